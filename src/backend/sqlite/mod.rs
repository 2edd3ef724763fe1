//! SQLite, the embedded default: WAL, `BEGIN IMMEDIATE` for writes, a busy timeout.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::backend::migrations;
use crate::backend::names::{Names, Style};
use crate::error::Error;
use crate::store::Schema;
use crate::store::{DEFAULT_NAMESPACE, Tables, db_error, validate_namespace};
use sqlx::migrate::Migrator;

mod audit;
mod batch;
pub(crate) mod errors;
mod flows;
mod idempotency;
#[cfg(feature = "testing")]
mod kit;
#[cfg(feature = "admin")]
mod lookup;
mod outbox;
mod rule_conn;
mod schema;
mod timers;
mod transitions;
mod units;
mod writer;

/// Applies orderly's migrations (`migrations/sqlite/`) in the default namespace, the
/// prefix `orderly_`: [`migrate_in`] with [`DEFAULT_NAMESPACE`].
pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    migrate_in(pool, DEFAULT_NAMESPACE).await
}

/// Applies orderly's migrations with the table prefix `namespace` and `_` (see
/// [`Tables::in_namespace`]), recorded in its table `migrations`: they create and alter
/// only orderly's own tables, so they and the application's run in either order. A
/// database an earlier orderly migrated has its tables renamed into the namespace first
/// (`docs/backends.md`, "Upgrading"). Idempotent.
pub async fn migrate_in(pool: &SqlitePool, namespace: &str) -> Result<(), Error> {
    let names = Names::new(&validate_namespace(namespace)?, Style::Prefix);
    // SQLite has no advisory lock (sqlx's migration lock does nothing there): calls in
    // one process take turns.
    static MIGRATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = MIGRATING.lock().await;
    let mut conn = pool.acquire().await.map_err(db_error::<SqliteStore>)?;
    let legacy = migrations::legacy(sqlx::migrate!("migrations/legacy/sqlite"));
    if migrations::has_legacy::<sqlx::Sqlite>(&mut conn, &DIALECT, &legacy).await? {
        legacy.run(&mut *conn).await?;
        migrations::move_legacy::<sqlx::Sqlite>(&mut conn, &DIALECT, &names).await?;
    }
    migrations::in_namespace(migrator_files(), &names)
        .run(&mut *conn)
        .await?;
    Ok(())
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
    sqlx::migrate!("migrations/sqlite")
}

/// How SQLite finds and moves an earlier orderly's tables: renamed with the prefix, and
/// their indexes, whose names are the whole database's, made again under the prefix.
const DIALECT: migrations::Dialect = migrations::Dialect {
    exists: |table| {
        format!("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
    },
    shared_exists: "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    moves: |from, names, to| {
        let to = names.in_namespace(to);
        if from == to {
            Vec::new()
        } else {
            vec![format!("ALTER TABLE {from} RENAME TO {to}")]
        }
    },
    old_indexes: &[
        "idempotency_records_stuck",
        "idempotency_records_expiry",
        "one_time_tokens_expiry",
        "flows_due",
        "outbox_due",
        "outbox_entity_status",
        "inbox_received",
        "timers_due",
        "timers_entity",
    ],
};

/// Connection options orderly expects: create the file if missing, WAL journal,
/// `synchronous = NORMAL` (durable at checkpoints in WAL mode), a 5 s busy timeout.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions, Error> {
    let options = SqliteConnectOptions::from_str(url).map_err(|e| Error::Database {
        source: e,
        retryable: false,
    })?;
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(BUSY_TIMEOUT))
}

/// The busy timeout of [`connect_options`], and how long a writer waits for its turn in
/// the process ([`Store::write_turn`](crate::Store::write_turn)).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The tables it drives, as configured.
    tables: Arc<Tables>,
    /// orderly's tables in the configured namespace.
    names: Arc<Names>,
    transitions: Arc<transitions::Sql>,
    /// The writers' turns of this store and its clones (one writer at a time).
    writers: Arc<tokio::sync::Mutex<()>>,
    /// The thread that writes the engine's own apply-first units, started at the first
    /// (`None` inside: the database cannot take a second connection).
    writer: Arc<tokio::sync::OnceCell<Option<writer::Writer>>>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` with [`connect_options`], a pool
    /// of 8 connections, and applies orderly's migrations in `tables`' namespace
    /// ([`migrate_in`]). The entity table is the application's: its migrations create it.
    pub async fn connect(url: &str, tables: Tables) -> Result<Self, Error> {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            // The database is a file in this process: a ping before each use, a call to
            // the connection's worker thread, would test nothing a statement does not.
            .test_before_acquire(false)
            .connect_with(connect_options(url)?)
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
        migrations::create_demo::<sqlx::Sqlite>(&mut conn, store.create_tables_sql())
            .await
            .map_err(db_error::<Self>)?;
        Ok(store)
    }

    /// A store over an existing pool and `tables`. Build the pool with
    /// [`connect_options`] and run [`migrate_in`] for their namespace first ([`migrate`]
    /// for the default).
    pub fn new(pool: SqlitePool, tables: Tables) -> Self {
        let names = Names::new(tables.namespace(), Style::Prefix);
        SqliteStore {
            pool,
            transitions: Arc::new(transitions::Sql::new(&tables, &names)),
            tables: Arc::new(tables),
            names: Arc::new(names),
            writers: Arc::default(),
            writer: Arc::default(),
        }
    }

    /// orderly's tables in this store's namespace.
    pub(crate) fn names(&self) -> &Names {
        &self.names
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Whether the engine's own write units go through a connection of the store's own
    /// thread rather than the pool (`None` until the first unit). They do on a database
    /// file opened with the default VFS, neither read-only nor immutable; a database in
    /// memory or in exclusive locking mode takes no second connection, and its units go
    /// through the pool. One more connection to the file than the pool's, shared by the
    /// store's clones. `false` again if the writer's connection failed to end a
    /// transaction (it is then closed).
    pub fn writes_on_own_connection(&self) -> Option<bool> {
        self.writer
            .get()
            .map(|w| w.as_ref().is_some_and(writer::Writer::alive))
    }

    /// The writer, started on the database `conn` has open at the first call.
    async fn writer(
        &self,
        conn: &mut sqlx::sqlite::SqliteConnection,
    ) -> Result<Option<&writer::Writer>, sqlx::Error> {
        let units = &self.transitions.units;
        let writer = self
            .writer
            .get_or_try_init(|| async {
                if !writer::plain_options(&self.pool.connect_options()) {
                    return Ok(None);
                }
                writer::Writer::start(
                    conn,
                    vec![units.update.get(1), units.record.get(1), units.emit.get(1)],
                )
                .await
            })
            .await?;
        Ok(writer.as_ref().filter(|w| w.alive()))
    }
}
