//! The flow layer on MySQL/MariaDB: its SQL, and [`FlowStore`] over it.
//!
//! The start is an `INSERT IGNORE` of a new flow and, if the key exists, a conditional
//! `UPDATE` taking it over (as for an idempotency claim). The recovery job's claim is one
//! READ COMMITTED transaction: `SELECT … FOR UPDATE SKIP LOCKED` chooses and locks the
//! due flows, an update hands them to the job's token. On Galera the reads are causal.

use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::MySqlStore;
use super::transition_sql::CAUSAL;
use crate::backend::flow_sql::{self, FlowStatements, LISTINGS, PurgeByKeys};
use crate::backend::names::{Names, PerNamespace};
use crate::backend::sql::{BySize, Statement};
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
    async fn read_flow(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
    ) -> Result<Option<FlowRow>, sqlx::Error> {
        flow_sql::read_flow::<MySql>(conn, self.flows(), kind, key).await
    }

    async fn read_steps(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
    ) -> Result<Vec<StepRow>, sqlx::Error> {
        flow_sql::read_steps::<MySql>(conn, self.flows(), kind, key).await
    }

    async fn touch(&self, conn: &mut MySqlConnection, t: &Touch<'_>) -> Result<bool, sqlx::Error> {
        flow_sql::touch::<MySql>(conn, self.flows(), t).await
    }

    async fn record_step(
        &self,
        conn: &mut MySqlConnection,
        w: &StepWrite<'_>,
    ) -> Result<(), sqlx::Error> {
        flow_sql::record_step::<MySql>(conn, self.flows(), w).await
    }

    async fn retry_steps(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
        phase: &str,
    ) -> Result<(), sqlx::Error> {
        flow_sql::retry_steps::<MySql>(conn, self.flows(), kind, key, phase).await
    }

    async fn wake_flow(
        &self,
        conn: &mut MySqlConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        flow_sql::wake_flow::<MySql>(conn, self.flows(), kind, key, from, token, lease_ms).await
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
        flow_sql::unpark::<MySql>(conn, self.flows(), kind, key, from, token, lease_ms).await
    }

    async fn list_flows(
        &self,
        conn: &mut MySqlConnection,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<FlowRow>, sqlx::Error> {
        flow_sql::list_flows::<MySql>(conn, self.flows(), which, after, limit).await
    }

    async fn count_flows(
        &self,
        conn: &mut MySqlConnection,
        which: Listing,
    ) -> Result<i64, sqlx::Error> {
        flow_sql::count_flows::<MySql>(conn, self.flows(), which).await
    }

    async fn purge_flows(
        &self,
        conn: &mut MySqlConnection,
        age_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let mut tx = <Self as RecordStore>::begin(conn).await?;
        let gone =
            flow_sql::purge_by_keys::<MySql>(&mut tx, PURGE.get(self.names()), age_ms, limit)
                .await?;
        tx.commit().await?;
        Ok(gone)
    }

    const BATCHES_STARTS: bool = true;

    /// One statement: a row of values per start, `INSERT IGNORE`d, answered by its count
    /// alone (as the records' claims are): all inserted, each start holds its flow
    /// (attempt 1); fewer, none is answered held, and each reads its flow (under its own
    /// token where the batch inserted it).
    async fn start_flows(
        &self,
        conn: &mut MySqlConnection,
        starts: &[NewFlow<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let mut query = sqlx::query(START_FLOWS.get(self.names()).get(starts.len()));
        for s in starts {
            query = query
                .bind(s.kind)
                .bind(s.key)
                .bind(s.version)
                .bind(s.input_hash)
                .bind(s.input)
                .bind(s.token)
                .bind(s.lease_ms);
        }
        let inserted = query.execute(conn).await?.rows_affected();
        Ok(if inserted == starts.len() as u64 {
            starts.iter().map(|s| (s.token.to_string(), 1)).collect()
        } else {
            Vec::new()
        })
    }

    async fn start_flow(
        &self,
        conn: &mut MySqlConnection,
        s: &NewFlow<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        let inserted = sqlx::query(START_FLOW_INSERT.get(self.names()).clone())
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
        let taken = sqlx::query(START_FLOW_TAKE_OVER.get(self.names()).clone())
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

    async fn take_due(
        &self,
        conn: &mut MySqlConnection,
        d: &TakeDue<'_>,
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let mut tx = Self::begin(conn).await?;
        let keys: Vec<String> = sqlx::query_scalar(TAKE_DUE_CHOOSE.get(self.names()).clone())
            .bind(d.kind)
            .bind(d.version)
            .bind(d.limit)
            .fetch_all(&mut *tx)
            .await?;
        if keys.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let mut update = sqlx::query(TAKE_DUE_HAND_OVER.get(self.names()).get(keys.len()))
            .bind(d.token)
            .bind(d.lease_ms)
            .bind(d.kind);
        for key in &keys {
            update = update.bind(key);
        }
        update.execute(&mut *tx).await?;
        tx.commit().await?;
        // What the claim holds, read back by its token once committed: read inside the
        // transaction, on a Galera node another node's write set could roll the
        // transaction back during that read without an error, and the read would answer
        // flows the claim no longer holds.
        let mut read = sqlx::query_as(TAKE_DUE_TAKEN.get(self.names()).get(keys.len()))
            .bind(d.kind)
            .bind(d.token);
        for key in &keys {
            read = read.bind(key);
        }
        read.fetch_all(conn).await
    }
}

/// The layer's statements, built once per namespace: with plain reads, and with causal
/// ones (for a Galera node; see
/// [`MySqlStore::causal_reads`](super::MySqlStore::causal_reads)).
static STATEMENTS: PerNamespace<[FlowStatements; 2]> =
    PerNamespace::new(|n| ["", CAUSAL].map(|causal| statements(n, causal)));

/// The statements over `n`'s tables, each read prefixed with `causal`.
fn statements(n: &Names, causal: &str) -> FlowStatements {
    let s = |sql: String| Statement::new(sql, true);
    let Names {
        flows, flow_steps, ..
    } = n;
    FlowStatements {
        read_flow: s(format!(
            "{}SELECT {} FROM {flows} WHERE kind = ?1 AND flow_key = ?2",
            causal,
            flow_columns()
        )),
        read_steps: s(format!(
            "{}SELECT step_index, phase, name, status, attempt, downstream_key, owner_token, output, \
                    error, started_at, finished_at \
             FROM {flow_steps} WHERE kind = ?1 AND flow_key = ?2 ORDER BY step_index, phase DESC",
            causal
        )),
        // The `WHERE` sees the row as it was; the assignments read no column assigned
        // before them.
        touch: s(format!(
            "UPDATE {flows} SET lease_until = {NOW} + ?4, attempt = IF(?5, 1, attempt), \
                 step_at = COALESCE(?6, step_at), status = COALESCE(?7, status), park_reason = ?8, \
                 output = COALESCE(?9, output), last_error = COALESCE(?10, last_error), \
                 updated_at = {NOW} \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?3 AND {LIVE}"
        )),
        record_step: s(format!(
            "INSERT INTO {flow_steps} (kind, flow_key, step_index, phase, name, status, attempt, \
                 downstream_key, owner_token, output, error, started_at, finished_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, IF(?7, 1, 0), ?8, ?9, ?10, ?11, {NOW}, \
                 IF(?6 IN ('STARTED', 'WAITING'), NULL, {NOW})) \
             ON DUPLICATE KEY UPDATE status = VALUES(status), \
                 attempt = LEAST(GREATEST(attempt, 0) + IF(?7, 1, 0), 2147483647), \
                 downstream_key = COALESCE(VALUES(downstream_key), downstream_key), \
                 owner_token = VALUES(owner_token), output = VALUES(output), error = VALUES(error), \
                 started_at = IF(?7, VALUES(started_at), started_at), \
                 finished_at = VALUES(finished_at)"
        )),
        retry_steps: s(format!(
            "UPDATE {flow_steps} SET status = 'RETRY' \
         WHERE kind = ?1 AND flow_key = ?2 AND phase = ?3 AND status IN ('STARTED', 'FAILED')"
        )),
        unpark: s(format!(
            "UPDATE {flows} SET park_reason = NULL, owner_token = ?3, attempt = 1, \
                 lease_until = {NOW} + ?4, updated_at = {NOW} \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?5 AND park_reason IS NOT NULL"
        )),
        wake: s(format!(
            "UPDATE {flows} SET owner_token = ?3, lease_until = {NOW} + ?4, updated_at = {NOW} \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?5 AND park_reason IS NULL \
               AND status = 'RUNNING'"
        )),
        list: LISTINGS.map(|which| s(list_sql(n, which, causal, false))),
        count: LISTINGS.map(|which| s(list_sql(n, which, causal, true))),
    }
}

/// The purge by keys, built once per namespace.
static PURGE: PerNamespace<PurgeByKeys> = PerNamespace::new(|n| {
    PurgeByKeys::new(
        n,
        format!(
            "SELECT kind, flow_key FROM {flows} \
     WHERE status IN ('COMPLETED', 'COMPENSATED') AND updated_at <= {NOW} - ?1 \
     LIMIT ?2 FOR UPDATE SKIP LOCKED",
            flows = n.flows
        ),
        true,
    )
});

/// A page of `which` flows in `n`'s table (see `FlowStatements::list`), or with
/// `count` how many there are (`FlowStatements::count`).
fn list_sql(n: &Names, which: Listing, causal: &str, count: bool) -> String {
    let filter = match which {
        Listing::Parked => "park_reason IS NOT NULL".to_string(),
        Listing::Running => format!("{LIVE} AND lease_until > {NOW}"),
        Listing::Stuck => format!("{LIVE} AND lease_until <= {NOW}"),
        Listing::Finished => "status IN ('COMPLETED', 'COMPENSATED')".to_string(),
        Listing::All => "TRUE".to_string(),
    };
    if count {
        return format!(
            "{causal}SELECT COUNT(*) FROM {flows} WHERE {filter}",
            flows = n.flows
        );
    }
    format!(
        "{}SELECT {} FROM {flows} WHERE {filter} AND (kind, flow_key) > (?1, ?2) \
         ORDER BY kind, flow_key LIMIT ?3",
        causal,
        flow_columns(),
        flows = n.flows
    )
}

impl MySqlStore {
    /// The layer's statements, with causal reads on a Galera node.
    fn flows(&self) -> &'static FlowStatements {
        &STATEMENTS.get(self.names())[usize::from(self.causal_reads() == Some(true))]
    }
}

/// The statement of `start_flow` (insert), built once per namespace.
static START_FLOW_INSERT: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "INSERT IGNORE INTO {flows} (kind, flow_key, version, input_hash, input, status, park_reason, \
             step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
         VALUES (?, ?, ?, ?, ?, 'RUNNING', NULL, 0, ?, 1, {NOW} + ?, NULL, NULL, {NOW}, {NOW})",
        flows = n.flows
    )).into_sql_str()
});

