//! The write units of the stores that write a transition statement by statement
//! (MySQL/MariaDB, SQLite): the guarded update, then the history insert (and the outbox
//! row), in one transaction, a savepoint, or in place in a caller's transaction. A
//! statement stopped by a constraint on these servers undoes only itself, which is what
//! lets a request recorded before be undone without a savepoint. Each backend writes its
//! statements; the order of the writes, their undoing and the answers are written here
//! once.

use std::future::Future;

use sqlx::{Connection, Database, Transaction};

use super::units::{end_unit, undo};
use crate::backend::errors::is_unique_violation;
use crate::store::{Apply, FirstWrite, Request, Written};

/// A backend's connection.
pub(crate) type Conn<S> = <<S as Stepwise>::Db as Database>::Connection;

/// The statements of a stepwise store, and the units made of them.
pub(crate) trait Stepwise: Sync {
    type Db: Database;

    /// The apply-first update of entity `id` from `from` to `to`: its new version if it
    /// was at `from`, `None` if nothing matched.
    fn bump(
        &self,
        conn: &mut Conn<Self>,
        id: i64,
        from: &str,
        to: &str,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

    /// The history insert for `a`, `seq = version + 1`, and the outbox row if its edge
    /// emits an event. `false` if the outbox already holds that row (the unit is then to
    /// be undone); a request recorded before comes back as the unique violation it is.
    fn record(
        &self,
        conn: &mut Conn<Self>,
        a: &Apply<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Puts entity `id` back at `from` and `version - 1`, where a bump left it at `to`
    /// and `version`: the rows it changed.
    fn restore(
        &self,
        conn: &mut Conn<Self>,
        id: i64,
        from: &str,
        to: &str,
        version: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// The update after a read, guarded by the status and version read: the rows it
    /// changed.
    fn update(
        &self,
        conn: &mut Conn<Self>,
        a: &Apply<'_>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// One request's apply-first writes, in an open transaction: the update guarded by
    /// the status, then the history insert. `NotApplied` if nothing matched (nothing
    /// written); a request recorded before comes back as the unique violation it is, for
    /// the caller to undo the update.
    fn first_write(
        &self,
        conn: &mut Conn<Self>,
        request: &Request<'_>,
    ) -> impl Future<Output = Result<FirstWrite, sqlx::Error>> + Send {
        async move {
            let ([from], [to]) = (request.from_states, request.to_states) else {
                return Ok(FirstWrite::NotTried);
            };
            let Some(version) = self.bump(conn, request.key.order_id, from, to).await? else {
                return Ok(FirstWrite::NotApplied);
            };
            let emits = request.emits.first().copied().flatten();
            if !self
                .record(conn, &request.apply(from, to, version - 1, emits))
                .await?
            {
                return Ok(FirstWrite::OutboxTaken);
            }
            Ok(applied(from, to, version))
        }
    }

    /// [`first_write`](Self::first_write) in a savepoint of its own, undone on any error.
    fn first_write_in_savepoint(
        &self,
        conn: &mut Conn<Self>,
        request: &Request<'_>,
    ) -> impl Future<Output = Result<FirstWrite, sqlx::Error>> + Send {
        async move {
            let mut savepoint = conn.begin().await?;
            match self.first_write(&mut savepoint, request).await {
                Ok(FirstWrite::OutboxTaken) => {
                    savepoint.rollback().await.map(|()| FirstWrite::OutboxTaken)
                }
                Ok(write) => savepoint.commit().await.map(|()| write),
                Err(e) => undo(savepoint, e).await,
            }
        }
    }

    /// One request's apply-first writes inside a caller's transaction; `NotTried` for an
    /// event with several source states, `NotApplied` for a request recorded before. For a
    /// request that emits nothing, without a savepoint: a statement that fails undoes only itself here,
    /// so a history insert stopped by the unique key (recorded before) leaves the caller's
    /// transaction usable, and the update before it is undone by the statement that
    /// restores what it changed (under the row lock, or the write lock, the update took).
    /// One round trip for each statement, where a savepoint adds two. Any other error is
    /// returned as it is, the update not undone: the caller rolls its transaction back.
    fn first_write_in_place(
        &self,
        conn: &mut Conn<Self>,
        request: &Request<'_>,
    ) -> impl Future<Output = Result<FirstWrite, sqlx::Error>> + Send {
        async move {
            let ([from], [to]) = (request.from_states, request.to_states) else {
                return Ok(FirstWrite::NotTried);
            };
            if request.emits_any() {
                return match self.first_write_in_savepoint(conn, request).await {
                    // Recorded before: its savepoint is undone.
                    Err(e) if is_unique_violation(&e) => Ok(FirstWrite::NotApplied),
                    other => other,
                };
            }
            let id = request.key.order_id;
            let Some(version) = self.bump(conn, id, from, to).await? else {
                return Ok(FirstWrite::NotApplied);
            };
            let Err(e) = self
                .record(conn, &request.apply(from, to, version - 1, None))
                .await
            else {
                return Ok(applied(from, to, version));
            };
            // Only a refused history row leaves the transaction as it was, the lock still
            // held: after any other error (a deadlock rolls the whole transaction back and
            // frees the lock, and a rival may since have moved the entity the same way)
            // nothing is restored, and the error tells the caller to roll back.
            if !is_unique_violation(&e) {
                return Err(e);
            }
            if self.restore(conn, id, from, to, version).await? != 1 {
                // Not a unique violation, which would read as "nothing written".
                return Err(sqlx::Error::Protocol(format!(
                    "the update of entity {id} could not be undone after its request was found recorded"
                )));
            }
            Ok(FirstWrite::NotApplied)
        }
    }

    /// Requests written one at a time in the open unit `tx` (each but a lone one in a
    /// savepoint of its own), which is committed if one of them applied and rolled back
    /// otherwise.
    fn first_writes_one_by_one(
        &self,
        mut tx: Transaction<'_, Self::Db>,
        requests: &[Request<'_>],
    ) -> impl Future<Output = Result<Vec<FirstWrite>, sqlx::Error>> + Send {
        async move {
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
            end_unit(tx, written).await
        }
    }

    /// The writes after a read in place, inside a unit whose owner undoes it for any
    /// answer but [`Written::Applied`] ([`Store::apply_in_unit`](crate::Store::apply_in_unit)):
    /// the guarded update, then the history insert (and its outbox row), no savepoint.
    fn apply_in_place(
        &self,
        conn: &mut Conn<Self>,
        a: &Apply<'_>,
    ) -> impl Future<Output = Result<Written, sqlx::Error>> + Send {
        async move {
            if self.update(conn, a).await? != 1 {
                return Ok(Written::Lost);
            }
            match self.record(conn, a).await {
                Ok(true) => Ok(Written::Applied),
                Ok(false) => Ok(Written::OutboxTaken),
                Err(e) if is_unique_violation(&e) => Ok(Written::Lost),
                Err(e) => Err(e),
            }
        }
    }

    /// The writes after a read in place, inside a transaction its owner rolls back whole
    /// on any error ([`Store::apply_in_batch`](crate::Store::apply_in_batch)): the
    /// guarded update, then the history insert (and its outbox row), no savepoint.
    /// [`Written::Lost`] only if the update matched nothing; a history row refused by
    /// its unique key comes back as the error it is, the update not undone.
    fn apply_in_batch_place(
        &self,
        conn: &mut Conn<Self>,
        a: &Apply<'_>,
    ) -> impl Future<Output = Result<Written, sqlx::Error>> + Send {
        async move {
            if self.update(conn, a).await? != 1 {
                return Ok(Written::Lost);
            }
            Ok(match self.record(conn, a).await? {
                true => Written::Applied,
                false => Written::OutboxTaken,
            })
        }
    }

    /// The write unit after a read, in the open unit `tx`: the guarded update, then the
    /// history insert (and its outbox row), then `COMMIT`. [`Written::Lost`] if the update
    /// matched nothing or the history's unique key holds the request already (recorded
    /// before, or a twin's row), [`Written::OutboxTaken`] if the outbox holds the row: the
    /// unit is rolled back.
    fn apply_in(
        &self,
        mut tx: Transaction<'_, Self::Db>,
        a: &Apply<'_>,
    ) -> impl Future<Output = Result<Written, sqlx::Error>> + Send {
        async move {
            match self.update(&mut tx, a).await {
                Ok(1) => {}
                Ok(_) => return tx.rollback().await.map(|()| Written::Lost),
                Err(e) => return undo(tx, e).await,
            }
            match self.record(&mut tx, a).await {
                Ok(true) => tx.commit().await.map(|()| Written::Applied),
                Ok(false) => tx.rollback().await.map(|()| Written::OutboxTaken),
                Err(e) if is_unique_violation(&e) => tx.rollback().await.map(|()| Written::Lost),
                Err(e) => undo(tx, e).await,
            }
        }
    }
}

fn applied(from: &str, to: &str, version: i64) -> FirstWrite {
    FirstWrite::Applied {
        from: from.to_string(),
        to: to.to_string(),
        version,
    }
}
