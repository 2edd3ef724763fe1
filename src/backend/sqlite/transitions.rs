//! The transition layer on SQLite: its SQL, and the [`Store`] operations over it.
//!
//! One writer at a time: a write unit of the engine's own takes the write lock up front
//! (`BEGIN IMMEDIATE`; a deferred `BEGIN` that reads and then writes can fail with
//! `SQLITE_BUSY_SNAPSHOT` instead of waiting), and reads need no locking variant.

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::SqliteStore;
use crate::backend::names::Names;
use crate::backend::rows::ObservedRow;
use crate::backend::stepwise::Stepwise;
use crate::backend::units::{end_unit, undo};
use crate::store::{
    Apply, Entity, ErrorClass, FirstWrite, Key, Observed, Prior, RawTransition, Request, Store,
    Tables, Txn, Unpooled, Written,
};

/// Every statement of the layer, for one pair of tables.
#[derive(Debug)]
pub(super) struct Sql {
    insert_order: SqlStr,
    get: SqlStr,
    observe: SqlStr,
    prior: SqlStr,
    latest_ref: SqlStr,
    /// The apply-first update, under `BEGIN IMMEDIATE` (the only writer, on the latest
    /// data), guarded by the status, returning the new version: `(to, id, from)`.
    /// A version below 0, or at the largest (which has no next), leaves a corrupt row alone
    /// for the judge to report.
    pub(super) bump: SqlStr,
    /// The update after a read, guarded by what was read: `(to, id, from, version)`.
    pub(super) update: SqlStr,
    /// Undoes this unit's own `bump` inside a caller's transaction (whose row lock it
    /// still holds), guarded by what the bump wrote: `(from, version, id, to, bumped)`.
    pub(super) restore: SqlStr,
    pub(super) record: SqlStr,
    /// The updates after a read of distinct entities, one statement: `?1` a JSON array
    /// of `[id, from, to, version]`; the entities moved come back.
    pub(super) update_batch: SqlStr,
    /// The history rows of those, one statement: `?1` a JSON array of `[id, seq, from,
    /// to, event, ref_id, payload_hash, payload, write_id, actor, reason]`.
    pub(super) record_batch: SqlStr,
    /// The outbox row of an edge that emits an event, in the history row's unit:
    /// `(machine, entity_id, version, event, transition, from, to, ref_id)`.
    pub(super) emit: SqlStr,
    history: SqlStr,
    /// A page of an entity's history, newest first: `(order_id, before_seq, limit)`.
    #[cfg(feature = "admin")]
    pub(super) history_page: SqlStr,
    #[cfg(feature = "admin")]
    pub(super) by_ref: SqlStr,
    #[cfg(feature = "admin")]
    pub(super) by_ref_prefix: SqlStr,
    #[cfg(feature = "admin")]
    pub(super) by_status: SqlStr,
    /// The statements of a unit of several requests, whose text depends on its size.
    pub(super) units: super::units::UnitStatements,
}

