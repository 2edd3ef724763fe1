//! MySQL and MariaDB (and engines that speak their protocol: TiDB, Galera).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr, Transaction};

use super::{
    Apply, ErrorClass, HistoryRow, Key, Observed, ObservedRow, Optimistic, Prior, PriorRow,
    RawTransition, Request, Store, Tables, classify_common,
};
use crate::Error;

/// Applies the embedded migrations in `migrations/mysql/` (idempotent).
pub async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
    sqlx::migrate!("migrations/mysql").run(pool).await?;
    Ok(())
}

/// The MySQL/MariaDB store.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    sql: Arc<Statements>,
}

#[derive(Debug)]
struct Statements {
    insert_order: SqlStr,
    get: SqlStr,
    observe: SqlStr,
    observe_locking: SqlStr,
    prior: SqlStr,
    prior_locking: SqlStr,
    latest_ref: SqlStr,
    latest_ref_locking: SqlStr,
    update: SqlStr,
    record: SqlStr,
    history: SqlStr,
}

impl Statements {
    fn new(tables: &Tables) -> Self {
        let (o, h) = tables.quoted('`');
        let sql = |s: String| AssertSqlSafe(s).into_sql_str();
        // `lock` is empty for the plain read and a locking clause for the read inside a
        // caller's transaction (see `observe`). The read is driven by the entity row rather
        // than a one-row derived table, which MariaDB materializes as a temporary table on
        // every call (about 40 µs here).
        let observe = |lock: &str| {
            sql(format!(
                "SELECT o.status, CAST(o.version AS SIGNED), h.from_status, h.to_status, h.payload_hash, h.seq \
                 FROM {o} AS o \
                 LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = ? AND h.ref_id = ? \
                 WHERE o.id = ? {lock}"
            ))
        };
        let prior = |lock: &str| {
            sql(format!(
                "SELECT from_status, to_status, payload_hash, seq FROM {h} \
                 WHERE order_id = ? AND event = ? AND ref_id = ? {lock}"
            ))
        };
        let latest_ref = |lock: &str| {
            sql(format!(
                "SELECT ref_id FROM {h} WHERE order_id = ? AND event = ? ORDER BY seq DESC LIMIT 1 {lock}"
            ))
        };
        Statements {
            insert_order: sql(format!(
                "INSERT INTO {o} (id, status, version) VALUES (?, ?, 0) ON DUPLICATE KEY UPDATE id = id"
            )),
            get: sql(format!(
                "SELECT status, CAST(version AS SIGNED) FROM {o} WHERE id = ?"
            )),
            observe: observe(""),
            prior: prior(""),
            prior_locking: prior("LOCK IN SHARE MODE"),
            observe_locking: observe("FOR UPDATE"),
            latest_ref: latest_ref(""),
            latest_ref_locking: latest_ref("LOCK IN SHARE MODE"),
            update: sql(format!(
                "UPDATE {o} SET status = ?, version = version + 1 \
                 WHERE id = ? AND status = ? AND version = ?"
            )),
            record: sql(format!(
                "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            )),
            history: sql(format!(
                "SELECT seq, from_status, to_status, event, ref_id, payload_hash, \
                 CAST(payload AS CHAR), created_at \
                 FROM {h} WHERE order_id = ? ORDER BY seq"
            )),
        }
    }
}

impl MySqlStore {
    /// Connects to `url` with a pool of 16 connections and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = MySqlConnectOptions::from_str(url).map_err(super::db_error::<Self>)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(super::db_error::<Self>)?;
        migrate(&pool).await?;
        Ok(Self::new(pool))
    }

    /// A store over an existing pool and the default tables; run [`migrate`] first.
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store over an existing pool and custom tables.
    pub fn with_tables(pool: MySqlPool, tables: Tables) -> Self {
        MySqlStore {
            sql: Arc::new(Statements::new(&tables)),
            pool,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

impl Store for MySqlStore {
    type Conn = MySqlConnection;
    type Pooled = sqlx::pool::PoolConnection<MySql>;
    type Tx<'c> = Transaction<'c, MySql>;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    async fn create(
        &self,
        conn: &mut MySqlConnection,
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
        conn: &mut MySqlConnection,
        request: Request<'_>,
        in_tx: bool,
    ) -> Result<Observed, sqlx::Error> {
        // Inside a REPEATABLE READ transaction a plain read returns the transaction's
        // snapshot, which may predate a rival's commit; locking reads see the latest rows.
        let sql = if in_tx {
            &self.sql.observe_locking
        } else {
            &self.sql.observe
        };
        let key = request.key;
        let row: Option<ObservedRow> = sqlx::query_as(sql.clone())
            .bind(key.event)
            .bind(key.ref_id)
            .bind(key.order_id)
            .fetch_optional(conn)
            .await?;
        let row = row.unwrap_or_default();
        Ok(Observed::from_row(row, Optimistic::NotTried))
    }

    async fn prior(
        &self,
        conn: &mut MySqlConnection,
        key: Key<'_>,
        in_tx: bool,
    ) -> Result<Option<Prior>, sqlx::Error> {
        let sql = if in_tx {
            &self.sql.prior_locking
        } else {
            &self.sql.prior
        };
        let row: Option<PriorRow> = sqlx::query_as(sql.clone())
            .bind(key.order_id)
            .bind(key.event)
            .bind(key.ref_id)
            .fetch_optional(conn)
            .await?;
        Ok(row.map(Prior::from))
    }

    async fn latest_ref(
        &self,
        conn: &mut MySqlConnection,
        key: Key<'_>,
        in_tx: bool,
    ) -> Result<Option<String>, sqlx::Error> {
        let sql = if in_tx {
            &self.sql.latest_ref_locking
        } else {
            &self.sql.latest_ref
        };
        sqlx::query_scalar(sql.clone())
            .bind(key.order_id)
            .bind(key.event)
            .fetch_optional(conn)
            .await
    }

    async fn begin(conn: &mut MySqlConnection, _in_tx: bool) -> Result<Self::Tx<'_>, sqlx::Error> {
        // BEGIN on a pooled connection, SAVEPOINT inside the caller's transaction.
        conn.begin().await
    }

    async fn commit(tx: Self::Tx<'_>) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn rollback(tx: Self::Tx<'_>) -> Result<(), sqlx::Error> {
        tx.rollback().await
    }

    async fn update(&self, conn: &mut MySqlConnection, a: Apply<'_>) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(self.sql.update.clone())
            .bind(a.to)
            .bind(a.key.order_id)
            .bind(a.from)
            .bind(a.version)
            .execute(conn)
            .await?;
        // The row always changes (version + 1), so "affected" equals "matched".
        Ok(done.rows_affected())
    }

    async fn record(&self, conn: &mut MySqlConnection, a: Apply<'_>) -> Result<(), sqlx::Error> {
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
        conn: &mut MySqlConnection,
        order_id: i64,
    ) -> Result<Option<(String, i64)>, sqlx::Error> {
        sqlx::query_as(self.sql.get.clone())
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn history(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
    ) -> Result<Vec<RawTransition>, sqlx::Error> {
        let rows: Vec<HistoryRow> = sqlx::query_as(self.sql.history.clone())
            .bind(order_id)
            .fetch_all(conn)
            .await?;
        Ok(rows.into_iter().map(RawTransition::from).collect())
    }

    /// Retryable: 1213 deadlock (also Galera's certification failure) and 1205 lock wait
    /// timeout.
    fn classify(err: &sqlx::Error) -> ErrorClass {
        if let Some(class) = classify_common(err) {
            return class;
        }
        let code = match err {
            sqlx::Error::Database(db) => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(|e| e.number()),
            _ => None,
        };
        match code {
            Some(1213 | 1205) => ErrorClass::Retryable,
            _ => ErrorClass::Fatal,
        }
    }
}
