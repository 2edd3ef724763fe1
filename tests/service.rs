//! End to end: the example service (`examples/service.rs`) as a real process on
//! loopback, driven over real HTTP by reqwest, on SQLite and on PostgreSQL (a database
//! of the test's own): one order for 64 concurrent identical requests, a callback
//! delivered three times at once, a second payment refused with the winner's id, the
//! service killed with SIGKILL mid-load and restarted, and a client that hangs up
//! mid-request.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Connection;

/// The example's binary, built with this suite's features (once per run).
fn binary() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> std::path::PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-q", "--example", "service", "--all-features"])
        .status()
        .expect("cargo runs");
    assert!(status.success(), "the service example does not build");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("debug").join("examples").join("service")
}

/// A running service: its process and address.
struct Service {
    child: Child,
    base: String,
}

impl Service {
    /// Starts the service on `db` with a short lease, and waits until it listens.
    fn start(db: &str) -> Service {
        let mut child = Command::new(binary())
            .args(["--listen", "127.0.0.1:0", "--db", db, "--lease-ms", "1500"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the service starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // Its relay may print events it publishes before the address.
        let addr = loop {
            let line = lines
                .next()
                .expect("the service printed its address")
                .unwrap();
            if let Some(addr) = line.strip_prefix("listening on ") {
                break addr.to_string();
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Service { child, base: addr }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGKILL, and wait for it to be gone.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM: a graceful stop; its exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY: sending a signal to a child process this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: Value,
) -> (StatusCode, bool, Value) {
    let mut request = client.post(url).json(&body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    let response = request.send().await.expect("the service answers");
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, replayed, body)
}

async fn get(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// One integer from the service's database, read directly.
async fn scalar(db: &str, sql: &'static str) -> i64 {
    if db.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(db).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    } else {
        let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    }
}

/// How many of the service's connections are inside a transaction: on PostgreSQL, its
/// database's sessions idle in a transaction; on SQLite, 1 if another connection holds
/// the write lock for more than 150 ms (a fresh `BEGIN IMMEDIATE` waits that long and
/// fails), else 0. The service's own jobs (the relay's claims, the flows' due reads)
/// take the write lock for a moment now and then; a transaction held open by a request
/// (`sku-slow` holds one for 800 ms) outlasts the wait.
async fn open_transactions(db: &str) -> i64 {
    if db.starts_with("sqlite:") {
        let options = orderly::store::sqlite::connect_options(db)
            .unwrap()
            .busy_timeout(Duration::from_millis(150));
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        match sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await {
            Ok(_) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
                0
            }
            Err(sqlx::Error::Database(e)) if e.message().contains("locked") => 1,
            Err(e) => panic!("{e}"),
        }
    } else {
        scalar(
            db,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
        )
        .await
    }
}

/// Creates an order under `key`, retrying a 409 in flight, and returns its id.
async fn create(client: &reqwest::Client, svc: &Service, key: &str, sku: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = post(
            client,
            &svc.url("/orders"),
            Some(key),
            json!({"sku": sku, "qty": 1}),
        )
        .await;
        if status == StatusCode::CREATED {
            return body["id"].as_i64().unwrap();
        }
        assert!(
            status == StatusCode::CONFLICT && Instant::now() < deadline,
            "{status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The whole story on one database.
async fn story(db: &str) {
    let svc = Service::start(db);
    let client = reqwest::Client::new();
    let before = get(&client, &svc.url("/stock/sku-1")).await["available"]
        .as_i64()
        .unwrap();

    // 64 concurrent identical POSTs with one key: one order; the others replay (or are
    // told 409 while it runs, and replay when they retry).
    let answers = futures_util::future::join_all((0..64).map(|_| {
        let (client, url) = (client.clone(), svc.url("/orders"));
        async move {
            post(
                &client,
                &url,
                Some("storm-1"),
                json!({"sku": "sku-1", "qty": 1}),
            )
            .await
        }
    }))
    .await;
    let created: Vec<_> = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::CREATED)
        .collect();
    let fresh = created.iter().filter(|(_, replayed, _)| !replayed).count();
    assert_eq!(fresh, 1, "one request ran: {answers:?}");
    for (status, _, body) in &answers {
        assert!(
            *status == StatusCode::CREATED || *status == StatusCode::CONFLICT,
            "{status} {body}"
        );
    }
    let ids: HashSet<_> = created.iter().map(|(_, _, b)| b["id"].clone()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = create(&client, &svc, "storm-1", "sku-1").await;
    assert_eq!(
        get(&client, &svc.url("/stock/sku-1")).await["available"],
        before - 1,
        "stock taken once"
    );

    // Pay, and the gateway's callback delivered three times at once: one Paid.
    let (status, _, paid) = post(
        &client,
        &svc.url(&format!("/orders/{id}/pay")),
        Some("pay-1"),
        json!({"card": "4242"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paid}");
    let payment = paid["payment_id"].as_str().unwrap().to_string();
    let callbacks = futures_util::future::join_all((0..3).map(|_| {
        let (client, url) = (client.clone(), svc.url("/webhooks/gateway"));
        let payment = payment.clone();
        async move {
            post(
                &client,
                &url,
                None,
                json!({"order_id": id, "payment_id": payment}),
            )
            .await
        }
    }))
    .await;
    let applied = callbacks
        .iter()
        .filter(|(s, _, b)| *s == StatusCode::OK && b["replayed"] == false)
        .count();
    assert_eq!(applied, 1, "{callbacks:?}");
    assert!(callbacks.iter().all(|(s, _, _)| *s == StatusCode::OK));
    // A second payment for the paid order: refused, naming the winner.
    let (status, _, refused) = post(
        &client,
        &svc.url("/webhooks/gateway"),
        None,
        json!({"order_id": id, "payment_id": "pay_second"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["paid_by"], payment.as_str());
    let order = get(&client, &svc.url(&format!("/orders/{id}"))).await;
    assert_eq!(order["state"], "Paid");
    assert_eq!(order["history"].as_array().unwrap().len(), 1);

    // A client that hangs up mid-request: the request still finishes, and its repeat is
    // replayed, not run again.
    let (target, slow_key) = (
        create(&client, &svc, "hangup-order", "sku-1").await,
        "hangup-pay",
    );
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let cut = impatient
        .post(svc.url(&format!("/orders/{target}/pay")))
        .header("Idempotency-Key", slow_key)
        .json(&json!({"card": "slow-4242"}))
        .send()
        .await;
    assert!(
        cut.is_err_and(|e| e.is_timeout()),
        "the client did not hang up"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let answer = post(
            &client,
            &svc.url(&format!("/orders/{target}/pay")),
            Some(slow_key),
            json!({"card": "slow-4242"}),
        )
        .await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(Instant::now() < deadline, "the hung-up request stayed held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(again.0, StatusCode::ACCEPTED, "{:?}", again.2);
    assert!(
        again.1,
        "the hung-up request ran again instead of replaying"
    );

    // A client that hangs up while its request holds a database transaction open
    // (`sku-slow` sleeps inside the reservation's transaction): the hang-up is seen to
    // land while a transaction is open, the request still finishes, nothing is left in a
    // transaction, and the repeat replays the order.
    let cut = impatient
        .post(svc.url("/orders"))
        .header("Idempotency-Key", "hangup-slow")
        .json(&json!({"sku": "sku-slow", "qty": 1}))
        .send()
        .await;
    assert!(
        cut.is_err_and(|e| e.is_timeout()),
        "the client did not hang up"
    );
    assert!(
        open_transactions(db).await > 0,
        "the hang-up did not land inside the reservation's transaction"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let replay = loop {
        let answer = post(
            &client,
            &svc.url("/orders"),
            Some("hangup-slow"),
            json!({"sku": "sku-slow", "qty": 1}),
        )
        .await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(Instant::now() < deadline, "the hung-up request stayed held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(replay.0, StatusCode::CREATED, "{:?}", replay.2);
    assert!(replay.1, "the hung-up order was created again");
    for _ in 0..5 {
        assert_eq!(
            open_transactions(db).await,
            0,
            "a connection stayed in a transaction after the hung-up request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        get(&client, &svc.url("/stock/sku-slow")).await["available"],
        999,
        "the stock taken once"
    );

    // Killed with SIGKILL mid-load (four clients sending at once), then restarted:
    // every request answered once retried, every order created once, the stock taken
    // once per order. The kill counts only if it left a request held (claimed, not
    // finished): up to three tries.
    let stock = get(&client, &svc.url("/stock/sku-1")).await["available"]
        .as_i64()
        .unwrap();
    let mut svc = svc;
    let mut keys: Vec<String> = Vec::new();
    let mut held = 0;
    for attempt in 0..3 {
        let batch: Vec<String> = (0..60).map(|i| format!("load-{attempt}-{i}")).collect();
        keys.extend(batch.iter().cloned());
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let senders: Vec<_> = batch
            .chunks(15)
            .map(|chunk| {
                let (client, url) = (client.clone(), svc.url("/orders"));
                let (chunk, answered) = (chunk.to_vec(), answered.clone());
                tokio::spawn(async move {
                    for key in chunk {
                        let sent = client
                            .post(&url)
                            .header("Idempotency-Key", &key)
                            .json(&json!({"sku": "sku-1", "qty": 1}))
                            .send()
                            .await;
                        if sent.is_err() {
                            return;
                        }
                        answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while answered.load(std::sync::atomic::Ordering::SeqCst) < 10 {
            assert!(Instant::now() < deadline, "the load never got going");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        svc.kill();
        for sender in senders {
            let _ = sender.await;
        }
        held = scalar(
            db,
            "SELECT COUNT(*) FROM idempotency_records WHERE status = 'PROCESSING'",
        )
        .await;
        svc = Service::start(db);
        if held > 0 {
            break;
        }
    }
    assert!(
        held > 0,
        "no kill left a request held: the kill never came mid-request"
    );
    for key in &keys {
        create(&client, &svc, key, "sku-1").await;
    }
    assert_eq!(
        scalar(
            db,
            "SELECT COUNT(*) FROM idempotency_records WHERE status = 'PROCESSING'"
        )
        .await,
        0,
        "a request stayed held"
    );
    let after = get(&client, &svc.url("/stock/sku-1")).await["available"]
        .as_i64()
        .unwrap();
    assert_eq!(
        after,
        stock - keys.len() as i64,
        "an order's stock taken twice or never"
    );
    let metrics = client
        .get(svc.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("orderly_claims_total"), "{metrics}");
    assert!(svc.stop().success(), "a graceful stop failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("service.db").display());
    story(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_on_postgres() {
    let admin = std::env::var("ORDERLY_PG_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("orderly_service_{}", std::process::id());
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .expect("PostgreSQL is reachable");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let db = admin.rsplit_once('/').unwrap().0.to_string() + "/" + &name;
    story(&db).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}
