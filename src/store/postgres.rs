//! PostgreSQL (and engines that speak its protocol: CockroachDB, YugabyteDB, Citus).

use std::str::FromStr;
use std::sync::Arc;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Postgres, SqlSafeStr, SqlStr, Transaction};

use super::{
    ErrorClass, Observed, Optimistic, Request, Statements, Store, Tables, classify_common,
};
use crate::Error;

/// The row of the fused statement: an [`ObservedRow`], then what was applied
/// `(from, to, version)`, all NULL when nothing was.
type FusedRow = (
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

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
    fused: SqlStr,
}

fn statements(tables: &Tables) -> (Statements, SqlStr) {
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
    // The read and the optimistic apply in one statement, one round trip: all parts
    // see one snapshot; `upd` keeps the status and version predicates, and under
    // READ COMMITTED a row changed since the snapshot fails them on re-check, so a
    // lost race updates nothing and the engine reads again. A twin's history row
    // (unique violation) aborts the whole statement. $4/$5 are the event's edges.
    // Returns the columns of `ObservedRow`, then what was applied.
    let fused = sql(format!(
        "WITH cur AS ( \
               SELECT status::text AS status, version::bigint AS version FROM {o} WHERE id = $1 \
             ), prior AS ( \
               SELECT from_status::text AS from_status, to_status::text AS to_status, \
                      payload_hash::text AS payload_hash, seq::bigint AS seq \
               FROM {h} WHERE order_id = $1 AND event = $2 AND ref_id = $3 \
             ), upd AS ( \
               UPDATE {o} AS o \
               SET status = ($5::text[])[array_position($4::text[], cur.status)], version = o.version + 1 \
               FROM cur \
               WHERE o.id = $1 AND o.status = cur.status AND o.version = cur.version \
                 AND cur.status = ANY($4::text[]) AND NOT EXISTS (SELECT 1 FROM prior) \
               RETURNING cur.status AS from_status, o.status::text AS to_status, o.version::bigint AS version \
             ), ins AS ( \
               INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload) \
               SELECT $1, version, from_status, to_status, $2, $3, $6, $7::jsonb FROM upd \
             ) \
             SELECT cur.status, cur.version, prior.from_status, prior.to_status, prior.payload_hash, \
                    prior.seq, upd.from_status, upd.to_status, upd.version \
             FROM (SELECT 1) AS one \
             LEFT JOIN cur ON true LEFT JOIN prior ON true LEFT JOIN upd ON true"
    ));
    (statements, fused)
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
        let (sql, fused) = statements(&tables);
        PgStore {
            sql: Arc::new(sql),
            fused,
            pool,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The statement sent for each transition outside a caller's transaction: the read
    /// and the optimistic apply in one. Parameters: `$1` order id, `$2` event, `$3` ref,
    /// `$4`/`$5` the event's from/to states (`text[]`), `$6` payload hash, `$7` payload.
    /// For `EXPLAIN` and for review.
    pub fn transition_sql(&self) -> &str {
        self.fused.as_str()
    }
}

impl Store for PgStore {
    type Conn = PgConnection;
    type Pooled = sqlx::pool::PoolConnection<Postgres>;
    type Tx<'c> = Transaction<'c, Postgres>;

    shared_store_methods!(PgConnection);

    async fn observe(
        &self,
        conn: &mut PgConnection,
        request: Request<'_>,
        in_tx: bool,
    ) -> Result<Observed, sqlx::Error> {
        let key = request.key;
        if in_tx {
            // Inside the caller's transaction an error would abort it: read only, and let
            // the engine apply within a savepoint. READ COMMITTED: the statement sees
            // what was committed before it began.
            let row: Option<super::ObservedRow> = sqlx::query_as(self.sql.observe[1].clone())
                .bind(key.order_id)
                .bind(key.event)
                .bind(key.ref_id)
                .fetch_optional(conn)
                .await?;
            return Ok(Observed::from_row(
                row.unwrap_or_default(),
                Optimistic::NotTried,
            ));
        }
        let (s, v, from, to, hash, seq, a_from, a_to, a_version): FusedRow =
            sqlx::query_as(self.fused.clone())
                .bind(key.order_id)
                .bind(key.event)
                .bind(key.ref_id)
                .bind(request.from_states)
                .bind(request.to_states)
                .bind(request.payload_hash)
                .bind(request.payload)
                .fetch_one(conn)
                .await?;
        let optimistic = match (a_from, a_to, a_version) {
            (Some(from), Some(to), Some(version)) => Optimistic::Applied(from, to, version),
            _ => Optimistic::NotApplied,
        };
        Ok(Observed::from_row((s, v, from, to, hash, seq), optimistic))
    }

    async fn begin(conn: &mut PgConnection, _in_tx: bool) -> Result<Self::Tx<'_>, sqlx::Error> {
        // BEGIN on a pooled connection, SAVEPOINT inside the caller's transaction.
        conn.begin().await
    }

    /// Retryable: 40001 serialization failure, 40P01 deadlock, 55P03 lock timeout, and
    /// 40003 statement completion unknown — safe to retry because every attempt starts
    /// by re-reading the request's history row, so an attempt that did commit is found
    /// and answered as `Replayed`, never applied again.
    fn classify(err: &sqlx::Error) -> ErrorClass {
        if let Some(class) = classify_common(err) {
            return class;
        }
        let code = match err {
            sqlx::Error::Database(db) => db.code(),
            _ => None,
        };
        match code.as_deref() {
            Some("40001" | "40P01" | "55P03" | "40003") => ErrorClass::Retryable,
            _ => ErrorClass::Fatal,
        }
    }
}
