//! The idempotency layer on MySQL/MariaDB: its SQL, and [`RecordStore`] over it.
//!
//! MySQL's `ON DUPLICATE KEY UPDATE` assigns left to right, each assignment seeing the
//! ones before it, so a conditional takeover cannot be written there. The claim is
//! therefore an `INSERT IGNORE` of a new record and, if the key exists, a conditional
//! `UPDATE` of it (the outcome table's conditions in its `WHERE`, judged on the latest
//! row, which the update locks): one statement for a new key, two otherwise, each
//! atomic on its own. On Galera the read is causal.

use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use super::MySqlStore;
use crate::idempotency::{Finish, NewClaim, RecordRow, RecordStore};
use crate::store::Txn;

/// The database clock, in milliseconds since the epoch (`NOW(3)` is fixed for the
/// statement).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

impl RecordStore for MySqlStore {
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
                 attempt = LAST_INSERT_ID(IF(expires_at <= {NOW}, 1, attempt + 1)), \
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

    async fn read(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordRow>, sqlx::Error> {
        let causal = if self.causal_reads() == Some(true) {
            "SET STATEMENT wsrep_sync_wait = 1 FOR "
        } else {
            ""
        };
        let sql = format!(
            "{causal}SELECT payload_hash, status, owner_token, attempt, \
                    CAST(lease_until - {NOW} AS SIGNED) AS lease_left_ms, \
                    CAST(IF(expires_at <= {NOW}, 1, 0) AS SIGNED) AS expired, \
                    result, terminal \
             FROM idempotency_records WHERE scope = ? AND idem_key = ?"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    async fn finish(
        &self,
        conn: &mut MySqlConnection,
        f: &Finish<'_>,
        txn: Txn,
    ) -> Result<bool, sqlx::Error> {
        // `lease_until` and `expires_at` read `status` before it is assigned.
        let sql = format!(
            "UPDATE idempotency_records SET \
                 lease_until = IF(? = 'PROCESSING', {NOW} + ?, lease_until), \
                 expires_at = IF(? = 'PROCESSING', expires_at, {NOW} + ?), \
                 status = ?, result = ?, terminal = ?, updated_at = {NOW} \
             WHERE scope = ? AND idem_key = ? AND owner_token = ? AND status = 'PROCESSING'"
        );
        let statement = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(f.status)
            .bind(f.lease_ms)
            .bind(f.status)
            .bind(f.retention_ms)
            .bind(f.status)
            .bind(f.result)
            .bind(f.terminal)
            .bind(f.scope)
            .bind(f.key)
            .bind(f.token);
        let done = match txn {
            Txn::Own => statement.execute(conn).await?,
            Txn::Caller => {
                let mut savepoint = conn.begin().await?;
                let done = statement.execute(&mut *savepoint).await?;
                savepoint.commit().await?;
                done
            }
        };
        Ok(done.rows_affected() == 1)
    }
}
