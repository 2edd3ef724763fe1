//! The idempotency layer on SQLite: its SQL, and [`RecordStore`] over it. The claim is
//! one statement (an upsert whose update runs only where the outcome table allows); the
//! single writer judges it on the latest data.

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Connection, Transaction};

use super::SqliteStore;
use crate::backend::names::PerNamespace;
use crate::backend::records_sql::{self, OneStatementClaims, RecordStatements};
use crate::backend::sql::{BySize, Statement};
use crate::idempotency::{Finish, NewClaim, RecordRow, RecordStore, StuckRow, TakeOver, TokenRow};
use crate::store::Txn;

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "(SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms)";
/// A claim's next attempt number, bounded to the column's range: a counter edited to its
/// largest value stays there, so the statement never fails after it took the record.
const NEXT_ATTEMPT: &str = "MIN(MAX(attempt, 0) + 1, 2147483647)";

impl RecordStore for SqliteStore {
    type Db = Sqlite;

    async fn read(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordRow>, sqlx::Error> {
        records_sql::read::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, scope, key).await
    }

    async fn finish(
        &self,
        conn: &mut SqliteConnection,
        f: &Finish<'_>,
        txn: Txn,
    ) -> Result<bool, sqlx::Error> {
        records_sql::finish::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, f, txn).await
    }

    async fn stuck(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        limit: i64,
    ) -> Result<Vec<StuckRow>, sqlx::Error> {
        records_sql::stuck::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, scope, limit).await
    }

    async fn held(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
    ) -> Result<(i64, i64), sqlx::Error> {
        records_sql::held::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, scope).await
    }

    async fn purge(&self, conn: &mut SqliteConnection, limit: i64) -> Result<u64, sqlx::Error> {
        records_sql::purge::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, limit).await
    }

    async fn issue_token(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        token: &str,
        ttl_ms: i64,
    ) -> Result<(), sqlx::Error> {
        records_sql::issue_token::<Sqlite>(
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
        conn: &mut SqliteConnection,
        scope: &str,
        token: &str,
    ) -> Result<bool, sqlx::Error> {
        records_sql::consume_token::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, scope, token)
            .await
    }

    async fn read_token(
        &self,
        conn: &mut SqliteConnection,
        scope: &str,
        token: &str,
    ) -> Result<Option<TokenRow>, sqlx::Error> {
        records_sql::read_token::<Sqlite>(conn, &STATEMENTS.get(self.names()).0, scope, token).await
    }

    async fn claim(
        &self,
        conn: &mut SqliteConnection,
        c: &NewClaim<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        records_sql::claim::<Sqlite>(conn, &STATEMENTS.get(self.names()).1, c).await
    }

    async fn take_over(
        &self,
        conn: &mut SqliteConnection,
        t: &TakeOver<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        records_sql::take_over::<Sqlite>(conn, &STATEMENTS.get(self.names()).1, t).await
    }

    async fn begin(conn: &mut SqliteConnection) -> Result<Transaction<'_, Sqlite>, sqlx::Error> {
        conn.begin_with("BEGIN IMMEDIATE").await
    }

    const BATCHES_CLAIMS: bool = true;

    /// One statement: a row of values for each claim, inserted `ON CONFLICT DO NOTHING`.
    async fn claim_new(
        &self,
        conn: &mut SqliteConnection,
        claims: &[NewClaim<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let mut query = sqlx::query_as(CLAIM_NEW.get(self.names()).get(claims.len()));
        for c in claims {
            query = query
                .bind(c.scope)
                .bind(c.key)
                .bind(c.payload_hash)
                .bind(c.token)
                .bind(c.lease_ms)
                .bind(c.retention_ms);
        }
        query.fetch_all(conn).await
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
                 SELECT payload_hash, status, owner_token, attempt, lease_until - ms AS lease_left_ms, \
                        CASE WHEN expires_at <= ms THEN 1 ELSE 0 END AS expired, result, terminal \
                 FROM {records}, now WHERE scope = ?1 AND idem_key = ?2"
            )),
            finish: s(format!(
                "WITH now AS {NOW} \
                 UPDATE {records} SET status = ?4, result = ?5, terminal = ?6, \
                     lease_until = CASE WHEN ?4 = 'PROCESSING' THEN (SELECT ms FROM now) + ?7 ELSE lease_until END, \
                     expires_at = (SELECT ms FROM now) + ?8, \
                     updated_at = (SELECT ms FROM now) \
                 WHERE scope = ?1 AND idem_key = ?2 AND owner_token = ?3 AND status = 'PROCESSING'"
            )),
            stuck: s(format!(
                "WITH now AS {NOW} \
                 SELECT idem_key, owner_token, payload_hash, attempt FROM {records}, now \
                 WHERE scope = ?1 AND status = 'PROCESSING' AND lease_until <= ms AND expires_at > ms \
                 ORDER BY lease_until LIMIT ?2"
            )),
            held: s(format!(
                "WITH now AS {NOW} \
                 SELECT COUNT(*), COALESCE(MAX(ms - created_at), 0) \
                 FROM {records}, now \
                 WHERE scope = ?1 AND status = 'PROCESSING' AND expires_at > ms"
            )),
            purge: [
                s(format!(
                    "WITH now AS {NOW} \
             DELETE FROM {records} WHERE rowid IN ( \
                 SELECT rowid FROM {records}, now \
                 WHERE expires_at <= ms AND (status <> 'PROCESSING' OR lease_until <= ms) LIMIT ?1)"
                )),
                s(format!(
                    "WITH now AS {NOW} \
             DELETE FROM {tokens} WHERE rowid IN ( \
                 SELECT rowid FROM {tokens}, now WHERE expires_at <= ms LIMIT ?1)"
                )),
            ],
            issue_token: s(format!(
                "WITH now AS {NOW} \
                 INSERT INTO {tokens} (scope, token, expires_at, used_at, created_at) \
                 SELECT ?1, ?2, ms + ?3, NULL, ms FROM now"
            )),
            consume_token: s(format!(
                "WITH now AS {NOW} \
                 UPDATE {tokens} SET used_at = (SELECT ms FROM now) \
                 WHERE scope = ?1 AND token = ?2 AND used_at IS NULL AND expires_at > (SELECT ms FROM now)"
            )),
            read_token: s(format!(
                "WITH now AS {NOW} \
                 SELECT used_at IS NOT NULL AS used, CASE WHEN expires_at <= ms THEN 1 ELSE 0 END AS expired \
                 FROM {tokens}, now WHERE scope = ?1 AND token = ?2"
            )),
        },
        OneStatementClaims {
            // `WHERE true` tells SQLite's parser that `ON CONFLICT` belongs to the insert.
            claim: s(format!(
                "WITH now AS {NOW} \
                 INSERT INTO {records} (scope, idem_key, payload_hash, status, owner_token, \
                     attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                 SELECT ?1, ?2, ?3, 'PROCESSING', ?4, 1, ms + ?5, ms + ?6, NULL, 0, ms, ms FROM now WHERE true \
                 ON CONFLICT (scope, idem_key) DO UPDATE SET \
                     payload_hash = excluded.payload_hash, status = 'PROCESSING', \
                     owner_token = excluded.owner_token, \
                     attempt = CASE WHEN expires_at <= excluded.created_at THEN 1 ELSE {NEXT_ATTEMPT} END, \
                     lease_until = excluded.lease_until, expires_at = excluded.expires_at, \
                     result = NULL, terminal = 0, \
                     created_at = CASE WHEN expires_at <= excluded.created_at \
                                       THEN excluded.created_at ELSE created_at END, \
                     updated_at = excluded.updated_at \
                 WHERE expires_at <= excluded.created_at \
                    OR (payload_hash IS excluded.payload_hash \
                        AND ((status = 'PROCESSING' AND lease_until <= excluded.created_at) \
                             OR (status = 'FAILED' AND NOT terminal))) \
                 RETURNING attempt"
            )),
            take_over: s(format!(
                "WITH now AS {NOW} \
                 UPDATE {records} SET owner_token = ?4, attempt = {NEXT_ATTEMPT}, \
                     lease_until = (SELECT ms FROM now) + ?5, expires_at = (SELECT ms FROM now) + ?6, \
                     updated_at = (SELECT ms FROM now) \
                 WHERE scope = ?1 AND idem_key = ?2 AND owner_token = ?3 AND status = 'PROCESSING' \
                   AND lease_until <= (SELECT ms FROM now) AND expires_at > (SELECT ms FROM now) \
                 RETURNING attempt"
            )),
        },
    )
});

/// The statement of `claim_new`, a row of values per claim, built once per namespace and
/// size.
static CLAIM_NEW: PerNamespace<BySize> = PerNamespace::new(|n| {
    let records = n.records.clone();
    BySize::new(move |size| {
        let rows = vec!["(?, ?, ?, ?, ?, ?)"; size].join(", ");
        format!(
            "WITH now AS {NOW} \
                 INSERT INTO {records} (scope, idem_key, payload_hash, status, owner_token, \
                     attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                 SELECT c.column1, c.column2, c.column3, 'PROCESSING', c.column4, 1, \
                        ms + c.column5, ms + c.column6, NULL, 0, ms, ms \
                 FROM now, (VALUES {rows}) AS c WHERE true \
                 ON CONFLICT (scope, idem_key) DO NOTHING \
                 RETURNING owner_token, attempt"
        )
    })
});
