//! The outbox's relay, operator calls and inbox, on every backend: relays racing over
//! many entities, a poison event, a relay dropped at every await point or killed with
//! SIGKILL, shutdown, purge, and events committed with `Records::run`.

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
    #[allow(dead_code)] // used by the Galera relay tests only
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
                "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
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
        relay.relay_once().await.unwrap();
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

/// Eight relays race over 2,000 events of 100 entities: every event is published once
/// (no relay died, so no lease ran out and nothing is republished), no entity's events
/// are received out of version order, and no two publishes of one entity overlap. The
/// race happened: several relays published, and publishes overlapped across entities.
pub async fn relays_race_each_event_once_in_order<B: Backend>(b: &B) {
    let (entities, per_entity) = (100, 20);
    seed(b, entities, per_entity).await;
    let rec = Arc::new(Recorder::default());
    let mut tasks = Vec::new();
    for relay in 0..8 {
        let store = b.store(Duration::from_secs(10)).await;
        let sink = RecordingSink {
            rec: rec.clone(),
            relay,
        };
        let relay = Relay::new(store, sink).with_config(fast(16)).unwrap();
        tasks.push(tokio::spawn(async move {
            drain(&relay).await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let received = rec.received();
    assert_eq!(
        received.len() as i64,
        entities * per_entity,
        "each event once"
    );
    for (entity, versions) in rec.by_entity() {
        assert_eq!(
            versions,
            (1..=per_entity).collect::<Vec<_>>(),
            "entity {entity}'s events in version order, each once"
        );
    }
    assert_eq!(
        rec.overlaps.load(Ordering::SeqCst),
        0,
        "one entity's publishes overlapped"
    );
    let relays: HashSet<usize> = received.iter().map(|r| r.2).collect();
    assert!(
        relays.len() >= 2,
        "only relays {relays:?} published: no race"
    );
    assert!(
        rec.peak.load(Ordering::SeqCst) > 1,
        "publishes never overlapped"
    );
    let outbox = Outbox::new(b.store(Duration::from_secs(10)).await);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE status = 'PUBLISHED' AND owner_token IS NULL")
            .await,
        entities * per_entity
    );
}

/// Four relays run while writers commit events, each entity's versions one right after
/// another, each in its own transaction: a claim's read can meet an entity's earlier and
/// later events committed after it began, and must still take only the earliest. Every
/// event is received once, each entity's in version order, no two publishes of one
/// entity overlap; the race happened: events were published while the writers wrote.
pub async fn relays_keep_order_while_events_commit<B: Backend>(b: &B) {
    let (writers, per_writer, per_entity) = (8_i64, 60_i64, 4_i64);
    let rec = Arc::new(Recorder::default());
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut relays = Vec::new();
    for relay in 0..4 {
        let store = b.store(Duration::from_secs(10)).await;
        let relay = Relay::new(store, RecordingSink::new(rec.clone(), relay))
            .with_config(fast(64))
            .unwrap();
        let writing = writing.clone();
        relays.push(tokio::spawn(async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                relay.relay_once().await.unwrap();
                if !writing.load(Ordering::SeqCst)
                    && relay.outbox().stats().await.unwrap().pending == 0
                {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "never drained");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    // The most events received as a writer was about to write its last one: counted
    // there, not after the writers are joined, so that a relay finishing the rest while
    // this task waits to run again cannot hide the race.
    let before_last = Arc::new(AtomicUsize::new(0));
    let write = |w: i64| {
        let (rec, before_last) = (rec.clone(), before_last.clone());
        async move {
            for e in 1..=per_writer {
                let entity = w * per_writer + e;
                for version in 1..=per_entity {
                    if e == per_writer && version == per_entity {
                        before_last.fetch_max(rec.received().len(), Ordering::SeqCst);
                    }
                    b.exec(&format!(
                        "INSERT INTO outbox (machine, entity_id, version, event, transition, \
                         from_status, to_status, ref_id) \
                     VALUES ('OrderMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', \
                         'Paid', 'r-{entity}-{version}')"
                    ))
                    .await;
                }
            }
        }
    };
    futures_util::future::join_all((0..writers).map(write)).await;
    let while_writing = before_last.load(Ordering::SeqCst);
    writing.store(false, Ordering::SeqCst);
    for relay in relays {
        relay.await.unwrap();
    }
    let total = writers * per_writer * per_entity;
    assert_eq!(rec.received().len() as i64, total, "each event once");
    for (entity, versions) in rec.by_entity() {
        assert_eq!(
            versions,
            (1..=per_entity).collect::<Vec<_>>(),
            "entity {entity}'s events in version order, each once"
        );
    }
    assert_eq!(rec.overlaps(), 0, "one entity's publishes overlapped");
    assert!(
        while_writing > 0,
        "no race: nothing was published before the writers' last events"
    );
}

/// A poison event (the sink refuses it every time) is retried with backoff and moves to
/// the dead state after `max_attempts` claims, with its last error (cut to the bound);
/// it holds back only its own entity's later events, never another entity's. A
/// permanent refusal dies at once. Requeued once the sink takes it, it and the events
/// behind it go out in order.
pub async fn poison_event_dies_without_holding_back_others<B: Backend>(b: &B) {
    seed(b, 3, 3).await;
    let rec = Arc::new(Recorder::default());
    let long = "x".repeat(100_000);
    rec.refuse
        .lock()
        .unwrap()
        .insert((1, 2), SinkError::retry(&long));
    rec.refuse
        .lock()
        .unwrap()
        .insert((3, 1), SinkError::permanent("schema rejected"));
    let store = b.store(Duration::from_secs(10)).await;
    let relay = Relay::new(
        store,
        RecordingSink {
            rec: rec.clone(),
            relay: 0,
        },
    )
    .with_config(fast(8))
    .unwrap();
    drain_quiet(&relay).await;
    let seen = rec.by_entity();
    assert_eq!(
        seen.get(&1),
        Some(&vec![1]),
        "entity 1 stops at its dead event"
    );
    assert_eq!(
        seen.get(&2),
        Some(&vec![1, 2, 3]),
        "entity 2 is not held back"
    );
    assert_eq!(seen.get(&3), None, "entity 3's first event died at once");
    assert_eq!(
        rec.refused.load(Ordering::SeqCst),
        3 + 1,
        "three tries of the poison, one of the permanent refusal"
    );
    let outbox = relay.outbox();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (3, 2), "{stats:?}");
    let dead = outbox.dead(10).await.unwrap();
    assert_eq!(
        dead.iter()
            .map(|d| (d.entity_id, d.version))
            .collect::<Vec<_>>(),
        [(1, 2), (3, 1)]
    );
    let error = dead[0].last_error.as_deref().unwrap();
    assert!(
        error.len() <= orderly::flow::MAX_ERROR_BYTES,
        "{}",
        error.len()
    );
    assert!(
        error.ends_with("[truncated, 100000 bytes]"),
        "{}",
        &error[error.len() - 40..]
    );
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(dead[1].last_error.as_deref(), Some("schema rejected"));

    // Requeued (and taken now): the dead event and those behind it, in order.
    rec.refuse.lock().unwrap().clear();
    let key = |entity_id, version| EventKey {
        machine: "OrderMachine".into(),
        entity_id,
        version,
    };
    assert!(outbox.requeue(&key(1, 2)).await.unwrap());
    assert!(!outbox.requeue(&key(1, 2)).await.unwrap(), "no longer dead");
    assert!(
        !outbox.requeue(&key(2, 1)).await.unwrap(),
        "published, not dead"
    );
    assert!(outbox.requeue(&key(3, 1)).await.unwrap());
    drain(&relay).await;
    let seen = rec.by_entity();
    assert_eq!(seen.get(&1), Some(&vec![1, 2, 3]));
    assert_eq!(seen.get(&3), Some(&vec![1, 2, 3]));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
}

/// Rows orderly never writes, each on its own entity, among healthy ones: a `created_at`
/// that is no time (PostgreSQL's `infinity`, MariaDB's zero date, on SQLite text that is
/// no date), a body that is not JSON, a version below 1, on SQLite a BLOB body and a
/// text version, a status orderly never writes, a claim by an unknown owner with a lease
/// of centuries; on SQLite also a text entity id. The relay publishes every healthy
/// entity in order; no corrupt row is published; the ones it claims go dead at their
/// first claim with the reason (their attempts never climb), a text version or entity id
/// too; each holds back only its own entity (a text entity id, whose entity cannot be
/// known, none); `stats` counts and `corrupt` lists them; `pending` and `dead` still
/// answer.
pub async fn corrupt_rows_are_set_aside_and_hold_back_only_their_entity<B: Backend>(b: &B) {
    let backend = std::any::type_name::<B::S>();
    let sqlite = backend.contains("Sqlite");
    seed(b, if sqlite { 9 } else { 8 }, 3).await;
    let at =
        |entity: i64, version: i64| format!("WHERE entity_id = {entity} AND version = {version}");
    // 1: a created_at the database cannot count from.
    let no_time = if backend.contains("Pg") {
        "'infinity'"
    } else if backend.contains("MySql") {
        "'0000-00-00 00:00:00'"
    } else {
        "'not a date'"
    };
    b.exec(&format!(
        "UPDATE outbox SET created_at = {no_time} {}",
        at(1, 1)
    ))
    .await;
    // 2: a status orderly never writes.
    b.exec(&format!("UPDATE outbox SET status = 'WEIRD' {}", at(2, 1)))
        .await;
    // 3: a body that is not JSON.
    b.exec(&format!(
        "UPDATE outbox SET body = 'not json {{' {}",
        at(3, 1)
    ))
    .await;
    // 5: a version below 1, before the entity's first.
    b.exec(&format!("UPDATE outbox SET version = -5 {}", at(5, 1)))
        .await;
    // 6: claimed by no relay of ours, for centuries.
    b.exec(&format!(
        "UPDATE outbox SET owner_token = 'ghost', lease_until = 9000000000000000 {}",
        at(6, 1)
    ))
    .await;
    if sqlite {
        // 7: a BLOB body; 8: a text version.
        b.exec(&format!("UPDATE outbox SET body = X'00FF' {}", at(7, 1)))
            .await;
        b.exec(&format!("UPDATE outbox SET version = 'v1' {}", at(8, 1)))
            .await;
        // 9: a text entity id.
        b.exec(&format!("UPDATE outbox SET entity_id = 'zz' {}", at(9, 1)))
            .await;
    }
    let rec = Arc::new(Recorder::default());
    let store = b.store(Duration::from_secs(10)).await;
    let relay = Relay::new(
        store,
        RecordingSink {
            rec: rec.clone(),
            relay: 0,
        },
    )
    .with_config(fast(4))
    .unwrap();
    let mut corrupt_seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut empty = 0;
    while empty < 50 {
        let round = relay.relay_once().await.expect("a round fails on no row");
        corrupt_seen += round.corrupt;
        empty = if round.claimed == 0 { empty + 1 } else { 0 };
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never went quiet"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = rec.by_entity();
    assert_eq!(
        seen.get(&4),
        Some(&vec![1, 2, 3]),
        "a healthy entity is published"
    );
    if !sqlite {
        assert_eq!(seen.get(&7), Some(&vec![1, 2, 3]));
        assert_eq!(seen.get(&8), Some(&vec![1, 2, 3]));
    }
    for entity in [1, 2, 3, 5, 6] {
        assert_eq!(
            seen.get(&entity),
            None,
            "entity {entity}: held back by its corrupt row"
        );
    }
    if sqlite {
        assert_eq!(seen.get(&7), None, "a BLOB body is not published");
        // The text version sorts after every integer: its entity's events go out, the
        // row itself never. The text entity id belongs to no entity that can be known: it
        // holds back none.
        assert_eq!(seen.get(&8), Some(&vec![2, 3]));
        assert_eq!(seen.get(&9), Some(&vec![2, 3]));
    }
    let set_aside = if sqlite { 6 } else { 3 };
    assert_eq!(corrupt_seen, set_aside, "rows set aside by the relay");
    let dead_corrupt = b
        .scalar(
            "SELECT count(*) FROM outbox WHERE status = 'DEAD' AND attempts = 1 \
             AND last_error LIKE 'corrupt row: %'",
        )
        .await;
    assert_eq!(
        dead_corrupt, set_aside as i64,
        "dead at the first claim, with the reason"
    );
    let outbox = relay.outbox();
    let stats = outbox.stats().await.unwrap();
    // Entities 1, 3, 5 (and 7) wait behind their dead row; 2 and 6 behind theirs. On
    // SQLite the text keys are dead too, and counted with the rows orderly never writes.
    let (pending, dead, unclaimed) = if sqlite { (13, 6, 5) } else { (11, 3, 2) };
    assert_eq!(
        (stats.pending, stats.dead, stats.corrupt),
        (pending, dead, unclaimed),
        "{stats:?}"
    );
    let corrupt = outbox.corrupt(10).await.unwrap();
    let listed: Vec<_> = corrupt
        .iter()
        .map(|c| (c.entity_id.as_str(), c.version.as_str(), c.reason.as_str()))
        .collect();
    assert!(
        listed.contains(&("2", "1", "a status orderly never writes")),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .any(|(e, v, why)| (*e, *v) == ("6", "1") && why.starts_with("claimed by ghost")),
        "{listed:?}"
    );
    if sqlite {
        assert!(
            listed.contains(&("8", "v1", "an entity id or version that is not an integer")),
            "{listed:?}"
        );
        assert!(
            listed.contains(&("zz", "1", "an entity id or version that is not an integer")),
            "{listed:?}"
        );
        let named = b
            .scalar(
                "SELECT count(*) FROM outbox WHERE status = 'DEAD' AND last_error LIKE \
                 'corrupt row: an entity id or version that is not an integer (entity id ''zz'', version 1)%'",
            )
            .await;
        assert_eq!(named, 1, "the dead row names its key");
        assert!(
            listed.contains(&("7", "1", "a column of the wrong type")),
            "{listed:?}"
        );
    }
    assert!(outbox.pending(100).await.is_ok());
    let dead = outbox.dead(100).await.unwrap();
    let mut dead_keys: Vec<_> = dead.iter().map(|d| (d.entity_id, d.version)).collect();
    dead_keys.sort();
    // The BLOB body does not read as an event: `corrupt` lists it, `dead` leaves it out.
    assert_eq!(dead_keys, [(1, 1), (3, 1), (5, -5)]);
}

/// Event bodies are bounded by `EngineConfig::max_event_body` when they are written: a
/// larger one is `InvalidInput` and nothing is written (no state change, no history, no
/// outbox row), along an emitting edge or not; one within it is stored. A body along an
/// edge that emits nothing is ignored: the transition applies, and no outbox row is
/// written.
pub async fn event_bodies_are_bounded_when_written<B: Backend>(b: &B) {
    use super::{OrderEvent, OrderState};
    let config = super::config(B::POLICY).max_event_body(1000);
    let e = orderly::Engine::<super::OrderMachine, _>::with_config(
        b.store(Duration::from_secs(10)).await,
        config,
    )
    .unwrap();
    let too_big = serde_json::json!({ "note": "x".repeat(2000) });
    let fits = serde_json::json!({ "note": "y".repeat(500) });
    for id in [1, 2] {
        e.create(id).await.unwrap();
    }
    // Pay emits OrderPaid; Cancel emits nothing.
    for (id, event) in [(1, OrderEvent::Pay), (2, OrderEvent::Cancel)] {
        let refused = e.transition(id, event, "r-1").event_body(&too_big).await;
        assert!(
            matches!(&refused, Err(Error::InvalidInput(why)) if why.contains("max_event_body")),
            "{refused:?}"
        );
        assert_eq!(e.get(id).await.unwrap().state, OrderState::Created);
    }
    assert_eq!(b.scalar("SELECT count(*) FROM order_transitions").await, 0);
    assert_eq!(b.scalar("SELECT count(*) FROM outbox").await, 0);
    let paid = e
        .transition(1, OrderEvent::Pay, "r-1")
        .event_body(&fits)
        .await;
    assert!(paid.is_ok(), "{paid:?}");
    let cancelled = e
        .transition(2, OrderEvent::Cancel, "r-1")
        .event_body(&fits)
        .await;
    assert!(
        cancelled.is_ok(),
        "a body along an edge that emits nothing: {cancelled:?}"
    );
    assert_eq!(e.get(2).await.unwrap().state, OrderState::Cancelled);
    let pending = Outbox::new(b.store(Duration::from_secs(10)).await)
        .pending(10)
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "one row, of the emitting edge");
    assert_eq!(pending[0].entity_id, 1);
    assert_eq!(pending[0].body.as_deref(), Some(fits.to_string().as_str()));
    let bad = orderly::Engine::<super::OrderMachine, _>::with_config(
        b.store(Duration::from_secs(10)).await,
        super::config(B::POLICY).max_event_body(0),
    );
    assert!(matches!(bad, Err(Error::InvalidInput(_))));
}

/// A relay round dropped at every await point leaves no connection in a transaction and
/// no event claimed past its lease: once the lease runs out, another relay publishes
/// everything, in order per entity. Events the dropped round published without recording
/// are published again (the duplicate window a consumer dedupes by message id).
pub async fn relay_dropped_at_every_await_point_leaves_nothing_claimed<B: Backend>(b: &B) {
    let (entities, per_entity) = (4, 6);
    seed(b, entities, per_entity).await;
    let store = b.store(Duration::from_secs(10)).await;
    let rec = Arc::new(Recorder::default());
    let lease = Duration::from_millis(400);
    let config = fast_by(4, Claim::Lease)
        .lease(lease)
        .publish_timeout(Duration::from_millis(200));
    let relay = Relay::new(
        store.clone(),
        RecordingSink {
            rec: rec.clone(),
            relay: 0,
        },
    )
    .with_config(config.clone())
    .unwrap();
    // First a round dropped for certain while it holds its claim: in the middle of its
    // publishes (which take 300 ms each here).
    let slow = Relay::new(
        store.clone(),
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 1,
            },
        },
    )
    .with_config(config.clone())
    .unwrap();
    {
        let round = slow.relay_once();
        tokio::pin!(round);
        while rec.current.load(Ordering::SeqCst) == 0 {
            tokio::select! {
                out = &mut round => panic!("the round ended before it published: {out:?}"),
                () = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
    }
    rec.current.store(0, Ordering::SeqCst);
    assert!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE owner_token IS NOT NULL")
            .await
            > 0,
        "the dropped round held no claim"
    );
    let mut drops = 1;
    // Then every await point: k = 0, 1, 2, … polls until a round completes.
    for k in 0.. {
        assert_pool_clean(b, &store).await;
        // A dropped round's connection was closed; the server rolls back what it held
        // once it sees the socket closed, which on a loaded machine can take a moment.
        let mut open = b.open_transactions().await;
        for _ in 0..100 {
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            open = b.open_transactions().await;
        }
        assert_eq!(
            open, 0,
            "a session is still in a transaction 2 s after the drop"
        );
        // Whatever the dropped round claimed comes free when its lease runs out.
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let held_until = b
            .scalar(
                "SELECT COALESCE(MAX(lease_until), 0) FROM outbox \
                 WHERE status = 'PENDING' AND owner_token IS NOT NULL",
            )
            .await;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(
            held_until <= now_ms,
            "an event is still claimed {} ms past the dropped round's lease",
            held_until - now_ms
        );
        match poll_at_most(relay.relay_once(), k).await {
            Some(round) => {
                round.unwrap();
                break;
            }
            None => drops += 1,
        }
        assert!(k < 200, "a round never completed");
    }
    assert!(drops >= 3, "the round was dropped at {drops} points only");
    drain(&relay).await;
    assert_pool_clean(b, &store).await;
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
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM outbox WHERE status <> 'PUBLISHED' OR owner_token IS NOT NULL"
        )
        .await,
        0
    );
}

/// A relay claiming by row locks, its round dropped in the middle of its publishes and
/// then at every await point. While the first dropped round held its batch (the earliest
/// event of every entity), another relay found nothing to claim; once it was dropped,
/// that relay claimed the batch at once (the connection closed, nothing to expire). No
/// session stays in a transaction, the pool is clean, no row ever carried a lease, and
/// everything is published, each entity's events first received in version order.
pub async fn locked_relay_dropped_at_every_await_point_frees_its_batch_at_once<B: Networked>(
    b: &B,
) {
    if !holds_claims_by_lock(b).await {
        return assert_claims_fall_back_to_a_lease(b).await;
    }
    let (entities, per_entity) = (4, 6);
    seed(b, entities, per_entity).await;
    let store = b.store(Duration::from_secs(10)).await;
    let rec = Arc::new(Recorder::default());
    let relay = |n: usize| {
        Relay::new(
            store.clone(),
            RecordingSink {
                rec: rec.clone(),
                relay: n,
            },
        )
        .with_config(fast_by(4, Claim::Lock))
        .unwrap()
    };
    let (relay, other) = (relay(0), relay(2));
    let slow = Relay::new(
        store.clone(),
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 1,
            },
        },
    )
    .with_config(fast_by(4, Claim::Lock))
    .unwrap();
    {
        let round = slow.relay_once();
        tokio::pin!(round);
        while rec.current.load(Ordering::SeqCst) == 0 {
            tokio::select! {
                out = &mut round => panic!("the round ended before it published: {out:?}"),
                () = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
        let meanwhile = other.relay_once().await.unwrap();
        assert_eq!(
            meanwhile.claimed, 0,
            "another relay claimed events of a batch held by lock"
        );
    }
    rec.current.store(0, Ordering::SeqCst);
    until_no_transaction_is_open(b).await;
    let freed = other.relay_once().await.unwrap();
    assert_eq!(
        (freed.claimed, freed.published),
        (4, 4),
        "the dropped round's batch was not claimable at once"
    );
    let mut drops = 1;
    for k in 0.. {
        assert_pool_clean(b, &store).await;
        until_no_transaction_is_open(b).await;
        assert_no_lease(b).await;
        match poll_at_most(relay.relay_once(), k).await {
            Some(round) => {
                round.unwrap();
                break;
            }
            None => drops += 1,
        }
        assert!(k < 200, "a round never completed");
    }
    assert!(drops >= 3, "the round was dropped at {drops} points only");
    drain(&relay).await;
    assert_pool_clean(b, &store).await;
    assert_no_lease(b).await;
    assert_first_receipts_in_order(&rec, entities, per_entity);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE status <> 'PUBLISHED'")
            .await,
        0
    );
}

/// A relay claiming by row locks, its connection cut at each statement of its round (the
/// lock, the record of what it published, the commit): as the statement goes out (the
/// server never sees it), and right after the server answered it (the relay never
/// hears). The round answers a retryable error, or what the database then holds; no
/// session is left in a transaction and no lease was written, so the batch is claimable
/// at once; a relay on a direct connection publishes everything, each entity's events
/// first received in version order, at most the cut batch twice, and each event counts
/// one attempt (a cut round's attempt only if it committed).
pub async fn locked_relay_cut_at_each_statement<B: Networked>(b: &B) {
    if !holds_claims_by_lock(b).await {
        return assert_claims_fall_back_to_a_lease(b).await;
    }
    use crate::server::{Cut, Proxy};
    let commit: &'static [u8] = if <B::S as orderly::Store>::BACKEND == "postgres" {
        b"COMMIT"
    } else {
        b"\x03COMMIT"
    };
    let points: [&'static [u8]; 3] = [b"SKIP LOCKED", b"SET status = 'PUBLISHED'", commit];
    let (entities, per_entity) = (4, 2);
    for point in points {
        for cut in [Cut::Request(point), Cut::ReplyTo(point)] {
            b.exec("DELETE FROM outbox").await;
            seed(b, entities, per_entity).await;
            let rec = Arc::new(Recorder::default());
            let proxy = Proxy::start(b.server(), cut).await;
            let cut_relay = Relay::new(
                b.store_at(proxy.port, 2).await,
                RecordingSink {
                    rec: rec.clone(),
                    relay: 1,
                },
            )
            .with_config(fast_by(8, Claim::Lock))
            .unwrap();
            let answer = cut_relay.relay_once().await;
            assert_eq!(
                proxy.cuts(),
                1,
                "{cut:?}: the proxy never cut, so the test shows nothing"
            );
            until_no_transaction_is_open(b).await;
            let published = b
                .scalar("SELECT COUNT(*) FROM outbox WHERE status = 'PUBLISHED'")
                .await;
            match answer {
                Ok(round) => assert_eq!(round.published as i64, published, "{cut:?}: {round:?}"),
                Err(e) => assert!(e.is_retryable(), "{cut:?}: {e}"),
            }
            assert_no_lease(b).await;
            let direct = Relay::new(
                b.store(Duration::from_secs(10)).await,
                RecordingSink {
                    rec: rec.clone(),
                    relay: 0,
                },
            )
            .with_config(fast_by(8, Claim::Lock))
            .unwrap();
            drain(&direct).await;
            assert_first_receipts_in_order(&rec, entities, per_entity);
            let twice = rec.received().len() as i64 - entities * per_entity;
            assert!(twice <= entities, "{cut:?}: {twice} published twice");
            assert_eq!(
                b.scalar(
                    "SELECT COUNT(*) FROM outbox WHERE attempts <> 1 OR status <> 'PUBLISHED'"
                )
                .await,
                0,
                "{cut:?}: an attempt counted that no commit recorded"
            );
        }
    }
}

/// Whether this database's store holds a relay's claims by lock: it does on one
/// PostgreSQL or MariaDB server; a Galera node answers `None` (its row locks bind no
/// other node), and there [`assert_claims_fall_back_to_a_lease`] is what holds.
async fn holds_claims_by_lock<B: Backend>(b: &B) -> bool {
    let store = b.store(Duration::from_secs(10)).await;
    let mut conn = store.acquire().await.unwrap();
    match store.lock_events(&mut conn, 0).await.unwrap() {
        Some(locked) => {
            assert!(locked.is_empty());
            store.settle_locked(&mut conn, &[], &[]).await.unwrap();
            true
        }
        None => false,
    }
}

/// On a store that holds no claims by lock, a relay configured to claim by lock claims
/// by lease: while it publishes, its events carry its token.
async fn assert_claims_fall_back_to_a_lease<B: Backend>(b: &B) {
    seed(b, 2, 1).await;
    let rec = Arc::new(Recorder::default());
    let relay = Relay::new(
        b.store(Duration::from_secs(10)).await,
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 0,
            },
        },
    )
    .with_config(fast_by(4, Claim::Lock))
    .unwrap();
    let round = relay.relay_once();
    tokio::pin!(round);
    while rec.current.load(Ordering::SeqCst) == 0 {
        tokio::select! {
            out = &mut round => panic!("the round ended before it published: {out:?}"),
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE owner_token IS NOT NULL")
            .await,
        2,
        "a relay on a store that holds no claims by lock claimed without a lease"
    );
    round.await.unwrap();
}

