//! The transition layer on SQLite: its SQL, and the [`Store`] operations over it.
//!
//! One writer at a time: a write unit of the engine's own takes the write lock up front
//! (`BEGIN IMMEDIATE`; a deferred `BEGIN` that reads and then writes can fail with
//! `SQLITE_BUSY_SNAPSHOT` instead of waiting), and reads need no locking variant.

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr, Transaction};

use super::SqliteStore;
use crate::store::{
    Apply, Entity, ErrorClass, FirstWrite, Key, Observed, ObservedRow, Prior, RawTransition,
    Request, Store, Tables, Txn, Written, is_unique_violation,
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
    /// `version >= 0` leaves a corrupt row alone for the judge to report.
    bump: SqlStr,
    /// The update after a read, guarded by what was read: `(to, id, from, version)`.
    update: SqlStr,
    record: SqlStr,
    history: SqlStr,
}

impl Sql {
    pub(super) fn new(tables: &Tables) -> Self {
        let (o, h) = tables.quoted('"');
        let sql = |s: String| AssertSqlSafe(s).into_sql_str();
        Sql {
            insert_order: sql(format!(
                "INSERT INTO {o} (id, status, version) VALUES (?1, ?2, 0) ON CONFLICT (id) DO NOTHING"
            )),
            get: sql(format!("SELECT status, version FROM {o} WHERE id = ?1")),
            observe: sql(format!(
                "SELECT o.status, o.version, h.from_status, h.to_status, h.payload_hash, h.seq \
                 FROM {o} AS o \
                 LEFT JOIN {h} AS h ON h.order_id = o.id AND h.event = ?2 AND h.ref_id = ?3 \
                 WHERE o.id = ?1"
            )),
            prior: sql(format!(
                "SELECT from_status, to_status, payload_hash, seq FROM {h} \
                 WHERE order_id = ?1 AND event = ?2 AND ref_id = ?3"
            )),
            latest_ref: sql(format!(
                "SELECT ref_id FROM {h} WHERE order_id = ?1 AND event = ?2 ORDER BY seq DESC LIMIT 1"
            )),
            bump: sql(format!(
                "UPDATE {o} SET status = ?1, version = version + 1 \
                 WHERE id = ?2 AND status = ?3 AND version >= 0 RETURNING version"
            )),
            update: sql(format!(
                "UPDATE {o} SET status = ?1, version = version + 1 \
                 WHERE id = ?2 AND status = ?3 AND version = ?4"
            )),
            record: sql(format!(
                "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            )),
            history: sql(format!(
                "SELECT seq, from_status, to_status, event, ref_id, payload_hash, payload, created_at \
                 FROM {h} WHERE order_id = ?1 ORDER BY seq"
            )),
        }
    }
}

impl SqliteStore {
    /// A write unit: `BEGIN IMMEDIATE` on the engine's connection, a savepoint inside the
    /// caller's transaction (which the caller began with `BEGIN IMMEDIATE`).
    async fn begin<'c>(
        conn: &'c mut SqliteConnection,
        txn: Txn,
    ) -> Result<Transaction<'c, Sqlite>, sqlx::Error> {
        match txn {
            Txn::Own => conn.begin_with("BEGIN IMMEDIATE").await,
            Txn::Caller => conn.begin().await,
        }
    }

