//! The transition layer on PostgreSQL: its SQL, and the [`Store`] operations over it.
//!
//! READ COMMITTED: every statement sees the latest commits, also inside a caller's
//! transaction, so no read needs a locking variant. Casts keep the decoded types fixed
//! when a user's table uses `VARCHAR` or `INTEGER`.

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr};

use super::PgStore;
use crate::store::{
    Apply, BATCH_READ_MAX, BatchReads, Entity, ErrorClass, FirstWrite, Key, Observed, ObservedRow,
    OwnedKey, PositionedPrior, Prior, RawTransition, Request, Store, Tables, Txn, Written,
    in_place, is_unique_violation,
};

/// Every statement of the layer, for one pair of tables.
#[derive(Debug)]
pub(super) struct Sql {
    insert_order: SqlStr,
    get: SqlStr,
    observe: SqlStr,
    prior: SqlStr,
    latest_ref: SqlStr,
    /// The apply-first unit for an event with one source state (scalar parameters, the
    /// common case) and for any other number (arrays).
    apply_first_one: SqlStr,
    apply_first_many: SqlStr,
    /// The same, for a request whose edges emit events: the outbox row in the same
    /// statement.
    apply_first_one_emitting: SqlStr,
    apply_first_many_emitting: SqlStr,
    /// The apply-first unit inside a caller's transaction, for a request whose edges
    /// emit nothing: a request recorded before inserts and updates nothing, with no
    /// error, so the unit needs no savepoint.
    apply_first_in_one: SqlStr,
    apply_first_in_many: SqlStr,
    /// The apply-first unit for a batch of requests of distinct entities, one statement
    /// (arrays), without and with outbox rows.
    apply_first_batch: SqlStr,
    apply_first_batch_emitting: SqlStr,
    apply: SqlStr,
    apply_emitting: SqlStr,
    history: SqlStr,
    batch_reads: BatchReads,
}

/// The columns of a history row that [`Prior`] decodes.
const PRIOR_COLUMNS: &str = "from_status::text AS from_status, to_status::text AS to_status, \
                             payload_hash::text AS payload_hash, seq::bigint AS seq";

