//! The outbox on SQLite: its SQL, and [`OutboxStore`] over it. The single writer makes
//! the relay's claim one `UPDATE … RETURNING` of the events its subquery chose. The
//! statements it shares with MySQL/MariaDB are in `backend/outbox_sql.rs`.

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::SqliteStore;
use crate::backend::names::PerNamespace;
use crate::backend::outbox_sql::{self, OutboxStatements, UNKNOWN_STATUS, claimed};
use crate::backend::sql::Params;
use crate::outbox::{
    ClaimEvents, ClaimedEvent, CorruptRow, EventKey, EventRow, FailedEvent, OutboxStore, StatsRow,
};

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// An event's age in milliseconds, on the database's clock.
macro_rules! age_ms {
    () => {
        "CAST((julianday('now') - julianday(created_at)) * 86400000 AS INTEGER)"
    };
}

/// [`age_ms!`], for the operators' filter of dead events.
#[cfg(feature = "admin")]
pub(super) const AGE_MS: &str = age_ms!();

/// An event's columns, its age on the database's clock.
pub(super) const EVENT_COLUMNS: &str = concat!(
    "machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, \
     status, attempts, last_error, traceparent, tracestate, ",
    age_ms!(),
    " AS age_ms"
);

/// An event's key as SQLite holds it: integers (a column's type is only a hint in SQLite;
/// a row with a text version could be neither ordered nor named).
const INTEGER_KEY: &str = "typeof(o.entity_id) = 'integer' AND typeof(o.version) = 'integer'";

/// A row orderly never writes (see `OutboxStore::list_corrupt`), and why; `?1` is the
/// longest lease a relay takes, in milliseconds.
fn corrupt() -> (String, String) {
    let lease = format!("(o.status = 'PENDING' AND o.lease_until > {NOW} + ?1)");
    let keys = format!("(o.status <> 'PUBLISHED' AND NOT ({INTEGER_KEY}))");
    let types = "(o.status <> 'PUBLISHED' AND (typeof(o.body) NOT IN ('text', 'null') \
        OR typeof(o.attempts) <> 'integer'))";
    let reason = format!(
        "CASE WHEN typeof(o.status) <> 'text' OR {UNKNOWN_STATUS} THEN 'a status orderly never writes' \
              WHEN {keys} THEN 'an entity id or version that is not an integer' \
              WHEN {types} THEN 'a column of the wrong type' \
              ELSE 'claimed by ' || COALESCE(o.owner_token, '?') || ' with a lease past the longest a relay takes' END"
    );
    (
        format!("(typeof(o.status) <> 'text' OR {UNKNOWN_STATUS} OR {lease} OR {keys} OR {types})"),
        reason,
    )
}

/// The statements every backend shares, built once per namespace.
static STATEMENTS: PerNamespace<OutboxStatements> =
    PerNamespace::new(|n| OutboxStatements::new(n, NOW, EVENT_COLUMNS, Params::Numbered));

impl OutboxStore for SqliteStore {
    async fn mark_failed(
        &self,
        conn: &mut SqliteConnection,
        f: &FailedEvent<'_>,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::mark_failed::<Sqlite>(conn, STATEMENTS.get(self.names()), f).await
    }

    async fn requeue_event(
        &self,
        conn: &mut SqliteConnection,
        key: &EventKey,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::requeue_event::<Sqlite>(conn, STATEMENTS.get(self.names()), key).await
    }

    async fn discard_event(
        &self,
        conn: &mut SqliteConnection,
        key: &EventKey,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::discard_event::<Sqlite>(conn, STATEMENTS.get(self.names()), key).await
    }

    async fn list_events(
        &self,
        conn: &mut SqliteConnection,
        status: &str,
        limit: i64,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        outbox_sql::list_events::<Sqlite>(conn, STATEMENTS.get(self.names()), status, limit).await
    }

    async fn mark_published(
        &self,
        conn: &mut SqliteConnection,
        token: &str,
        keys: &[EventKey],
    ) -> Result<u64, sqlx::Error> {
        outbox_sql::mark_published_or_keys::<Sqlite>(
            conn,
            STATEMENTS.get(self.names()),
            token,
            keys,
        )
        .await
    }

    async fn claim_events(
        &self,
        conn: &mut SqliteConnection,
        c: &ClaimEvents<'_>,
    ) -> Result<Vec<ClaimedEvent>, sqlx::Error> {
        let rows = sqlx::query(CLAIM_EVENTS.get(self.names()).clone())
            .bind(c.token)
            .bind(c.lease_ms)
            .bind(c.limit)
            .fetch_all(conn)
            .await?;
        Ok(rows.iter().map(set_dead_or_claimed).collect())
    }

    async fn list_corrupt(
        &self,
        conn: &mut SqliteConnection,
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
        conn: &mut SqliteConnection,
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
        conn: &mut SqliteConnection,
        max_lease_ms: i64,
    ) -> Result<StatsRow, sqlx::Error> {
        sqlx::query_as(OUTBOX_STATS.get(self.names()).clone())
            .bind(max_lease_ms)
            .fetch_one(conn)
            .await
    }