    /// The history insert for `a`, `seq = version + 1`.
    async fn record(&self, conn: &mut SqliteConnection, a: &Apply<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(self.transitions.record.clone())
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

    /// One request's apply-first writes, in an open transaction: the update guarded by
    /// the status, then the history insert. `NotApplied` if nothing matched (nothing
    /// written); a request recorded before comes back as the unique violation it is, for
    /// the caller to undo the update.
    async fn first_write(
        &self,
        conn: &mut SqliteConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        let ([from], [to]) = (request.from_states, request.to_states) else {
            return Ok(FirstWrite::NotTried);
        };
        let bumped: Option<i64> = sqlx::query_scalar(self.transitions.bump.clone())
            .bind(*to)
            .bind(request.key.order_id)
            .bind(*from)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(version) = bumped else {
            return Ok(FirstWrite::NotApplied);
        };
        let apply = Apply {
            key: request.key,
            from,
            to,
            version: version - 1,
            payload_hash: request.payload_hash,
            payload: request.payload,
        };
        self.record(conn, &apply).await?;
        Ok(FirstWrite::Applied {
            from: (*from).to_string(),
            to: (*to).to_string(),
            version,
        })
    }

    /// [`first_write`](Self::first_write) in a savepoint of its own, undone on any error.
    async fn first_write_in_savepoint(
        &self,
        conn: &mut SqliteConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        let mut savepoint = conn.begin().await?;
        match self.first_write(&mut savepoint, request).await {
            Ok(write) => savepoint.commit().await.map(|()| write),
            Err(e) => undo(savepoint, e).await,
        }
    }

    /// Ends a write unit whose update matched: the history insert for `a`, then `COMMIT`.
    /// `false` if the history's unique key holds the request already (recorded before,
    /// or a twin's row): the unit is rolled back.
    async fn record_and_commit(
        &self,
        mut tx: Transaction<'_, Sqlite>,
        a: &Apply<'_>,
    ) -> Result<bool, sqlx::Error> {
        match self.record(&mut tx, a).await {
            Ok(()) => tx.commit().await.map(|()| true),
            Err(e) if is_unique_violation(&e) => tx.rollback().await.map(|()| false),
            Err(e) => undo(tx, e).await,
        }
    }
}

impl Store for SqliteStore {
    type Conn = SqliteConnection;
    type Pooled = sqlx::pool::PoolConnection<Sqlite>;

    /// 1/4. Tried first, a replay takes the write lock (`BEGIN IMMEDIATE`), waiting behind
    /// every writer, for an update that changes nothing; read first, a new request costs
    /// one read more, which in-process is cheap.
    const READ_FIRST_FROM: u32 = 256;

    async fn acquire(&self) -> Result<Self::Pooled, sqlx::Error> {
        self.pool.acquire().await
    }

    fn discard(conn: Self::Pooled) {
        // Detached and dropped: the connection is closed, and whatever it held open is
        // rolled back.
        drop(conn.detach());
    }

    fn classify(err: &sqlx::Error) -> ErrorClass {
        super::classify(err)
    }

    /// The floor's statements for one request: `BEGIN IMMEDIATE`; the update guarded by the
    /// status, returning the new version; the history insert; `COMMIT`. For several, one
    /// `BEGIN IMMEDIATE` and one `COMMIT`, each request in a savepoint of its own. Events
    /// with several source states are not tried: the recorded `from` would need the
    /// matched row.
    async fn apply_first(
        &self,
        conn: &mut SqliteConnection,
        requests: &[Request<'_>],
    ) -> Result<Vec<FirstWrite>, sqlx::Error> {
        if !requests.iter().any(tried_first) {
            return Ok(vec![FirstWrite::NotTried; requests.len()]);
        }
        let mut tx = Self::begin(conn, Txn::Own).await?;
        let mut written = Vec::with_capacity(requests.len());
        for request in requests {
            let step = match requests {
                [_] => self.first_write(&mut tx, request).await,
                _ => self.first_write_in_savepoint(&mut tx, request).await,
            };
            match step {
                Ok(write) => written.push(write),
                // Recorded before: its writes are undone (its savepoint, or below).
                Err(e) if is_unique_violation(&e) => written.push(FirstWrite::NotApplied),
                Err(e) => return undo(tx, e).await,
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

    async fn apply(
        &self,
        conn: &mut SqliteConnection,
        a: &Apply<'_>,
        txn: Txn,
    ) -> Result<Written, sqlx::Error> {
        let mut tx = Self::begin(conn, txn).await?;
        let updated = sqlx::query(self.transitions.update.clone())
            .bind(a.to)
            .bind(a.key.order_id)
            .bind(a.from)
            .bind(a.version)
            .execute(&mut *tx)
            .await;
        let updated = match updated {
            Ok(updated) => updated,
            Err(e) => return undo(tx, e).await,
        };
        if updated.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(Written::Lost);
        }
        Ok(if self.record_and_commit(tx, a).await? {
            Written::Applied
        } else {
            Written::Lost
        })
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

/// Rolls a write unit back after `error`, and returns the error. A rollback that fails
/// too (on a connection already lost) adds nothing to what `error` says.
async fn undo<T>(tx: Transaction<'_, Sqlite>, error: sqlx::Error) -> Result<T, sqlx::Error> {
    let _ = tx.rollback().await;
    Err(error)
}

/// Whether the apply-first unit tries `request`: an event with one source state.
fn tried_first(request: &Request<'_>) -> bool {
    matches!((request.from_states, request.to_states), ([_], [_]))
}