impl Sql {
    pub(super) fn new(tables: &Tables) -> Self {
        let (o, h) = tables.quoted('"');
        let sql = |s: String| AssertSqlSafe(s).into_sql_str();
        // The apply-first unit, one statement and one round trip: move the entity along
        // the event's edge from its current state and record the history row. No read
        // before and no version predicate: under READ COMMITTED an UPDATE evaluates its
        // predicate on the latest committed version of the row it locks (re-checking it
        // if a rival committed after the statement's snapshot), so the status is judged
        // on the very row it changes, and a concurrent move makes it update nothing. A
        // request recorded before (a replay, even at a state the entity came back to, or
        // a twin that committed first) is stopped by the unique key of the history
        // insert, which aborts the whole statement. A version below 0 or at
        // the largest (which has no next) leaves a corrupt row
        // alone for the judge to report.
        let apply_first = |edge: &str, edge_cond: &str| {
            sql(format!(
                "WITH upd AS ( \
                   UPDATE {o} AS o SET status = e.t, version = o.version + 1 \
                   FROM {edge} AS e(f, t) \
                   WHERE o.id = $1 AND {edge_cond} AND o.version BETWEEN 0 AND 9223372036854775806 \
                   RETURNING o.version::bigint AS seq, e.f, e.t \
                 ) \
                 INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id) \
                 SELECT $1, seq, f, t, $2, $3, $4, $5::jsonb, $8 FROM upd \
                 RETURNING {PRIOR_COLUMNS}"
            ))
        };
        // The emitting variants: one more data-modifying CTE, the outbox row of the edge
        // that moved (`$9`, the edges' events, parallel to `$6`/`$7`; `$10` the machine;
        // `$11` the request's own event body).
        // All of a statement's CTEs run, and a twin's unique violation aborts them all.
        let apply_first_emitting = |edge: &str, edge_cond: &str| {
            sql(format!(
                "WITH upd AS ( \
                   UPDATE {o} AS o SET status = e.t, version = o.version + 1 \
                   FROM {edge} AS e(f, t, x) \
                   WHERE o.id = $1 AND {edge_cond} AND o.version BETWEEN 0 AND 9223372036854775806 \
                   RETURNING o.version::bigint AS seq, e.f, e.t, e.x \
                 ), emitted AS ( \
                   INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body) \
                   SELECT $10, $1, seq, x, $2, f, t, $3, $11 FROM upd WHERE x IS NOT NULL \
                 ) \
                 INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id) \
                 SELECT $1, seq, f, t, $2, $3, $4, $5::jsonb, $8 FROM upd \
                 RETURNING {PRIOR_COLUMNS}"
            ))
        };
        // The same inside a caller's transaction, where an error would abort the
        // caller's transaction: the entity's row locked at its latest version if it is
        // at a source state of the event (under READ COMMITTED a row lock waits for a
        // rival and re-checks the predicate on the row it committed); its history row
        // inserted unless the request is recorded (a twin's row committed before stops
        // it without an error); the entity moved only if the history row went in. A
        // request recorded before changes nothing and returns nothing.
        let apply_first_in = |edge: &str, edge_cond: &str| {
            sql(format!(
                "WITH cur AS ( \
                   SELECT o.version + 1 AS seq, e.f, e.t FROM {o} AS o, {edge} AS e(f, t) \
                   WHERE o.id = $1 AND {edge_cond} AND o.version BETWEEN 0 AND 9223372036854775806 \
                   FOR UPDATE OF o \
                 ), ins AS ( \
                   INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id) \
                   SELECT $1, seq, f, t, $2, $3, $4, $5::jsonb, $8 FROM cur \
                   ON CONFLICT (order_id, event, ref_id) DO NOTHING \
                   RETURNING {PRIOR_COLUMNS} \
                 ), upd AS ( \
                   UPDATE {o} AS o SET status = ins.to_status, version = ins.seq \
                   FROM ins WHERE o.id = $1 \
                   RETURNING o.version \
                 ) \
                 SELECT ins.* FROM ins JOIN upd ON upd.version = ins.seq"
            ))
        };
        // The apply-first unit for a batch, one statement: the requests (`$1`..`$7`,
        // parallel arrays, one request per entity) and their edges (`$8`..`$11`, by
        // entity), the update of every entity whose status is one of its request's
        // sources and whose request is not recorded yet, and the history rows of those
        // that moved (each returned with its entity, which names its request). A twin
        // recorded after the statement's snapshot still meets the unique key, which
        // aborts the whole statement: the store then writes the batch one request at a
        // time. The emitting variant adds the outbox rows (`$12`, the machine).
        let batch = |emitting: bool| {
            let emitted = if emitting {
                "emitted AS (                    INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body)                    SELECT $12, u.id, u.seq, u.x, r.event, u.f, u.t, r.ref_id, r.body                    FROM upd AS u JOIN r ON r.order_id = u.id WHERE u.x IS NOT NULL                  ), "
            } else {
                ""
            };
            sql(format!(
                "WITH r AS (                    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[])                      AS r(order_id, event, ref_id, payload_hash, payload, write_id, body)                  ), upd AS (                    UPDATE {o} AS o SET status = e.t, version = o.version + 1                    FROM r JOIN unnest($8::bigint[], $9::text[], $10::text[], $11::text[]) AS e(order_id, f, t, x)                      ON e.order_id = r.order_id                    WHERE o.id = r.order_id AND o.status = e.f                      AND o.version BETWEEN 0 AND 9223372036854775806                      AND NOT EXISTS (SELECT 1 FROM {h} AS h                                      WHERE h.order_id = r.order_id AND h.event = r.event AND h.ref_id = r.ref_id)                    RETURNING o.id, o.version::bigint AS seq, e.f, e.t, e.x                  ), {emitted}ins AS (                    INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id)                    SELECT u.id, u.seq, u.f, u.t, r.event, r.ref_id, r.payload_hash, r.payload::jsonb, r.write_id                    FROM upd AS u JOIN r ON r.order_id = u.id                    RETURNING order_id, seq                  )                  SELECT ins.order_id::bigint AS i, u.f::text AS from_status, u.t::text AS to_status,                         NULL::text AS payload_hash, ins.seq::bigint AS seq                  FROM ins JOIN upd AS u ON u.id = ins.order_id"
            ))
        };
        Sql {
            apply_first_batch: batch(false),
            apply_first_batch_emitting: batch(true),
            insert_order: sql(format!(
                "INSERT INTO {o} (id, status, version) VALUES ($1, $2, 0) ON CONFLICT (id) DO NOTHING"
            )),
            get: sql(format!(
                "SELECT status::text AS status, version::bigint AS version FROM {o} WHERE id = $1"
            )),
            observe: sql(format!(
                "SELECT o.status::text AS status, o.version::bigint AS version, \
                        h.from_status::text AS from_status, h.to_status::text AS to_status, \
                        h.payload_hash::text AS payload_hash, h.seq::bigint AS seq, h.write_id \
                 FROM {o} AS o \
                 LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = $2 AND h.ref_id = $3 \
                 WHERE o.id = $1"
            )),
            prior: sql(format!(
                "SELECT {PRIOR_COLUMNS}, write_id FROM {h} WHERE order_id = $1 AND event = $2 AND ref_id = $3"
            )),
            latest_ref: sql(format!(
                "SELECT ref_id::text FROM {h} WHERE order_id = $1 AND event = $2 ORDER BY seq DESC LIMIT 1"
            )),
            apply_first_one: apply_first("(SELECT $6::text, $7::text)", "o.status = $6"),
            apply_first_many: apply_first("unnest($6::text[], $7::text[])", "o.status = e.f"),
            apply_first_one_emitting: apply_first_emitting(
                "(SELECT $6::text, $7::text, $9::text)",
                "o.status = $6",
            ),
            apply_first_in_one: apply_first_in("(SELECT $6::text, $7::text)", "o.status = $6"),
            apply_first_in_many: apply_first_in("unnest($6::text[], $7::text[])", "o.status = e.f"),
            apply_first_many_emitting: apply_first_emitting(
                "unnest($6::text[], $7::text[], $9::text[])",
                "o.status = e.f",
            ),
            apply_emitting: sql(format!(
                "WITH upd AS ( \
                   UPDATE {o} SET status = $1, version = version + 1 \
                   WHERE id = $2 AND status = $3 AND version = $4 RETURNING id \
                 ), ins AS ( \
                   INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id) \
                   SELECT $2, $4::bigint + 1, $3, $1, $5, $6, $7, $8::jsonb, $9 FROM upd RETURNING seq \
                 ) \
                 INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body) \
                 SELECT $10, $2, seq, $11, $5, $3, $1, $6, $12 FROM ins"
            )),
            // The write after a read, one statement: the update guarded by the status and
            // version that were read, feeding the history insert.
            apply: sql(format!(
                "WITH upd AS ( \
                   UPDATE {o} SET status = $1, version = version + 1 \
                   WHERE id = $2 AND status = $3 AND version = $4 RETURNING id \
                 ) \
                 INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id) \
                 SELECT $2, $4::bigint + 1, $3, $1, $5, $6, $7, $8::jsonb, $9 FROM upd"
            )),
            history: sql(format!(
                "SELECT seq::bigint AS seq, from_status::text AS from_status, to_status::text AS to_status, \
                        event::text AS event, ref_id::text AS ref_id, payload_hash::text AS payload_hash, \
                        payload::text AS payload, created_at \
                 FROM {h} WHERE order_id = $1 ORDER BY seq"
            )),
            batch_reads: BatchReads::new(|n| priors_sql(&h, n)),
        }
    }
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
        "SELECT q.i, h.from_status::text AS from_status, h.to_status::text AS to_status, \
                h.payload_hash::text AS payload_hash, h.seq::bigint AS seq, h.write_id \
         FROM (VALUES {}) AS q(order_id, event, ref_id, i) \
         JOIN {h} AS h ON h.order_id = q.order_id AND h.event = q.event AND h.ref_id = q.ref_id",
        rows.join(", ")
    )
}

