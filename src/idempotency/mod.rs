//! Idempotency records: lock → judge → update for whole requests ("create order 42 and
//! reserve its stock", "charge the card for order 42"), where a single transition is not
//! the unit of work.
//!
//! A request is identified by `(scope, key)`: the scope names the operation, the key is
//! the caller's idempotency key. [`Records::claim`] takes the record (the lock), or says
//! why not (the judge): done before ([`Claim::Replayed`], the stored result), in flight
//! elsewhere ([`Error::InFlight`]), or another payload under the same key
//! ([`Error::PayloadMismatch`]). The holder then does its work and [`complete`]s,
//! [`fail`]s or [`release`]s the record (the update), every write fenced by the owner
//! token its claim minted: a holder whose lease expired and was taken over gets
//! [`Error::LeaseLost`] and changes nothing. [`complete_in`] completes inside the
//! caller's transaction, so the record commits with the work.
//!
//! [`complete`]: Records::complete
//! [`fail`]: Records::fail
//! [`release`]: Records::release
//! [`complete_in`]: Records::complete_in

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ReadFirst;
use crate::engine::{FirstRound, fingerprint_of, validate_reference};
use crate::store::{ErrorClass, Lease, Txn, db_error};
use crate::{Error, Result};

#[cfg(feature = "redis")]
mod front;
mod recovery;
mod run;
mod seam;
mod tokens;

#[cfg(feature = "redis")]
pub use front::{FrontConfig, RedisFront};
pub use recovery::{Reconciled, Reconciler, Recovered, Stuck};
pub use run::{Done, Ran, Work};
pub use seam::{Finish, NewClaim, RecordRow, RecordStore, StuckRow, TakeOver, TokenRow};

/// Longest accepted idempotency key, in characters (as for a transition's reference).
pub const MAX_KEY_LEN: usize = crate::engine::MAX_REF_LEN;

/// The longest lease, retention or time to live: the database clock plus it stays far
/// inside a 64-bit count of milliseconds.
pub(crate) const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How many times a claim reads and tries again when the record changes under it.
const CLAIM_ROUNDS: u32 = 8;

/// How a scope's records live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeConfig {
    /// How long a claim holds its record before another may take it over.
    pub lease: Duration,
    /// How long a record is kept (from its claim, and again from every later write);
    /// past it the record counts as absent. Longer than the lease, so that a record is
    /// never absent while its holder's lease is live.
    pub retention: Duration,
}

/// The idempotency records of one store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Records<S> {
    store: S,
    scopes: Arc<HashMap<String, ScopeConfig>>,
    /// Whether a claim reads the record before its write (shared by clones).
    first: FirstRound,
    #[cfg(feature = "redis")]
    front: Option<Arc<RedisFront>>,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This request holds the record now: do the work, then complete, fail or release.
    Claimed(Claimed),
    /// The request was done before: its stored outcome.
    Replayed(Stored),
}

/// A held record: the proof, for every later write, that it is this holder's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    scope: String,
    key: String,
    token: String,
    attempt: i32,
    /// The token under which this claim set a marker in the Redis front, removed once
    /// the record is finished.
    marker: Option<String>,
}

impl Claimed {
    /// The scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }
    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }
    /// The owner token this claim minted.
    pub fn token(&self) -> &str {
        &self.token
    }
    /// How many times the record has been claimed, this claim included.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }
}

/// A finished request's stored outcome, replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// Completed: the result's JSON text.
    Succeeded(String),
    /// Failed terminally: the failure's JSON text, if one was stored.
    Failed(Option<String>),
}

impl Stored {
    /// The stored result (or failure) as `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        let text = match self {
            Stored::Succeeded(text) | Stored::Failed(Some(text)) => text.as_str(),
            Stored::Failed(None) => "null",
        };
        serde_json::from_str(text).map_err(|e| {
            Error::InvalidInput(format!("the stored outcome does not parse as asked: {e}"))
        })
    }
}

