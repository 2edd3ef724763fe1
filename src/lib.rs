#![cfg_attr(not(doctest), doc = include_str!("../README.md"))]
//!
//! # The modules
//!
//! Each layer is a module; arrows point down only (a layer uses the ones below it).
//!
//! ## [`machine`]: the graph
//!
//! Pure, no I/O. [`StateMachine`] names the state and event types, the initial and
//! terminal states and a `const` table of [`Transition`]s; [`state_machine!`] writes all
//! of it and checks the graph at compile time (duplicate rows, unreachable states, edges
//! out of a terminal state). `machine::mermaid` and `machine::dot` render it.
//!
//! ## [`engine`]: the algorithm
//!
//! Written once for every backend. [`Engine::transition`] returns a
//! [`TransitionRequest`]; options (a payload, the caller's transaction) go on it, and
//! awaiting it runs: validate the input → apply first with the floor's statements (or,
//! while replays are common, read the request's history row first: [`ReadFirst`]) → if
//! that did not settle it, read the entity and the request's history row in one
//! statement → judge by the outcome table (a pure function, property-tested against the
//! reference model) → the conditional write → on a lost race, read afresh and judge
//! again, at most [`EngineConfig::max_attempts`] times, all within
//! [`EngineConfig::deadline`]. A call dropped at any await point leaves no connection
//! in the pool mid-conversation (one that had a connection is finished off the caller's
//! task, and its connection returns warm); a write whose connection failed is read back
//! before it is answered, `Applied` only if the row found is this call's own.
//!
//! ## [`store`]: the seam
//!
//! The [`Store`] trait holds a transition's operations, each one round trip or one atomic
//! unit the store owns: the apply-first write, the judge's read, the write after a read,
//! the refusal's read, the batched read of many requests, create/get/history; a guarded
//! request's unit (begin, lock, prior, apply, arm timers, end); the probes and DDL of
//! the tables it is configured with; two operators' reads; and error classification.
//! The two write units are where anything that must commit with a transition joins it.
//! Rows, table names, error classes and leases live here too, in no dialect.
//!
//! ## [`backend`]: the dialects
//!
//! One folder per backend behind a cargo feature (`sqlite`, `postgres`, `mysql`)
//! implements every layer's seam from above: [`Store`], the idempotency layer's
//! `RecordStore`, the flow layer's `FlowStore`, the outbox's `OutboxStore`, the timers'
//! `TimerStore`, one file per
//! layer, with the migrations in `migrations/<backend>/` (embedded with
//! `sqlx::migrate!`). What the dialects share (statements written once, the write units
//! of the dialects that write statement by statement, batched reads) is beside them. No
//! layer imports a backend.
//!
//! ## [`idempotency`]: whole requests, once
//!
//! [`Records`] makes a request that is more than one transition happen once: `claim`
//! takes the record for `(scope, key)` under a lease, or answers from it (the stored
//! result replayed byte for byte, in flight elsewhere, or another payload under the
//! same key); the holder's `complete`, `fail`, `release` and `extend` are fenced by the
//! owner token its claim minted, and `complete_in` commits the record with the caller's
//! own writes. `run` does the common case in one call: claim, the caller's work in a
//! transaction, the record completed in it (or the failure policy applied). The
//! recovery job (`recover`, `recovery_loop`) takes over records whose holder died and
//! asks a reconciler what happened; `purge` removes expired records in batches;
//! `issue`/`consume` are one-time tokens; with the cargo feature `redis`, a Redis
//! front sheds storms of identical requests. Each backend implements its seam,
//! [`idempotency::RecordStore`], in `backend/<backend>/idempotency.rs`. See
//! `docs/idempotency.md`.
//!
//! ## `testing`: your own graph, property-tested
//!
//! Cargo feature `testing`: proptest strategies for random request sequences full of
//! duplicates, a reference model of the outcome table, and a checker that runs a
//! sequence through an engine and the model side by side.
//!
//! ## [`flow`](mod@flow): multi-step flows, with compensation
//!
//! [`flow!`](macro@flow) declares a flow's kind, definition version and steps in order, each local,
//! keyed or unsafe and with or without a compensation, and checks the declaration at
//! compile time (no empty flow, no keyed or unsafe step with an effect before the pivot
//! left without a compensation). A [`Definition`] attaches the actions; [`Flows`] starts
//! a flow (claimed under an owner token, replayed once finished), runs local steps in
//! their checkpoint transaction and records keyed and unsafe calls as started before and
//! finished after, compensates the completed steps in reverse when one fails, parks what
//! needs a person, and resumes flows whose runner died with its recovery job
//! (`recover`, `recovery_loop`; `SKIP LOCKED` where the backend has it). Each backend
//! implements its seam, [`flow::FlowStore`], in `backend/<backend>/flows.rs`. See
//! `docs/flows.md`.
//!
//! ## Events on the graph
//!
//! An edge of [`state_machine!`] may name the domain event it emits (`Created + Pay =>
//! Paid emits OrderPaid`); a transition along it writes an outbox row in the same atomic
//! unit as the update and the history row (inside the caller's transaction too), and a
//! replay or a refusal writes none. [`outbox::Relay`] publishes the rows through an
//! [`outbox::Sink`] (NATS JetStream, RabbitMQ and Kafka behind the `nats`, `rabbitmq`
//! and `kafka` features), per entity in version order, under fenced leases, with retries, a dead
//! state and purge; [`outbox::Inbox`] dedupes a consumer whose work is not a transition.
//! Each backend implements its seam, [`outbox::OutboxStore`], in
//! `backend/<backend>/outbox.rs`. See `docs/outbox.md`.
//!
//! ## [`timer`]: timers on the graph
//!
//! A state of [`state_machine!`] may carry timers (`Created after 30 min => Cancel`):
//! the unit that enters the state (a move, or the create) writes each timer's row, due
//! after its delay by the database's clock; [`Timers`], a job on any number of nodes,
//! claims due timers under fenced leases (`SKIP LOCKED` where the backend has it) and
//! fires each through the engine with the reference `timer:{state}:{version}`, applied
//! only while the entity is still at that version: `Applied` once, `Replayed` after, moot
//! once the entity has moved on, never a late move of an order that moved first.
//! [`Engine::schedule`] schedules timers by hand, and `cancel_timer` cancels them. The
//! seam, [`TimerStore`], lives in [`store::timers`]; each backend implements it in
//! `backend/<backend>/timers.rs`. See `docs/timers.md`.
//!
//! ## `http`: the `Idempotency-Key` header
//!
//! Cargo feature `http`: `http::IdempotencyLayer`, a tower layer (it works under axum)
//! over [`Records`]. A request with a key is claimed once; its response is kept and
//! replayed to every repeat, marked `Idempotent-Replayed: true`; the same key with
//! another request is 422, a key still in flight 409 with `Retry-After`, a missing or
//! malformed key 400, records out of reach 503, all as `application/problem+json`.
//! Routes say whether a key is required and which responses are kept, and a handler can
//! keep its response in its own transaction (`complete_in`). See `docs/http.md`.
//!
//! ## Metrics and spans
//!
//! Every transition, claim, flow, flow step and recovery round is a `tracing` span that
//! carries its outcome. Cargo feature `metrics`: counters, gauges and histograms through
//! the `metrics` facade (no exporter installed; the application picks one), with
//! bounded labels only (machine, event, outcome, backend, scope, flow kind), never an id.
//! The names and labels are in `docs/observability.md`.
//!
//! ## Coalescing
//!
//! While one statement of a kind is in flight, the calls of that kind that arrive queue
//! for the next, which carries them all: transitions' writes (one write unit, one
//! commit; every backend, a Galera node when asked), transitions' reads (PostgreSQL and
//! MySQL/MariaDB), idempotency claims (every backend), holders' finishes of idempotency
//! records (every backend) and flow starts (every backend). Each call is
//! answered as if it had gone alone; a lone call goes at once. There is no timer: a
//! queue forms only while a statement is in flight. The turn, the queue and every kind
//! of batch (writes, reads, claims, finishes and starts) live in `src/coalesce/`.
//!
//! # Errors
//!
//! One [`Error`] enum, named for what the caller does next. A repeat is not an error:
//! it is `Ok(`[`Outcome::Replayed`]`)`. [`Error::is_retryable`] covers contention,
//! serialization failures, deadlocks, lock timeouts, busy databases, lost connections
//! and in-doubt writes ([`Error::InDoubt`]): re-sending the same request is safe. Every
//! call on the engine's own connections is answered within
//! [`EngineConfig::deadline`]: past it, [`Error::Unavailable`] (no connection was to be
//! had) or [`Error::DeadlineExceeded`], both retryable. Your own statements' `sqlx::Error`
//! converts with `?`, classified the same way.
//! [`Error::is_conflict`] covers [`Error::RefConflict`] and [`Error::PayloadMismatch`].
//!
//! # Tables
//!
//! The entity table is the application's, named in [`Tables`]: it needs `id`, `status`
//! and `version` columns and orderly leaves the rest alone. orderly's own tables live in
//! a namespace (the schema `orderly` on PostgreSQL, the prefix `orderly_` on MariaDB and
//! SQLite; [`Tables::in_namespace`]), created by its migrations, which record themselves
//! there: the history `transitions(order_id, seq, from_status, to_status, event, ref_id,
//! payload_hash, payload, write_id, actor, reason, created_at)` with `PRIMARY KEY
//! (order_id, seq)` and `UNIQUE (order_id, event, ref_id)`, and the tables of the other
//! layers. [`Engine::create_tables`] makes the entity table where none exists (a demo, a
//! test) or a history table under a name of yours ([`Tables::with_history`]).
#![warn(missing_docs)]
// On docs.rs (and in CI's docs.rs-style build), each item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