impl PgStore {
    /// The apply-first statement for one request; a request recorded before comes back
    /// as the unique violation it is.
    async fn first_write(
        &self,
        conn: &mut PgConnection,
        request: &Request<'_>,
        txn: Txn,
    ) -> Result<FirstWrite, sqlx::Error> {
        let sql = &self.transitions;
        let key = request.key;
        let emitting = request.emits_any();
        let query = match (request.from_states, request.to_states) {
            ([from], [to]) => {
                let statement = match (emitting, txn) {
                    (true, _) => &sql.apply_first_one_emitting,
                    (false, Txn::Own) => &sql.apply_first_one,
                    (false, Txn::Caller) => &sql.apply_first_in_one,
                };
                let query = sqlx::query_as(statement.clone())
                    .bind(key.order_id)
                    .bind(key.event)
                    .bind(key.ref_id)
                    .bind(request.payload_hash)
                    .bind(request.payload)
                    .bind(*from)
                    .bind(*to)
                    .bind(request.write_id);
                if emitting {
                    query
                        .bind(request.emits.first().copied().flatten())
                        .bind(request.machine)
                        .bind(request.event_body)
                } else {
                    query
                }
            }
            (from, to) => {
                let statement = match (emitting, txn) {
                    (true, _) => &sql.apply_first_many_emitting,
                    (false, Txn::Own) => &sql.apply_first_many,
                    (false, Txn::Caller) => &sql.apply_first_in_many,
                };
                let query = sqlx::query_as(statement.clone())
                    .bind(key.order_id)
                    .bind(key.event)
                    .bind(key.ref_id)
                    .bind(request.payload_hash)
                    .bind(request.payload)
                    .bind(from)
                    .bind(to)
                    .bind(request.write_id);
                if emitting {
                    query
                        .bind(request.emits)
                        .bind(request.machine)
                        .bind(request.event_body)
                } else {
                    query
                }
            }
        };
        Ok(match query.fetch_optional(conn).await? {
            Some(Prior { seq, from, to, .. }) => FirstWrite::Applied {
                from,
                to,
                version: seq,
            },
            None => FirstWrite::NotApplied,
        })
    }
}

