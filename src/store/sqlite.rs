//! SQLite, the embedded default: WAL, `BEGIN IMMEDIATE` for writes, a busy timeout.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr, Sqlite, Transaction};

use super::{
    ErrorClass, FirstRound, Observed, ObservedRow, Optimistic, ReadFirst, Request, Statements,
    Store, Tables, classify_common,
};
use crate::Error;

/// Applies the embedded migrations in `migrations/sqlite/` (idempotent).
pub async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    sqlx::migrate!("migrations/sqlite").run(pool).await?;
    Ok(())
}

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
        .busy_timeout(Duration::from_secs(5)))
}

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Statements>,
    /// The apply-first attempt's update: `(to, id, from)`, returning the new version.
    optimistic_update: SqlStr,
    first_round: FirstRound,
}

fn statements(tables: &Tables) -> Statements {
    let (o, h) = tables.quoted('"');
    let sql = |s: String| AssertSqlSafe(s).into_sql_str();
    // One writer at a time (`BEGIN IMMEDIATE`), so reads need no locking variant.
    let twice = |s: String| {
        let s = sql(s);
        [s.clone(), s]
    };
    Statements {
        insert_order: sql(format!(
            "INSERT INTO {o} (id, status, version) VALUES (?1, ?2, 0) ON CONFLICT (id) DO NOTHING"
        )),
        get: sql(format!("SELECT status, version FROM {o} WHERE id = ?1")),
        observe: twice(format!(
            "SELECT o.status, o.version, h.from_status, h.to_status, h.payload_hash, h.seq \
             FROM {o} AS o \
             LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = ?2 AND h.ref_id = ?3 \
             WHERE o.id = ?1"
        )),
        prior: twice(format!(
            "SELECT from_status, to_status, payload_hash, seq FROM {h} \
             WHERE order_id = ?1 AND event = ?2 AND ref_id = ?3"
        )),
        latest_ref: twice(format!(
            "SELECT ref_id FROM {h} WHERE order_id = ?1 AND event = ?2 ORDER BY seq DESC LIMIT 1"
        )),
        update: sql(format!(
            "UPDATE {o} SET status = ?1, version = version + 1 \
             WHERE id = ?2 AND status = ?3 AND version = ?4"
        )),
        record: sql(format!(
            "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
        )),
        history: sql(format!(
            "SELECT seq, from_status, to_status, event, ref_id, payload_hash, payload, created_at \
             FROM {h} WHERE order_id = ?1 ORDER BY seq"
        )),
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` with [`connect_options`], a pool
    /// of 8 connections, and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(connect_options(url)?)
            .await
            .map_err(super::db_error::<Self>)?;
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
        let (o, _) = tables.quoted('"');
        let optimistic_update = AssertSqlSafe(format!(
            "UPDATE {o} SET status = ?1, version = version + 1 \
             WHERE id = ?2 AND status = ?3 AND version >= 0 RETURNING version"
        ))
        .into_sql_str();
        SqliteStore {
            sql: Arc::new(statements(&tables)),
            pool,
            optimistic_update,
            first_round: FirstRound::new(Self::READ_FIRST_FROM),
        }
    }

    /// The share of replays from which [`ReadFirst::Adaptive`] reads first, in 1/1024ths:
    /// 1/4. Tried first, a replay takes the write lock (`BEGIN IMMEDIATE`), waiting
    /// behind every writer, for an update that changes nothing; read first, a new
    /// request costs one read more, which in-process is cheap.
    const READ_FIRST_FROM: u32 = 256;

    first_round_methods!("1/4");

    /// The attempt's update (see [`transaction_attempt!`]), under `BEGIN IMMEDIATE`: the
    /// only writer, on the latest data.
    async fn bump(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
        from: &str,
        to: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(self.optimistic_update.clone())
            .bind(to)
            .bind(order_id)
            .bind(from)
            .fetch_optional(conn)
            .await
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn sql(&self) -> &Statements {
        &self.sql
    }
}

impl Store for SqliteStore {
    type Conn = SqliteConnection;
    type Pooled = sqlx::pool::PoolConnection<Sqlite>;
    type Tx<'c> = Transaction<'c, Sqlite>;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    shared_store_methods!(SqliteConnection);

    transaction_attempt!();

    async fn observe(
        &self,
        conn: &mut SqliteConnection,
        request: Request<'_>,
        in_tx: bool,
    ) -> Result<Observed, sqlx::Error> {
        let key = request.key;
        let row: Option<ObservedRow> =
            sqlx::query_as(self.sql().observe[usize::from(in_tx)].clone())
                .bind(key.order_id)
                .bind(key.event)
                .bind(key.ref_id)
                .fetch_optional(conn)
                .await?;
        Ok(Observed::from_row(
            row.unwrap_or_default(),
            Optimistic::NotTried,
        ))
    }

    async fn begin(conn: &mut SqliteConnection, in_tx: bool) -> Result<Self::Tx<'_>, sqlx::Error> {
        if in_tx {
            conn.begin().await
        } else {
            // Take the write lock up front: a deferred BEGIN that reads and then writes can
            // fail with SQLITE_BUSY_SNAPSHOT instead of waiting.
            conn.begin_with("BEGIN IMMEDIATE").await
        }
    }

    /// SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes such as
    /// SQLITE_BUSY_SNAPSHOT (517), are retryable.
    fn classify(err: &sqlx::Error) -> ErrorClass {
        if let Some(class) = classify_common(err) {
            return class;
        }
        let code = match err {
            sqlx::Error::Database(db) => db.code().and_then(|c| c.parse::<i32>().ok()),
            _ => None,
        };
        match code.map(|c| c & 0xff) {
            Some(5 | 6) => ErrorClass::Retryable,
            _ => ErrorClass::Fatal,
        }
    }
}