/// Waits (2 s at most) until no session of this database is in a transaction: a
/// connection closed by its client is rolled back once the server sees the socket go.
async fn until_no_transaction_is_open<B: Backend>(b: &B) {
    let mut open = b.open_transactions().await;
    for _ in 0..100 {
        if open == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        open = b.open_transactions().await;
    }
    assert_eq!(open, 0, "a session is still in a transaction after 2 s");
}

/// No event carries a claim's token or lease: claims by lock write none.
async fn assert_no_lease<B: Backend>(b: &B) {
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE owner_token IS NOT NULL OR lease_until <> 0")
            .await,
        0,
        "a claim by lock wrote a lease"
    );
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

/// `Relay::run` stops on its shutdown signal after finishing the batch in hand: the
/// events it had claimed are published and recorded, none is left claimed.
pub async fn relay_shutdown_finishes_the_batch_in_hand<B: Backend>(b: &B) {
    seed(b, 40, 1).await;
    let rec = Arc::new(Recorder::default());
    let relay = Relay::new(
        b.store(Duration::from_secs(10)).await,
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 0,
            },
        },
    )
    .with_config(fast(10))
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        relay
            .run(async {
                stopped.await.ok();
            })
            .await
    });
    // Stop while the first batch is being published (each publish takes 300 ms).
    while rec.current.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.send(()).unwrap();
    let total = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("run stopped")
        .unwrap()
        .unwrap();
    assert!(total.claimed >= 10, "{total:?}");
    assert_eq!(total.published, total.claimed, "{total:?}");
    assert!(total.claimed < 40, "it went on after the signal: {total:?}");
    assert_eq!(rec.received().len(), total.published);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE owner_token IS NOT NULL")
            .await,
        0
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE status = 'PUBLISHED'")
            .await,
        total.published as i64
    );
}

