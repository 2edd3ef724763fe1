//! The conformance suite on SQLite: each test on its own database file.

mod conformance;
mod server;

use std::marker::PhantomData;
use std::time::Duration;

use conformance::{Adaptive, Always, Backend, Policy};
use orderly::backend::sqlite::{connect_options, migrate};
use orderly::{ReadFirst, SqliteStore, Tables};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqlitePoolOptions};
use sqlx::{Connection, Sqlite, Transaction};

struct Sqlite3<P: Policy = Adaptive> {
    _dir: tempfile::TempDir,
    url: String,
    pool: SqlitePool,
    policy: PhantomData<P>,
}

impl<P: Policy> Sqlite3<P> {
    async fn pool(&self, busy: Duration) -> SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(16)
            .connect_with(connect_options(&self.url).unwrap().busy_timeout(busy))
            .await
            .unwrap()
    }
}

impl<P: Policy> Backend for Sqlite3<P> {
    type S = SqliteStore;
    type Tx = Transaction<'static, Sqlite>;
    type TxOn<'c> = Transaction<'c, Sqlite>;

    harness_sql_methods!(SqliteConnection);

    /// A schema change runs after a read of the schema on the same connection: a pooled
    /// SQLite connection parses `ALTER TABLE` against the schema it cached, and one that
    /// cached it before another connection dropped a column answers "duplicate column
    /// name" to the statement that adds it back. Reading first makes it load the schema
    /// as it is.
    fn sql(sql: &str) -> String {
        if sql.trim_start().starts_with("ALTER TABLE") {
            format!("SELECT 1 FROM sqlite_schema LIMIT 1; {sql}")
        } else {
            sql.to_owned()
        }
    }

    async fn fresh() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("orderly.db").display());
        let pool = SqlitePoolOptions::new()
            .max_connections(16)
            .connect_with(connect_options(&url).unwrap())
            .await
            .unwrap();
        migrate(&pool).await.unwrap();
        conformance::create_app_orders(
            &SqliteStore::new(pool.clone(), conformance::app_tables()),
            &pool,
        )
        .await;
        Sqlite3 {
            _dir: dir,
            url,
            pool,
            policy: PhantomData,
        }
    }

    const POLICY: ReadFirst = P::READ_FIRST;

    async fn store(&self, lock_timeout: Duration) -> SqliteStore {
        SqliteStore::new(self.pool(lock_timeout).await, conformance::app_tables())
    }

    async fn custom_store(&self) -> SqliteStore {
        self.exec(
            "CREATE TABLE shop_orders (id INTEGER PRIMARY KEY, customer TEXT, status TEXT NOT NULL, version INTEGER NOT NULL)",
        )
        .await;
        self.exec(
            "CREATE TABLE shop_order_log (order_id INTEGER NOT NULL, seq INTEGER NOT NULL, from_status TEXT NOT NULL, \
             to_status TEXT NOT NULL, event TEXT NOT NULL, ref_id TEXT NOT NULL, payload_hash TEXT, payload TEXT, write_id INTEGER, actor TEXT, reason TEXT, \
             created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), \
             PRIMARY KEY (order_id, seq), UNIQUE (order_id, event, ref_id))",
        )
        .await;
        let tables = Tables::new("shop_orders")
            .and_then(|t| t.with_history("shop_order_log"))
            .unwrap();
        SqliteStore::new(self.pool(Duration::from_secs(10)).await, tables)
    }

    async fn small_store(&self, max: u32) -> SqliteStore {
        let pool = SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(connect_options(&self.url).unwrap())
            .await
            .unwrap();
        SqliteStore::new(pool, conformance::app_tables())
    }

    fn pool_counts(store: &SqliteStore) -> (u32, usize) {
        (store.pool().size(), store.pool().num_idle())
    }

    /// A transaction left open on a connection holds SQLite's write lock (orderly's
    /// writes begin `IMMEDIATE`): another connection cannot begin one.
    async fn open_transactions(&self) -> i64 {
        let options = connect_options(&self.url)
            .unwrap()
            .busy_timeout(Duration::from_millis(0));
        let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
        let held = match sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn).await {
            Ok(_) => {
                sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
                0
            }
            Err(_) => 1,
        };
        conn.close().await.unwrap();
        held
    }

    async fn lock_waits(&self) -> i64 {
        0
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin_with("BEGIN IMMEDIATE").await.unwrap()
    }

    async fn begin_on(conn: &mut SqliteConnection) -> Self::TxOn<'_> {
        conn.begin_with("BEGIN IMMEDIATE").await.unwrap()
    }

    async fn commit_on(tx: Self::TxOn<'_>) {
        tx.commit().await.unwrap();
    }

    async fn cleanup(self) {
        self.pool.close().await;
    }

    fn child_handle(&self) -> String {
        self.url.clone()
    }

    async fn child_store(handle: &str) -> SqliteStore {
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(connect_options(handle).unwrap())
            .await
            .unwrap();
        SqliteStore::new(pool, conformance::app_tables())
    }
}

