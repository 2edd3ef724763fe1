//! The idempotency layer on PostgreSQL: its SQL, and [`RecordStore`] over it. The claim is
//! one statement: an insert that, on a conflict, takes the record over only where the
//! outcome table allows, judged on the latest committed row, which the upsert locks.

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr, Transaction};

use super::{MS, NOW, PgStore};
use crate::backend::names::PerNamespace;
use crate::backend::records_sql::{self, OneStatementClaims, RecordStatements};
use crate::backend::sql::{BySize, Statement};
use crate::idempotency::{Finish, NewClaim, RecordRow, RecordStore, StuckRow, TakeOver, TokenRow};
use crate::store::Txn;

/// A claim's next attempt number, bounded to the column's range: a counter edited to its
/// largest value stays there, so the statement never fails after it took the record.
const NEXT_ATTEMPT: &str = "LEAST(GREATEST(r.attempt, 0)::bigint + 1, 2147483647)::int";

/// A record held (`PROCESSING`), in a statement that names the record by its key. An
/// expression, not the column: the planner cannot answer it from the stuck index
/// (`status, lease_until`), which it chose over the primary key once the statistics said
/// almost every record is finished, and which holds an entry for every record claimed
/// since the last vacuum (the finished ones' dead), so that each update read them all.
const BY_KEY_PROCESSING: &str = "(r.status || '') = 'PROCESSING'";

impl RecordStore for PgStore {
    type Db = Postgres;

    async fn read(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordRow>, sqlx::Error> {
        records_sql::read::<Postgres>(conn, &STATEMENTS.get(self.names()).0, scope, key).await
    }

    async fn finish(
        &self,
        conn: &mut PgConnection,
        f: &Finish<'_>,
        txn: Txn,
    ) -> Result<bool, sqlx::Error> {
        records_sql::finish::<Postgres>(conn, &STATEMENTS.get(self.names()).0, f, txn).await
    }

    async fn stuck(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        limit: i64,
    ) -> Result<Vec<StuckRow>, sqlx::Error> {
        records_sql::stuck::<Postgres>(conn, &STATEMENTS.get(self.names()).0, scope, limit).await
    }

    async fn held(&self, conn: &mut PgConnection, scope: &str) -> Result<(i64, i64), sqlx::Error> {
        records_sql::held::<Postgres>(conn, &STATEMENTS.get(self.names()).0, scope).await
    }

    async fn purge(&self, conn: &mut PgConnection, limit: i64) -> Result<u64, sqlx::Error> {
        records_sql::purge::<Postgres>(conn, &STATEMENTS.get(self.names()).0, limit).await
    }

    async fn issue_token(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        token: &str,
        ttl_ms: i64,
    ) -> Result<(), sqlx::Error> {
        records_sql::issue_token::<Postgres>(
            conn,
            &STATEMENTS.get(self.names()).0,
            scope,
            token,
            ttl_ms,
        )
        .await
    }

    async fn consume_token(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        token: &str,
    ) -> Result<bool, sqlx::Error> {
        records_sql::consume_token::<Postgres>(conn, &STATEMENTS.get(self.names()).0, scope, token)
            .await
    }

    async fn read_token(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        token: &str,
    ) -> Result<Option<TokenRow>, sqlx::Error> {
        records_sql::read_token::<Postgres>(conn, &STATEMENTS.get(self.names()).0, scope, token)
            .await
    }

    async fn claim(
        &self,
        conn: &mut PgConnection,
        c: &NewClaim<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        records_sql::claim::<Postgres>(conn, &STATEMENTS.get(self.names()).1, c).await
    }

    async fn take_over(
        &self,
        conn: &mut PgConnection,
        t: &TakeOver<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        records_sql::take_over::<Postgres>(conn, &STATEMENTS.get(self.names()).1, t).await
    }

    async fn begin(conn: &mut PgConnection) -> Result<Transaction<'_, Postgres>, sqlx::Error> {
        conn.begin().await
    }

