//! What the page and the command line show, as rows: history lines, outbox events,
//! timers, an entity's timeline, the overview's counts, what a search found.

use serde::Serialize;

use crate::admin::lookup::{FlowHit, RecordHit};
use crate::error::{Error, Result};
use crate::outbox::{EventKey, EventRow};
use crate::store::RefRow;
use crate::store::timers::ClaimedTimer;

/// One history row, as text.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Line {
    pub(crate) seq: i64,
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) event: String,
    pub(crate) ref_id: String,
    pub(crate) payload_hash: Option<String>,
    pub(crate) actor: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) at: String,
}

/// An outbox event, as shown.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Event {
    /// `{machine}:{entity_id}:{version}`, as brokers see it.
    pub(crate) id: String,
    pub(crate) machine: String,
    pub(crate) entity_id: i64,
    pub(crate) version: i64,
    pub(crate) event: String,
    pub(crate) ref_id: String,
    pub(crate) status: String,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) age_ms: Option<i64>,
}

impl From<EventRow> for Event {
    fn from(r: EventRow) -> Self {
        Event {
            id: format!("{}:{}:{}", r.machine, r.entity_id, r.version),
            machine: r.machine,
            entity_id: r.entity_id,
            version: r.version,
            event: r.event,
            ref_id: r.ref_id,
            status: r.status,
            attempts: r.attempts,
            last_error: r.last_error,
            age_ms: r.age_ms,
        }
    }
}

/// A timer, as shown.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TimerLine {
    pub(crate) event: String,
    pub(crate) ref_id: String,
    /// `None` for a row that does not read.
    pub(crate) due_at: Option<i64>,
    pub(crate) status: String,
    pub(crate) outcome: Option<String>,
    pub(crate) last_error: Option<String>,
}

/// A timer row as the timeline shows it; one that does not read is shown as such, with
/// its id and the reason, never left out.
impl From<ClaimedTimer> for TimerLine {
    fn from(t: ClaimedTimer) -> Self {
        match t {
            Ok(t) => TimerLine {
                event: t.event,
                ref_id: t.ref_id,
                due_at: Some(t.due_at),
                status: t.status,
                outcome: t.outcome,
                last_error: t.last_error,
            },
            Err(corrupt) => TimerLine {
                event: String::new(),
                ref_id: String::new(),
                due_at: None,
                status: "UNREADABLE".into(),
                outcome: None,
                last_error: Some(match corrupt.id {
                    Some(id) => format!("timer {id}: {}", corrupt.reason),
                    None => corrupt.reason,
                }),
            },
        }
    }
}

/// An entity as an operator reads it: its state, history, outbox events and timers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Timeline {
    pub(crate) machine: String,
    pub(crate) id: i64,
    pub(crate) state: Option<String>,
    pub(crate) version: Option<i64>,
    /// A page of the history, newest first.
    pub(crate) history: Vec<Line>,
    /// The version the next page reads below, if there are older rows.
    pub(crate) older: Option<i64>,
    pub(crate) events: Vec<Event>,
    pub(crate) timers: Vec<TimerLine>,
}

/// The counts the overview shows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Overview {
    pub(crate) outbox: OutboxCounts,
    pub(crate) timers: TimerCounts,
    pub(crate) flows: FlowCounts,
    pub(crate) records: RecordCounts,
    pub(crate) machines: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct OutboxCounts {
    pub(crate) pending: u64,
    pub(crate) dead: u64,
    pub(crate) corrupt: u64,
    pub(crate) oldest_pending_ms: u64,
    /// Published in the last minute (the throughput); `None` where the store does not
    /// count them.
    pub(crate) published_last_minute: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TimerCounts {
    pub(crate) pending: i64,
    pub(crate) due: i64,
    pub(crate) dead: i64,
    pub(crate) oldest_late_ms: i64,
}

/// Counted whole.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FlowCounts {
    pub(crate) parked: u64,
    pub(crate) running: u64,
}

/// Counted whole.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RecordCounts {
    pub(crate) stuck: u64,
    /// `None` where the store does not count them.
    pub(crate) in_flight: Option<u64>,
}

/// A history row found by its reference, with its machine.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HistoryHit {
    pub(crate) machine: String,
    #[serde(flatten)]
    pub(crate) row: RefRow,
}

/// What a search found: history rows by reference, records by key, flows by key,
/// outbox events by reference or message id, and, for a number, the entity of that id
/// in each machine that has it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Found {
    pub(crate) term: String,
    /// Whether it found what starts with the term.
    pub(crate) prefix: bool,
    pub(crate) history: Vec<HistoryHit>,
    pub(crate) records: Vec<RecordHit>,
    pub(crate) flows: Vec<FlowHit>,
    pub(crate) events: Vec<Event>,
    pub(crate) entities: Vec<(String, i64)>,
}

impl Found {
    /// Whether a kind filled its limit (there may be more of it).
    pub(crate) fn full(&self) -> bool {
        [
            self.history.len(),
            self.records.len(),
            self.flows.len(),
            self.events.len(),
        ]
        .into_iter()
        .any(|n| n as i64 >= super::FOUND_MAX)
    }

    /// How many things it found.
    pub(crate) fn count(&self) -> usize {
        self.history.len()
            + self.records.len()
            + self.flows.len()
            + self.events.len()
            + self.entities.len()
    }
}

/// Milliseconds since the epoch as an RFC 3339 time.
pub(crate) fn time_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), |t| t.to_rfc3339())
}

/// The parts of a message id `{machine}:{entity_id}:{version}`, if `term` is one.
pub(crate) fn message_id(term: &str) -> Option<(&str, i64, i64)> {
    let (rest, version) = term.rsplit_once(':')?;
    let (machine, entity_id) = rest.rsplit_once(':')?;
    if machine.is_empty() {
        return None;
    }
    Some((machine, entity_id.parse().ok()?, version.parse().ok()?))
}

/// The event a message id names; [`Error::InvalidInput`] if `id` is none.
pub(crate) fn event_key(id: &str) -> Result<EventKey> {
    let (machine, entity_id, version) = message_id(id).ok_or_else(|| {
        Error::InvalidInput(format!(
            "a message id is machine:entity_id:version, not {id:?}"
        ))
    })?;
    Ok(EventKey {
        machine: machine.to_string(),
        entity_id,
        version,
    })
}

/// An event's message id, `{machine}:{entity_id}:{version}`.
pub(crate) fn id_of(key: &EventKey) -> String {
    format!("{}:{}:{}", key.machine, key.entity_id, key.version)
}
