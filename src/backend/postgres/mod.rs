//! PostgreSQL (and engines that speak its protocol: CockroachDB, YugabyteDB, Citus).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::backend::migrations;
use crate::backend::names::{Names, Style};
use crate::error::Error;
use crate::store::Schema;
use crate::store::{DEFAULT_NAMESPACE, Tables, db_error, validate_namespace};
use sqlx::migrate::{Migrate, Migrator};

mod audit;
pub(crate) mod errors;
mod flows;
mod idempotency;
#[cfg(feature = "admin")]
mod lookup;
mod outbox;
mod rule_conn;
mod schema;
mod timers;
mod transition_sql;
mod transitions;
mod units;

/// The database clock, in milliseconds since the epoch: a statement's `WITH now AS {NOW}`.
const NOW: &str = "(SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms)";

/// That clock as a value, in an `UPDATE` of a table keyed by parameters. Not `FROM now`:
/// joined in an update, `now` made PostgreSQL choose a sequential scan for a prepared
/// statement's generic plan made while the table looked empty (just created or
/// truncated), and the connection kept that plan while the table grew, so every update
/// read the whole table.
const MS: &str = "(SELECT ms FROM now)";

/// Applies orderly's migrations (`migrations/postgres/`) in the default namespace, the
/// schema `orderly`: [`migrate_in`] with [`DEFAULT_NAMESPACE`].
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    migrate_in(pool, DEFAULT_NAMESPACE).await
}

/// Applies orderly's migrations in the schema `namespace` (see
/// [`Tables::in_namespace`]), creating it, and records them there (table `migrations`):
/// they create and alter only orderly's own tables, so they and the application's run
/// in either order. A database an earlier orderly migrated has its tables moved into the
/// schema first (`docs/backends.md`, "Upgrading"). Idempotent; concurrent calls take
/// turns on an advisory lock.
pub async fn migrate_in(pool: &PgPool, namespace: &str) -> Result<(), Error> {
    let names = Names::new(&validate_namespace(namespace)?, Style::Schema);
    let mut conn = pool.acquire().await.map_err(db_error::<PgStore>)?;
    // The session's advisory lock goes with the connection, whatever fails below.
    conn.close_on_drop();
    conn.lock().await?;
    let legacy = migrations::legacy(sqlx::migrate!("migrations/legacy/postgres"));
    if migrations::has_legacy::<sqlx::Postgres>(&mut conn, &DIALECT, &legacy).await? {
        legacy.run(&mut *conn).await?;
        migrations::move_legacy::<sqlx::Postgres>(&mut conn, &DIALECT, &names).await?;
    }
    migrations::in_namespace(migrator_files(), &names)
        .run(&mut *conn)
        .await?;
    conn.unlock().await?;
    Ok(())
}

/// orderly's migrations in the default namespace, for an application that runs them
/// itself, for example up to a version ([`Migrator::run_to`]); [`migrator_in`] for
/// another. Only [`migrate_in`] moves an earlier orderly's tables: on a database an
/// earlier orderly migrated, call it once first.
pub fn migrator() -> Migrator {
    migrations::in_namespace(
        migrator_files(),
        &Names::new(DEFAULT_NAMESPACE, Style::Schema),
    )
}

/// [`migrator`] in the schema `namespace`; [`Error::InvalidInput`] if it is none.
pub fn migrator_in(namespace: &str) -> Result<Migrator, Error> {
    let names = Names::new(&validate_namespace(namespace)?, Style::Schema);
    Ok(migrations::in_namespace(migrator_files(), &names))
}

fn migrator_files() -> Migrator {
    sqlx::migrate!("migrations/postgres")
}

/// How PostgreSQL finds and moves an earlier orderly's tables: where unqualified names
/// resolve (the search path), into the schema.
const DIALECT: migrations::Dialect = migrations::Dialect {
    exists: |table| format!("SELECT 1 WHERE to_regclass('{table}') IS NOT NULL"),
    shared_exists: "SELECT 1 WHERE to_regclass('_sqlx_migrations') IS NOT NULL",
    moves: |from, names, to| {
        let ns = &names.namespace;
        let mut moves = vec![
            format!("CREATE SCHEMA IF NOT EXISTS \"{ns}\""),
            format!("ALTER TABLE {from} SET SCHEMA \"{ns}\""),
        ];
        if from != to {
            moves.push(format!("ALTER TABLE \"{ns}\".{from} RENAME TO {to}"));
        }
        moves
    },
    old_indexes: &[],
};

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The tables it drives, as configured.
    tables: Arc<Tables>,
    /// orderly's tables in the configured namespace.
    names: Arc<Names>,
    transitions: Arc<transition_sql::Sql>,
    /// The connection a lone caller's units go on between them, unless turned off
    /// ([`keep_connection`](Self::keep_connection)).
    kept: Option<crate::backend::kept::Kept<sqlx::Postgres>>,
}