/// Whether a failure is replayed to later requests, or the record opened to a new claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Stored and replayed: the request must not be run again (a card declined).
    Terminal,
    /// Stored, and the next claim with the same payload runs the request again (a
    /// timeout downstream).
    Retryable,
}

impl<S: RecordStore> Records<S> {
    /// Records on `store` with no scopes yet; add them with [`scope`](Self::scope).
    pub fn new(store: S) -> Self {
        Records {
            store,
            scopes: Arc::default(),
            first: FirstRound::new(ReadFirst::Adaptive, S::READ_FIRST_FROM),
            #[cfg(feature = "redis")]
            front: None,
        }
    }

    /// Puts a Redis front before every claim (feature `redis`): while a request runs,
    /// identical requests are answered [`Error::InFlight`] by Redis without reaching the
    /// database. The database stays the authority; Redis down or slow only costs the
    /// front's timeout, and the request goes on to the database.
    #[cfg(feature = "redis")]
    pub fn front(mut self, front: RedisFront) -> Self {
        self.front = Some(Arc::new(front));
        self
    }

    /// Adds a scope: a name (`[A-Za-z0-9_.:-]`, 1 to 64 characters) and how its records
    /// live. A bad name, a lease under a millisecond, or a retention not longer than the
    /// lease or over 100 years is [`Error::InvalidInput`].
    pub fn scope(mut self, name: &str, config: ScopeConfig) -> Result<Self> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c));
        if !ok {
            return Err(Error::InvalidInput(format!(
                "scope name {name:?} must be 1 to 64 of [A-Za-z0-9_.:-]"
            )));
        }
        if config.lease < Duration::from_millis(1)
            || config.retention <= config.lease
            || config.retention > MAX_SPAN
        {
            return Err(Error::InvalidInput(format!(
                "scope {name}: the lease must be at least a millisecond, and the retention \
                 longer than it and at most 100 years"
            )));
        }
        Arc::make_mut(&mut self.scopes).insert(name.to_string(), config);
        Ok(self)
    }

    /// Which round trip a claim starts with, as for a transition ([`ReadFirst`]): the
    /// claim's write (a new request answered in one statement; a repeat costs the write
    /// that takes nothing, then a read) or a read of the record (a repeat answered by
    /// that one read; a new request pays it on top). The default, `Adaptive`, reads
    /// first while repeats make up enough of the recent claims through these records.
    /// The answers are the same either way.
    pub fn read_first(mut self, policy: ReadFirst) -> Self {
        self.first = FirstRound::new(policy, S::READ_FIRST_FROM);
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Claims `(scope, key)` for a request with `payload` (any serializable value; `&()`
    /// for none). The outcome table is in `docs/idempotency.md`.
    pub async fn claim<P: Serialize + ?Sized>(
        &self,
        scope: &str,
        key: &str,
        payload: &P,
    ) -> Result<Claim> {
        let config = self.config(scope)?;
        validate_reference("an idempotency key", key)?;
        let hash = fingerprint_of(payload)?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let claim = NewClaim {
            scope,
            key,
            payload_hash: Some(&hash),
            token: &token,
            lease_ms: millis(config.lease),
            retention_ms: millis(config.retention),
        };
        let marker = self.mark(&claim, config.lease).await?;
        match self.claim_db(&claim, &hash).await {
            // Granted: whoever set the pending marker, this claim's held one replaces it.
            Ok(Claim::Claimed(held)) => {
                let marker = self.hold(&claim, config.lease).await;
                Ok(Claim::Claimed(Claimed { marker, ..held }))
            }
            other => {
                if let Some(marker) = &marker {
                    self.unmark(scope, key, marker).await;
                }
                other
            }
        }
    }

    /// The claim in the database.
    async fn claim_db(&self, claim: &NewClaim<'_>, hash: &str) -> Result<Claim> {
        let (scope, key, token) = (claim.scope, claim.key, claim.token);
        let claimed = |attempt| {
            Claim::Claimed(Claimed {
                scope: scope.to_string(),
                key: key.to_string(),
                token: token.to_string(),
                attempt,
                marker: None,
            })
        };
        let repeat = |answer: Result<Claim>| {
            self.first.note(true);
            answer
        };
        if self.first.reads_first() {
            // A read that fails leaves the claim's write to settle it.
            let row = self.read(scope, key).await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, scope, key, "read before the claim failed");
                None
            });
            match judge(row.as_ref(), hash, token, scope, key) {
                Ok(Seen::Claimable) => {}
                Ok(Seen::Mine(attempt)) => return Ok(claimed(attempt)),
                Ok(Seen::Done(stored)) => return repeat(Ok(Claim::Replayed(stored))),
                Err(e) => return repeat(Err(e)),
            }
        }
        for _ in 0..CLAIM_ROUNDS {
            match self.claim_once(claim).await {
                Ok(Some(attempt)) => {
                    self.first.note(false);
                    return Ok(claimed(attempt));
                }
                Ok(None) => {}
                // The claim may have committed with its acknowledgement lost: the read
                // below recognises the record as this claim's own by its token.
                Err(e) if S::classify(&e) != ErrorClass::Fatal => {
                    tracing::debug!(error = %e, scope, key, "claim failed; reading the record");
                }
                Err(e) => return Err(db_error::<S>(e)),
            }
            let row = self.read(scope, key).await.map_err(db_error::<S>)?;
            match judge(row.as_ref(), hash, token, scope, key) {
                Ok(Seen::Claimable) => continue,
                Ok(Seen::Mine(attempt)) => return Ok(claimed(attempt)),
                Ok(Seen::Done(stored)) => return repeat(Ok(Claim::Replayed(stored))),
                Err(e) => return repeat(Err(e)),
            }
        }
        Err(Error::Contention {
            attempts: CLAIM_ROUNDS,
        })
    }

    /// Completes the held record with `result`, stored as JSON and replayed byte for byte
    /// to every later claim. [`Error::LeaseLost`] if the record is no longer this
    /// holder's (nothing is written); a result that does not serialize is
    /// [`Error::InvalidInput`], before any write.
    pub async fn complete<R: Serialize + ?Sized>(&self, held: &Claimed, result: &R) -> Result<()> {
        let json = to_json(result)?;
        let finish = self.finish(held, "SUCCEEDED", Some(&json), false)?;
        self.fenced(held, &finish).await
    }

    /// [`complete`](Self::complete) inside the caller's transaction: the record commits
    /// or rolls back with the caller's own writes.
    pub async fn complete_in<R: Serialize + ?Sized>(
        &self,
        conn: &mut S::Conn,
        held: &Claimed,
        result: &R,
    ) -> Result<()> {
        let out = self.complete_on(conn, held, result, Txn::Caller).await;
        if out.is_ok() {
            self.unmark_held(held).await;
        }
        out
    }

    /// Completes on `conn`, inside a transaction that is the caller's (the write in a
    /// savepoint) or orderly's own.
    async fn complete_on<R: Serialize + ?Sized>(
        &self,
        conn: &mut S::Conn,
        held: &Claimed,
        result: &R,
        txn: Txn,
    ) -> Result<()> {
        let json = to_json(result)?;
        let finish = self.finish(held, "SUCCEEDED", Some(&json), false)?;
        let wrote = self
            .store
            .finish(conn, &finish, txn)
            .await
            .map_err(db_error::<S>)?;
        lease_held(held, wrote)
    }

    /// Fails the held record with `failure` (stored as JSON). [`Failure::Terminal`]:
    /// replayed to later claims; [`Failure::Retryable`]: the next claim with the same
    /// payload runs the request again.
    pub async fn fail<F: Serialize + ?Sized>(
        &self,
        held: &Claimed,
        failure: &F,
        kind: Failure,
    ) -> Result<()> {
        let json = to_json(failure)?;
        let finish = self.finish(held, "FAILED", Some(&json), kind == Failure::Terminal)?;
        self.fenced(held, &finish).await
    }

    /// Gives the held record up, storing nothing: the next claim runs the request again.
    pub async fn release(&self, held: &Claimed) -> Result<()> {
        let finish = self.finish(held, "FAILED", None, false)?;
        self.fenced(held, &finish).await
    }

    /// Extends the held record's lease by the scope's lease, from now.
    pub async fn extend(&self, held: &Claimed) -> Result<()> {
        let finish = self.finish(held, "PROCESSING", None, false)?;
        self.fenced(held, &finish).await
    }

    fn config(&self, scope: &str) -> Result<ScopeConfig> {
        self.scopes
            .get(scope)
            .copied()
            .ok_or_else(|| Error::InvalidInput(format!("unknown scope {scope:?}")))
    }

    fn finish<'a>(
        &self,
        held: &'a Claimed,
        status: &'static str,
        result: Option<&'a str>,
        terminal: bool,
    ) -> Result<Finish<'a>> {
        let config = self.config(&held.scope)?;
        Ok(Finish {
            scope: &held.scope,
            key: &held.key,
            token: &held.token,
            status,
            result,
            terminal,
            lease_ms: millis(config.lease),
            retention_ms: millis(config.retention),
        })
    }

    /// The claim statement on a pooled connection (closed unless the statement ran to its
    /// end, as for every statement below).
    async fn claim_once(&self, claim: &NewClaim<'_>) -> Result<Option<i32>, sqlx::Error> {
        let mut lease = Lease::acquire(&self.store).await?;
        let out = self.store.claim(lease.conn(), claim).await;
        lease.release_after(&out);
        out
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<RecordRow>, sqlx::Error> {
        let mut lease = Lease::acquire(&self.store).await?;
        let out = self.store.read(lease.conn(), scope, key).await;
        lease.release_after(&out);
        out
    }

    /// A fenced write on the engine's own connection. If the connection failed after it
    /// was sent, the record is read back: a write that landed left it finished under
    /// this holder's token, which no other holder could have done.
    async fn fenced(&self, held: &Claimed, finish: &Finish<'_>) -> Result<()> {
        let written = async {
            let mut lease = Lease::acquire(&self.store).await?;
            let out = self.store.finish(lease.conn(), finish, Txn::Own).await;
            lease.release_after(&out);
            out
        };
        // An extension leaves the record as it found it, so a read cannot tell whether
        // it landed: a lost one is an error to retry, never taken for success.
        let finishes = finish.status != "PROCESSING";
        let out = match written.await {
            Ok(true) => Ok(()),
            // Nothing written: the record is not this holder's any more, unless this very
            // write landed before (a retry of a write whose acknowledgement was lost).
            Ok(false) if finishes => match self.landed(held, finish.status, Some(finish)).await {
                Ok(landed) => lease_held(held, landed),
                Err(e) => Err(db_error::<S>(e)),
            },
            Ok(false) => lease_held(held, false),
            Err(e) if finishes && S::classify(&e) == ErrorClass::ConnectionLost => {
                match self.landed(held, finish.status, Some(finish)).await {
                    Ok(landed) => lease_held(held, landed),
                    Err(_) => Err(db_error::<S>(e)),
                }
            }
            Err(e) => Err(db_error::<S>(e)),
        };
        // Finished (by this holder or, if the lease was lost, by another): the request
        // is no longer running, and the front's marker goes.
        if finish.status != "PROCESSING" && !matches!(out, Err(Error::Database { .. })) {
            self.unmark_held(held).await;
        }
        out
    }
}

