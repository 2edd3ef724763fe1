//! MySQL and MariaDB (and engines that speak their protocol: TiDB, Galera).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr, Transaction};

use super::{
    BatchReads, ErrorClass, FirstRound, Observed, ObservedRow, Optimistic, ReadFirst, Request,
    Statements, Store, Tables, classify_common,
};
use crate::Error;

/// Applies the embedded migrations in `migrations/mysql/` (idempotent).
pub async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
    sqlx::migrate!("migrations/mysql").run(pool).await?;
    Ok(())
}

/// The MySQL/MariaDB store.
///
/// Its apply-first update returns the new version through `LAST_INSERT_ID(expr)`, so after
/// a transition a pooled connection's `LAST_INSERT_ID()` holds that version until the next
/// insert with an auto-increment key. Read `LAST_INSERT_ID()` only on the connection and
/// right after the insert it is meant for, as MySQL advises anyway.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    sql: Arc<Statements>,
    /// The optimistic attempt's update, judged on the row it locks: `(to, id, from)`.
    /// `LAST_INSERT_ID(expr)` hands the new version back in the statement's reply.
    optimistic_update: SqlStr,
    batch_reads: BatchReads,
    first_round: FirstRound,
}

fn statements(tables: &Tables) -> Statements {
    let (o, h) = tables.quoted('`');
    let sql = |s: String| AssertSqlSafe(s).into_sql_str();
    // `[plain, inside a caller's transaction]`: in REPEATABLE READ a plain read returns the
    // caller's snapshot, which may predate a rival's commit; locking reads see the latest
    // rows. The judge's read is driven by the entity row rather than a one-row derived
    // table, which MariaDB materializes as a temporary table on every call (about 40 µs
    // here); its parameters are therefore (event, ref_id, order_id).
    let locking = |f: &dyn Fn(&str) -> String, lock: &str| [sql(f("")), sql(f(lock))];
    Statements {
        insert_order: sql(format!(
            "INSERT INTO {o} (id, status, version) VALUES (?, ?, 0) ON DUPLICATE KEY UPDATE id = id"
        )),
        get: sql(format!(
            "SELECT status, CAST(version AS SIGNED) FROM {o} WHERE id = ?"
        )),
        observe: locking(
            &|lock| {
                format!(
                    "SELECT o.status, CAST(o.version AS SIGNED), h.from_status, h.to_status, h.payload_hash, h.seq \
                     FROM {o} AS o \
                     LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = ? AND h.ref_id = ? \
                     WHERE o.id = ? {lock}"
                )
            },
            "FOR UPDATE",
        ),
        prior: locking(
            &|lock| {
                format!(
                    "SELECT from_status, to_status, payload_hash, seq FROM {h} \
                     WHERE order_id = ? AND event = ? AND ref_id = ? {lock}"
                )
            },
            "LOCK IN SHARE MODE",
        ),
        latest_ref: locking(
            &|lock| {
                format!(
                    "SELECT ref_id FROM {h} WHERE order_id = ? AND event = ? ORDER BY seq DESC LIMIT 1 {lock}"
                )
            },
            "LOCK IN SHARE MODE",
        ),
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

/// The batched read for `n` requests: the requests as a derived table of `UNION ALL`ed
/// rows (the form MySQL and MariaDB share), joined with the history on its unique key,
/// each answer tagged with its request's position. The derived table is materialized on
/// every call (a temporary table, about 40 µs here), which is why a lone request is read
/// with the plain statement instead.
fn priors_sql(h: &str, n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!("SELECT CAST(? AS SIGNED) AS order_id, ? AS event, ? AS ref_id, CAST({i} AS SIGNED) AS i"))
        .collect();
    format!(
        "SELECT q.i, h.from_status, h.to_status, h.payload_hash, h.seq \
         FROM ({}) AS q \
         JOIN {h} AS h ON h.order_id = q.order_id AND h.event = q.event AND h.ref_id = q.ref_id",
        rows.join(" UNION ALL ")
    )
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
        let (o, h) = tables.quoted('`');
        let optimistic_update = AssertSqlSafe(format!(
            "UPDATE {o} SET status = ?, version = LAST_INSERT_ID(version + 1) \
             WHERE id = ? AND status = ?"
        ))
        .into_sql_str();
        MySqlStore {
            sql: Arc::new(statements(&tables)),
            pool,
            optimistic_update,
            batch_reads: BatchReads::new(|n| priors_sql(&h, n)),
            first_round: FirstRound::new(Self::READ_FIRST_FROM),
        }
    }

    /// The share of replays from which [`ReadFirst::Adaptive`] reads first, in 1/1024ths:
    /// 1/4. Tried first, a replay costs four round trips (`BEGIN`, an update that changes
    /// nothing, `ROLLBACK`, the read); read first, a new request costs one more.
    const READ_FIRST_FROM: u32 = 256;

    first_round_methods!("1/4");

    /// The attempt's update (see [`transaction_attempt!`]): InnoDB's `UPDATE` is a
    /// locking read of the latest committed row, not the transaction's snapshot.
    /// `LAST_INSERT_ID(expr)` returns the new version in the reply, so nothing is read;
    /// it also stays the connection's `LAST_INSERT_ID()` until the next insert with an
    /// auto-increment key.
    async fn bump(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
        from: &str,
        to: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let update = sqlx::query(self.optimistic_update.clone())
            .bind(to)
            .bind(order_id)
            .bind(from)
            .execute(conn)
            .await?;
        if update.rows_affected() != 1 {
            return Ok(None);
        }
        i64::try_from(update.last_insert_id())
            .map(Some)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))
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

    shared_store_methods!(MySqlConnection);

    batched_priors!();

    transaction_attempt!();

    async fn observe(
        &self,
        conn: &mut MySqlConnection,
        request: Request<'_>,
        in_tx: bool,
    ) -> Result<Observed, sqlx::Error> {
        // Its own binding order (see `statements`).
        let key = request.key;
        let row: Option<ObservedRow> = sqlx::query_as(self.sql.observe[usize::from(in_tx)].clone())
            .bind(key.event)
            .bind(key.ref_id)
            .bind(key.order_id)
            .fetch_optional(conn)
            .await?;
        Ok(Observed::from_row(
            row.unwrap_or_default(),
            Optimistic::NotTried,
        ))
    }

    async fn begin(conn: &mut MySqlConnection, _in_tx: bool) -> Result<Self::Tx<'_>, sqlx::Error> {
        // BEGIN on a pooled connection, SAVEPOINT inside the caller's transaction.
        conn.begin().await
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