    /// One statement: the finishes as a `VALUES` list, each record updated where its
    /// holder's token still holds it.
    async fn finish_many(
        &self,
        conn: &mut PgConnection,
        finishes: &[Finish<'_>],
    ) -> Result<Vec<String>, sqlx::Error> {
        let mut query = sqlx::query_scalar(FINISH_MANY.get(self.names()).get(finishes.len()));
        for f in finishes {
            query = query
                .bind(f.scope)
                .bind(f.key)
                .bind(f.token)
                .bind(f.status)
                .bind(f.result)
                .bind(f.terminal)
                .bind(f.retention_ms);
        }
        query.fetch_all(conn).await
    }

    const BATCHES_CLAIMS: bool = true;

    /// One statement: the claims as arrays, inserted `ON CONFLICT DO NOTHING`.
    async fn claim_new(
        &self,
        conn: &mut PgConnection,
        claims: &[NewClaim<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let scopes: Vec<&str> = claims.iter().map(|c| c.scope).collect();
        let keys: Vec<&str> = claims.iter().map(|c| c.key).collect();
        let hashes: Vec<Option<&str>> = claims.iter().map(|c| c.payload_hash).collect();
        let tokens: Vec<&str> = claims.iter().map(|c| c.token).collect();
        let leases: Vec<i64> = claims.iter().map(|c| c.lease_ms).collect();
        let retentions: Vec<i64> = claims.iter().map(|c| c.retention_ms).collect();
        sqlx::query_as(CLAIM_NEW.get(self.names()).clone())
            .bind(scopes)
            .bind(keys)
            .bind(hashes)
            .bind(tokens)
            .bind(leases)
            .bind(retentions)
            .fetch_all(conn)
            .await
    }
}

/// The layer's statements, built once per namespace.
static STATEMENTS: PerNamespace<(RecordStatements, OneStatementClaims)> = PerNamespace::new(|n| {
    let s = |sql: String| Statement::new(sql, false);
    let (records, tokens) = (&n.records, &n.tokens);
    (
        RecordStatements {
            read: s(format!(
                "WITH now AS {NOW} \
                 SELECT payload_hash, status, owner_token, attempt, \
                        lease_until - ms AS lease_left_ms, \
                        (CASE WHEN expires_at <= ms THEN 1 ELSE 0 END)::bigint AS expired, \
                        result, terminal \
                 FROM {records}, now WHERE scope = $1 AND idem_key = $2"
            )),
            finish: s(format!(
                "WITH now AS {NOW} \
                 UPDATE {records} AS r SET status = $4, result = $5, terminal = $6, \
                     lease_until = CASE WHEN $4 = 'PROCESSING' THEN {MS} + $7 ELSE r.lease_until END, \
                     expires_at = {MS} + $8, \
                     updated_at = {MS} \
                 WHERE r.scope = $1 AND r.idem_key = $2 AND r.owner_token = $3 AND {BY_KEY_PROCESSING}"
            )),
            stuck: s(format!(
                "WITH now AS {NOW} \
                 SELECT idem_key, owner_token, payload_hash, attempt FROM {records}, now \
                 WHERE scope = $1 AND status = 'PROCESSING' AND lease_until <= ms AND expires_at > ms \
                 ORDER BY lease_until LIMIT $2"
            )),
            // Each batch is chosen and locked in one subquery; rows another transaction holds (a
            // claim taking an expired record over) are skipped, not waited for.
            held: s(format!(
                "WITH now AS {NOW} \
                 SELECT COUNT(*)::bigint, COALESCE(MAX(ms - created_at), 0)::bigint \
                 FROM {records}, now \
                 WHERE scope = $1 AND status = 'PROCESSING' AND expires_at > ms"
            )),
            purge: [
                s(format!(
                    "WITH now AS {NOW} \
             DELETE FROM {records} WHERE (scope, idem_key) IN ( \
                 SELECT scope, idem_key FROM {records} AS r, now \
                 WHERE expires_at <= ms AND (status <> 'PROCESSING' OR lease_until <= ms) \
                 LIMIT $1 FOR UPDATE OF r SKIP LOCKED)"
                )),
                s(format!(
                    "WITH now AS {NOW} \
             DELETE FROM {tokens} WHERE (scope, token) IN ( \
                 SELECT scope, token FROM {tokens} AS t, now WHERE expires_at <= ms \
                 LIMIT $1 FOR UPDATE OF t SKIP LOCKED)"
                )),
            ],
            issue_token: s(format!(
                "WITH now AS {NOW} \
                 INSERT INTO {tokens} (scope, token, expires_at, used_at, created_at) \
                 SELECT $1, $2, ms + $3, NULL, ms FROM now"
            )),
            consume_token: s(format!(
                "WITH now AS {NOW} \
                 UPDATE {tokens} AS t SET used_at = {MS} \
                 WHERE t.scope = $1 AND t.token = $2 AND t.used_at IS NULL AND t.expires_at > {MS}"
            )),
            read_token: s(format!(
                "WITH now AS {NOW} \
                 SELECT used_at IS NOT NULL AS used, \
                        (CASE WHEN expires_at <= ms THEN 1 ELSE 0 END)::bigint AS expired \
                 FROM {tokens}, now WHERE scope = $1 AND token = $2"
            )),
        },
        OneStatementClaims {
            claim: s(format!(
                "WITH now AS {NOW} \
                 INSERT INTO {records} AS r (scope, idem_key, payload_hash, status, owner_token, \
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
            )),
            take_over: s(format!(
                "WITH now AS {NOW} \
                 UPDATE {records} AS r SET owner_token = $4, attempt = {NEXT_ATTEMPT}, \
                     lease_until = {MS} + $5, expires_at = {MS} + $6, updated_at = {MS} \
                 WHERE r.scope = $1 AND r.idem_key = $2 AND r.owner_token = $3 \
                   AND {BY_KEY_PROCESSING} AND r.lease_until <= {MS} AND r.expires_at > {MS} \
                 RETURNING r.attempt"
            )),
        },
    )
});

/// The statement of `claim_new`, built once per namespace (the batch goes in as arrays).
static CLAIM_NEW: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW} \
         INSERT INTO {records} (scope, idem_key, payload_hash, status, owner_token, \
             attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
         SELECT c.scope, c.idem_key, c.payload_hash, 'PROCESSING', c.owner_token, 1, \
                ms + c.lease_ms, ms + c.retention_ms, NULL, FALSE, ms, ms \
         FROM now, unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) \
              AS c(scope, idem_key, payload_hash, owner_token, lease_ms, retention_ms) \
         ON CONFLICT (scope, idem_key) DO NOTHING \
         RETURNING owner_token::text, attempt::int",
        records = n.records
    )).into_sql_str()
});

