//! The outbox on MySQL/MariaDB: its SQL, and [`OutboxStore`] over it. The relay's claim
//! is a READ COMMITTED transaction: `SELECT … FOR UPDATE SKIP LOCKED` chooses and locks
//! the events; a second, plain read tests the chosen ones again for an earlier
//! unpublished event of their entity; an update hands the survivors to the claim's
//! token. The second read is needed: the locking read sees the latest committed rows,
//! but its subquery reads the statement's snapshot, so an entity's events committed
//! while it ran (v1 and v2, after its snapshot) would both look like the earliest. The
//! next statement's snapshot sees every event committed before the ones the locking read
//! found. On Galera, two nodes' claims of one event collide at certification: one of
//! them fails with a deadlock, which the relay retries. The statements it shares with
//! SQLite are in `backend/outbox_sql.rs`.

use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::MySqlStore;
use crate::backend::names::{Names, PerNamespace};
use crate::backend::outbox_sql::{self, ATTEMPT, OutboxStatements, UNKNOWN_STATUS, claimed};
use crate::backend::sql::Params;
use crate::idempotency::RecordStore;
use crate::outbox::{
    ClaimEvents, ClaimedEvent, CorruptRow, EventKey, EventRow, FailedEvent, OutboxStore, StatsRow,
};

/// The database clock, in milliseconds since the epoch (`NOW(3)` is fixed for the
/// statement).
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// An event's age in milliseconds, on the database's clock.
macro_rules! age_ms {
    () => {
        "CAST(TIMESTAMPDIFF(MICROSECOND, created_at, NOW(6)) DIV 1000 AS SIGNED)"
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

/// No earlier event of `o`'s entity is unpublished (pending, dead, or in a status
/// orderly never writes).
fn head(n: &Names) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM {outbox} AS p WHERE p.machine = o.machine \
         AND p.entity_id = o.entity_id AND p.status <> 'PUBLISHED' AND p.version < o.version)",
        outbox = n.outbox
    )
}

/// A row orderly never writes (see `OutboxStore::list_corrupt`); its one parameter is the
/// longest lease a relay takes, in milliseconds.
fn corrupt() -> String {
    format!("({UNKNOWN_STATUS} OR (o.status = 'PENDING' AND o.lease_until > {NOW} + ?))")
}

/// The statements every backend shares, built once per namespace.
static STATEMENTS: PerNamespace<OutboxStatements> =
    PerNamespace::new(|n| OutboxStatements::new(n, NOW, EVENT_COLUMNS, Params::Plain));

impl OutboxStore for MySqlStore {
    async fn mark_failed(
        &self,
        conn: &mut MySqlConnection,
        f: &FailedEvent<'_>,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::mark_failed::<MySql>(conn, STATEMENTS.get(self.names()), f).await
    }

    async fn requeue_event(
        &self,
        conn: &mut MySqlConnection,
        key: &EventKey,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::requeue_event::<MySql>(conn, STATEMENTS.get(self.names()), key).await
    }

    async fn discard_event(
        &self,
        conn: &mut MySqlConnection,
        key: &EventKey,
    ) -> Result<bool, sqlx::Error> {
        outbox_sql::discard_event::<MySql>(conn, STATEMENTS.get(self.names()), key).await
    }

    async fn list_events(
        &self,
        conn: &mut MySqlConnection,
        status: &str,
        limit: i64,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        outbox_sql::list_events::<MySql>(conn, STATEMENTS.get(self.names()), status, limit).await
    }

