//! The write units of the transition layer on SQLite through the pool: the apply-first
//! unit of a few requests in one call to the connection's worker thread and the unit of
//! several requests statement by statement, for a store with no writer (`writer.rs`,
//! whose unit runs the latter's statements); and the statements the one-request units of
//! `backend/stepwise.rs` are made of (the update, the history and outbox rows, the
//! restore).

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Connection, Row, Transaction};

use super::SqliteStore;
use crate::backend::Tried;
use crate::backend::errors::is_unique_violation;
use crate::backend::sql::BySize;
use crate::backend::stepwise::Stepwise;
use crate::store::{Apply, FirstWrite, Request, Txn};

impl SqliteStore {
    /// A write unit: `BEGIN IMMEDIATE` on the engine's connection, a savepoint inside the
    /// caller's transaction (which the caller began with `BEGIN IMMEDIATE`).
    pub(super) async fn begin<'c>(
        conn: &'c mut SqliteConnection,
        txn: Txn,
    ) -> Result<Transaction<'c, Sqlite>, sqlx::Error> {
        match txn {
            Txn::Own => conn.begin_with("BEGIN IMMEDIATE").await,
            Txn::Caller => conn.begin().await,
        }
    }

    /// The apply-first writes of requests of distinct entities in an open `BEGIN
    /// IMMEDIATE` transaction, a statement for each kind of row: one update of every
    /// entity whose status is its request's source and whose request is not recorded
    /// (exact: the transaction holds the write lock), returning the new versions; one
    /// insert of their history rows; one of their outbox rows. `None` if a row met a
    /// unique key (the caller undoes the transaction). A request whose event has several
    /// source states is not tried.
    pub(super) async fn first_writes(
        &self,
        conn: &mut SqliteConnection,
        requests: &[Request<'_>],
    ) -> Result<Option<Vec<FirstWrite>>, sqlx::Error> {
        let units = &self.transitions.units;
        let tried = crate::backend::tried(requests);
        let mut written = vec![FirstWrite::NotTried; requests.len()];
        let mut query = sqlx::query_as::<_, (i64, i64)>(units.update.get(tried.len()));
        for (_, r, from, to) in &tried {
            query = query
                .bind(r.key.order_id)
                .bind(*from)
                .bind(*to)
                .bind(r.key.event)
                .bind(r.key.ref_id);
        }
        let moved = query.fetch_all(&mut *conn).await?;
        let moved: Vec<(&Tried<'_, '_>, i64)> = tried
            .iter()
            .filter_map(|t| {
                let version = moved.iter().find(|(id, _)| *id == t.1.key.order_id)?.1;
                Some((t, version))
            })
            .collect();
        for &(i, _, _, _) in &tried {
            written[i] = FirstWrite::NotApplied;
        }
        if moved.is_empty() {
            return Ok(Some(written));
        }
        let mut query = sqlx::query(units.record.get(moved.len()));
        for ((_, r, from, to), version) in &moved {
            query = query
                .bind(r.key.order_id)
                .bind(*version)
                .bind(*from)
                .bind(*to)
                .bind(r.key.event)
                .bind(r.key.ref_id)
                .bind(r.payload_hash)
                .bind(r.payload)
                .bind(r.write_id)
                .bind(r.audit.actor)
                .bind(r.audit.reason);
        }
        match query.execute(&mut *conn).await {
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
        let emitting: Vec<_> = moved
            .iter()
            .filter_map(|(t, version)| Some((t, version, t.1.emits.first().copied().flatten()?)))
            .collect();
        if !emitting.is_empty() {
            let mut query = sqlx::query(units.emit.get(emitting.len()));
            for ((_, r, from, to), version, event) in &emitting {
                query = query
                    .bind(r.machine)
                    .bind(r.key.order_id)
                    .bind(**version)
                    .bind(*event)
                    .bind(r.key.event)
                    .bind(*from)
                    .bind(*to)
                    .bind(r.key.ref_id)
                    .bind(r.event_body)
                    .bind(r.traceparent())
                    .bind(r.tracestate());
            }
            match query.execute(&mut *conn).await {
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        for ((i, _, from, to), version) in moved {
            written[*i] = FirstWrite::Applied {
                from: (*from).to_string(),
                to: (*to).to_string(),
                version,
            };
        }
        Ok(Some(written))
    }
}

impl SqliteStore {
    /// The apply-first writes of requests of distinct entities (`NotTried` for one whose
    /// event has several source states), as a whole unit (from `BEGIN IMMEDIATE` to `COMMIT`) in one call to the
    /// connection's worker thread, where a unit of statements one by one makes a call for
    /// each. `None` if the unit could not be written that way (a row met a unique key, as
    /// a history the graph no longer explains can make it): nothing is left written, and
    /// the caller writes the requests one by one. Any other error is returned, the unit
    /// rolled back.
    pub(super) async fn unit_in_one_call(
        &self,
        conn: &mut SqliteConnection,
        requests: &[Request<'_>],
    ) -> Result<Option<Vec<FirstWrite>>, sqlx::Error> {
        let tried: Vec<(&Request<'_>, &str, &str)> = requests
            .iter()
            .filter_map(|r| match (r.from_states, r.to_states) {
                ([from], [to]) => Some((r, *from, *to)),
                _ => None,
            })
            .collect();
        let mut query = sqlx::query(self.transitions.units.one_call.get(tried.len()));
        for &(r, from, to) in &tried {
            query = query
                .bind(r.key.order_id)
                .bind(from)
                .bind(to)
                .bind(r.key.event)
                .bind(r.key.ref_id)
                .bind(r.payload_hash)
                .bind(r.payload)
                .bind(r.write_id)
                .bind(r.audit.actor)
                .bind(r.audit.reason)
                .bind(r.machine)
                .bind(r.emits.first().copied().flatten())
                .bind(r.event_body)
                .bind(r.traceparent())
                .bind(r.tracestate());
        }
        // The rows are the update's: no other statement of the unit returns any.
        let moved: Vec<(i64, i64)> = match query.fetch_all(&mut *conn).await {
            Ok(rows) => rows
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<_, sqlx::Error>>()?,
            Err(e) => {
                // The unit stopped at a statement after its `BEGIN`, or at its `COMMIT`: undone
                // (a `ROLLBACK` with no transaction open fails, and says nothing).
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return if is_unique_violation(&e) {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
        };
        Ok(Some(
            requests
                .iter()
                .map(|r| {
                    let version = moved.iter().find(|(id, _)| *id == r.key.order_id);
                    match (version, r.from_states, r.to_states) {
                        (Some(&(_, version)), [from], [to]) => FirstWrite::Applied {
                            from: (*from).to_string(),
                            to: (*to).to_string(),
                            version,
                        },
                        (None, [_], [_]) => FirstWrite::NotApplied,
                        // Several source states: the recorded `from` would need the row.
                        _ => FirstWrite::NotTried,
                    }
                })
                .collect(),
        ))
    }
}

impl Stepwise for SqliteStore {
    type Db = Sqlite;

    async fn bump(
        &self,
        conn: &mut SqliteConnection,
        id: i64,
        from: &str,
        to: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(self.transitions.bump.clone())
            .bind(to)
            .bind(id)
            .bind(from)
            .fetch_optional(&mut *conn)
            .await
    }

    async fn record(
        &self,
        conn: &mut SqliteConnection,
        a: &Apply<'_>,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query(self.transitions.record.clone())
            .bind(a.key.order_id)
            .bind(a.version + 1)
            .bind(a.from)
            .bind(a.to)
            .bind(a.key.event)
            .bind(a.key.ref_id)
            .bind(a.payload_hash)
            .bind(a.payload)
            .bind(a.write_id)
            .bind(a.audit.actor)
            .bind(a.audit.reason)
            .execute(&mut *conn)
            .await?;
        if let Some(event) = a.emits {
            let emitted = sqlx::query(self.transitions.emit.clone())
                .bind(a.machine)
                .bind(a.key.order_id)
                .bind(a.version + 1)
                .bind(event)
                .bind(a.key.event)
                .bind(a.from)
                .bind(a.to)
                .bind(a.key.ref_id)
                .bind(a.event_body)
                .bind(a.traceparent())
                .bind(a.tracestate())
                .execute(conn)
                .await;
            // The statement's own unique key is the outbox's: the row is there already.
            return match emitted {
                Ok(_) => Ok(true),
                Err(e) if is_unique_violation(&e) => Ok(false),
                Err(e) => Err(e),
            };
        }
        Ok(true)
    }

    async fn restore(
        &self,
        conn: &mut SqliteConnection,
        id: i64,
        from: &str,
        to: &str,
        version: i64,
    ) -> Result<u64, sqlx::Error> {
        let restored = sqlx::query(self.transitions.restore.clone())
            .bind(from)
            .bind(version - 1)
            .bind(id)
            .bind(to)
            .bind(version)
            .execute(conn)
            .await?;
        Ok(restored.rows_affected())
    }

    async fn update(&self, conn: &mut SqliteConnection, a: &Apply<'_>) -> Result<u64, sqlx::Error> {
        let updated = sqlx::query(self.transitions.update.clone())
            .bind(a.to)
            .bind(a.key.order_id)
            .bind(a.from)
            .bind(a.version)
            .execute(conn)
            .await?;
        Ok(updated.rows_affected())
    }
}

/// The statements of a unit of several requests, sized by the requests they carry, built
/// once per size.
#[derive(Debug)]
pub(super) struct UnitStatements {
    /// Every tried entity at its request's source state, its request not recorded, moved
    /// on: `(order_id, from, to, event, ref_id)` per request; returns `(id, version)`.
    pub(super) update: BySize,
    /// The history rows of the entities moved, 11 values each.
    pub(super) record: BySize,
    /// The outbox rows of those whose edge emits, 11 values each.
    pub(super) emit: BySize,
    /// The whole unit in one call (see [`SqliteStore::unit_in_one_call`]), 15 values per
    /// request.
    one_call: BySize,
}

impl UnitStatements {
    /// The statements over the entity table `o` and the history table `h` (quoted).
    pub(super) fn new(o: &str, h: &str, x: &str) -> Self {
        let (uo, uh, rh) = (o.to_string(), h.to_string(), h.to_string());
        let (co, ch, cx, ex) = (o.to_string(), h.to_string(), x.to_string(), x.to_string());
        UnitStatements {
            one_call: BySize::new(move |n| one_call_sql(&co, &ch, &cx, n)),
            update: BySize::new(move |n| {
                let (o, h) = (&uo, &uh);
                format!(
                    "WITH r(order_id, f, t, event, ref_id) AS (VALUES {values}) \
                     UPDATE {o} SET status = r.t, version = {o}.version + 1 FROM r \
                     WHERE {o}.id = r.order_id AND {o}.status = r.f \
                       AND {o}.version BETWEEN 0 AND 9223372036854775806 \
                       AND NOT EXISTS (SELECT 1 FROM {h} AS h \
                                       WHERE h.order_id = r.order_id AND h.event = r.event AND h.ref_id = r.ref_id) \
                     RETURNING id, version",
                    values = placeholders(n, 5)
                )
            }),
            record: BySize::new(move |n| {
                format!(
                    "INSERT INTO {rh} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id, actor, reason) \
                     VALUES {}",
                    placeholders(n, 11)
                )
            }),
            emit: BySize::new(move |n| {
                format!(
                    "INSERT INTO {ex} (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, traceparent, tracestate) \
                     VALUES {}",
                    placeholders(n, 11)
                )
            }),
        }
    }
}

/// The text of a unit in one call of `n` requests over the entity table `o` and the
/// history table `h`: `BEGIN IMMEDIATE`; the history rows of the requests whose entity
/// is at their source state and which are not recorded; the outbox rows of those whose
/// edge emits; the entities whose history row this unit wrote (found by its write id at
/// the next sequence number, which no other row can hold), moved on, returning
/// `(id, version)`; `COMMIT`. The unit holds the only write lock from its first
/// statement, so each statement sees exactly what the one before it wrote. Each request
/// binds 15 values: order id, source, target, event, reference, payload hash, payload,
/// write id, actor, reason, machine, the event its edge emits (`NULL`: none), the event
/// body, the trace context's `traceparent` and `tracestate`. Every statement names all
/// of them, numbered in order, in the same table of requests: sqlx binds the numbers a
/// statement skips as plain positional parameters from a running count, and stops
/// binding at the first past the values, so a statement that named only its share would
/// leave the parameters after a gap unbound (`NULL`).
fn one_call_sql(o: &str, h: &str, x: &str, n: usize) -> String {
    let r = format!(
        "WITH r(order_id, f, t, event, ref_id, ph, p, wid, actor, reason, machine, emits, body, tp, ts) \
         AS (VALUES {})",
        placeholders(n, 15)
    );
    format!(
        "BEGIN IMMEDIATE; \
         {r} INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id, actor, reason) \
         SELECT r.order_id, {o}.version + 1, r.f, r.t, r.event, r.ref_id, r.ph, r.p, r.wid, r.actor, r.reason \
         FROM r JOIN {o} ON {o}.id = r.order_id \
         WHERE {o}.status = r.f AND {o}.version BETWEEN 0 AND 9223372036854775806 \
           AND NOT EXISTS (SELECT 1 FROM {h} AS x \
                           WHERE x.order_id = r.order_id AND x.event = r.event AND x.ref_id = r.ref_id); \
         {r} INSERT INTO {x} (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, traceparent, tracestate) \
         SELECT r.machine, r.order_id, x.seq, r.emits, x.event, x.from_status, x.to_status, x.ref_id, r.body, r.tp, r.ts \
         FROM r JOIN {o} ON {o}.id = r.order_id \
         JOIN {h} AS x ON x.order_id = r.order_id AND x.seq = {o}.version + 1 AND x.write_id = r.wid \
         WHERE r.emits IS NOT NULL; \
         {r} UPDATE {o} SET status = r.t, version = {o}.version + 1 FROM r \
         WHERE {o}.id = r.order_id \
           AND EXISTS (SELECT 1 FROM {h} AS x \
                       WHERE x.order_id = r.order_id AND x.seq = {o}.version + 1 AND x.write_id = r.wid) \
         RETURNING id, version; \
         COMMIT"
    )
}

/// `rows` groups of `width` numbered parameters, `(?1, ?2), (?3, ?4)`, in order.
fn placeholders(rows: usize, width: usize) -> String {
    (0..rows)
        .map(|r| {
            let group: Vec<String> = (1..=width).map(|c| format!("?{}", r * width + c)).collect();
            format!("({})", group.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives up a rules unit whose commit or rollback was in flight when its call was
/// dropped. sqlx's worker thread runs the end whether or not its answer is still awaited;
/// one it ran but could not report makes it ignore the next rollback queued without an
/// answer, which it expects from a dropped `Transaction`. Here none comes: left set, that
/// mark would swallow the undo of a later unit abandoned on this connection (whose
/// savepoint would then stay open, and turn the caller's `commit()` into a `RELEASE`).
/// So a rollback is always queued: if the worker had not yet run the end (sqlx's count is
/// still above `depth`), it runs the end, then ignores this rollback; if it had run it,
/// it ignores this rollback; if the end never reached it, this rollback undoes the unit.
pub(super) fn abandon_ending_unit(conn: &mut SqliteConnection, depth: usize) {
    use sqlx_core::transaction::TransactionManager;
    type Manager = <Sqlite as sqlx::Database>::TransactionManager;
    let open = Manager::get_transaction_depth(conn).saturating_sub(depth);
    for _ in 0..open.max(1) {
        Manager::start_rollback(conn);
    }
}
