//! The idempotency layer on PostgreSQL: its SQL, and [`RecordStore`] over it. The claim is
//! one statement: an insert that, on a conflict, takes the record over only where the
//! outcome table allows, judged on the latest committed row, which the upsert locks.

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{Connection, Transaction};

use super::PgStore;
use crate::idempotency::{Finish, NewClaim, RecordRow, RecordStore, StuckRow, TakeOver, TokenRow};
use crate::store::Txn;

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "(SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms)";
/// A claim's next attempt number, bounded to the column's range: a counter edited to its
/// largest value stays there, so the statement never fails after it took the record.
const NEXT_ATTEMPT: &str = "LEAST(GREATEST(r.attempt, 0)::bigint + 1, 2147483647)::int";

impl RecordStore for PgStore {
    type Db = Postgres;

    async fn begin(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        conn.begin().await
    }

    async fn claim(
        &self,
        conn: &mut PgConnection,
        c: &NewClaim<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             INSERT INTO idempotency_records AS r (scope, idem_key, payload_hash, status, owner_token, \
                 attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
             SELECT $1, $2, $3, 'PROCESSING', $4, 1, ms + $5, ms + $6, NULL, FALSE, ms, ms FROM now \
             ON CONFLICT (scope, idem_key) DO UPDATE SET \
                 payload_hash = EXCLUDED.payload_hash, status = 'PROCESSING', \
                 owner_token = EXCLUDED.owner_token, \
                 attempt = CASE WHEN r.expires_at <= EXCLUDED.created_at THEN 1 ELSE {NEXT_ATTEMPT} END, \
                 lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at, \
                 result = NULL, terminal = FALSE, \
                 created_at = CASE WHEN r.expires_at <= EXCLUDED.created_at \
                                   THEN EXCLUDED.created_at ELSE r.created_at END, \
                 updated_at = EXCLUDED.updated_at \
             WHERE r.expires_at <= EXCLUDED.created_at \
                OR (r.payload_hash IS NOT DISTINCT FROM EXCLUDED.payload_hash \
                    AND ((r.status = 'PROCESSING' AND r.lease_until <= EXCLUDED.created_at) \
                         OR (r.status = 'FAILED' AND NOT r.terminal))) \
             RETURNING attempt"
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(c.scope)
            .bind(c.key)
            .bind(c.payload_hash)
            .bind(c.token)
            .bind(c.lease_ms)
            .bind(c.retention_ms)
            .fetch_optional(conn)
            .await
    }

    async fn read(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordRow>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             SELECT payload_hash, status, owner_token, attempt, \
                    lease_until - ms AS lease_left_ms, \
                    (CASE WHEN expires_at <= ms THEN 1 ELSE 0 END)::bigint AS expired, \
                    result, terminal \
             FROM idempotency_records, now WHERE scope = $1 AND idem_key = $2"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(key)
            .fetch_optional(conn)
            .await
    }

    async fn finish(
        &self,
        conn: &mut PgConnection,
        f: &Finish<'_>,
        txn: Txn,
    ) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             UPDATE idempotency_records AS r SET status = $4, result = $5, terminal = $6, \
                 lease_until = CASE WHEN $4 = 'PROCESSING' THEN now.ms + $7 ELSE r.lease_until END, \
                 expires_at = now.ms + $8, \
                 updated_at = now.ms \
             FROM now \
             WHERE r.scope = $1 AND r.idem_key = $2 AND r.owner_token = $3 AND r.status = 'PROCESSING'"
        );
        let statement = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(f.scope)
            .bind(f.key)
            .bind(f.token)
            .bind(f.status)
            .bind(f.result)
            .bind(f.terminal)
            .bind(f.lease_ms)
            .bind(f.retention_ms);
        let done = match txn {
            Txn::Own => statement.execute(conn).await?,
            // In a savepoint, so that a failure does not abort the caller's transaction.
            Txn::Caller => {
                let mut savepoint = conn.begin().await?;
                let done = statement.execute(&mut *savepoint).await?;
                savepoint.commit().await?;
                done
            }
        };
        Ok(done.rows_affected() == 1)
    }

    async fn stuck(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        limit: i64,
    ) -> Result<Vec<StuckRow>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             SELECT idem_key, owner_token, payload_hash, attempt FROM idempotency_records, now \
             WHERE scope = $1 AND status = 'PROCESSING' AND lease_until <= ms AND expires_at > ms \
             ORDER BY lease_until LIMIT $2"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(limit)
            .fetch_all(conn)
            .await
    }

    async fn take_over(
        &self,
        conn: &mut PgConnection,
        t: &TakeOver<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             UPDATE idempotency_records AS r SET owner_token = $4, attempt = {NEXT_ATTEMPT}, \
                 lease_until = now.ms + $5, expires_at = now.ms + $6, updated_at = now.ms \
             FROM now \
             WHERE r.scope = $1 AND r.idem_key = $2 AND r.owner_token = $3 \
               AND r.status = 'PROCESSING' AND r.lease_until <= now.ms AND r.expires_at > now.ms \
             RETURNING r.attempt"
        );
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(t.scope)
            .bind(t.key)
            .bind(t.from)
            .bind(t.token)
            .bind(t.lease_ms)
            .bind(t.retention_ms)
            .fetch_optional(conn)
            .await
    }

    async fn purge(&self, conn: &mut PgConnection, limit: i64) -> Result<u64, sqlx::Error> {
        // The batch is chosen and locked in one subquery; rows another transaction holds
        // (a claim taking an expired record over) are skipped, not waited for.
        let records = format!(
            "WITH now AS {NOW} \
             DELETE FROM idempotency_records WHERE (scope, idem_key) IN ( \
                 SELECT scope, idem_key FROM idempotency_records, now \
                 WHERE expires_at <= ms AND (status <> 'PROCESSING' OR lease_until <= ms) \
                 LIMIT $1 FOR UPDATE OF idempotency_records SKIP LOCKED)"
        );
        let tokens = format!(
            "WITH now AS {NOW} \
             DELETE FROM one_time_tokens WHERE (scope, token) IN ( \
                 SELECT scope, token FROM one_time_tokens, now WHERE expires_at <= ms \
                 LIMIT $1 FOR UPDATE OF one_time_tokens SKIP LOCKED)"
        );
        let mut gone = 0;
        for sql in [records, tokens] {
            gone += sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(limit)
                .execute(&mut *conn)
                .await?
                .rows_affected();
        }
        Ok(gone)
    }

    async fn issue_token(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        token: &str,
        ttl_ms: i64,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             INSERT INTO one_time_tokens (scope, token, expires_at, used_at, created_at) \
             SELECT $1, $2, ms + $3, NULL, ms FROM now"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(token)
            .bind(ttl_ms)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn consume_token(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        token: &str,
    ) -> Result<bool, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             UPDATE one_time_tokens AS t SET used_at = now.ms FROM now \
             WHERE t.scope = $1 AND t.token = $2 AND t.used_at IS NULL AND t.expires_at > now.ms"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(token)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn read_token(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        token: &str,
    ) -> Result<Option<TokenRow>, sqlx::Error> {
        let sql = format!(
            "WITH now AS {NOW} \
             SELECT used_at IS NOT NULL AS used, \
                    (CASE WHEN expires_at <= ms THEN 1 ELSE 0 END)::bigint AS expired \
             FROM one_time_tokens, now WHERE scope = $1 AND token = $2"
        );
        sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(scope)
            .bind(token)
            .fetch_optional(conn)
            .await
    }
}