conformance!(Sqlite3);

/// The whole suite again with every transition reading first, the path the adaptive
/// policy takes while replays are common.
mod read_first {
    use super::conformance::Backend;
    crate::conformance!(super::Sqlite3<super::Always>);
}

/// A guarded call dropped inside the caller's transaction, at each poll and under random
/// deadlines; and a call over an edge with no rules, at each poll.
#[tokio::test]
async fn a_dropped_guarded_call_keeps_the_callers_writes() {
    let b = <Sqlite3>::fresh().await;
    conformance::a_dropped_guarded_call_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn a_dropped_plain_call_keeps_the_callers_writes() {
    let b = <Sqlite3>::fresh().await;
    conformance::a_dropped_plain_call_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn a_dropped_call_that_arms_a_timer_keeps_the_callers_writes() {
    let b = <Sqlite3>::fresh().await;
    conformance::a_dropped_call_that_arms_a_timer_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn random_deadlines_keep_the_callers_writes() {
    let b = <Sqlite3>::fresh().await;
    conformance::random_deadlines_keep_the_callers_writes(&b).await;
    b.cleanup().await;
}

/// Busy and locked codes, as SQLite reports them, are retryable; others are not.
#[tokio::test]
async fn sqlite_busy_codes_are_retryable() {
    use orderly::store::{ErrorClass, Store};
    let b = <Sqlite3>::fresh().await;
    let mut holder = b.begin().await;
    <Sqlite3>::exec_in(&mut holder, "UPDATE orders SET version = 0 WHERE id = 0").await;
    let mut other = SqliteConnection::connect_with(
        &connect_options(&b.url)
            .unwrap()
            .busy_timeout(Duration::ZERO),
    )
    .await
    .unwrap();
    let busy = other
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        SqliteStore::classify(&busy),
        ErrorClass::Retryable,
        "{busy:?}"
    );
    let syntax = sqlx::raw_sql("SELEC 1")
        .execute(&mut other)
        .await
        .unwrap_err();
    assert_eq!(SqliteStore::classify(&syntax), ErrorClass::Fatal);
    <Sqlite3>::rollback(holder).await;
}

/// A real SQLITE_BUSY: another connection holds the write lock longer than the engine's
/// busy timeout; the engine backs off, retries, and applies once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn busy_database_is_retried_then_applied() {
    use conformance::{OrderEvent, OrderMachine, OrderState};
    use orderly::{Engine, EngineConfig, Outcome};
    let b = <Sqlite3>::fresh().await;
    let config = EngineConfig::default()
        .max_attempts(50)
        .max_backoff(Duration::from_millis(20));
    let e: Engine<OrderMachine, SqliteStore> =
        Engine::with_config(b.store(Duration::from_millis(10)).await, config).unwrap();
    e.create(1).await.unwrap();
    let mut holder = b.begin().await;
    <Sqlite3>::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let started = std::time::Instant::now();
    let ours = {
        let e = e.clone();
        tokio::spawn(async move { e.transition(1, OrderEvent::Pay, "p-1").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !ours.is_finished(),
        "the engine must still be retrying while the lock is held"
    );
    <Sqlite3>::rollback(holder).await;
    let outcome = ours.await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        outcome,
        Outcome::Applied {
            from: OrderState::Created,
            to: OrderState::Paid,
            version: 1
        }
    );
    assert_eq!(e.history(1).await.unwrap().len(), 1);
}

/// The harness's transaction holds the write lock (`BEGIN IMMEDIATE`), which the attempt's
/// `BEGIN IMMEDIATE` waits for; a read in WAL mode does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_policy_reads_first_during_a_replay_storm() {
    let b = <Sqlite3>::fresh().await;
    conformance::adaptive_reads_first_in_a_replay_storm(&b, "SELECT 1").await;
    b.cleanup().await;
}

/// A transition's future is `Send` whatever the payload's type: the payload is
/// fingerprinted when it is given, and the future holds only its text. A payload in a
/// `Cell` (`&Cell` is not `Send`) is awaited on a spawned task, as an HTTP handler would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transition_futures_are_send_for_any_payload() {
    use conformance::{OrderEvent, OrderMachine, OrderState};
    use orderly::{Engine, Outcome};
    let b = <Sqlite3>::fresh().await;
    let e: Engine<OrderMachine, SqliteStore> =
        Engine::new(b.store(Duration::from_secs(5)).await).unwrap();
    e.create(1).await.unwrap();
    let task = tokio::spawn({
        let e = e.clone();
        async move {
            let amount = std::cell::Cell::new(4200_u32);
            e.transition(1, OrderEvent::Pay, "p-1")
                .payload(&amount)
                .await
        }
    });
    assert_eq!(
        task.await.unwrap().unwrap(),
        Outcome::Applied {
            from: OrderState::Created,
            to: OrderState::Paid,
            version: 1
        }
    );
    assert_eq!(
        e.history(1).await.unwrap()[0].payload,
        Some(serde_json::json!(4200))
    );
}