impl<S: RecordStore> Records<S> {
    /// Asks the Redis front, if there is one: the marker this claim set, or
    /// [`Error::InFlight`] if an identical request holds one.
    async fn mark(&self, claim: &NewClaim<'_>, lease: Duration) -> Result<Option<String>> {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.front {
            let hash = claim.payload_hash.unwrap_or_default();
            return match front
                .mark(claim.scope, claim.key, hash, claim.token, lease)
                .await
            {
                front::Mark::Set => Ok(Some(claim.token.to_string())),
                front::Mark::Held(retry_after) => Err(Error::InFlight {
                    scope: claim.scope.to_string(),
                    key: claim.key.to_string(),
                    retry_after,
                }),
                front::Mark::Pass => Ok(None),
            };
        }
        let _ = (claim, lease);
        Ok(None)
    }

    /// Tells the Redis front that this claim was granted: its held marker now sheds
    /// identical requests. The token the marker is under, if there is a front.
    async fn hold(&self, claim: &NewClaim<'_>, lease: Duration) -> Option<String> {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.front {
            let hash = claim.payload_hash.unwrap_or_default();
            front
                .hold(claim.scope, claim.key, hash, claim.token, lease)
                .await;
            return Some(claim.token.to_string());
        }
        let _ = (claim, lease);
        None
    }

    /// Removes the Redis front's marker of a request that is no longer running.
    async fn unmark(&self, scope: &str, key: &str, marker: &str) {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.front {
            front.unmark(scope, key, marker).await;
        }
        let _ = (scope, key, marker);
    }

    /// Removes the held record's marker, if its claim set one.
    pub(crate) async fn unmark_held(&self, held: &Claimed) {
        if let Some(marker) = &held.marker {
            self.unmark(&held.scope, &held.key, marker).await;
        }
    }

    /// Whether a write whose acknowledgement was lost landed: the record is in `status`
    /// under this holder's token, which no other holder could have written (and, given
    /// `finish`, holds what it wrote).
    async fn landed(
        &self,
        held: &Claimed,
        status: &str,
        finish: Option<&Finish<'_>>,
    ) -> Result<bool, sqlx::Error> {
        let row = self.read(&held.scope, &held.key).await?;
        Ok(row.is_some_and(|r| {
            r.owner_token.as_deref() == Some(held.token.as_str())
                && r.status == status
                && finish
                    .is_none_or(|f| r.result.as_deref() == f.result && r.terminal == f.terminal)
        }))
    }
}

