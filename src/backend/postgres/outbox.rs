//! The outbox on PostgreSQL: its SQL, and [`OutboxStore`] over it. The relay's claim is
//! one statement: an update of the events a `FOR UPDATE SKIP LOCKED` subquery chose, so
//! two relays never wait for, or claim, the same event. The statements whose shape it
//! shares with the other backends are in `backend/outbox_sql.rs`.

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::{MS, NOW, PgStore};
use crate::backend::names::{Names, PerNamespace};
use crate::backend::outbox_sql::{self, ATTEMPT, OutboxStatements, UNKNOWN_STATUS, claimed};
use crate::backend::sql::Params;
use crate::outbox::{
    ClaimEvents, ClaimedEvent, CorruptRow, EventKey, EventRow, FailedEvent, OutboxStore, StatsRow,
};

/// An event's age in milliseconds, on the database's clock.
macro_rules! age_ms {
    () => {
        "CASE WHEN isfinite(o.created_at) THEN (extract(epoch FROM clock_timestamp() - o.created_at) * 1000)::bigint END"
    };
}

/// [`age_ms!`], for the operators' filter of dead events.
#[cfg(feature = "admin")]
pub(super) const AGE_MS: &str = age_ms!();

/// An event's columns, its age on the database's clock.
/// (`NULL` for an infinite `created_at`: the subtraction would fail the statement.)
pub(super) const EVENT_COLUMNS: &str = concat!(
    "o.machine, o.entity_id, o.version, o.event, o.transition, o.from_status, o.to_status, \
     o.ref_id, o.body, o.status, o.attempts, o.last_error, o.traceparent, o.tracestate, ",
    age_ms!(),
    " AS age_ms"
);

/// No earlier event of `o`'s entity is unpublished (pending, dead, or in a status
/// orderly never writes).
fn head(n: &Names) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM {outbox} AS p WHERE p.machine = o.machine \
         AND p.entity_id = o.entity_id AND p.status <> 'PUBLISHED' AND p.version < o.version)",
        outbox = n.outbox
    )
}

/// A row orderly never writes (see `OutboxStore::list_corrupt`); `$1` is the longest lease
/// a relay takes, in milliseconds.
fn corrupt() -> String {
    format!(
        "({UNKNOWN_STATUS} OR (o.status = 'PENDING' AND o.lease_until > {clock} + $1))",
        clock = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    )
}

/// The statements every backend shares, built once per namespace.
static STATEMENTS: PerNamespace<OutboxStatements> =
    PerNamespace::new(|n| OutboxStatements::new(n, NOW, EVENT_COLUMNS, Params::Dollar));

impl OutboxStore for PgStore {
    async fn mark_failed(
        &self,
        conn: &mut PgConnection,
        f: &FailedEvent<'_>,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::mark_failed::<Postgres>(conn, STATEMENTS.get(self.names()), f).await
    }

    async fn requeue_event(
        &self,
        conn: &mut PgConnection,
        key: &EventKey,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::requeue_event::<Postgres>(conn, STATEMENTS.get(self.names()), key).await
    }

    async fn discard_event(
        &self,
        conn: &mut PgConnection,
        key: &EventKey,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::discard_event::<Postgres>(conn, STATEMENTS.get(self.names()), key).await
    }

    async fn list_events(
        &self,
        conn: &mut PgConnection,
        status: &str,
        limit: i64,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        outbox_sql::list_events::<Postgres>(conn, STATEMENTS.get(self.names()), status, limit).await
    }

    /// The batch's keys as three arrays (see `key_arrays`).
    async fn mark_published(
        &self,
        conn: &mut PgConnection,
        token: &str,
        keys: &[crate::outbox::EventKey],
    ) -> Result<u64, sqlx::Error> {
        if keys.is_empty() {
            return Ok(0);
        }
        let (machines, entities, versions) = key_arrays(keys);
        Ok(sqlx::query(MARK_PUBLISHED.get(self.names()).clone())
            .bind(token)
            .bind(machines)
            .bind(entities)
            .bind(versions)
            .execute(conn)
            .await?
            .rows_affected())
    }

    async fn claim_events(
        &self,
        conn: &mut PgConnection,
        c: &ClaimEvents<'_>,
    ) -> Result<Vec<ClaimedEvent>, sqlx::Error> {
        let rows = sqlx::query(CLAIM_EVENTS.get(self.names()).clone())
            .bind(c.token)
            .bind(c.lease_ms)
            .bind(c.limit)
            .fetch_all(conn)
            .await?;
        Ok(rows.iter().map(claimed).collect())
    }

