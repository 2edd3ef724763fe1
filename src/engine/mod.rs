//! The transition algorithm, written once for every backend.
//!
//! validate input → apply first (the floor's statements), or read the request's history
//! row first during a storm of replays → if that did not settle it, read the entity and
//! the request's history row (one statement) → judge → conditional update + history
//! insert → on a lost race, read afresh and judge again, within a bounded retry budget.
//!
//! | file | concern |
//! |---|---|
//! | `mod.rs` | [`Engine`], [`EngineConfig`], the outcome types, create/get/history |
//! | `request.rs` | [`TransitionRequest`] and [`CreateRequest`]: a request, its options, and its way in |
//! | `judge.rs` | the outcome table as a pure function of what was read (no I/O) |
//! | `req.rs` | what a request's way shares: the validated request, its connection, the answers without a write |
//! | `attempt.rs` | the retry loop and one attempt |
//! | `settle.rs` | the read-back of an in-doubt write |
//! | `read_first.rs` | [`ReadFirst`]: when a request starts with a read |
//! | `writes.rs` | apply-first writes of concurrent callers coalesced into one unit, and a request's turn among them |
//! | `detach.rs` | a call finished off its caller's task when the caller stops waiting |
//! | `input.rs` | references, payload fingerprints, names read from the database |
//! | `timers.rs` | timers scheduled and cancelled by hand |
//!
//! Two guarantees hold whatever the driver does:
//! - **Cancellation**: a caller may drop any future at any await point; the pooled
//!   connection is then closed, never returned to the pool mid-conversation (see
//!   `store/lease.rs`), and what committed stays committed.
//! - **In-doubt commits**: when the connection fails at or after a write was sent, the
//!   request is read back by its identity on a fresh connection and answered from the
//!   history; if that read is impossible too, the answer is [`Error::InDoubt`], which is
//!   safe to re-send.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::error::Error;
use crate::error::Result;
use crate::machine::{StateMachine, validate};
use crate::store::{Entity, Lease, Store, db_error};

mod attempt;
mod edges;
mod guarded;
mod input;
mod judge;
mod req;
mod request;
pub(crate) mod rule_conn;
mod rules;
mod schema;
mod settle;
mod step;
mod timer_batch;
mod timers;
mod writes;

pub use crate::coalesce::writes::CoalescedWrites;
pub use crate::support::read_first::ReadFirst;
use crate::support::{detach, read_first};
pub use input::{MAX_REF_LEN, parse_event};
pub use request::{CreateRequest, TransitionRequest};
pub use rule_conn::{Arg, RuleConn};
pub use rules::{Halt, Judged, RuleFuture, Rules, RulesOf};
pub(crate) use timer_batch::{ARMABLE_VERSIONS, Armed, BatchFiring};

