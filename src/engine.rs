//! The transition algorithm, written once for every backend.
//!
//! validate input → apply first (the floor's statements), or read the request's history
//! row first during a storm of replays → if that did not settle it, read the entity and
//! the request's history row (one statement) → judge → conditional update + history
//! insert → on a lost race, read afresh and judge again, within a bounded retry budget.
//!
//! Two guarantees hold whatever the driver does:
//! - **Cancellation**: a caller may drop any future at any await point; the pooled
//!   connection is then closed, never returned to the pool mid-conversation (see
//!   `lease`), and what committed stays committed.
//! - **In-doubt commits**: when the connection fails at or after a write was sent, the
//!   request is read back by its identity on a fresh connection and answered from the
//!   history; if that read is impossible too, the answer is [`Error::InDoubt`], which is
//!   safe to re-send.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::machine::{StateMachine, validate};
use crate::store::{
    Apply, ErrorClass, Key, Observed, Optimistic, Prior, RawTransition, Request, Store, db_error,
    is_unique_violation,
};
use crate::{Error, Result};

mod batch;
mod lease;

use lease::Lease;

/// Longest accepted `ref_id`, in characters.
pub const MAX_REF_LEN: usize = 255;

/// The result of a transition that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome<S> {
    /// This call moved the entity.
    Applied {
        /// State before.
        from: S,
        /// State after.
        to: S,
        /// Version after (equals the history row's `seq`).
        version: i64,
    },
    /// This exact request was applied before; nothing was written. The fields are what the
    /// first application recorded, even if the entity has moved on since.
    Replayed {
        /// State before the first application.
        from: S,
        /// State after the first application.
        to: S,
        /// Version after the first application.
        version: i64,
    },
}

impl<S: Copy> Outcome<S> {
    /// The state this request led to.
    pub fn state(&self) -> S {
        match self {
            Outcome::Applied { to, .. } | Outcome::Replayed { to, .. } => *to,
        }
    }

    /// The version this request produced.
    pub fn version(&self) -> i64 {
        match self {
            Outcome::Applied { version, .. } | Outcome::Replayed { version, .. } => *version,
        }
    }

    /// Whether this call wrote anything.
    pub fn is_applied(&self) -> bool {
        matches!(self, Outcome::Applied { .. })
    }
}

/// An entity's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Order<S> {
    /// Its id.
    pub id: i64,
    /// Its state.
    pub state: S,
    /// Number of transitions applied to it.
    pub version: i64,
}

/// One history row, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<M: StateMachine> {
    /// Version after this transition.
    pub seq: i64,
    /// State before.
    pub from: M::State,
    /// State after.
    pub to: M::State,
    /// The event.
    pub event: M::Event,
    /// The caller's reference.
    pub ref_id: String,
    /// SHA-256 of the payload's JSON, hex, if a payload was given.
    pub payload_hash: Option<String>,
    /// The payload, if one was given.
    pub payload: Option<serde_json::Value>,
    /// When it was recorded (database clock).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Retry policy for lost races and retryable database errors.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Attempts per request before [`Error::Contention`]. Default 10.
    pub max_attempts: u32,
    /// First backoff delay. Default 1 ms.
    pub min_backoff: Duration,
    /// Largest backoff delay. Default 100 ms.
    pub max_backoff: Duration,
    /// How long to keep trying to read a request back after the connection failed at or
    /// after its write was sent, before answering [`Error::InDoubt`]. Default 5 s.
    pub in_doubt_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_attempts: 10,
            min_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(100),
            in_doubt_timeout: Duration::from_secs(5),
        }
    }
}

/// Drives a [`StateMachine`] over a [`Store`]. Cheap to clone: clones share the store's
/// pool.
pub struct Engine<M: StateMachine, S> {
    store: S,
    config: EngineConfig,
    edges: Arc<HashMap<M::Event, Edges>>,
    /// Coalesces read-first reads, on a store that [batches reads](Store::BATCHES_READS).
    reads: Option<Arc<batch::Reads<S>>>,
}

/// The rows of the transition table for one event, as names: `from[i]` leads to `to[i]`.
#[derive(Debug, Default)]
struct Edges {
    from: Vec<&'static str>,
    to: Vec<&'static str>,
}

