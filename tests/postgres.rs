//! The conformance suite on PostgreSQL: each test on its own database.
//!
//! Server: `ORDERLY_PG_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`), a
//! role allowed to create databases.

mod conformance;
mod server;

use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use conformance::{Adaptive, Always, Backend, OrderEvent, OrderMachine, Policy};
use orderly::backend::postgres::migrate;
use orderly::store::{ErrorClass, Store};
use orderly::{Engine, EngineConfig, Error, PgStore, ReadFirst, Tables};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Postgres, Transaction};

struct Pg<P: Policy = Adaptive> {
    admin: PgConnectOptions,
    options: PgConnectOptions,
    name: String,
    pool: PgPool,
    policy: PhantomData<P>,
}

impl<P: Policy> Pg<P> {
    async fn pool(&self, lock_timeout: Duration) -> PgPool {
        let timeout = format!("{}ms", lock_timeout.as_millis());
        PgPoolOptions::new()
            .max_connections(20)
            .connect_with(
                self.options
                    .clone()
                    .options([("lock_timeout", timeout.as_str())]),
            )
            .await
            .unwrap()
    }
}

impl<P: Policy> Backend for Pg<P> {
    type S = PgStore;
    type Tx = Transaction<'static, Postgres>;
    type TxOn<'c> = Transaction<'c, Postgres>;

    harness_sql_methods!(PgConnection);

    fn sql(sql: &str) -> String {
        conformance::in_schema(sql)
    }

    async fn fresh() -> Self {
        let url = server::url(
            "ORDERLY_PG_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        );
        let admin = PgConnectOptions::from_str(&url).unwrap();
        let name = server::unique_db_name();
        let mut conn = PgConnection::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required for this suite: {e}"));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options.clone())
            .await
            .unwrap();
        migrate(&pool).await.unwrap();
        conformance::create_app_orders(
            &PgStore::new(pool.clone(), conformance::app_tables()),
            &pool,
        )
        .await;
        Pg {
            admin,
            options,
            name,
            pool,
            policy: PhantomData,
        }
    }

    const POLICY: ReadFirst = P::READ_FIRST;

    async fn store(&self, lock_timeout: Duration) -> PgStore {
        PgStore::new(self.pool(lock_timeout).await, conformance::app_tables())
    }

    async fn custom_store(&self) -> PgStore {
        self.exec(
            "CREATE TABLE shop_orders (id BIGINT PRIMARY KEY, customer TEXT, status VARCHAR(32) NOT NULL, version INTEGER NOT NULL)",
        )
        .await;
        self.exec(
            "CREATE TABLE shop_order_log (order_id BIGINT NOT NULL, seq BIGINT NOT NULL, from_status TEXT NOT NULL, \
             to_status TEXT NOT NULL, event TEXT NOT NULL, ref_id TEXT NOT NULL, payload_hash TEXT, payload JSONB, write_id BIGINT, actor TEXT, reason TEXT, \
             created_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
             PRIMARY KEY (order_id, seq), UNIQUE (order_id, event, ref_id))",
        )
        .await;
        let tables = Tables::new("shop_orders")
            .and_then(|t| t.with_history("shop_order_log"))
            .unwrap();
        PgStore::new(self.pool(Duration::from_secs(10)).await, tables)
    }

    async fn small_store(&self, max: u32) -> PgStore {
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone())
            .await
            .unwrap();
        PgStore::new(pool, conformance::app_tables())
    }

    fn pool_counts(store: &PgStore) -> (u32, usize) {
        (store.pool().size(), store.pool().num_idle())
    }

    async fn open_transactions(&self) -> i64 {
        self.scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
        .await
    }

    async fn lock_waits(&self) -> i64 {
        self.scalar(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE NOT l.granted AND a.datname = current_database()",
        )
        .await
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    async fn begin_on(conn: &mut PgConnection) -> Self::TxOn<'_> {
        conn.begin().await.unwrap()
    }

    async fn commit_on(tx: Self::TxOn<'_>) {
        tx.commit().await.unwrap();
    }

    async fn cleanup(self) {
        self.pool.close().await;
        let mut conn = PgConnection::connect_with(&self.admin).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }

    fn child_handle(&self) -> String {
        self.name.clone()
    }

    async fn child_store(handle: &str) -> PgStore {
        let url = server::url(
            "ORDERLY_PG_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        );
        let options = PgConnectOptions::from_str(&url).unwrap().database(handle);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();
        PgStore::new(pool, conformance::app_tables())
    }
}

