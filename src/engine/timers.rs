//! Timers scheduled and cancelled by hand, and the names a timer row stores.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::{Engine, input, within_deadline};
use crate::error::Error;
use crate::error::Result;
use crate::machine::{MAX_TIMER_MS, StateMachine, StateTimer};
use crate::store::{Lease, db_error};

/// Timers scheduled by hand: an event for an entity at a time, and its cancellation by
/// its reference (a state's own timers are armed by the moves that enter it; see
/// [`Timers`](crate::Timers)).
impl<M: StateMachine, S: crate::store::timers::TimerStore> Engine<M, S> {
    /// Schedules `event` for `order_id` `after` from now (by the database's clock, at most
    /// 366 days), under the reference `ref_id`: the timer job fires it through this
    /// machine's engine with that reference, so the outcome table decides (`Applied`
    /// once; an event the entity's state no longer allows makes it moot). `true` if it
    /// was scheduled, `false` if a timer with this event and reference exists for the
    /// entity already (scheduling is idempotent). A reference that is not valid is
    /// [`Error::InvalidInput`]. Nothing checks that the entity exists: a timer of none
    /// ends moot.
    pub async fn schedule(
        &self,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
        after: Duration,
    ) -> Result<bool> {
        let timer = self.new_timer(order_id, event, ref_id, after)?;
        within_deadline(self.config.deadline, true, async {
            let store = &self.store;
            Lease::run(store, async |c| store.schedule_timer(c, &timer).await).await
        })
        .await
    }

    /// [`schedule`](Self::schedule) inside the caller's transaction (the connection is
    /// inside it): the timer commits or rolls back with the caller's own writes.
    pub async fn schedule_within(
        &self,
        conn: &mut S::Conn,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
        after: Duration,
    ) -> Result<bool> {
        let timer = self.new_timer(order_id, event, ref_id, after)?;
        self.store
            .schedule_timer(conn, &timer)
            .await
            .map_err(db_error::<S>)
    }

    fn new_timer<'r>(
        &self,
        order_id: i64,
        event: M::Event,
        ref_id: &'r str,
        after: Duration,
    ) -> Result<crate::store::timers::NewTimer<'r>> {
        input::validate_ref(ref_id)?;
        names::<M>()?;
        let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        if after_ms > MAX_TIMER_MS {
            return Err(Error::InvalidInput(
                "a timer's delay must be at most 366 days".into(),
            ));
        }
        Ok(crate::store::timers::NewTimer {
            key: crate::store::timers::TimerKey {
                machine: M::NAME,
                entity_id: order_id,
                event: event.into(),
                ref_id,
            },
            after_ms: after_ms as i64,
            at: None,
        })
    }

    /// Cancels the pending (or dead) timer of `order_id` that fires `event` under
    /// `ref_id`; whether it did. `false` if there is none, if a job is firing it at this
    /// moment (its claim is live: the firing goes on, and the outcome table decides it),
    /// or if the store's history holds `event` for the entity under `ref_id` (a job
    /// applied the timer and did not live to record it: the job that takes it over
    /// records it fired, `replayed`).
    /// A state's own timer has the reference `timer:{state}:{version}`.
    pub async fn cancel_timer(&self, order_id: i64, event: M::Event, ref_id: &str) -> Result<bool> {
        input::validate_ref(ref_id)?;
        let key = crate::store::timers::TimerKey {
            machine: M::NAME,
            entity_id: order_id,
            event: event.into(),
            ref_id,
        };
        within_deadline(self.config.deadline, true, async {
            let store = &self.store;
            Lease::run(store, async |c| store.cancel_timer(c, &key).await).await
        })
        .await
    }

    /// The entity's timers, of every status, earliest due first; rows that do not read
    /// as timers come back as [`CorruptTimer`](crate::store::timers::CorruptTimer)s.
    pub async fn timers(&self, order_id: i64) -> Result<Vec<crate::store::timers::ClaimedTimer>> {
        within_deadline(self.config.deadline, false, async {
            let store = &self.store;
            Lease::run(store, async |c| store.timers_of(c, M::NAME, order_id).await).await
        })
        .await
    }
}