impl PgStore {
    /// The apply-first unit for requests of distinct entities, one statement; `None` if
    /// one of them met the history's or the outbox's unique key (the statement was
    /// undone as a whole).
    async fn first_writes(
        &self,
        conn: &mut PgConnection,
        requests: &[Request<'_>],
    ) -> Result<Option<Vec<FirstWrite>>, sqlx::Error> {
        let sql = &self.transitions;
        let emitting = requests.iter().any(Request::emits_any);
        let statement = if emitting {
            &sql.apply_first_batch_emitting
        } else {
            &sql.apply_first_batch
        };
        let mut edges = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in requests {
            for (i, (from, to)) in r.from_states.iter().zip(r.to_states).enumerate() {
                edges.0.push(r.key.order_id);
                edges.1.push(*from);
                edges.2.push(*to);
                edges.3.push(r.emits.get(i).copied().flatten());
            }
        }
        let query = sqlx::query_as::<_, PositionedPrior>(statement.clone())
            .bind(
                requests
                    .iter()
                    .map(|r| r.key.order_id)
                    .collect::<Vec<i64>>(),
            )
            .bind(requests.iter().map(|r| r.key.event).collect::<Vec<&str>>())
            .bind(requests.iter().map(|r| r.key.ref_id).collect::<Vec<&str>>())
            .bind(requests.iter().map(|r| r.payload_hash).collect::<Vec<_>>())
            .bind(requests.iter().map(|r| r.payload).collect::<Vec<_>>())
            .bind(requests.iter().map(|r| r.write_id).collect::<Vec<i64>>())
            .bind(requests.iter().map(|r| r.event_body).collect::<Vec<_>>())
            .bind(edges.0)
            .bind(edges.1)
            .bind(edges.2)
            .bind(edges.3);
        let query = if emitting {
            query.bind(requests.first().map(|r| r.machine))
        } else {
            query
        };
        let rows = match query.fetch_all(conn).await {
            Ok(rows) => rows,
            Err(e) if is_outbox_taken(&e) || is_unique_violation(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut written = vec![FirstWrite::NotApplied; requests.len()];
        for row in rows {
            // The row's position is its entity, which names one request of the batch.
            if let Some(i) = requests.iter().position(|r| r.key.order_id == row.i) {
                written[i] = FirstWrite::Applied {
                    from: row.prior.from,
                    to: row.prior.to,
                    version: row.prior.seq,
                };
            }
        }
        Ok(Some(written))
    }
}

impl Store for PgStore {
    type Conn = PgConnection;
    type Pooled = sqlx::pool::PoolConnection<Postgres>;

    /// 3/8. Tried first, a replay costs the statement (which writes nothing, so commits
    /// nothing) and then the read, about 2.5 reads of server CPU; read first, a new
    /// request costs one read more. Reading first pays from about 2/5.
    const BACKEND: &'static str = "postgres";
    const READ_FIRST_FROM: u32 = 384;
    const BATCH_READ_MAX: usize = BATCH_READ_MAX;
    const BATCHES_WRITES: bool = true;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    fn discard(conn: Self::Pooled) {
        // Detached, the connection no longer counts against the pool; dropped, its socket
        // closes at once, without a goodbye that could wait on a stream left in the
        // middle of a reply.
        drop(conn.detach());
    }

    fn classify(err: &sqlx::Error) -> ErrorClass {
        super::classify(err)
    }

    /// One statement for one request, any number of source states, atomic on its own.
    /// For several of distinct entities, one statement for all. Otherwise, or if one of
    /// them meets a unique key (a twin, a replay recorded after the statement's
    /// snapshot), one `BEGIN` and one `COMMIT`, each request's statement in a savepoint
    /// of its own.
    async fn apply_first(
        &self,
        conn: &mut PgConnection,
        requests: &[Request<'_>],
    ) -> Result<Vec<FirstWrite>, sqlx::Error> {
        if let [request] = requests {
            return match self.first_write(conn, request, Txn::Own).await {
                Ok(write) => Ok(vec![write]),
                // Recorded before: the statement was undone as a whole.
                Err(e) if is_outbox_taken(&e) => Ok(vec![FirstWrite::OutboxTaken]),
                Err(e) if is_unique_violation(&e) => Ok(vec![FirstWrite::NotApplied]),
                Err(e) => Err(e),
            };
        }
        let distinct = crate::store::distinct_entities(requests);
        let one_machine = requests.windows(2).all(|w| w[0].machine == w[1].machine);
        if distinct
            && one_machine
            && let Some(written) = self.first_writes(conn, requests).await?
        {
            return Ok(written);
        }
        let mut tx = conn.begin().await?;
        let mut written = Vec::with_capacity(requests.len());
        for request in requests {
            let step = async {
                let mut savepoint = (*tx).begin().await?;
                match self.first_write(&mut savepoint, request, Txn::Own).await {
                    Ok(write) => savepoint.commit().await.map(|()| write),
                    Err(e) => {
                        let _ = savepoint.rollback().await;
                        Err(e)
                    }
                }
            };
            match step.await {
                Ok(write) => written.push(write),
                // Recorded before: its savepoint is undone.
                Err(e) if is_outbox_taken(&e) => written.push(FirstWrite::OutboxTaken),
                Err(e) if is_unique_violation(&e) => written.push(FirstWrite::NotApplied),
                Err(e) => {
                    let _ = tx.rollback().await;
                    return Err(e);
                }
            }
        }
        if written
            .iter()
            .any(|w| matches!(w, FirstWrite::Applied { .. }))
        {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(written)
    }

    async fn observe(
        &self,
        conn: &mut PgConnection,
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

    async fn apply_first_in(
        &self,
        conn: &mut PgConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        // A request that emits nothing: one statement, which a request recorded before
        // leaves without an error.
        if !request.emits_any() {
            return self.first_write(conn, request, Txn::Caller).await;
        }
        // One that emits: one statement, in a savepoint so that a twin's unique key (the
        // history's or the outbox's) does not abort the caller's transaction.
        let mut savepoint = conn.begin().await?;
        match self.first_write(&mut savepoint, request, Txn::Caller).await {
            Ok(write) => savepoint.commit().await.map(|()| write),
            Err(e) => {
                savepoint.rollback().await?;
                if is_outbox_taken(&e) {
                    Ok(FirstWrite::OutboxTaken)
                } else if is_unique_violation(&e) {
                    Ok(FirstWrite::NotApplied)
                } else {
                    Err(e)
                }
            }
        }
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        a: &Apply<'_>,
        txn: Txn,
    ) -> Result<Written, sqlx::Error> {
        let sql = &self.transitions;
        let statement = if a.emits.is_some() {
            &sql.apply_emitting
        } else {
            &sql.apply
        };
        let statement = sqlx::query(statement.clone())
            .bind(a.to)
            .bind(a.key.order_id)
            .bind(a.from)
            .bind(a.version)
            .bind(a.key.event)
            .bind(a.key.ref_id)
            .bind(a.payload_hash)
            .bind(a.payload)
            .bind(a.write_id);
        let statement = match a.emits {
            Some(event) => statement.bind(a.machine).bind(event).bind(a.event_body),
            None => statement,
        };
        // One statement is atomic on its own; inside the caller's transaction it runs in a
        // savepoint, so that a twin's unique key does not abort the caller's transaction.
        let outcome = match txn {
            Txn::Own => statement.execute(conn).await,
            Txn::Caller => {
                let mut savepoint = conn.begin().await?;
                match statement.execute(&mut *savepoint).await {
                    Ok(done) => savepoint.commit().await.map(|()| done),
                    Err(e) => {
                        savepoint.rollback().await?;
                        Err(e)
                    }
                }
            }
        };
        match outcome {
            Ok(done) if done.rows_affected() == 1 => Ok(Written::Applied),
            Ok(_) => Ok(Written::Lost),
            Err(e) if is_outbox_taken(&e) => Ok(Written::OutboxTaken),
            Err(e) if is_unique_violation(&e) => Ok(Written::Lost),
            Err(e) => Err(e),
        }
    }

    async fn latest_ref(
        &self,
        conn: &mut PgConnection,
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
        conn: &mut PgConnection,
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

    async fn priors(
        &self,
        conn: &mut PgConnection,
        keys: &[OwnedKey],
    ) -> Result<Vec<Option<Prior>>, sqlx::Error> {
        let (sql, padding) = self.transitions.batch_reads.sql(keys.len());
        let mut query = sqlx::query_as(sql.clone());
        for key in keys {
            query = query.bind(key.order_id).bind(key.event).bind(&key.ref_id);
        }
        for _ in 0..padding {
            query = query
                .bind(None::<i64>)
                .bind(None::<&str>)
                .bind(None::<&str>);
        }
        let rows: Vec<PositionedPrior> = query.fetch_all(conn).await?;
        Ok(in_place(keys.len(), rows))
    }

    async fn create(
        &self,
        conn: &mut PgConnection,
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

    async fn get(
        &self,
        conn: &mut PgConnection,
        order_id: i64,
    ) -> Result<Option<Entity>, sqlx::Error> {
        sqlx::query_as(self.transitions.get.clone())
            .bind(order_id)
            .fetch_optional(conn)
            .await
    }

    async fn history(
        &self,
        conn: &mut PgConnection,
        order_id: i64,
    ) -> Result<Vec<RawTransition>, sqlx::Error> {
        sqlx::query_as(self.transitions.history.clone())
            .bind(order_id)
            .fetch_all(conn)
            .await
    }
}

/// Whether `e` is the outbox's primary key refusing a row: the outbox holds an event of
/// the entity at that version already (its version was reused), not a twin request.
fn is_outbox_taken(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.constraint() == Some("outbox_pkey"))
}
