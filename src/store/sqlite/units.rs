//! The write units of the transition layer on SQLite: the transaction
//! control around the statements of `transitions.rs` (a unit's writes, its savepoints,
//! its commit, and its rollback on every error path).

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Connection, Transaction};

use super::SqliteStore;
use crate::store::{Apply, FirstWrite, Request, Txn, Written, is_unique_violation};

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

    /// The history insert for `a`, `seq = version + 1`, and the outbox row if its edge
    /// emits an event. `false` if the outbox already holds that row (the unit is then to
    /// be undone).
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

    /// One request's apply-first writes, in an open transaction: the update guarded by
    /// the status, then the history insert. `NotApplied` if nothing matched (nothing
    /// written); a request recorded before comes back as the unique violation it is, for
    /// the caller to undo the update.
    pub(super) async fn first_write(
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
            write_id: request.write_id,
            emits: request.emits.first().copied().flatten(),
            machine: request.machine,
            event_body: request.event_body,
        };
        if !self.record(conn, &apply).await? {
            return Ok(FirstWrite::OutboxTaken);
        }
        Ok(FirstWrite::Applied {
            from: (*from).to_string(),
            to: (*to).to_string(),
            version,
        })
    }

    /// [`first_write`](Self::first_write) in a savepoint of its own, undone on any error.
    pub(super) async fn first_write_in_savepoint(
        &self,
        conn: &mut SqliteConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        let mut savepoint = conn.begin().await?;
        match self.first_write(&mut savepoint, request).await {
            Ok(FirstWrite::OutboxTaken) => {
                savepoint.rollback().await.map(|()| FirstWrite::OutboxTaken)
            }
            Ok(write) => savepoint.commit().await.map(|()| write),
            Err(e) => undo(savepoint, e).await,
        }
    }

    /// Ends a write unit whose update matched: the history insert for `a` (and its outbox
    /// row), then `COMMIT`. [`Written::Lost`] if the history's unique key holds the
    /// request already (recorded before, or a twin's row), [`Written::OutboxTaken`] if
    /// the outbox holds the row: the unit is rolled back.
    pub(super) async fn record_and_commit(
        &self,
        mut tx: Transaction<'_, Sqlite>,
        a: &Apply<'_>,
    ) -> Result<Written, sqlx::Error> {
        match self.record(&mut tx, a).await {
            Ok(true) => tx.commit().await.map(|()| Written::Applied),
            Ok(false) => tx.rollback().await.map(|()| Written::OutboxTaken),
            Err(e) if is_unique_violation(&e) => tx.rollback().await.map(|()| Written::Lost),
            Err(e) => undo(tx, e).await,
        }
    }
}

/// Rolls a write unit back after `error`, and returns the error. A rollback that fails
/// too (on a connection already lost) adds nothing to what `error` says.
pub(super) async fn undo<T>(
    tx: Transaction<'_, Sqlite>,
    error: sqlx::Error,
) -> Result<T, sqlx::Error> {
    let _ = tx.rollback().await;
    Err(error)
}
