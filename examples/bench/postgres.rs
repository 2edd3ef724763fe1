//! The bench on PostgreSQL: its own database, the floor and naive modes by hand, the plans.

use super::*;
use orderly::backend::postgres::migrate;
use orderly::store::OwnedKey;
use orderly::{EngineConfig, PgStore, ReadFirst};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};
use std::str::FromStr;

pub struct Db {
    pool: PgPool,
    /// Whether the stores keep a connection out of the pool between their conversations
    /// (not with `--pooled-units`).
    keep: bool,
}

/// Finished idempotency records and flows of each lane (the library's and the
/// hand-written), kept in their tables through every reset, as a running service's
/// tables hold. Measured against tables a reset had emptied and analyzed, PostgreSQL
/// planned the first lane's statements as sequential scans (a table it knows to be
/// empty), and each connection kept those plans while the lane filled the table, so the
/// first lane's updates slowed with every row and the second lane's, planned later, did
/// not. The hand-written completion tests the record's status through an expression, as
/// the library does, so that it too is planned by the record's key, not by the stuck
/// index (docs/benchmarks.md, "Idempotency records").
const PRE_RECORDS: i64 = 10_000;

impl Db {
    pub async fn setup(
        args: &Args,
        pool_size: u32,
        name: &str,
        history_rows: i64,
    ) -> Result<Self, BoxError> {
        let url = std::env::var("ORDERLY_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let admin = PgConnectOptions::from_str(&url)?;
        let mut conn = PgConnection::connect_with(&admin).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let pool = PgPoolOptions::new()
            .max_connections(pool_size)
            .min_connections(pool_size)
            // No ping round trip on every acquire, for every mode alike (see docs/benchmarks.md).
            .test_before_acquire(false)
            .connect_with(admin.database(name))
            .await?;
        migrate(&pool).await?;
        // The bench's own entity table, `orders`, as an application's migration makes it.
        let tables = orderly::Tables::new("orders")?;
        for sql in orderly::Schema::create_tables_sql(&orderly::PgStore::new(pool.clone(), tables))
        {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO orders (id, status, version) SELECT g, 'Created', 0 FROM generate_series(1, {}) g",
            args.orders
        )))
        .execute(&pool)
        .await?;
        if history_rows > 0 {
            // Other orders' history (negative ids), four transitions per order.
            sqlx::raw_sql(AssertSqlSafe(format!(
                "INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) \
                 SELECT -1 - g / 4, g % 4 + 1, 'Created', 'Paid', 'Pay', 'pre-' || g FROM generate_series(0, {} - 1) g",
                history_rows
            )))
            .execute(&pool)
            .await?;
        }
        // Finished records and flows of earlier requests, as a running service's tables
        // hold: the statements of both lanes are planned against tables that are not
        // empty (docs/benchmarks.md, "Idempotency records").
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO orderly.idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                 attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
             SELECT s, 'pre-' || g, 'h', 'SUCCEEDED', 't', 1, 0, 9000000000000, NULL, FALSE, 0, 0 \
             FROM generate_series(0, {n} - 1) g, (VALUES ('hand'), ('{scope}')) AS lane(s); \
             INSERT INTO orderly.flows (kind, flow_key, version, input_hash, input, status, park_reason, \
                 step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) \
             SELECT k, 'pre-' || g, 1, 'h', '{{}}', 'COMPLETED', NULL, 2, 't', 1, 0, NULL, NULL, 0, 0 \
             FROM generate_series(0, {n} - 1) g, (VALUES ('hand'), ('{kind}')) AS lane(k)",
            n = PRE_RECORDS,
            scope = crate::records::SCOPE,
            kind = "bench", // `flows::PayShip`'s kind
        )))
        .execute(&pool)
        .await?;
        sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
        Ok(Db {
            pool,
            keep: !args.pooled_units,
        })
    }
}

impl BenchDb for Db {
    type S = PgStore;

