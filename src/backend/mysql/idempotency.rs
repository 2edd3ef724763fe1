//! The idempotency layer on MySQL/MariaDB: its SQL, and [`RecordStore`] over it.
//!
//! MySQL's `ON DUPLICATE KEY UPDATE` assigns left to right, each assignment seeing the
//! ones before it, so a conditional takeover cannot be written there. The claim is
//! therefore an `INSERT IGNORE` of a new record and, if the key exists, a conditional
//! `UPDATE` of it (the outcome table's conditions in its `WHERE`, judged on the latest
//! row, which the update locks): one statement for a new key, two otherwise, each
//! atomic on its own. On Galera the read is causal.

use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{Connection, Transaction};

use super::MySqlStore;
use crate::backend::records_sql::{RecordSql, shared_record_statements};
use crate::idempotency::{NewClaim, RecordStore, TakeOver};

/// The database clock, in milliseconds since the epoch (`NOW(3)` is fixed for the
/// statement).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";
/// A claim's next attempt number, bounded to the column's range: a counter edited to its
/// largest value stays there, so the statement never fails after it took the record.
const NEXT_ATTEMPT: &str = "LEAST(GREATEST(attempt, 0) + 1, 2147483647)";

impl RecordStore for MySqlStore {
    type Db = MySql;

    shared_record_statements!(MySqlConnection, sqlx::MySql);

    /// READ COMMITTED: InnoDB then takes no gap locks for the locking reads inside (a
    /// transition's judging read of its history row), so concurrent requests on
    /// neighbouring keys do not deadlock on each other's gaps; orderly's reads inside
    /// are locking reads and see the latest committed rows at any level. The level and
    /// the begin go in one round trip.
    async fn begin(conn: &mut MySqlConnection) -> Result<Transaction<'_, MySql>, sqlx::Error> {
        conn.begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            .await
    }

    async fn claim(
        &self,
        conn: &mut MySqlConnection,
        c: &NewClaim<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let insert = format!(
            "INSERT IGNORE INTO idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                 attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
             VALUES (?, ?, ?, 'PROCESSING', ?, 1, {NOW} + ?, {NOW} + ?, NULL, FALSE, {NOW}, {NOW})"
        );
        let inserted = sqlx::query(sqlx::AssertSqlSafe(insert))
            .bind(c.scope)
            .bind(c.key)
            .bind(c.payload_hash)
            .bind(c.token)
            .bind(c.lease_ms)
            .bind(c.retention_ms)
            .execute(&mut *conn)
            .await?;
        if inserted.rows_affected() == 1 {
            return Ok(Some(1));
        }
        // `attempt` and `created_at` first: they read `expires_at` before it is assigned.
        let take_over = format!(
            "UPDATE idempotency_records SET \
                 attempt = LAST_INSERT_ID(IF(expires_at <= {NOW}, 1, {NEXT_ATTEMPT})), \
                 created_at = IF(expires_at <= {NOW}, {NOW}, created_at), \
                 payload_hash = ?, status = 'PROCESSING', owner_token = ?, \
                 lease_until = {NOW} + ?, expires_at = {NOW} + ?, result = NULL, terminal = FALSE, \
                 updated_at = {NOW} \
             WHERE scope = ? AND idem_key = ? \
               AND (expires_at <= {NOW} \
                    OR (payload_hash <=> ? \
                        AND ((status = 'PROCESSING' AND lease_until <= {NOW}) \
                             OR (status = 'FAILED' AND NOT terminal))))"
        );
        let taken = sqlx::query(sqlx::AssertSqlSafe(take_over))
            .bind(c.payload_hash)
            .bind(c.token)
            .bind(c.lease_ms)
            .bind(c.retention_ms)
            .bind(c.scope)
            .bind(c.key)
            .bind(c.payload_hash)
            .execute(conn)
            .await?;
        if taken.rows_affected() != 1 {
            return Ok(None);
        }
        i32::try_from(taken.last_insert_id())
            .map(Some)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }

    async fn take_over(
        &self,
        conn: &mut MySqlConnection,
        t: &TakeOver<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let sql = format!(
            "UPDATE idempotency_records SET owner_token = ?, \
                 attempt = LAST_INSERT_ID({NEXT_ATTEMPT}), updated_at = {NOW}, lease_until = {NOW} + ?, \
                 expires_at = {NOW} + ? \
             WHERE scope = ? AND idem_key = ? AND owner_token = ? AND status = 'PROCESSING' \
               AND lease_until <= {NOW} AND expires_at > {NOW}"
        );
        let taken = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(t.token)
            .bind(t.lease_ms)
            .bind(t.retention_ms)
            .bind(t.scope)
            .bind(t.key)
            .bind(t.from)
            .execute(conn)
            .await?;
        if taken.rows_affected() != 1 {
            return Ok(None);
        }
        i32::try_from(taken.last_insert_id())
            .map(Some)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
}

