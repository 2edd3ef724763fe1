//! MySQL and MariaDB (and engines that speak their protocol: TiDB, Galera).

use std::str::FromStr;
use std::sync::{Arc, OnceLock};

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
///
/// On MariaDB Galera (a server with `wsrep_on`), every read the engine judges by, and
/// [`get`](crate::Engine::get) and [`history`](crate::Engine::history), is causal: it runs
/// as `SET STATEMENT wsrep_sync_wait = 1 FOR SELECT …`, so it waits until the node has
/// applied every write set the cluster certified before it, and a request acknowledged
/// on one node is a replay on every other. The store finds out on the first connection
/// it borrows from its pool ([`connect`](Self::connect) asks at once); a cross-node race
/// that Galera's certification settles surfaces as error 1213 at `COMMIT`, which is
/// retried and judged afresh.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// `[plain, causal]` statements and batched reads; see [`MySqlStore::causal_reads`].
    sql: [Arc<Statements>; 2],
    batch_reads: [BatchReads; 2],
    /// Whether the server is a Galera node, once known.
    galera: Arc<OnceLock<bool>>,
    /// The optimistic attempt's update, judged on the row it locks: `(to, id, from)`.
    /// `LAST_INSERT_ID(expr)` hands the new version back in the statement's reply.
    optimistic_update: SqlStr,
    first_round: FirstRound,
}

/// Makes a read wait, on a Galera node, for the write sets certified before it.
const CAUSAL: &str = "SET STATEMENT wsrep_sync_wait = 1 FOR ";

fn statements(tables: &Tables, causal: bool) -> Statements {
    let (o, h) = tables.quoted('`');
    let sql = |s: String| AssertSqlSafe(s).into_sql_str();
    let read = |s: String| {
        let s = if causal { format!("{CAUSAL}{s}") } else { s };
        AssertSqlSafe(s).into_sql_str()
    };
    // `[plain, inside a caller's transaction]`: in REPEATABLE READ a plain read returns the
    // caller's snapshot, which may predate a rival's commit; locking reads see the latest
    // rows. The judge's read is driven by the entity row rather than a one-row derived
    // table, which MariaDB materializes as a temporary table on every call (about 40 µs
    // here); its parameters are therefore (event, ref_id, order_id).
    let locking = |f: &dyn Fn(&str) -> String, lock: &str| [read(f("")), read(f(lock))];
    Statements {
        insert_order: sql(format!(
            "INSERT INTO {o} (id, status, version) VALUES (?, ?, 0) ON DUPLICATE KEY UPDATE id = id"
        )),
        get: read(format!(
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
        history: read(format!(
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
fn priors_sql(h: &str, n: usize, causal: bool) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| format!("SELECT CAST(? AS SIGNED) AS order_id, ? AS event, ? AS ref_id, CAST({i} AS SIGNED) AS i"))
        .collect();
    format!(
        "{}SELECT q.i, h.from_status, h.to_status, h.payload_hash, h.seq \
         FROM ({}) AS q \
         JOIN {h} AS h ON h.order_id = q.order_id AND h.event = q.event AND h.ref_id = q.ref_id",
        if causal { CAUSAL } else { "" },
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
        let store = Self::new(pool);
        store.acquire().await.map_err(super::db_error::<Self>)?;
        Ok(store)
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
             WHERE id = ? AND status = ? AND version >= 0"
        ))
        .into_sql_str();
        MySqlStore {
            sql: [false, true].map(|causal| Arc::new(statements(&tables, causal))),
            batch_reads: [false, true].map(|causal| BatchReads::new(|n| priors_sql(&h, n, causal))),
            galera: Arc::default(),
            pool,
            optimistic_update,
            first_round: FirstRound::new(Self::READ_FIRST_FROM),
        }
    }

    /// Whether this store's reads are causal: `Some(true)` on a Galera node, `None` until
    /// the store has borrowed its first connection.
    pub fn causal_reads(&self) -> Option<bool> {
        self.galera.get().copied()
    }

    fn sql(&self) -> &Statements {
        &self.sql[usize::from(self.causal_reads() == Some(true))]
    }

    fn batch_reads(&self) -> &BatchReads {
        &self.batch_reads[usize::from(self.causal_reads() == Some(true))]
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

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        if self.galera.get().is_none() {
            // `wsrep_on` exists on MariaDB only; MySQL answers no row.
            let wsrep: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
                .fetch_optional(&mut *conn)
                .await?;
            let on = wsrep.is_some_and(|(_, value)| value.eq_ignore_ascii_case("ON"));
            // Concurrent first borrowers find the same answer; the first one sets it.
            let _ = self.galera.set(on);
        }
        Ok(conn)
    }

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
        let row: Option<ObservedRow> =
            sqlx::query_as(self.sql().observe[usize::from(in_tx)].clone())
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

    /// Retryable: 1213 deadlock (also Galera's certification failure), 1205 lock wait
    /// timeout, 1047 (a Galera node not in the primary component). Connection lost (the
    /// write may have committed, so the engine re-reads the request before answering):
    /// 1927 connection killed, 1053 server shutdown, 1152 aborted connection, 1158–1161
    /// network read/write errors, 2006 server gone away, 2013 connection lost during a
    /// query; besides the I/O errors every backend shares (sqlx reports a socket that a
    /// `KILL` closed as an I/O error).
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
            Some(1213 | 1205 | 1047) => ErrorClass::Retryable,
            Some(1927 | 1053 | 1152 | 1158..=1161 | 2006 | 2013) => ErrorClass::ConnectionLost,
            _ => ErrorClass::Fatal,
        }
    }
}
