//! The transition layer on PostgreSQL: the [`Store`] operations over the statements of
//! `transition_sql.rs`.
//!
//! READ COMMITTED: every statement sees the latest commits, also inside a caller's
//! transaction, so no read needs a locking variant.

use sqlx::Connection;
use sqlx::postgres::{PgConnection, Postgres};

use super::PgStore;
use crate::backend::errors::is_unique_violation;
use crate::backend::rows::ObservedRow;
use crate::backend::units::{end_unit, undo};
use crate::backend::{BATCH_READ_MAX, in_place};
use crate::store::{
    Apply, Entity, ErrorClass, FirstWrite, Key, Observed, OwnedKey, PositionedPrior, Prior,
    RawTransition, Request, Store, Txn, Unpooled, Written,
};

impl Store for PgStore {
    async fn arm_timers(
        &self,
        conn: &mut PgConnection,
        arm: &crate::timer::Arm<'_>,
    ) -> Result<(), sqlx::Error> {
        let statements = super::timers::STATEMENTS.get(self.names());
        crate::backend::timer_sql::arm::<sqlx::Postgres>(conn, statements, arm).await
    }

    type Conn = PgConnection;
    type Pooled = sqlx::pool::PoolConnection<Postgres>;

    /// 3/8. Tried first, a replay costs the statement (which writes nothing, so commits
    /// nothing) and then the read, about 2.5 reads of server CPU; read first, a new
    /// request costs one read more. Reading first pays from about 2/5.
    const BACKEND: &'static str = "postgres";
    const READ_FIRST_FROM: u32 = 384;
    const BATCH_READ_MAX: usize = BATCH_READ_MAX;
    const BATCHES_WRITES: bool = true;