#[derive(Clone)]
struct SlowSink {
    inner: RecordingSink,
}

impl Sink for SlowSink {
    async fn publish(&self, m: &Message) -> Result<(), SinkError> {
        self.inner.rec.current.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.inner.rec.current.fetch_sub(1, Ordering::SeqCst);
        self.inner.publish(m).await
    }
}

/// Purge deletes only published events older than the retention, in batches; pending
/// and dead events stay whatever their age. Stats count pending and dead events and the
/// oldest pending one's age. Bad input is refused.
pub async fn outbox_purge_and_stats<B: Backend>(b: &B) {
    seed(b, 3, 2).await;
    let outbox = Outbox::new(b.store(Duration::from_secs(10)).await);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (6, 0));
    // Entity 1 published long ago, entity 2 just now, entity 3 pending and dead.
    b.exec("UPDATE outbox SET status = 'PUBLISHED', published_at = 1000 WHERE entity_id = 1")
        .await;
    b.exec(&format!(
        "UPDATE outbox SET status = 'PUBLISHED', published_at = {} WHERE entity_id = 2",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    ))
    .await;
    b.exec("UPDATE outbox SET status = 'DEAD' WHERE entity_id = 3 AND version = 1")
        .await;
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (1, 1));
    assert!(stats.oldest_pending < Duration::from_secs(600), "{stats:?}");
    assert!(matches!(
        outbox.purge(Duration::from_secs(3600), 0).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(outbox.purge(Duration::from_secs(3600), 1).await.unwrap(), 1);
    assert_eq!(
        outbox.purge(Duration::from_secs(3600), 10).await.unwrap(),
        1
    );
    assert_eq!(
        outbox.purge(Duration::from_secs(3600), 10).await.unwrap(),
        0
    );
    assert_eq!(b.scalar("SELECT COUNT(*) FROM outbox").await, 4);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE entity_id = 1")
            .await,
        0
    );
    assert!(matches!(
        Relay::new(outbox.store().clone(), orderly::outbox::ChannelSink::new().0)
            .with_config(RelayConfig::default()
                .batch(0)
                .lease(Duration::from_secs(1))
                .publish_timeout(Duration::from_secs(1))),
        Err(Error::InvalidInput(m)) if m.contains("batch") && m.contains("lease")
    ));
    assert!(matches!(
        Relay::new(outbox.store().clone(), orderly::outbox::ChannelSink::new().0)
            .with_config(RelayConfig::default()
                .batch(1001)
                .idle(Duration::ZERO)
                .max_backoff(Duration::from_secs(2 * 24 * 3600))),
        Err(Error::InvalidInput(m)) if m.contains("batch") && m.contains("idle") && m.contains("max_backoff")
    ));
}