impl<M: StateMachine, S: Clone> Clone for Engine<M, S> {
    fn clone(&self) -> Self {
        Engine {
            store: self.store.clone(),
            config: self.config.clone(),
            edges: self.edges.clone(),
            reads: self.reads.clone(),
        }
    }
}

impl<M: StateMachine, S: Store> std::fmt::Debug for Engine<M, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("machine", &M::NAME)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

enum Step<S> {
    Done(Result<Outcome<S>>),
    /// Read again; the reason is for the trace.
    Retry(&'static str),
    /// The connection failed (and is discarded). `wrote`: at or after this attempt's
    /// write was sent, so the write may have committed.
    Lost {
        error: sqlx::Error,
        wrote: bool,
    },
}

/// Where a request's connection comes from.
enum Conn<'c, S: Store> {
    /// The engine's own, from the pool, taken when first needed and replaced after a
    /// failure that lost it. Dropped mid-request, it is closed (see [`Lease`]).
    Pooled(Option<Lease<S>>),
    /// The caller's transaction.
    Caller(&'c mut S::Conn),
}

impl<S: Store> Conn<'_, S> {
    fn in_tx(&self) -> bool {
        matches!(self, Conn::Caller(_))
    }

    async fn get(&mut self, store: &S) -> Result<&mut S::Conn, sqlx::Error> {
        match self {
            Conn::Caller(conn) => Ok(conn),
            Conn::Pooled(lease) => {
                let held = match lease.take() {
                    Some(held) => held,
                    None => Lease::acquire(store).await?,
                };
                Ok(lease.insert(held).conn())
            }
        }
    }

    /// The connection failed: closed, and replaced when next needed.
    fn lost(&mut self) {
        if let Conn::Pooled(lease) = self {
            *lease = None;
        }
    }

    /// The request ran to its end: a pooled connection goes back to the pool.
    fn finish(self) {
        if let Conn::Pooled(Some(lease)) = self {
            lease.release();
        }
    }
}

enum Verdict<S> {
    Done(Result<Outcome<S>>),
    Apply {
        from: S,
        to: S,
        version: i64,
    },
    /// The event is not allowed from `state`: a conflict if the event was applied under
    /// another reference, an invalid transition otherwise.
    Refused {
        state: S,
    },
}

/// A payload's fingerprint and JSON text.
struct Payload {
    hash: String,
    json: String,
}

impl<M: StateMachine, S: Store> Engine<M, S> {
    /// An engine with the default [`EngineConfig`]. Fails with [`Error::InvalidMachine`]
    /// if the graph is unsound (only possible for hand-written machines; the macro checks
    /// at compile time).
    pub fn new(store: S) -> Result<Self> {
        Self::with_config(store, EngineConfig::default())
    }