    async fn exec(&self, sql: String) -> Result<(), BoxError> {
        sqlx::raw_sql(AssertSqlSafe(super::db::in_schema(&sql)))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn service_db(&self, name: &str, skus: usize) -> Result<String, BoxError> {
        let url = std::env::var("ORDERLY_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let admin = PgConnectOptions::from_str(&url)?;
        let mut conn = PgConnection::connect_with(&admin).await?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let mut db = PgConnection::connect_with(&admin.database(name)).await?;
        let values = (0..skus)
            .map(|i| format!("('sku-c-{i}', 1000000000)"))
            .collect::<Vec<_>>()
            .join(", ");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE stock (sku TEXT PRIMARY KEY, available BIGINT NOT NULL); \
             INSERT INTO stock (sku, available) VALUES {values}"
        )))
        .execute(&mut db)
        .await?;
        Ok(with_database(&url, name))
    }

    async fn timers_hand(
        &self,
        batch: i64,
        engine: &Engine<TimerMachine, PgStore>,
    ) -> Result<usize, BoxError> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT id, entity_id, ref_id FROM orderly.timers WHERE status = 'PENDING' \
             AND next_at <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
             ORDER BY next_at LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        for (_, entity, ref_id) in &rows {
            engine
                .transition(*entity, TimerEvent::Cancel, ref_id)
                .within(&mut tx)
                .await?;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        sqlx::query("UPDATE orderly.timers SET status = 'FIRED', outcome = 'applied', fired_at = 0 WHERE id = ANY($1)")
            .bind(ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows.len())
    }

    async fn lateness_ms(&self, sql: String) -> Result<Vec<i64>, BoxError> {
        Ok(
            sqlx::query_scalar(AssertSqlSafe(super::db::in_schema(&sql)))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    fn now_ms_sql(&self) -> &'static str {
        "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    }

    async fn count(&self, sql: String) -> Result<i64, BoxError> {
        Ok(
            sqlx::query_scalar(AssertSqlSafe(super::db::in_schema(&sql)))
                .fetch_one(&self.pool)
                .await?,
        )
    }

    async fn hot_hand(&self, id: i64, ref_id: &str) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Open", "hot-hand", id)?;
        let n =
            sqlx::query("UPDATE orders SET version = version + 1 WHERE id = $1 AND version = $2")
                .bind(id)
                .bind(version)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        ensure(n == 1, "hot-hand", id)?;
        sqlx::query("INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(id).bind(version + 1).bind("Open").bind("Open").bind("Touch").bind(ref_id)
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn relay_hand<K: Sink>(&self, batch: i64, sink: &K) -> Result<usize, BoxError> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, status, attempts, last_error, 0::bigint AS age_ms FROM orderly.outbox WHERE status = 'PENDING' \
             LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        publish_all(sink, &rows).await?;
        let machines: Vec<&str> = rows.iter().map(|r| r.machine.as_str()).collect();
        let entities: Vec<i64> = rows.iter().map(|r| r.entity_id).collect();
        let versions: Vec<i64> = rows.iter().map(|r| r.version).collect();
        sqlx::query(
            "UPDATE orderly.outbox SET status = 'PUBLISHED', published_at = 0 \
             WHERE (machine, entity_id, version) IN (SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[]))",
        )
        .bind(machines).bind(entities).bind(versions)
        .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows.len())
    }

    fn engine(&self) -> Engine<OrderMachine, PgStore> {
        Engine::new(
            PgStore::new(self.pool.clone(), orderly::Tables::new("orders").unwrap())
                .keep_connection(self.keep),
        )
        .expect("valid machine")
    }

    async fn floor(&self, id: i64) -> Result<(), BoxError> {
        let n = sqlx::query(
            "WITH u AS (UPDATE orders SET status = $2, version = version + 1 \
               WHERE id = $1 AND status = $3 AND version = $4 RETURNING version) \
             INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) \
             SELECT $1, version, $3, $2, $5, $6 FROM u",
        )
        .bind(id)
        .bind("Paid")
        .bind("Created")
        .bind(0_i64)
        .bind("Pay")
        .bind(bench_ref(id))
        .execute(&self.pool)
        .await?
        .rows_affected();
        ensure(n == 1, "floor", id)
    }

    async fn pgbench_floor(&self, c: usize, transitions: i64) -> Result<Option<f64>, BoxError> {
        // bench/pgbench-floor.sh, on this database: its orders, its count of what applied
        // (it fails unless every transition did) and its clean-up are its own.
        let options = self.pool.connect_options();
        let out = std::process::Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/bench/pgbench-floor.sh"
            ))
            .args([c.to_string(), transitions.to_string()])
            .env("PGHOST", options.get_host())
            .env("PGPORT", options.get_port().to_string())
            .env("PGUSER", options.get_username())
            .env("PGDATABASE", options.get_database().unwrap_or("postgres"))
            .output()
            .map_err(|e| format!("bench/pgbench-floor.sh could not run: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "bench/pgbench-floor.sh failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let tps: f64 = stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix("tps=")?.parse().ok())
            .ok_or_else(|| format!("bench/pgbench-floor.sh printed no rate: {stdout}"))?;
        Ok(Some(tps))
    }

    async fn floor_batch(&self, ids: &[i64]) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        for &id in ids {
            let n = sqlx::query(
                "WITH u AS (UPDATE orders SET status = $2, version = version + 1 \
                   WHERE id = $1 AND status = $3 AND version = $4 RETURNING version) \
                 INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) \
                 SELECT $1, version, $3, $2, $5, $6 FROM u",
            )
            .bind(id).bind("Paid").bind("Created").bind(0_i64).bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?.rows_affected();
            ensure(n == 1, "floor-batch", id)?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn outbox_hand(&self, id: i64) -> Result<(), BoxError> {
        let n = sqlx::query(
            "WITH u AS (UPDATE orders SET status = $2, version = version + 1 \
               WHERE id = $1 AND status = $3 AND version = $4 RETURNING version), \
             h AS (INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) \
               SELECT $1, version, $3, $2, $5, $6 FROM u) \
             INSERT INTO orderly.outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
             SELECT 'EmitMachine', $1, version, 'OrderPaid', $5, $3, $2, $6 FROM u",
        )
        .bind(id).bind("Paid").bind("Created").bind(0_i64).bind("Pay").bind(bench_ref(id))
        .execute(&self.pool).await?.rows_affected();
        ensure(n == 1, "out-hand", id)
    }

    fn due<'c>(
        conn: &'c mut PgConnection,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT due FROM bench_due WHERE id = $1")
                .bind(id)
                .fetch_one(conn)
                .await
        })
    }

    fn ledger<'c>(
        conn: &'c mut PgConnection,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query("INSERT INTO bench_ledger (order_id, amount) VALUES ($1, $2)")
                .bind(id)
                .bind(DUE)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    async fn guarded_hand(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Created", "guard-hand", id)?;
        let due: i64 = sqlx::query_scalar("SELECT due FROM bench_due WHERE id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        ensure(due == DUE, "guard-hand", id)?;
        sqlx::query("UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4")
            .bind("Paid").bind(id).bind(&status).bind(version)
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO bench_ledger (order_id, amount) VALUES ($1, $2)")
            .bind(id)
            .bind(DUE)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn naive(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Created", "naive", id)?;
        sqlx::query("UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4")
            .bind("Paid").bind(id).bind(&status).bind(version)
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn read(&self, id: i64) -> Result<(), BoxError> {
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM orderly.transitions WHERE order_id = $1 AND event = $2 AND ref_id = $3",
        )
        .bind(id)
        .bind("Pay")
        .bind(bench_ref(id))
        .fetch_optional(&self.pool)
        .await?;
        ensure(seq.is_some(), "read", id)
    }

    async fn records_hand(&self, id: i64) -> Result<(), BoxError> {
        records_hand!(
            &self.pool,
            self.pool.begin(),
            id,
            &HandSql {
                claim: "INSERT INTO orderly.idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                        attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                    SELECT 'hand', $1, $2, 'PROCESSING', $3, 1, ms + 30000, ms + 86400000, NULL, FALSE, ms, ms \
                    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now \
                    ON CONFLICT DO NOTHING",
                update: "UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4",
                insert: "INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)",
                complete: "UPDATE orderly.idempotency_records SET status = 'SUCCEEDED', result = $1, \
                           updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
                       WHERE scope = 'hand' AND idem_key = $2 AND owner_token = $3 AND (status || '') = 'PROCESSING'",
            }
        )
    }

    async fn flow_hand(&self, id: i64) -> Result<(), BoxError> {
        flow_hand!(
            &self.pool,
            self.pool.begin(),
            id,
            &FlowSql {
                claim: "INSERT INTO orderly.flows (kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) SELECT 'hand', $1, 1, $2, $3, 'RUNNING', NULL, 0, $4, 1, ms + 30000, NULL, NULL, ms, ms FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now ON CONFLICT DO NOTHING",
                update: "UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4",
                insert: "INSERT INTO orderly.transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)",
                step: "INSERT INTO orderly.flow_steps (kind, flow_key, step_index, phase, name, status, attempt, downstream_key, owner_token, output, error, started_at, finished_at) SELECT 'hand', $1, $2, 'F', $3, 'SUCCEEDED', 1, NULL, $4, $5, NULL, ms, ms FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now",
                touch: "UPDATE orderly.flows SET step_at = $1, status = $2, output = COALESCE($3, output), attempt = 1, lease_until = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 30000, updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint WHERE kind = 'hand' AND flow_key = $4 AND owner_token = $5 AND park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')",
            }
        )
    }

    async fn reset(&self) -> Result<(), BoxError> {
        sqlx::raw_sql(
            "DELETE FROM orderly.transitions WHERE order_id > 0; \
             UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0; \
             DELETE FROM orderly.idempotency_records WHERE idem_key NOT LIKE 'pre-%'; \
             DELETE FROM orderly.flows WHERE flow_key NOT LIKE 'pre-%'; \
             DELETE FROM orderly.flow_steps; \
             DELETE FROM orderly.outbox;",
        )
        .execute(&self.pool)
        .await?;
        sqlx::raw_sql(
            "VACUUM ANALYZE orders, orderly.transitions, orderly.idempotency_records, orderly.flows, orderly.flow_steps, orderly.outbox",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn explain(&self) -> Result<String, BoxError> {
        // The plans of the statements the engine itself prepared, found by their text in
        // `pg_prepared_statements` on a pool of one connection: the statement for a new
        // request (executed by EXPLAIN ANALYZE, so in a transaction rolled back), the
        // read that answers a replay when the engine reads first, and the batched read
        // for 8 requests in its generic plan (the one a prepared statement keeps).
        self.reset().await?;
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(self.pool.connect_options().as_ref().clone())
            .await?;
        let store = PgStore::new(pool.clone(), orderly::Tables::new("orders").unwrap());
        let config = |read_first| EngineConfig::default().read_first(read_first);
        let writer =
            Engine::<OrderMachine, _>::with_config(store.clone(), config(ReadFirst::Never))?;
        let reader =
            Engine::<OrderMachine, _>::with_config(store.clone(), config(ReadFirst::Always))?;
        writer.transition(1, OrderEvent::Pay, &bench_ref(1)).await?;
        reader.transition(1, OrderEvent::Pay, &bench_ref(1)).await?;
        let mut conn = pool.acquire().await?;
        let keys: Vec<OwnedKey> = (1..=8)
            .map(|id| OwnedKey {
                order_id: id,
                event: "Pay",
                ref_id: bench_ref(id),
            })
            .collect();
        store.priors(&mut conn, &keys).await?;
        let prepared: Vec<(String, String)> =
            sqlx::query_as("SELECT name, statement FROM pg_prepared_statements")
                .fetch_all(&mut *conn)
                .await?;
        let named = |what: &str, test: &dyn Fn(&str) -> bool| {
            prepared
                .iter()
                .find(|(_, sql)| test(sql))
                .map(|(name, _)| name.clone())
                .ok_or_else(|| format!("the engine prepared no {what}"))
        };
        let write = named("apply-first statement", &|sql| {
            sql.starts_with("WITH upd") && sql.contains("$6::text, $7::text")
        })?;
        let read = named("read", &|sql| sql.starts_with("SELECT from_status"))?;
        let batch = named("batched read", &|sql| sql.contains("(VALUES"))?;
        async fn explain(conn: &mut PgConnection, sql: String) -> Result<String, BoxError> {
            let rows = sqlx::raw_sql(AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"
            )))
            .fetch_all(conn)
            .await?;
            let lines: Result<Vec<String>, _> = rows.iter().map(|r| r.try_get(0)).collect();
            Ok(lines?.join("\n"))
        }
        let ref2 = bench_ref(2);
        sqlx::raw_sql("BEGIN").execute(&mut *conn).await?;
        let applied = explain(
            &mut conn,
            format!(
                "EXECUTE {write}(2, 'Pay', '{ref2}', NULL, NULL, 'Created', 'Paid', 42, NULL, NULL)"
            ),
        )
        .await;
        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
        let replay = explain(
            &mut conn,
            format!("EXECUTE {read}(1, 'Pay', '{}')", bench_ref(1)),
        )
        .await?;
        sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
            .execute(&mut *conn)
            .await?;
        let args: Vec<String> = (1..=8)
            .map(|id| format!("{id}, 'Pay', '{}'", bench_ref(id)))
            .collect();
        let batched = explain(&mut conn, format!("EXECUTE {batch}({})", args.join(", "))).await?;
        drop(conn);
        pool.close().await;
        Ok(format!(
            "-- the statement, for a new request (applied, then rolled back):\n{}\n\
             -- the read that answers a replay when the engine reads first:\n{replay}\n\
             -- the same read for a batch of 8 concurrent requests (generic plan):\n{batched}",
            applied?
        ))
    }

    fn describe(&self) -> String {
        "PostgreSQL, default settings (synchronous_commit=on), one pool for every mode".into()
    }
}