    /// The connection kept between conversations ([`PgStore::keep_connection`]), or one
    /// of the pool's.
    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        if let Some(kept) = &self.kept
            && let Some(conn) = kept.take_kept(&self.pool).await
        {
            return Ok(conn);
        }
        self.pool.acquire().await.map_err(super::refused)
    }

    fn give_back(&self, conn: Self::Pooled) {
        match &self.kept {
            Some(kept) => kept.give_back(conn, &self.pool),
            None => drop(conn),
        }
    }

    async fn run_sql(&self, conn: &mut Self::Conn, sql: String) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .map(|_| ())
    }

    fn discard(conn: Self::Pooled) {
        // Detached, the connection no longer counts against the pool; dropped, its socket
        // closes at once, without a goodbye that could wait on a stream left in the
        // middle of a reply.
        drop(conn.detach());
    }

    fn classify(err: &sqlx::Error) -> ErrorClass {
        super::errors::classify(err)
    }

    fn writes_unpooled(&self) -> bool {
        self.kept.is_some()
    }

    /// On the connection kept between units ([`PgStore::keep_connection`]), or one the
    /// pool holds idle.
    async fn apply_first_unpooled(
        &self,
        requests: &[Request<'_>],
    ) -> Result<Unpooled, sqlx::Error> {
        let taken = match &self.kept {
            Some(kept) => kept.take(&self.pool).await,
            None => None,
        };
        let Some(mut taken) = taken else {
            return Ok(Unpooled::NoWriter);
        };
        // A unit that fails leaves its connection to be closed, never kept.
        let written = self.apply_first(taken.conn(), requests).await?;
        taken.keep(&self.pool);
        Ok(Unpooled::Written(written))
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
        let distinct = crate::backend::distinct_entities(requests);
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
                    Err(e) => undo(savepoint, e).await,
                }
            };
            match step.await {
                Ok(write) => written.push(write),
                // Recorded before: its savepoint is undone.
                Err(e) if is_outbox_taken(&e) => written.push(FirstWrite::OutboxTaken),
                Err(e) if is_unique_violation(&e) => written.push(FirstWrite::NotApplied),
                Err(e) => return undo(tx, e).await,
            }
        }
        end_unit(tx, written).await
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
        // One statement is atomic on its own; inside the caller's transaction it runs in a
        // savepoint, so that a twin's unique key does not abort the caller's transaction.
        let outcome = match txn {
            Txn::Own => self.apply_statement(a).execute(conn).await,
            Txn::Caller => {
                let mut savepoint = conn.begin().await?;
                match self.apply_statement(a).execute(&mut *savepoint).await {
                    Ok(done) => savepoint.commit().await.map(|()| done),
                    Err(e) => {
                        savepoint.rollback().await?;
                        Err(e)
                    }
                }
            }
        };
        written(outcome)
    }

    async fn apply_in_batch(
        &self,
        conn: &mut PgConnection,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        // No savepoint: any error aborts the batch's transaction, which its owner then
        // rolls back; a request recorded before is such an error, not "nothing written".
        match self.apply_statement(a).execute(conn).await {
            Ok(done) if done.rows_affected() == 1 => Ok(Written::Applied),
            Ok(_) => Ok(Written::Lost),
            Err(e) if is_outbox_taken(&e) => Ok(Written::OutboxTaken),
            Err(e) => Err(e),
        }
    }

    async fn apply_many_in_batch(
        &self,
        conn: &mut PgConnection,
        applies: &[Apply<'_>],
    ) -> Result<Vec<Written>, sqlx::Error> {
        if !crate::backend::one_statement_batch(applies) {
            return crate::store::apply_each_in_batch(self, conn, applies).await;
        }
        let moved: Vec<i64> = sqlx::query_scalar(self.transitions.apply_batch.clone())
            .bind(applies.iter().map(|a| a.key.order_id).collect::<Vec<i64>>())
            .bind(applies.iter().map(|a| a.from).collect::<Vec<&str>>())
            .bind(applies.iter().map(|a| a.to).collect::<Vec<&str>>())
            .bind(applies.iter().map(|a| a.version).collect::<Vec<i64>>())
            .bind(applies.iter().map(|a| a.key.event).collect::<Vec<&str>>())
            .bind(applies.iter().map(|a| a.key.ref_id).collect::<Vec<&str>>())
            .bind(applies.iter().map(|a| a.payload_hash).collect::<Vec<_>>())
            .bind(applies.iter().map(|a| a.payload).collect::<Vec<_>>())
            .bind(applies.iter().map(|a| a.write_id).collect::<Vec<i64>>())
            .bind(applies.iter().map(|a| a.audit.actor).collect::<Vec<_>>())
            .bind(applies.iter().map(|a| a.audit.reason).collect::<Vec<_>>())
            .fetch_all(conn)
            .await?;
        let moved: std::collections::HashSet<i64> = moved.into_iter().collect();
        Ok(applies
            .iter()
            .map(|a| match moved.contains(&a.key.order_id) {
                true => Written::Applied,
                false => Written::Lost,
            })
            .collect())
    }

    async fn apply_in_unit(
        &self,
        conn: &mut PgConnection,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        // No savepoint: an error aborts the unit, which the engine then undoes.
        written(self.apply_statement(a).execute(conn).await)
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

    async fn begin_rules_unit(
        &self,
        conn: &mut PgConnection,
        txn: Txn,
    ) -> Result<usize, sqlx::Error> {
        // REPEATABLE READ: a guard's plain read of a shared row that the unit then writes
        // (the stock it checks before its effect takes one) is as safe as a locking one.
        // Two units that both read the last one and both take it cannot both commit: the
        // second to update it gets 40001 and is judged again, guard included, from a
        // fresh read. (SERIALIZABLE would catch write skew too, at 0.67-0.75 x the hand
        // floor at 8 and 32 callers in the bench, from its predicate locks' false
        // conflicts; REPEATABLE READ runs at 1.0 x. docs/design.md says which rule a
        // guard must then keep.)
        crate::backend::units::begin_rules_unit::<sqlx::Postgres>(
            conn,
            txn,
            Some("BEGIN ISOLATION LEVEL REPEATABLE READ"),
            true,
        )
        .await
    }

    async fn end_rules_unit(
        &self,
        conn: &mut PgConnection,
        commit: bool,
        depth: usize,
    ) -> Result<(), sqlx::Error> {
        if depth == 0 {
            return crate::backend::units::end_rules_unit::<sqlx::Postgres>(conn, commit, depth)
                .await;
        }
        // Released and opened again in one message: a savepoint of a name nests on
        // PostgreSQL, so the empty one left for the queued rollback sits at the caller's
        // level, not inside the unit.
        crate::backend::units::end_caller_unit::<sqlx::Postgres>(conn, commit, depth, |d| {
            let (open, release) = crate::backend::units::unit_savepoint(d);
            format!("{release}; {open}")
        })
        .await
    }

    fn abandon_rules_unit(&self, conn: &mut PgConnection, depth: usize) {
        crate::backend::units::abandon_rules_unit::<sqlx::Postgres>(conn, depth);
    }

    async fn lock(
        &self,
        conn: &mut PgConnection,
        order_id: i64,
    ) -> Result<Option<Entity>, sqlx::Error> {
        sqlx::query_as(self.transitions.lock.clone())
            .bind(order_id)
            .fetch_optional(conn)
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
pub(super) fn is_outbox_taken(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.constraint() == Some("outbox_pkey"))
}

impl PgStore {
    /// The write after a read, bound to `a`: the update guarded by status and version,
    /// the history row and, on an edge that emits, the outbox row, in one statement.
    fn apply_statement<'q>(
        &self,
        a: &'q Apply<'_>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
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
        match a.emits {
            Some(event) => statement
                .bind(a.machine)
                .bind(event)
                .bind(a.event_body)
                .bind(a.audit.actor)
                .bind(a.audit.reason)
                .bind(a.traceparent())
                .bind(a.tracestate()),
            None => statement.bind(a.audit.actor).bind(a.audit.reason),
        }
    }
}

/// What the write after a read did, from the statement's answer.
fn written(
    outcome: Result<sqlx::postgres::PgQueryResult, sqlx::Error>,
) -> Result<Written, sqlx::Error> {
    match outcome {
        Ok(done) if done.rows_affected() == 1 => Ok(Written::Applied),
        Ok(_) => Ok(Written::Lost),
        Err(e) if is_outbox_taken(&e) => Ok(Written::OutboxTaken),
        Err(e) if is_unique_violation(&e) => Ok(Written::Lost),
        Err(e) => Err(e),
    }
}
