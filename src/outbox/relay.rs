//! The relay: claim → publish → record. A round claims by row lock (`locked`) where
//! the store holds claims that way, by lease under a token of its own (`leased`)
//! otherwise.

mod leased;
mod locked;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tracing::Instrument;

use super::view::Outbox;
use super::{ClaimedEvent, EventKey, EventRow, Message, OutboxStore, Sink, SinkError};
use super::{MAX_LEASE, millis};
use crate::error::Error;
use crate::error::Result;
use crate::support::text::bounded;

/// The largest batch a relay claims: its keys are bound three parameters each, well
/// inside every backend's limit.
const MAX_BATCH: u32 = 1000;

/// How a relay claims, publishes and retries.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The most events claimed (and published together) in one round, 1 to 1000.
    /// Default 128.
    pub batch: u32,
    /// How long a claim lasts: another relay takes an event over only after this.
    /// Default 30 s; at least twice `publish_timeout`, at most a day.
    pub lease: Duration,
    /// How long one publish may take before it counts as failed. Default 10 s.
    pub publish_timeout: Duration,
    /// Claims of one event after which a failing event goes to the dead state. Default 10.
    pub max_attempts: u32,
    /// The first retry's delay; each next one doubles, with jitter. Default 500 ms.
    pub min_backoff: Duration,
    /// The longest retry delay (at most a day). Default 5 min.
    pub max_backoff: Duration,
    /// How long [`Relay::run`] sleeps when a round found nothing to publish (or failed).
    /// Default 200 ms.
    pub idle: Duration,
    /// How a round holds the events it publishes. Default [`Claim::Lock`].
    pub claim: Claim,
}

crate::support::config::setters!(RelayConfig {
    batch: u32,
    lease: Duration,
    publish_timeout: Duration,
    max_attempts: u32,
    min_backoff: Duration,
    max_backoff: Duration,
    idle: Duration,
    claim: Claim,
});

/// How a relay's round holds the events it publishes, so that no other relay publishes
/// them at the same time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Claim {
    /// Row locks, held in one transaction across the publish, where the store can hold
    /// them (one PostgreSQL or MySQL/MariaDB server): the round locks the batch, publishes
    /// it and records the outcomes in one commit, and writes nothing for the claim itself.
    /// A relay that dies mid-batch releases its events when its connection closes, and
    /// the attempt it was making is not counted. Elsewhere (SQLite, whose write
    /// transaction would hold the whole database across the publish; a Galera node, whose
    /// row locks bind no other node) a [`Claim::Lease`].
    #[default]
    Lock,
    /// A lease written with the claim's token in one short transaction, the outcomes
    /// recorded under that token afterwards: nothing is held open across the publish, and
    /// an event whose relay died is taken over when the lease runs out. Each claim counts
    /// an attempt.
    Lease,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch: 128,
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            max_attempts: 10,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(300),
            idle: Duration::from_millis(200),
            claim: Claim::Lock,
        }
    }
}

impl RelayConfig {
    fn check(&self) -> Result<()> {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        let mut problems = Vec::new();
        if self.batch == 0 || self.batch > MAX_BATCH {
            problems.push("batch must be 1 to 1000");
        }
        if self.max_attempts == 0 || self.max_attempts > i32::MAX as u32 {
            problems.push("max_attempts must be 1 to 2147483647");
        }
        if self.publish_timeout.is_zero() {
            problems.push("publish_timeout must be positive");
        }
        // The lease starts at the claim; the publishes, the slowest of the batch, and the
        // record must all fit in it.
        if self.lease < self.publish_timeout.saturating_mul(2) {
            problems.push("lease must be at least twice publish_timeout");
        }
        if self.lease > MAX_LEASE {
            problems.push("lease must be at most a day");
        }
        if self.min_backoff > self.max_backoff {
            problems.push("min_backoff must not exceed max_backoff");
        }
        if self.max_backoff > DAY {
            problems.push("max_backoff must be at most a day");
        }
        if self.idle.is_zero() {
            problems.push("idle must be positive");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "relay config: {}",
                problems.join("; ")
            )))
        }
    }
}

