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
    Apply, ErrorClass, HistoryRow, Key, Observed, ObservedRow, Optimistic, Prior, PriorRow,
    RawTransition, Request, Store, Tables, classify_common,
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
}

#[derive(Debug)]
struct Statements {
    insert_order: SqlStr,
    get: SqlStr,
    observe: SqlStr,
    prior: SqlStr,
    latest_ref: SqlStr,
    update: SqlStr,
    record: SqlStr,
    history: SqlStr,
}

impl Statements {
    fn new(tables: &Tables) -> Self {
        let (o, h) = tables.quoted('"');
        let sql = |s: String| AssertSqlSafe(s).into_sql_str();
        Statements {
            insert_order: sql(format!(
                "INSERT INTO {o} (id, status, version) VALUES (?1, ?2, 0) ON CONFLICT (id) DO NOTHING"
            )),
            get: sql(format!("SELECT status, version FROM {o} WHERE id = ?1")),
            observe: sql(format!(
                "SELECT o.status, o.version, h.from_status, h.to_status, h.payload_hash, h.seq \
                 FROM {o} AS o \
                 LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = ?2 AND h.ref_id = ?3 \
                 WHERE o.id = ?1"
            )),
            prior: sql(format!(
                "SELECT from_status, to_status, payload_hash, seq FROM {h} \
                 WHERE order_id = ?1 AND event = ?2 AND ref_id = ?3"
            )),
            latest_ref: sql(format!(
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
        SqliteStore {
            sql: Arc::new(Statements::new(&tables)),
            pool,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl Store for SqliteStore {
    type Conn = SqliteConnection;
    type Pooled = sqlx::pool::PoolConnection<Sqlite>;
    type Tx<'c> = Transaction<'c, Sqlite>;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    async fn create(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
        initial: &'static str,
    ) -> Result<(String, i64), sqlx::Error> {
        sqlx::query(self.sql.insert_order.clone())
            .bind(order_id)
            .bind(initial)
            .execute(&mut *conn)
            .await?;
        sqlx::query_as(self.sql.get.clone())
            .bind(order_id)
            .fetch_one(&mut *conn)
            .await
    }

    async fn observe(
        &self,
        conn: &mut SqliteConnection,
        request: Request<'_>,
        _in_tx: bool,
    ) -> Result<Observed, sqlx::Error> {
        let key = request.key;
        let row: Option<ObservedRow> = sqlx::query_as(self.sql.observe.clone())
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

    async fn prior(
        &self,
        conn: &mut SqliteConnection,
        key: Key<'_>,
        _in_tx: bool,
    ) -> Result<Option<Prior>, sqlx::Error> {
        let row: Option<PriorRow> = sqlx::query_as(self.sql.prior.clone())
            .bind(key.order_id)
            .bind(key.event)
            .bind(key.ref_id)
            .fetch_optional(conn)
            .await?;
        Ok(row.map(Prior::from))
    }

    async fn latest_ref(
        &self,
        conn: &mut SqliteConnection,
        key: Key<'_>,
        _in_tx: bool,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(self.sql.latest_ref.clone())
            .bind(key.order_id)
            .bind(key.event)
            .fetch_optional(conn)
            .await
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

    async fn commit(tx: Self::Tx<'_>) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn rollback(tx: Self::Tx<'_>) -> Result<(), sqlx::Error> {
        tx.rollback().await
    }

    async fn update(&self, conn: &mut SqliteConnection, a: Apply<'_>) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(self.sql.update.clone())
            .bind(a.to)
            .bind(a.key.order_id)
            .bind(a.from)
            .bind(a.version)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn record(&self, conn: &mut SqliteConnection, a: Apply<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(self.sql.record.clone())
            .bind(a.key.order_id)
            .bind(a.version + 1)
            .bind(a.from)
            .bind(a.to)
            .bind(a.key.event)
            .bind(a.key.ref_id)
            .bind(a.payload_hash)
            .bind(a.payload)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        sqlx::query_as(self.sql.get.clone())
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn history(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
    ) -> Result<Vec<RawTransition>, sqlx::Error> {
        let rows: Vec<HistoryRow> = sqlx::query_as(self.sql.history.clone())
            .bind(order_id)
            .fetch_all(conn)
            .await?;
        Ok(rows.into_iter().map(RawTransition::from).collect())
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