/// The statement of `finish_many`, a row of values per finish, built once per namespace
/// and size. A `VALUES` list, not arrays: the planner knows its row count, so a generic
/// plan probes the primary key once a row (as each finish alone does), where an `unnest`
/// of arrays, counted as ten rows, was planned as a hash join over the whole table while
/// the table was not yet analyzed. No finish in it is an extension: the lease stays as
/// it is.
static FINISH_MANY: PerNamespace<BySize> = PerNamespace::new(|n| {
    let records = n.records.clone();
    BySize::new(move |size| {
        let rows: Vec<String> = (0..size)
            .map(|i| {
                let p = 7 * i;
                if i == 0 {
                    "($1::text, $2::text, $3::text, $4::text, $5::text, $6::bool, $7::bigint)"
                        .to_string()
                } else {
                    format!(
                        "(${}, ${}, ${}, ${}, ${}, ${}, ${})",
                        p + 1,
                        p + 2,
                        p + 3,
                        p + 4,
                        p + 5,
                        p + 6,
                        p + 7
                    )
                }
            })
            .collect();
        format!(
            "WITH now AS {NOW} \
             UPDATE {records} AS r SET status = f.status, result = f.result, \
                 terminal = f.terminal, expires_at = {MS} + f.retention_ms, updated_at = {MS} \
             FROM (VALUES {rows}) \
                  AS f(scope, idem_key, owner_token, status, result, terminal, retention_ms) \
             WHERE r.scope = f.scope AND r.idem_key = f.idem_key \
               AND r.owner_token = f.owner_token AND {BY_KEY_PROCESSING} \
             RETURNING r.owner_token::text",
            rows = rows.join(", ")
        )
    })
});