impl PgStore {
    /// Connects to `url` with a pool of 16 connections and applies orderly's migrations
    /// in `tables`' namespace ([`migrate_in`]). The entity table is the application's:
    /// its migrations create it.
    pub async fn connect(url: &str, tables: Tables) -> Result<Self, Error> {
        let options = PgConnectOptions::from_str(url).map_err(db_error::<Self>)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(db_error::<Self>)?;
        migrate_in(&pool, tables.namespace()).await?;
        Ok(Self::new(pool, tables))
    }

    /// The quick start's store: [`connect`](Self::connect) with [`Tables::demo`], and the
    /// demo's entity table created where it does not exist.
    pub async fn demo(url: &str) -> Result<Self, Error> {
        let store = Self::connect(url, Tables::demo()).await?;
        let mut conn = store.pool.acquire().await.map_err(db_error::<Self>)?;
        migrations::create_demo::<sqlx::Postgres>(&mut conn, store.create_tables_sql())
            .await
            .map_err(db_error::<Self>)?;
        Ok(store)
    }

    /// A store over an existing pool and `tables`; run [`migrate_in`] for their
    /// namespace first ([`migrate`] for the default).
    pub fn new(pool: PgPool, tables: Tables) -> Self {
        let names = Names::new(tables.namespace(), Style::Schema);
        PgStore {
            pool,
            transitions: Arc::new(transition_sql::Sql::new(&tables, &names)),
            tables: Arc::new(tables),
            names: Arc::new(names),
            kept: Some(Default::default()),
        }
    }

    /// Whether the store keeps a connection out of the pool between its conversations (the
    /// transition layer's apply-first units, a lone caller's and a batch's; reads; the
    /// idempotency records' and flows' statements and transactions; the outbox's and
    /// timers'); on by default. Taking a connection from the pool and giving it back
    /// costs a round trip to the server each time (sqlx tests every connection it takes
    /// back). The kept connection is only ever one the pool held, tested as the pool
    /// tests the connections it hands out once it sat kept longer than 1 ms (back to
    /// back conversations pay no test). It goes back to the pool after a conversation that finds none idle at the
    /// pool's size limit, 10 to 20 ms after the last one, and when the pool is closed; it
    /// is closed, never given back, when it is lost, when its conversation is dropped,
    /// and when an apply-first unit fails on it. While
    /// kept it skips the pool's `before_acquire` and `after_release` hooks and its
    /// `max_lifetime`: turn this off if you rely on them. Off, every conversation takes a
    /// connection from the pool.
    pub fn keep_connection(mut self, keep: bool) -> Self {
        self.kept = keep.then(Default::default);
        self
    }

    /// orderly's tables in this store's namespace.
    pub(crate) fn names(&self) -> &Names {
        &self.names
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Retryable: 40001 serialization failure, 40P01 deadlock, 55P03 lock timeout.
/// Connection lost (the write may have committed, so the engine re-reads the request
/// before answering): class 08 (connection exception), 57P01 `admin_shutdown` (a session
/// ended by `pg_terminate_backend` or a fast shutdown), 57P02 `crash_shutdown`, 57P03
/// `cannot_connect_now`, and 40003 `statement_completion_unknown` (the server lost track
/// of whether the statement finished), and 25006 `read_only_sql_transaction` (the
/// connection is on a standby, where an endpoint still routing to a former primary
/// sent it; the connection is discarded); besides the I/O errors every backend shares.
/// A connection the server would not open now: the database not accepting connections
/// (55000, `ALLOW_CONNECTIONS false`), starting up or shutting down (57P03, 57P01,
/// 57P02), too many connections (53300), a connection failure (class 08).
pub(crate) fn refused(err: sqlx::Error) -> sqlx::Error {
    crate::backend::errors::refused(err, |db| {
        db.code().is_some_and(|code| {
            matches!(&*code, "55000" | "57P01" | "57P02" | "57P03" | "53300")
                || code.starts_with("08")
        })
    })
}
