//! MySQL and MariaDB (and engines that speak their protocol: TiDB, Galera).

use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};

use crate::backend::migrations;
use crate::error::Error;
use crate::store::{Store, Tables, db_error};
use sqlx::migrate::Migrator;

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

/// Applies orderly's migrations (`migrations/mysql/`), recorded in
/// [`MIGRATIONS_TABLE`](crate::store::MIGRATIONS_TABLE) beside the application's own
/// `_sqlx_migrations`, so the two may run in either order. Rows an earlier orderly left
/// in `_sqlx_migrations` are moved over first. Idempotent.
pub async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
    let mut conn = pool.acquire().await.map_err(db_error::<MySqlStore>)?;
    // The session's named lock goes with the connection, whatever fails below.
    conn.close_on_drop();
    let locked = lock_migrations(&mut conn).await?;
    let ours = migrator();
    migrations::adopt::<sqlx::MySql>(&mut conn, &ours, SHARED_MIGRATIONS_EXIST).await?;
    ours.run(&mut *conn).await?;
    if locked {
        sqlx::query(RELEASE_MIGRATIONS)
            .execute(&mut *conn)
            .await
            .map_err(db_error::<MySqlStore>)?;
    }
    Ok(())
}

/// The named lock [`migrate`] holds: one per database, waited for at most 60 s.
const LOCK_MIGRATIONS: &str =
    "SELECT GET_LOCK(CONCAT('orderly_migrate.', SHA1(IFNULL(DATABASE(), ''))), 60)";
const RELEASE_MIGRATIONS: &str =
    "SELECT RELEASE_LOCK(CONCAT('orderly_migrate.', SHA1(IFNULL(DATABASE(), ''))))";

/// Takes [`LOCK_MIGRATIONS`]; whether it holds it. sqlx's own migration lock asks
/// `GET_LOCK(name, -1)`, which MariaDB answers `NULL` at once without locking, so two
/// nodes starting together would both apply a migration. A server without named locks
/// (error 1235 on Galera, or `NULL`) is migrated unlocked, as sqlx would.
async fn lock_migrations(conn: &mut MySqlConnection) -> Result<bool, Error> {
    match sqlx::query_scalar::<_, Option<i64>>(LOCK_MIGRATIONS)
        .fetch_one(&mut *conn)
        .await
    {
        Ok(Some(1)) => Ok(true),
        Ok(Some(_)) => Err(Error::Database {
            source: sqlx::Error::Protocol(
                "another process held orderly's migration lock for 60 s".into(),
            ),
            retryable: true,
        }),
        Ok(None) => Ok(false),
        Err(sqlx::Error::Database(e))
            if e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == 1235) =>
        {
            Ok(false)
        }
        Err(e) => Err(db_error::<MySqlStore>(e)),
    }
}

/// orderly's migrations for this backend, recorded in
/// [`MIGRATIONS_TABLE`](crate::store::MIGRATIONS_TABLE): for an application that runs
/// them itself, for example up to a version ([`Migrator::run_to`]). Only [`migrate`]
/// moves an earlier orderly's rows out of `_sqlx_migrations`: on a database an earlier
/// orderly migrated, call [`migrate`] once first, or this migrator applies everything
/// again (and fails on the first column that exists).
pub fn migrator() -> Migrator {
    migrations::own_table(sqlx::migrate!("migrations/mysql"))
}

/// A row when the database has sqlx's default migrations table.
const SHARED_MIGRATIONS_EXIST: &str = "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'";

