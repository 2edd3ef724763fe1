//! The flow layer on SQLite: its SQL, and [`FlowStore`] over it. One writer at a time:
//! the recovery job's claim is one update of the due flows it selects.

use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::SqliteStore;
use crate::backend::flow_sql::{self, FlowClaims, FlowStatements, LISTINGS, PurgeByKeys};
use crate::backend::names::{Names, PerNamespace};
use crate::backend::sql::{BySize, Statement};
use crate::flow::{FlowRow, FlowStore, Listing, NewFlow, StepRow, StepWrite, TakeDue, Touch};
use crate::idempotency::RecordStore;

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "(SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms)";

/// A flow record's columns, with the clock applied.
const FLOW_COLUMNS: &str = "f.kind, f.flow_key, f.version, f.input_hash, f.input, f.status, \
    f.park_reason, f.step_at, f.owner_token, f.attempt, f.lease_until - now.ms AS lease_left_ms, \
    f.output, f.last_error, f.created_at, f.updated_at";

/// A flow a runner may take: running or compensating, not parked.
const LIVE: &str = "park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')";

impl FlowStore for SqliteStore {
    async fn read_flow(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
    ) -> Result<Option<FlowRow>, sqlx::Error> {
        flow_sql::read_flow::<Sqlite>(conn, STATEMENTS.get(self.names()), kind, key).await
    }

    async fn read_steps(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
    ) -> Result<Vec<StepRow>, sqlx::Error> {
        flow_sql::read_steps::<Sqlite>(conn, STATEMENTS.get(self.names()), kind, key).await
    }

    async fn touch(&self, conn: &mut SqliteConnection, t: &Touch<'_>) -> Result<bool, sqlx::Error> {
        flow_sql::touch::<Sqlite>(conn, STATEMENTS.get(self.names()), t).await
    }

    async fn record_step(
        &self,
        conn: &mut SqliteConnection,
        w: &StepWrite<'_>,
    ) -> Result<(), sqlx::Error> {
        flow_sql::record_step::<Sqlite>(conn, STATEMENTS.get(self.names()), w).await
    }

    async fn retry_steps(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
        phase: &str,
    ) -> Result<(), sqlx::Error> {
        flow_sql::retry_steps::<Sqlite>(conn, STATEMENTS.get(self.names()), kind, key, phase).await
    }

