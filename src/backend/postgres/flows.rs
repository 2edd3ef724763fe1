//! The flow layer on PostgreSQL: its SQL, and [`FlowStore`] over it. The recovery job's
//! claim is one statement: an update of the due flows a `FOR UPDATE SKIP LOCKED`
//! subquery chose, so two jobs never wait for, or claim, the same flow.

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::{MS, NOW, PgStore};
use crate::backend::flow_sql::{self, FlowClaims, FlowStatements, LISTINGS};
use crate::backend::names::{Names, PerNamespace};
use crate::backend::sql::Statement;
use crate::flow::{FlowRow, FlowStore, Listing, NewFlow, StepRow, StepWrite, TakeDue, Touch};

/// A flow record's columns, with the clock applied.
const FLOW_COLUMNS: &str = "f.kind, f.flow_key, f.version, f.input_hash, f.input, f.status, \
    f.park_reason, f.step_at, f.owner_token, f.attempt, f.lease_until - now.ms AS lease_left_ms, \
    f.output, f.last_error, f.created_at, f.updated_at";

/// A flow a runner may take: running or compensating, not parked.
const LIVE: &str = "f.park_reason IS NULL AND f.status IN ('RUNNING', 'COMPENSATING')";

impl FlowStore for PgStore {
    async fn read_flow(
        &self,
        conn: &mut PgConnection,
        kind: &str,
        key: &str,
    ) -> Result<Option<FlowRow>, sqlx::Error> {
        flow_sql::read_flow::<Postgres>(conn, STATEMENTS.get(self.names()), kind, key).await
    }

    async fn read_steps(
        &self,
        conn: &mut PgConnection,
        kind: &str,
        key: &str,
    ) -> Result<Vec<StepRow>, sqlx::Error> {
        flow_sql::read_steps::<Postgres>(conn, STATEMENTS.get(self.names()), kind, key).await
    }

    async fn touch(&self, conn: &mut PgConnection, t: &Touch<'_>) -> Result<bool, sqlx::Error> {
        flow_sql::touch::<Postgres>(conn, STATEMENTS.get(self.names()), t).await
    }

    async fn record_step(
        &self,
        conn: &mut PgConnection,
        w: &StepWrite<'_>,
    ) -> Result<(), sqlx::Error> {
        flow_sql::record_step::<Postgres>(conn, STATEMENTS.get(self.names()), w).await
    }

    async fn retry_steps(
        &self,
        conn: &mut PgConnection,
        kind: &str,
        key: &str,
        phase: &str,
    ) -> Result<(), sqlx::Error> {
        flow_sql::retry_steps::<Postgres>(conn, STATEMENTS.get(self.names()), kind, key, phase)
            .await
    }

    async fn wake_flow(
        &self,
        conn: &mut PgConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        flow_sql::wake_flow::<Postgres>(
            conn,
            STATEMENTS.get(self.names()),
            kind,
            key,
            from,
            token,
            lease_ms,
        )
        .await
    }

    async fn unpark(
        &self,
        conn: &mut PgConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        flow_sql::unpark::<Postgres>(
            conn,
            STATEMENTS.get(self.names()),
            kind,
            key,
            from,
            token,
            lease_ms,
        )
        .await
    }

