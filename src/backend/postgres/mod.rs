//! PostgreSQL (and engines that speak its protocol: CockroachDB, YugabyteDB, Citus).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::backend::migrations;
use crate::error::Error;
use crate::store::{Tables, db_error};
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

/// Applies orderly's migrations (`migrations/postgres/`), recorded in
/// [`MIGRATIONS_TABLE`](crate::store::MIGRATIONS_TABLE) beside the application's own
/// `_sqlx_migrations`, so the two may run in either order. Rows an earlier orderly left
/// in `_sqlx_migrations` are moved over first. Idempotent.
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    let mut conn = pool.acquire().await.map_err(db_error::<PgStore>)?;
    // The session's advisory lock goes with the connection, whatever fails below.
    conn.close_on_drop();
    let ours = migrator();
    conn.lock().await?;
    migrations::adopt::<sqlx::Postgres>(&mut conn, &ours, SHARED_MIGRATIONS_EXIST).await?;
    ours.run(&mut *conn).await?;
    conn.unlock().await?;
    Ok(())
}

/// orderly's migrations for this backend, recorded in
/// [`MIGRATIONS_TABLE`](crate::store::MIGRATIONS_TABLE): for an application that runs
/// them itself, for example up to a version ([`Migrator::run_to`]). Only [`migrate`]
/// moves an earlier orderly's rows out of `_sqlx_migrations`: on a database an earlier
/// orderly migrated, call [`migrate`] once first, or this migrator applies everything
/// again (and fails on the first column that exists).
pub fn migrator() -> Migrator {
    migrations::own_table(sqlx::migrate!("migrations/postgres"))
}

/// A row when the database has sqlx's default migrations table.
const SHARED_MIGRATIONS_EXIST: &str = "SELECT 1 WHERE to_regclass('_sqlx_migrations') IS NOT NULL";

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The tables it drives, as configured.
    tables: Arc<Tables>,
    transitions: Arc<transition_sql::Sql>,
}

impl PgStore {
    /// Connects to `url` with a pool of 16 connections and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = PgConnectOptions::from_str(url).map_err(db_error::<Self>)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(db_error::<Self>)?;
        migrate(&pool).await?;
        Ok(Self::new(pool))
    }

    /// A store over an existing pool and the default tables; run [`migrate`] first.
    pub fn new(pool: PgPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store over an existing pool and custom tables.
    pub fn with_tables(pool: PgPool, tables: Tables) -> Self {
        PgStore {
            pool,
            tables: Arc::new(tables.clone()),
            transitions: Arc::new(transition_sql::Sql::new(&tables)),
        }
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