/// The statement of `start_flows`, a row of values per start, built once per namespace
/// and size.
static START_FLOWS: PerNamespace<BySize> = PerNamespace::new(|n| {
    let flows = n.flows.clone();
    BySize::new(move |size| {
        let rows = vec![
            format!(
                "(?, ?, ?, ?, ?, 'RUNNING', NULL, 0, ?, 1, {NOW} + ?, NULL, NULL, {NOW}, {NOW})"
            );
            size
        ]
        .join(", ");
        format!(
            "INSERT IGNORE INTO {flows} (kind, flow_key, version, input_hash, input, status, \
             park_reason, step_at, owner_token, attempt, lease_until, output, last_error, \
             created_at, updated_at) VALUES {rows}"
        )
    })
});

/// The statement of `start_flow` (take over), built once per namespace.
static START_FLOW_TAKE_OVER: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "UPDATE {flows} SET attempt = LAST_INSERT_ID(LEAST(GREATEST(attempt, 0) + 1, 2147483647)), owner_token = ?, \
             lease_until = {NOW} + ?, updated_at = {NOW} \
         WHERE kind = ? AND flow_key = ? AND input_hash = ? AND version = ? AND {LIVE} \
           AND lease_until <= {NOW}",
        flows = n.flows
    )).into_sql_str()
});