use detach::within_deadline;
use input::{parse_record, parse_state, parse_version};
use read_first::FirstRound;

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
    /// SHA-256 of the payload's canonical JSON, hex, if a payload was given.
    pub payload_hash: Option<String>,
    /// The payload, if one was given.
    pub payload: Option<serde_json::Value>,
    /// Who asked for it ([`TransitionRequest::actor`]), if the request said.
    pub actor: Option<String>,
    /// Why ([`TransitionRequest::reason`]), if the request said.
    pub reason: Option<String>,
    /// When it was recorded (database clock).
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// How an engine retries and when it reads first.
#[non_exhaustive]
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
    /// Which round trip a transition starts with (inside a caller's transaction too).
    /// Default [`ReadFirst::Adaptive`].
    pub read_first: ReadFirst,
    /// Every transition on the engine's own connections is answered within this,
    /// retries and the read-back of an in-doubt write included: past it, the answer is
    /// [`Error::Unavailable`] if no connection was to be had, or
    /// [`Error::DeadlineExceeded`] (what the call was in the middle of is finished off
    /// the caller's task, and a write it had not sent is never sent; a re-send is
    /// answered as the database then says). Inside a caller's transaction the
    /// caller's own timeouts apply. Default 5 s.
    pub deadline: Duration,
    /// Whether new requests on the engine's own connections that arrive while another's
    /// write is in flight wait and go together in the next write unit, one commit for
    /// all (on a store that batches writes). A request that finds no write in flight
    /// goes at once, alone. No answer changes. Default `true`.
    pub coalesce_writes: bool,
    /// The largest event body ([`TransitionRequest::event_body`]), in bytes of JSON: a
    /// larger one is [`Error::InvalidInput`] and nothing is written. Set it to what your
    /// sink can carry ([`Sink::max_message_bytes`](crate::outbox::Sink::max_message_bytes),
    /// less room for the headers): a body the broker refuses would go dead at its first
    /// publish. Default 1 MiB less 16 KiB (NATS's default `max_payload` is 1 MiB, headers
    /// included); 1 byte to 64 MiB.
    pub max_event_body: usize,
    /// The delays of the machine's timers set here rather than in the graph, by the
    /// names of the state that arms each and the event it fires: `("Created",
    /// "Cancel")` → 15 min overrides `Created after 30 min => Cancel`. Each names a
    /// timer the machine declares, with a delay of 1 ms to 366 days, else the engine is
    /// not made ([`Error::InvalidInput`]). The engine arms the timers with these delays
    /// and draws them so ([`Engine::mermaid`]). Set with
    /// [`timer_delay`](Self::timer_delay). Default none.
    pub timer_delays: BTreeMap<(String, String), Duration>,
}

crate::support::config::setters!(EngineConfig {
    max_attempts: u32,
    min_backoff: Duration,
    max_backoff: Duration,
    in_doubt_timeout: Duration,
    read_first: ReadFirst,
    deadline: Duration,
    coalesce_writes: bool,
    max_event_body: usize,
});

/// The default [`EngineConfig::max_event_body`].
pub const DEFAULT_MAX_EVENT_BODY: usize = (1 << 20) - (16 << 10);

/// The largest [`EngineConfig::max_event_body`].
const MAX_EVENT_BODY: usize = 64 << 20;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_attempts: 10,
            min_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(100),
            in_doubt_timeout: Duration::from_secs(5),
            read_first: ReadFirst::default(),
            deadline: Duration::from_secs(5),
            coalesce_writes: true,
            max_event_body: DEFAULT_MAX_EVENT_BODY,
            timer_delays: BTreeMap::new(),
        }
    }
}

impl EngineConfig {
    /// The same config with the delay of the timer that entering `state` arms to fire
    /// `event` set to `after` (from your configuration: "an unpaid order expires after
    /// …"); see [`timer_delays`](Self::timer_delays).
    #[must_use]
    pub fn timer_delay(mut self, state: &str, event: &str, after: Duration) -> Self {
        self.timer_delays
            .insert((state.to_owned(), event.to_owned()), after);
        self
    }
}

/// Drives a [`StateMachine`] over a [`Store`]. Cheap to clone: clones share the store's
/// pool and the share of replays that [`ReadFirst::Adaptive`] goes by.
pub struct Engine<M: StateMachine, S: Store> {
    store: S,
    /// The guards and effects the machine's edges name.
    rules: Option<Arc<dyn Rules<M, S::Conn>>>,
    config: EngineConfig,
    edges: Arc<HashMap<M::Event, edges::Edges>>,
    first: FirstRound,
    /// Coalesces read-first reads, on a store that batches reads.
    reads: Option<Arc<crate::coalesce::reads::Reads<S>>>,
    /// The delay of each of the machine's timers ([`StateMachine::TIMERS`], in its
    /// order), in milliseconds: as declared, or as the config set it.
    timer_ms: Arc<[u64]>,
    /// Coalesces apply-first writes, on a store that batches writes.
    writes: Option<Arc<crate::coalesce::writes::Writes<S>>>,
}

