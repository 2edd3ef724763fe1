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

use crate::error::Error;

use crate::error::Result;

/// How the front behaves.
#[non_exhaustive]
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

crate::support::config::setters!(FrontConfig {
    ttl: Duration,
    timeout: Duration,
    pause_after_failure: Duration,
});

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
///
/// Each request's marker, `orderly:idem:{scope length}:{scope}:{key}`, is set *pending*
/// before the database claim and turned *held* once the database granted the claim; only
/// a held marker sheds identical requests. While pending (the claim's round trip), a
/// request with the same key goes on to the database, which may have a stored answer for
/// it: a repeat of a finished request is never told to wait by the front.
pub struct RedisFront {
    conn: ConnectionManager,
    config: FrontConfig,
    down_until: Mutex<Option<Instant>>,
    mark: Script,
    hold: Script,
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
    /// This request set a pending marker: go on to the database (a granted claim then
    /// sets its held marker, [`hold`](RedisFront::hold); one not granted removes it).
    Set,
    /// An identical request holds the record: in flight, for about this long.
    Held(Duration),
    /// No answer from the front (no held marker of this payload, Redis down or slow):
    /// go on to the database.
    Pass,
}

impl RedisFront {
    /// A front on the Redis at `url` (`redis://127.0.0.1:6379/`). Connects lazily: a
    /// Redis that is down now is no error, only a front that passes every request on.
    /// A malformed URL, a `ttl` or `timeout` under a millisecond, or a `ttl` over 100
    /// years is [`Error::InvalidInput`].
    pub fn new(url: &str, config: FrontConfig) -> Result<Self> {
        let ms = Duration::from_millis(1);
        if config.ttl < ms || config.timeout < ms || config.ttl > super::MAX_SPAN {
            return Err(Error::InvalidInput(
                "the front's ttl and timeout must be at least a millisecond (ttl at most 100 years)"
                    .into(),
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
            // Sets a pending marker unless one exists; else returns it and its time to
            // live.
            mark: Script::new(
                "local old = redis.call('GET', KEYS[1]) \
                 if old then return {old, redis.call('PTTL', KEYS[1])} end \
                 redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
                 return false",
            ),
            // The held marker of the request the database granted the record to; it
            // replaces whatever pending marker another request set.
            hold: Script::new("redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1"),
            // Removes the marker if it is still this request's (by its token).
            unmark: Script::new(
                "local v = redis.call('GET', KEYS[1]) \
                 if v and string.sub(v, -string.len(ARGV[1])) == ARGV[1] then \
                 return redis.call('DEL', KEYS[1]) end return 0",
            ),
        })
    }

    /// The marker's key: the scope's length first, so that no two `(scope, key)` pairs
    /// share one (scopes and keys may both hold `:`).
    fn key(scope: &str, key: &str) -> String {
        format!("orderly:idem:{}:{scope}:{key}", scope.len())
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

    /// Runs `script` within the front's timeout; `None` (and a pause) if Redis failed.
    async fn call<T: redis::FromRedisValue>(
        &self,
        what: &str,
        call: &redis::ScriptInvocation<'_>,
    ) -> Option<T> {
        if !self.available() {
            return None;
        }
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.config.timeout, call.invoke_async::<T>(&mut conn)).await {
            Ok(Ok(answer)) => Some(answer),
            Ok(Err(e)) => {
                self.failed(what, &e);
                None
            }
            Err(_) => {
                self.failed(what, &"timed out");
                None
            }
        }
    }

    fn ttl_ms(&self, lease: Duration) -> u64 {
        u64::try_from(self.config.ttl.min(lease).as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Sets a pending marker for a request with payload fingerprint `hash` and owner
    /// token `token`, unless one is there; a held marker of the same payload sheds it.
    pub(crate) async fn mark(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
        token: &str,
        lease: Duration,
    ) -> Mark {
        let mut call = self.mark.key(Self::key(scope, key));
        call.arg(format!("p:{hash}:{token}"))
            .arg(self.ttl_ms(lease));
        match self.call::<Option<(String, i64)>>("marking", &call).await {
            Some(None) => Mark::Set,
            Some(Some((old, left_ms))) => {
                let mut parts = old.splitn(3, ':');
                let held = parts.next() == Some("h") && parts.next() == Some(hash);
                if held && left_ms > 0 {
                    Mark::Held(Duration::from_millis(left_ms.unsigned_abs()))
                } else {
                    Mark::Pass
                }
            }
            None => Mark::Pass,
        }
    }

    /// Sets the held marker of the request with owner token `token`: the database granted
    /// it the record (the only holder there is).
    pub(crate) async fn hold(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
        token: &str,
        lease: Duration,
    ) {
        let mut call = self.hold.key(Self::key(scope, key));
        call.arg(format!("h:{hash}:{token}"))
            .arg(self.ttl_ms(lease));
        let _: Option<i64> = self.call("holding", &call).await;
    }

    /// Removes the marker set by the request with owner token `token`, if it is still
    /// there.
    pub(crate) async fn unmark(&self, scope: &str, key: &str, token: &str) {
        let mut call = self.unmark.key(Self::key(scope, key));
        call.arg(format!(":{token}"));
        let _: Option<i64> = self.call("unmarking", &call).await;
    }
}
