//! The conformance suite on MySQL/MariaDB: each test on its own database.
//!
//! Server: `ORDERLY_MYSQL_URL` (default `mysql://root@127.0.0.1:3306/test`), a user
//! allowed to create databases.

mod conformance;
mod server;

use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use conformance::{Adaptive, Always, Backend, Policy};
use orderly::backend::mysql::migrate;
use orderly::{MySqlStore, ReadFirst, Tables};
use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, Transaction};

struct My<P: Policy = Adaptive> {
    admin: MySqlConnectOptions,
    options: MySqlConnectOptions,
    name: String,
    pool: MySqlPool,
    policy: PhantomData<P>,
}

impl<P: Policy> My<P> {
    /// `lock_timeout` rounds up to whole seconds: InnoDB's granularity.
    async fn pool(&self, lock_timeout: Duration) -> MySqlPool {
        let secs = lock_timeout.as_millis().div_ceil(1000).max(1);
        MySqlPoolOptions::new()
            .max_connections(20)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute(AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {secs}"
                    )))
                    .await?;
                    Ok(())
                })
            })
            .connect_with(self.options.clone())
            .await
            .unwrap()
    }
}

impl<P: Policy> Backend for My<P> {
    type S = MySqlStore;
    type Tx = Transaction<'static, MySql>;
    type TxOn<'c> = Transaction<'c, MySql>;

    harness_sql_methods!(MySqlConnection);

    async fn fresh() -> Self {
        let url = server::url("ORDERLY_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        let admin = MySqlConnectOptions::from_str(&url).unwrap();
        let name = server::unique_db_name();
        let mut conn = MySqlConnection::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("MySQL/MariaDB at {url} is required for this suite: {e}"));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let options = admin.clone().database(&name);
        let pool = MySqlPoolOptions::new()
            .max_connections(16)
            .connect_with(options.clone())
            .await
            .unwrap();
        migrate(&pool).await.unwrap();
        conformance::create_app_orders(
            &MySqlStore::new(pool.clone(), conformance::app_tables()),
            &pool,
        )
        .await;
        My {
            admin,
            options,
            name,
            pool,
            policy: PhantomData,
        }
    }

    const POLICY: ReadFirst = P::READ_FIRST;

    async fn store(&self, lock_timeout: Duration) -> MySqlStore {
        MySqlStore::new(self.pool(lock_timeout).await, conformance::app_tables())
    }

    async fn custom_store(&self) -> MySqlStore {
        self.exec(
            "CREATE TABLE shop_orders (id BIGINT PRIMARY KEY, customer VARCHAR(64), status VARCHAR(32) NOT NULL, version INT NOT NULL) \
             COLLATE utf8mb4_bin",
        )
        .await;
        self.exec(
            "CREATE TABLE shop_order_log (order_id BIGINT NOT NULL, seq BIGINT NOT NULL, from_status VARCHAR(64) NOT NULL, \
             to_status VARCHAR(64) NOT NULL, event VARCHAR(64) NOT NULL, ref_id VARCHAR(255) NOT NULL, payload_hash CHAR(64), \
             payload JSON, write_id BIGINT, actor VARCHAR(255), reason TEXT, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
             PRIMARY KEY (order_id, seq), UNIQUE KEY (order_id, event, ref_id)) COLLATE utf8mb4_bin",
        )
        .await;
        let tables = Tables::new("shop_orders")
            .and_then(|t| t.with_history("shop_order_log"))
            .unwrap();
        MySqlStore::new(self.pool(Duration::from_secs(10)).await, tables)
    }

    async fn small_store(&self, max: u32) -> MySqlStore {
        let pool = MySqlPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone())
            .await
            .unwrap();
        MySqlStore::new(pool, conformance::app_tables())
    }

    fn pool_counts(store: &MySqlStore) -> (u32, usize) {
        (store.pool().size(), store.pool().num_idle())
    }

    /// Sessions of this database that sleep while holding an InnoDB transaction.
    async fn open_transactions(&self) -> i64 {
        self.scalar(
            "SELECT COUNT(*) FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = DATABASE() AND p.command = 'Sleep'",
        )
        .await
    }

    /// Statements of this database's other sessions that have run for more than 50 ms
    /// (`time_ms`, a MariaDB column): in a test's quiet database, a statement waiting on
    /// a lock. (MariaDB's
    /// `innodb_trx` does not list a transaction whose insert waits on another's
    /// uncommitted duplicate key, nor does `innodb_lock_waits` show the wait.)
    async fn lock_waits(&self) -> i64 {
        self.scalar(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE db = DATABASE() AND id <> CONNECTION_ID() \
               AND command IN ('Query', 'Execute') AND time_ms > 50",
        )
        .await
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    async fn begin_on(conn: &mut MySqlConnection) -> Self::TxOn<'_> {
        conn.begin().await.unwrap()
    }

    async fn commit_on(tx: Self::TxOn<'_>) {
        tx.commit().await.unwrap();
    }

    async fn cleanup(self) {
        self.pool.close().await;
        let mut conn = MySqlConnection::connect_with(&self.admin).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {}",
            self.name
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }

    fn child_handle(&self) -> String {
        self.name.clone()
    }

    async fn child_store(handle: &str) -> MySqlStore {
        let url = server::url("ORDERLY_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        let options = MySqlConnectOptions::from_str(&url)
            .unwrap()
            .database(handle);
        let pool = MySqlPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();
        MySqlStore::new(pool, conformance::app_tables())
    }
}