    async fn list_flows(
        &self,
        conn: &mut PgConnection,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<FlowRow>, sqlx::Error> {
        flow_sql::list_flows::<Postgres>(conn, STATEMENTS.get(self.names()), which, after, limit)
            .await
    }

    async fn count_flows(
        &self,
        conn: &mut PgConnection,
        which: Listing,
    ) -> Result<i64, sqlx::Error> {
        flow_sql::count_flows::<Postgres>(conn, STATEMENTS.get(self.names()), which).await
    }

    async fn start_flow(
        &self,
        conn: &mut PgConnection,
        f: &NewFlow<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        flow_sql::start_flow::<Postgres>(conn, CLAIMS.get(self.names()), f).await
    }

    async fn take_due(
        &self,
        conn: &mut PgConnection,
        d: &TakeDue<'_>,
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        flow_sql::take_due::<Postgres>(conn, CLAIMS.get(self.names()), d).await
    }

    const BATCHES_STARTS: bool = true;

    /// One statement: the starts as arrays, inserted `ON CONFLICT DO NOTHING`.
    async fn start_flows(
        &self,
        conn: &mut PgConnection,
        starts: &[crate::flow::NewFlow<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let kinds: Vec<&str> = starts.iter().map(|s| s.kind).collect();
        let keys: Vec<&str> = starts.iter().map(|s| s.key).collect();
        let versions: Vec<i32> = starts.iter().map(|s| s.version).collect();
        let hashes: Vec<&str> = starts.iter().map(|s| s.input_hash).collect();
        let inputs: Vec<&str> = starts.iter().map(|s| s.input).collect();
        let tokens: Vec<&str> = starts.iter().map(|s| s.token).collect();
        let leases: Vec<i64> = starts.iter().map(|s| s.lease_ms).collect();
        sqlx::query_as(START_FLOWS.get(self.names()).clone())
            .bind(kinds)
            .bind(keys)
            .bind(versions)
            .bind(hashes)
            .bind(inputs)
            .bind(tokens)
            .bind(leases)
            .fetch_all(conn)
            .await
    }

    async fn purge_flows(
        &self,
        conn: &mut PgConnection,
        age_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        // The batch is chosen and locked in one subquery (rows another transaction holds
        // are skipped); its steps go in the same statement.
        let gone: i64 = sqlx::query_scalar(PURGE_FLOWS.get(self.names()).clone())
            .bind(age_ms)
            .bind(limit)
            .fetch_one(conn)
            .await?;
        Ok(gone.unsigned_abs())
    }
}

/// The layer's statements, built once per namespace.
static STATEMENTS: PerNamespace<FlowStatements> = PerNamespace::new(|n| {
    let s = |sql: String| Statement::new(sql, false);
    let (flows, flow_steps) = (&n.flows, &n.flow_steps);
    FlowStatements {
        read_flow: s(format!(
            "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM {flows} AS f, now \
             WHERE f.kind = $1 AND f.flow_key = $2"
        )),
        read_steps: s(format!(
            "SELECT step_index, phase, name, status, attempt, downstream_key, owner_token, output, \
                    error, started_at, finished_at \
             FROM {flow_steps} WHERE kind = $1 AND flow_key = $2 ORDER BY step_index, phase DESC"
        )),
        touch: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} AS f SET lease_until = {MS} + $4, \
                 attempt = CASE WHEN $5 THEN 1 ELSE f.attempt END, \
                 step_at = COALESCE($6, f.step_at), status = COALESCE($7, f.status), \
                 park_reason = $8, output = COALESCE($9, f.output), \
                 last_error = COALESCE($10, f.last_error), updated_at = {MS} \
             WHERE f.kind = $1 AND f.flow_key = $2 AND f.owner_token = $3 AND {LIVE}"
        )),
        record_step: s(format!(
            "WITH now AS {NOW} \
             INSERT INTO {flow_steps} AS s (kind, flow_key, step_index, phase, name, status, attempt, \
                 downstream_key, owner_token, output, error, started_at, finished_at) \
             SELECT $1, $2, $3, $4, $5, $6, CASE WHEN $7 THEN 1 ELSE 0 END, $8, $9, $10, $11, ms, \
                 CASE WHEN $6 IN ('STARTED', 'WAITING') THEN NULL ELSE ms END FROM now \
             ON CONFLICT (kind, flow_key, step_index, phase) DO UPDATE SET status = EXCLUDED.status, \
                 attempt = LEAST(GREATEST(s.attempt, 0)::bigint + CASE WHEN $7 THEN 1 ELSE 0 END, 2147483647)::int, \
                 downstream_key = COALESCE(EXCLUDED.downstream_key, s.downstream_key), \
                 owner_token = EXCLUDED.owner_token, output = EXCLUDED.output, \
                 error = EXCLUDED.error, \
                 started_at = CASE WHEN $7 THEN EXCLUDED.started_at ELSE s.started_at END, \
                 finished_at = EXCLUDED.finished_at"
        )),
        retry_steps: s(format!(
            "UPDATE {flow_steps} SET status = 'RETRY' \
             WHERE kind = $1 AND flow_key = $2 AND phase = $3 AND status IN ('STARTED', 'FAILED')"
        )),
        unpark: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} AS f SET park_reason = NULL, owner_token = $3, attempt = 1, \
                 lease_until = {MS} + $4, updated_at = {MS} \
             WHERE f.kind = $1 AND f.flow_key = $2 AND f.owner_token = $5 \
               AND f.park_reason IS NOT NULL"
        )),
        wake: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} AS f SET owner_token = $3, lease_until = {MS} + $4, updated_at = {MS} \
             WHERE f.kind = $1 AND f.flow_key = $2 AND f.owner_token = $5 \
               AND f.park_reason IS NULL AND f.status = 'RUNNING'"
        )),
        list: LISTINGS.map(|which| s(list_sql(n, which, false))),
        count: LISTINGS.map(|which| s(list_sql(n, which, true))),
    }
});