    async fn inbox_insert(
        &self,
        conn: &mut SqliteConnection,
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
        conn: &mut SqliteConnection,
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

/// A claimed row the claim itself set `DEAD` (its key is not an integer): reported as
/// set aside, with the reason it was given; any other row as it reads.
fn set_dead_or_claimed(row: &sqlx::sqlite::SqliteRow) -> ClaimedEvent {
    use sqlx::Row;
    if row
        .try_get::<String, _>("status")
        .is_ok_and(|s| s == "DEAD")
    {
        return Err(crate::outbox::CorruptEvent {
            key: None,
            reason: row
                .try_get::<String, _>("last_error")
                .unwrap_or_else(|_| NOT_AN_INTEGER_KEY.into()),
        });
    }
    claimed(row)
}

/// Why a row whose entity id or version is not an integer is set aside.
const NOT_AN_INTEGER_KEY: &str = "an entity id or version that is not an integer";

/// The statement of `claim_events`, built once per namespace. SQLite keeps any value in any column: a
/// pending row whose entity id or version is not an integer can be neither ordered among
/// its entity's events nor named as a message, so the claim that meets it sets it `DEAD`
/// with its reason (a relay cannot fence a later write to a key it cannot name). Such a
/// row holds back no other event: whose entity it was cannot be known.
static CLAIM_EVENTS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    let key = "typeof(entity_id) = 'integer' AND typeof(version) = 'integer'";
    let outbox = &n.outbox;
    AssertSqlSafe(format!(
        "UPDATE {outbox} SET owner_token = ?1, lease_until = {NOW} + ?2, \
             attempts = MIN(MAX(attempts, 0) + 1, 2147483647), \
             status = CASE WHEN {key} THEN status ELSE 'DEAD' END, \
             last_error = CASE WHEN {key} THEN last_error \
                 ELSE 'corrupt row: {NOT_AN_INTEGER_KEY} (entity id ' || quote(entity_id) || ', version ' \
                     || quote(version) || '): set aside by the relay, never published' END \
         WHERE (machine, entity_id, version) IN ( \
             SELECT o.machine, o.entity_id, o.version FROM {outbox} AS o \
             WHERE o.status = 'PENDING' AND o.next_at <= {NOW} AND o.lease_until <= {NOW} \
               AND (NOT ({INTEGER_KEY}) \
                 OR NOT EXISTS (SELECT 1 FROM {outbox} AS p WHERE p.machine = o.machine \
                   AND p.entity_id = o.entity_id AND p.status <> 'PUBLISHED' \
                   AND p.version < o.version)) \
             LIMIT ?3) \
         RETURNING {EVENT_COLUMNS}"
    ))
    .into_sql_str()
});

/// The statement of `purge_published`, built once per namespace.
static PURGE_PUBLISHED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    let outbox = &n.outbox;
    AssertSqlSafe(format!(
        "DELETE FROM {outbox} WHERE (machine, entity_id, version) IN ( \
             SELECT machine, entity_id, version FROM {outbox} \
             WHERE status = 'PUBLISHED' AND published_at <= {NOW} - ?1 LIMIT ?2)"
    ))
    .into_sql_str()
});

/// The statement of `inbox_insert`, built once per namespace.
static INBOX_INSERT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    let inbox = &n.inbox;
    AssertSqlSafe(format!(
        "INSERT INTO {inbox} (consumer, message_id, received_at) VALUES (?1, ?2, {NOW}) \
         ON CONFLICT (consumer, message_id) DO NOTHING"
    ))
    .into_sql_str()
});

/// The statement of `inbox_purge`, built once per namespace.
static INBOX_PURGE: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    let inbox = &n.inbox;
    AssertSqlSafe(format!(
        "DELETE FROM {inbox} WHERE (consumer, message_id) IN ( \
             SELECT consumer, message_id FROM {inbox} WHERE received_at <= {NOW} - ?1 LIMIT ?2)"
    ))
    .into_sql_str()
});

/// The statement of `list_corrupt`, built once per namespace.
static LIST_CORRUPT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    let (corrupt, reason) = corrupt();
    let outbox = &n.outbox;
    AssertSqlSafe(format!(
        "SELECT CAST(o.machine AS TEXT) AS machine, CAST(o.entity_id AS TEXT) AS entity_id, \
                CAST(o.version AS TEXT) AS version, CAST(o.status AS TEXT) AS status, {reason} AS reason \
         FROM {outbox} AS o WHERE {corrupt} \
         ORDER BY o.machine, o.entity_id, o.version LIMIT ?2"
    )).into_sql_str()
});

/// The statement of `outbox_stats`, built once per namespace.
static OUTBOX_STATS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    let (corrupt, _) = corrupt();
    let outbox = &n.outbox;
    AssertSqlSafe(format!(
        "SELECT COALESCE(SUM(status = 'PENDING'), 0) AS pending, \
                COALESCE(SUM(status = 'DEAD'), 0) AS dead, \
                COALESCE(CAST((julianday('now') - julianday( \
                    MIN(CASE WHEN status = 'PENDING' AND julianday(created_at) IS NOT NULL \
                        THEN created_at END))) * 86400000 AS INTEGER), 0) \
                    AS oldest_pending_ms, \
                (SELECT count(*) FROM {outbox} AS o WHERE {corrupt}) AS corrupt \
         FROM {outbox} WHERE status IN ('PENDING', 'DEAD')"
    ))
    .into_sql_str()
});
