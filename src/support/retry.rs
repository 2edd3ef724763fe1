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

/// `work` (which may run twice without changing anything twice: a record of rows still
/// under the caller's claim), tried again on a retryable error (a deadlock, a lock wait,
/// a lost connection) up to `tries` times in all, after a short backoff each.
pub(crate) async fn retried<T, F>(tries: i32, work: impl Fn() -> F) -> crate::error::Result<T>
where
    F: std::future::Future<Output = crate::error::Result<T>>,
{
    let mut tried = 1;
    loop {
        match work().await {
            Err(e) if e.is_retryable() && tried < tries => {
                tracing::debug!(error = %e, tried, "trying a record again");
                tokio::time::sleep(delay(
                    Duration::from_millis(5),
                    Duration::from_millis(200),
                    tried,
                ))
                .await;
                tried += 1;
            }
            answer => return answer,
        }
    }
}
