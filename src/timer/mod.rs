//! Timers: events scheduled for an entity and fired exactly once through the engine.
//!
//! A state of [`state_machine!`](crate::state_machine!) may carry timers (`Created after
//! 30 min => Cancel`): the unit that enters the state (a move into it, or the create)
//! writes a timer row due that long after, by the database's clock, with the reference
//! `timer:{state}:{version}` (the entity's state and version after the move). An
//! application schedules timers of its own too ([`Engine::schedule`](crate::Engine::schedule)),
//! and cancels them by their reference.
//!
//! [`Timers`] is the job that fires them, on any number of nodes: it claims due timers
//! under a lease, fires each through the machine's engine with the timer's reference, and
//! records the outcome fenced by its claim. The engine's outcome table makes the firing
//! exactly once: the first firing is `Applied`; a second one (two jobs, a crash after the
//! commit) is `Replayed`; a state's timer whose entity has left that state and version
//! since (paid in time) is moot, never a late move of a paid order. The model and its
//! table of situations are in `docs/timers.md`.

mod batch;
mod config;
mod fire;
mod job;

pub use crate::store::timers::{
    Arm, ClaimTimers, ClaimedTimer, CorruptTimer, FailedTimer, FiredTimer, NewTimer, TimerKey,
    TimerRow, TimerStats, TimerStore,
};
pub use config::{TimerRound, TimersConfig};
pub use job::Timers;
