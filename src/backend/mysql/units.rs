//! The write units of the transition layer on MySQL/MariaDB: the unit of several
//! requests' apply-first writes, and the statements the one-request units of
//! `backend/stepwise.rs` are made of (the update, the history and outbox rows, the
//! restore).

use sqlx::mysql::{MySql, MySqlConnection};

use super::MySqlStore;
use super::text::text;
use crate::backend::Tried;
use crate::backend::errors::is_unique_violation;
use crate::backend::stepwise::Stepwise;
use crate::store::{Apply, FirstWrite, Request, Written};

impl MySqlStore {
    /// The writes after a read of distinct entities inside the job's batch transaction
    /// (the timers'), emitting nothing: a locking read of the entities (in the order of
    /// their ids), then for those still at the state and version each was read at, one
    /// update and one multi-row insert of their history rows. A history row refused by
    /// its unique key, or a statement that changed another number of rows than it was
    /// given, is an error: the batch's owner rolls back.
    pub(super) async fn apply_batch(
        &self,
        conn: &mut MySqlConnection,
        applies: &[Apply<'_>],
    ) -> Result<Vec<Written>, sqlx::Error> {
        let units = &self.sql().units;
        let class = |n: usize| n.next_power_of_two().max(2);
        let size = class(applies.len());
        let mut lock = sqlx::query_as::<_, (i64, String, i64)>(units.lock.get(size));
        for a in applies {
            lock = lock.bind(a.key.order_id);
        }
        for _ in applies.len()..size {
            lock = lock.bind(None::<i64>);
        }
        let entities = lock.fetch_all(&mut *conn).await?;
        let written: Vec<Written> = applies
            .iter()
            .map(|a| {
                let at = entities.iter().any(|(id, status, version)| {
                    *id == a.key.order_id && status == a.from && *version == a.version
                });
                match at && (0..i64::MAX).contains(&a.version) {
                    true => Written::Applied,
                    false => Written::Lost,
                }
            })
            .collect();
        let moving: Vec<&Apply<'_>> = applies
            .iter()
            .zip(&written)
            .filter(|(_, w)| **w == Written::Applied)
            .map(|(a, _)| a)
            .collect();
        if moving.is_empty() {
            return Ok(written);
        }
        let size = class(moving.len());
        let mut update = sqlx::query(units.update.get(size));
        for a in &moving {
            update = update.bind(a.key.order_id).bind(a.to);
        }
        for _ in moving.len()..size {
            update = update.bind(None::<i64>).bind(None::<&str>);
        }
        for a in &moving {
            update = update.bind(a.key.order_id);
        }
        for _ in moving.len()..size {
            update = update.bind(None::<i64>);
        }
        let updated = update.execute(&mut *conn).await?.rows_affected();
        let mut record = sqlx::query(units.record.get(size));
        for a in &moving {
            record = record
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
                .bind(a.audit.reason);
        }
        for _ in moving.len()..size {
            record = record
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<i64>)
                .bind(None::<&str>)
                .bind(None::<&str>);
        }
        let recorded = if updated == moving.len() as u64 {
            record.execute(&mut *conn).await?.rows_affected()
        } else {
            0
        };
        if (updated, recorded) != (moving.len() as u64, moving.len() as u64) {
            return Err(sqlx::Error::Protocol(format!(
                "a timer batch's {} moves changed {updated} entities and wrote {recorded} history rows",
                moving.len()
            )));
        }
        Ok(written)
    }

