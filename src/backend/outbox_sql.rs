//! The outbox statements whose shape every backend shares, written once with `?N`
//! parameters ([`OutboxStatements`], and the list of a batch's keys as `OR`ed groups for
//! the backends that take it): each backend's `outbox.rs` builds them once with its
//! clock, its event columns and its parameter style, calls the functions here from its
//! methods of [`OutboxStore`](crate::outbox::OutboxStore), and writes its own claim,
//! stats, purge and inbox statements.

use sqlx::Executor;

use crate::backend::names::Names;
#[cfg(feature = "sqlite")]
use crate::backend::sql::BySize;
use crate::backend::sql::{Arg, Binds, Params, Statement};
use crate::outbox::{ClaimedEvent, CorruptEvent, EventKey, EventRow, FailedEvent};
use crate::support::trace::TraceContext;

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
    let event = <EventRow as sqlx::FromRow<'r, R>>::from_row(row).map(|event| EventRow {
        trace: stored_trace(row, &event),
        ..event
    });
    event.map_err(|e| {
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

/// The trace context stored with an event, leniently: none when its columns are not
/// there, do not decode, or do not read as a W3C trace context (named in the log then);
/// a `tracestate` that does not read is left out.
fn stored_trace<'r, R>(row: &'r R, event: &EventRow) -> Option<TraceContext>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let read = |column: &'static str| row.try_get::<Option<String>, _>(column).ok().flatten();
    let traceparent = read("traceparent")?;
    let trace = TraceContext::from_values(Some(&traceparent), read("tracestate").as_deref());
    if trace.is_none() {
        tracing::warn!(
            machine = %event.machine,
            entity_id = event.entity_id,
            version = event.version,
            "an outbox row's traceparent does not read; the event is published without it"
        );
    }
    trace
}

/// A status orderly never writes, as index ranges around the three it does (a `NOT IN`
/// would read every published row).
pub(crate) const UNKNOWN_STATUS: &str = "(o.status < 'DEAD' OR (o.status > 'DEAD' AND o.status < 'PENDING') \
    OR (o.status > 'PENDING' AND o.status < 'PUBLISHED') OR o.status > 'PUBLISHED')";

/// `({alias}machine = ? AND {alias}entity_id = ? AND {alias}version = ?) OR …`, one group
/// per key; `alias` is a table alias with its dot (`"o."`), or `""`.
#[cfg(feature = "sqlite")]
pub(crate) fn keys_in(alias: &str, n: usize) -> String {
    let one = format!("({alias}machine = ? AND {alias}entity_id = ? AND {alias}version = ?)");
    format!("({})", vec![one; n.max(1)].join(" OR "))
}

/// One more attempt, saturating (a negative count orderly never writes counts from 0).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const ATTEMPT: &str = "LEAST(GREATEST(attempts, 0), 2147483646) + 1";

/// The statements of the methods every backend shares, built once.
#[derive(Debug)]
pub(crate) struct OutboxStatements {
    /// A claimed event back to PENDING (or DEAD), fenced by its claim: 1 dead, 2 retry
    /// in ms, 3 error, 4 machine, 5 entity id, 6 version, 7 token.
    mark_failed: Statement,
    /// A locked event back to PENDING (or DEAD), one more attempt counted, fenced by the
    /// row lock its relay holds: 1 dead, 2 retry in ms, 3 error, 4 machine, 5 entity id,
    /// 6 version.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    failed_locked: Statement,
    /// A dead event back to PENDING: 1 machine, 2 entity id, 3 version.
    requeue: Statement,
    /// A dead event deleted: 1 machine, 2 entity id, 3 version.
    discard: Statement,
    /// Events in a status, in key order: 1 status, 2 limit.
    list: Statement,
    /// A claim's events published, their keys as `OR`ed groups, sized by the batch:
    /// 1 token, then machine, entity id and version of each (plain `?`s, bound in order;
    /// PostgreSQL and MySQL/MariaDB have their own statements).
    #[cfg(feature = "sqlite")]
    mark_published: BySize,
}