/// The MySQL/MariaDB store.
///
/// Its apply-first update returns the new version through `LAST_INSERT_ID(expr)`, so after
/// a transition a pooled connection's `LAST_INSERT_ID()` holds that version until the next
/// insert with an auto-increment key. Read `LAST_INSERT_ID()` only on the connection and
/// right after the insert it is meant for, as MySQL advises anyway.
///
/// On MariaDB Galera (a server with `wsrep_on`), every read the engine judges by outside
/// a transaction, and [`get`](crate::Engine::get) and [`history`](crate::Engine::history),
/// is causal: it runs as `SET STATEMENT wsrep_sync_wait = 1 FOR SELECT …`, so it waits
/// until the node has applied every write set the cluster certified before it, and a
/// request acknowledged on one node is a replay on every other. Inside a transaction
/// Galera does not wait (the prefix changes nothing there): a guarded request's unit
/// waits before it begins; a coalesced unit's reads may be behind, and its writes are
/// then refused at certification (1213, retried). The store finds out on the first connection
/// it borrows from its pool ([`connect`](Self::connect) asks at once); a cross-node race
/// that Galera's certification settles surfaces as error 1213 at `COMMIT`, which is
/// retried and judged afresh.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// The tables it drives, as configured.
    tables: Arc<Tables>,
    /// The transition layer's SQL, `[plain, causal]`; see [`MySqlStore::causal_reads`].
    transitions: Arc<[transition_sql::Sql; 2]>,
    /// Whether the server is a Galera node, once known.
    galera: Arc<OnceLock<bool>>,
    /// Whether the transition layer coalesces writes on a Galera node
    /// ([`coalesce_on_galera`](Self::coalesce_on_galera)).
    galera_units: bool,
}

impl MySqlStore {
    /// Connects to `url` with a pool of 16 connections and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = MySqlConnectOptions::from_str(url).map_err(db_error::<Self>)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(db_error::<Self>)?;
        migrate(&pool).await?;
        let store = Self::new(pool);
        store.acquire().await.map_err(db_error::<Self>)?;
        Ok(store)
    }

    /// A store over an existing pool and the default tables; run [`migrate`] first.
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store over an existing pool and custom tables.
    pub fn with_tables(pool: MySqlPool, tables: Tables) -> Self {
        MySqlStore {
            pool,
            tables: Arc::new(tables.clone()),
            transitions: Arc::new(
                [false, true].map(|causal| transition_sql::Sql::new(&tables, causal)),
            ),
            galera: Arc::default(),
            galera_units: false,
        }
    }

    /// Coalesces the transition layer's writes on a Galera node too (off by default; on
    /// a single server they always are). Each unit's writes then stay inside their
    /// transaction (docs/design.md, "Why coalesce writes"), and the Galera suite's
    /// `coalesced_units_across_nodes_leave_no_gap_in_a_history` holds. Off by default
    /// because, with units on for every test, 2 of 178 Galera suite runs published events
    /// twice (a relay's round failed after publishing, which units somehow make more
    /// likely; docs/backends.md).
    pub fn coalesce_on_galera(mut self) -> Self {
        self.galera_units = true;
        self
    }

    /// Whether a unit of several requests may be written now: the server is known, and
    /// is one server or a Galera node with [`coalesce_on_galera`](Self::coalesce_on_galera).
    pub(super) fn units_allowed(&self) -> bool {
        match self.causal_reads() {
            Some(galera) => !galera || self.galera_units,
            None => false,
        }
    }

    /// Whether this store's reads are causal: `Some(true)` on a Galera node, `None` until
    /// the store has borrowed its first connection.
    pub fn causal_reads(&self) -> Option<bool> {
        self.galera.get().copied()
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Finds out, once, whether the server is a Galera node.
    async fn detect_galera(&self, conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
        if self.galera.get().is_none() {
            // `wsrep_on` exists on MariaDB only; MySQL answers no row.
            let wsrep: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
                .fetch_optional(conn)
                .await?;
            let on = wsrep.is_some_and(|(_, value)| value.eq_ignore_ascii_case("ON"));
            // Concurrent first borrowers find the same answer; the first one sets it.
            let _ = self.galera.set(on);
        }
        Ok(())
    }
}

/// Retryable: 1213 deadlock (also Galera's certification failure), 1205 lock wait
/// timeout, 1047 (a Galera node not in the primary component). Connection lost (the
/// write may have committed, so the engine re-reads the request before answering): 1927
/// connection killed, 1053 server shutdown, 1152 aborted connection, 1158–1161 network
/// read/write errors, 2006 server gone away, 2013 connection lost during a query;
/// besides the I/O errors every backend shares (sqlx reports a socket that a `KILL`
/// closed as an I/O error).
/// A connection the server would not open now: too many connections (1040, 1203), the
/// server shutting down (1053), a Galera node not ready (1047), a host blocked after
/// failed connects (1129).
pub(crate) fn refused(err: sqlx::Error) -> sqlx::Error {
    crate::backend::errors::refused(err, |db| {
        db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| matches!(e.number(), 1040 | 1203 | 1053 | 1047 | 1129))
    })
}
