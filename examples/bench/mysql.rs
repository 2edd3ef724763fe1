//! The bench on MySQL/MariaDB: its own database, the floor and naive modes by hand.

use super::*;
use orderly::MySqlStore;
use orderly::backend::mysql::migrate;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};
use std::str::FromStr;

pub struct Db {
    pool: MySqlPool,
}

impl Db {
    pub async fn setup(
        args: &Args,
        pool_size: u32,
        name: &str,
        history_rows: i64,
    ) -> Result<Self, BoxError> {
        let url = std::env::var("ORDERLY_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let admin = MySqlConnectOptions::from_str(&url)?;
        let mut conn = MySqlConnection::connect_with(&admin).await?;
        sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
            .execute(&mut conn)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let pool = MySqlPoolOptions::new()
            .max_connections(pool_size)
            .min_connections(pool_size)
            // No ping round trip on every acquire, for every mode alike (see docs/benchmarks.md).
            .test_before_acquire(false)
            .connect_with(admin.database(name))
            .await?;
        migrate(&pool).await?;
        // The bench's own entity table, `orders`, as an application's migration makes it.
        let tables = orderly::Tables::new("orders")?;
        for sql in
            orderly::Schema::create_tables_sql(&orderly::MySqlStore::new(pool.clone(), tables))
        {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        for sql in order_inserts(args.orders) {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        for sql in history_inserts(history_rows) {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        sqlx::raw_sql("ANALYZE TABLE orders, orderly_transitions")
            .execute(&pool)
            .await?;
        Ok(Db { pool })
    }
}

impl BenchDb for Db {
    type S = MySqlStore;

    fn analyze(&self, table: &str) -> String {
        format!("ANALYZE TABLE {table}")
    }

    async fn exec(&self, sql: String) -> Result<(), BoxError> {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn service_db(&self, name: &str, skus: usize) -> Result<String, BoxError> {
        let url = std::env::var("ORDERLY_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let admin = MySqlConnectOptions::from_str(&url)?;
        let mut conn = MySqlConnection::connect_with(&admin).await?;
        sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
            .execute(&mut conn)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
        let mut db = MySqlConnection::connect_with(&admin.database(name)).await?;
        let values = (0..skus)
            .map(|i| format!("('sku-c-{i}', 1000000000)"))
            .collect::<Vec<_>>()
            .join(", ");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE stock (sku VARCHAR(64) PRIMARY KEY, available BIGINT NOT NULL); \
             INSERT INTO stock (sku, available) VALUES {values}"
        )))
        .execute(&mut db)
        .await?;
        Ok(with_database(&url, name))
    }

    async fn timers_hand(
        &self,
        batch: i64,
        engine: &Engine<TimerMachine, MySqlStore>,
    ) -> Result<usize, BoxError> {
        // READ COMMITTED, as the job's claim: under REPEATABLE READ the four loops' SKIP
        // LOCKED scans take gap locks on the due index and wait on each other.
        let mut tx = self
            .pool
            .begin_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
            .await?;
        let rows: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT id, entity_id, ref_id FROM orderly_timers WHERE status = 'PENDING' \
             AND next_at <= CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) \
             ORDER BY next_at LIMIT ? FOR UPDATE SKIP LOCKED",
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
        if !rows.is_empty() {
            let ids: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE orderly_timers SET status = 'FIRED', outcome = 'applied', fired_at = 0 WHERE id IN ({})",
                ids.join(", ")
            )))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    async fn lateness_ms(&self, sql: String) -> Result<Vec<i64>, BoxError> {
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?)
    }

