//! The flow layer on SQLite: its SQL, and [`FlowStore`] over it. One writer at a time:
//! the recovery job's claim is one update of the due flows it selects.

use sqlx::sqlite::SqliteConnection;

use super::SqliteStore;
use crate::backend::flow_sql::{
    FlowSql, OneStatementClaims, PurgeByKeys, one_statement_flow_claims, purge_flows_by_keys,
    shared_flow_statements,
};
use crate::flow::{FlowStore, Listing};

/// The database clock, in milliseconds since the epoch.
const NOW: &str = "(SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms)";

/// A flow record's columns, with the clock applied.
const FLOW_COLUMNS: &str = "f.kind, f.flow_key, f.version, f.input_hash, f.input, f.status, \
    f.park_reason, f.step_at, f.owner_token, f.attempt, f.lease_until - now.ms AS lease_left_ms, \
    f.output, f.last_error, f.created_at, f.updated_at";

/// A flow a runner may take: running or compensating, not parked.
const LIVE: &str = "park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')";

impl FlowStore for SqliteStore {
    shared_flow_statements!(SqliteConnection, sqlx::Sqlite);
    purge_flows_by_keys!(SqliteConnection, sqlx::Sqlite);
    one_statement_flow_claims!(SqliteConnection, sqlx::Sqlite);

    const BATCHES_STARTS: bool = true;

    /// One statement: a row of values for each start, inserted `ON CONFLICT DO NOTHING`.
    async fn start_flows(
        &self,
        conn: &mut SqliteConnection,
        starts: &[crate::flow::NewFlow<'_>],
    ) -> Result<Vec<(String, i32)>, sqlx::Error> {
        let rows = vec!["(?, ?, ?, ?, ?, ?, ?)"; starts.len()].join(", ");
        let sql = format!(
            "WITH now AS {NOW} \
             INSERT INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             SELECT s.column1, s.column2, s.column3, s.column4, s.column5, 'RUNNING', NULL, 0, \
                    s.column6, 1, ms + s.column7, NULL, NULL, ms, ms \
             FROM now, (VALUES {rows}) AS s WHERE true \
             ON CONFLICT (kind, flow_key) DO NOTHING \
             RETURNING owner_token, attempt"
        );
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
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

impl FlowSql for SqliteStore {
    const POSITIONAL: bool = false;

    fn read_flow_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM flows AS f, now \
             WHERE f.kind = ?1 AND f.flow_key = ?2"
        )
    }

    fn read_steps_sql(&self) -> String {
        "SELECT step_index, phase, name, status, attempt, downstream_key, owner_token, output, \
                    error, started_at, finished_at \
             FROM flow_steps WHERE kind = ?1 AND flow_key = ?2 ORDER BY step_index, phase DESC"
            .to_string()
    }

    fn touch_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} \
             UPDATE flows SET lease_until = (SELECT ms FROM now) + ?4, \
                 attempt = CASE WHEN ?5 THEN 1 ELSE attempt END, \
                 step_at = COALESCE(?6, step_at), status = COALESCE(?7, status), \
                 park_reason = ?8, output = COALESCE(?9, output), \
                 last_error = COALESCE(?10, last_error), updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?3 AND {LIVE}"
        )
    }

    fn record_step_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} \
             INSERT INTO flow_steps (kind, flow_key, step_index, phase, name, status, attempt, \
                 downstream_key, owner_token, output, error, started_at, finished_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?7 THEN 1 ELSE 0 END, ?8, ?9, ?10, ?11, ms, \
                 CASE WHEN ?6 = 'STARTED' THEN NULL ELSE ms END FROM now WHERE true \
             ON CONFLICT (kind, flow_key, step_index, phase) DO UPDATE SET status = excluded.status, \
                 attempt = MIN(MAX(attempt, 0) + CASE WHEN ?7 THEN 1 ELSE 0 END, 2147483647), \
                 downstream_key = COALESCE(excluded.downstream_key, downstream_key), \
                 owner_token = excluded.owner_token, output = excluded.output, \
                 error = excluded.error, \
                 started_at = CASE WHEN ?7 THEN excluded.started_at ELSE started_at END, \
                 finished_at = excluded.finished_at"
        )
    }

    fn retry_steps_sql(&self) -> String {
        "UPDATE flow_steps SET status = 'RETRY' \
             WHERE kind = ?1 AND flow_key = ?2 AND phase = ?3 AND status IN ('STARTED', 'FAILED')"
            .to_string()
    }

    fn unpark_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} \
             UPDATE flows SET park_reason = NULL, owner_token = ?3, attempt = 1, \
                 lease_until = (SELECT ms FROM now) + ?4, updated_at = (SELECT ms FROM now) \
             WHERE kind = ?1 AND flow_key = ?2 AND owner_token = ?5 AND park_reason IS NOT NULL"
        )
    }

    fn list_flows_sql(&self, which: Listing) -> String {
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
        format!(
            "WITH now AS {NOW} SELECT {FLOW_COLUMNS} FROM flows AS f, now \
             WHERE {filter} AND (f.kind, f.flow_key) > (?1, ?2) \
             ORDER BY f.kind, f.flow_key LIMIT ?3"
        )
    }
}

impl OneStatementClaims for SqliteStore {
    fn start_flow_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} \
             INSERT INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             SELECT ?1, ?2, ?3, ?4, ?5, 'RUNNING', NULL, 0, ?6, 1, ms + ?7, NULL, NULL, ms, ms \
             FROM now WHERE true \
             ON CONFLICT (kind, flow_key) DO UPDATE SET owner_token = excluded.owner_token, \
                 attempt = MIN(MAX(attempt, 0) + 1, 2147483647), lease_until = excluded.lease_until, \
                 updated_at = excluded.updated_at \
             WHERE input_hash = excluded.input_hash AND version = excluded.version AND {LIVE} \
               AND lease_until <= excluded.created_at \
             RETURNING attempt"
        )
    }

    fn take_due_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} \
             UPDATE flows SET owner_token = ?3, attempt = MIN(MAX(attempt, 0) + 1, 2147483647), \
                 lease_until = (SELECT ms FROM now) + ?4, updated_at = (SELECT ms FROM now) \
             WHERE rowid IN ( \
                 SELECT rowid FROM flows \
                 WHERE kind = ?1 AND version = ?2 AND {LIVE} AND lease_until <= (SELECT ms FROM now) \
                 ORDER BY lease_until LIMIT ?5) \
             RETURNING flow_key, attempt"
        )
    }
}

impl PurgeByKeys for SqliteStore {
    fn purge_choose_sql(&self) -> String {
        format!(
            "WITH now AS {NOW} SELECT kind, flow_key FROM flows, now \
             WHERE status IN ('COMPLETED', 'COMPENSATED') AND updated_at <= ms - ?1 LIMIT ?2"
        )
    }
}
