//! The outbox on SQLite: its SQL, and [`OutboxStore`] over it. The single writer makes
//! the relay's claim one `UPDATE … RETURNING` of the events its subquery chose. The
//! statements it shares with MySQL/MariaDB are in `store/outbox_sql.rs`.

use sqlx::sqlite::SqliteConnection;

use super::SqliteStore;
use crate::outbox::{ClaimEvents, EventRow, OutboxStore, StatsRow};
use crate::store::outbox_sql::{as_written, or_keys_mark_published, shared_outbox_statements};

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// An event's columns, its age on the database's clock.
const EVENT_COLUMNS: &str = "machine, entity_id, version, event, transition, from_status, \
    to_status, ref_id, body, status, attempts, last_error, \
    CAST((julianday('now') - julianday(created_at)) * 86400000 AS INTEGER) AS age_ms";

impl OutboxStore for SqliteStore {
    shared_outbox_statements!(
        SqliteConnection,
        now = NOW,
        columns = EVENT_COLUMNS,
        params = as_written
    );
    or_keys_mark_published!(SqliteConnection, now = NOW, params = as_written);

    async fn claim_events(
        &self,
        conn: &mut SqliteConnection,
        c: &ClaimEvents<'_>,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        let sql = format!(
            "UPDATE outbox SET owner_token = ?1, lease_until = {NOW} + ?2, \
                 attempts = MIN(MAX(attempts, 0) + 1, 2147483647) \
             WHERE (machine, entity_id, version) IN ( \
                 SELECT o.machine, o.entity_id, o.version FROM outbox AS o \
                 WHERE o.status = 'PENDING' AND o.next_at <= {NOW} AND o.lease_until <= {NOW} \
                   AND NOT EXISTS (SELECT 1 FROM outbox AS p WHERE p.machine = o.machine \
                       AND p.entity_id = o.entity_id AND p.status IN ('PENDING', 'DEAD') \
                       AND p.version < o.version) \
                 LIMIT ?3) \
             RETURNING {EVENT_COLUMNS}"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(c.token)
            .bind(c.lease_ms)
            .bind(c.limit)
            .fetch_all(conn)
            .await
    }

    async fn purge_published(
        &self,
        conn: &mut SqliteConnection,
        retention_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let sql = format!(
            "DELETE FROM outbox WHERE (machine, entity_id, version) IN ( \
                 SELECT machine, entity_id, version FROM outbox \
                 WHERE status = 'PUBLISHED' AND published_at <= {NOW} - ?1 LIMIT ?2)"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(retention_ms)
            .bind(limit)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn outbox_stats(&self, conn: &mut SqliteConnection) -> Result<StatsRow, sqlx::Error> {
        sqlx::query_as(
            "SELECT COALESCE(SUM(status = 'PENDING'), 0) AS pending, \
                    COALESCE(SUM(status = 'DEAD'), 0) AS dead, \
                    COALESCE(CAST((julianday('now') - julianday( \
                        MIN(CASE WHEN status = 'PENDING' THEN created_at END))) * 86400000 AS INTEGER), 0) \
                        AS oldest_pending_ms \
             FROM outbox WHERE status IN ('PENDING', 'DEAD')",
        )
        .fetch_one(conn)
        .await
    }

    async fn inbox_insert(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "INSERT INTO inbox (consumer, message_id, received_at) VALUES (?1, ?2, {NOW}) \
             ON CONFLICT (consumer, message_id) DO NOTHING"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
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
        let sql = format!(
            "DELETE FROM inbox WHERE (consumer, message_id) IN ( \
                 SELECT consumer, message_id FROM inbox WHERE received_at <= {NOW} - ?1 LIMIT ?2)"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(retention_ms)
            .bind(limit)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }
}