impl OutboxStatements {
    /// The statements with the backend's millisecond clock `now`, its event columns
    /// `columns` (SQL text, over `outbox AS o`) and its parameter style.
    pub(crate) fn new(n: &Names, now: &str, columns: &str, params: Params) -> Self {
        let outbox = &n.outbox;
        let s = |sql: String| Statement::shared(sql, params);
        OutboxStatements {
            mark_failed: s(format!(
                "UPDATE {outbox} SET status = CASE WHEN ?1 THEN 'DEAD' ELSE 'PENDING' END, \
                     owner_token = NULL, lease_until = 0, next_at = {now} + ?2, last_error = ?3 \
                 WHERE machine = ?4 AND entity_id = ?5 AND version = ?6 \
                   AND owner_token = ?7 AND status = 'PENDING'"
            )),
            #[cfg(any(feature = "postgres", feature = "mysql"))]
            failed_locked: s(format!(
                "UPDATE {outbox} SET status = CASE WHEN ?1 THEN 'DEAD' ELSE 'PENDING' END, \
                     owner_token = NULL, lease_until = 0, next_at = {now} + ?2, last_error = ?3, \
                     attempts = {ATTEMPT} \
                 WHERE machine = ?4 AND entity_id = ?5 AND version = ?6 AND status = 'PENDING'"
            )),
            requeue: s(format!(
                "UPDATE {outbox} SET status = 'PENDING', attempts = 0, owner_token = NULL, \
                     lease_until = 0, next_at = 0 \
                 WHERE machine = ?1 AND entity_id = ?2 AND version = ?3 AND status = 'DEAD'"
            )),
            discard: s(format!(
                "DELETE FROM {outbox} \
                 WHERE machine = ?1 AND entity_id = ?2 AND version = ?3 AND status = 'DEAD'"
            )),
            list: s(format!(
                "SELECT {columns} FROM {outbox} AS o WHERE o.status = ?1 \
                 ORDER BY o.machine, o.entity_id, o.version LIMIT ?2"
            )),
            #[cfg(feature = "sqlite")]
            mark_published: {
                let (now, outbox) = (now.to_string(), outbox.clone());
                BySize::new(move |n| {
                    format!(
                        "UPDATE {outbox} SET status = 'PUBLISHED', owner_token = NULL, lease_until = 0, \
                             last_error = NULL, published_at = {now}, next_at = {now} \
                         WHERE owner_token = ? AND status = 'PENDING' AND {keys}",
                        keys = keys_in("", n)
                    )
                })
            },
        }
    }
}

/// [`OutboxStore::mark_failed`](crate::outbox::OutboxStore::mark_failed).
pub(crate) async fn mark_failed<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OutboxStatements,
    f: &FailedEvent<'_>,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Bool(f.dead),
        Arg::I64(f.retry_in_ms),
        Arg::Str(f.error),
        Arg::Str(&f.key.machine),
        Arg::I64(f.key.entity_id),
        Arg::I64(f.key.version),
        Arg::Str(f.token),
    ];
    let done = s.mark_failed.query::<DB>(&args)?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// The failures of [`OutboxStore::settle_locked`](crate::outbox::OutboxStore::settle_locked),
/// one statement each, inside the lock's transaction; then the commit (sqlx's count of
/// open transactions back to none, whatever the commit answers).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn settle_failed_and_commit<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OutboxStatements,
    failed: &[FailedEvent<'_>],
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for f in failed {
        let args = [
            Arg::Bool(f.dead),
            Arg::I64(f.retry_in_ms),
            Arg::Str(f.error),
            Arg::Str(&f.key.machine),
            Arg::I64(f.key.entity_id),
            Arg::I64(f.key.version),
        ];
        s.failed_locked
            .query::<DB>(&args)?
            .execute(&mut *conn)
            .await?;
    }
    crate::backend::units::end_rules_unit::<DB>(conn, true, 0).await
}

/// Runs `statement` on the event of `key` (1 machine, 2 entity id, 3 version); whether
/// it changed that one row.
async fn on_event<DB: Binds>(
    conn: &mut DB::Connection,
    statement: &Statement,
    key: &EventKey,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let args = [
        Arg::Str(&key.machine),
        Arg::I64(key.entity_id),
        Arg::I64(key.version),
    ];
    let done = statement.query::<DB>(&args)?.execute(conn).await?;
    Ok(DB::rows_affected(&done) == 1)
}