    async fn mark_published(
        &self,
        conn: &mut MySqlConnection,
        token: &str,
        keys: &[EventKey],
    ) -> Result<u64, sqlx::Error> {
        if keys.is_empty() {
            return Ok(0);
        }
        let keys = keys
            .iter()
            .map(|k| (k.machine.as_str(), k.entity_id, k.version));
        let done = sqlx::query(MARK_PUBLISHED.get(self.names()).clone())
            .bind(keys_json(keys))
            .bind(token)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    async fn claim_events(
        &self,
        conn: &mut MySqlConnection,
        c: &ClaimEvents<'_>,
    ) -> Result<Vec<ClaimedEvent>, sqlx::Error> {
        let mut tx = Self::begin(conn).await?;
        let locked: Vec<(String, i64, i64)> =
            sqlx::query_as(CLAIM_EVENTS_CHOOSE.get(self.names()).clone())
                .bind(c.limit)
                .fetch_all(&mut *tx)
                .await?;
        if locked.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        // The earlier-event test again, on a snapshot that sees every event committed
        // before the ones the locking read found; the survivors' rows, as they are (they
        // are locked), each decoded on its own.
        let chosen = keys_json(locked.iter().map(|(m, e, v)| (m.as_str(), *e, *v)));
        let mut rows: Vec<ClaimedEvent> =
            sqlx::query(CLAIM_EVENTS_RECHECK.get(self.names()).clone())
                .bind(chosen)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(claimed)
                .collect();
        // A row whose key does not read cannot be handed over (nor set aside): it is left
        // as it is. (The key's columns are typed; it does not happen.)
        rows.retain(|row| row.as_ref().map_or_else(|c| c.key.is_some(), |_| true));
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(rows);
        }
        let keys: Vec<EventKey> = rows
            .iter()
            .filter_map(|row| match row {
                Ok(e) => Some(EventKey {
                    machine: e.machine.clone(),
                    entity_id: e.entity_id,
                    version: e.version,
                }),
                Err(c) => c.key.clone(),
            })
            .collect();
        let kept = keys_json(
            keys.iter()
                .map(|k| (k.machine.as_str(), k.entity_id, k.version)),
        );
        let handed = sqlx::query(CLAIM_EVENTS_HAND_OVER.get(self.names()).clone())
            .bind(&kept)
            .bind(c.token)
            .bind(c.lease_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        if handed == keys.len() as u64 {
            for row in rows.iter_mut().flatten() {
                row.attempts = row.attempts.max(0).saturating_add(1);
            }
            return Ok(rows);
        }
        // Locked rows cannot change under the claim; if they did, the claim answers what
        // it holds, read back by its token once committed. (Read inside the transaction,
        // on a Galera node another node's write set could roll the transaction back
        // during that read without an error: the read would answer rows the claim no
        // longer holds.)
        let read = sqlx::query(CLAIM_EVENTS_TAKEN.get(self.names()).clone())
            .bind(&kept)
            .bind(c.token);
        Ok(read.fetch_all(conn).await?.iter().map(claimed).collect())
    }

    /// The claim's choice in one statement (see `LOCK_EVENTS`), in a READ COMMITTED
    /// transaction left open. Not on a Galera node, whose row locks bind no other node.
    async fn lock_events(
        &self,
        conn: &mut MySqlConnection,
        limit: i64,
    ) -> Result<Option<Vec<ClaimedEvent>>, sqlx::Error> {
        if self.causal_reads() != Some(false) {
            return Ok(None);
        }
        crate::backend::units::begin_rules_unit::<MySql>(
            conn,
            crate::store::Txn::Own,
            Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"),
            false,
        )
        .await?;
        let mut rows: Vec<ClaimedEvent> = sqlx::query(LOCK_EVENTS.get(self.names()).clone())
            .bind(limit)
            .fetch_all(conn)
            .await?
            .iter()
            .map(claimed)
            .collect();
        // A row whose key does not read cannot be settled: it is left as it is (the key's
        // columns are typed; it does not happen).
        rows.retain(|row| row.as_ref().map_or_else(|c| c.key.is_some(), |_| true));
        Ok(Some(rows))
    }

    async fn settle_locked(
        &self,
        conn: &mut MySqlConnection,
        published: &[EventKey],
        failed: &[FailedEvent<'_>],
    ) -> Result<u64, sqlx::Error> {
        let mut marked = 0;
        if !published.is_empty() {
            let keys = published
                .iter()
                .map(|k| (k.machine.as_str(), k.entity_id, k.version));
            marked = sqlx::query(PUBLISHED_LOCKED.get(self.names()).clone())
                .bind(keys_json(keys))
                .execute(&mut *conn)
                .await?
                .rows_affected();
        }
        outbox_sql::settle_failed_and_commit::<MySql>(conn, STATEMENTS.get(self.names()), failed)
            .await?;
        Ok(marked)
    }

    async fn list_corrupt(
        &self,
        conn: &mut MySqlConnection,
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
        conn: &mut MySqlConnection,
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
        conn: &mut MySqlConnection,
        max_lease_ms: i64,
    ) -> Result<StatsRow, sqlx::Error> {
        // A zero date (which the default `sql_mode` accepts) is no time to count from.
        sqlx::query_as(OUTBOX_STATS.get(self.names()).clone())
            .bind(max_lease_ms)
            .fetch_one(conn)
            .await
    }

    /// `INSERT IGNORE` (the inbox layer checks the lengths first, so the only error it
    /// can turn into a warning is the duplicate key).
    async fn inbox_insert(
        &self,
        conn: &mut MySqlConnection,
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
        conn: &mut MySqlConnection,
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

/// The statement of `claim_events` (choose), built once per namespace.
static CLAIM_EVENTS_CHOOSE: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT o.machine, o.entity_id, o.version FROM {outbox} AS o \
         WHERE o.status = 'PENDING' AND o.next_at <= {NOW} AND o.lease_until <= {NOW} AND {head} \
         LIMIT ? FOR UPDATE SKIP LOCKED",
        outbox = n.outbox,
        head = head(n)
    ))
    .into_sql_str()
});