    async fn wake_flow(
        &self,
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        flow_sql::wake_flow::<Sqlite>(
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
        conn: &mut SqliteConnection,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        flow_sql::unpark::<Sqlite>(
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
        conn: &mut SqliteConnection,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> Result<Vec<FlowRow>, sqlx::Error> {
        flow_sql::list_flows::<Sqlite>(conn, STATEMENTS.get(self.names()), which, after, limit)
            .await
    }

    async fn count_flows(
        &self,
        conn: &mut SqliteConnection,
        which: Listing,
    ) -> Result<i64, sqlx::Error> {
        flow_sql::count_flows::<Sqlite>(conn, STATEMENTS.get(self.names()), which).await
    }

    async fn start_flow(
        &self,
        conn: &mut SqliteConnection,
        f: &NewFlow<'_>,
    ) -> Result<Option<i32>, sqlx::Error> {
        flow_sql::start_flow::<Sqlite>(conn, CLAIMS.get(self.names()), f).await
    }

    async fn take_due(
        &self,
        conn: &mut SqliteConnection,
        d: &TakeDue<'_>,
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        flow_sql::take_due::<Sqlite>(conn, CLAIMS.get(self.names()), d).await
    }

    async fn purge_flows(
        &self,
        conn: &mut SqliteConnection,
        age_ms: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        let mut tx = <Self as RecordStore>::begin(conn).await?;
        let gone =
            flow_sql::purge_by_keys::<Sqlite>(&mut tx, PURGE.get(self.names()), age_ms, limit)
                .await?;
        tx.commit().await?;
        Ok(gone)
    }

    const BATCHES_STARTS: bool = true;

    /// One statement: a row of values for each start, inserted `ON CONFLICT DO NOTHING`.
    async fn start_flows(
        &self,
        conn: &mut SqliteConnection,
        starts: &[crate::flow::NewFlow<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let mut query = sqlx::query_as(START_FLOWS.get(self.names()).get(starts.len()));
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
        query.fetch_all(conn).await
    }
}

/// The layer's statements, built once per namespace.
static STATEMENTS: PerNamespace<FlowStatements> = PerNamespace::new(|n| {
    let s = |sql: String| Statement::new(sql, false);
    let (flows, flow_steps) = (&n.flows, &n.flow_steps);
    FlowStatements {
        read_flow: s(format!(
            "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM {flows} AS f, now \
             WHERE f.kind = ?1 AND f.flow_key = ?2"
        )),
        read_steps: s(format!(
            "SELECT step_index, phase, name, status, attempt, downstream_key, owner_token, output, \
                    error, started_at, finished_at \
             FROM {flow_steps} WHERE kind = ?1 AND flow_key = ?2 ORDER BY step_index, phase DESC"
        )),
        touch: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} SET lease_until = (SELECT ms FROM now) + ?4, \
                 attempt = CASE WHEN ?5 THEN 1 ELSE attempt END, \
                 step_at = COALESCE(?6, step_at), status = COALESCE(?7, status), \
                 park_reason = ?8, output = COALESCE(?9, output), \
                 last_error = COALESCE(?10, last_error), updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?3 AND {LIVE}"
        )),
        record_step: s(format!(
            "WITH now AS {NOW} \
             INSERT INTO {flow_steps} (kind, flow_key, step_index, phase, name, status, attempt, \
                 downstream_key, owner_token, output, error, started_at, finished_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?7 THEN 1 ELSE 0 END, ?8, ?9, ?10, ?11, ms, \
                 CASE WHEN ?6 IN ('STARTED', 'WAITING') THEN NULL ELSE ms END FROM now WHERE true \
             ON CONFLICT (kind, flow_key, step_index, phase) DO UPDATE SET status = excluded.status, \
                 attempt = MIN(MAX(attempt, 0) + CASE WHEN ?7 THEN 1 ELSE 0 END, 2147483647), \
                 downstream_key = COALESCE(excluded.downstream_key, downstream_key), \
                 owner_token = excluded.owner_token, output = excluded.output, \
                 error = excluded.error, \
                 started_at = CASE WHEN ?7 THEN excluded.started_at ELSE started_at END, \
                 finished_at = excluded.finished_at"
        )),
        retry_steps: s(format!(
            "UPDATE {flow_steps} SET status = 'RETRY' \
             WHERE kind = ?1 AND flow_key = ?2 AND phase = ?3 AND status IN ('STARTED', 'FAILED')"
        )),
        unpark: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} SET park_reason = NULL, owner_token = ?3, attempt = 1, \
                 lease_until = (SELECT ms FROM now) + ?4, updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?5 AND park_reason IS NOT NULL"
        )),
        wake: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} SET owner_token = ?3, lease_until = (SELECT ms FROM now) + ?4, \
                 updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?5 AND park_reason IS NULL \
               AND status = 'RUNNING'"
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
             INSERT INTO {flows} (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, 'RUNNING', NULL, 0, ?6, 1, ms + ?7, NULL, NULL, ms, ms \
             FROM now WHERE true \
             ON CONFLICT (kind, flow_key) DO UPDATE SET owner_token = excluded.owner_token, \
                 attempt = MIN(MAX(attempt, 0) + 1, 2147483647), lease_until = excluded.lease_until, \
                 updated_at = excluded.updated_at \
             WHERE input_hash = excluded.input_hash AND version = excluded.version AND {LIVE} \
               AND lease_until <= excluded.created_at \
             RETURNING attempt"
        )),
        take_due: s(format!(
            "WITH now AS {NOW} \
             UPDATE {flows} SET owner_token = ?3, attempt = MIN(MAX(attempt, 0) + 1, 2147483647), \
                 lease_until = (SELECT ms FROM now) + ?4, updated_at = (SELECT ms FROM now) \
             WHERE rowid IN ( \
                 SELECT rowid FROM {flows} \
                 WHERE kind = ?1 AND version = ?2 AND {LIVE} AND lease_until <= (SELECT ms FROM now) \
                 ORDER BY lease_until LIMIT ?5) \
             RETURNING flow_key, attempt"
        )),
    }
});

/// The purge by keys, built once per namespace.
static PURGE: PerNamespace<PurgeByKeys> = PerNamespace::new(|n| {
    let flows = &n.flows;
    PurgeByKeys::new(
        n,
        format!(
            "WITH now AS {NOW} SELECT kind, flow_key FROM {flows}, now \
     WHERE status IN ('COMPLETED', 'COMPENSATED') AND updated_at <= ms - ?1 LIMIT ?2"
        ),
        false,
    )
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
        Listing::All => "1",
    };
    let flows = &n.flows;
    if count {
        return format!("WITH now AS {NOW} SELECT COUNT(*) FROM {flows} AS f, now WHERE {filter}");
    }
    format!(
        "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM {flows} AS f, now \
         WHERE {filter} AND (f.kind, f.flow_key) > (?1, ?2) \
         ORDER BY f.kind, f.flow_key LIMIT ?3"
    )
}

/// The statement of `start_flows`, a row of values per start, built once per namespace
/// and size.
static START_FLOWS: PerNamespace<BySize> = PerNamespace::new(|n| {
    let flows = n.flows.clone();
    BySize::new(move |size| {
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?)"; size].join(", ");
        format!(
            "WITH now AS {NOW} \
                 INSERT INTO {flows} (kind, flow_key, version, input_hash, input, status, park_reason, \
                     step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
                 SELECT s.column1, s.column2, s.column3, s.column4, s.column5, 'RUNNING', NULL, 0, \
                        s.column6, 1, ms + s.column7, NULL, NULL, ms, ms \
                 FROM now, (VALUES {rows}) AS s WHERE true \
                 ON CONFLICT (kind, flow_key) DO NOTHING \
                 RETURNING owner_token, attempt"
        )
    })
});