extern crate self as orderly;

/// Every Rust fragment of the README and of the guides under `docs/`, compiled as doc
/// tests (`cargo test --all-features --doc`): the features they use are all on.
#[cfg(all(
    doctest,
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "testing",
    feature = "nats",
    feature = "cli",
    feature = "http"
))]
mod guides {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[doc = include_str!("../docs/admin.md")]
    struct Admin;
    #[doc = include_str!("../docs/backends.md")]
    struct Backends;
    #[doc = include_str!("../docs/flows.md")]
    struct Flows;
    #[doc = include_str!("../docs/http.md")]
    struct Http;
    #[doc = include_str!("../docs/idempotency.md")]
    struct Idempotency;
    #[doc = include_str!("../docs/observability.md")]
    struct Observability;
    #[doc = include_str!("../docs/outbox.md")]
    struct Outbox;
    #[doc = include_str!("../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../docs/timers.md")]
    struct Timers;
}

#[cfg(feature = "admin")]
pub mod admin;
pub mod backend;
#[cfg(feature = "cli")]
pub mod cli;
mod coalesce;
pub mod engine;
pub mod error;
pub mod flow;
#[cfg(feature = "http")]
pub mod http;
pub mod idempotency;
pub mod machine;
mod observe;
pub mod outbox;
pub mod store;
mod support;
#[cfg(feature = "testing")]
pub mod testing;
pub mod timer;

#[cfg(feature = "mysql")]
pub use backend::mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use backend::postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use backend::sqlite::SqliteStore;
pub use engine::{
    CoalescedWrites, CreateRequest, DEFAULT_MAX_EVENT_BODY, Engine, EngineConfig, Halt, Judged,
    Order, Outcome, ReadFirst, Record, RuleConn, RuleFuture, Rules, RulesOf, TransitionRequest,
};
pub use error::{Error, Result, TokenRejection};
pub use flow::{Definition, FlowConfig, FlowOutcome, Flows, Resume, Started, StepError};
pub use idempotency::{
    Claim, Claimed, CoalescedClaims, Done, Failure, Ran, Reconciled, Records, Recovered,
    ScopeConfig, Stored, Stuck,
};
#[cfg(feature = "redis")]
pub use idempotency::{FrontConfig, RedisFront};
pub use machine::{StateMachine, StateTimer, Transition};
pub use store::{Schema, Store, Tables, WriteTurn};
pub use support::trace::TraceContext;
pub use timer::{TimerStore, Timers, TimersConfig};

#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use strum;
}
