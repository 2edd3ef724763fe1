//! The idempotency layer on MySQL/MariaDB: its SQL, and [`RecordStore`] over it.
//!
//! MySQL's `ON DUPLICATE KEY UPDATE` assigns left to right, each assignment seeing the
//! ones before it, so a conditional takeover cannot be written there. The claim is
//! therefore an `INSERT IGNORE` of a new record and, if the key exists, a conditional
//! `UPDATE` of it (the outcome table's conditions in its `WHERE`, judged on the latest
//! row, which the update locks): one statement for a new key, two otherwise, each
//! atomic on its own. On Galera the read is causal.

use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{AssertSqlSafe, Connection, SqlSafeStr, SqlStr, Transaction};

use super::MySqlStore;
use super::transition_sql::CAUSAL;
use crate::backend::names::{Names, PerNamespace};
use crate::backend::records_sql::{self, RecordStatements};
use crate::backend::sql::{BySize, Statement};
use crate::idempotency::{Finish, NewClaim, RecordRow, RecordStore, StuckRow, TakeOver, TokenRow};
use crate::store::Txn;

/// The database clock, in milliseconds since the epoch (`NOW(3)` is fixed for the
/// statement).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";
/// A claim's next attempt number, bounded to the column's range: a counter edited to its
/// largest value stays there, so the statement never fails after it took the record.
const NEXT_ATTEMPT: &str = "LEAST(GREATEST(attempt, 0) + 1, 2147483647)";

impl RecordStore for MySqlStore {
    type Db = MySql;

    async fn read(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        key: &str,
    ) -> Result<Option<RecordRow>, sqlx::Error> {
        records_sql::read::<MySql>(conn, self.records(), scope, key).await
    }

    async fn finish(
        &self,
        conn: &mut MySqlConnection,
        f: &Finish<'_>,
        txn: Txn,
    ) -> Result<bool, sqlx::Error> {
        records_sql::finish::<MySql>(conn, self.records(), f, txn).await
    }

    async fn stuck(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        limit: i64,
    ) -> Result<Vec<StuckRow>, sqlx::Error> {
        records_sql::stuck::<MySql>(conn, self.records(), scope, limit).await
    }

    async fn held(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
    ) -> Result<(i64, i64), sqlx::Error> {
        records_sql::held::<MySql>(conn, self.records(), scope).await
    }

    async fn purge(&self, conn: &mut MySqlConnection, limit: i64) -> Result<u64, sqlx::Error> {
        records_sql::purge::<MySql>(conn, self.records(), limit).await
    }

    async fn issue_token(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        token: &str,
        ttl_ms: i64,
    ) -> Result<(), sqlx::Error> {
        records_sql::issue_token::<MySql>(conn, self.records(), scope, token, ttl_ms).await
    }

    async fn consume_token(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        token: &str,
    ) -> Result<bool, sqlx::Error> {
        records_sql::consume_token::<MySql>(conn, self.records(), scope, token).await
    }

    async fn read_token(
        &self,
        conn: &mut MySqlConnection,
        scope: &str,
        token: &str,
    ) -> Result<Option<TokenRow>, sqlx::Error> {
        records_sql::read_token::<MySql>(conn, self.records(), scope, token).await
    }

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
        let inserted = sqlx::query(CLAIM.get(self.names()).insert.clone())
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
        let taken = sqlx::query(CLAIM.get(self.names()).take_expired.clone())
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

    const BATCHES_CLAIMS: bool = true;