/// The flow start and the recovery claim, built once per namespace.
static CLAIMS: PerNamespace<FlowClaims> = PerNamespace::new(|n| {
    let s = |sql: String| Statement::new(sql, false);
    let flows = &n.flows;
    FlowClaims {
        start_flow: s(format!(
            "WITH now AS {NOW} \
             INSERT INTO {flows} AS f (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             SELECT $1, $2, $3, $4, $5, 'RUNNING', NULL, 0, $6, 1, ms + $7, NULL, NULL, ms, ms FROM now \
             ON CONFLICT (kind, flow_key) DO UPDATE SET owner_token = EXCLUDED.owner_token, \
                 attempt = LEAST(GREATEST(f.attempt, 0)::bigint + 1, 2147483647)::int, lease_until = EXCLUDED.lease_until, \
                 updated_at = EXCLUDED.updated_at \
             WHERE f.input_hash = EXCLUDED.input_hash AND f.version = EXCLUDED.version AND {LIVE} \
               AND f.lease_until <= EXCLUDED.created_at \
             RETURNING attempt"
        )),
        take_due: s(format!(
            "WITH now AS {NOW}, due AS ( \
                 SELECT f.kind, f.flow_key FROM {flows} AS f, now \
                 WHERE f.kind = $1 AND f.version = $2 AND {LIVE} AND f.lease_until <= now.ms \
                 ORDER BY f.lease_until LIMIT $5 FOR UPDATE OF f SKIP LOCKED) \
             UPDATE {flows} AS f SET owner_token = $3, \
                 attempt = LEAST(GREATEST(f.attempt, 0)::bigint + 1, 2147483647)::int, \
                 lease_until = {MS} + $4, updated_at = {MS} \
             FROM due \
             WHERE f.kind = due.kind AND f.flow_key = due.flow_key AND f.lease_until <= {MS} \
             RETURNING f.flow_key, f.attempt"
        )),
    }
});

/// A page of `which` flows (see `FlowStatements::list`), or with `count` how many
/// there are (`FlowStatements::count`).
fn list_sql(n: &Names, which: Listing, count: bool) -> String {
    let filter = match which {
        Listing::Parked => "f.park_reason IS NOT NULL",
        Listing::Running => {
            "f.park_reason IS NULL AND f.status IN ('RUNNING', 'COMPENSATING') AND f.lease_until > now.ms"
        }
        Listing::Stuck => {
            "f.park_reason IS NULL AND f.status IN ('RUNNING', 'COMPENSATING') AND f.lease_until <= now.ms"
        }
        Listing::Finished => "f.status IN ('COMPLETED', 'COMPENSATED')",
        Listing::All => "TRUE",
    };
    let flows = &n.flows;
    if count {
        return format!("WITH now AS {NOW} SELECT COUNT(*) FROM {flows} AS f, now WHERE {filter}");
    }
    format!(
        "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM {flows} AS f, now \
         WHERE {filter} AND (f.kind, f.flow_key) > ($1, $2) \
         ORDER BY f.kind, f.flow_key LIMIT $3"
    )
}

/// The statement of `purge_flows`, built once per namespace.
static PURGE_FLOWS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW}, gone AS ( \
             DELETE FROM {flows} WHERE (kind, flow_key) IN ( \
                 SELECT f.kind, f.flow_key FROM {flows} AS f, now \
                 WHERE f.status IN ('COMPLETED', 'COMPENSATED') AND f.updated_at <= now.ms - $1 \
                 LIMIT $2 FOR UPDATE OF f SKIP LOCKED) \
             RETURNING kind, flow_key), \
         steps AS ( \
             DELETE FROM {flow_steps} AS s USING gone \
             WHERE s.kind = gone.kind AND s.flow_key = gone.flow_key) \
         SELECT COUNT(*) FROM gone",
        flows = n.flows,
        flow_steps = n.flow_steps
    ))
    .into_sql_str()
});

/// The statement of `start_flows`, built once per namespace (the batch goes in as arrays).
static START_FLOWS: PerNamespace<SqlStr> = PerNamespace::new(|n| {
    AssertSqlSafe(format!(
        "WITH now AS {NOW} \
         INSERT INTO {flows} (kind, flow_key, version, input_hash, input, status, park_reason, \
             step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
         SELECT s.kind, s.flow_key, s.version, s.input_hash, s.input, 'RUNNING', NULL, 0, \
                s.owner_token, 1, ms + s.lease_ms, NULL, NULL, ms, ms \
         FROM now, unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::bigint[]) \
              AS s(kind, flow_key, version, input_hash, input, owner_token, lease_ms) \
         ON CONFLICT (kind, flow_key) DO NOTHING \
         RETURNING owner_token::text, attempt::int",
        flows = n.flows
    )).into_sql_str()
});
