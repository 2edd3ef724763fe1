//! PostgreSQL (and engines that speak its protocol: CockroachDB, YugabyteDB, Citus).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Postgres, SqlSafeStr, SqlStr, Transaction};

use super::{
    BatchReads, ErrorClass, FirstRound, Observed, Optimistic, ReadFirst, Request, Statements,
    Store, Tables, classify_common,
};
use crate::Error;

/// The row of the apply-first statement: `(version, from, to)` of what it applied.
type AppliedRow = (i64, String, String);

/// Applies the embedded migrations in `migrations/postgres/` (idempotent).
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    sqlx::migrate!("migrations/postgres").run(pool).await?;
    Ok(())
}

/// The PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    sql: Arc<Statements>,
    apply_first: ApplyFirst,
    batch_reads: BatchReads,
    first_round: FirstRound,
}

/// The apply-first statement in its two shapes: for an event with one source state
/// (scalar parameters, the common case), and for any other number (arrays).
#[derive(Debug, Clone)]
struct ApplyFirst {
    one_source: SqlStr,
    many_sources: SqlStr,
}

fn statements(tables: &Tables) -> (Statements, ApplyFirst) {
    let (o, h) = tables.quoted('"');
    let sql = |s: String| AssertSqlSafe(s).into_sql_str();
    // READ COMMITTED: every statement sees the latest commits, also inside a caller's
    // transaction, so reads need no locking variant.
    let twice = |s: String| {
        let s = sql(s);
        [s.clone(), s]
    };
    // Casts keep the decoded types fixed when a user's table uses VARCHAR or INTEGER.
    let statements = Statements {
        insert_order: sql(format!(
            "INSERT INTO {o} (id, status, version) VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING"
        )),
        get: sql(format!(
            "SELECT status::text, version::bigint FROM {o} WHERE id = $1"
        )),
        observe: twice(format!(
            "SELECT o.status::text, o.version::bigint, h.from_status::text, h.to_status::text, \
                    h.payload_hash::text, h.seq::bigint \
             FROM {o} AS o \
             LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = $2 AND h.ref_id = $3 \
             WHERE o.id = $1"
        )),
        prior: twice(format!(
            "SELECT from_status::text, to_status::text, payload_hash::text, seq::bigint FROM {h} \
             WHERE order_id = $1 AND event = $2 AND ref_id = $3"
        )),
        latest_ref: twice(format!(
            "SELECT ref_id::text FROM {h} WHERE order_id = $1 AND event = $2 ORDER BY seq DESC LIMIT 1"
        )),
        update: sql(format!(
            "UPDATE {o} SET status = $1, version = version + 1 \
             WHERE id = $2 AND status = $3 AND version = $4"
        )),
        record: sql(format!(
            "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)"
        )),
        history: sql(format!(
            "SELECT seq::bigint, from_status::text, to_status::text, event::text, ref_id::text, \
             payload_hash::text, payload::text, created_at \
             FROM {h} WHERE order_id = $1 ORDER BY seq"
        )),
    };
    // The apply-first attempt, one statement and one round trip: move the entity along
    // the event's edge from its current state and record the history row. No read before
    // and no version predicate: under READ COMMITTED an UPDATE evaluates its predicate on
    // the latest committed version of the row it locks (re-checking it if a rival
    // committed after the statement's snapshot), so the status is judged on the very row
    // it changes, and a concurrent move makes it update nothing. A request recorded
    // before (a replay, even at a state the entity came back to, or a twin that committed
    // first) is stopped by the unique key of the history insert, which aborts the whole
    // statement. A row back: applied. Nothing back, or the unique key: the store reads
    // and the engine judges.
    let apply_first = |edge: &str, edge_cond: &str| {
        sql(format!(
            "WITH upd AS ( \
               UPDATE {o} AS o SET status = e.t, version = o.version + 1 \
               FROM {edge} AS e(f, t) \
               WHERE o.id = $1 AND {edge_cond} AND o.version >= 0 \
               RETURNING o.version::bigint AS seq, e.f, e.t \
             ) \
             INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload) \
             SELECT $1, seq, f, t, $2, $3, $4, $5::jsonb FROM upd \
             RETURNING seq::bigint, from_status::text, to_status::text"
        ))
    };
    let apply_first = ApplyFirst {
        one_source: apply_first("(SELECT $6::text, $7::text)", "o.status = $6"),
        many_sources: apply_first("unnest($6::text[], $7::text[])", "o.status = e.f"),
    };
    (statements, apply_first)
}

