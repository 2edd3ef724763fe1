//! The flow layer on MySQL/MariaDB: its SQL, and [`FlowStore`] over it.
//!
//! The start is an `INSERT IGNORE` of a new flow and, if the key exists, a conditional
//! `UPDATE` taking it over (as for an idempotency claim). The recovery job's claim is one
//! READ COMMITTED transaction: `SELECT … FOR UPDATE SKIP LOCKED` chooses and locks the
//! due flows, an update hands them to the job's token. On Galera the reads are causal.

use sqlx::mysql::MySqlConnection;

use super::MySqlStore;
use crate::flow::{FlowRow, FlowStore, Listing, NewFlow, StepRow, StepWrite, TakeDue, Touch};
use crate::idempotency::RecordStore;

/// The database clock, in milliseconds since the epoch (`NOW(3)` is fixed for the
/// statement).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// A flow a runner may take: running or compensating, not parked.
const LIVE: &str = "park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')";

/// A flow record's columns, with the clock applied.
fn flow_columns() -> String {
    format!(
        "kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, \
         attempt, CAST(lease_until - {NOW} AS SIGNED) AS lease_left_ms, output, last_error, \
         created_at, updated_at"
    )
}

impl FlowStore for MySqlStore {
    async fn start_flow(
        &self,
        conn: &mut MySqlConnection,
        s: &NewFlow<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let insert = format!(
            "INSERT IGNORE INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, 'RUNNING', NULL, 0, ?, 1, {NOW} + ?, NULL, NULL, {NOW}, {NOW})"
        );
        let inserted = sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(s.kind)
            .bind(s.key)
            .bind(s.version)
            .bind(s.input_hash)
            .bind(s.input)
            .bind(s.token)
            .bind(s.lease_ms)
            .execute(&mut *conn)
            .await?;
        if inserted.rows_affected() == 1 {
            return Ok(Some(1));
        }
        let take_over = format!(
            "UPDATE flows SET attempt = LAST_INSERT_ID(LEAST(GREATEST(attempt, 0) + 1, 2147483647)), owner_token = ?, \
                 lease_until = {NOW} + ?, updated_at = {NOW} \
             WHERE kind = ? AND flow_key = ? AND input_hash = ? AND version = ? AND {LIVE} \
               AND lease_until <= {NOW}"
        );
        let taken = sqlx::query(sqlx::AssertSqlSafe(take_over))
            .bind(s.token)
            .bind(s.lease_ms)
            .bind(s.kind)
            .bind(s.key)
            .bind(s.input_hash)
            .bind(s.version)
            .execute(conn)
            .await?;
        if taken.rows_affected() != 1 {
            return Ok(None);
        }
        i32::try_from(taken.last_insert_id())
            .map(Some)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }

    async fn read_flow(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
    ) -> Result<Option<FlowRow>, sqlx::Error> {
        let sql = format!(
            "{}SELECT {} FROM flows WHERE kind = ? AND flow_key = ?",
            self.causal(),
            flow_columns()
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(kind)
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    async fn read_steps(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
    ) -> Result<Vec<StepRow>, sqlx::Error> {
        let sql = format!(
            "{}SELECT step_index, phase, name, status, attempt, downstream_key, owner_token, output, \
                    error, started_at, finished_at \
             FROM flow_steps WHERE kind = ? AND flow_key = ? ORDER BY step_index, phase DESC",
            self.causal()
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(kind)
            .bind(key)
            .fetch_all(conn)
            .await
    }

    async fn touch(&self, conn: &mut MySqlConnection, t: &Touch<'_>) -> Result<bool, sqlx::Error> {
        // The `WHERE` sees the row as it was; the assignments read no column assigned
        // before them.
        let sql = format!(
            "UPDATE flows SET lease_until = {NOW} + ?, attempt = IF(?, 1, attempt), \
                 step_at = COALESCE(?, step_at), status = COALESCE(?, status), park_reason = ?, \
                 output = COALESCE(?, output), last_error = COALESCE(?, last_error), \
                 updated_at = {NOW} \
             WHERE kind = ? AND flow_key = ? AND owner_token = ? AND {LIVE}"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(t.lease_ms)
            .bind(t.progress)
            .bind(t.step_at)
            .bind(t.status)
            .bind(t.park)
            .bind(t.output)
            .bind(t.error)
            .bind(t.kind)
            .bind(t.key)
            .bind(t.token)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn record_step(
        &self,
        conn: &mut MySqlConnection,
        w: &StepWrite<'_>,
    ) -> Result<(), sqlx::Error> {
        let begins = i32::from(w.begins);
        let finished = if w.status == "STARTED" { "NULL" } else { NOW };
        let sql = format!(
            "INSERT INTO flow_steps (kind, flow_key, step_index, phase, name, status, attempt, \
                 downstream_key, owner_token, output, error, started_at, finished_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NOW}, {finished}) \
             ON DUPLICATE KEY UPDATE status = VALUES(status), \
                 attempt = LEAST(GREATEST(attempt, 0) + ?, 2147483647), \
                 downstream_key = COALESCE(VALUES(downstream_key), downstream_key), \
                 owner_token = VALUES(owner_token), output = VALUES(output), error = VALUES(error), \
                 started_at = IF(? = 1, VALUES(started_at), started_at), \
                 finished_at = VALUES(finished_at)"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(w.kind)
            .bind(w.key)
            .bind(w.index)
            .bind(w.phase)
            .bind(w.name)
            .bind(w.status)
            .bind(begins)
            .bind(w.downstream_key)
            .bind(w.token)
            .bind(w.output)
            .bind(w.error)
            .bind(begins)
            .bind(begins)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn retry_steps(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
        phase: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE flow_steps SET status = 'RETRY' \
             WHERE kind = ? AND flow_key = ? AND phase = ? AND status IN ('STARTED', 'FAILED')",
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
        conn: &mut MySqlConnection,
        d: &TakeDue<'_>,
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let mut tx = Self::begin(conn).await?;
        let choose = format!(
            "SELECT flow_key FROM flows \
             WHERE kind = ? AND version = ? AND {LIVE} AND lease_until <= {NOW} \
             ORDER BY lease_until LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let keys: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(choose))
            .bind(d.kind)
            .bind(d.version)
            .bind(d.limit)
            .fetch_all(&mut *tx)
            .await?;
        if keys.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let marks = vec!["?"; keys.len()].join(", ");
        let hand_over = format!(
            "UPDATE flows SET owner_token = ?, attempt = LEAST(GREATEST(attempt, 0) + 1, 2147483647), \
                 lease_until = {NOW} + ?, \
                 updated_at = {NOW} \
             WHERE kind = ? AND flow_key IN ({marks}) AND {LIVE} AND lease_until <= {NOW}"
        );
        let mut update = sqlx::query(sqlx::AssertSqlSafe(hand_over))
            .bind(d.token)
            .bind(d.lease_ms)
            .bind(d.kind);
        for key in &keys {
            update = update.bind(key);
        }
        update.execute(&mut *tx).await?;
        let taken = format!(
            "SELECT flow_key, attempt FROM flows \
             WHERE kind = ? AND owner_token = ? AND flow_key IN ({marks})"
        );
        let mut read = sqlx::query_as(sqlx::AssertSqlSafe(taken))
            .bind(d.kind)
            .bind(d.token);
        for key in &keys {
            read = read.bind(key);
        }
        let claimed = read.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    async fn unpark(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "UPDATE flows SET park_reason = NULL, owner_token = ?, attempt = 1, \
                 lease_until = {NOW} + ?, updated_at = {NOW} \
             WHERE kind = ? AND flow_key = ? AND owner_token = ? AND park_reason IS NOT NULL"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(token)
            .bind(lease_ms)
            .bind(kind)
            .bind(key)
            .bind(from)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge_flows(
        &self,
        conn: &mut MySqlConnection,
        age_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let mut tx = Self::begin(conn).await?;
        let chosen = format!(
            "SELECT kind, flow_key FROM flows \
             WHERE status IN ('COMPLETED', 'COMPENSATED') AND updated_at <= {NOW} - ? \
             LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let keys: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(chosen))
            .bind(age_ms)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        for (kind, key) in &keys {
            for table in ["flow_steps", "flows"] {
                let sql = format!("DELETE FROM {table} WHERE kind = ? AND flow_key = ?");
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
        conn: &mut MySqlConnection,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<FlowRow>, sqlx::Error> {
        let filter = match which {
            Listing::Parked => "park_reason IS NOT NULL".to_string(),
            Listing::Running => format!("{LIVE} AND lease_until > {NOW}"),
            Listing::Stuck => format!("{LIVE} AND lease_until <= {NOW}"),
            Listing::Finished => "status IN ('COMPLETED', 'COMPENSATED')".to_string(),
            Listing::All => "TRUE".to_string(),
        };
        let (kind, key) = after.unwrap_or(("", ""));
        let sql = format!(
            "{}SELECT {} FROM flows WHERE {filter} AND (kind, flow_key) > (?, ?) \
             ORDER BY kind, flow_key LIMIT ?",
            self.causal(),
            flow_columns()
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(kind)
            .bind(key)
            .bind(limit)
            .fetch_all(conn)
            .await
    }
}