    fn now_ms_sql(&self) -> &'static str {
        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    }

    async fn count(&self, sql: String) -> Result<i64, BoxError> {
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn hot_hand(&self, id: i64, ref_id: &str) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Open", "hot-hand", id)?;
        let n = sqlx::query("UPDATE orders SET version = version + 1 WHERE id = ? AND version = ?")
            .bind(id)
            .bind(version)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        ensure(n == 1, "hot-hand", id)?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(id).bind(version + 1).bind("Open").bind("Open").bind("Touch").bind(ref_id)
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn relay_hand<K: Sink>(&self, batch: i64, sink: &K) -> Result<usize, BoxError> {
        let mut tx = self.pool.begin().await?;
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, status, attempts, last_error, CAST(0 AS SIGNED) AS age_ms FROM orderly_outbox WHERE status = 'PENDING' \
             LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        publish_all(sink, &rows).await?;
        if !rows.is_empty() {
            let keys =
                vec!["(machine = ? AND entity_id = ? AND version = ?)"; rows.len()].join(" OR ");
            let sql = format!(
                "UPDATE orderly_outbox SET status = 'PUBLISHED', published_at = 0 WHERE {keys}"
            );
            let mut update = sqlx::query(AssertSqlSafe(sql));
            for row in &rows {
                update = update
                    .bind(&row.machine)
                    .bind(row.entity_id)
                    .bind(row.version);
            }
            update.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    fn engine(&self) -> Engine<OrderMachine, MySqlStore> {
        Engine::new(MySqlStore::new(
            self.pool.clone(),
            orderly::Tables::new("orders").unwrap(),
        ))
        .expect("valid machine")
    }

    async fn floor(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
            .bind("Paid").bind(id).bind("Created").bind(0_i64)
            .execute(&mut *tx).await?.rows_affected();
        ensure(n == 1, "floor", id)?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn floor_batch(&self, ids: &[i64]) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        for &id in ids {
            let n = sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
                .bind("Paid").bind(id).bind("Created").bind(0_i64)
                .execute(&mut *tx).await?.rows_affected();
            ensure(n == 1, "floor-batch", id)?;
            sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn outbox_hand(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let n = sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
            .bind("Paid").bind(id).bind("Created").bind(0_i64)
            .execute(&mut *tx).await?.rows_affected();
        ensure(n == 1, "out-hand", id)?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
            .bind("EmitMachine").bind(id).bind(1_i64).bind("OrderPaid").bind("Pay").bind("Created").bind("Paid").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    fn due<'c>(
        conn: &'c mut MySqlConnection,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT due FROM bench_due WHERE id = ?")
                .bind(id)
                .fetch_one(conn)
                .await
        })
    }

    fn ledger<'c>(
        conn: &'c mut MySqlConnection,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query("INSERT INTO bench_ledger (order_id, amount) VALUES (?, ?)")
                .bind(id)
                .bind(DUE)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    async fn guarded_hand(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Created", "guard-hand", id)?;
        let due: i64 = sqlx::query_scalar("SELECT due FROM bench_due WHERE id = ?")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        ensure(due == DUE, "guard-hand", id)?;
        sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
            .bind("Paid").bind(id).bind(&status).bind(version)
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO bench_ledger (order_id, amount) VALUES (?, ?)")
            .bind(id)
            .bind(DUE)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn naive(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = ? FOR UPDATE")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Created", "naive", id)?;
        sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
            .bind("Paid").bind(id).bind(&status).bind(version)
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn read(&self, id: i64) -> Result<(), BoxError> {
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM orderly_transitions WHERE order_id = ? AND event = ? AND ref_id = ?",
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
                claim: "INSERT IGNORE INTO orderly_idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                        attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                    VALUES ('hand', ?, ?, 'PROCESSING', ?, 1, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000, \
                        CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 86400000, NULL, FALSE, \
                        CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
                update: "UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?",
                insert: "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)",
                complete: "UPDATE orderly_idempotency_records SET status = 'SUCCEEDED', result = ?, \
                           updated_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) \
                       WHERE scope = 'hand' AND idem_key = ? AND owner_token = ? AND status = 'PROCESSING'",
            }
        )
    }

    async fn flow_hand(&self, id: i64) -> Result<(), BoxError> {
        flow_hand!(
            &self.pool,
            self.pool.begin(),
            id,
            &FlowSql {
                claim: "INSERT IGNORE INTO orderly_flows (kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) VALUES ('hand', ?, 1, ?, ?, 'RUNNING', NULL, 0, ?, 1, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000, NULL, NULL, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
                update: "UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?",
                insert: "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)",
                step: "INSERT INTO orderly_flow_steps (kind, flow_key, step_index, phase, name, status, attempt, downstream_key, owner_token, output, error, started_at, finished_at) VALUES ('hand', ?, ?, 'F', ?, 'SUCCEEDED', 1, NULL, ?, ?, NULL, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
                touch: "UPDATE orderly_flows SET step_at = ?, status = ?, output = COALESCE(?, output), attempt = 1, lease_until = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000, updated_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) WHERE kind = 'hand' AND flow_key = ? AND owner_token = ? AND park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')",
            }
        )
    }

    async fn reset(&self) -> Result<(), BoxError> {
        sqlx::raw_sql("DELETE FROM orderly_transitions WHERE order_id > 0")
            .execute(&self.pool)
            .await?;
        for table in ["idempotency_records", "flows", "flow_steps", "outbox"] {
            sqlx::raw_sql(AssertSqlSafe(format!("DELETE FROM orderly_{table}")))
                .execute(&self.pool)
                .await?;
        }
        sqlx::raw_sql("UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn explain(&self) -> Result<String, BoxError> {
        Ok("(--explain is implemented for PostgreSQL)".into())
    }

    fn describe(&self) -> String {
        "MariaDB/MySQL, default settings (innodb_flush_log_at_trx_commit=1), one pool for every mode".into()
    }
}
