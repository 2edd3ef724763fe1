//! The flow layer on SQLite: its SQL, and [`FlowStore`] over it. One writer at a time:
//! the recovery job's claim is one update of the due flows it selects.

use sqlx::sqlite::SqliteConnection;

use super::SqliteStore;
use crate::flow::{FlowRow, FlowStore, Listing, NewFlow, StepRow, StepWrite, TakeDue, Touch};
use crate::idempotency::RecordStore;

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "(SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms)";

/// A flow record's columns, with the clock applied.
const FLOW_COLUMNS: &str = "f.kind, f.flow_key, f.version, f.input_hash, f.input, f.status, \
    f.park_reason, f.step_at, f.owner_token, f.attempt, f.lease_until - now.ms AS lease_left_ms, \
    f.output, f.last_error, f.created_at, f.updated_at";

/// A flow a runner may take: running or compensating, not parked.
const LIVE: &str = "park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')";

impl FlowStore for SqliteStore {
    async fn start_flow(
        &self,
        conn: &mut SqliteConnection,
        s: &NewFlow<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        // `WHERE true` tells SQLite's parser that `ON CONFLICT` belongs to the insert.
        let sql = format!(
            "WITH now AS {NOW} \
             INSERT INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, 'RUNNING', NULL, 0, ?6, 1, ms + ?7, NULL, NULL, ms, ms \
             FROM now WHERE true \
             ON CONFLICT (kind, flow_key) DO UPDATE SET owner_token = excluded.owner_token, \
                 attempt = MIN(MAX(attempt, 0) + 1, 2147483647), lease_until = excluded.lease_until, \
                 updated_at = excluded.updated_at \
             WHERE input_hash = excluded.input_hash AND version = excluded.version AND {LIVE} \
               AND lease_until <= excluded.created_at \
             RETURNING attempt"
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(s.kind)
            .bind(s.key)
            .bind(s.version)
            .bind(s.input_hash)
            .bind(s.input)
            .bind(s.token)
            .bind(s.lease_ms)
            .fetch_optional(conn)
            .await
    }

    async fn read_flow(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
    ) -> Result<Option<FlowRow>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM flows AS f, now \
             WHERE f.kind = ?1 AND f.flow_key = ?2"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(kind)
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    async fn read_steps(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
    ) -> Result<Vec<StepRow>, sqlx::Error> {
        sqlx::query_as(
            "SELECT step_index, phase, name, status, attempt, downstream_key, owner_token, output, \
                    error, started_at, finished_at \
             FROM flow_steps WHERE kind = ?1 AND flow_key = ?2 ORDER BY step_index, phase DESC",
        )
        .bind(kind)
        .bind(key)
        .fetch_all(conn)
        .await
    }

    async fn touch(&self, conn: &mut SqliteConnection, t: &Touch<'_>) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             UPDATE flows SET lease_until = (SELECT ms FROM now) + ?4, \
                 attempt = CASE WHEN ?5 THEN 1 ELSE attempt END, \
                 step_at = COALESCE(?6, step_at), status = COALESCE(?7, status), \
                 park_reason = ?8, output = COALESCE(?9, output), \
                 last_error = COALESCE(?10, last_error), updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?3 AND {LIVE}"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(t.kind)
            .bind(t.key)
            .bind(t.token)
            .bind(t.lease_ms)
            .bind(t.progress)
            .bind(t.step_at)
            .bind(t.status)
            .bind(t.park)
            .bind(t.output)
            .bind(t.error)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn record_step(
        &self,
        conn: &mut SqliteConnection,
        w: &StepWrite<'_>,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             INSERT INTO flow_steps (kind, flow_key, step_index, phase, name, status, attempt, \
                 downstream_key, owner_token, output, error, started_at, finished_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?7 THEN 1 ELSE 0 END, ?8, ?9, ?10, ?11, ms, \
                 CASE WHEN ?6 = 'STARTED' THEN NULL ELSE ms END FROM now WHERE true \
             ON CONFLICT (kind, flow_key, step_index, phase) DO UPDATE SET status = excluded.status, \
                 attempt = MIN(MAX(attempt, 0) + CASE WHEN ?7 THEN 1 ELSE 0 END, 2147483647), \
                 downstream_key = COALESCE(excluded.downstream_key, downstream_key), \
                 owner_token = excluded.owner_token, output = excluded.output, \
                 error = excluded.error, \
                 started_at = CASE WHEN ?7 THEN excluded.started_at ELSE started_at END, \
                 finished_at = excluded.finished_at"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(w.kind)
            .bind(w.key)
            .bind(w.index)
            .bind(w.phase)
            .bind(w.name)
            .bind(w.status)
            .bind(w.begins)
            .bind(w.downstream_key)
            .bind(w.token)
            .bind(w.output)
            .bind(w.error)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn retry_steps(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
        phase: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE flow_steps SET status = 'RETRY' \
             WHERE kind = ?1 AND flow_key = ?2 AND phase = ?3 AND status IN ('STARTED', 'FAILED')",
        )
        .bind(kind)
        .bind(key)
        .bind(phase)
        .execute(conn)
        .await
        .map(drop)
    }

    async fn take_due(
        &self,
        conn: &mut SqliteConnection,
        d: &TakeDue<'_>,
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             UPDATE flows SET owner_token = ?3, attempt = MIN(MAX(attempt, 0) + 1, 2147483647), \
                 lease_until = (SELECT ms FROM now) + ?4, updated_at = (SELECT ms FROM now) \
             WHERE rowid IN ( \
                 SELECT rowid FROM flows \
                 WHERE kind = ?1 AND version = ?2 AND {LIVE} AND lease_until <= (SELECT ms FROM now) \
                 ORDER BY lease_until LIMIT ?5) \
             RETURNING flow_key, attempt"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(d.kind)
            .bind(d.version)
            .bind(d.token)
            .bind(d.lease_ms)
            .bind(d.limit)
            .fetch_all(conn)
            .await
    }

    async fn unpark(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             UPDATE flows SET park_reason = NULL, owner_token = ?3, attempt = 1, \
                 lease_until = (SELECT ms FROM now) + ?4, updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?5 AND park_reason IS NOT NULL"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(kind)
            .bind(key)
            .bind(token)
            .bind(lease_ms)
            .bind(from)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_flows(
        &self,
        conn: &mut SqliteConnection,
        age_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let mut tx = <Self as RecordStore>::begin(conn).await?;
        let chosen = format!(
            "WITH now AS {NOW} SELECT kind, flow_key FROM flows, now \
             WHERE status IN ('COMPLETED', 'COMPENSATED') AND updated_at <= ms - ?1 LIMIT ?2"
        );
        let keys: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(chosen))
            .bind(age_ms)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        for (kind, key) in &keys {
            for table in ["flow_steps", "flows"] {
                let sql = format!("DELETE FROM {table} WHERE kind = ?1 AND flow_key = ?2");
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(kind)
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(keys.len() as u64)
    }

    async fn list_flows(
        &self,
        conn: &mut SqliteConnection,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<FlowRow>, sqlx::Error> {
        let filter = match which {
            Listing::Parked => "f.park_reason IS NOT NULL",
            Listing::Running => {
                "f.park_reason IS NULL AND f.status IN ('RUNNING', 'COMPENSATING') AND f.lease_until > now.ms"
            }
            Listing::Stuck => {
                "f.park_reason IS NULL AND f.status IN ('RUNNING', 'COMPENSATING') AND f.lease_until <= now.ms"
            }
            Listing::Finished => "f.status IN ('COMPLETED', 'COMPENSATED')",
            Listing::All => "1",
        };
        let (kind, key) = after.unwrap_or(("", ""));
        let sql = format!(
            "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM flows AS f, now \
             WHERE {filter} AND (f.kind, f.flow_key) > (?1, ?2) \
             ORDER BY f.kind, f.flow_key LIMIT ?3"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(kind)
            .bind(key)
            .bind(limit)
            .fetch_all(conn)
            .await
    }
}