    /// One statement: a row of values per claim, `INSERT IGNORE`d. MySQL returns no rows
    /// from an insert, so only its count answers: all inserted, each claim holds its
    /// record (attempt 1); fewer, and which is not told, so none is answered held, and
    /// each reads its record (under its own token where the batch inserted it).
    async fn claim_new(
        &self,
        conn: &mut MySqlConnection,
        claims: &[NewClaim<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let mut query = sqlx::query(CLAIM_NEW.get(self.names()).get(claims.len()));
        for c in claims {
            query = query
                .bind(c.scope)
                .bind(c.key)
                .bind(c.payload_hash)
                .bind(c.token)
                .bind(c.lease_ms)
                .bind(c.retention_ms);
        }
        let inserted = query.execute(conn).await?.rows_affected();
        Ok(if inserted == claims.len() as u64 {
            claims.iter().map(|c| (c.token.to_string(), 1)).collect()
        } else {
            Vec::new()
        })
    }

    async fn take_over(
        &self,
        conn: &mut MySqlConnection,
        t: &TakeOver<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let taken = sqlx::query(CLAIM.get(self.names()).take_over.clone())
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

/// The claim's and the takeover's statements (plain `?`s, bound in the order they
/// stand), built once per namespace.
struct Claim {
    /// A new record: scope, key, payload hash, token, lease ms, retention ms.
    insert: SqlStr,
    /// An existing record taken where the outcome table allows: payload hash, token,
    /// lease ms, retention ms, scope, key, payload hash.
    take_expired: SqlStr,
    /// A held record whose lease ran out, taken over: token, lease ms, retention ms,
    /// scope, key, the token it was found with.
    take_over: SqlStr,
}

static CLAIM: PerNamespace<Claim> = PerNamespace::new(|n| {
    let s = |sql: String| AssertSqlSafe(sql).into_sql_str();
    let records = &n.records;
    Claim {
        insert: s(format!(
            "INSERT IGNORE INTO {records} (scope, idem_key, payload_hash, status, owner_token, \
             attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
         VALUES (?, ?, ?, 'PROCESSING', ?, 1, {NOW} + ?, {NOW} + ?, NULL, FALSE, {NOW}, {NOW})"
        )),
        // `attempt` and `created_at` first: they read `expires_at` before it is assigned.
        take_expired: s(format!(
            "UPDATE {records} SET \
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
        )),
        take_over: s(format!(
            "UPDATE {records} SET owner_token = ?, \
             attempt = LAST_INSERT_ID({NEXT_ATTEMPT}), updated_at = {NOW}, lease_until = {NOW} + ?, \
             expires_at = {NOW} + ? \
         WHERE scope = ? AND idem_key = ? AND owner_token = ? AND status = 'PROCESSING' \
           AND lease_until <= {NOW} AND expires_at > {NOW}"
        )),
    }
});

/// The statement of `claim_new`, a row of values per claim, built once per namespace and
/// size.
static CLAIM_NEW: PerNamespace<BySize> = PerNamespace::new(|n| {
    let records = n.records.clone();
    BySize::new(move |size| {
        let rows = vec![
            format!(
                "(?, ?, ?, 'PROCESSING', ?, 1, {NOW} + ?, {NOW} + ?, NULL, FALSE, {NOW}, {NOW})"
            );
            size
        ]
        .join(", ");
        format!(
            "INSERT IGNORE INTO {records} (scope, idem_key, payload_hash, status, owner_token, \
             attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
             VALUES {rows}"
        )
    })
});

/// The layer's shared statements, built once per namespace: with plain reads, and with
/// causal ones (for a Galera node; see
/// [`MySqlStore::causal_reads`](super::MySqlStore::causal_reads)).
static STATEMENTS: PerNamespace<[RecordStatements; 2]> =
    PerNamespace::new(|n| ["", CAUSAL].map(|causal| statements(n, causal)));

/// The shared statements over `n`'s tables, each read prefixed with `causal`.
fn statements(n: &Names, causal: &str) -> RecordStatements {
    let s = |sql: String| Statement::new(sql, true);
    let Names {
        records, tokens, ..
    } = n;
    RecordStatements {
        read: s(format!(
            "{}SELECT payload_hash, status, owner_token, attempt, \
                    CAST(lease_until - {NOW} AS SIGNED) AS lease_left_ms, \
                    CAST(IF(expires_at <= {NOW}, 1, 0) AS SIGNED) AS expired, \
                    result, terminal \
             FROM {records} WHERE scope = ?1 AND idem_key = ?2",
            causal
        )),
        // `lease_until` reads `status` before it is assigned.
        finish: s(format!(
            "UPDATE {records} SET \
                 lease_until = IF(?4 = 'PROCESSING', {NOW} + ?7, lease_until), \
                 expires_at = {NOW} + ?8, \
                 status = ?4, result = ?5, terminal = ?6, updated_at = {NOW} \
             WHERE scope = ?1 AND idem_key = ?2 AND owner_token = ?3 AND status = 'PROCESSING'"
        )),
        stuck: s(format!(
            "{}SELECT idem_key, owner_token, payload_hash, attempt FROM {records} \
             WHERE scope = ?1 AND status = 'PROCESSING' AND lease_until <= {NOW} AND expires_at > {NOW} \
             ORDER BY lease_until LIMIT ?2",
            causal
        )),
        held: s(format!(
            "{}SELECT CAST(COUNT(*) AS SIGNED), CAST(COALESCE(MAX({NOW} - created_at), 0) AS SIGNED) \
             FROM {records} \
             WHERE scope = ?1 AND status = 'PROCESSING' AND expires_at > {NOW}",
            causal
        )),
        purge: [
            s(format!(
                "DELETE FROM {records} \
             WHERE expires_at <= {NOW} AND (status <> 'PROCESSING' OR lease_until <= {NOW}) LIMIT ?1"
            )),
            s(format!(
                "DELETE FROM {tokens} WHERE expires_at <= {NOW} LIMIT ?1"
            )),
        ],
        issue_token: s(format!(
            "INSERT INTO {tokens} (scope, token, expires_at, used_at, created_at) \
             VALUES (?1, ?2, {NOW} + ?3, NULL, {NOW})"
        )),
        consume_token: s(format!(
            "UPDATE {tokens} SET used_at = {NOW} \
             WHERE scope = ?1 AND token = ?2 AND used_at IS NULL AND expires_at > {NOW}"
        )),
        read_token: s(format!(
            "{}SELECT used_at IS NOT NULL AS used, \
                    CAST(IF(expires_at <= {NOW}, 1, 0) AS SIGNED) AS expired \
             FROM {tokens} WHERE scope = ?1 AND token = ?2",
            causal
        )),
    }
}

impl MySqlStore {
    /// The layer's shared statements, with causal reads on a Galera node.
    fn records(&self) -> &'static RecordStatements {
        &STATEMENTS.get(self.names())[usize::from(self.causal_reads() == Some(true))]
    }
}