impl Sql {
    pub(super) fn new(tables: &Tables, names: &Names) -> Self {
        let x = &names.outbox;
        let (o, h) = tables.quoted('"', names);
        let sql = |s: String| AssertSqlSafe(s).into_sql_str();
        Sql {
            units: super::units::UnitStatements::new(&o, &h, x),
            insert_order: sql(format!(
                "INSERT INTO {o} (id, status, version) SELECT ?1, ?2, 0 \
                 WHERE NOT EXISTS (SELECT 1 FROM {o} WHERE id = ?1) ON CONFLICT (id) DO NOTHING"
            )),
            get: sql(format!("SELECT status, version FROM {o} WHERE id = ?1")),
            observe: sql(format!(
                "SELECT o.status, o.version, h.from_status, h.to_status, h.payload_hash, h.seq, h.write_id \
                 FROM {o} AS o \
                 LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = ?2 AND h.ref_id = ?3 \
                 WHERE o.id = ?1"
            )),
            prior: sql(format!(
                "SELECT from_status, to_status, payload_hash, seq, write_id FROM {h} \
                 WHERE order_id = ?1 AND event = ?2 AND ref_id = ?3"
            )),
            latest_ref: sql(format!(
                "SELECT ref_id FROM {h} WHERE order_id = ?1 AND event = ?2 ORDER BY seq DESC LIMIT 1"
            )),
            bump: sql(format!(
                "UPDATE {o} SET status = ?1, version = version + 1 \
                 WHERE id = ?2 AND status = ?3 AND version BETWEEN 0 AND 9223372036854775806 RETURNING version"
            )),
            update: sql(format!(
                "UPDATE {o} SET status = ?1, version = version + 1 \
                 WHERE id = ?2 AND status = ?3 AND version = ?4"
            )),
            restore: sql(format!(
                "UPDATE {o} SET status = ?1, version = ?2 WHERE id = ?3 AND status = ?4 AND version = ?5"
            )),
            record: sql(format!(
                "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id, actor, reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            )),
            update_batch: sql(format!(
                "UPDATE {o} SET status = r.t, version = version + 1 \
                 FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS f, \
                              json_extract(value, '$[2]') AS t, json_extract(value, '$[3]') AS v \
                       FROM json_each(?1)) AS r \
                 WHERE {o}.id = r.id AND {o}.status = r.f AND {o}.version = r.v RETURNING id"
            )),
            record_batch: sql(format!(
                "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id, actor, reason) \
                 SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), \
                        json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), \
                        json_extract(value, '$[6]'), json_extract(value, '$[7]'), json_extract(value, '$[8]'), \
                        json_extract(value, '$[9]'), json_extract(value, '$[10]') \
                 FROM json_each(?1)"
            )),
            emit: sql(format!(
                "INSERT INTO {x} (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, traceparent, tracestate) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            )),
            history: sql(format!(
                "SELECT seq, from_status, to_status, event, ref_id, payload_hash, payload, actor, reason, created_at \
                 FROM {h} WHERE order_id = ?1 ORDER BY seq"
            )),
            #[cfg(feature = "admin")]
            history_page: sql(format!(
                "SELECT seq, from_status, to_status, event, ref_id, payload_hash, payload, actor, reason, created_at \
                 FROM {h} WHERE order_id = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3"
            )),
            #[cfg(feature = "admin")]
            by_status: sql(format!(
                "SELECT status, COUNT(*) FROM {o} GROUP BY status ORDER BY status"
            )),
            #[cfg(feature = "admin")]
            by_ref: sql(format!(
                "SELECT order_id, seq, from_status, to_status, event FROM {h} \
                 WHERE ref_id = ?1 ORDER BY order_id, seq LIMIT ?2"
            )),
            #[cfg(feature = "admin")]
            by_ref_prefix: sql(format!(
                "SELECT order_id, seq, from_status, to_status, event FROM {h} \
                 WHERE instr(ref_id, ?1) = 1 ORDER BY order_id, seq LIMIT ?2"
            )),
        }
    }
}

/// The most requests an apply-first unit carries in one call to the connection's worker
/// thread (see `SqliteStore::unit_in_one_call`). Measured on the bench machine: one call
/// doubles a lone caller's rate, but at 32 callers, with units of about 25 requests, its
/// statements (the requests' table in each, joins where the unit of several calls binds
/// plain rows) made the engine a third slower than four calls per unit.
const ONE_CALL_MAX: usize = 4;

impl Store for SqliteStore {
    async fn arm_timers(
        &self,
        conn: &mut SqliteConnection,
        arm: &crate::timer::Arm<'_>,
    ) -> Result<(), sqlx::Error> {
        crate::backend::timer_sql::arm::<sqlx::Sqlite>(
            conn,
            super::timers::STATEMENTS.get(self.names()),
            arm,
        )
        .await
    }

    type Conn = SqliteConnection;
    type Pooled = sqlx::pool::PoolConnection<Sqlite>;

    /// 1/4. Tried first, a replay takes the write lock (`BEGIN IMMEDIATE`), waiting behind
    /// every writer, for an update that changes nothing; read first, a new request costs
    /// one read more, which in-process is cheap.
    const BACKEND: &'static str = "sqlite";
    const READ_FIRST_FROM: u32 = 256;
    const BATCHES_WRITES: bool = true;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    async fn run_sql(&self, conn: &mut Self::Conn, sql: String) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .map(|_| ())
    }

    async fn write_turn(&self) -> Option<crate::store::WriteTurn> {
        crate::store::WriteTurn::take(&self.writers, super::BUSY_TIMEOUT).await
    }

    fn discard(conn: Self::Pooled) {
        // Detached and dropped: the connection is closed, and whatever it held open is
        // rolled back.
        drop(conn.detach());
    }

    fn classify(err: &sqlx::Error) -> ErrorClass {
        super::errors::classify(err)
    }

    fn writes_unpooled(&self) -> bool {
        self.writer
            .get()
            .is_some_and(|w| w.as_ref().is_some_and(super::writer::Writer::alive))
    }

    /// On the store's writer: one hand-off to its thread and one back.
    async fn apply_first_unpooled(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Unpooled, sqlx::Error> {
        if !requests.iter().any(Request::has_one_edge) {
            return Ok(Unpooled::Written(vec![
                FirstWrite::NotTried;
                requests.len()
            ]));
        }
        let writer = self.writer.get().and_then(Option::as_ref);
        match writer.filter(|w| w.alive()) {
            Some(writer) if crate::backend::distinct_entities(requests) => Ok(writer
                .write_unit(std::sync::Arc::clone(&self.transitions), requests)
                .await?
                .map_or(Unpooled::KeyMet, Unpooled::Written)),
            _ => Ok(Unpooled::NoWriter),
        }
    }

    /// The floor's statements for one request: `BEGIN IMMEDIATE`; the update guarded by the
    /// status, returning the new version; the history insert; `COMMIT`. For several of
    /// distinct entities, one `BEGIN IMMEDIATE`, one update for all, one multi-row
    /// history insert (and one of outbox rows), one `COMMIT`; if a row meets a unique
    /// key, that is undone and each request goes in a savepoint of its own. Events with
    /// several source states are not tried: the recorded `from` would need the matched
    /// row.
    async fn apply_first(
        &self,
        conn: &mut SqliteConnection,
        requests: &[Request<'_>],
    ) -> Result<Vec<FirstWrite>, sqlx::Error> {
        if !requests.iter().any(Request::has_one_edge) {
            return Ok(vec![FirstWrite::NotTried; requests.len()]);
        }
        let distinct = crate::backend::distinct_entities(requests);
        // On the store's writer, a unit is one hand-off whatever its size.
        if distinct && let Some(writer) = self.writer(conn).await? {
            match writer
                .write_unit(std::sync::Arc::clone(&self.transitions), requests)
                .await?
            {
                Some(written) => return Ok(written),
                // A row met a unique key: nothing written; one request at a time below.
                None => {
                    let tx = Self::begin(conn, Txn::Own).await?;
                    return self.first_writes_one_by_one(tx, requests).await;
                }
            }
        }
        // Through the pool, a few requests go in one call to the connection's worker
        // thread; more go statement by statement, where each call carries enough
        // requests that the calls cost less than the one call's heavier statements.
        if requests.len() <= ONE_CALL_MAX
            && distinct
            && let Some(written) = self.unit_in_one_call(conn, requests).await?
        {
            return Ok(written);
        }
        let mut tx = Self::begin(conn, Txn::Own).await?;
        if requests.len() > 1 && distinct {
            match self.first_writes(&mut tx, requests).await {
                Ok(Some(written)) => return end_unit(tx, written).await,
                // A row met a unique key: undone, and written one request at a time.
                Ok(None) => {
                    tx.rollback().await?;
                    tx = Self::begin(conn, Txn::Own).await?;
                }
                Err(e) => return undo(tx, e).await,
            }
        }
        self.first_writes_one_by_one(tx, requests).await
    }

    async fn observe(
        &self,
        conn: &mut SqliteConnection,
        key: Key<'_>,
        _txn: Txn,
    ) -> Result<Option<Observed>, sqlx::Error> {
        let row: Option<ObservedRow> = sqlx::query_as(self.transitions.observe.clone())
            .bind(key.order_id)
            .bind(key.event)
            .bind(key.ref_id)
            .fetch_optional(conn)
            .await?;
        Ok(row.map(Observed::from))
    }

    /// One statement: the unit holds the only write lock, so the entity and its history
    /// row read together are as last committed.
    async fn lock_observe(
        &self,
        conn: &mut SqliteConnection,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<(Option<Entity>, Option<Prior>), sqlx::Error> {
        Ok(match self.observe(&mut *conn, key, txn).await? {
            Some(observed) => (Some(observed.entity), observed.prior),
            // A request recorded for an entity that is gone is still a replay.
            None => (None, self.prior(conn, key, txn).await?),
        })
    }

    async fn apply_first_in(
        &self,
        conn: &mut SqliteConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        self.first_write_in_place(conn, request).await
    }

    async fn apply(
        &self,
        conn: &mut SqliteConnection,
        a: &Apply<'_>,
        txn: Txn,
    ) -> Result<Written, sqlx::Error> {
        self.apply_in(Self::begin(conn, txn).await?, a).await
    }

    async fn apply_in_batch(
        &self,
        conn: &mut SqliteConnection,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        self.apply_in_batch_place(conn, a).await
    }

    async fn apply_many_in_batch(
        &self,
        conn: &mut SqliteConnection,
        applies: &[Apply<'_>],
    ) -> Result<Vec<Written>, sqlx::Error> {
        if !crate::backend::one_statement_batch(applies) {
            return crate::store::apply_each_in_batch(self, conn, applies).await;
        }
        super::batch::apply_batch(self, conn, applies).await
    }

    async fn apply_in_unit(
        &self,
        conn: &mut SqliteConnection,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        self.apply_in_place(conn, a).await
    }

    async fn latest_ref(
        &self,
        conn: &mut SqliteConnection,
        key: Key<'_>,
        _txn: Txn,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(self.transitions.latest_ref.clone())
            .bind(key.order_id)
            .bind(key.event)
            .fetch_optional(conn)
            .await
    }

    async fn prior(
        &self,
        conn: &mut SqliteConnection,
        key: Key<'_>,
        _txn: Txn,
    ) -> Result<Option<Prior>, sqlx::Error> {
        sqlx::query_as(self.transitions.prior.clone())
            .bind(key.order_id)
            .bind(key.event)
            .bind(key.ref_id)
            .fetch_optional(conn)
            .await
    }

    async fn create(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
        initial: &'static str,
        _txn: Txn,
    ) -> Result<Entity, sqlx::Error> {
        sqlx::query(self.transitions.insert_order.clone())
            .bind(order_id)
            .bind(initial)
            .execute(&mut *conn)
            .await?;
        sqlx::query_as(self.transitions.get.clone())
            .bind(order_id)
            .fetch_one(conn)
            .await
    }

    async fn begin_rules_unit(
        &self,
        conn: &mut SqliteConnection,
        txn: Txn,
    ) -> Result<usize, sqlx::Error> {
        crate::backend::units::begin_rules_unit::<sqlx::Sqlite>(
            conn,
            txn,
            Some("BEGIN IMMEDIATE"),
            false,
        )
        .await
    }

    async fn end_rules_unit(
        &self,
        conn: &mut SqliteConnection,
        commit: bool,
        depth: usize,
    ) -> Result<(), sqlx::Error> {
        crate::backend::units::end_rules_unit::<sqlx::Sqlite>(conn, commit, depth).await
    }

    fn abandon_rules_unit(&self, conn: &mut SqliteConnection, depth: usize) {
        crate::backend::units::abandon_rules_unit::<sqlx::Sqlite>(conn, depth);
    }

    fn abandon_ending_unit(&self, conn: &mut SqliteConnection, depth: usize) {
        super::units::abandon_ending_unit(conn, depth);
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
    ) -> Result<Option<Entity>, sqlx::Error> {
        sqlx::query_as(self.transitions.get.clone())
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn history(
        &self,
        conn: &mut SqliteConnection,
        order_id: i64,
    ) -> Result<Vec<RawTransition>, sqlx::Error> {
        sqlx::query_as(self.transitions.history.clone())
            .bind(order_id)
            .fetch_all(conn)
            .await
    }
}
