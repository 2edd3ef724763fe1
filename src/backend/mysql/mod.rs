//! MySQL and MariaDB (and engines that speak their protocol: TiDB, Galera).

use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};

use crate::backend::migrations;
use crate::backend::names::{Names, Style};
use crate::error::Error;
use crate::store::Schema;
use crate::store::{DEFAULT_NAMESPACE, Store, Tables, db_error, validate_namespace};
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
pub(crate) mod text;
mod timers;
mod transition_sql;
mod transitions;
mod units;

/// Applies orderly's migrations (`migrations/mysql/`) in the default namespace, the
/// prefix `orderly_`: [`migrate_in`] with [`DEFAULT_NAMESPACE`].
pub async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
    migrate_in(pool, DEFAULT_NAMESPACE).await
}

/// Applies orderly's migrations with the table prefix `namespace` and `_` (see
/// [`Tables::in_namespace`]), recorded in its table `migrations`: they create and alter
/// only orderly's own tables, so they and the application's run in either order. A
/// database an earlier orderly migrated has its tables renamed into the namespace first
/// (`docs/backends.md`, "Upgrading"). Idempotent; concurrent calls take turns on a named
/// lock.
pub async fn migrate_in(pool: &MySqlPool, namespace: &str) -> Result<(), Error> {
    let names = Names::new(&validate_namespace(namespace)?, Style::Prefix);
    let mut conn = pool.acquire().await.map_err(db_error::<MySqlStore>)?;
    // The session's named lock goes with the connection, whatever fails below.
    conn.close_on_drop();
    let locked = lock_migrations(&mut conn).await?;
    let legacy = migrations::legacy(sqlx::migrate!("migrations/legacy/mysql"));
    if migrations::has_legacy::<sqlx::MySql>(&mut conn, &DIALECT, &legacy).await? {
        legacy.run(&mut *conn).await?;
        migrations::move_legacy::<sqlx::MySql>(&mut conn, &DIALECT, &names).await?;
    }
    migrations::in_namespace(migrator_files(), &names)
        .run(&mut *conn)
        .await?;
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

/// orderly's migrations in the default namespace, for an application that runs them
/// itself, for example up to a version ([`Migrator::run_to`]); [`migrator_in`] for
/// another. Only [`migrate_in`] moves an earlier orderly's tables: on a database an
/// earlier orderly migrated, call it once first.
pub fn migrator() -> Migrator {
    migrations::in_namespace(
        migrator_files(),
        &Names::new(DEFAULT_NAMESPACE, Style::Prefix),
    )
}

/// [`migrator`] with the prefix `namespace`; [`Error::InvalidInput`] if it is none.
pub fn migrator_in(namespace: &str) -> Result<Migrator, Error> {
    let names = Names::new(&validate_namespace(namespace)?, Style::Prefix);
    Ok(migrations::in_namespace(migrator_files(), &names))
}

fn migrator_files() -> Migrator {
    sqlx::migrate!("migrations/mysql")
}

/// How MySQL/MariaDB finds and moves an earlier orderly's tables: in the connection's
/// database, renamed with the prefix.
const DIALECT: migrations::Dialect = migrations::Dialect {
    exists: |table| {
        format!(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '{table}'"
        )
    },
    shared_exists: "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'",
    moves: |from, names, to| {
        let to = names.in_namespace(to);
        if from == to {
            Vec::new()
        } else {
            vec![format!("RENAME TABLE {from} TO {to}")]
        }
    },
    old_indexes: &[],
};

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
    /// orderly's tables in the configured namespace.
    names: Arc<Names>,
    /// The transition layer's SQL, `[plain, causal]`; see [`MySqlStore::causal_reads`].
    transitions: Arc<[transition_sql::Sql; 2]>,
    /// Whether the server is a Galera node, once known.
    galera: Arc<OnceLock<bool>>,
    /// Whether the transition layer coalesces writes on a Galera node
    /// ([`coalesce_on_galera`](Self::coalesce_on_galera)).
    galera_units: bool,
}

impl MySqlStore {
    /// Connects to `url` with a pool of 16 connections and applies orderly's migrations
    /// in `tables`' namespace ([`migrate_in`]). The entity table is the application's:
    /// its migrations create it.
    pub async fn connect(url: &str, tables: Tables) -> Result<Self, Error> {
        let options = MySqlConnectOptions::from_str(url).map_err(db_error::<Self>)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(db_error::<Self>)?;
        migrate_in(&pool, tables.namespace()).await?;
        let store = Self::new(pool, tables);
        store.acquire().await.map_err(db_error::<Self>)?;
        Ok(store)
    }

    /// The quick start's store: [`connect`](Self::connect) with [`Tables::demo`], and the
    /// demo's entity table created where it does not exist.
    pub async fn demo(url: &str) -> Result<Self, Error> {
        let store = Self::connect(url, Tables::demo()).await?;
        let mut conn = store.pool.acquire().await.map_err(db_error::<Self>)?;
        migrations::create_demo::<sqlx::MySql>(&mut conn, store.create_tables_sql())
            .await
            .map_err(db_error::<Self>)?;
        Ok(store)
    }

    /// A store over an existing pool and `tables`; run [`migrate_in`] for their namespace
    /// first ([`migrate`] for the default).
    pub fn new(pool: MySqlPool, tables: Tables) -> Self {
        let names = Names::new(tables.namespace(), Style::Prefix);
        MySqlStore {
            pool,
            transitions: Arc::new(
                [false, true].map(|causal| transition_sql::Sql::new(&tables, &names, causal)),
            ),
            tables: Arc::new(tables),
            names: Arc::new(names),
            galera: Arc::default(),
            galera_units: false,
        }
    }

    /// orderly's tables in this store's namespace.
    pub(crate) fn names(&self) -> &Names {
        &self.names
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
