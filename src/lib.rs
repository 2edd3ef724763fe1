#![doc = include_str!("../README.md")]
//!
//! # Concepts
//!
//! - **Machine** ([`machine`]): a pure graph. [`StateMachine`] names the state and event
//!   types, the initial and terminal states and a `const` table of [`Transition`]s;
//!   [`state_machine!`] writes all of it and checks the graph at compile time. No I/O.
//! - **Engine** ([`engine`]): the algorithm, once for every backend. Validate input →
//!   read the entity, the request's history row and the event's latest reference in one
//!   statement → judge by the outcome table → conditional update + history insert in one
//!   local transaction → on a lost race, read afresh and judge again, at most
//!   [`EngineConfig::max_attempts`] times.
//! - **Store** ([`store`]): one module per backend behind a cargo feature, supplying SQL
//!   and error classification through the [`Store`] trait, with its own migrations
//!   (`migrations/<backend>/`, embedded with `sqlx::migrate!`).
//! - **Testing** (`testing`, cargo feature `testing`): proptest strategies, a reference
//!   model and a checker for your own graphs.
//!
//! # Errors
//!
//! One [`Error`] enum, named for what the caller does next. A repeat is not an error:
//! it is `Ok(`[`Outcome::Replayed`]`)`. [`Error::is_retryable`] covers contention,
//! serialization failures, deadlocks, lock timeouts and busy databases;
//! [`Error::is_conflict`] covers [`Error::RefConflict`] and [`Error::PayloadMismatch`].
//!
//! # Tables
//!
//! The migrations create `orders(id, status, version, created_at)` and
//! `order_transitions(order_id, seq, from_status, to_status, event, ref_id, payload_hash,
//! payload, created_at)` with `PRIMARY KEY (order_id, seq)` and
//! `UNIQUE (order_id, event, ref_id)`. [`Tables`] points the engine at an existing entity
//! table of yours: it needs `id`, `status` and `version` columns and leaves the rest alone.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

extern crate self as orderly;

pub mod engine;
pub mod error;
pub mod machine;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use engine::{Engine, EngineConfig, Order, Outcome, ReadFirst, Record, TransitionRequest};
pub use error::{Error, Result};
pub use machine::{StateMachine, Transition};
#[cfg(feature = "mysql")]
pub use store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use store::sqlite::SqliteStore;
pub use store::{Store, Tables};

#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use strum;
}