/// The batched read for `n` requests: one probe of the unique index per request, each
/// answer tagged with its request's position. Scalar parameters in a `VALUES` list, not
/// arrays: the planner knows the row count of a `VALUES` list, so the generic plan costs
/// what a custom one does and the prepared statement keeps it, where an `unnest` of array
/// parameters would be planned again on every execution.
fn priors_sql(h: &str, n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|i| {
            let p = 3 * i;
            format!(
                "(${}::bigint, ${}::text, ${}::text, {i}::bigint)",
                p + 1,
                p + 2,
                p + 3
            )
        })
        .collect();
    format!(
        "SELECT q.i, h.from_status::text, h.to_status::text, h.payload_hash::text, h.seq::bigint \
         FROM (VALUES {}) AS q(order_id, event, ref_id, i) \
         JOIN {h} AS h ON h.order_id = q.order_id AND h.event = q.event AND h.ref_id = q.ref_id",
        rows.join(", ")
    )
}

impl PgStore {
    /// Connects to `url` with a pool of 16 connections and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = PgConnectOptions::from_str(url).map_err(super::db_error::<Self>)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(super::db_error::<Self>)?;
        migrate(&pool).await?;
        Ok(Self::new(pool))
    }

    /// A store over an existing pool and the default tables; run [`migrate`] first.
    pub fn new(pool: PgPool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store over an existing pool and custom tables.
    pub fn with_tables(pool: PgPool, tables: Tables) -> Self {
        let (sql, apply_first) = statements(&tables);
        let (_, h) = tables.quoted('"');
        PgStore {
            batch_reads: BatchReads::new(|n| priors_sql(&h, n)),
            sql: Arc::new(sql),
            apply_first,
            pool,
            first_round: FirstRound::new(Self::READ_FIRST_FROM),
        }
    }

    /// The share of replays from which [`ReadFirst::Adaptive`] reads first, in 1/1024ths:
    /// 3/8. Tried first, a replay costs the statement (which writes nothing, so commits
    /// nothing) and then the read, about 2.5 reads of server CPU; read first, a new
    /// request costs one read more. Reading first pays from about 2/5.
    const READ_FIRST_FROM: u32 = 384;

    first_round_methods!("3/8");

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn sql(&self) -> &Statements {
        &self.sql
    }

    fn batch_reads(&self) -> &BatchReads {
        &self.batch_reads
    }

    /// The statement a transition outside a caller's transaction starts with, unless the
    /// store reads first: the update along the event's edge and the history insert, one
    /// round trip; the floor's statement (a data-modifying CTE feeding the insert),
    /// returning the history row it inserted. Parameters: `$1` order id, `$2` event, `$3`
    /// ref, `$4` payload hash, `$5` payload, then the event's edge: for an event with
    /// exactly one source state (`sources == 1`) `$6`/`$7` are its from and to states
    /// (`text`); otherwise they are all of them, in matching order (`text[]`). Returns
    /// `(version, from, to)` if it applied. For `EXPLAIN` and for review.
    pub fn transition_sql(&self, sources: usize) -> &str {
        if sources == 1 {
            self.apply_first.one_source.as_str()
        } else {
            self.apply_first.many_sources.as_str()
        }
    }

    /// The read a replay is answered by when the store reads first: the request's history
    /// row by the unique key `(order_id, event, ref_id)` (`$1`, `$2`, `$3`). For `EXPLAIN`.
    pub fn read_first_sql(&self) -> &str {
        self.sql().prior[0].as_str()
    }

    /// The same read for the requests of a batch (see [`ReadFirst`]), in the statement
    /// for up to `n` of them (`n` is rounded up to a power of two, at most 64): order id,
    /// event and reference of each request as `$1, $2, $3`, `$4, $5, $6`, …; returns
    /// `(position, from, to, payload hash, seq)` for each request recorded, positions
    /// counted from 0. For `EXPLAIN`.
    pub fn read_batch_sql(&self, n: usize) -> &str {
        self.batch_reads.sql(n).as_str()
    }
}

