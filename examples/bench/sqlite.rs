//! The bench on SQLite: a temporary file, the floor and naive modes by hand.

use super::*;
use orderly::SqliteStore;
use orderly::backend::sqlite::{connect_options, migrate};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Connection, Row};

pub struct Db {
    pool: SqlitePool,
    /// The database file, for the direct binding's connection.
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Db {
    pub async fn setup(
        args: &Args,
        pool_size: u32,
        name: &str,
        history_rows: i64,
    ) -> Result<Self, BoxError> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join(format!("{name}.db"));
        let url = format!("sqlite://{}", path.display());
        let pool = SqlitePoolOptions::new()
            .max_connections(pool_size)
            .min_connections(pool_size)
            // No ping round trip on every acquire, for every mode alike (see docs/benchmarks.md).
            .test_before_acquire(false)
            .connect_with(connect_options(&url)?)
            .await?;
        migrate(&pool).await?;
        // The bench's own entity table, `orders`, as an application's migration makes it.
        let tables = orderly::Tables::new("orders")?;
        for sql in
            orderly::Schema::create_tables_sql(&orderly::SqliteStore::new(pool.clone(), tables))
        {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        for sql in order_inserts(args.orders) {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        for sql in history_inserts(history_rows) {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
        }
        sqlx::raw_sql("ANALYZE").execute(&pool).await?;
        Ok(Db {
            pool,
            path,
            _dir: dir,
        })
    }
}

/// The floor's statements for each of `ids` through rusqlite, a direct binding: one
/// connection of its own with the store's settings (WAL, `synchronous = NORMAL`, the
/// busy timeout), the statements prepared once, `per_commit` requests in each
/// `BEGIN IMMEDIATE … COMMIT`. Each request's latency is its transaction's.
fn direct_loop(
    path: &std::path::Path,
    ids: &[i64],
    per_commit: usize,
) -> Result<Vec<u32>, BoxError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")?;
    let mut update = conn.prepare(
        "UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4",
    )?;
    let mut insert = conn.prepare(
        "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut micros = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(per_commit.max(1)) {
        let t = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")?;
        for &id in chunk {
            let n = update.execute(rusqlite::params!["Paid", id, "Created", 0_i64])?;
            ensure(n == 1, "direct", id)?;
            insert.execute(rusqlite::params![
                id,
                1_i64,
                "Created",
                "Paid",
                "Pay",
                bench_ref(id)
            ])?;
        }
        conn.execute_batch("COMMIT")?;
        let took = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
        micros.extend(std::iter::repeat_n(took, chunk.len()));
    }
    Ok(micros)
}

/// The floor's two statements for `id`, in an open transaction.
async fn sqlite_floor_statements(conn: &mut SqliteConnection, id: i64) -> Result<(), BoxError> {
    let n = sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
        .bind("Paid").bind(id).bind("Created").bind(0_i64)
        .execute(&mut *conn).await?.rows_affected();
    ensure(n == 1, "floor", id)?;
    sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
        .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
        .execute(conn).await?;
    Ok(())
}

impl BenchDb for Db {
    type S = SqliteStore;

