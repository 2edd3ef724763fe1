//! The delays of the background jobs' retries (the relay's, the timer job's): exponential
//! with jitter between a floor and a cap, and durations as the database's milliseconds.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The delay before the next try of work tried `attempts` times: doubling from `min`,
/// with jitter, never above `max`.
pub(crate) fn delay(min: Duration, max: Duration, attempts: i32) -> Duration {
    let n = usize::try_from(attempts.max(1) - 1).unwrap_or(0);
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
        .nth(n.min(64))
        .unwrap_or(max)
        // The jitter is added after the cap: cap again.
        .min(max)
}

/// `d` in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
