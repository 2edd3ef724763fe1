//! The optional Redis front (feature `redis`): a short-lived marker set before the
//! database claim, so that a storm of identical requests is answered "in flight" by
//! Redis while the first one runs, without reaching the database.
//!
//! The database stays the authority. The front only ever answers
//! [`Error::InFlight`](crate::Error::InFlight), and only to a request whose payload
//! matches the marker's; every other answer (claimed, replayed, payload mismatch) comes
//! from the database. Redis down, slow or unreachable: the call gives up after the
//! front's timeout and the request goes on to the database as if there were no front.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{Client, Script};

use crate::{Error, Result};

/// How the front behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrontConfig {
    /// How long a marker lives (capped at the scope's lease): the window in which
    /// identical requests are shed. A marker outlives its request only if it could not be
    /// removed (Redis went away), and then sheds retries for at most this long.
    pub ttl: Duration,
    /// The most a request waits on Redis before going on to the database.
    pub timeout: Duration,
    /// After Redis failed, how long the front stays out of the way before trying again.
    pub pause_after_failure: Duration,
}

impl Default for FrontConfig {
    fn default() -> Self {
        FrontConfig {
            ttl: Duration::from_secs(2),
            timeout: Duration::from_millis(20),
            pause_after_failure: Duration::from_secs(1),
        }
    }
}

/// A Redis front for [`Records`](crate::Records): see [`Records::front`](crate::Records::front).
pub struct RedisFront {
    conn: ConnectionManager,
    config: FrontConfig,
    down_until: Mutex<Option<Instant>>,
    mark: Script,
    unmark: Script,
}

impl std::fmt::Debug for RedisFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisFront")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What the front said about a request.
#[derive(Debug)]
pub(crate) enum Mark {
    /// This request set the marker (its value): go on to the database.
    Set(String),
    /// An identical request holds the marker: in flight, for about this long.
    Held(Duration),
    /// No answer from the front (another payload's marker, Redis down or slow): go on
    /// to the database.
    Pass,
}

impl RedisFront {
    /// A front on the Redis at `url` (`redis://127.0.0.1:6379/`). Connects lazily: a
    /// Redis that is down now is no error, only a front that passes every request on.
    /// A malformed URL or a zero `ttl` or `timeout` is [`Error::InvalidInput`].
    pub fn new(url: &str, config: FrontConfig) -> Result<Self> {
        if config.ttl.is_zero() || config.timeout.is_zero() {
            return Err(Error::InvalidInput(
                "the front's ttl and timeout must be positive".into(),
            ));
        }
        let client = Client::open(url)
            .map_err(|e| Error::InvalidInput(format!("redis url {url:?}: {e}")))?;
        let manager = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(Some(config.timeout))
            .set_number_of_retries(1);
        let conn = ConnectionManager::new_lazy_with_config(client, manager)
            .map_err(|e| Error::InvalidInput(format!("redis front: {e}")))?;
        Ok(RedisFront {
            conn,
            config,
            down_until: Mutex::new(None),
            // Sets the marker unless one exists; else returns it and its time to live.
            mark: Script::new(
                "local old = redis.call('GET', KEYS[1]) \
                 if old then return {old, redis.call('PTTL', KEYS[1])} end \
                 redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
                 return false",
            ),
            // Removes the marker if it is still this request's.
            unmark: Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                 return redis.call('DEL', KEYS[1]) end return 0",
            ),
        })
    }

    fn key(scope: &str, key: &str) -> String {
        format!("orderly:idem:{scope}:{key}")
    }

    /// Whether Redis is to be asked now (not within a pause after a failure).
    fn available(&self) -> bool {
        let down = self.down_until.lock().unwrap_or_else(|e| e.into_inner());
        down.is_none_or(|until| Instant::now() >= until)
    }

    fn failed(&self, what: &str, error: &dyn std::fmt::Display) {
        tracing::warn!(%error, "redis front: {what} failed; passing requests to the database");
        *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + self.config.pause_after_failure);
    }

    /// Sets the marker of `(scope, key)` for a request with payload fingerprint `hash`
    /// and owner token `token`, unless one is there.
    pub(crate) async fn mark(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
        token: &str,
        lease: Duration,
    ) -> Mark {
        if !self.available() {
            return Mark::Pass;
        }
        let value = format!("{hash}:{token}");
        let ttl = self.config.ttl.min(lease);
        let mut conn = self.conn.clone();
        let mut call = self.mark.key(Self::key(scope, key));
        call.arg(&value).arg(ttl.as_millis().max(1) as u64);
        let answer = tokio::time::timeout(
            self.config.timeout,
            call.invoke_async::<Option<(String, i64)>>(&mut conn),
        )
        .await;
        match answer {
            Ok(Ok(None)) => Mark::Set(value),
            Ok(Ok(Some((old, left_ms)))) => match old.split_once(':') {
                Some((old_hash, _)) if old_hash == hash && left_ms > 0 => {
                    Mark::Held(Duration::from_millis(left_ms.unsigned_abs()))
                }
                _ => Mark::Pass,
            },
            Ok(Err(e)) => {
                self.failed("marking", &e);
                Mark::Pass
            }
            Err(_) => {
                self.failed("marking", &"timed out");
                Mark::Pass
            }
        }
    }

    /// Removes the marker `value` of `(scope, key)` if it is still there.
    pub(crate) async fn unmark(&self, scope: &str, key: &str, value: &str) {
        if !self.available() {
            return;
        }
        let mut conn = self.conn.clone();
        let mut call = self.unmark.key(Self::key(scope, key));
        call.arg(value);
        match tokio::time::timeout(self.config.timeout, call.invoke_async::<i64>(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.failed("unmarking", &e),
            Err(_) => self.failed("unmarking", &"timed out"),
        }
    }
}
