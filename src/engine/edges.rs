//! The transition table by event, derived once per engine: each event's edges as names,
//! what they emit, whether they name rules, and whether the event can be applied again.

use std::collections::HashMap;

use crate::machine::StateMachine;

/// The table of `M`, by event.
pub(super) fn of<M: StateMachine>() -> HashMap<M::Event, Edges> {
    let mut edges: HashMap<M::Event, Edges> = HashMap::new();
    for t in M::TRANSITIONS {
        let e = edges.entry(t.event).or_default();
        e.from.push(t.from.into());
        e.to.push(t.to.into());
        e.emits.push(t.emits);
        e.guarded |= t.guard.is_some() || t.effect.is_some();
        e.rules |= e.guarded || M::timers_of(t.to).next().is_some();
    }
    for e in edges.values_mut() {
        e.repeatable = reaches::<M>(&e.to, &e.from);
    }
    edges
}

/// Whether one of the states `targets` is reachable from one of `starts` along the
/// machine's transitions (in none or more steps).
fn reaches<M: StateMachine>(starts: &[&'static str], targets: &[&'static str]) -> bool {
    let mut seen: Vec<&'static str> = starts.to_vec();
    let mut todo = seen.clone();
    while let Some(state) = todo.pop() {
        if targets.contains(&state) {
            return true;
        }
        for t in M::TRANSITIONS {
            let (from, to): (&'static str, &'static str) = (t.from.into(), t.to.into());
            if from == state && !seen.contains(&to) {
                seen.push(to);
                todo.push(to);
            }
        }
    }
    false
}

/// The rows of the transition table for one event, as names: `from[i]` leads to `to[i]`.
#[derive(Debug, Default)]
pub(super) struct Edges {
    pub(super) from: Vec<&'static str>,
    pub(super) to: Vec<&'static str>,
    /// The domain event each edge emits, if any.
    pub(super) emits: Vec<Option<&'static str>>,
    /// Whether an edge of the event names a guard or an effect, or enters a state that
    /// carries timers: its requests are written in a unit of their own (`guarded.rs`).
    pub(super) rules: bool,
    /// Whether an edge of the event names a guard or an effect (code of the
    /// application's, which may call out of the database).
    pub(super) guarded: bool,
    /// Whether the event can be applied again after it was applied: one of its source
    /// states is reachable from one of its target states. An event that cannot is
    /// recorded for no entity that is at one of its source states.
    pub(super) repeatable: bool,
}