conformance!(My);
conformance!(@networked My);

impl<P: Policy> conformance::Networked for My<P> {
    const CUT: server::Cut = server::Cut::ReplyTo(b"COMMIT");
    // The `COMMIT` query itself (`COM_QUERY`, 0x03), not `… READ COMMITTED`.
    const COMMIT_CUT: server::Cut = server::Cut::ReplyTo(b"\x03COMMIT");
    // The apply-first update's text (the transition layer's statements go as text,
    // `COM_QUERY`, their values written in: src/backend/mysql/text.rs).
    const WRITE_CUT: server::Cut = server::Cut::ReplyTo(b"LAST_INSERT_ID(");
    // The update's values: the state it moves from, `Created`, as the hexadecimal
    // literal the text statement carries.
    const WRITE_PATTERN: &'static [u8] = b"X'43726561746564'";

    fn server(&self) -> std::net::SocketAddr {
        server::socket_addr(self.options.get_host(), self.options.get_port())
    }

    async fn store_at(&self, port: u16, max: u32) -> MySqlStore {
        let pool = MySqlPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone().host("127.0.0.1").port(port))
            .await
            .unwrap();
        MySqlStore::new(pool, conformance::app_tables())
    }

    async fn kill_sessions(&self) -> usize {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(id AS SIGNED) FROM information_schema.processlist \
             WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command <> 'Killed'",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let mut killed = 0;
        for id in ids {
            // A session may end by itself meanwhile (1094: unknown thread).
            if sqlx::raw_sql(AssertSqlSafe(format!("KILL {id}")))
                .execute(&self.pool)
                .await
                .is_ok()
            {
                killed += 1;
            }
        }
        killed
    }
}

/// The whole suite again with every transition reading first, the path the adaptive
/// policy takes while replays are common.
mod read_first {
    use super::conformance::Backend;
    crate::conformance!(super::My<super::Always>);
}

async fn deadlocks(b: &My) -> i64 {
    let row: (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    row.1.parse().unwrap()
}

/// `conformance::connection_cut_under_coalesced_claims_answers_each_claim`, cut at the
/// first request carrying a key of the test: the execution of the claim that went alone,
/// or of a batch's multi-row `INSERT IGNORE` (the keys are in the parameters).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_coalesced_claims() {
    let b = <My>::fresh().await;
    conformance::connection_cut_under_coalesced_claims_answers_each_claim(&b, b"cut-").await;
    b.cleanup().await;
}

/// The same, cut at the text of a batch of claims (its rows after the first, sent once
/// per connection and size, in its prepare).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_at_a_batch_of_claims() {
    let b = <My>::fresh().await;
    conformance::connection_cut_under_coalesced_claims_answers_each_claim(
        &b,
        b"), (?, ?, ?, 'PROCESSING'",
    )
    .await;
    b.cleanup().await;
}