    async fn exec(&self, sql: String) -> Result<(), BoxError> {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn service_db(&self, name: &str, skus: usize) -> Result<String, BoxError> {
        let dir = self.path.parent().ok_or("the bench database's directory")?;
        let url = format!("sqlite://{}", dir.join(format!("{name}.db")).display());
        let mut db = SqliteConnection::connect_with(&connect_options(&url)?).await?;
        let values = (0..skus)
            .map(|i| format!("('sku-c-{i}', 1000000000)"))
            .collect::<Vec<_>>()
            .join(", ");
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL); \
             INSERT INTO stock (sku, available) VALUES {values} ON CONFLICT (sku) DO NOTHING"
        )))
        .execute(&mut db)
        .await?;
        db.close().await?;
        Ok(url)
    }

    async fn timers_hand(
        &self,
        batch: i64,
        engine: &Engine<TimerMachine, SqliteStore>,
    ) -> Result<usize, BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rows: Vec<(i64, i64, String)> = sqlx::query_as(
            "SELECT id, entity_id, ref_id FROM orderly_timers WHERE status = 'PENDING' \
             AND next_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             ORDER BY next_at LIMIT ?1",
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
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    }

    async fn count(&self, sql: String) -> Result<i64, BoxError> {
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn hot_hand(&self, id: i64, ref_id: &str) -> Result<(), BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = ?1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Open", "hot-hand", id)?;
        let n =
            sqlx::query("UPDATE orders SET version = version + 1 WHERE id = ?1 AND version = ?2")
                .bind(id)
                .bind(version)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        ensure(n == 1, "hot-hand", id)?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(id).bind(version + 1).bind("Open").bind("Open").bind("Touch").bind(ref_id)
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn relay_hand<K: Sink>(&self, batch: i64, sink: &K) -> Result<usize, BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, status, attempts, last_error, 0 AS age_ms FROM orderly_outbox WHERE status = 'PENDING' LIMIT ?1",
        )
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
        publish_all(sink, &rows).await?;
        for row in &rows {
            sqlx::query("UPDATE orderly_outbox SET status = 'PUBLISHED', published_at = 0 WHERE machine = ?1 AND entity_id = ?2 AND version = ?3")
                .bind(&row.machine).bind(row.entity_id).bind(row.version)
                .execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(rows.len())
    }

    fn engine(&self) -> Engine<OrderMachine, SqliteStore> {
        Engine::new(SqliteStore::new(
            self.pool.clone(),
            orderly::Tables::new("orders").unwrap(),
        ))
        .expect("valid machine")
    }

    async fn floor(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let n = sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
            .bind("Paid").bind(id).bind("Created").bind(0_i64)
            .execute(&mut *tx).await?.rows_affected();
        ensure(n == 1, "floor", id)?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn floor_batch(&self, ids: &[i64]) -> Result<(), BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for &id in ids {
            sqlite_floor_statements(&mut tx, id).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn driver_limit(&self, ids: &[i64]) -> Result<Option<Vec<u32>>, BoxError> {
        let mut conn = SqliteConnection::connect_with(self.pool.connect_options().as_ref()).await?;
        let mut micros = Vec::with_capacity(ids.len());
        for &id in ids {
            let t = Instant::now();
            sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await?;
            sqlite_floor_statements(&mut conn, id).await?;
            sqlx::query("COMMIT").execute(&mut conn).await?;
            micros.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        }
        conn.close().await?;
        Ok(Some(micros))
    }

    async fn direct(&self, ids: &[i64], per_commit: usize) -> Result<Option<Vec<u32>>, BoxError> {
        let (path, ids) = (self.path.clone(), ids.to_vec());
        let micros =
            tokio::task::spawn_blocking(move || direct_loop(&path, &ids, per_commit)).await??;
        Ok(Some(micros))
    }

    async fn outbox_hand(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let n = sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
            .bind("Paid").bind(id).bind("Created").bind(0_i64)
            .execute(&mut *tx).await?.rows_affected();
        ensure(n == 1, "out-hand", id)?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
            .bind("EmitMachine").bind(id).bind(1_i64).bind("OrderPaid").bind("Pay").bind("Created").bind("Paid").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    fn due<'c>(
        conn: &'c mut SqliteConnection,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query_scalar("SELECT due FROM bench_due WHERE id = ?1")
                .bind(id)
                .fetch_one(conn)
                .await
        })
    }

    fn ledger<'c>(
        conn: &'c mut SqliteConnection,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query("INSERT INTO bench_ledger (order_id, amount) VALUES (?1, ?2)")
                .bind(id)
                .bind(DUE)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    async fn guarded_hand(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = ?1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Created", "guard-hand", id)?;
        let due: i64 = sqlx::query_scalar("SELECT due FROM bench_due WHERE id = ?1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        ensure(due == DUE, "guard-hand", id)?;
        sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
            .bind("Paid").bind(id).bind(&status).bind(version)
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO bench_ledger (order_id, amount) VALUES (?1, ?2)")
            .bind(id)
            .bind(DUE)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn naive(&self, id: i64) -> Result<(), BoxError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let row = sqlx::query("SELECT status, version FROM orders WHERE id = ?1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
        ensure(status == "Created", "naive", id)?;
        sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
            .bind("Paid").bind(id).bind(&status).bind(version)
            .execute(&mut *tx).await?;
        sqlx::query("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn read(&self, id: i64) -> Result<(), BoxError> {
        let seq: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM orderly_transitions WHERE order_id = ?1 AND event = ?2 AND ref_id = ?3",
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
            self.pool.begin_with("BEGIN IMMEDIATE"),
            id,
            &HandSql {
                claim: "INSERT INTO orderly_idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                        attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                    SELECT 'hand', ?1, ?2, 'PROCESSING', ?3, 1, ms + 30000, ms + 86400000, NULL, 0, ms, ms \
                    FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms) WHERE true \
                    ON CONFLICT DO NOTHING",
                update: "UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4",
                insert: "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                complete: "UPDATE orderly_idempotency_records SET status = 'SUCCEEDED', result = ?1, \
                           updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) \
                       WHERE scope = 'hand' AND idem_key = ?2 AND owner_token = ?3 AND status = 'PROCESSING'",
            }
        )
    }

    async fn flow_hand(&self, id: i64) -> Result<(), BoxError> {
        flow_hand!(
            &self.pool,
            self.pool.begin_with("BEGIN IMMEDIATE"),
            id,
            &FlowSql {
                claim: "INSERT INTO orderly_flows (kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) SELECT 'hand', ?1, 1, ?2, ?3, 'RUNNING', NULL, 0, ?4, 1, ms + 30000, NULL, NULL, ms, ms FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms) WHERE true ON CONFLICT DO NOTHING",
                update: "UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4",
                insert: "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                step: "INSERT INTO orderly_flow_steps (kind, flow_key, step_index, phase, name, status, attempt, downstream_key, owner_token, output, error, started_at, finished_at) SELECT 'hand', ?1, ?2, 'F', ?3, 'SUCCEEDED', 1, NULL, ?4, ?5, NULL, ms, ms FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms)",
                touch: "UPDATE orderly_flows SET step_at = ?1, status = ?2, output = COALESCE(?3, output), attempt = 1, lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER) + 30000, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) WHERE kind = 'hand' AND flow_key = ?4 AND owner_token = ?5 AND park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')",
            }
        )
    }

    async fn reset(&self) -> Result<(), BoxError> {
        sqlx::raw_sql(
            "DELETE FROM orderly_transitions WHERE order_id > 0; \
             UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0; \
             DELETE FROM orderly_idempotency_records; \
             DELETE FROM orderly_flows; \
             DELETE FROM orderly_flow_steps; \
             DELETE FROM orderly_outbox; \
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn explain(&self) -> Result<String, BoxError> {
        Ok("(--explain is implemented for PostgreSQL)".into())
    }

    fn describe(&self) -> String {
        "SQLite file in WAL mode, synchronous=NORMAL, one pool for every mode".into()
    }
}