/// The consumer's inbox: the first receipt of a message id inside the consumer's
/// transaction says "do the work", a redelivery says "skip"; a receipt rolled back with
/// its work is not remembered; bad ids are refused; purge removes old entries only.
pub async fn inbox_dedupes_inside_the_consumers_transaction<B: Backend>(b: &B) {
    let store = b.store(Duration::from_secs(10)).await;
    let inbox = Inbox::new(store.clone(), "warehouse").unwrap();
    assert!(matches!(
        Inbox::new(store.clone(), ""),
        Err(Error::InvalidInput(_))
    ));
    let mut tx = b.begin().await;
    assert!(inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap());
    B::rollback(tx).await;
    let mut tx = b.begin().await;
    assert!(
        inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap(),
        "rolled back, so new"
    );
    assert!(!inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap());
    B::commit(tx).await;
    let mut tx = b.begin().await;
    assert!(
        !inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap(),
        "a redelivery"
    );
    assert!(matches!(
        inbox.receive(&mut tx, &"m".repeat(256)).await,
        Err(Error::InvalidInput(_))
    ));
    B::commit(tx).await;
    let other = Inbox::new(store, "billing").unwrap();
    let mut tx = b.begin().await;
    assert!(
        other.receive(&mut tx, "OrderMachine:1:1").await.unwrap(),
        "another consumer"
    );
    B::commit(tx).await;
    b.exec("UPDATE inbox SET received_at = 1000 WHERE consumer = 'billing'")
        .await;
    assert_eq!(inbox.purge(Duration::from_secs(3600), 10).await.unwrap(), 1);
    assert_eq!(b.scalar("SELECT COUNT(*) FROM inbox").await, 1);
}

