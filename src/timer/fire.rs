//! How the job fires one timer: through its machine's engine on the engine's own
//! connections, or inside the job's batch transaction; and how each firing ended.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::{TimerRow, TimerStore};
use crate::engine::{
    ARMABLE_VERSIONS, Armed, BatchFiring, Engine, Outcome, TransitionRequest, parse_event,
};
use crate::error::{Error, Result};
use crate::flow::{FlowStore, Flows, Woken};
use crate::machine::StateMachine;
use crate::support::text::bounded;

/// How one firing ended.
#[derive(Clone)]
pub(super) enum Fired {
    /// Recorded as fired with this outcome, and a note (why moot or refused).
    Outcome(&'static str, Option<String>),
    /// Failed for now.
    Retry(String),
    /// Failed for good.
    Dead(String),
    /// Not fired: the job is stopping (the timer is handed back unfired).
    Skipped,
}

pub(super) type FireFuture<'a> = Pin<Box<dyn Future<Output = Fired> + Send + 'a>>;

/// A machine's engine, as the job fires through it.
pub(super) trait Fire<S: TimerStore>: Send + Sync {
    /// Fires `timer` on the engine's own connections, within its deadline.
    fn fire<'a>(&'a self, timer: &'a TimerRow) -> FireFuture<'a>;

    /// Whether `timer` can be fired inside the job's batch transaction: its event's
    /// edges name no guard or effect (the firing is only writes, undone with the
    /// transaction if it rolls back), and its row reads.
    fn batchable(&self, timer: &TimerRow) -> bool {
        let _ = timer;
        false
    }

    /// How long a batch transaction of the machine's timers may take, if any of them
    /// can be fired in one ([`batchable`](Self::batchable)): the engine's deadline.
    fn batch_deadline(&self) -> Option<Duration> {
        None
    }

    /// Fires a [`batchable`](Self::batchable) timer inside the transaction open on
    /// `conn`. Any answer but [`Fired::Outcome`] means the transaction is to be undone.
    fn fire_within<'a>(&'a self, conn: &'a mut S::Conn, timer: &'a TimerRow) -> FireFuture<'a> {
        let _ = (conn, timer);
        Box::pin(async { Fired::Retry("this machine fires no timer in a batch".into()) })
    }

    /// [`fire_within`](Self::fire_within) for each of `timers` (of distinct entities),
    /// each answer in its place, by default one after another. The answers stop at the
    /// first that is not [`Fired::Outcome`]: the transaction is to be undone then, and
    /// nothing after it is fired in it.
    fn fire_many_within<'a>(
        &'a self,
        conn: &'a mut S::Conn,
        timers: &'a [&'a TimerRow],
    ) -> ManyFuture<'a> {
        Box::pin(async move {
            let mut fired = Vec::with_capacity(timers.len());
            for t in timers {
                let answer = self.fire_within(&mut *conn, t).await;
                let last = !matches!(answer, Fired::Outcome(..));
                fired.push(answer);
                if last {
                    break;
                }
            }
            fired
        })
    }
}

pub(super) type ManyFuture<'a> = Pin<Box<dyn Future<Output = Vec<Fired>> + Send + 'a>>;

impl<M: StateMachine, S: TimerStore> Engine<M, S> {
    /// The timer's request, or how the firing ends without one (a row that names no
    /// event, state or version of the machine).
    fn timer_request<'a>(&'a self, t: &'a TimerRow) -> Result<TransitionRequest<'a, M, S>, Fired> {
        let event = parse_event::<M>(&t.event)
            .map_err(|_| Fired::Dead(format!("unknown event {:?} of {}", t.event, M::NAME)))?;
        let request = self
            .transition(t.entity_id, event, &t.ref_id)
            .actor("timer");
        match (&t.state, t.version) {
            (None, None) => Ok(request),
            (Some(state), Some(version)) => {
                let Ok(state) = state.parse::<M::State>() else {
                    return Err(Fired::Dead(format!(
                        "unknown state {state:?} of {}",
                        M::NAME
                    )));
                };
                if !ARMABLE_VERSIONS.contains(&version) {
                    return Err(Fired::Dead(format!(
                        "version {version} (versions run from 0 to {})",
                        ARMABLE_VERSIONS.end - 1
                    )));
                }
                Ok(request.armed_at(state, version))
            }
            _ => Err(Fired::Dead(
                "a state without a version, or a version without a state".into(),
            )),
        }
    }
}