impl<M: StateMachine, S: Store> Clone for Engine<M, S> {
    fn clone(&self) -> Self {
        Engine {
            store: self.store.clone(),
            rules: self.rules.clone(),
            config: self.config.clone(),
            edges: self.edges.clone(),
            first: self.first.clone(),
            reads: self.reads.clone(),
            writes: self.writes.clone(),
            timer_ms: self.timer_ms.clone(),
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

impl<M: StateMachine, S: Store> Engine<M, S> {
    /// An engine with the default [`EngineConfig`]. Fails with [`Error::InvalidMachine`]
    /// if the graph is unsound (only possible for hand-written machines; the macro checks
    /// at compile time).
    pub fn new(store: S) -> Result<Self> {
        Self::with_config(store, EngineConfig::default())
    }

    /// An engine with an explicit configuration.
    pub fn with_config(store: S, config: EngineConfig) -> Result<Self> {
        validate::<M>().map_err(Error::InvalidMachine)?;
        if config.max_attempts == 0 {
            return Err(Error::InvalidInput(
                "max_attempts must be at least 1".into(),
            ));
        }
        if config.deadline.is_zero() || config.deadline > Duration::from_secs(365 * 24 * 3600) {
            return Err(Error::InvalidInput(
                "deadline must be more than 0 and at most a year".into(),
            ));
        }
        if config.max_event_body == 0 || config.max_event_body > MAX_EVENT_BODY {
            return Err(Error::InvalidInput(
                "max_event_body must be 1 byte to 64 MiB".into(),
            ));
        }
        if !M::TIMERS.is_empty() {
            timers::names::<M>()?;
        }
        let timer_ms = timers::delays::<M>(&config.timer_delays)?;
        let edges = edges::of::<M>();
        Ok(Engine {
            reads: (S::BATCH_READ_MAX > 1)
                .then(|| crate::coalesce::reads::Reads::new(store.clone())),
            writes: (config.coalesce_writes && S::BATCHES_WRITES)
                .then(|| crate::coalesce::writes::Writes::new(store.clone(), config.deadline)),
            first: FirstRound::new(config.read_first, S::READ_FIRST_FROM),
            store,
            rules: None,
            config,
            edges: Arc::new(edges),
            timer_ms,
        })
    }

    /// Whether `event` has an edge that names a guard or an effect.
    fn has_rules(&self, event: M::Event) -> bool {
        self.edges.get(&event).is_some_and(|e| e.rules)
    }

    /// Whether no edge of `event` names a guard or an effect: its transition is only
    /// writes to the database (a timer job fires it inside the claim's transaction).
    pub(crate) fn unguarded(&self, event: M::Event) -> bool {
        self.edges.get(&event).is_some_and(|e| !e.guarded)
    }

    /// The engine's deadline for one call.
    pub(crate) fn deadline(&self) -> Duration {
        self.config.deadline
    }

    /// Whether `event` can be applied again after it was applied (see [`Edges`]).
    fn repeatable(&self, event: M::Event) -> bool {
        self.edges.get(&event).is_none_or(|e| e.repeatable)
    }

    /// Whether a request of `event` to an entity at `status` is certainly unrecorded: the
    /// event is allowed there and is not repeatable, so it was never applied to the
    /// entity.
    fn unrecorded_at(&self, event: M::Event, status: &str) -> bool {
        self.edges
            .get(&event)
            .is_some_and(|e| !e.repeatable && e.from.contains(&status))
    }

    /// The engine with the guards and effects its machine's edges name (`rules` is
    /// usually `RulesOf(my_rules)`, `my_rules` implementing the machine's rules trait
    /// for this store's connection). A request along an edge that names a rule runs it
    /// inside the transition's unit; without rules, such a request fails with
    /// [`Error::RuleFailed`] and writes nothing.
    pub fn with_rules(mut self, rules: impl Rules<M, S::Conn>) -> Self {
        self.rules = Some(Arc::new(rules));
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The share of recent transitions through this engine (and its clones) that were
    /// replays, between 0 and 1, as [`ReadFirst::Adaptive`] counts it; 0 under the other
    /// policies. A cheap gauge for metrics.
    pub fn recent_replay_share(&self) -> f64 {
        self.first.share()
    }

    /// Moves the entity by `event`, exactly once per `(order_id, event, ref_id)`: await
    /// the returned request, after setting any options on it (a payload, the caller's
    /// transaction).
    ///
    /// See the outcome table in the crate docs: `Ok(Applied)` for the first application,
    /// `Ok(Replayed)` for a repeat, and a typed [`Error`] otherwise.
    pub fn transition<'a>(
        &'a self,
        order_id: i64,
        event: M::Event,
        ref_id: &'a str,
    ) -> TransitionRequest<'a, M, S> {
        TransitionRequest::new(self, order_id, Ok(event), ref_id)
    }

    /// [`transition`](Self::transition) with the event given by name, as received from a
    /// client or a queue. An unknown name is [`Error::InvalidInput`] when awaited.
    pub fn transition_named<'a>(
        &'a self,
        order_id: i64,
        event: &str,
        ref_id: &'a str,
    ) -> TransitionRequest<'a, M, S> {
        TransitionRequest::new(self, order_id, parse_event::<M>(event), ref_id)
    }