/// The idempotency records' writers on one store take turns at SQLite's write lock in
/// the process, in order, instead of retrying it in the busy handler: with a busy timeout
/// of zero, 16 concurrent `Records::run` calls, whose work holds the transaction a few
/// milliseconds, all complete, each run once. The premise: the same calls on two stores
/// over the same file (each with its own turns) meet the lock as before, and some of
/// them are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_writers_take_turns_at_the_write_lock() {
    use orderly::{Done, Records, ScopeConfig};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let b = <Sqlite3>::fresh().await;
    let config = ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600));
    let records = |store| Records::new(store).scope("s", config).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    // 16 calls on `stores` (round robin): how many failed.
    let storm = |stores: Vec<Records<SqliteStore>>, tag: &'static str| {
        let ran = ran.clone();
        async move {
            let calls: Vec<_> = (0..16)
                .map(|i| {
                    let (r, ran) = (stores[i % stores.len()].clone(), ran.clone());
                    tokio::spawn(async move {
                        r.run("s", &format!("{tag}-{i}"), &i, move |_tx| {
                            Box::pin(async move {
                                ran.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(3)).await;
                                Ok::<_, orderly::Error>(Done::<usize, ()>::Succeeded(i))
                            })
                        })
                        .await
                    })
                })
                .collect();
            let mut failed = 0;
            for (i, call) in calls.into_iter().enumerate() {
                match call.await.unwrap() {
                    Ok(ran) => assert_eq!((ran.outcome, ran.replayed), (Ok(i), false)),
                    Err(_) => failed += 1,
                }
            }
            failed
        }
    };
    let one = records(b.store(Duration::ZERO).await);
    assert_eq!(storm(vec![one], "one").await, 0);
    assert_eq!(ran.load(Ordering::Relaxed), 16, "each request ran once");
    let two = vec![
        records(b.store(Duration::ZERO).await),
        records(b.store(Duration::ZERO).await),
    ];
    let failed = storm(two, "two").await;
    assert!(
        failed > 0,
        "two stores never met the write lock: the test shows nothing"
    );
}