conformance!(Pg);
conformance!(@networked Pg);

impl<P: Policy> conformance::Networked for Pg<P> {
    const CUT: server::Cut = server::Cut::Reply(b"INSERT 0 1\0");
    const COMMIT_CUT: server::Cut = server::Cut::Reply(b"COMMIT\0");
    // The apply-first statement's text, sent once per connection (its `Parse`).
    const WRITE_CUT: server::Cut = server::Cut::ReplyTo(b"WITH upd AS");
    // The reference travels in the statement's parameters (its `Bind`).
    const WRITE_PATTERN: &'static [u8] = b"p-1";

    fn server(&self) -> std::net::SocketAddr {
        server::socket_addr(self.options.get_host(), self.options.get_port())
    }

    async fn store_at(&self, port: u16, max: u32) -> PgStore {
        let pool = PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone().host("127.0.0.1").port(port))
            .await
            .unwrap();
        PgStore::new(pool, conformance::app_tables())
    }

    async fn kill_sessions(&self) -> usize {
        let killed = self
            .scalar(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND backend_type = 'client backend') AS k",
            )
            .await;
        killed as usize
    }
}

/// The whole suite again with every transition reading first, the path the adaptive
/// policy takes during a storm of replays.
mod read_first {
    use super::conformance::Backend;
    crate::conformance!(super::Pg<super::Always>);
}

/// `conformance::connection_cut_under_a_unit_answers_each_request`, cut at the text of
/// the batch statement (sent once per connection, in its `Parse`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_a_coalesced_unit() {
    let b = <Pg>::fresh().await;
    conformance::connection_cut_under_a_unit_answers_each_request(&b, b"unnest($1::bigint[]").await;
    b.cleanup().await;
}

/// `conformance::a_unit_cut_with_no_connection_left_is_never_unsent`: a unit's
/// parameters travel in its `Bind`, sent with its `Execute`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coalesced_unit_cut_with_no_connection_left() {
    let b = <Pg>::fresh().await;
    conformance::a_unit_cut_with_no_connection_left_is_never_unsent(&b).await;
    b.cleanup().await;
}

/// The connection PostgreSQL keeps out of the pool between units (MySQL keeps none).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_connection_goes_back_and_dies_harmlessly() {
    let b = <Pg>::fresh().await;
    conformance::a_kept_connection_goes_back_and_dies_harmlessly(&b).await;
    b.cleanup().await;
}

/// `conformance::connection_cut_under_coalesced_claims_answers_each_claim`, cut at the
/// text of the batch of claims (sent once per connection, in its `Parse`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_coalesced_claims() {
    let b = <Pg>::fresh().await;
    conformance::connection_cut_under_coalesced_claims_answers_each_claim(
        &b,
        b"unnest($1::text[], $2::text[], $3::text[], $4::text[]",
    )
    .await;
    b.cleanup().await;
}

/// `conformance::connection_cut_under_coalesced_starts_runs_each_flow_once`, cut at the
/// text of the batch of starts (sent once per connection, in its `Parse`), and with the
/// answer to its execution dropped (its parameters in binary: the array of kinds, two
/// elements of it in a row, which no lone start binds).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_coalesced_starts() {
    let b = <Pg>::fresh().await;
    conformance::connection_cut_under_coalesced_starts_runs_each_flow_once(
        &b,
        b"unnest($1::text[], $2::text[], $3::int[]",
        b"\x00\x00\x00\x04shop\x00\x00\x00\x04shop",
    )
    .await;
    b.cleanup().await;
}

/// `conformance::connection_cut_under_coalesced_finishes_answers_each_finish`: cut at the
/// text of the batch of finishes (sent once per connection and size, in its `Parse`), and
/// at its execution (its parameters in binary: one finish's retention, 3,600,000 ms in
/// eight bytes, then the next finish's scope, which no lone finish binds), before the
/// server gets it and after it committed, its reply dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_cut_under_coalesced_finishes() {
    const ROWS: &[u8] = b"\x00\x00\x00\x08\x00\x00\x00\x00\x00\x36\xee\x80\x00\x00\x00\x08payments";
    let b = <Pg>::fresh().await;
    conformance::connection_cut_under_coalesced_finishes_answers_each_finish(
        &b,
        &[
            server::Cut::Request(b"AS f(scope, idem_key, owner_token"),
            server::Cut::Request(ROWS),
            server::Cut::ReplyTo(ROWS),
        ],
    )
    .await;
    b.cleanup().await;
}