    /// One statement: the claim's choice, `FOR UPDATE SKIP LOCKED`, returning the rows.
    /// (Its snapshot is taken before it locks: an event committed after it began is not
    /// seen at all, so an entity's later event never looks like its earliest.)
    async fn lock_events(
        &self,
        conn: &mut PgConnection,
        limit: i64,
    ) -> Result<Option<Vec<ClaimedEvent>>, sqlx::Error> {
        crate::backend::units::begin_rules_unit::<Postgres>(
            conn,
            crate::store::Txn::Own,
            None,
            false,
        )
        .await?;
        let rows = sqlx::query(LOCK_EVENTS.get(self.names()).clone())
            .bind(limit)
            .fetch_all(conn)
            .await?;
        Ok(Some(rows.iter().map(claimed).collect()))
    }

    async fn settle_locked(
        &self,
        conn: &mut PgConnection,
        published: &[EventKey],
        failed: &[FailedEvent<'_>],
    ) -> Result<u64, sqlx::Error> {
        let mut marked = 0;
        if !published.is_empty() {
            let (machines, entities, versions) = key_arrays(published);
            marked = sqlx::query(PUBLISHED_LOCKED.get(self.names()).clone())
                .bind(machines)
                .bind(entities)
                .bind(versions)
                .execute(&mut *conn)
                .await?
                .rows_affected();
        }
        outbox_sql::settle_failed_and_commit::<Postgres>(
            conn,
            STATEMENTS.get(self.names()),
            failed,
        )
        .await?;
        Ok(marked)
    }

    async fn list_corrupt(
        &self,
        conn: &mut PgConnection,
        max_lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<CorruptRow>, sqlx::Error> {
        sqlx::query_as(LIST_CORRUPT.get(self.names()).clone())
            .bind(max_lease_ms)
            .bind(limit)
            .fetch_all(conn)
            .await
    }

    async fn purge_published(
        &self,
        conn: &mut PgConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(PURGE_PUBLISHED.get(self.names()).clone())
            .bind(retention_ms)
            .bind(limit)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn outbox_stats(
        &self,
        conn: &mut PgConnection,
        max_lease_ms: i64,
    ) -> Result<StatsRow, sqlx::Error> {
        sqlx::query_as(OUTBOX_STATS.get(self.names()).clone())
            .bind(max_lease_ms)
            .fetch_one(conn)
            .await
    }

    async fn inbox_insert(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(INBOX_INSERT.get(self.names()).clone())
            .bind(consumer)
            .bind(message_id)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn inbox_purge(
        &self,
        conn: &mut PgConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(INBOX_PURGE.get(self.names()).clone())
            .bind(retention_ms)
            .bind(limit)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }
}

/// A batch's keys as three arrays, matched with `unnest`: a list of `OR`ed groups (one
/// per event, up to the relay's batch) cost the server about four times as much to plan
/// and run.
fn key_arrays(keys: &[EventKey]) -> (Vec<&str>, Vec<i64>, Vec<i64>) {
    (
        keys.iter().map(|k| k.machine.as_str()).collect(),
        keys.iter().map(|k| k.entity_id).collect(),
        keys.iter().map(|k| k.version).collect(),
    )
}

/// The statement of `lock_events`, built once per namespace.
static LOCK_EVENTS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW} SELECT {EVENT_COLUMNS} FROM {outbox} AS o, now \
         WHERE o.status = 'PENDING' AND o.next_at <= now.ms AND o.lease_until <= now.ms AND {head} \
         LIMIT $1 FOR UPDATE OF o SKIP LOCKED",
        outbox = n.outbox,
        head = head(n)
    ))
    .into_sql_str()
});

/// The statement of `settle_locked` for the published events, built once per namespace.
static PUBLISHED_LOCKED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "UPDATE {outbox} SET status = 'PUBLISHED', owner_token = NULL, lease_until = 0, \
             last_error = NULL, published_at = {NOW}, next_at = {NOW}, attempts = {ATTEMPT} \
         WHERE status = 'PENDING' AND (machine, entity_id, version) IN \
               (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]))",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// The statement of `mark_published`, built once per namespace.