/// On a database file the engine's own write units go through the store's own
/// connection (one hand-off per unit), which keeps the pool's busy timeout: a unit that
/// meets another connection's write lock past it answers a retryable error and writes
/// nothing, and goes through once the lock is free. A database in memory takes no second
/// connection, and a pool on another VFS gets none: their units go through the pool,
/// with the same answers.
#[tokio::test]
async fn units_on_a_file_go_through_the_stores_own_connection() {
    use conformance::{OrderEvent, OrderMachine, OrderState};
    use orderly::{Engine, Outcome};
    let paid = Outcome::Applied {
        from: OrderState::Created,
        to: OrderState::Paid,
        version: 1,
    };
    let b = <Sqlite3>::fresh().await;
    let store = SqliteStore::new(
        b.pool(Duration::from_millis(50)).await,
        conformance::app_tables(),
    );
    assert_eq!(store.writes_on_own_connection(), None);
    let e: Engine<OrderMachine, SqliteStore> = Engine::new(store.clone()).unwrap();
    e.create(1).await.unwrap();
    e.create(2).await.unwrap();
    assert_eq!(e.transition(1, OrderEvent::Pay, "p-1").await.unwrap(), paid);
    assert_eq!(store.writes_on_own_connection(), Some(true));

    let mut holder = b.begin().await;
    <Sqlite3>::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 0",
    )
    .await;
    let busy = e.transition(2, OrderEvent::Pay, "p-2").await.unwrap_err();
    assert!(busy.is_retryable(), "{busy:?}");
    <Sqlite3>::rollback(holder).await;
    assert_eq!(b.scalar("SELECT version FROM orders WHERE id = 2").await, 0);
    assert_eq!(e.transition(2, OrderEvent::Pay, "p-2").await.unwrap(), paid);
    assert_eq!(e.history(2).await.unwrap().len(), 1);

    // In memory, and on a file through another VFS (whose locks a plain connection
    // would not see): through the pool.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("vfs.db").display());
    let other_vfs = connect_options(&url).unwrap().vfs("unix-none");
    for (options, order) in [
        (connect_options("sqlite::memory:").unwrap(), 1),
        (other_vfs, 3),
    ] {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        migrate(&pool).await.unwrap();
        conformance::create_app_orders(
            &SqliteStore::new(pool.clone(), conformance::app_tables()),
            &pool,
        )
        .await;
        let store = SqliteStore::new(pool, conformance::app_tables());
        let e: Engine<OrderMachine, SqliteStore> = Engine::new(store.clone()).unwrap();
        e.create(order).await.unwrap();
        assert_eq!(
            e.transition(order, OrderEvent::Pay, "p-1").await.unwrap(),
            paid
        );
        assert_eq!(store.writes_on_own_connection(), Some(false));
        assert_eq!(
            e.transition(order, OrderEvent::Pay, "p-1").await.unwrap(),
            Outcome::Replayed {
                from: OrderState::Created,
                to: OrderState::Paid,
                version: 1
            }
        );
    }
}

/// The trace contexts of a unit's requests go into their outbox rows on the two ways a
/// unit goes through the pool (a database in memory has no writer thread): in one call
/// (up to four requests) and statement by statement (more).
#[tokio::test]
async fn a_units_trace_contexts_are_stored_through_the_pool() {
    use conformance::OrderMachine;
    use orderly::store::{FirstWrite, Key, Request};
    use orderly::{Engine, Store, TraceContext};
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(connect_options("sqlite::memory:").unwrap())
        .await
        .unwrap();
    migrate(&pool).await.unwrap();
    let store = SqliteStore::new(pool.clone(), conformance::app_tables());
    conformance::create_app_orders(&store, &pool).await;
    let e: Engine<OrderMachine, SqliteStore> = Engine::new(store.clone()).unwrap();
    let traces: Vec<TraceContext> = (1..=9)
        .map(|n| {
            TraceContext::new(&format!("{n:032x}"), &format!("{n:016x}"), true)
                .unwrap()
                .with_tracestate(&format!("v=t{n}"))
                .unwrap()
        })
        .collect();
    for id in 1..=9 {
        e.create(id).await.unwrap();
    }
    let request = |id: i64| Request {
        key: Key {
            order_id: id,
            event: "Pay",
            ref_id: "unit",
        },
        from_states: &["Created"],
        to_states: &["Paid"],
        payload_hash: None,
        payload: None,
        write_id: id,
        audit: Default::default(),
        emits: &[Some("OrderPaid")],
        machine: "OrderMachine",
        event_body: None,
        trace: Some(&traces[id as usize - 1]),
    };
    for unit in [1..=3, 4..=9] {
        let requests: Vec<Request<'_>> = unit.map(request).collect();
        let mut conn = store.acquire().await.unwrap();
        let written = store.apply_first(&mut conn, &requests).await.unwrap();
        assert!(
            written
                .iter()
                .all(|w| matches!(w, FirstWrite::Applied { .. })),
            "{written:?}"
        );
    }
    assert_eq!(store.writes_on_own_connection(), Some(false));
    let rows: Vec<(i64, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT entity_id, traceparent, tracestate FROM orderly_outbox ORDER BY entity_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want: Vec<(i64, Option<String>, Option<String>)> = (1..=9)
        .map(|n| {
            (
                n,
                Some(traces[n as usize - 1].traceparent().to_string()),
                Some(format!("v=t{n}")),
            )
        })
        .collect();
    assert_eq!(rows, want);
}