/// What a read of the record says to a claim.
enum Seen {
    /// Absent, expired, its lease run out, or failed retryably: claim again.
    Claimable,
    /// This claim's own (its commit's acknowledgement was lost).
    Mine(i32),
    /// Finished: replay it.
    Done(Stored),
}

/// The outcome table of a claim, on a record as read. The payload is checked before
/// anything else but absence: a changed payload is a mismatch even while the first
/// request runs.
fn judge(row: Option<&RecordRow>, hash: &str, token: &str, scope: &str, key: &str) -> Result<Seen> {
    let Some(row) = row.filter(|r| r.expired == 0) else {
        return Ok(Seen::Claimable);
    };
    if row.owner_token.as_deref() == Some(token) && row.status == "PROCESSING" {
        return Ok(Seen::Mine(row.attempt));
    }
    if row.payload_hash.as_deref() != Some(hash) {
        return Err(Error::PayloadMismatch {
            subject: format!("scope {scope}"),
            reference: key.to_string(),
        });
    }
    match row.status.as_str() {
        "PROCESSING" if row.lease_left_ms > 0 => Err(Error::InFlight {
            scope: scope.to_string(),
            key: key.to_string(),
            retry_after: Duration::from_millis(row.lease_left_ms.unsigned_abs()),
        }),
        "PROCESSING" => Ok(Seen::Claimable),
        "SUCCEEDED" => Ok(Seen::Done(Stored::Succeeded(
            row.result.clone().unwrap_or_else(|| "null".into()),
        ))),
        "FAILED" if row.terminal => Ok(Seen::Done(Stored::Failed(row.result.clone()))),
        "FAILED" => Ok(Seen::Claimable),
        other => Err(Error::CorruptRecord {
            scope: scope.to_string(),
            key: key.to_string(),
            value: other.to_string(),
        }),
    }
}

fn lease_held(held: &Claimed, wrote: bool) -> Result<()> {
    if wrote {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            scope: held.scope.clone(),
            key: held.key.clone(),
        })
    }
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| Error::InvalidInput(format!("the result does not serialize as JSON: {e}")))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
