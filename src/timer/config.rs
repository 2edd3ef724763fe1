//! How a timer job claims, fires and retries ([`TimersConfig`]), and what one of its
//! rounds did ([`TimerRound`]).

use std::time::Duration;

use crate::error::Error;

use crate::error::Result;

/// The largest batch a job claims.
const MAX_BATCH: u32 = 1000;

/// The longest lease a job may take.
const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// How a timer job claims, fires and retries.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct TimersConfig {
    /// The most timers of one machine claimed (and fired together) in one round, 1 to
    /// 1000. Default 128.
    pub batch: u32,
    /// How long a claim lasts: another job takes a timer over only after this. Default
    /// 60 s; at most a day. Make it longer than twice the engines' deadline (a round's
    /// batch may take that long, and the timers it fires one by one are claimed at its
    /// start): a firing that runs past the lease may be fired again by another job, which
    /// the engine answers `Replayed`.
    pub lease: Duration,
    /// Claims of one timer after which a timer that keeps failing is set aside as dead.
    /// Default 10.
    pub max_attempts: u32,
    /// The first retry's delay; each next one doubles, with jitter. Default 500 ms.
    pub min_backoff: Duration,
    /// The longest retry delay (at most a day). Default 5 min.
    pub max_backoff: Duration,
    /// The longest [`Timers::run`](super::Timers::run) sleeps when a round found nothing
    /// to fire (it wakes sooner when a timer falls due sooner), and how long it sleeps
    /// after a round that failed. Default 200 ms.
    pub idle: Duration,
    /// How many timers of a round one job fires at once, 1 to 1000 (each takes a
    /// connection of the engine's pool while it fires). Default 8.
    pub concurrency: usize,
}

crate::support::config::setters!(TimersConfig {
    batch: u32,
    lease: Duration,
    max_attempts: u32,
    min_backoff: Duration,
    max_backoff: Duration,
    idle: Duration,
    concurrency: usize,
});

impl Default for TimersConfig {
    fn default() -> Self {
        TimersConfig {
            batch: 128,
            lease: Duration::from_secs(60),
            max_attempts: 10,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(300),
            idle: Duration::from_millis(200),
            concurrency: 8,
        }
    }
}

impl TimersConfig {
    pub(super) fn check(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.batch == 0 || self.batch > MAX_BATCH {
            problems.push("batch must be 1 to 1000");
        }
        if self.max_attempts == 0 || self.max_attempts > i32::MAX as u32 {
            problems.push("max_attempts must be 1 to 2147483647");
        }
        if self.lease < Duration::from_secs(1) || self.lease > MAX_LEASE {
            problems.push("lease must be 1 s to a day");
        }
        if self.min_backoff > self.max_backoff {
            problems.push("min_backoff must not exceed max_backoff");
        }
        if self.max_backoff > MAX_LEASE {
            problems.push("max_backoff must be at most a day");
        }
        if self.concurrency == 0 || self.concurrency > 1000 {
            problems.push("concurrency must be 1 to 1000");
        }
        if self.idle.is_zero() {
            problems.push("idle must be positive");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "timers config: {}",
                problems.join("; ")
            )))
        }
    }
}

/// What one round of a timer job did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerRound {
    /// Timers this round claimed.
    pub claimed: usize,
    /// Fired, and the engine applied the event.
    pub applied: usize,
    /// Fired, and the engine answered that the event was applied before under the
    /// timer's reference (fired before by another job, or before a crash).
    pub replayed: usize,
    /// Fired, and moot: the entity had left the state (and version) that armed the
    /// timer, or the event was no longer allowed; nothing was written.
    pub moot: usize,
    /// Fired, and a guard of the edge refused the move; nothing was written.
    pub refused: usize,
    /// Failed for now (a busy database, a failing effect): tried again after a backoff.
    pub retried: usize,
    /// Set aside as dead: out of attempts, or failing for good (an unknown event or
    /// state, a corrupt row).
    pub dead: usize,
    /// Whose claim another job took over before the outcome was recorded (that job
    /// fires it again; the engine answers it `Replayed` if it applied here).
    pub lost: usize,
}

impl TimerRound {
    pub(super) fn add(&mut self, other: TimerRound) {
        self.claimed += other.claimed;
        self.applied += other.applied;
        self.replayed += other.replayed;
        self.moot += other.moot;
        self.refused += other.refused;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lost += other.lost;
    }
}
