//! What the page and the command line read and do, written once: an entity's timeline,
//! the search, the filter of dead events, and the actions, each going through the
//! library's own fenced calls and recorded in the audit trail.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use serde::Serialize;

use super::AdminStore;
use super::panel::{Admin, LIST_MAX};
use crate::admin::lookup::{EventsBy, FlowHit, RecordHit, StuckRecord};
use crate::flow::{FlowConfig, Flows, Listing, Resume};
use crate::outbox::{EventKey, EventRow, Outbox};
use crate::store::audit::AuditEntry;
use crate::store::timers::TimerRow;
use crate::store::{Lease, RefRow, Store};
use crate::timer::{TimerKey, Timers};
use crate::{Error, Result};

/// How many dead events a bulk requeue reads, and requeues, at a time.
pub(crate) const BATCH: u32 = 500;

/// How many rows of each kind a search shows.
pub(crate) const FOUND_MAX: i64 = 100;

/// What an action did: how many things it changed, or the error it stopped at and how
/// many it had changed by then.
pub(crate) type Acted = std::result::Result<i64, (Error, i64)>;

/// The longest `who` and `target` recorded (the audit table holds them).
const MAX_WHO: usize = 255;
const MAX_TARGET: usize = 4096;

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
    pub(crate) due_at: i64,
    pub(crate) status: String,
    pub(crate) outcome: Option<String>,
    pub(crate) last_error: Option<String>,
}

impl From<TimerRow> for TimerLine {
    fn from(t: TimerRow) -> Self {
        TimerLine {
            event: t.event,
            ref_id: t.ref_id,
            due_at: t.due_at,
            status: t.status,
            outcome: t.outcome,
            last_error: t.last_error,
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
    pub(crate) history: Vec<Line>,
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
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TimerCounts {
    pub(crate) pending: i64,
    pub(crate) due: i64,
    pub(crate) dead: i64,
    pub(crate) oldest_late_ms: i64,
}

/// Counted up to [`LIST_MAX`] each.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FlowCounts {
    pub(crate) parked: usize,
    pub(crate) running: usize,
}

/// Counted up to [`LIST_MAX`].
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RecordCounts {
    pub(crate) stuck: usize,
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
    pub(crate) history: Vec<HistoryHit>,
    pub(crate) records: Vec<RecordHit>,
    pub(crate) flows: Vec<FlowHit>,
    pub(crate) events: Vec<Event>,
    pub(crate) entities: Vec<(String, i64)>,
}

impl Found {
    /// How many things it found.
    pub(crate) fn count(&self) -> usize {
        self.history.len()
            + self.records.len()
            + self.flows.len()
            + self.events.len()
            + self.entities.len()
    }
}

/// Which dead events a list or a bulk requeue takes: each field absent meaning any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    pub(crate) machine: Option<String>,
    pub(crate) event: Option<String>,
    /// Text the last error contains.
    pub(crate) error: Option<String>,
    /// Dead events at least this old (from their write), in seconds.
    pub(crate) older_than_s: Option<u64>,
}

impl Filter {
    /// The filter of a form or a query (`machine`, `event`, `error`, `older` in
    /// seconds), blank fields meaning any; an `older` that is no count of seconds is
    /// [`Error::InvalidInput`].
    pub(crate) fn from_fields(q: &HashMap<String, String>) -> Result<Self> {
        let want = |k: &str| {
            q.get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let older_than_s = match want("older") {
            None => None,
            Some(text) => Some(text.parse().map_err(|_| {
                Error::InvalidInput(format!("older is a count of seconds, not {text:?}"))
            })?),
        };
        Ok(Filter {
            machine: want("machine"),
            event: want("event"),
            error: want("error"),
            older_than_s,
        })
    }

    /// The filter as form fields (blank for any).
    pub(crate) fn fields(&self) -> [(&'static str, String); 4] {
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        [
            ("machine", text(&self.machine)),
            ("event", text(&self.event)),
            ("error", text(&self.error)),
            (
                "older",
                self.older_than_s
                    .map_or_else(String::new, |s| s.to_string()),
            ),
        ]
    }

    /// Whether `row` matches.
    pub(crate) fn matches(&self, row: &EventRow) -> bool {
        self.machine.as_ref().is_none_or(|m| *m == row.machine)
            && self.event.as_ref().is_none_or(|e| *e == row.event)
            && self.error.as_ref().is_none_or(|t| {
                row.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains(t.as_str()))
            })
            && self.older_than_s.is_none_or(|s| {
                let at_least = i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX);
                row.age_ms.is_some_and(|age| age >= at_least)
            })
    }

