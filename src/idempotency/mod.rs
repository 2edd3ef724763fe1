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

use serde::de::DeserializeOwned;

use crate::engine::ReadFirst;
use crate::error::Error;
use crate::error::Result;
use crate::store::Lease;
use crate::support::read_first::FirstRound;

mod claim;
mod claims;
mod finish;
mod finishes;
#[cfg(feature = "redis")]
mod front;
mod recovery;
mod run;
mod seam;
mod tokens;

pub use crate::coalesce::claims::CoalescedClaims;
#[cfg(feature = "redis")]
pub use front::{FrontConfig, RedisFront};
pub use recovery::{Held, Reconciled, Reconciler, Recovered, Stuck};
pub use run::{Done, Ran, Work};
pub use seam::{Finish, NewClaim, RecordRow, RecordStore, StuckRow, TakeOver, TokenRow};

/// Longest accepted idempotency key, in characters (as for a transition's reference).
pub const MAX_KEY_LEN: usize = crate::support::input::MAX_REF_LEN;

/// The longest lease, retention or time to live: the database clock plus it stays far
/// inside a 64-bit count of milliseconds.
pub(crate) const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The default of [`Records::deadline`].
const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// How many times a claim reads and tries again when the record changes under it.
const CLAIM_ROUNDS: u32 = 8;

/// How a scope's records live.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeConfig {
    /// How long a claim holds its record before another may take it over.
    pub lease: Duration,
    /// How long a record is kept (from its claim, and again from every later write);
    /// past it the record counts as absent. Longer than the lease, so that a record is
    /// never absent while its holder's lease is live.
    pub retention: Duration,
}

impl ScopeConfig {
    /// A scope whose claims hold their record for `lease` and whose records are kept for
    /// `retention` ([`Records::scope`] refuses a retention not longer than the lease).
    pub fn new(lease: Duration, retention: Duration) -> Self {
        ScopeConfig { lease, retention }
    }
}

crate::support::config::setters!(ScopeConfig {
    lease: Duration,
    retention: Duration,
});

/// The idempotency records of one store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Records<S> {
    store: S,
    scopes: Arc<HashMap<String, ScopeConfig>>,
    /// Whether a claim reads the record before its write (shared by clones).
    first: FirstRound,
    /// Every claim and every holder's write is answered within this.
    deadline: Duration,
    /// The queue of concurrent claims, on a store that batches them (shared by clones).
    claims: Option<Arc<crate::coalesce::claims::Batched<S, claims::Owned, i32>>>,
    /// The queue of concurrent finishes (shared by clones), unless turned off.
    finishes: Option<Arc<crate::coalesce::claims::Batched<S, finishes::Owned, ()>>>,
    #[cfg(feature = "redis")]
    front: Option<Arc<RedisFront>>,
    /// What [`Records::run`] asks at its recorded points (the testing kit's faults).
    hook: crate::support::hook::Slot,
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
        let claims = S::BATCHES_CLAIMS
            .then(|| crate::coalesce::claims::Batched::new(store.clone(), DEFAULT_DEADLINE));
        let finishes = Some(crate::coalesce::claims::Batched::new(
            store.clone(),
            DEFAULT_DEADLINE,
        ));
        Records {
            store,
            scopes: Arc::default(),
            first: FirstRound::new(ReadFirst::Adaptive, S::READ_FIRST_FROM),
            deadline: DEFAULT_DEADLINE,
            claims,
            finishes,
            #[cfg(feature = "redis")]
            front: None,
            hook: crate::support::hook::Slot::default(),
        }
    }

    /// These records, [`Records::run`] asking `hook` at each recorded point.
    #[cfg(feature = "testing")]
    pub(crate) fn with_hook(mut self, hook: Arc<dyn crate::support::hook::Hook>) -> Self {
        self.hook = crate::support::hook::Slot(Some(hook));
        self
    }

    /// Whether concurrent claims are coalesced: while one claim statement is in flight,
    /// the new claims that arrive go together in the next, one statement and one commit
    /// (every backend's store can). A lone claim goes at once, as
    /// without. Every claim is answered as if it had gone alone. Default on.
    pub fn coalesce_claims(mut self, on: bool) -> Self {
        self.claims = (on && S::BATCHES_CLAIMS)
            .then(|| crate::coalesce::claims::Batched::new(self.store.clone(), DEFAULT_DEADLINE));
        self
    }

    /// How many claims went in statements of two or more.
    pub fn coalesced_claims(&self) -> CoalescedClaims {
        self.claims
            .as_ref()
            .map(|c| c.coalesced())
            .unwrap_or_default()
    }

    /// Whether concurrent finishes are coalesced: while one holder's finish
    /// ([`complete`](Self::complete), [`fail`](Self::fail), [`release`](Self::release))
    /// is in flight, the finishes that arrive go together in the next, one transaction
    /// and one commit (one statement on PostgreSQL). A lone finish goes at once, as
    /// without. Each is answered as if it had gone alone. Default on.
    pub fn coalesce_finishes(mut self, on: bool) -> Self {
        self.finishes =
            on.then(|| crate::coalesce::claims::Batched::new(self.store.clone(), DEFAULT_DEADLINE));
        self
    }

    /// How many finishes went in batches of two or more.
    pub fn coalesced_finishes(&self) -> CoalescedClaims {
        self.finishes
            .as_ref()
            .map(|c| c.coalesced())
            .unwrap_or_default()
    }

    /// Every claim, and every holder's write (`complete`, `fail`, `release`, `extend`),
    /// is answered within `deadline`, its retries and read-backs included: past it,
    /// [`Error::Unavailable`] if it never got a connection (of its own, or, for a
    /// coalesced finish, its batch's), else
    /// [`Error::DeadlineExceeded`] (what it sent may have landed: a claim then holds the
    /// record until its lease runs out, a finish is found by the next claim). Both are
    /// retryable. The work inside [`run`](Self::run) is bounded by the lease, not by
    /// this. Default 5 s; zero or over a year is [`Error::InvalidInput`].
    pub fn deadline(mut self, deadline: Duration) -> Result<Self> {
        if deadline.is_zero() || deadline > Duration::from_secs(365 * 24 * 3600) {
            return Err(Error::InvalidInput(
                "deadline must be more than 0 and at most a year".into(),
            ));
        }
        self.deadline = deadline;
        Ok(self)
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

    /// How `scope`'s records live, if it was added.
    pub fn scope_config(&self, scope: &str) -> Option<ScopeConfig> {
        self.scopes.get(scope).copied()
    }

    fn config(&self, scope: &str) -> Result<ScopeConfig> {
        self.scopes
            .get(scope)
            .copied()
            .ok_or_else(|| Error::InvalidInput(format!("unknown scope {scope:?}")))
    }

    async fn read(&self, scope: &str, key: &str) -> Result<Option<RecordRow>, sqlx::Error> {
        let mut lease = Lease::acquire(&self.store).await?;
        let out = self.store.read(lease.conn(), scope, key).await;
        lease.release_after(&out);
        out
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