/// How a firing's answer is recorded.
fn judged<St>(answer: Result<Outcome<St>>) -> Fired {
    match answer {
        Ok(Outcome::Applied { .. }) => Fired::Outcome("applied", None),
        Ok(Outcome::Replayed { .. }) => Fired::Outcome("replayed", None),
        Err(
            e @ (Error::Moot { .. }
            | Error::InvalidTransition { .. }
            | Error::RefConflict { .. }
            | Error::NotFound { .. }),
        ) => Fired::Outcome("moot", Some(bounded(e.to_string()))),
        Err(e @ Error::Refused { .. }) => Fired::Outcome("refused", Some(bounded(e.to_string()))),
        Err(e @ Error::RuleFailed { .. }) => Fired::Retry(e.to_string()),
        Err(e) if e.is_retryable() => Fired::Retry(e.to_string()),
        Err(e) => Fired::Dead(e.to_string()),
    }
}

impl<M: StateMachine, S: TimerStore> Fire<S> for Engine<M, S> {
    fn fire<'a>(&'a self, t: &'a TimerRow) -> FireFuture<'a> {
        Box::pin(async move {
            match self.timer_request(t) {
                Ok(request) => judged(request.await),
                Err(fired) => fired,
            }
        })
    }

    fn batchable(&self, t: &TimerRow) -> bool {
        parse_event::<M>(&t.event).is_ok_and(|event| self.unguarded(event))
            && self.timer_request(t).is_ok()
    }

    fn batch_deadline(&self) -> Option<Duration> {
        M::TRANSITIONS
            .iter()
            .any(|t| self.unguarded(t.event))
            .then(|| self.deadline())
    }

    fn fire_within<'a>(&'a self, conn: &'a mut S::Conn, t: &'a TimerRow) -> FireFuture<'a> {
        Box::pin(async move {
            match self.timer_request(t) {
                Ok(request) => judged(request.within(conn).await),
                Err(fired) => fired,
            }
        })
    }

    /// The firings that are only writes at the armed state and version in one statement
    /// where the store has one; the others (and those it did not apply) one by one.
    fn fire_many_within<'a>(
        &'a self,
        conn: &'a mut S::Conn,
        timers: &'a [&'a TimerRow],
    ) -> ManyFuture<'a> {
        Box::pin(async move {
            let armed: Vec<Armed<'_>> = timers
                .iter()
                .map(|t| Armed {
                    entity_id: t.entity_id,
                    event: &t.event,
                    ref_id: &t.ref_id,
                    state: t.state.as_deref(),
                    version: t.version,
                })
                .collect();
            let answers = match self.fire_armed_in_batch(&mut *conn, &armed).await {
                Ok(answers) => answers,
                Err(e) => return vec![Fired::Retry(e.to_string())],
            };
            let mut fired = Vec::with_capacity(timers.len());
            for (t, answer) in timers.iter().zip(answers) {
                let answer = match answer {
                    BatchFiring::Applied => Fired::Outcome("applied", None),
                    BatchFiring::Judge => self.fire_within(&mut *conn, t).await,
                };
                let last = !matches!(answer, Fired::Outcome(..));
                fired.push(answer);
                if last {
                    break;
                }
            }
            fired
        })
    }
}

/// The flows' wait timers, as the job fires them: each wakes its flow.
impl<S: FlowStore + TimerStore> Fire<S> for Flows<S> {
    fn fire<'a>(&'a self, t: &'a TimerRow) -> FireFuture<'a> {
        Box::pin(async move {
            match self.wake(t).await {
                Woken::Woke => Fired::Outcome("applied", None),
                Woken::Moot(note) => Fired::Outcome("moot", Some(bounded(note))),
                Woken::Retry(e) => Fired::Retry(e),
                Woken::Dead(e) => Fired::Dead(e),
            }
        })
    }
}

/// A firing to record as fired: the timer's id, its outcome, a note (why moot or
/// refused), and its lateness (none for a row that did not read).
pub(super) struct FiredRow {
    id: i64,
    outcome: &'static str,
    note: Option<String>,
    late_ms: Option<i64>,
}

impl FiredRow {
    pub(super) fn new(
        id: i64,
        outcome: &'static str,
        note: Option<String>,
        late_ms: Option<i64>,
    ) -> Self {
        FiredRow {
            id,
            outcome,
            // Text as every backend stores it (PostgreSQL takes no NUL).
            note: note.map(|n| n.replace('\0', "\u{FFFD}")),
            late_ms,
        }
    }

    /// The row's record.
    pub(super) fn mark(&self) -> super::FiredTimer<'_> {
        super::FiredTimer {
            id: self.id,
            outcome: self.outcome,
            note: self.note.as_deref(),
        }
    }
}

/// Counts recorded firings in the round, and observes their lateness.
pub(super) fn count_fired(machine: &str, fired: &[FiredRow], round: &mut super::TimerRound) {
    for row in fired {
        match row.outcome {
            "applied" => round.applied += 1,
            "replayed" => round.replayed += 1,
            "moot" => round.moot += 1,
            _ => round.refused += 1,
        }
        if let Some(late_ms) = row.late_ms {
            crate::observe::timer_fired(machine, row.outcome, late_ms);
        }
    }
}
