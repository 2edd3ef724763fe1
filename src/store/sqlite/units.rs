//! The write units of the transition layer on SQLite: the transaction
//! control around the statements of `transitions.rs` (a unit's writes, its savepoints,
//! its commit, and its rollback on every error path).

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{AssertSqlSafe, Connection, Transaction};

use super::SqliteStore;
use crate::store::{Apply, FirstWrite, Request, Tried, Txn, Written, is_unique_violation};

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
        let Some(version) = self.bump(conn, request.key.order_id, from, to).await? else {
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
        let (o, h) = (&self.transitions.orders, &self.transitions.transitions);
        let tried = crate::store::tried(requests);
        let mut written = vec![FirstWrite::NotTried; requests.len()];
        let values = placeholders(tried.len(), 5);
        let update = format!(
            "WITH r(order_id, f, t, event, ref_id) AS (VALUES {values}) \
             UPDATE {o} SET status = r.t, version = {o}.version + 1 FROM r \
             WHERE {o}.id = r.order_id AND {o}.status = r.f \
               AND {o}.version BETWEEN 0 AND 9223372036854775806 \
               AND NOT EXISTS (SELECT 1 FROM {h} AS h \
                               WHERE h.order_id = r.order_id AND h.event = r.event AND h.ref_id = r.ref_id) \
             RETURNING id, version"
        );
        let mut query = sqlx::query_as::<_, (i64, i64)>(AssertSqlSafe(update));
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
        let record = format!(
            "INSERT INTO {h} (order_id, seq, from_status, to_status, event, ref_id, payload_hash, payload, write_id) \
             VALUES {}",
            placeholders(moved.len(), 9)
        );
        let mut query = sqlx::query(AssertSqlSafe(record));
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
                .bind(r.write_id);
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
            let emit = format!(
                "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id, body) \
                 VALUES {}",
                placeholders(emitting.len(), 9)
            );
            let mut query = sqlx::query(AssertSqlSafe(emit));
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
                    .bind(r.event_body);
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

    /// The apply-first update: the entity's new version if it was at `from`.
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

    /// One request's apply-first writes inside a caller's transaction, for a request
    /// that emits nothing, without a savepoint: a statement stopped by a constraint
    /// undoes only itself, so a history insert stopped by the unique key (recorded
    /// before) leaves the caller's transaction usable, and the update before it is
    /// undone by the statement that restores what it changed (the caller's transaction
    /// holds the write lock). Two statements, where a savepoint adds two more.
    /// Any other error is returned as it is, the update not undone: the caller rolls
    /// its transaction back.
    pub(super) async fn first_write_in_place(
        &self,
        conn: &mut SqliteConnection,
        request: &Request<'_>,
    ) -> Result<FirstWrite, sqlx::Error> {
        let ([from], [to], false) = (request.from_states, request.to_states, request.emits_any())
        else {
            return self.first_write_in_savepoint(conn, request).await;
        };
        let id = request.key.order_id;
        let Some(version) = self.bump(conn, id, from, to).await? else {
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
            emits: None,
            machine: request.machine,
            event_body: request.event_body,
        };
        let Err(e) = self.record(conn, &apply).await else {
            return Ok(FirstWrite::Applied {
                from: (*from).to_string(),
                to: (*to).to_string(),
                version,
            });
        };
        // Only a refused history row leaves the transaction as it was, the row lock (or
        // the write lock) still held: after any other error (a deadlock rolls the whole
        // transaction back and frees the lock, and a rival may since have moved the
        // entity the same way) nothing is restored, and the error tells the caller to
        // roll back.
        if !is_unique_violation(&e) {
            return Err(e);
        }
        // Guarded by what the update wrote.
        let restored = sqlx::query(self.transitions.restore.clone())
            .bind(*from)
            .bind(version - 1)
            .bind(id)
            .bind(*to)
            .bind(version)
            .execute(&mut *conn)
            .await?;
        if restored.rows_affected() != 1 {
            // Not a unique violation, which would read as "nothing written".
            return Err(sqlx::Error::Protocol(format!(
                "the update of entity {id} could not be undone after its request was found recorded"
            )));
        }
        Ok(FirstWrite::NotApplied)
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

/// Rolls a write unit back after `error`, and returns the error. A rollback that fails
/// too (on a connection already lost) adds nothing to what `error` says.
pub(super) async fn undo<T>(
    tx: Transaction<'_, Sqlite>,
    error: sqlx::Error,
) -> Result<T, sqlx::Error> {
    let _ = tx.rollback().await;
    Err(error)
}