/// `conformance::connection_cut_under_coalesced_starts_runs_each_flow_once`, cut at the
/// text of a batch of starts (its rows after the first, sent once per connection and
/// size, in its prepare), and with the answer to its execution dropped (its parameters
/// in binary: one start's lease, 30,000 ms in eight bytes, then the next start's kind,
/// which a lone start binds only to take over a flow whose lease ran out, and none does
/// here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_coalesced_starts() {
    let b = <My>::fresh().await;
    conformance::connection_cut_under_coalesced_starts_runs_each_flow_once(
        &b,
        b"), (?, ?, ?, ?, ?, 'RUNNING'",
        b"\x30\x75\x00\x00\x00\x00\x00\x00\x04shop",
    )
    .await;
    b.cleanup().await;
}

/// `conformance::connection_cut_under_coalesced_finishes_answers_each_finish`: a batch of
/// finishes is one transaction, its finishes' updates and one `COMMIT` (a lone finish
/// commits by itself): cut as the `COMMIT` goes out, after the server got it, and with
/// its reply dropped once it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_coalesced_finishes() {
    let b = <My>::fresh().await;
    conformance::connection_cut_under_coalesced_finishes_answers_each_finish(
        &b,
        &[
            server::Cut::Request(b"\x03COMMIT"),
            server::Cut::Forward(b"\x03COMMIT"),
            server::Cut::ReplyTo(b"\x03COMMIT"),
        ],
    )
    .await;
    b.cleanup().await;
}

/// `conformance::finish_in_a_batch_past_its_deadline_is_in_doubt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finish_in_a_batch_past_its_deadline_is_in_doubt() {
    let b = <My>::fresh().await;
    conformance::finish_in_a_batch_past_its_deadline_is_in_doubt(&b).await;
    b.cleanup().await;
}

/// `conformance::connection_cut_under_a_unit_answers_each_request`, cut at the text of
/// a unit's multi-row history insert (sent once per connection, in its prepare).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_a_coalesced_unit() {
    let b = <My>::fresh().await;
    conformance::connection_cut_under_a_unit_answers_each_request(
        &b,
        b"write_id, actor, reason) SELECT x.c0",
    )
    .await;
    b.cleanup().await;
}

/// `conformance::deadlock_scenario`, with InnoDB's evidence. InnoDB rolls back the lighter
/// transaction; the ballast makes the rival heavier, so the engine is the victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlock_is_retried_and_rejudged() {
    // InnoDB keeps one deadlock report for the whole server, and other tests of this
    // suite (racing relays) deadlock too: when another's report came after this one's,
    // the scenario runs again on a fresh database, at most three times.
    for _ in 0..3 {
        let b = <My>::fresh().await;
        b.exec("CREATE TABLE ballast (n INT)").await;
        let before = deadlocks(&b).await;
        conformance::deadlock_scenario(
            &b,
            &["INSERT INTO ballast VALUES (1),(2),(3),(4),(5),(6),(7),(8),(9),(10)"],
        )
        .await;
        assert!(
            deadlocks(&b).await > before,
            "no deadlock was recorded: the test did not provoke what it claims"
        );
        let status: (String, String, String) = sqlx::query_as("SHOW ENGINE INNODB STATUS")
            .fetch_one(&b.pool)
            .await
            .unwrap();
        let latest = status
            .2
            .split("LATEST DETECTED DEADLOCK")
            .nth(1)
            .expect("a deadlock report")
            .to_string();
        let ours = latest.contains(&b.name);
        b.cleanup().await;
        if ours {
            return;
        }
    }
    panic!("in three runs the latest deadlock report never named this test's database");
}

/// The attempt's `UPDATE` of the order's row waits for a row lock; the plain read is a
/// consistent, non-locking read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_policy_reads_first_during_a_replay_storm() {
    let b = <My>::fresh().await;
    conformance::adaptive_reads_first_in_a_replay_storm(
        &b,
        "SELECT id FROM orders WHERE id = 1 FOR UPDATE",
    )
    .await;
    b.cleanup().await;
}

/// Inside a caller's transaction, whose REPEATABLE READ snapshot predates another
/// session's create-and-pay of the same order, `create` answers from the committed row
/// (`AlreadyExists` at `Paid`), not from the snapshot, where the order does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_within_an_old_snapshot_sees_the_committed_row() {
    use conformance::OrderEvent::Pay;
    use orderly::Error;
    let b = <My>::fresh().await;
    let e = conformance::engine(&b).await;
    let mut tx = b.begin().await;
    // The snapshot is taken at the transaction's first read.
    <My>::exec_in(&mut tx, "SELECT COUNT(*) FROM orders").await;
    e.create(3).await.unwrap();
    e.transition(3, Pay, "p-3").await.unwrap();
    let in_snapshot: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE id = 3")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        in_snapshot, 0,
        "the snapshot must predate the create: the test shows nothing"
    );
    let err = e.create(3).within(&mut tx).await.unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists { order_id: 3, ref state } if state == "Paid"),
        "{err:?}"
    );
    <My>::rollback(tx).await;
    b.cleanup().await;
}

