//! The backends: one folder per SQL dialect, each behind its cargo feature, implementing
//! every layer's seam from above ([`Store`](crate::Store) for transitions,
//! [`RecordStore`](crate::idempotency::RecordStore) for idempotency records,
//! [`FlowStore`](crate::flow::FlowStore) for flows,
//! [`OutboxStore`](crate::outbox::OutboxStore) for the outbox).
//!
//! Each dialect's folder holds its store type, its connection handling and its
//! migrations' entry point in `mod.rs`, and its SQL, one file per layer it serves
//! (`transitions.rs`, `idempotency.rs`, `flows.rs`, `outbox.rs`), with the statements of
//! multi-statement write units in `units.rs`. What the dialects share is beside them:
//!
//! | file | what it holds |
//! |---|---|
//! | `sql.rs` | statements written once with numbered parameters, each dialect's placeholders |
//! | `records_sql.rs`, `flow_sql.rs`, `outbox_sql.rs` | the statements of the idempotency, flow and outbox layers whose values every dialect binds alike |
//! | `errors.rs` | the error classes every driver shares |
//! | `classify.rs` | a user's own driver error classified by its backend |
//! | `units.rs` | how a write unit ends, and which requests of a batch go together |
//! | `stepwise.rs` | the write units of the dialects that write a transition statement by statement (MySQL/MariaDB, SQLite) |
//! | `batched.rs` | batched reads of requests' history rows |
//! | `migrations.rs` | orderly's migrations in a table of their own |
//! | `rows.rs` | the judge's read as one decoded row |
//! | `names.rs` | orderly's own tables in a namespace, and the statements built once per namespace |
//! | `tables.rs` | the configured tables' names quoted, their probes and added columns |
//!
//! Nothing below this folder imports it: the layers reach a backend only through their
//! seam traits. See `docs/backends.md`, "Adding a backend".

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod audit_sql;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod batched;
mod classify;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod errors;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod flow_sql;
#[cfg(feature = "postgres")]
pub(crate) mod kept;
#[cfg(all(
    feature = "admin",
    any(feature = "sqlite", feature = "postgres", feature = "mysql")
))]
pub(crate) mod lookup_sql;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod migrations;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod names;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod outbox_sql;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod records_sql;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod rows;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod rule_conn;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) mod stepwise;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod tables;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod timer_sql;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) mod units;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use batched::{BATCH_READ_MAX, BatchReads, in_place};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) use units::distinct_entities;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use units::{Tried, tried};

/// Whether the writes after a read in a timer batch can go in the store's few batch
/// statements: more than one, at most 4,096 (MySQL/MariaDB's statement binds 11 values a
/// row, 65,535 at most), of distinct entities, none emitting an event.
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) fn one_statement_batch(applies: &[crate::store::Apply<'_>]) -> bool {
    let mut ids: Vec<i64> = applies.iter().map(|a| a.key.order_id).collect();
    ids.sort_unstable();
    ids.dedup();
    (2..=4096).contains(&applies.len())
        && ids.len() == applies.len()
        && applies.iter().all(|a| a.emits.is_none())
}