/// The event of a transition inside `Records::run`'s work commits with the work and its
/// record, and is absent when the work is rolled back (a failure, an error).
pub async fn events_commit_with_records_run<B: Backend>(b: &B) {
    let e = engine(b).await;
    let r = Records::new(b.store(Duration::from_secs(10)).await)
        .scope(
            "orders",
            orderly::ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let ran = r
        .run(
            "orders",
            "o-1",
            &1,
            place::<B>(e.clone(), runs.clone(), 1, "ok"),
        )
        .await
        .unwrap();
    assert_eq!(ran.outcome, Ok(1));
    let count = |id: i64| {
        format!("SELECT COUNT(*) FROM outbox WHERE entity_id = {id} AND event = 'OrderPaid'")
    };
    assert_eq!(b.scalar(&count(1)).await, 1);
    let again = r
        .run(
            "orders",
            "o-1",
            &1,
            place::<B>(e.clone(), runs.clone(), 1, "ok"),
        )
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(b.scalar(&count(1)).await, 1, "a replay writes no event");
    for (id, verdict) in [(2, "declined"), (3, "error")] {
        let _ = r
            .run(
                "orders",
                &format!("o-{id}"),
                &id,
                place::<B>(e.clone(), runs.clone(), id, verdict),
            )
            .await;
        assert_eq!(
            b.scalar(&count(id)).await,
            0,
            "{verdict}: rolled back with the work"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// The environment variable that makes a test binary a relay child.
pub const RELAY_CHILD: &str = "relay|";

/// A relay in a process of its own, killed with SIGKILL in the middle of a batch (its
/// sink published part of the batch and hangs): another relay, here, finishes the work
/// once the child's lease ran out. Every event is published; the only duplicates are
/// events the child published in the batch it never recorded; each entity's events,
/// first receipts across both relays, are in version order.
pub async fn relay_killed_by_sigkill_another_finishes<B: Backend>(b: &B) {
    killed_relay_another_finishes(b, Claim::Lease, "relay_killed_by_sigkill_another_finishes")
        .await;
}

/// A relay claiming by row locks, in a process of its own, killed with SIGKILL in the
/// middle of a batch (published in part, the rest hanging): its batch is claimable as
/// soon as the server sees the connection gone, with no lease to run out (none was ever
/// written). Another relay, here, publishes everything; the only duplicates are events
/// of the batch the child never recorded (at most one batch); each entity's events, first
/// receipts across both, are in version order; every event counts one attempt (the
/// killed batch's was never recorded).
pub async fn locked_relay_killed_by_sigkill_another_finishes<B: Networked>(b: &B) {
    if !holds_claims_by_lock(b).await {
        return assert_claims_fall_back_to_a_lease(b).await;
    }
    killed_relay_another_finishes(
        b,
        Claim::Lock,
        "locked_relay_killed_by_sigkill_another_finishes",
    )
    .await;
}

async fn killed_relay_another_finishes<B: Backend>(b: &B, claim: Claim, name: &str) {
    let (entities, per_entity) = (20, 5);
    seed(b, entities, per_entity).await;
    let dir = tempfile::tempdir().unwrap();
    let thread = std::thread::current();
    let test = thread.name().filter(|n| n.ends_with(name)).unwrap_or(name);
    let mode = if claim == Claim::Lock {
        "lock"
    } else {
        "lease"
    };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(
            super::CHILD,
            format!(
                "{RELAY_CHILD}{mode}|{}|{}",
                b.child_handle(),
                dir.path().display()
            ),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let hung = dir.path().join("hung");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !hung.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        assert!(std::time::Instant::now() < deadline, "the child never hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
    }
    let by_child: Vec<(i64, i64)> = std::fs::read_to_string(dir.path().join("published"))
        .unwrap()
        .lines()
        .map(|l| {
            let (e, v) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("a partial line in the child's log: {l:?}"));
            (e.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    let unrecorded = if claim == Claim::Lock {
        assert_no_lease(b).await;
        // The child's session is gone once the server saw its socket close: nothing of
        // it holds a lock.
        until_no_transaction_is_open(b).await;
        // Unrecorded: published by the child and still pending (its last batch).
        let pending: HashSet<(i64, i64)> = list_pending(b).await;
        let held = by_child.iter().filter(|k| pending.contains(k)).count() as i64;
        assert!(
            held > 0,
            "the child was killed holding no published, unrecorded event"
        );
        assert!(held <= 8, "{held} unrecorded events, more than one batch");
        held
    } else {
        let unrecorded = b
            .scalar(
                "SELECT COUNT(*) FROM outbox WHERE status = 'PENDING' AND owner_token IS NOT NULL",
            )
            .await;
        assert!(unrecorded > 0, "the child was killed holding no claim");
        unrecorded
    };
    assert!(
        !by_child.is_empty(),
        "the child published nothing before it was killed"
    );
    let rec = Arc::new(Recorder::default());
    let relay = Relay::new(
        b.store(Duration::from_secs(10)).await,
        RecordingSink {
            rec: rec.clone(),
            relay: 1,
        },
    )
    .with_config(fast(8))
    .unwrap();
    drain(&relay).await;
    let mut all: Vec<(i64, i64)> = by_child.clone();
    all.extend(rec.received().iter().map(|r| (r.0, r.1)));
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut twice = 0;
    for (entity, version) in &all {
        let seen = firsts.entry(*entity).or_default();
        if seen.contains(version) {
            twice += 1;
        } else {
            seen.push(*version);
        }
    }
    for entity in 1..=entities {
        assert_eq!(
            firsts.get(&entity),
            Some(&(1..=per_entity).collect::<Vec<_>>()),
            "entity {entity}"
        );
    }
    assert!(
        twice as i64 <= unrecorded,
        "{twice} duplicates, more than the {unrecorded} events the child left claimed"
    );
    if claim == Claim::Lock {
        assert_eq!(
            b.scalar("SELECT COUNT(*) FROM outbox WHERE attempts <> 1 OR status <> 'PUBLISHED'")
                .await,
            0,
            "an event counted an attempt the killed child never recorded"
        );
    }
}

/// The keys of the pending events.
async fn list_pending<B: Backend>(b: &B) -> HashSet<(i64, i64)> {
    Outbox::new(b.store(Duration::from_secs(10)).await)
        .pending(1000)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.entity_id, e.version))
        .collect()
}

/// The child of `relay_killed_by_sigkill_another_finishes`: relays with a lease of one
/// second through a sink that logs each publish to a file and, from the 25th on, logs
/// and then hangs (marking `hung`).
pub(crate) async fn relay_child<B: Backend>(spec: &str) {
    let (mode, spec) = spec.split_once('|').expect("mode|handle|directory");
    let claim = if mode == "lock" {
        Claim::Lock
    } else {
        Claim::Lease
    };
    let (handle, dir) = spec.split_once('|').expect("handle|directory");
    let dir = std::path::PathBuf::from(dir);
    let store = B::child_store(handle).await;
    let sink = FileSink {
        dir,
        count: Arc::new(AtomicUsize::new(0)),
    };
    let relay = Relay::new(store, sink)
        .with_config(
            fast_by(8, claim)
                .lease(Duration::from_secs(1))
                .publish_timeout(Duration::from_millis(400))
                // Hung publishes time out and are retried until the kill: none may go dead
                // first, however late the kill comes on a loaded machine.
                .max_attempts(1000),
        )
        .unwrap();
    relay.run(std::future::pending()).await.unwrap();
}

#[derive(Clone)]
struct FileSink {
    dir: std::path::PathBuf,
    count: Arc<AtomicUsize>,
}

impl Sink for FileSink {
    async fn publish(&self, m: &Message) -> Result<(), SinkError> {
        use std::io::Write;
        let n = self.count.fetch_add(1, Ordering::SeqCst);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("published"))
            .unwrap();
        // One write call per line: publishes run concurrently, and the child is killed
        // while some of them are writing. `writeln!` on a `File` writes each piece of
        // the line with a call of its own, so a kill between two left a partial line.
        let line = format!("{} {}\n", m.entity_id, m.version);
        log.write_all(line.as_bytes()).unwrap();
        log.sync_all().unwrap();
        if n >= 25 {
            std::fs::write(self.dir.join("hung"), b"").unwrap();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// A request's own event body is stored in the outbox row of an emitting edge and
/// published as the message's body (without one, the body is the event's fields as
/// JSON); a replay with another body writes nothing; a body too large is refused and
/// nothing is written.
pub async fn event_body_is_published_as_the_message_body<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=3 {
        e.create(id).await.unwrap();
    }
    let body = serde_json::json!({"amount": 4200, "currency": "EUR"});
    let paid = e
        .transition(1, super::OrderEvent::Pay, "p-1")
        .event_body(&body)
        .await
        .unwrap();
    assert!(paid.is_applied());
    let replay = e
        .transition(1, super::OrderEvent::Pay, "p-1")
        .event_body(&serde_json::json!({"amount": 1}))
        .await
        .unwrap();
    assert!(!replay.is_applied());
    let mut tx = b.begin().await;
    e.transition(2, super::OrderEvent::Pay, "p-2")
        .event_body(&serde_json::json!({"amount": 7}))
        .within(&mut tx)
        .await
        .unwrap();
    B::commit(tx).await;
    let huge = "x".repeat(1024 * 1024 + 1);
    let refused = e
        .transition(3, super::OrderEvent::Pay, "p-3")
        .event_body(&huge)
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(e.get(3).await.unwrap().version, 0, "nothing written");
    e.transition(3, super::OrderEvent::Pay, "p-3")
        .await
        .unwrap();

    let (sink, mut received) = orderly::outbox::ChannelSink::new();
    let relay = Relay::new(b.store(Duration::from_secs(10)).await, sink);
    assert_eq!(relay.relay_once().await.unwrap().published, 3);
    let mut bodies = HashMap::new();
    while let Ok(m) = received.try_recv() {
        bodies.insert(
            m.entity_id,
            serde_json::from_str::<serde_json::Value>(&m.body).unwrap(),
        );
    }
    assert_eq!(bodies[&1], body, "the attached body, not the replay's");
    assert_eq!(bodies[&2], serde_json::json!({"amount": 7}));
    assert_eq!(bodies[&3]["id"], "OrderMachine:3:1");
    assert_eq!(bodies[&3]["event"], "OrderPaid");
    assert_eq!(bodies[&3]["ref_id"], "p-3");
}

orderly::flow! {
    /// A flow of one local step: the payment's transition inside the step's checkpoint
    /// transaction, then (if its input says so) a failure.
    pub PayStepFlow {
        kind: "outbox_pay";
        version: 1;
        steps: PayStepFlowStep {
            Pay: local,
        }
    }
}

/// The event of a transition inside a flow's local step commits with the step's
/// checkpoint, and is absent when the step fails after the transition (its transaction,
/// the transition and the event with it, rolled back); a replayed flow writes no second
/// event.
pub async fn events_commit_with_flow_local_steps<B: Backend>(b: &B) {
    use orderly::flow::FlowOutcome;
    let e = engine(b).await;
    e.create(1).await.unwrap();
    e.create(2).await.unwrap();
    let moved = e.clone();
    let def = orderly::Definition::<B::S, (i64, bool)>::new(PayStepFlow).local(
        PayStepFlowStep::Pay,
        move |conn, ctx| {
            let e = moved.clone();
            Box::pin(async move {
                let (id, fail) = *ctx.input();
                e.transition(id, super::OrderEvent::Pay, "p")
                    .within(conn)
                    .await?;
                if fail {
                    return Err(orderly::StepError::fail("declined after the transition"));
                }
                Ok(())
            })
        },
    );
    let f = orderly::Flows::new(
        b.store(Duration::from_secs(10)).await,
        super::flows::config(Duration::from_secs(30)),
    )
    .unwrap()
    .register(def)
    .unwrap();
    let done = f.start(PayStepFlow, "ok", &(1, false)).await.unwrap();
    assert!(
        matches!(done.outcome, FlowOutcome::Completed(_)),
        "{:?}",
        done.outcome
    );
    let again = f.start(PayStepFlow, "ok", &(1, false)).await.unwrap();
    assert!(again.replayed);
    let failed = f.start(PayStepFlow, "fail", &(2, true)).await.unwrap();
    assert!(
        matches!(failed.outcome, FlowOutcome::Compensated { .. }),
        "{:?}",
        failed.outcome
    );
    let count = |id: i64| {
        format!("SELECT COUNT(*) FROM outbox WHERE entity_id = {id} AND event = 'OrderPaid'")
    };
    assert_eq!(
        b.scalar(&count(1)).await,
        1,
        "committed with the step, once"
    );
    assert_eq!(b.scalar(&count(2)).await, 0, "rolled back with the step");
    assert_eq!(e.get(2).await.unwrap().version, 0);
}
