//! SQLite, the embedded default: WAL, `BEGIN IMMEDIATE` for writes, a busy timeout.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::backend::migrations;
use crate::error::Error;
use crate::store::{Tables, db_error};
use sqlx::migrate::Migrator;

mod audit;
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

/// Applies orderly's migrations (`migrations/sqlite/`), recorded in
/// [`MIGRATIONS_TABLE`](crate::store::MIGRATIONS_TABLE) beside the application's own
/// `_sqlx_migrations`, so the two may run in either order. Rows an earlier orderly left
/// in `_sqlx_migrations` are moved over first. Idempotent.
pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    // SQLite has no advisory lock (sqlx's migration lock does nothing there): calls in
    // one process take turns.
    static MIGRATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = MIGRATING.lock().await;
    let mut conn = pool.acquire().await.map_err(db_error::<SqliteStore>)?;
    let ours = migrator();
    migrations::adopt::<sqlx::Sqlite>(&mut conn, &ours, SHARED_MIGRATIONS_EXIST).await?;
    ours.run(&mut *conn).await?;
    Ok(())
}

/// orderly's migrations for this backend, recorded in
/// [`MIGRATIONS_TABLE`](crate::store::MIGRATIONS_TABLE): for an application that runs
/// them itself, for example up to a version ([`Migrator::run_to`]). Only [`migrate`]
/// moves an earlier orderly's rows out of `_sqlx_migrations`: on a database an earlier
/// orderly migrated, call [`migrate`] once first, or this migrator applies everything
/// again (and fails on the first column that exists).
pub fn migrator() -> Migrator {
    migrations::own_table(sqlx::migrate!("migrations/sqlite"))
}

/// A row when the database has sqlx's default migrations table.
const SHARED_MIGRATIONS_EXIST: &str =
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'";

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
    transitions: Arc<transitions::Sql>,
    /// The writers' turns of this store and its clones (one writer at a time).
    writers: Arc<tokio::sync::Mutex<()>>,
    /// The thread that writes the engine's own apply-first units, started at the first
    /// (`None` inside: the database cannot take a second connection).
    writer: Arc<tokio::sync::OnceCell<Option<writer::Writer>>>,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` with [`connect_options`], a pool
    /// of 8 connections, and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            // The database is a file in this process: a ping before each use, a call to
            // the connection's worker thread, would test nothing a statement does not.
            .test_before_acquire(false)
            .connect_with(connect_options(url)?)
            .await
            .map_err(db_error::<Self>)?;
        migrate(&pool).await?;
        Ok(Self::new(pool))
    }

    /// A store over an existing pool and the default tables. Build the pool with
    /// [`connect_options`] and run [`migrate`] first.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store over an existing pool and custom tables.
    pub fn with_tables(pool: SqlitePool, tables: Tables) -> Self {
        SqliteStore {
            pool,
            tables: Arc::new(tables.clone()),
            transitions: Arc::new(transitions::Sql::new(&tables)),
            writers: Arc::default(),
            writer: Arc::default(),
        }
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