/// `conformance::finish_in_a_batch_past_its_deadline_is_in_doubt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finish_in_a_batch_past_its_deadline_is_in_doubt() {
    let b = <Pg>::fresh().await;
    conformance::finish_in_a_batch_past_its_deadline_is_in_doubt(&b).await;
    b.cleanup().await;
}

async fn deadlocks(b: &Pg) -> i64 {
    b.scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .await
}

/// `conformance::deadlock_scenario`, with PostgreSQL's evidence. PostgreSQL aborts the
/// engine: it waited first, so its deadlock check runs first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlock_is_retried_and_rejudged() {
    let b = <Pg>::fresh().await;
    let before = deadlocks(&b).await;
    conformance::deadlock_scenario(&b, &[]).await;
    // The statistics collector reports the deadlock a moment later.
    assert!(
        server::eventually(Duration::from_secs(10), || async {
            deadlocks(&b).await > before
        })
        .await,
        "no deadlock was recorded: the test did not provoke what it claims"
    );
    b.cleanup().await;
}

/// A write on a read-only server (what a connection that lands on a standby after a
/// failover gets: 25006) is a lost connection: discarded, retryable, never a wrong answer.
#[tokio::test]
async fn a_read_only_server_is_a_lost_connection() {
    let b = <Pg>::fresh().await;
    let mut tx = b.pool.begin_with("BEGIN READ ONLY").await.unwrap();
    let err = sqlx::query("INSERT INTO orders (id, status, version) VALUES (98, 'Created', 0)")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("25006")
    );
    assert_eq!(PgStore::classify(&err), ErrorClass::ConnectionLost);
    assert!(Error::from(err).is_retryable());
    drop(tx);
    b.cleanup().await;
}