/// What one round of a relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayRound {
    /// Events this round claimed.
    pub claimed: usize,
    /// Published and recorded so.
    pub published: usize,
    /// Failed to publish: due again after a backoff.
    pub retried: usize,
    /// Moved to the dead state (refused for good, or out of attempts).
    pub dead: usize,
    /// Whose claim another relay took over before the outcome was recorded (published
    /// here or not, the other relay publishes it again: the broker or the consumer
    /// dedupes by [`Message::id`]).
    pub lost: usize,
    /// Rows orderly never writes (a column that does not read, a version below 1, a
    /// `created_at` that is no time, a body that is not JSON): never published, moved to
    /// the dead state with the reason (so they hold back only their own entity), and
    /// logged.
    pub corrupt: usize,
}

impl RelayRound {
    fn add(&mut self, other: RelayRound) {
        self.claimed += other.claimed;
        self.published += other.published;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lost += other.lost;
        self.corrupt += other.corrupt;
    }
}

/// A relay: claims the outbox's events, publishes them through a [`Sink`], and records
/// each outcome fenced by its claim. Run several (tasks or processes) over one database:
/// no two publish one event at once, and one entity's events go out in version order.
#[derive(Debug)]
pub struct Relay<S, K> {
    outbox: Outbox<S>,
    sink: Arc<K>,
    config: RelayConfig,
}

impl<S: OutboxStore, K: Sink> Relay<S, K> {
    /// A relay of `store`'s outbox to `sink`, with the default [`RelayConfig`].
    pub fn new(store: S, sink: K) -> Self {
        Relay {
            outbox: Outbox::new(store),
            sink: Arc::new(sink),
            config: RelayConfig::default(),
        }
    }

    /// The same relay with `config`; [`Error::InvalidInput`] naming every problem if the
    /// config cannot work (a zero batch, a lease no longer than the publish timeout).
    pub fn with_config(mut self, config: RelayConfig) -> Result<Self> {
        config.check()?;
        self.config = config;
        Ok(self)
    }

    /// The outbox it relays.
    pub fn outbox(&self) -> &Outbox<S> {
        &self.outbox
    }

    /// The sink it publishes to.
    pub fn sink(&self) -> &K {
        &self.sink
    }

    /// One round: claims up to [`RelayConfig::batch`] events (the earliest unpublished
    /// event of each entity, so one round holds at most one event per entity),
    /// publishes them concurrently, and records the outcomes: published events in one
    /// statement, each failure on its own (retried after a backoff, or dead).
    pub async fn relay_once(&self) -> Result<RelayRound> {
        // At debug level: an idle relay runs a round five times a second.
        let span = tracing::debug_span!(
            "orderly.relay",
            claimed = tracing::field::Empty,
            published = tracing::field::Empty,
        );
        let out = self.relay_round().instrument(span.clone()).await;
        if let Ok(r) = &out {
            span.record("claimed", r.claimed);
            span.record("published", r.published);
            crate::observe::relay_round(r.published, r.retried, r.dead, r.lost, r.corrupt);
        }
        out
    }

    async fn relay_round(&self) -> Result<RelayRound> {
        if self.config.claim == Claim::Lock
            && let Some(round) = self.locked_round().await?
        {
            return Ok(round);
        }
        self.leased_round().await
    }

    /// Publishes `rows` concurrently: the keys published, and the failures with the
    /// attempts they count.
    async fn publish_batch(
        &self,
        rows: &[EventRow],
    ) -> (Vec<EventKey>, Vec<(EventKey, i32, SinkError)>) {
        let outcomes = join_all(rows.iter().map(|row| self.publish(row))).await;
        let mut published = Vec::new();
        let mut failed = Vec::new();
        for (row, outcome) in rows.iter().zip(outcomes) {
            let key = EventKey {
                machine: row.machine.clone(),
                entity_id: row.entity_id,
                version: row.version,
            };
            match outcome {
                Ok(()) => published.push(key),
                Err(e) => failed.push((key, row.attempts, e)),
            }
        }
        (published, failed)
    }