/// `conformance::caller_transaction_cut_at_each_statement`: inside a caller's
/// transaction a request's unit is the update, the history insert (its text carries the
/// request's reference, `b-1` or `b-2`, as a hexadecimal literal) and, for a request
/// found recorded, the restore of the update; each sent as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caller_transaction_cut_at_each_statement() {
    use server::Cut;
    let b = <My>::fresh().await;
    let bump: &[u8] = b"LAST_INSERT_ID(version + 1)";
    // The restore's `SET status = ?, version = ?` as sent (each literal spaced): the
    // update's `version = LAST_INSERT_ID(…)` has one space where this has two.
    let restore: &[u8] = b"' , version =  ";
    // `b-2` and `b-1` as the history insert's hexadecimal literals.
    let (b2, b1): (&[u8], &[u8]) = (b"X'622D32'", b"X'622D31'");
    conformance::caller_transaction_cut_at_each_statement(
        &b,
        &[
            ("before the update", Cut::Request(bump), "b-2"),
            ("after the update was sent", Cut::Forward(bump), "b-2"),
            ("before the history insert", Cut::Request(b2), "b-2"),
            ("after the history insert", Cut::Forward(b2), "b-2"),
            ("before the update", Cut::Request(bump), "b-1"),
            ("before the refused history insert", Cut::Request(b1), "b-1"),
            ("after the refused history insert", Cut::Forward(b1), "b-1"),
            ("before the restore", Cut::Request(restore), "b-1"),
            ("after the restore was sent", Cut::Forward(restore), "b-1"),
        ],
    )
    .await;
    b.cleanup().await;
}

/// A guarded call dropped inside the caller's transaction, at each poll and under random
/// deadlines; and a call over an edge with no rules, at each poll.
#[tokio::test]
async fn a_dropped_guarded_call_keeps_the_callers_writes() {
    let b = <My>::fresh().await;
    conformance::a_dropped_guarded_call_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn a_dropped_plain_call_keeps_the_callers_writes() {
    let b = <My>::fresh().await;
    conformance::a_dropped_plain_call_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn a_dropped_call_that_arms_a_timer_keeps_the_callers_writes() {
    let b = <My>::fresh().await;
    conformance::a_dropped_call_that_arms_a_timer_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn random_deadlines_keep_the_callers_writes() {
    let b = <My>::fresh().await;
    conformance::random_deadlines_keep_the_callers_writes(&b).await;
    b.cleanup().await;
}

/// A timer batch bounds its lock waits for its session (the engine's deadline, 2 s), then
/// puts back the session's own `innodb_lock_wait_timeout` (7 s, the application's, set
/// on connect), not the server's default. One connection: the batch's is the one read.
#[tokio::test]
async fn a_timer_batch_puts_back_the_sessions_lock_wait() {
    use conformance::timers::{TEng, make_due};
    let b = <My>::fresh().await;
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute("SET SESSION innodb_lock_wait_timeout = 7")
                    .await?;
                Ok(())
            })
        })
        .connect_with(b.options.clone())
        .await
        .unwrap();
    let store = MySqlStore::new(pool.clone(), conformance::app_tables());
    let engine: TEng<My> = orderly::Engine::with_config(
        store.clone(),
        orderly::EngineConfig::default().deadline(Duration::from_secs(2)),
    )
    .unwrap();
    let timers = orderly::Timers::new(store).fire(engine.clone());
    for id in 1..=3 {
        engine.create(id).await.unwrap();
        make_due(&b, id).await;
    }
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.applied), (3, 3), "{round:?}");
    let lock_wait: i64 =
        sqlx::query_scalar("SELECT CAST(@@SESSION.innodb_lock_wait_timeout AS SIGNED)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(lock_wait, 7, "the session's lock wait after the batch");
    b.cleanup().await;
}