impl RecordSql for MySqlStore {
    const POSITIONAL: bool = true;

    fn read_sql(&self) -> String {
        format!(
            "{}SELECT payload_hash, status, owner_token, attempt, \
                    CAST(lease_until - {NOW} AS SIGNED) AS lease_left_ms, \
                    CAST(IF(expires_at <= {NOW}, 1, 0) AS SIGNED) AS expired, \
                    result, terminal \
             FROM idempotency_records WHERE scope = ?1 AND idem_key = ?2",
            self.causal()
        )
    }

    /// `lease_until` reads `status` before it is assigned.
    fn finish_sql(&self) -> String {
        format!(
            "UPDATE idempotency_records SET \
                 lease_until = IF(?4 = 'PROCESSING', {NOW} + ?7, lease_until), \
                 expires_at = {NOW} + ?8, \
                 status = ?4, result = ?5, terminal = ?6, updated_at = {NOW} \
             WHERE scope = ?1 AND idem_key = ?2 AND owner_token = ?3 AND status = 'PROCESSING'"
        )
    }

    fn stuck_sql(&self) -> String {
        format!(
            "{}SELECT idem_key, owner_token, payload_hash, attempt FROM idempotency_records \
             WHERE scope = ?1 AND status = 'PROCESSING' AND lease_until <= {NOW} AND expires_at > {NOW} \
             ORDER BY lease_until LIMIT ?2",
            self.causal()
        )
    }

    fn held_sql(&self) -> String {
        format!(
            "{}SELECT CAST(COUNT(*) AS SIGNED), CAST(COALESCE(MAX({NOW} - created_at), 0) AS SIGNED) \
             FROM idempotency_records \
             WHERE scope = ?1 AND status = 'PROCESSING' AND expires_at > {NOW}",
            self.causal()
        )
    }

    fn purge_sql(&self) -> [String; 2] {
        [
            format!(
                "DELETE FROM idempotency_records \
                 WHERE expires_at <= {NOW} AND (status <> 'PROCESSING' OR lease_until <= {NOW}) LIMIT ?1"
            ),
            format!("DELETE FROM one_time_tokens WHERE expires_at <= {NOW} LIMIT ?1"),
        ]
    }

    fn issue_token_sql(&self) -> String {
        format!(
            "INSERT INTO one_time_tokens (scope, token, expires_at, used_at, created_at) \
             VALUES (?1, ?2, {NOW} + ?3, NULL, {NOW})"
        )
    }

    fn consume_token_sql(&self) -> String {
        format!(
            "UPDATE one_time_tokens SET used_at = {NOW} \
             WHERE scope = ?1 AND token = ?2 AND used_at IS NULL AND expires_at > {NOW}"
        )
    }

    fn read_token_sql(&self) -> String {
        format!(
            "{}SELECT used_at IS NOT NULL AS used, \
                    CAST(IF(expires_at <= {NOW}, 1, 0) AS SIGNED) AS expired \
             FROM one_time_tokens WHERE scope = ?1 AND token = ?2",
            self.causal()
        )
    }
}

impl MySqlStore {
    /// The prefix that makes a read causal on Galera (it waits for what the cluster
    /// committed before it), empty elsewhere.
    pub(super) fn causal(&self) -> &'static str {
        if self.causal_reads() == Some(true) {
            "SET STATEMENT wsrep_sync_wait = 1 FOR "
        } else {
            ""
        }
    }
}
