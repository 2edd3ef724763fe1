//! The transition layer on MySQL/MariaDB: its SQL, and the [`Store`] operations over it.
//!
//! REPEATABLE READ: inside a caller's transaction a plain read returns the transaction's
//! snapshot, which may predate a rival's commit, so the reads there lock and see the
//! latest rows. On Galera the reads outside a transaction are causal (see
//! [`MySqlStore`]).

use sqlx::Connection;
use sqlx::mysql::{MySql, MySqlConnection};

use super::MySqlStore;
use super::text::text;
use super::transition_sql::{Sql, at};
use crate::backend::rows::ObservedRow;
use crate::backend::stepwise::Stepwise;
use crate::backend::units::{end_unit, undo};
use crate::backend::{BATCH_READ_MAX, in_place};
use crate::store::{
    Apply, Entity, ErrorClass, FirstWrite, Key, Lease, Observed, OwnedKey, PositionedPrior, Prior,
    RawTransition, Request, Store, Txn, Written,
};

impl MySqlStore {
    pub(super) fn sql(&self) -> &Sql {
        &self.transitions[usize::from(self.causal_reads() == Some(true))]
    }
}

/// Closes the connection's prepared statements after a unit that did not complete: a
/// unit's statements are prepared once per connection, and after one was cut off
/// mid-way (seen on Galera: a deadlock from a brute-force abort), the next execution of
/// the padded insert on that connection inserted its padding row, NULLs turned into
/// zeros and empty strings; prepared afresh, it did not. Closing them needs the
/// connection: if it cannot be done, the connection is lost, and that is the answer.
async fn prepare_afresh(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    conn.clear_cached_statements().await.inspect_err(|e| {
        tracing::warn!(error = %e, "closing a failed unit's prepared statements failed");
    })
}

/// A rules unit's transaction found rolled back by another node's write set (a Galera
/// node): answered as a lost connection, so that the connection is not used again and
/// the request goes again on another.
fn transaction_gone(order_id: i64) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "the transaction of the unit of entity {order_id} was rolled back by another node's write set"
    ))
}

impl Store for MySqlStore {
    async fn arm_timers(
        &self,
        conn: &mut MySqlConnection,
        arm: &crate::timer::Arm<'_>,
    ) -> Result<(), sqlx::Error> {
        crate::backend::timer_sql::arm_as_text(
            conn,
            super::timers::STATEMENTS.get(self.names()),
            arm,
        )
        .await
    }

    type Conn = MySqlConnection;
    type Pooled = sqlx::pool::PoolConnection<MySql>;

    /// 1/4. Tried first, a replay costs four round trips (`BEGIN`, an update that changes
    /// nothing, `ROLLBACK`, the read); read first, a new request costs one more.
    const BACKEND: &'static str = "mysql";
    const READ_FIRST_FROM: u32 = 256;
    const BATCH_READ_MAX: usize = BATCH_READ_MAX;
    const BATCHES_WRITES: bool = true;

    /// Not on a Galera node unless [`MySqlStore::coalesce_on_galera`] said so.
    fn batches_writes(&self) -> bool {
        self.causal_reads() != Some(true) || self.galera_units
    }