    /// Creates the entity at the initial state: await the returned request, or run it
    /// inside your transaction with [`within`](CreateRequest::within). Creating one that
    /// already exists at the initial state is not an error; one that has moved on is
    /// [`Error::AlreadyExists`]. A row is inserted (`id`, `status`, `version` 0) only when
    /// none has the id, so an entity table with `NOT NULL` business columns takes its row
    /// from your own insert, made first in the same transaction, at the initial state's
    /// stored form (its variant name, `M::INITIAL.as_ref()`) and version 0.
    pub fn create(&self, order_id: i64) -> CreateRequest<'_, M, S> {
        CreateRequest::new(self, order_id)
    }

    /// How many of this engine's write units (and its clones') carried several requests
    /// at once, and how many requests they carried: a cheap gauge of how much
    /// [`EngineConfig::coalesce_writes`] shares. Zero on a store that does not batch
    /// writes, or with coalescing off.
    pub fn coalesced_writes(&self) -> CoalescedWrites {
        self.writes
            .as_ref()
            .map(|w| w.coalesced())
            .unwrap_or_default()
    }

    /// The entity's current state.
    pub async fn get(&self, order_id: i64) -> Result<Order<M::State>> {
        within_deadline(self.config.deadline, false, async {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let row = self.store.get(lease.conn(), order_id).await;
            lease.release_after(&row);
            let entity = row
                .map_err(db_error::<S>)?
                .ok_or(Error::NotFound { order_id })?;
            Ok(Order {
                id: order_id,
                state: parse_state::<M>(order_id, &entity.status)?,
                version: parse_version(order_id, entity.version)?,
            })
        })
        .await
    }

    /// The entity's history, oldest first.
    pub async fn history(&self, order_id: i64) -> Result<Vec<Record<M>>> {
        within_deadline(self.config.deadline, false, async {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let rows = self.store.history(lease.conn(), order_id).await;
            lease.release_after(&rows);
            let rows = rows.map_err(db_error::<S>)?;
            rows.into_iter()
                .map(|r| parse_record::<M>(order_id, r))
                .collect()
        })
        .await
    }
}

pub(super) fn created<M: StateMachine>(order_id: i64, entity: Entity) -> Result<Order<M::State>> {
    let state = parse_state::<M>(order_id, &entity.status)?;
    let version = parse_version(order_id, entity.version)?;
    if state != M::INITIAL {
        return Err(Error::AlreadyExists {
            order_id,
            state: entity.status,
        });
    }
    Ok(Order {
        id: order_id,
        state,
        version,
    })
}