    /// The filter in words, as the audit trail records it.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("machine", &self.machine),
            ("event", &self.event),
            ("error", &self.error),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        }
        if let Some(s) = self.older_than_s {
            parts.push(format!("older than {s} s"));
        }
        if parts.is_empty() {
            "every dead event".to_string()
        } else {
            format!("dead events where {}", parts.join(", "))
        }
    }
}

/// How to resume a parked flow, by its name on a form or a command line.
pub(crate) fn resume_how(how: &str, output: Option<&str>) -> Result<Resume> {
    match how {
        "retry" => Ok(Resume::Retry),
        "compensate" => Ok(Resume::Compensate),
        "applied" => {
            let text = output
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .unwrap_or("null");
            let value = serde_json::from_str(text).map_err(|e| {
                Error::InvalidInput(format!("the step's output is not JSON ({e}): {text:?}"))
            })?;
            Ok(Resume::Applied(value))
        }
        other => Err(Error::InvalidInput(format!(
            "a resume is retry, applied or compensate, not {other:?}"
        ))),
    }
}

/// What to do with a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnTimer {
    Rearm,
    Cancel,
}

/// `text` cut to `max` bytes at a character boundary.
fn bounded(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The entity's state and its history, read raw from `store` (names as stored).
async fn raw_timeline<S: Store>(
    store: &S,
    id: i64,
) -> Result<(Option<crate::store::Entity>, Vec<Line>)> {
    let now = Lease::run(store, async |c| store.get(c, id).await).await?;
    let rows = Lease::run(store, async |c| store.history(c, id).await).await?;
    let lines = rows
        .into_iter()
        .map(|r| Line {
            seq: r.seq,
            from: r.from,
            to: r.to,
            event: r.event,
            ref_id: r.ref_id,
            payload_hash: r.payload_hash,
            actor: r.actor,
            reason: r.reason,
            at: r.created_at.to_rfc3339(),
        })
        .collect();
    Ok((now, lines))
}

impl<S: AdminStore> Admin<S> {
    /// The registered flows, or the store's flows under no definition (which lists
    /// them, and resumes none).
    pub(crate) fn flows_here(&self) -> Result<Flows<S>> {
        match &self.flows {
            Some(flows) => Ok(flows.clone()),
            None => Flows::new(self.store.clone(), FlowConfig::default()),
        }
    }

    /// Up to [`LIST_MAX`] records stuck in PROCESSING past their lease, of one scope or
    /// of all.
    pub(crate) async fn stuck_records(&self, scope: Option<&str>) -> Result<Vec<StuckRecord>> {
        let store = &self.store;
        Lease::run(store, async |c| {
            store.stuck_records(c, scope, i64::from(LIST_MAX)).await
        })
        .await
    }

    /// The overview's counts.
    pub(crate) async fn overview(&self) -> Result<Overview> {
        let outbox = Outbox::new(self.store.clone()).stats().await?;
        let timers = Timers::new(self.store.clone()).stats().await?;
        let flows = self.flows_here()?;
        let parked = flows.list(Listing::Parked, None, LIST_MAX).await?.len();
        let running = flows.list(Listing::Running, None, LIST_MAX).await?.len();
        let stuck = self.stuck_records(None).await?.len();
        Ok(Overview {
            outbox: OutboxCounts {
                pending: outbox.pending,
                dead: outbox.dead,
                corrupt: outbox.corrupt,
                oldest_pending_ms: u64::try_from(outbox.oldest_pending.as_millis())
                    .unwrap_or(u64::MAX),
            },
            timers: TimerCounts {
                pending: timers.pending,
                due: timers.due,
                dead: timers.dead,
                oldest_late_ms: timers.oldest_late_ms,
            },
            flows: FlowCounts { parked, running },
            records: RecordCounts { stuck },
            machines: self.machines.keys().map(|m| m.to_string()).collect(),
        })
    }

    /// The store of `machine`'s entities: its registered engine's, else the page's own.
    fn entities_of(&self, machine: &str) -> &S {
        self.machines
            .get(machine)
            .map_or(&self.store, |m| m.store())
    }

    /// The store the page reads.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The graph of a registered machine, as Mermaid text.
    pub(crate) fn graph(&self, machine: &str) -> Option<String> {
        self.machines.get(machine).map(|m| m.graph())
    }

    /// How many entities of a registered machine are in each state (a read of its
    /// entity table whole); `None` for a machine not registered.
    pub(crate) async fn states(&self, machine: &str) -> Result<Option<Vec<(String, i64)>>> {
        let Some(view) = self.machines.get(machine) else {
            return Ok(None);
        };
        let store = view.store();
        Ok(Some(
            Lease::run(store, async |c| store.count_by_status(c).await).await?,
        ))
    }

    /// The latest `limit` actions of the audit trail, newest first.
    pub(crate) async fn audit(&self, limit: i64) -> Result<Vec<crate::store::audit::AuditRow>> {
        let store = &self.store;
        Lease::run(store, async |c| store.list_audit(c, limit).await).await
    }

    /// Whether `machine` is registered with this page.
    pub(crate) fn knows_machine(&self, machine: &str) -> bool {
        self.machines.contains_key(machine)
    }

    /// Entity `id` of `machine`: its state and history (from the machine's store, or the
    /// page's own for a machine not registered), its outbox events and its timers.
    pub(crate) async fn timeline(&self, machine: &str, id: i64) -> Result<Timeline> {
        let (now, history) = raw_timeline(self.entities_of(machine), id).await?;
        let store = &self.store;
        let by = EventsBy::Entity {
            machine,
            entity_id: id,
        };
        let events = Lease::run(store, async |c| store.events_by(c, by, FOUND_MAX).await).await?;
        let timers = Lease::run(store, async |c| store.timers_of(c, machine, id).await).await?;
        Ok(Timeline {
            machine: machine.to_string(),
            id,
            state: now.as_ref().map(|e| e.status.clone()),
            version: now.as_ref().map(|e| e.version),
            history,
            events: events.into_iter().map(Event::from).collect(),
            timers: timers
                .into_iter()
                .filter_map(|t| t.ok())
                .map(TimerLine::from)
                .collect(),
        })
    }

    /// Everything `term` names: history rows of every registered machine (or of the
    /// page's own store if none is) made with it as their reference, records and flows
    /// with it as their key, outbox events with it as their reference or message id, and
    /// for an integer, the entities with that id.
    pub(crate) async fn search(&self, term: &str) -> Result<Found> {
        let term = term.trim();
        if term.is_empty() {
            return Err(Error::InvalidInput("a search needs a term".into()));
        }
        crate::support::input::validate_reference("a search term", term)?;
        let mut found = Found {
            term: term.to_string(),
            history: Vec::new(),
            records: Vec::new(),
            flows: Vec::new(),
            events: Vec::new(),
            entities: Vec::new(),
        };
        let stores: Vec<(&str, &S)> = if self.machines.is_empty() {
            vec![("", &self.store)]
        } else {
            self.machines.iter().map(|(n, m)| (*n, m.store())).collect()
        };
        for (machine, store) in &stores {
            let rows = Lease::run(*store, async |c| store.by_ref(c, term, FOUND_MAX).await).await?;
            found.history.extend(rows.into_iter().map(|row| HistoryHit {
                machine: machine.to_string(),
                row,
            }));
            if let Ok(id) = term.parse::<i64>()
                && Lease::run(*store, async |c| store.get(c, id).await)
                    .await?
                    .is_some()
            {
                found.entities.push((machine.to_string(), id));
            }
        }
        let store = &self.store;
        found.records = Lease::run(store, async |c| {
            store.records_by_key(c, term, FOUND_MAX).await
        })
        .await?;
        found.flows = Lease::run(store, async |c| {
            store.flows_by_key(c, term, FOUND_MAX).await
        })
        .await?;
        let mut events = Lease::run(store, async |c| {
            store.events_by(c, EventsBy::Ref(term), FOUND_MAX).await
        })
        .await?;
        if let Some((machine, entity_id, version)) = message_id(term) {
            let by = EventsBy::Id {
                machine,
                entity_id,
                version,
            };
            events.extend(Lease::run(store, async |c| store.events_by(c, by, 1).await).await?);
        }
        found.events = events.into_iter().map(Event::from).collect();
        Ok(found)
    }

    /// Records an action (what it changed, and why it stopped if it failed) in the
    /// audit trail; returns the notice that tells what it did.
    pub(crate) async fn record(
        &self,
        who: &str,
        action: &str,
        target: &str,
        acted: &Acted,
    ) -> String {
        let (n, failure) = match acted {
            Ok(n) => (*n, None),
            Err((e, n)) => (*n, Some(e)),
        };
        let recorded_target = match failure {
            None => bounded(target, MAX_TARGET),
            Some(e) => bounded(&format!("{target} (failed: {e})"), MAX_TARGET),
        };
        let who = bounded(who, MAX_WHO);
        let entry = AuditEntry {
            who: &who,
            action,
            target: &recorded_target,
            affected: n,
        };
        let store = &self.store;
        let recorded: Result<()> =
            async { Lease::run(store, async |c| store.record_audit(c, &entry).await).await }.await;
        let mut notice = match failure {
            None => format!("{action} {target}: {n} changed"),
            Some(e) => format!("{action} {target} failed after {n} changed: {e}"),
        };
        if let Err(e) = recorded {
            // The action stands; only its record failed: say so.
            notice.push_str(&format!(" (the audit record failed: {e})"));
        }
        notice
    }

    /// Requeues one dead event.
    pub(crate) async fn requeue_one(&self, key: &EventKey) -> Acted {
        Outbox::new(self.store.clone())
            .requeue(key)
            .await
            .map(i64::from)
            .map_err(|e| (e, 0))
    }

    /// Requeues every dead event `filter` matches, a batch at a time; `progress` is
    /// told the count so far after each batch.
    pub(crate) async fn requeue_matching(
        &self,
        filter: &Filter,
        progress: &mut (dyn FnMut(i64) + Send),
    ) -> Acted {
        let outbox = Outbox::new(self.store.clone());
        let mut requeued = 0i64;
        // Each round reads the dead events up to a batch past the ones it left dead (those
        // the filter does not match, and any that did not move) and requeues the matching
        // ones, which leave the dead state. It ends once a round has read every dead event.
        let mut left = 0u32;
        loop {
            let limit = left.saturating_add(BATCH);
            let rows = outbox.dead(limit).await.map_err(|e| (e, requeued))?;
            let all_read = rows.len() < limit as usize || limit == u32::MAX;
            let mut moved = 0u32;
            let mut failed = None;
            for r in rows.iter().filter(|r| filter.matches(r)) {
                let key = EventKey {
                    machine: r.machine.clone(),
                    entity_id: r.entity_id,
                    version: r.version,
                };
                match outbox.requeue(&key).await {
                    Ok(true) => moved += 1,
                    Ok(false) => {}
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            requeued += i64::from(moved);
            if let Some(e) = failed {
                return Err((e, requeued));
            }
            progress(requeued);
            if all_read {
                return Ok(requeued);
            }
            left = u32::try_from(rows.len())
                .unwrap_or(u32::MAX)
                .saturating_sub(moved);
        }
    }

    /// Resumes a parked flow through the registered flows (a step that panics is this
    /// action's failure).
    pub(crate) async fn resume_flow(&self, kind: &str, key: &str, how: Resume) -> Acted {
        let Some(flows) = self.flows.as_ref() else {
            return Err((
                Error::InvalidInput("no flows are registered here".into()),
                0,
            ));
        };
        // What the flow looked like before: an error after the resume unparked it
        // (a step that failed, a deadline) is a failure after one change, not before.
        let look = || async {
            flows
                .get(kind, key)
                .await
                .ok()
                .flatten()
                .map(|v| (v.flow.status, v.flow.park_reason, v.flow.updated_at))
        };
        let before = look().await;
        let resumed = AssertUnwindSafe(flows.resume(kind, key, how))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                Err(Error::RuleFailed {
                    rule: "a flow step",
                    reason: format!("a step of flow {kind} {key} panicked"),
                })
            });
        match resumed {
            Ok(_) => Ok(1),
            Err(e) => {
                let after = look().await;
                let changed = before.is_some() && after.is_some() && before != after;
                Err((e, i64::from(changed)))
            }
        }
    }

    /// Releases a record stuck in PROCESSING past its lease, through the registered
    /// records ([`Records::release_stuck`](crate::Records::release_stuck)).
    pub(crate) async fn release_record(&self, scope: &str, key: &str) -> Acted {
        let Some(records) = self.records.as_ref() else {
            return Err((
                Error::InvalidInput("no idempotency records are registered here".into()),
                0,
            ));
        };
        records
            .release_stuck(scope, key)
            .await
            .map(i64::from)
            .map_err(|e| (e, 0))
    }

    /// Re-arms a dead timer ([`Timers::rearm`]) or cancels a pending or dead one no job
    /// is firing (the store's fenced `cancel_timer`); the action's name and what it did.
    pub(crate) async fn on_timer(
        &self,
        key: &TimerKey<'_>,
        what: OnTimer,
    ) -> (&'static str, Acted) {
        let store = &self.store;
        let (action, changed) = match what {
            OnTimer::Rearm => ("timers.rearm", Timers::new(store.clone()).rearm(key).await),
            OnTimer::Cancel => (
                "timers.cancel",
                async { Lease::run(store, async |c| store.cancel_timer(c, key).await).await }.await,
            ),
        };
        (action, changed.map(i64::from).map_err(|e| (e, 0)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_read_back_into_their_parts() {
        assert_eq!(message_id("Order:12:3"), Some(("Order", 12, 3)));
        assert_eq!(message_id("a:b:12:3"), Some(("a:b", 12, 3)));
        assert_eq!(message_id(":12:3"), None);
        assert_eq!(message_id("Order:x:3"), None);
        assert_eq!(message_id("pay_123"), None);
    }

    #[test]
    fn a_filter_reads_its_fields_and_refuses_a_bad_age() {
        let q: HashMap<String, String> = [("machine", " M "), ("event", ""), ("older", "60")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let f = Filter::from_fields(&q).unwrap();
        assert_eq!(f.machine.as_deref(), Some("M"));
        assert_eq!(f.event, None);
        assert_eq!(f.older_than_s, Some(60));
        assert_eq!(f.describe(), "dead events where machine=M, older than 60 s");
        let bad: HashMap<String, String> = [("older".to_string(), "an hour".to_string())].into();
        assert!(matches!(
            Filter::from_fields(&bad),
            Err(Error::InvalidInput(_))
        ));
    }
}