/// The machine's timers as this engine arms and draws them: their delays as declared,
/// or as [`EngineConfig::timer_delays`](crate::EngineConfig::timer_delays) set them.
impl<M: StateMachine, S: crate::store::Store> Engine<M, S> {
    /// The machine's timers ([`StateMachine::TIMERS`], in their order), each with the
    /// delay this engine arms it with.
    pub fn state_timers(&self) -> Vec<StateTimer<M::State, M::Event>> {
        M::TIMERS
            .iter()
            .zip(self.timer_ms.iter())
            .map(|(t, ms)| StateTimer {
                after_ms: *ms,
                ..*t
            })
            .collect()
    }

    /// The timers entering `state` arms: each event's name and its delay in milliseconds.
    pub(super) fn armed_in(&self, state: M::State) -> Vec<(&'static str, u64)> {
        M::TIMERS
            .iter()
            .zip(self.timer_ms.iter())
            .filter(|(t, _)| t.state == state)
            .map(|(t, ms)| (t.event.into(), *ms))
            .collect()
    }

    /// The graph as a Mermaid `stateDiagram-v2`, its timers with this engine's delays.
    pub fn mermaid(&self) -> String {
        crate::machine::mermaid_with::<M>(&self.state_timers())
    }

    /// The graph in Graphviz DOT, its timers with this engine's delays.
    pub fn dot(&self) -> String {
        crate::machine::dot_with::<M>(&self.state_timers())
    }

    /// The graph drawn as SVG, its timers with this engine's delays.
    pub fn svg(&self) -> String {
        crate::machine::svg_with::<M>(&self.state_timers())
    }
}

/// The delay of each of `M`'s timers, in its order: as declared, or as `set` says (by the
/// names of the state and the event). [`Error::InvalidInput`] naming every entry that
/// names no timer of the machine or whose delay is not 1 ms to 366 days.
pub(super) fn delays<M: StateMachine>(
    set: &BTreeMap<(String, String), Duration>,
) -> Result<Arc<[u64]>> {
    let mut ms: Vec<u64> = M::TIMERS.iter().map(|t| t.after_ms).collect();
    let mut problems = Vec::new();
    for ((state, event), after) in set {
        let found = M::TIMERS.iter().position(|t| {
            let (s, e): (&'static str, &'static str) = (t.state.into(), t.event.into());
            s == state && e == event
        });
        let after_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
        match found {
            None => problems.push(format!(
                "{} declares no timer that entering {state:?} arms to fire {event:?}",
                M::NAME
            )),
            Some(_) if after_ms == 0 || after_ms > MAX_TIMER_MS => problems.push(format!(
                "the delay of the timer of {state:?} on {event:?} must be 1 ms to 366 days"
            )),
            Some(i) => ms[i] = after_ms,
        }
    }
    if problems.is_empty() {
        Ok(ms.into())
    } else {
        Err(Error::InvalidInput(format!(
            "timer_delays: {}",
            problems.join("; ")
        )))
    }
}

/// The names a timer row stores (the machine's, its states' and events'), each at most
/// 64 bytes as the timers table holds them: else [`Error::InvalidInput`] (a longer one
/// would not be stored as it is on MySQL/MariaDB).
pub(super) fn names<M: StateMachine>() -> Result<()> {
    use strum::IntoEnumIterator;
    let names = std::iter::once(M::NAME)
        .chain(M::State::iter().map(Into::into))
        .chain(M::Event::iter().map(Into::into));
    for name in names {
        if name.len() > 64 {
            return Err(Error::InvalidInput(format!(
                "the timers table holds names of at most 64 bytes; {name:?} is longer"
            )));
        }
    }
    Ok(())
}
