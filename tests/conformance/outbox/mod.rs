//! The outbox's relay, operator calls and inbox, on every backend: relays racing over
//! many entities, a poison event, a relay dropped at every await point or killed with
//! SIGKILL, shutdown, purge, and events committed with `Records::run`.

pub(crate) mod cancel;
mod events;
mod killed;
mod relays;
mod trace;

// Each suite runs the bodies it lists; the others stay unused in its binary.
#[allow(unused_imports)]
pub use self::{cancel::*, events::*, killed::*, relays::*, trace::*};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orderly::outbox::{
    Claim, EventKey, Inbox, Message, Outbox, OutboxStore, Relay, RelayConfig, Sink, SinkError,
};
use orderly::{Error, Records, Store};

use super::faults::{assert_pool_clean, poll_at_most};
use super::records_jobs::place;
use super::{Backend, Networked, engine};

/// Events published, as a consumer would see them, with what the race did.
#[derive(Default)]
pub(crate) struct Recorder {
    /// `(entity, version, relay)` in the order the sink took them.
    received: Mutex<Vec<(i64, i64, usize)>>,
    /// Entities being published right now.
    in_flight: Mutex<HashSet<i64>>,
    /// Publishes of an entity that began while another of its publishes was in flight.
    overlaps: AtomicUsize,
    /// Publishes in flight now, and the most at once.
    current: AtomicUsize,
    peak: AtomicUsize,
    /// Events the sink refuses, and how.
    refuse: Mutex<HashMap<(i64, i64), SinkError>>,
    /// Publishes that were refused.
    refused: AtomicUsize,
}

impl Recorder {
    /// Publishes of one entity that overlapped another of its publishes.
    pub(crate) fn overlaps(&self) -> usize {
        self.overlaps.load(Ordering::SeqCst)
    }

    pub(crate) fn received(&self) -> Vec<(i64, i64, usize)> {
        self.received.lock().unwrap().clone()
    }

    /// The events relay number `relay` published, in order: `(entity, version)`.
    fn received_by(&self, relay: usize) -> Vec<(i64, i64)> {
        let received = self.received.lock().unwrap();
        received
            .iter()
            .filter(|r| r.2 == relay)
            .map(|r| (r.0, r.1))
            .collect()
    }

    /// One round of `relay`, relay number `n` of this recorder; the events it published
    /// but could not record (the round failed after publishing, or lost its claim before
    /// its marks) are added to `unrecorded`: the only events another round may publish
    /// again.
    pub(crate) async fn round_noting_unrecorded<S: OutboxStore, K: Sink>(
        &self,
        relay: &Relay<S, K>,
        n: usize,
        unrecorded: &mut HashSet<(i64, i64)>,
    ) -> orderly::Result<orderly::outbox::RelayRound> {
        let before = self.received_by(n).len();
        let round = relay.relay_once().await;
        if round.as_ref().map_or(true, |r| r.lost > 0) {
            unrecorded.extend(self.received_by(n).into_iter().skip(before));
        }
        round
    }

    /// Each entity's versions in the order they were received.
    fn by_entity(&self) -> HashMap<i64, Vec<i64>> {
        let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
        for (entity, version, _) in self.received() {
            seen.entry(entity).or_default().push(version);
        }
        seen
    }
}

#[derive(Clone)]
pub(crate) struct RecordingSink {
    rec: Arc<Recorder>,
    relay: usize,
}

impl RecordingSink {
    /// A sink recording into `rec`, as relay number `relay`.
    pub(crate) fn new(rec: Arc<Recorder>, relay: usize) -> Self {
        RecordingSink { rec, relay }
    }
}