/// The statement of `take_due` (choose), built once per namespace.
static TAKE_DUE_CHOOSE: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "SELECT flow_key FROM {flows} \
         WHERE kind = ? AND version = ? AND {LIVE} AND lease_until <= {NOW} \
         ORDER BY lease_until LIMIT ? FOR UPDATE SKIP LOCKED",
        flows = n.flows
    ))
    .into_sql_str()
});

/// The statements of `take_due` sized by the flows they name (the hand-over, the
/// read-back of what the claim holds), built once per namespace and size.
static TAKE_DUE_HAND_OVER: PerNamespace<BySize> = PerNamespace::new(|n| {
    let flows = n.flows.clone();
    BySize::new(move |size| {
        format!(
            "UPDATE {flows} SET owner_token = ?, attempt = LEAST(GREATEST(attempt, 0) + 1, 2147483647), \
                 lease_until = {NOW} + ?, \
                 updated_at = {NOW} \
             WHERE kind = ? AND flow_key IN ({marks}) AND {LIVE} AND lease_until <= {NOW}",
            marks = vec!["?"; size].join(", ")
        )
    })
});
static TAKE_DUE_TAKEN: PerNamespace<BySize> = PerNamespace::new(|n| {
    let flows = n.flows.clone();
    BySize::new(move |size| {
        format!(
            "SELECT flow_key, attempt FROM {flows} \
             WHERE kind = ? AND owner_token = ? AND flow_key IN ({marks})",
            marks = vec!["?"; size].join(", ")
        )
    })
});