    /// The apply-first writes of requests of distinct entities in an open transaction: a
    /// locking read of the entities (in the order of their ids, by the primary key, so
    /// that no other row is locked), a read of their
    /// requests' history rows (exact: a request is recorded only with its entity's
    /// update, which waits for these locks; on Galera a rival node's write set fails
    /// certification instead), then for those whose entity is at the request's source
    /// state and whose request is not recorded, one update, one multi-row insert of their
    /// history rows and one of their outbox rows (on Galera each write only while the
    /// transaction lives: `LIVE`). `None` if a row met a unique key, or a
    /// statement changed another number of rows than it was given (the caller undoes the
    /// transaction). A request whose event has several source states is not tried.
    pub(super) async fn first_writes(
        &self,
        conn: &mut MySqlConnection,
        requests: &[Request<'_>],
    ) -> Result<Option<Vec<FirstWrite>>, sqlx::Error> {
        let units = &self.sql().units;
        let mut written = vec![FirstWrite::NotTried; requests.len()];
        let tried = crate::backend::tried(requests);
        for t in &tried {
            written[t.0] = FirstWrite::NotApplied;
        }
        // Statement texts come in size classes (powers of two, the unused places bound as
        // NULL, which matches nothing), so that a connection's statement cache holds
        // every unit's statements: an evicted statement is closed with a message that
        // has no reply, after which the next request can wait on the server's delayed
        // acknowledgement (sqlx leaves Nagle's algorithm on).
        let class = |n: usize| n.next_power_of_two().max(2);
        let mut lock = sqlx::query_as::<_, (i64, String, i64)>(units.lock.get(class(tried.len())));
        for t in &tried {
            lock = lock.bind(t.1.key.order_id);
        }
        for _ in tried.len()..class(tried.len()) {
            lock = lock.bind(None::<i64>);
        }
        let entities = lock.fetch_all(&mut *conn).await?;
        let mut recorded = sqlx::query_scalar::<_, i64>(units.recorded.get(class(tried.len())));
        for t in &tried {
            recorded = recorded
                .bind(t.1.key.order_id)
                .bind(t.1.key.event)
                .bind(t.1.key.ref_id);
        }
        for _ in tried.len()..class(tried.len()) {
            recorded = recorded
                .bind(None::<i64>)
                .bind(None::<&str>)
                .bind(None::<&str>);
        }
        let recorded = recorded.fetch_all(&mut *conn).await?;
        // Those that move, with their new versions.
        let moving: Vec<(&Tried<'_, '_>, i64)> = tried
            .iter()
            .filter(|t| !recorded.contains(&t.1.key.order_id))
            .filter_map(|t| {
                let (_, status, version) = entities.iter().find(|e| e.0 == t.1.key.order_id)?;
                let movable = status == t.2 && (0..i64::MAX).contains(version);
                movable.then_some((t, version + 1))
            })
            .collect();
        if moving.is_empty() {
            return Ok(Some(written));
        }
        let size = class(moving.len());
        let mut update = sqlx::query(units.update.get(size));
        for ((_, r, _, to), _) in &moving {
            update = update.bind(r.key.order_id).bind(*to);
        }
        for _ in moving.len()..size {
            update = update.bind(None::<i64>).bind(None::<&str>);
        }
        for ((_, r, _, _), _) in &moving {
            update = update.bind(r.key.order_id);
        }
        for _ in moving.len()..size {
            update = update.bind(None::<i64>);
        }
        let updated = update.execute(&mut *conn).await?.rows_affected();
        if updated != moving.len() as u64 {
            return Ok(not_given("update", updated, moving.len()));
        }
        let mut record = sqlx::query(units.record.get(size));
        for ((_, r, from, to), version) in &moving {
            record = record
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
        for _ in moving.len()..size {
            record = record
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<i64>)
                .bind(None::<&str>)
                .bind(None::<&str>);
        }
        match record.execute(&mut *conn).await {
            Ok(done) if done.rows_affected() != moving.len() as u64 => {
                return Ok(not_given(
                    "history insert",
                    done.rows_affected(),
                    moving.len(),
                ));
            }
            Ok(_) => {}
            Err(e) if is_unique_violation(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
        let emitting: Vec<_> = moving
            .iter()
            .filter_map(|(t, version)| Some((t, version, t.1.emits.first().copied().flatten()?)))
            .collect();
        if !emitting.is_empty() {
            let size = class(emitting.len());
            let mut emit = sqlx::query(units.emit.get(size));
            for ((_, r, from, to), version, event) in &emitting {
                emit = emit
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
            for _ in emitting.len()..size {
                emit = emit
                    .bind(None::<&str>)
                    .bind(None::<i64>)
                    .bind(None::<i64>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<&str>);
            }
            match emit.execute(&mut *conn).await {
                Ok(done) if done.rows_affected() != emitting.len() as u64 => {
                    return Ok(not_given(
                        "outbox insert",
                        done.rows_affected(),
                        emitting.len(),
                    ));
                }
                Ok(_) => {}
                Err(e) if is_unique_violation(&e) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        for ((i, _, from, to), version) in moving {
            written[*i] = FirstWrite::Applied {
                from: (*from).to_string(),
                to: (*to).to_string(),
                version,
            };
        }
        Ok(Some(written))
    }
}

impl Stepwise for MySqlStore {
    type Db = MySql;

    async fn bump(
        &self,
        conn: &mut MySqlConnection,
        id: i64,
        from: &str,
        to: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let bumped = text(&self.sql().bump)
            .bind(to)
            .bind(id)
            .bind(from)
            .execute(&mut *conn)
            .await?;
        if bumped.rows_affected() != 1 {
            return Ok(None);
        }
        i64::try_from(bumped.last_insert_id())
            .map(Some)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }

    async fn record(&self, conn: &mut MySqlConnection, a: &Apply<'_>) -> Result<bool, sqlx::Error> {
        text(&self.sql().record)
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
            let emitted = text(&self.sql().emit)
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
        conn: &mut MySqlConnection,
        id: i64,
        from: &str,
        to: &str,
        version: i64,
    ) -> Result<u64, sqlx::Error> {
        let restored = text(&self.sql().restore)
            .bind(from)
            .bind(version - 1)
            .bind(id)
            .bind(to)
            .bind(version)
            .execute(conn)
            .await?;
        Ok(restored.rows_affected())
    }

    async fn update(&self, conn: &mut MySqlConnection, a: &Apply<'_>) -> Result<u64, sqlx::Error> {
        let updated = text(&self.sql().update)
            .bind(a.to)
            .bind(a.key.order_id)
            .bind(a.from)
            .bind(a.version)
            .execute(conn)
            .await?;
        Ok(updated.rows_affected())
    }
}

/// A statement of a unit changed another number of rows than the unit gave it: the unit
/// is to be undone and its requests written one at a time (`None`, as after a unique
/// key). On a Galera node: a write that found its transaction rolled back by a
/// brute-force abort (`LIVE`); and, seen once, after such an abort cut a unit's padded
/// insert off, the next execution of that prepared statement inserted its padding row,
/// NULLs turned into zeros and empty strings.
fn not_given<T>(what: &str, changed: u64, given: usize) -> Option<T> {
    tracing::warn!(
        statement = what,
        changed,
        given,
        "a coalesced unit's statement changed rows it was not given; the unit is undone"
    );
    None
}