    /// An engine with an explicit retry policy.
    pub fn with_config(store: S, config: EngineConfig) -> Result<Self> {
        validate::<M>().map_err(Error::InvalidMachine)?;
        if config.max_attempts == 0 {
            return Err(Error::InvalidInput(
                "max_attempts must be at least 1".into(),
            ));
        }
        let mut edges: HashMap<M::Event, Edges> = HashMap::new();
        for t in M::TRANSITIONS {
            let e = edges.entry(t.event).or_default();
            e.from.push(t.from.into());
            e.to.push(t.to.into());
        }
        Ok(Engine {
            reads: S::BATCHES_READS.then(|| batch::Reads::new(store.clone())),
            store,
            config,
            edges: Arc::new(edges),
        })
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Creates the entity at the initial state. Creating one that already exists at the
    /// initial state is not an error; one that has moved on is [`Error::AlreadyExists`].
    pub async fn create(&self, order_id: i64) -> Result<Order<M::State>> {
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let row = self
            .store
            .create(lease.conn(), order_id, M::INITIAL.into())
            .await;
        lease.release_after(&row);
        self.created(order_id, row.map_err(db_error::<S>)?)
    }

    /// [`create`](Self::create) inside the caller's transaction.
    pub async fn create_in(&self, conn: &mut S::Conn, order_id: i64) -> Result<Order<M::State>> {
        let row = self
            .store
            .create(conn, order_id, M::INITIAL.into())
            .await
            .map_err(db_error::<S>)?;
        self.created(order_id, row)
    }

    fn created(&self, order_id: i64, (status, version): (String, i64)) -> Result<Order<M::State>> {
        let state = parse_state::<M>(order_id, &status)?;
        let version = parse_version(order_id, version)?;
        if state != M::INITIAL {
            return Err(Error::AlreadyExists {
                order_id,
                state: status,
            });
        }
        Ok(Order {
            id: order_id,
            state,
            version,
        })
    }

    /// The entity's current state.
    pub async fn get(&self, order_id: i64) -> Result<Order<M::State>> {
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let row = self.store.get(lease.conn(), order_id).await;
        lease.release_after(&row);
        let (status, version) = row
            .map_err(db_error::<S>)?
            .ok_or(Error::NotFound { order_id })?;
        Ok(Order {
            id: order_id,
            state: parse_state::<M>(order_id, &status)?,
            version: parse_version(order_id, version)?,
        })
    }

    /// The entity's history, oldest first.
    pub async fn history(&self, order_id: i64) -> Result<Vec<Record<M>>> {
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let rows = self.store.history(lease.conn(), order_id).await;
        lease.release_after(&rows);
        let rows = rows.map_err(db_error::<S>)?;
        rows.into_iter()
            .map(|r| parse_record::<M>(order_id, r))
            .collect()
    }

    /// Moves the entity by `event`, exactly once per `(order_id, event, ref_id)`.
    ///
    /// See the outcome table in the crate docs: `Ok(Applied)` for the first application,
    /// `Ok(Replayed)` for a repeat, and a typed [`Error`] otherwise.
    pub async fn transition(
        &self,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
    ) -> Result<Outcome<M::State>> {
        self.run_pooled(order_id, event, ref_id, None).await
    }

    /// Like [`transition`](Self::transition), with a payload recorded in the history.
    /// Its SHA-256 fingerprint is part of the request's identity: repeating the reference
    /// with a different payload is [`Error::PayloadMismatch`].
    pub async fn transition_with_payload<P: Serialize + ?Sized>(
        &self,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
        payload: &P,
    ) -> Result<Outcome<M::State>> {
        let payload = fingerprint(payload)?;
        self.run_pooled(order_id, event, ref_id, Some(payload))
            .await
    }

    /// Like [`transition`](Self::transition), with the event given by name (as received
    /// from a client or a queue). An unknown name is [`Error::InvalidInput`].
    pub async fn transition_named(
        &self,
        order_id: i64,
        event: &str,
        ref_id: &str,
    ) -> Result<Outcome<M::State>> {
        self.transition(order_id, parse_event::<M>(event)?, ref_id)
            .await
    }

    /// [`transition`](Self::transition) inside the caller's transaction, so the caller's
    /// own writes and the state change commit or roll back together. The attempt runs in a
    /// savepoint, so a lost race is undone without aborting the caller's transaction.
    ///
    /// On SQLite, begin the caller's transaction with `BEGIN IMMEDIATE`; on MySQL/MariaDB
    /// the read takes row locks, since a plain read would see the transaction's snapshot.
    ///
    /// If you drop this future before it completes (a timeout, `select!`), your
    /// connection may be in the middle of a statement: do not commit; roll back by closing
    /// the connection (`PoolConnection::detach`, then drop it). A retryable error here
    /// means your whole transaction is gone: run it again from its `BEGIN`.
    pub async fn transition_in(
        &self,
        conn: &mut S::Conn,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
    ) -> Result<Outcome<M::State>> {
        validate_ref(ref_id)?;
        let key = Key {
            order_id,
            event: event.into(),
            ref_id,
        };
        self.run(&mut Conn::Caller(conn), key, event, None, false)
            .await
    }

    /// [`transition_with_payload`](Self::transition_with_payload) inside the caller's
    /// transaction.
    pub async fn transition_with_payload_in<P: Serialize + ?Sized>(
        &self,
        conn: &mut S::Conn,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
        payload: &P,
    ) -> Result<Outcome<M::State>> {
        validate_ref(ref_id)?;
        let payload = fingerprint(payload)?;
        let key = Key {
            order_id,
            event: event.into(),
            ref_id,
        };
        self.run(&mut Conn::Caller(conn), key, event, Some(&payload), false)
            .await
    }

    async fn run_pooled(
        &self,
        order_id: i64,
        event: M::Event,
        ref_id: &str,
        payload: Option<Payload>,
    ) -> Result<Outcome<M::State>> {
        validate_ref(ref_id)?;
        let key = Key {
            order_id,
            event: event.into(),
            ref_id,
        };
        // While the store reads first, read in a batch with concurrent callers before
        // taking a connection: a replay is answered without one.
        let mut read_first_done = false;
        if let Some(reads) = &self.reads {
            let first = self.store.first_round();
            if first.reads_first()
                && let Some(prior) = reads.prior(key).await
            {
                first.note(prior.is_some());
                let hash = payload.as_ref().map(|p| p.hash.as_str());
                if let Some(answer) = answer_from_history::<M>(prior, key, event, hash) {
                    return answer;
                }
                read_first_done = true;
            }
        }
        let mut conn = Conn::Pooled(None);
        let outcome = self
            .run(&mut conn, key, event, payload.as_ref(), read_first_done)
            .await;
        conn.finish();
        outcome
    }

    /// The retry loop; `ref_id` is already validated. `read_first_done`: the request's
    /// history row was read first (and counted) and it has none, so the first attempt
    /// goes straight to applying.
    async fn run(
        &self,
        conn: &mut Conn<'_, S>,
        key: Key<'_>,
        event: M::Event,
        payload: Option<&Payload>,
        read_first_done: bool,
    ) -> Result<Outcome<M::State>> {
        let in_tx = conn.in_tx();
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(self.config.min_backoff)
            .with_max_delay(self.config.max_backoff)
            .with_jitter()
            .without_max_times()
            .build();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let read_done = read_first_done && attempts == 1;
            let step = match conn.get(&self.store).await {
                Ok(c) => self.attempt(c, key, event, payload, in_tx, read_done).await,
                Err(e) => retry_or_fail::<M, S>(e, in_tx, false),
            };
            let (reason, lost) = match step {
                Step::Done(result) => return result,
                Step::Retry(reason) => (reason, None),
                Step::Lost { error, wrote } => {
                    conn.lost();
                    if wrote {
                        let hash = payload.map(|p| p.hash.as_str());
                        if let Some(answer) = self.settle(key, event, hash, error).await {
                            return answer;
                        }
                        ("the write did not land", None)
                    } else {
                        ("connection lost", Some(error))
                    }
                }
            };
            if attempts >= self.config.max_attempts {
                tracing::warn!(
                    order_id = key.order_id,
                    event = key.event,
                    attempts,
                    reason,
                    "giving up"
                );
                return Err(match lost {
                    Some(error) => db_error::<S>(error),
                    None => Error::Contention { attempts },
                });
            }
            let delay = delays.next().unwrap_or(self.config.max_backoff);
            tracing::debug!(
                order_id = key.order_id,
                event = key.event,
                attempts,
                reason,
                ?delay,
                "reading again"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// Settles a request whose connection failed at or after its write was sent: reads
    /// the request back by its identity on fresh connections, for at most
    /// [`EngineConfig::in_doubt_timeout`]. Recorded: `Applied` as recorded (see
    /// docs/design.md, "Why is an in-doubt write answered `Applied`?"), or
    /// `PayloadMismatch` if the recorded payload is another. `None`: not recorded, so the
    /// write did not land; judge afresh. Unreadable: [`Error::InDoubt`].
    async fn settle(
        &self,
        key: Key<'_>,
        event: M::Event,
        payload_hash: Option<&str>,
        error: sqlx::Error,
    ) -> Option<Result<Outcome<M::State>>> {
        tracing::debug!(order_id = key.order_id, event = key.event, %error, "write in doubt: reading it back");
        let read_back = async {
            let mut delays = ExponentialBuilder::default()
                .with_min_delay(self.config.min_backoff)
                .with_max_delay(self.config.max_backoff)
                .without_max_times()
                .build();
            loop {
                let read = async {
                    let mut lease = Lease::acquire(&self.store).await?;
                    let prior = self.store.prior(lease.conn(), key, false).await;
                    lease.release_after(&prior);
                    prior
                };
                match read.await {
                    Ok(prior) => return prior,
                    Err(e) => {
                        tracing::debug!(error = %e, "reading an in-doubt write back failed");
                        tokio::time::sleep(delays.next().unwrap_or(self.config.max_backoff)).await;
                    }
                }
            }
        };
        let prior = match tokio::time::timeout(self.config.in_doubt_timeout, read_back).await {
            Ok(prior) => prior?,
            Err(_) => {
                return Some(Err(Error::InDoubt {
                    order_id: key.order_id,
                    event: key.event,
                    ref_id: key.ref_id.to_string(),
                    source: error,
                }));
            }
        };
        answer_from_history::<M>(Some(prior), key, event, payload_hash).map(|answer| {
            answer.map(|outcome| match outcome {
                Outcome::Replayed { from, to, version }
                | Outcome::Applied { from, to, version } => Outcome::Applied { from, to, version },
            })
        })
    }

    /// One read → judge → update. A lost race or a retryable error asks for another
    /// attempt, which starts again from a fresh read. `read_done`: this request was read
    /// first already, found unrecorded and counted.
    async fn attempt(
        &self,
        conn: &mut S::Conn,
        key: Key<'_>,
        event: M::Event,
        payload: Option<&Payload>,
        in_tx: bool,
        read_done: bool,
    ) -> Step<M::State> {
        let hash = payload.map(|p| p.hash.as_str());
        let edges = self.edges.get(&event);
        let request = Request {
            key,
            from_states: edges.map_or(&[], |e| &e.from),
            to_states: edges.map_or(&[], |e| &e.to),
            payload_hash: hash,
            payload: payload.map(|p| p.json.as_str()),
        };
        // Outside a caller's transaction, try to apply first (the floor's statements), or,
        // while replays are common, read the request's history row first (`ReadFirst`).
        let first = self.store.first_round();
        let reads_first = !in_tx && !read_done && first.reads_first();
        // Whether this request has been counted for `ReadFirst::Adaptive` yet.
        let noted = reads_first || read_done;
        if reads_first {
            let prior = match self.store.prior(conn, key, false).await {
                Ok(prior) => prior,
                Err(e) => return retry_or_fail::<M, S>(e, in_tx, false),
            };
            first.note(prior.is_some());
            if let Some(answer) = answer_from_history::<M>(prior, key, event, hash) {
                return Step::Done(answer);
            }
        }
        let mut optimistic = Optimistic::NotTried;
        if !in_tx {
            optimistic = match self.store.attempt(conn, request).await {
                Ok(Optimistic::Applied(from, to, version)) => {
                    if !noted {
                        first.note(false);
                    }
                    let applied = parse_state::<M>(key.order_id, &from).and_then(|from| {
                        let to = parse_state::<M>(key.order_id, &to)?;
                        Ok(Outcome::Applied { from, to, version })
                    });
                    return Step::Done(applied);
                }
                Ok(tried) => tried,
                // Recorded before (a replay, or a twin that committed first): the attempt
                // was undone; the read finds the history row.
                Err(e) if is_unique_violation(&e) => Optimistic::NotApplied,
                Err(e) => return retry_or_fail::<M, S>(e, in_tx, true),
            };
        }
        let mut observed = match self.store.observe(conn, request, in_tx).await {
            Ok(o) => Observed { optimistic, ..o },
            Err(e) => return retry_or_fail::<M, S>(e, in_tx, false),
        };
        if !in_tx && !noted {
            first.note(observed.prior.is_some());
        }
        if observed.current.is_none() && observed.prior.is_none() {
            // No entity row, so the read had nothing to join the history row to: a
            // request recorded for it is still a replay (row 1 before row 5).
            observed.prior = match self.store.prior(conn, key, in_tx).await {
                Ok(prior) => prior,
                Err(e) => return retry_or_fail::<M, S>(e, in_tx, false),
            };
        }
        let (from, to, version) = match judge::<M>(&observed, key, event, hash) {
            Verdict::Done(result) => return Step::Done(result),
            Verdict::Refused { state } => {
                return match self.store.latest_ref(conn, key, in_tx).await {
                    // A twin of this very request was applied after the judge's read (on
                    // a graph with a cycle, the entity can come back to where the event
                    // is refused): the request is recorded now, and the next read
                    // answers it as a replay. Never a conflict with itself.
                    Ok(Some(existing)) if existing == key.ref_id => {
                        Step::Retry("own reference recorded meanwhile")
                    }
                    Ok(existing) => Step::Done(Err(refusal::<M>(state, event, existing))),
                    Err(e) => retry_or_fail::<M, S>(e, in_tx, false),
                };
            }
            // The store's optimistic update already found this snapshot stale.
            Verdict::Apply { .. } if observed.optimistic == Optimistic::NotApplied => {
                return Step::Retry("stale snapshot");
            }
            Verdict::Apply { from, to, version } => (from, to, version),
        };
        let apply = Apply {
            key,
            from: from.into(),
            to: to.into(),
            version,
            payload_hash: request.payload_hash,
            payload: request.payload,
        };
        match self.apply(conn, apply, in_tx).await {
            Ok(true) => Step::Done(Ok(Outcome::Applied {
                from,
                to,
                version: version + 1,
            })),
            // Someone else moved first: nothing was written; judge again from a fresh read.
            Ok(false) => Step::Retry("lost the conditional update"),
            Err(e) => retry_or_fail::<M, S>(e, in_tx, true),
        }
    }

    /// The conditional update and the history row, atomically. `Ok(false)` when the race
    /// was lost: the update matched no row, or a twin's history row holds the unique key.
    ///
    /// Boxed so that the futures of the public methods do not hold the store's transaction
    /// type: with a concrete store, rustc cannot yet prove such futures `Send`
    /// (rust-lang/rust#100013), and callers need to spawn them.
    fn apply<'a>(
        &'a self,
        conn: &'a mut S::Conn,
        apply: Apply<'a>,
        in_tx: bool,
    ) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + 'a>> {
        Box::pin(async move {
            let mut tx = S::begin(conn, in_tx).await?;
            if self.store.update(&mut tx, apply).await? != 1 {
                S::rollback(tx).await?;
                return Ok(false);
            }
            match self.store.record(&mut tx, apply).await {
                Ok(()) => S::commit(tx).await.map(|()| true),
                Err(e) if is_unique_violation(&e) => S::rollback(tx).await.map(|()| false),
                Err(e) => Err(e),
            }
        })
    }
}

/// The next step after a database error. Inside a caller's transaction every error ends
/// the request: a retryable one (a deadlock, a lost connection) took the caller's
/// transaction with it, and the caller runs the whole transaction again. `wrote`: the
/// error came at or after the attempt's write was sent.
fn retry_or_fail<M: StateMachine, S: Store>(
    e: sqlx::Error,
    in_tx: bool,
    wrote: bool,
) -> Step<M::State> {
    match S::classify(&e) {
        _ if in_tx => Step::Done(Err(db_error::<S>(e))),
        ErrorClass::Retryable => {
            tracing::debug!(error = %e, "retryable database error");
            Step::Retry("retryable database error")
        }
        ErrorClass::ConnectionLost => {
            tracing::debug!(error = %e, wrote, "connection lost");
            Step::Lost { error: e, wrote }
        }
        ErrorClass::Fatal => Step::Done(Err(db_error::<S>(e))),
    }
}

/// The answer to a request recorded before (`prior`), from its history row alone: a
/// replay is final, so the entity's row is not needed. `None` if it was not recorded.
fn answer_from_history<M: StateMachine>(
    prior: Option<Prior>,
    key: Key<'_>,
    event: M::Event,
    payload_hash: Option<&str>,
) -> Option<Result<Outcome<M::State>>> {
    let replay = Observed {
        current: None,
        prior: Some(prior?),
        optimistic: Optimistic::NotTried,
    };
    match judge::<M>(&replay, key, event, payload_hash) {
        Verdict::Done(result) => Some(result),
        // Unreachable: with a history row the judge always answers.
        Verdict::Apply { .. } | Verdict::Refused { .. } => None,
    }
}

/// The outcome table, as a pure function of what was read.
fn judge<M: StateMachine>(
    observed: &Observed,
    key: Key<'_>,
    event: M::Event,
    payload_hash: Option<&str>,
) -> Verdict<M::State> {
    let done = Verdict::Done;
    if let Some(prior) = &observed.prior {
        if prior.payload_hash.as_deref() != payload_hash {
            return done(Err(Error::PayloadMismatch {
                event: event.into(),
                ref_id: key.ref_id.to_string(),
            }));
        }
        let parsed = parse_state::<M>(key.order_id, &prior.from)
            .and_then(|from| Ok((from, parse_state::<M>(key.order_id, &prior.to)?)));
        return done(parsed.map(|(from, to)| Outcome::Replayed {
            from,
            to,
            version: prior.seq,
        }));
    }
    let Some((status, version)) = &observed.current else {
        return done(Err(Error::NotFound {
            order_id: key.order_id,
        }));
    };
    let (state, version) = match parse_state::<M>(key.order_id, status)
        .and_then(|state| Ok((state, parse_version(key.order_id, *version)?)))
    {
        Ok(read) => read,
        Err(e) => return done(Err(e)),
    };
    match M::next(state, event) {
        Some(to) => Verdict::Apply {
            from: state,
            to,
            version,
        },
        None => Verdict::Refused { state },
    }
}

/// Rows 3 and 4 of the outcome table: the event is not allowed from `state`; it is a
/// conflict if it was applied to this entity under another reference.
fn refusal<M: StateMachine>(
    state: M::State,
    event: M::Event,
    existing_ref: Option<String>,
) -> Error {
    match existing_ref {
        Some(existing_ref) => Error::RefConflict {
            event: event.into(),
            existing_ref,
        },
        None => Error::InvalidTransition {
            state: state.into(),
            event: event.into(),
        },
    }
}

/// Parses an event name as received from a client or a queue.
pub fn parse_event<M: StateMachine>(name: &str) -> Result<M::Event> {
    name.parse()
        .map_err(|_| Error::InvalidInput(format!("unknown event {name:?} for machine {}", M::NAME)))
}

fn parse_state<M: StateMachine>(order_id: i64, value: &str) -> Result<M::State> {
    value.parse().map_err(|_| Error::CorruptState {
        order_id,
        value: value.to_string(),
    })
}

/// A version is a count of transitions: a negative one was written outside orderly.
fn parse_version(order_id: i64, version: i64) -> Result<i64> {
    if version < 0 {
        return Err(Error::CorruptState {
            order_id,
            value: format!("version {version}"),
        });
    }
    Ok(version)
}

fn parse_record<M: StateMachine>(order_id: i64, raw: RawTransition) -> Result<Record<M>> {
    let corrupt = |value: &str| Error::CorruptState {
        order_id,
        value: value.to_string(),
    };
    let payload = match raw.payload.as_deref() {
        Some(text) => Some(serde_json::from_str(text).map_err(|_| corrupt(text))?),
        None => None,
    };
    Ok(Record {
        seq: raw.seq,
        from: parse_state::<M>(order_id, &raw.from)?,
        to: parse_state::<M>(order_id, &raw.to)?,
        event: raw.event.parse().map_err(|_| corrupt(&raw.event))?,
        ref_id: raw.ref_id,
        payload_hash: raw.payload_hash,
        payload,
        created_at: raw.created_at,
    })
}

fn validate_ref(ref_id: &str) -> Result<()> {
    if ref_id.trim().is_empty() {
        return Err(Error::InvalidInput("ref_id must not be empty".into()));
    }
    // MySQL/MariaDB compare with PAD SPACE ("p-1" = "p-1 "); refusing edge whitespace
    // keeps a reference's identity the same on every backend.
    if ref_id.trim() != ref_id {
        return Err(Error::InvalidInput(
            "ref_id must not begin or end with whitespace".into(),
        ));
    }
    let len = ref_id.chars().count();
    if len > MAX_REF_LEN {
        return Err(Error::InvalidInput(format!(
            "ref_id is {len} characters long; the limit is {MAX_REF_LEN}"
        )));
    }
    if ref_id.chars().any(char::is_control) {
        return Err(Error::InvalidInput(
            "ref_id must not contain control characters".into(),
        ));
    }
    Ok(())
}

/// The payload's identity: two payloads are the same payload when they serialize to
/// equal JSON values (`serde_json::Value` equality: the same members whatever their
/// order, the same array elements in the same order, equal strings, and numbers equal as
/// JSON numbers of the same kind, so `1` and `1.0` differ). The fingerprint is the SHA-256
/// of the value's canonical JSON text (RFC 8785: members sorted, no whitespace), which is
/// also the text stored. A payload that does not serialize to JSON, or that holds a NUL
/// character (which PostgreSQL cannot store), is [`Error::InvalidInput`] on every backend.
fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<Payload> {
    let not_json = |e: serde_json::Error| {
        Error::InvalidInput(format!("payload is not serializable as JSON: {e}"))
    };
    let value = serde_json::to_value(payload).map_err(not_json)?;
    if holds_nul(&value) {
        return Err(Error::InvalidInput(
            "payload must not contain a NUL character (U+0000)".into(),
        ));
    }
    let json = serde_json_canonicalizer::to_string(&value).map_err(not_json)?;
    let hash = hex::encode(Sha256::digest(json.as_bytes()));
    Ok(Payload { hash, json })
}

fn holds_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(members) => members
            .iter()
            .any(|(k, v)| k.contains('\0') || holds_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::state_machine! {
        Door {
            states: DoorState { Closed, Open }
            events: DoorEvent { Push, Pull }
            initial: Closed;
            terminal: [];
            transitions: {
                Closed + Push => Open,
                Open + Pull => Closed,
            }
        }
    }

    fn key(ref_id: &str) -> Key<'_> {
        Key {
            order_id: 1,
            event: "Push",
            ref_id,
        }
    }

