//! The outbox statements whose shape every backend shares, written once with `?`
//! parameters (and the list of a batch's keys as `OR`ed groups, for the backends that
//! take it): each backend's `outbox.rs` brings its clock, its event columns and its
//! parameter style (PostgreSQL numbers them, see [`numbered`]), and its own claim,
//! stats, purge and inbox statements.

use crate::outbox::{ClaimedEvent, CorruptEvent, EventKey, EventRow};

/// One claimed row, decoded on its own: a row whose columns do not read as an
/// [`EventRow`] is a [`CorruptEvent`] (with its key, if that much reads), so that one bad
/// row never fails the claim of the others.
pub(crate) fn claimed<'r, R>(row: &'r R) -> ClaimedEvent
where
    R: sqlx::Row,
    EventRow: sqlx::FromRow<'r, R>,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    <EventRow as sqlx::FromRow<'r, R>>::from_row(row).map_err(|e| {
        let key = match (
            row.try_get::<String, _>("machine"),
            row.try_get::<i64, _>("entity_id"),
            row.try_get::<i64, _>("version"),
        ) {
            (Ok(machine), Ok(entity_id), Ok(version)) => Some(EventKey {
                machine,
                entity_id,
                version,
            }),
            _ => None,
        };
        CorruptEvent {
            key,
            reason: format!("unreadable row: {e}"),
        }
    })
}

/// A status orderly never writes, as index ranges around the three it does (a `NOT IN`
/// would read every published row).
pub(crate) const UNKNOWN_STATUS: &str = "(o.status < 'DEAD' OR (o.status > 'DEAD' AND o.status < 'PENDING') \
    OR (o.status > 'PENDING' AND o.status < 'PUBLISHED') OR o.status > 'PUBLISHED')";

/// `({alias}machine = ? AND {alias}entity_id = ? AND {alias}version = ?) OR …`, one group
/// per key; `alias` is a table alias with its dot (`"o."`), or `""`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn keys_in(alias: &str, n: usize) -> String {
    let one = format!("({alias}machine = ? AND {alias}entity_id = ? AND {alias}version = ?)");
    format!("({})", vec![one; n.max(1)].join(" OR "))
}

/// `sql` as written, for a backend whose parameters are `?`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn as_written(sql: &str) -> String {
    sql.to_string()
}

/// `sql` with its `?` parameters numbered `$1`, `$2`, … (PostgreSQL). The statements
/// here hold no other `?`.
#[cfg(feature = "postgres")]
pub(crate) fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// The methods of [`OutboxStore`](crate::outbox::OutboxStore) whose statements have the
/// same shape on every backend, for the backend's connection type `$conn`, its
/// millisecond clock `$now`, its event columns `$columns` (SQL text, over `outbox AS o`)
/// and its parameter style `$params` ([`as_written`] or [`numbered`]).
macro_rules! shared_outbox_statements {
    ($conn:ty, now = $now:expr, columns = $columns:expr, params = $params:path) => {
        async fn mark_failed(
            &self,
            conn: &mut $conn,
            f: &$crate::outbox::FailedEvent<'_>,
        ) -> Result<bool, sqlx::Error> {
            let sql = $params(&format!(
                "UPDATE outbox SET status = CASE WHEN ? THEN 'DEAD' ELSE 'PENDING' END, \
                     owner_token = NULL, lease_until = 0, next_at = {now} + ?, last_error = ? \
                 WHERE machine = ? AND entity_id = ? AND version = ? \
                   AND owner_token = ? AND status = 'PENDING'",
                now = $now
            ));
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(f.dead)
                .bind(f.retry_in_ms)
                .bind(f.error)
                .bind(&f.key.machine)
                .bind(f.key.entity_id)
                .bind(f.key.version)
                .bind(f.token)
                .execute(conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn requeue_event(
            &self,
            conn: &mut $conn,
            key: &$crate::outbox::EventKey,
        ) -> Result<bool, sqlx::Error> {
            let sql = $params(
                "UPDATE outbox SET status = 'PENDING', attempts = 0, owner_token = NULL, \
                     lease_until = 0, next_at = 0 \
                 WHERE machine = ? AND entity_id = ? AND version = ? AND status = 'DEAD'",
            );
            let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&key.machine)
            .bind(key.entity_id)
            .bind(key.version)
            .execute(conn)
            .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn list_events(
            &self,
            conn: &mut $conn,
            status: &str,
            limit: i64,
        ) -> Result<Vec<$crate::outbox::EventRow>, sqlx::Error> {
            let sql = $params(&format!(
                "SELECT {columns} FROM outbox AS o WHERE o.status = ? \
                 ORDER BY o.machine, o.entity_id, o.version LIMIT ?",
                columns = $columns
            ));
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(status)
                .bind(limit)
                .fetch_all(conn)
                .await?;
            // A row that does not read as an event is left out of the list (and named in
            // the log): `list_corrupt` shows it.
            Ok(rows
                .iter()
                .filter_map(|row| match $crate::backend::outbox_sql::claimed(row) {
                    Ok(event) => Some(event),
                    Err(corrupt) => {
                        tracing::warn!(key = ?corrupt.key, reason = %corrupt.reason, "an outbox row does not read as an event");
                        None
                    }
                })
                .collect())
        }
    };
}

pub(crate) use shared_outbox_statements;

/// [`OutboxStore::mark_published`](crate::outbox::OutboxStore::mark_published) with the
/// batch's keys as `OR`ed groups (MySQL/MariaDB, SQLite; PostgreSQL matches them against
/// arrays, which it plans cheaper), for the backend's connection type `$conn`, its clock
/// `$now` and its parameter style `$params`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! or_keys_mark_published {
    ($conn:ty, now = $now:expr, params = $params:path) => {
        async fn mark_published(
            &self,
            conn: &mut $conn,
            token: &str,
            keys: &[$crate::outbox::EventKey],
        ) -> Result<u64, sqlx::Error> {
            if keys.is_empty() {
                return Ok(0);
            }
            let sql = $params(&format!(
                "UPDATE outbox SET status = 'PUBLISHED', owner_token = NULL, lease_until = 0, \
                     last_error = NULL, published_at = {now} \
                 WHERE owner_token = ? AND status = 'PENDING' AND {keys}",
                now = $now,
                keys = $crate::backend::outbox_sql::keys_in("", keys.len())
            ));
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(token);
            for key in keys {
                query = query
                    .bind(key.machine.as_str())
                    .bind(key.entity_id)
                    .bind(key.version);
            }
            Ok(query.execute(conn).await?.rows_affected())
        }
    };
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use or_keys_mark_published;