/// The statements of `claim_events` that name the chosen events (the re-check, the
/// hand-over, the read-back of what the claim holds), each joining its one parameter
/// ([`KEYS`]) to the rows by the primary key; built once per namespace.
static CLAIM_EVENTS_RECHECK: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT {EVENT_COLUMNS} FROM {KEYS} STRAIGHT_JOIN {outbox} AS o FORCE INDEX (PRIMARY) \
             ON o.machine = k.m AND o.entity_id = k.e AND o.version = k.v \
         WHERE {head}",
        outbox = n.outbox,
        head = head(n)
    ))
    .into_sql_str()
});
static CLAIM_EVENTS_HAND_OVER: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "UPDATE {KEYS} STRAIGHT_JOIN {outbox} AS o FORCE INDEX (PRIMARY) \
             ON o.machine = k.m AND o.entity_id = k.e AND o.version = k.v \
         SET o.owner_token = ?, o.lease_until = {NOW} + ?, \
             o.attempts = LEAST(GREATEST(o.attempts, 0) + 1, 2147483647) \
         WHERE o.status = 'PENDING' AND o.next_at <= {NOW} AND o.lease_until <= {NOW}",
        outbox = n.outbox
    ))
    .into_sql_str()
});
static CLAIM_EVENTS_TAKEN: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT {EVENT_COLUMNS} FROM {KEYS} STRAIGHT_JOIN {outbox} AS o FORCE INDEX (PRIMARY) \
             ON o.machine = k.m AND o.entity_id = k.e AND o.version = k.v \
         WHERE o.owner_token = ?",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// The statement of `mark_published` (claims by lease), built once per namespace.
static MARK_PUBLISHED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "UPDATE {KEYS} STRAIGHT_JOIN {outbox} AS o FORCE INDEX (PRIMARY) \
             ON o.machine = k.m AND o.entity_id = k.e AND o.version = k.v \
         SET o.status = 'PUBLISHED', o.owner_token = NULL, o.lease_until = 0, \
             o.last_error = NULL, o.published_at = {NOW}, o.next_at = {NOW} \
         WHERE o.owner_token = ? AND o.status = 'PENDING'",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// A batch's keys as a table `k (m, e, v)`, from one parameter: the keys as a JSON array
/// of `[machine, entity id, version]`. MariaDB matches a list of key tuples (`OR`ed
/// groups, or a row constructor's `IN`) against the primary key about ten times slower
/// than it joins these rows to it.
const KEYS: &str = "JSON_TABLE(?, '$[*]' COLUMNS ( \
    m VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PATH '$[0]', \
    e BIGINT PATH '$[1]', v BIGINT PATH '$[2]')) AS k";

/// The parameter of [`KEYS`].
fn keys_json<'a>(keys: impl Iterator<Item = (&'a str, i64, i64)>) -> String {
    serde_json::Value::Array(keys.map(|(m, e, v)| serde_json::json!([m, e, v])).collect())
        .to_string()
}