/// [`OutboxStore::requeue_event`](crate::outbox::OutboxStore::requeue_event).
pub(crate) async fn requeue_event<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OutboxStatements,
    key: &EventKey,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    on_event::<DB>(conn, &s.requeue, key).await
}

/// [`OutboxStore::discard_event`](crate::outbox::OutboxStore::discard_event).
pub(crate) async fn discard_event<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OutboxStatements,
    key: &EventKey,
) -> Result<bool, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    on_event::<DB>(conn, &s.discard, key).await
}

/// [`OutboxStore::list_events`](crate::outbox::OutboxStore::list_events). A row that does
/// not read as an event is left out of the list (and named in the log): `list_corrupt`
/// shows it.
pub(crate) async fn list_events<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OutboxStatements,
    status: &str,
    limit: i64,
) -> Result<Vec<EventRow>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    EventRow: for<'r> sqlx::FromRow<'r, DB::Row>,
    &'static str: sqlx::ColumnIndex<DB::Row>,
    String: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    Vec<u8>: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i64: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
    i32: for<'r> sqlx::Decode<'r, DB> + sqlx::Type<DB>,
{
    let rows = s
        .list
        .query::<DB>(&[Arg::Str(status), Arg::I64(limit)])?
        .fetch_all(conn)
        .await?;
    Ok(readable(&rows))
}

/// The rows that read as events, to be shown: a text whose bytes are not UTF-8 (which
/// SQLite stores as given) reads with U+FFFD in their place, where the relay's claim sets
/// the row aside. Each row that still does not read is named in the log (and listed by
/// `list_corrupt`).
pub(crate) fn readable<'r, R>(rows: &'r [R]) -> Vec<EventRow>
where
    R: sqlx::Row,
    EventRow: sqlx::FromRow<'r, R>,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.iter()
        .filter_map(|row| match claimed(row).or_else(|e| shown(row).map_err(|_| e)) {
            Ok(event) => Some(event),
            Err(corrupt) => {
                tracing::warn!(key = ?corrupt.key, reason = %corrupt.reason, "an outbox row does not read as an event");
                None
            }
        })
        .collect()
}

/// An outbox row read to be shown, its texts lossily (`support::text::lossy`).
fn shown<'r, R>(row: &'r R) -> Result<EventRow, sqlx::Error>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    use crate::support::text::{lossy, lossy_or_none};
    let event = EventRow {
        machine: lossy(row, "machine")?,
        entity_id: row.try_get("entity_id")?,
        version: row.try_get("version")?,
        event: lossy(row, "event")?,
        transition: lossy(row, "transition")?,
        from_status: lossy(row, "from_status")?,
        to_status: lossy(row, "to_status")?,
        ref_id: lossy(row, "ref_id")?,
        body: lossy_or_none(row, "body")?,
        status: lossy(row, "status")?,
        attempts: row.try_get("attempts")?,
        last_error: lossy_or_none(row, "last_error")?,
        age_ms: row.try_get("age_ms")?,
        trace: None,
    };
    Ok(EventRow {
        trace: stored_trace(row, &event),
        ..event
    })
}

/// [`OutboxStore::mark_published`](crate::outbox::OutboxStore::mark_published) with the
/// batch's keys as `OR`ed groups (SQLite, whose plain `?`s bind in order; PostgreSQL
/// matches them against arrays, MySQL/MariaDB joins them as a JSON table: each plans
/// those cheaper).
#[cfg(feature = "sqlite")]
pub(crate) async fn mark_published_or_keys<DB: Binds>(
    conn: &mut DB::Connection,
    s: &OutboxStatements,
    token: &str,
    keys: &[EventKey],
) -> Result<u64, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    if keys.is_empty() {
        return Ok(0);
    }
    let mut values = vec![Arg::Str(token)];
    for key in keys {
        values.extend([
            Arg::Str(&key.machine),
            Arg::I64(key.entity_id),
            Arg::I64(key.version),
        ]);
    }
    let args = crate::backend::sql::arguments::<DB>(&values)?;
    let done = sqlx::query_with(s.mark_published.get(keys.len()), args)
        .execute(conn)
        .await?;
    Ok(DB::rows_affected(&done))
}