    #[test]
    fn judge_follows_the_outcome_table() {
        let current = |s: &str, v| Some((s.to_string(), v));
        let apply = judge::<Door>(
            &Observed {
                current: current("Closed", 0),
                ..Default::default()
            },
            key("r"),
            DoorEvent::Push,
            None,
        );
        assert!(matches!(
            apply,
            Verdict::Apply {
                from: DoorState::Closed,
                to: DoorState::Open,
                version: 0
            }
        ));

        let prior = Prior {
            seq: 1,
            from: "Closed".into(),
            to: "Open".into(),
            payload_hash: None,
        };
        let replay = judge::<Door>(
            &Observed {
                current: current("Open", 1),
                prior: Some(prior.clone()),
                ..Default::default()
            },
            key("r"),
            DoorEvent::Push,
            None,
        );
        assert!(matches!(
            replay,
            Verdict::Done(Ok(Outcome::Replayed { version: 1, .. }))
        ));

        let mismatch = judge::<Door>(
            &Observed {
                current: current("Open", 1),
                prior: Some(prior),
                ..Default::default()
            },
            key("r"),
            DoorEvent::Push,
            Some("abc"),
        );
        assert!(matches!(
            mismatch,
            Verdict::Done(Err(Error::PayloadMismatch { .. }))
        ));

        let refused = judge::<Door>(
            &Observed {
                current: current("Open", 1),
                ..Default::default()
            },
            key("r"),
            DoorEvent::Push,
            None,
        );
        assert!(matches!(
            refused,
            Verdict::Refused {
                state: DoorState::Open
            }
        ));
        assert!(matches!(
            refusal::<Door>(DoorState::Open, DoorEvent::Push, Some("other".into())),
            Error::RefConflict { ref existing_ref, .. } if existing_ref == "other"
        ));
        assert!(matches!(
            refusal::<Door>(DoorState::Open, DoorEvent::Push, None),
            Error::InvalidTransition {
                state: "Open",
                event: "Push"
            }
        ));

        let corrupt = judge::<Door>(
            &Observed {
                current: current("Ajar", 1),
                ..Default::default()
            },
            key("r"),
            DoorEvent::Push,
            None,
        );
        assert!(matches!(
            corrupt,
            Verdict::Done(Err(Error::CorruptState { .. }))
        ));

        let missing = judge::<Door>(&Observed::default(), key("r"), DoorEvent::Push, None);
        assert!(matches!(
            missing,
            Verdict::Done(Err(Error::NotFound { order_id: 1 }))
        ));
    }

    #[test]
    fn refs_are_validated() {
        assert!(validate_ref("p-1").is_ok());
        assert!(validate_ref(&"x".repeat(255)).is_ok());
        assert!(matches!(validate_ref(""), Err(Error::InvalidInput(_))));
        assert!(matches!(validate_ref("  "), Err(Error::InvalidInput(_))));
        assert!(matches!(
            validate_ref(&"x".repeat(256)),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(validate_ref("a\0b"), Err(Error::InvalidInput(_))));
        assert!(matches!(validate_ref("p-1 "), Err(Error::InvalidInput(_))));
    }
}