impl Store for PgStore {
    type Conn = PgConnection;
    type Pooled = sqlx::pool::PoolConnection<Postgres>;
    type Tx<'c> = Transaction<'c, Postgres>;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    shared_store_methods!(PgConnection);

    batched_priors!();

    async fn observe(
        &self,
        conn: &mut PgConnection,
        request: Request<'_>,
        in_tx: bool,
    ) -> Result<Observed, sqlx::Error> {
        // READ COMMITTED: the statement sees what was committed before it began, also
        // inside a caller's transaction.
        let key = request.key;
        let row: Option<super::ObservedRow> =
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

    /// One statement (see [`PgStore::transition_sql`]), any number of source states.
    async fn attempt(
        &self,
        conn: &mut PgConnection,
        request: Request<'_>,
    ) -> Result<Optimistic, sqlx::Error> {
        let key = request.key;
        let query = match (request.from_states, request.to_states) {
            ([from], [to]) => sqlx::query_as(self.apply_first.one_source.clone())
                .bind(key.order_id)
                .bind(key.event)
                .bind(key.ref_id)
                .bind(request.payload_hash)
                .bind(request.payload)
                .bind(*from)
                .bind(*to),
            (from, to) => sqlx::query_as(self.apply_first.many_sources.clone())
                .bind(key.order_id)
                .bind(key.event)
                .bind(key.ref_id)
                .bind(request.payload_hash)
                .bind(request.payload)
                .bind(from)
                .bind(to),
        };
        let row: Option<AppliedRow> = query.fetch_optional(conn).await?;
        Ok(match row {
            Some((version, from, to)) => Optimistic::Applied(from, to, version),
            None => Optimistic::NotApplied,
        })
    }

    fn first_round(&self) -> &FirstRound {
        &self.first_round
    }

    async fn begin(conn: &mut PgConnection, _in_tx: bool) -> Result<Self::Tx<'_>, sqlx::Error> {
        // BEGIN on a pooled connection, SAVEPOINT inside the caller's transaction.
        conn.begin().await
    }

    /// Retryable: 40001 serialization failure, 40P01 deadlock, 55P03 lock timeout.
    /// Connection lost (the write may have committed, so the engine re-reads the request
    /// before answering): class 08 (connection exception), 57P01 `admin_shutdown` (a
    /// session ended by `pg_terminate_backend` or a fast shutdown), 57P02
    /// `crash_shutdown`, 57P03 `cannot_connect_now`, and 40003 statement completion
    /// unknown; besides the I/O errors every backend shares.
    fn classify(err: &sqlx::Error) -> ErrorClass {
        if let Some(class) = classify_common(err) {
            return class;
        }
        let code = match err {
            sqlx::Error::Database(db) => db.code(),
            _ => None,
        };
        match code.as_deref() {
            Some("40001" | "40P01" | "55P03") => ErrorClass::Retryable,
            Some("57P01" | "57P02" | "57P03" | "40003") => ErrorClass::ConnectionLost,
            Some(c) if c.starts_with("08") => ErrorClass::ConnectionLost,
            _ => ErrorClass::Fatal,
        }
    }
}