    async fn run_sql(&self, conn: &mut Self::Conn, sql: String) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .map(|_| ())
    }

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        let conn = self.pool.acquire().await.map_err(super::refused)?;
        if self.causal_reads().is_some() {
            return Ok(conn);
        }
        // Until the server has answered, the connection is mid-conversation: a lease
        // closes it if this future is dropped or the question fails.
        let mut lease = Lease::<Self>::held(self, conn);
        self.detect_galera(lease.conn()).await?;
        lease.into_inner().ok_or(sqlx::Error::PoolClosed)
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

    /// The floor's statements for one request: `BEGIN`; the update guarded by the
    /// status, returning the new version; the history insert; `COMMIT`. For several of
    /// distinct entities, one `BEGIN`, a locking read of the entities and a read of
    /// their requests' history rows, one update, one multi-row history insert (and one
    /// of outbox rows), one `COMMIT`; if a row meets a unique key, or a statement changes
    /// another number of rows than it was given, that is undone and each request goes in
    /// a savepoint of its own. Events with several source states are not tried: the
    /// recorded `from` would need the matched row.
    async fn apply_first(
        &self,
        conn: &mut MySqlConnection,
        requests: &[Request<'_>],
    ) -> Result<Vec<FirstWrite>, sqlx::Error> {
        if !requests.iter().any(Request::has_one_edge) {
            return Ok(vec![FirstWrite::NotTried; requests.len()]);
        }
        if requests.len() > 1 && self.units_allowed() && crate::backend::distinct_entities(requests)
        {
            // READ COMMITTED: the unit's reads see the latest commits, and its locking
            // read keeps no lock on a row it did not match.
            let mut tx = conn
                .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
                .await?;
            match self.first_writes(&mut tx, requests).await {
                Ok(Some(written)) => return end_unit(tx, written).await,
                // A row met a unique key, or a statement changed rows it was not given:
                // undone, and written one request at a time.
                Ok(None) => {
                    tx.rollback().await?;
                    prepare_afresh(conn).await?;
                }
                Err(e) => {
                    let out = undo(tx, e).await;
                    if let Err(lost) = prepare_afresh(conn).await {
                        if let Err(e) = &out {
                            tracing::warn!(error = %e, "the failed unit's own error");
                        }
                        return Err(lost);
                    }
                    return out;
                }
            }
        }
        self.first_writes_one_by_one(conn.begin().await?, requests)
            .await
    }

    async fn observe(
        &self,
        conn: &mut MySqlConnection,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<Option<Observed>, sqlx::Error> {
        let row: Option<ObservedRow> = text(&self.sql().observe[at(txn)])
            .bind(key.event)
            .bind(key.ref_id)
            .bind(key.order_id)
            .optional_as(conn)
            .await?;
        Ok(row.map(Observed::from))
    }

    async fn apply_first_in(
        &self,
        conn: &mut MySqlConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        self.first_write_in_place(conn, request).await
    }

    async fn apply(
        &self,
        conn: &mut MySqlConnection,
        a: &Apply<'_>,
        _txn: Txn,
    ) -> Result<Written, sqlx::Error> {
        self.apply_in(conn.begin().await?, a).await
    }

    async fn apply_in_batch(
        &self,
        conn: &mut MySqlConnection,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        self.apply_in_batch_place(conn, a).await
    }

    async fn apply_many_in_batch(
        &self,
        conn: &mut MySqlConnection,
        applies: &[Apply<'_>],
    ) -> Result<Vec<Written>, sqlx::Error> {
        if !crate::backend::one_statement_batch(applies) {
            return crate::store::apply_each_in_batch(self, conn, applies).await;
        }
        self.apply_batch(conn, applies).await
    }

    async fn apply_in_unit(
        &self,
        conn: &mut MySqlConnection,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        self.apply_in_place(conn, a).await
    }

    async fn latest_ref(
        &self,
        conn: &mut MySqlConnection,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<Option<String>, sqlx::Error> {
        text(&self.sql().latest_ref[at(txn)])
            .bind(key.order_id)
            .bind(key.event)
            .optional_as::<(String,)>(conn)
            .await
            .map(|r| r.map(|(v,)| v))
    }

    async fn prior(
        &self,
        conn: &mut MySqlConnection,
        key: Key<'_>,
        txn: Txn,
    ) -> Result<Option<Prior>, sqlx::Error> {
        text(&self.sql().prior[at(txn)])
            .bind(key.order_id)
            .bind(key.event)
            .bind(key.ref_id)
            .optional_as(conn)
            .await
    }

    async fn priors(
        &self,
        conn: &mut MySqlConnection,
        keys: &[OwnedKey],
    ) -> Result<Vec<Option<Prior>>, sqlx::Error> {
        let (sql, padding) = self.sql().batch_reads.sql(keys.len());
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
        conn: &mut MySqlConnection,
        order_id: i64,
        initial: &'static str,
        txn: Txn,
    ) -> Result<Entity, sqlx::Error> {
        // An entity the caller inserted (with business columns) is not inserted again:
        // the insert would fail on those columns before meeting the key. A read first,
        // not `INSERT … SELECT … WHERE NOT EXISTS`, whose shared gap locks deadlock two
        // creates of neighbouring ids.
        let exists = text(&self.sql().get)
            .bind(order_id)
            .fetch_optional(&mut *conn)
            .await?
            .is_some();
        if !exists {
            text(&self.sql().insert_order)
                .bind(order_id)
                .bind(initial)
                .execute(&mut *conn)
                .await?;
        }
        text(&self.sql().created[at(txn)])
            .bind(order_id)
            .one_as(conn)
            .await
    }

    async fn begin_rules_unit(
        &self,
        conn: &mut MySqlConnection,
        txn: Txn,
    ) -> Result<usize, sqlx::Error> {
        // On a Galera node a read inside a transaction does not wait for the write sets
        // other nodes certified (`wsrep_sync_wait` is not applied there, the causal
        // prefix included): a unit that began on a lagging node could find no entity the
        // cluster acknowledged, or judge it at an older state. The wait comes first, in
        // the same round trip.
        //
        // SERIALIZABLE (for this transaction only): InnoDB takes a shared lock for every
        // plain read, so a guard's read of a shared row (the stock it checks before its
        // effect takes one) is as safe as a locking one. Two units that both read the
        // last one and both take it deadlock; the loser (1213) is judged again, guard
        // included, from a fresh read.
        let begin = if self.causal_reads() == Some(true) {
            "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT 1; \
             SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION"
        } else {
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION"
        };
        crate::backend::units::begin_rules_unit::<sqlx::MySql>(conn, txn, Some(begin), false).await
    }

    async fn end_rules_unit(
        &self,
        conn: &mut MySqlConnection,
        commit: bool,
        depth: usize,
    ) -> Result<(), sqlx::Error> {
        if depth == 0 {
            return crate::backend::units::end_rules_unit::<sqlx::MySql>(conn, commit, depth).await;
        }
        // A SAVEPOINT of a name the transaction holds replaces it on MariaDB: the unit's
        // writes stay, under an empty savepoint of the same name.
        crate::backend::units::end_caller_unit::<sqlx::MySql>(conn, commit, depth, |d| {
            crate::backend::units::unit_savepoint(d).0
        })
        .await
    }

    fn abandon_rules_unit(&self, conn: &mut MySqlConnection, depth: usize) {
        crate::backend::units::abandon_rules_unit::<sqlx::MySql>(conn, depth);
    }

    async fn lock(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
    ) -> Result<Option<Entity>, sqlx::Error> {
        text(&self.sql().lock)
            .bind(order_id)
            .optional_as(conn)
            .await
    }

    /// On a Galera node: the entity's version changed and put back, each only inside
    /// the transaction (`LIVE`).
    async fn write_before_rules(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
        version: i64,
    ) -> Result<(), sqlx::Error> {
        if self.causal_reads() != Some(true) {
            return Ok(());
        }
        let [arm, disarm] = &self.sql().arm;
        let armed = text(arm).bind(order_id).execute(&mut *conn).await?;
        if armed.rows_affected() != 1 {
            return Err(transaction_gone(order_id));
        }
        let put_back = text(disarm)
            .bind(version)
            .bind(order_id)
            .execute(conn)
            .await?;
        if put_back.rows_affected() != 1 {
            return Err(transaction_gone(order_id));
        }
        Ok(())
    }

    async fn get(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
    ) -> Result<Option<Entity>, sqlx::Error> {
        text(&self.sql().get).bind(order_id).optional_as(conn).await
    }

    async fn history(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
    ) -> Result<Vec<RawTransition>, sqlx::Error> {
        text(&self.sql().history).bind(order_id).all_as(conn).await
    }
}