/// The statement of `lock_events`, built once per namespace: the claim's choice,
/// returning the rows. The locking read meets the latest committed rows, while its
/// subquery reads the statement's snapshot, so the earlier-event test is made as one the
/// snapshot can answer alone: the event is the earliest unpublished of its entity *in the
/// snapshot*. An event committed after the snapshot began is not in it and waits for the
/// next claim (its entity's earlier events may have been committed after the snapshot
/// too, unseen). An event the snapshot holds was committed after every earlier event of
/// its entity (a transition writes the next version only once the previous one
/// committed), so the snapshot holds those as well.
static LOCK_EVENTS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT {EVENT_COLUMNS} FROM {outbox} AS o \
         WHERE o.status = 'PENDING' AND o.next_at <= {NOW} AND o.lease_until <= {NOW} \
           AND o.version = (SELECT MIN(p.version) FROM {outbox} AS p \
               WHERE p.machine = o.machine AND p.entity_id = o.entity_id AND p.status <> 'PUBLISHED') \
         LIMIT ? FOR UPDATE SKIP LOCKED",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// The statement of `settle_locked` for the published events, built once per namespace.
/// The keys are read first and each joined to its row by the primary key: the rows an
/// update reads it locks, and a scan of the table would wait for (and deadlock with) the
/// events other relays hold.
static PUBLISHED_LOCKED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "UPDATE {KEYS} STRAIGHT_JOIN {outbox} AS o FORCE INDEX (PRIMARY) \
             ON o.machine = k.m AND o.entity_id = k.e AND o.version = k.v \
         SET status = 'PUBLISHED', owner_token = NULL, lease_until = 0, \
             last_error = NULL, published_at = {NOW}, next_at = {NOW}, attempts = {ATTEMPT} \
         WHERE o.status = 'PENDING'",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// The statement of `purge_published`, built once per namespace.
static PURGE_PUBLISHED: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "DELETE FROM {outbox} WHERE status = 'PUBLISHED' AND published_at <= {NOW} - ? LIMIT ?",
        outbox = n.outbox
    ))
    .into_sql_str()
});

/// The statement of `inbox_insert`, built once per namespace.
static INBOX_INSERT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "INSERT IGNORE INTO {inbox} (consumer, message_id, received_at) VALUES (?, ?, {NOW})",
        inbox = n.inbox
    ))
    .into_sql_str()
});

/// The statement of `list_corrupt`, built once per namespace.
static LIST_CORRUPT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT o.machine, CAST(o.entity_id AS CHAR) AS entity_id, CAST(o.version AS CHAR) AS version, o.status, \
             CASE WHEN {UNKNOWN_STATUS} THEN 'a status orderly never writes' \
                  ELSE CONCAT('claimed by ', COALESCE(o.owner_token, '?'), ' with a lease past the longest a relay takes') END AS reason \
         FROM {outbox} AS o WHERE {corrupt} \
         ORDER BY o.machine, o.entity_id, o.version LIMIT ?",
        outbox = n.outbox,
        corrupt = corrupt()
    )).into_sql_str()
});

/// The statement of `outbox_stats`, built once per namespace.
static OUTBOX_STATS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT CAST(COALESCE(SUM(status = 'PENDING'), 0) AS SIGNED) AS pending, \
                CAST(COALESCE(SUM(status = 'DEAD'), 0) AS SIGNED) AS dead, \
                CAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, \
                    MIN(CASE WHEN status = 'PENDING' AND YEAR(created_at) > 0 THEN created_at END), \
                    NOW(6)) DIV 1000, 0) AS SIGNED) AS oldest_pending_ms, \
                (SELECT CAST(COUNT(*) AS SIGNED) FROM {outbox} AS o WHERE {corrupt}) AS corrupt \
         FROM {outbox} WHERE status IN ('PENDING', 'DEAD')",
        outbox = n.outbox,
        corrupt = corrupt()
    )).into_sql_str()
});

/// The statement of `inbox_purge`, built once per namespace.
static INBOX_PURGE: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "DELETE FROM {inbox} WHERE received_at <= {NOW} - ? LIMIT ?",
        inbox = n.inbox
    ))
    .into_sql_str()
});