/// A pooled connection that turned read-only, as one still open to a primary demoted in
/// a failover is: the transition's write fails there with 25006, the engine discards the
/// connection and applies on a fresh one, within the call. The pool holds one connection,
/// so a second backend afterwards shows the read-only one was dropped, not reused.
#[tokio::test]
async fn a_connection_turned_read_only_is_replaced_within_the_call() {
    let b = <Pg>::fresh().await;
    let setup: Engine<OrderMachine, PgStore> = Engine::new(b.small_store(1).await).unwrap();
    setup.create(7).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(b.options.clone())
        .await
        .unwrap();
    let read_only: i32 = {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("SET SESSION default_transaction_read_only = on")
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .unwrap()
    };
    let engine: Engine<OrderMachine, PgStore> =
        Engine::new(PgStore::new(pool.clone(), conformance::app_tables())).unwrap();
    let answer = engine.transition(7, OrderEvent::Pay, "p-1").await;
    assert!(
        matches!(answer, Ok(orderly::Outcome::Applied { .. })),
        "{answer:?}"
    );
    let (backend, setting): (i32, String) =
        sqlx::query_as("SELECT pg_backend_pid(), current_setting('default_transaction_read_only')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_ne!(backend, read_only, "the read-only connection was reused");
    assert_eq!(setting, "off");
    assert_eq!(engine.history(7).await.unwrap().len(), 1);
    pool.close().await;
    b.cleanup().await;
}

/// Under SERIALIZABLE, concurrent writers of one row get 40001; the engine classifies it
/// retryable and the storm still ends with one application.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serialization_failures_are_retried() {
    let b = <Pg>::fresh().await;
    // First show that the server really reports 40001 here, and that it is retryable.
    b.exec("INSERT INTO orders (id, status, version) VALUES (99, 'Created', 0)")
        .await;
    let mut t1 = b
        .pool
        .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .await
        .unwrap();
    let mut t2 = b
        .pool
        .begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .await
        .unwrap();
    sqlx::query("SELECT version FROM orders WHERE id = 99")
        .execute(&mut *t2)
        .await
        .unwrap();
    sqlx::query("UPDATE orders SET version = 1 WHERE id = 99")
        .execute(&mut *t1)
        .await
        .unwrap();
    t1.commit().await.unwrap();
    let err = sqlx::query("UPDATE orders SET version = 2 WHERE id = 99")
        .execute(&mut *t2)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().and_then(|d| d.code()).as_deref(),
        Some("40001")
    );
    assert_eq!(PgStore::classify(&err), ErrorClass::Retryable);
    drop(t2);

    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect_with(
            b.options
                .clone()
                .options([("default_transaction_isolation", "serializable")]),
        )
        .await
        .unwrap();
    let store =
        conformance::Hooked::new(PgStore::new(pool, conformance::app_tables()), None, false);
    let e: Engine<OrderMachine, _> = Engine::new(store.clone()).unwrap();
    e.create(1).await.unwrap();
    // A rival changes the row and commits while the storm waits on its lock, so every
    // waiter's snapshot is stale when the lock is released: 40001 for each of them.
    let mut rival = b.begin().await;
    Pg::<Adaptive>::exec_in(
        &mut rival,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let e = e.clone();
            tokio::spawn(async move { e.transition(1, OrderEvent::Pay, "p-1").await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Pg::<Adaptive>::commit(rival).await;
    let mut applied = 0;
    for t in tasks {
        if t.await.unwrap().unwrap().is_applied() {
            applied += 1;
        }
    }
    assert_eq!(applied, 1);
    assert_eq!(e.history(1).await.unwrap().len(), 1);
    // The storm really met serialization failures, and every one was retried.
    assert!(
        store.retryable_errors() > 0,
        "no 40001 in the storm: the test shows nothing"
    );
    b.cleanup().await;
}

/// The statement needs `ROW EXCLUSIVE` on the history table for its insert even when it
/// writes nothing, so it waits behind `SHARE` (what a non-concurrent `CREATE INDEX`
/// holds); the plain read does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adaptive_policy_reads_first_during_a_replay_storm() {
    let b = <Pg>::fresh().await;
    conformance::adaptive_reads_first_in_a_replay_storm(
        &b,
        "LOCK TABLE orderly.transitions IN SHARE MODE",
    )
    .await;
    b.cleanup().await;
}

/// While one caller's read is in flight, concurrent callers queue for the next batch. If
/// the caller whose read is in flight gives up (a timeout drops its future), the ones
/// queued behind it are not stranded: they go on by themselves and get their answers.
/// The in-flight read is held up by a lock that even a plain read waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_giving_up_mid_read_strands_no_one() {
    let b = <Pg>::fresh().await;
    let e: Engine<OrderMachine, PgStore> = Engine::with_config(
        b.store(Duration::from_secs(20)).await,
        EngineConfig::default().read_first(ReadFirst::Always),
    )
    .unwrap();
    e.create(1).await.unwrap();
    let first = e.transition(1, OrderEvent::Pay, "p-1").await.unwrap();
    assert!(first.is_applied());

    let mut held = b.begin().await;
    Pg::<Adaptive>::exec_in(
        &mut held,
        "LOCK TABLE orderly.transitions IN ACCESS EXCLUSIVE MODE",
    )
    .await;
    let leader = tokio::spawn({
        let e = e.clone();
        async move {
            tokio::time::timeout(
                Duration::from_millis(600),
                e.transition(1, OrderEvent::Pay, "p-1"),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let followers: Vec<_> = (0..8)
        .map(|_| {
            let e = e.clone();
            tokio::spawn(async move { e.transition(1, OrderEvent::Pay, "p-1").await })
        })
        .collect();
    let gave_up = leader.await.unwrap();
    assert!(
        gave_up.is_err(),
        "the first read did not wait for the lock, so the test shows nothing: {gave_up:?}"
    );
    Pg::<Adaptive>::rollback(held).await;
    for follower in followers {
        let out = tokio::time::timeout(Duration::from_secs(15), follower)
            .await
            .expect("a caller queued behind the one that gave up was stranded")
            .unwrap()
            .unwrap();
        assert!(
            !out.is_applied() && (out.state(), out.version()) == (first.state(), 1),
            "{out:?}"
        );
    }
    // And the engine reads on as before.
    let again = e.transition(1, OrderEvent::Pay, "p-1").await.unwrap();
    assert!(!again.is_applied());
    assert_eq!(
        b.scalar("SELECT count(*) FROM orderly.transitions").await,
        1
    );
    b.cleanup().await;
}

/// `conformance::caller_transaction_cut_at_each_statement`: inside a caller's
/// transaction a request's unit is one statement, whose execution carries the request's
/// reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caller_transaction_cut_at_each_statement() {
    use server::Cut;
    let b = <Pg>::fresh().await;
    conformance::caller_transaction_cut_at_each_statement(
        &b,
        &[
            ("before the statement", Cut::Request(b"b-2"), "b-2"),
            ("after the statement", Cut::Forward(b"b-2"), "b-2"),
            ("before the statement", Cut::Request(b"b-1"), "b-1"),
            ("after the statement", Cut::Forward(b"b-1"), "b-1"),
        ],
    )
    .await;
    b.cleanup().await;
}

/// A database that refuses new connections (`ALLOW_CONNECTIONS false`: SQLSTATE 55000
/// at connect) cannot serve now: every layer answers a retryable
/// [`orderly::Error::Unavailable`], never a fatal database error, and serves again once
/// the database takes connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_unavailable() {
    use orderly::{Error, Records, ScopeConfig};
    let b = <Pg>::fresh().await;
    let store = b.store(Duration::from_secs(10)).await;
    let engine = Engine::<OrderMachine, _>::with_config(
        store.clone(),
        EngineConfig::default().deadline(Duration::from_secs(2)),
    )
    .unwrap();
    engine.create(1).await.unwrap();
    let records = Records::new(store.clone())
        .deadline(Duration::from_secs(2))
        .unwrap()
        .scope(
            "s",
            ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    let refuse = |allow: bool| {
        let name = b.name.clone();
        let admin = b.admin.clone();
        async move {
            let mut conn = PgConnection::connect_with(&admin).await.unwrap();
            sqlx::raw_sql(AssertSqlSafe(format!(
                "ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
        }
    };
    // The harness's own pool holds a session from before the refusal, to cut the rest.
    assert_eq!(b.scalar("SELECT 1::bigint").await, 1);
    refuse(false).await;
    assert!(
        conformance::faults::Networked::kill_sessions(&b).await > 0,
        "no session of the store's was cut"
    );
    // The refusal is what the server says at connect.
    let direct = PgConnection::connect_with(&b.options).await.map(|_| ());
    let code = match &direct {
        Err(sqlx::Error::Database(db)) => db.code().map(|c| c.to_string()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("55000"), "{direct:?}");

    let unavailable = |what: &str, e: Error| {
        assert!(
            matches!(e, Error::Unavailable { .. }) && e.is_retryable(),
            "{what}: {e:?}"
        );
    };
    let transition = engine.transition(1, OrderEvent::Pay, "p-1").await;
    unavailable("a transition", transition.unwrap_err());
    let claim = records.claim("s", "k-1", &"body").await;
    unavailable("a claim", claim.unwrap_err());
    let read = engine.get(1).await;
    unavailable("a read", read.unwrap_err());

    refuse(true).await;
    assert!(engine.transition(1, OrderEvent::Pay, "p-1").await.is_ok());
    assert!(records.claim("s", "k-1", &"body").await.is_ok());
    b.cleanup().await;
}

/// A guarded call dropped inside the caller's transaction, at each poll and under random
/// deadlines; and a call over an edge with no rules, at each poll.
#[tokio::test]
async fn a_dropped_guarded_call_keeps_the_callers_writes() {
    let b = <Pg>::fresh().await;
    conformance::a_dropped_guarded_call_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn a_dropped_plain_call_keeps_the_callers_writes() {
    let b = <Pg>::fresh().await;
    conformance::a_dropped_plain_call_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn a_dropped_call_that_arms_a_timer_keeps_the_callers_writes() {
    let b = <Pg>::fresh().await;
    conformance::a_dropped_call_that_arms_a_timer_keeps_the_callers_writes(&b).await;
    b.cleanup().await;
}

#[tokio::test]
async fn random_deadlines_keep_the_callers_writes() {
    let b = <Pg>::fresh().await;
    conformance::random_deadlines_keep_the_callers_writes(&b).await;
    b.cleanup().await;
}