    /// A failed publish of an event claimed `attempts` times, logged: the error as
    /// recorded, the delay before the next try, and whether the event is dead.
    fn failure(&self, key: &EventKey, attempts: i32, error: SinkError) -> (String, i64, bool) {
        let dead = error.permanent
            || u32::try_from(attempts).unwrap_or(u32::MAX) >= self.config.max_attempts;
        let error = bounded(error.message);
        tracing::warn!(
            machine = %key.machine, entity = key.entity_id, version = key.version,
            attempts, dead, error = %error, "publishing an outbox event failed"
        );
        (error, millis(self.backoff(attempts)), dead)
    }

    /// Runs rounds until `shutdown` completes: back to back while there is work, every
    /// [`RelayConfig::idle`] when there is none or a round failed (a database error is
    /// logged and tried again). The round in hand when `shutdown` completes is finished
    /// first. Returns what all rounds did.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<RelayRound> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = RelayRound::default();
        loop {
            let pause = match self.relay_once().await {
                Ok(round) => {
                    total.add(round);
                    round.claimed < self.config.batch as usize
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay round failed");
                    true
                }
            };
            let wait = if pause {
                self.config.idle
            } else {
                Duration::ZERO
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(total),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Publishes one event, bounded by the publish timeout, in a span of its own (kind
    /// PRODUCER; with the `otel` feature, a child of the event's stored trace context,
    /// linked to the round's span, whose own context the message carries).
    async fn publish(&self, row: &EventRow) -> std::result::Result<(), SinkError> {
        #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
        let mut message = Message::from_row(row);
        let span = tracing::info_span!(
            "orderly.publish",
            otel.kind = "producer",
            messaging.message.id = %message.id,
            outcome = tracing::field::Empty,
        );
        #[cfg(feature = "otel")]
        {
            message.trace = crate::support::otel::producer(&span, row.trace.as_ref());
        }
        let publish =
            tokio::time::timeout(self.config.publish_timeout, self.sink.publish(&message));
        let outcome = match publish.instrument(span.clone()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(SinkError::retry(format!(
                "publish timed out after {:?}",
                self.config.publish_timeout
            ))),
        };
        let label = match &outcome {
            Ok(()) => "published",
            Err(e) if e.permanent => "refused",
            Err(_) => "failed",
        };
        span.record("outcome", label);
        outcome
    }

    /// The delay before the next try of an event claimed `attempts` times.
    fn backoff(&self, attempts: i32) -> Duration {
        crate::support::retry::delay(self.config.min_backoff, self.config.max_backoff, attempts)
    }
}

/// Logs a claimed row that must not be published, and returns its key if it read (to be
/// recorded dead with the reason; one whose key did not read is left as it is).
fn set_aside(key: Option<EventKey>, reason: &str) -> Option<EventKey> {
    tracing::error!(
        ?key,
        reason,
        "a corrupt outbox row is set aside, not published"
    );
    key
}

/// The claimed rows to publish, and the ones to set aside (key, reason): rows that did not
/// read, and rows that read but are nothing orderly writes.
fn sort_out(claimed: Vec<ClaimedEvent>) -> (Vec<EventRow>, Vec<(Option<EventKey>, String)>) {
    let mut rows = Vec::with_capacity(claimed.len());
    let mut corrupt = Vec::new();
    for row in claimed {
        match row {
            Ok(row) => match corrupt_reason(&row) {
                None => rows.push(row),
                Some(reason) => corrupt.push((
                    Some(EventKey {
                        machine: row.machine,
                        entity_id: row.entity_id,
                        version: row.version,
                    }),
                    reason,
                )),
            },
            Err(c) => corrupt.push((c.key, c.reason)),
        }
    }
    (rows, corrupt)
}

/// Why an event row that read is still nothing orderly writes, if it is not.
fn corrupt_reason(row: &EventRow) -> Option<String> {
    if row.version < 1 {
        return Some(format!("version {} (versions start at 1)", row.version));
    }
    if row.age_ms.is_none() {
        return Some("created_at is no time (infinity, or a zero date)".into());
    }
    if let Some(body) = &row.body
        && serde_json::from_str::<serde::de::IgnoredAny>(body).is_err()
    {
        return Some("the body is not JSON".into());
    }
    None
}