static MARK_PUBLISHED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "UPDATE {outbox} SET status = 'PUBLISHED', owner_token = NULL, lease_until = 0, \
             last_error = NULL, published_at = {NOW}, next_at = {NOW} \
         WHERE owner_token = $1 AND status = 'PENDING' \
           AND (machine, entity_id, version) IN \
               (SELECT * FROM unnest($2::text[], $3::bigint[], $4::bigint[]))",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// The statement of `claim_events`, built once per namespace.
static CLAIM_EVENTS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW}, chosen AS ( \
             SELECT o.machine, o.entity_id, o.version FROM {outbox} AS o, now \
             WHERE o.status = 'PENDING' AND o.next_at <= now.ms AND o.lease_until <= now.ms AND {head} \
             LIMIT $3 FOR UPDATE OF o SKIP LOCKED) \
         UPDATE {outbox} AS o SET owner_token = $1, lease_until = {MS} + $2, \
             attempts = LEAST(GREATEST(o.attempts, 0)::bigint + 1, 2147483647)::int \
         FROM chosen \
         WHERE o.machine = chosen.machine AND o.entity_id = chosen.entity_id AND o.version = chosen.version \
         RETURNING {EVENT_COLUMNS}",
        outbox = n.outbox,
        head = head(n)
    )).into_sql_str()
});

/// The statement of `purge_published`, built once per namespace.
static PURGE_PUBLISHED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW}, gone AS ( \
             SELECT o.machine, o.entity_id, o.version FROM {outbox} AS o, now \
             WHERE o.status = 'PUBLISHED' AND o.published_at <= now.ms - $1 \
             LIMIT $2 FOR UPDATE OF o SKIP LOCKED) \
         DELETE FROM {outbox} AS o USING gone \
         WHERE o.machine = gone.machine AND o.entity_id = gone.entity_id AND o.version = gone.version",
        outbox = n.outbox
    )).into_sql_str()
});

/// The statement of `inbox_insert`, built once per namespace.
static INBOX_INSERT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "INSERT INTO {inbox} (consumer, message_id, received_at) \
         VALUES ($1, $2, (extract(epoch FROM clock_timestamp()) * 1000)::bigint) \
         ON CONFLICT (consumer, message_id) DO NOTHING",
        inbox = n.inbox
    ))
    .into_sql_str()
});

/// The statement of `inbox_purge`, built once per namespace.
static INBOX_PURGE: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW}, gone AS ( \
             SELECT i.consumer, i.message_id FROM {inbox} AS i, now \
             WHERE i.received_at <= now.ms - $1 LIMIT $2 FOR UPDATE OF i SKIP LOCKED) \
         DELETE FROM {inbox} AS i USING gone \
         WHERE i.consumer = gone.consumer AND i.message_id = gone.message_id",
        inbox = n.inbox
    ))
    .into_sql_str()
});

/// The statement of `list_corrupt`, built once per namespace. The rows are found first
/// (through the status index: the unknown statuses and the pending rows) and ordered
/// after, behind `OFFSET 0`: with the order and limit in the same query the planner
/// expects the few corrupt rows early in the primary key and reads the whole outbox
/// through it (450 ms at a million rows, none found).
static LIST_CORRUPT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT c.machine, c.entity_id::text AS entity_id, c.version::text AS version, c.status, c.reason \
         FROM (SELECT o.machine, o.entity_id, o.version, o.status, \
                   CASE WHEN {UNKNOWN_STATUS} THEN 'a status orderly never writes' \
                        ELSE 'claimed by ' || COALESCE(o.owner_token, '?') || ' with a lease past the longest a relay takes' END AS reason \
               FROM {outbox} AS o WHERE {corrupt} OFFSET 0) AS c \
         ORDER BY c.machine, c.entity_id, c.version LIMIT $2",
        outbox = n.outbox,
        corrupt = corrupt()
    )).into_sql_str()
});

/// The statement of `outbox_stats`, built once per namespace.
static OUTBOX_STATS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE status = 'PENDING') AS pending, \
                count(*) FILTER (WHERE status = 'DEAD') AS dead, \
                COALESCE((extract(epoch FROM clock_timestamp() - \
                    min(created_at) FILTER (WHERE status = 'PENDING' AND isfinite(created_at))) \
                    * 1000)::bigint, 0) AS oldest_pending_ms, \
                (SELECT count(*) FROM {outbox} AS o WHERE {corrupt}) AS corrupt \
         FROM {outbox} WHERE status IN ('PENDING', 'DEAD')",
        outbox = n.outbox,
        corrupt = corrupt()
    ))
    .into_sql_str()
});