impl Sink for RecordingSink {
    async fn publish(&self, m: &Message) -> Result<(), SinkError> {
        let rec = &self.rec;
        if !rec.in_flight.lock().unwrap().insert(m.entity_id) {
            rec.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let now = rec.current.fetch_add(1, Ordering::SeqCst) + 1;
        rec.peak.fetch_max(now, Ordering::SeqCst);
        // Widen the window in which another relay could publish the same entity.
        tokio::time::sleep(Duration::from_micros(200 + (m.version as u64 % 5) * 100)).await;
        let refusal = rec
            .refuse
            .lock()
            .unwrap()
            .get(&(m.entity_id, m.version))
            .cloned();
        rec.in_flight.lock().unwrap().remove(&m.entity_id);
        rec.current.fetch_sub(1, Ordering::SeqCst);
        if let Some(e) = refusal {
            rec.refused.fetch_add(1, Ordering::SeqCst);
            return Err(e);
        }
        assert_eq!(m.id, format!("{}:{}:{}", m.machine, m.entity_id, m.version));
        rec.received
            .lock()
            .unwrap()
            .push((m.entity_id, m.version, self.relay));
        Ok(())
    }
}

/// The multi-row inserts of `per_entity` events for each of `entities` entities.
pub(crate) fn seed_rows(entities: i64, per_entity: i64) -> Vec<String> {
    let mut rows = Vec::new();
    for entity in 1..=entities {
        for version in 1..=per_entity {
            rows.push(format!(
                "('OrderMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', 'Paid', 'r-{entity}-{version}')"
            ));
        }
    }
    rows.chunks(500)
        .map(|chunk| {
            format!(
                "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
                 VALUES {}",
                chunk.join(", ")
            )
        })
        .collect()
}

/// Writes `per_entity` events for each of `entities` entities straight into the outbox
/// (the relay reads only the table).
pub(crate) async fn seed<B: Backend>(b: &B, entities: i64, per_entity: i64) {
    for sql in seed_rows(entities, per_entity) {
        b.exec(&sql).await;
    }
}

/// A quick config with the default claim (row locks where the store holds them).
fn fast(batch: u32) -> RelayConfig {
    fast_by(batch, Claim::Lock)
}

/// A quick config claiming by `claim`.
fn fast_by(batch: u32, claim: Claim) -> RelayConfig {
    RelayConfig::default()
        .claim(claim)
        .batch(batch)
        .lease(Duration::from_secs(30))
        .publish_timeout(Duration::from_secs(10))
        .max_attempts(3)
        .min_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(5))
        .idle(Duration::from_millis(5))
}

/// Runs `relay` until the outbox has nothing pending, or panics after 120 s.
async fn drain<S: OutboxStore, K: Sink>(relay: &Relay<S, K>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        match relay.relay_once().await {
            Ok(_) => {}
            // Relays racing for one entity's events on MySQL/MariaDB (most on a Galera
            // node) meet deadlocks: a retryable error, which `Relay::run` retries too.
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("{e}"),
        }
        if relay.outbox().stats().await.unwrap().pending == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the outbox never drained"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Runs `relay` (number `n`, recording into `rec`) until nothing is pending, and returns
/// what it published and could not record: the only events another relay may publish
/// again (docs/outbox.md, "Duplicates").
async fn drain_noting<S: OutboxStore, K: Sink>(
    rec: &Recorder,
    relay: &Relay<S, K>,
    n: usize,
) -> HashSet<(i64, i64)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut unrecorded = HashSet::new();
    loop {
        match rec.round_noting_unrecorded(relay, n, &mut unrecorded).await {
            Ok(_) => {}
            // Relays racing on MySQL/MariaDB (most on a Galera node) meet deadlocks, some
            // at the record's commit after the publish: a retryable error, which
            // `Relay::run` retries too.
            Err(e) if e.is_retryable() => {}
            Err(e) => panic!("{e}"),
        }
        if relay.outbox().stats().await.unwrap().pending == 0 {
            return unrecorded;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the outbox never drained"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Every one of `total` events received, each once but one in `unrecorded` (published
/// and not recorded, so published again); each entity's first copies in version order.
fn assert_once_but_unrecorded(
    rec: &Recorder,
    unrecorded: &HashSet<(i64, i64)>,
    total: i64,
    per_entity: i64,
) {
    let mut seen = HashSet::new();
    for (entity, version, _) in rec.received() {
        assert!(
            seen.insert((entity, version)) || unrecorded.contains(&(entity, version)),
            "entity {entity} version {version} published twice, recorded the first time"
        );
    }
    assert_eq!(seen.len() as i64, total, "every event published");
    for (entity, versions) in rec.by_entity() {
        let mut firsts = versions.clone();
        let mut kept = HashSet::new();
        firsts.retain(|v| kept.insert(*v));
        assert_eq!(
            firsts,
            (1..=per_entity).collect::<Vec<_>>(),
            "entity {entity}'s events in version order: {versions:?}"
        );
    }
}

/// Runs `relay` until 50 rounds in a row (a quarter of a second, far longer than the
/// test configs' backoff) found nothing to claim: what is left pending is held back.
async fn drain_quiet<S: OutboxStore, K: Sink>(relay: &Relay<S, K>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut empty = 0;
    while empty < 50 {
        let round = relay.relay_once().await.unwrap();
        empty = if round.claimed == 0 { empty + 1 } else { 0 };
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never went quiet"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Every entity's events, first receipts only, in version order, none missing.
fn assert_first_receipts_in_order(rec: &Recorder, entities: i64, per_entity: i64) {
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    for (entity, version, _) in rec.received() {
        let seen = firsts.entry(entity).or_default();
        if !seen.contains(&version) {
            seen.push(version);
        }
    }
    for entity in 1..=entities {
        assert_eq!(
            firsts.get(&entity),
            Some(&(1..=per_entity).collect::<Vec<_>>()),
            "entity {entity}"
        );
    }
}

/// The environment variable that makes a test binary a relay child.
pub const RELAY_CHILD: &str = "relay|";
