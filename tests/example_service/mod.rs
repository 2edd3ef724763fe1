//! The example service (`examples/service/`) as a real process on loopback, for the
//! suites that drive it over real HTTP.
#![allow(dead_code)]

mod cargo;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sqlx::Connection;

/// The example's binary, built with this suite's features (once per run).
pub fn binary() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> std::path::PathBuf {
    let status = cargo::plain_cargo()
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
pub struct Service {
    pub child: Child,
    pub base: String,
}

impl Service {
    /// Starts the service on `db` with a short lease, and waits until it listens.
    pub fn start(db: &str) -> Service {
        Self::start_with(db, &["--lease-ms", "1500"])
    }

    /// Starts the service on `db` with these further arguments, and waits until it
    /// listens.
    pub fn start_with(db: &str, args: &[&str]) -> Service {
        let mut child = Command::new(binary())
            .args(["--listen", "127.0.0.1:0", "--db", db])
            .args(args)
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

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM: a graceful stop; its exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
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

pub async fn post(
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

pub async fn get(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// One integer from the service's database, read directly.
pub async fn scalar(db: &str, sql: &'static str) -> i64 {
    if db.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(db).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    } else if db.starts_with("mysql:") {
        let mut conn = sqlx::MySqlConnection::connect(db).await.unwrap();
        sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
    } else {
        // orderly's tables in PostgreSQL's schema (`orderly.outbox` for `orderly_outbox`).
        let sql = sql.replace("orderly_", "orderly.");
        let mut conn = sqlx::PgConnection::connect(db).await.unwrap();
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }
}

/// How many of the service's connections are inside a transaction: on PostgreSQL, its
/// database's sessions idle in a transaction; on MariaDB, its database's idle sessions
/// with an open InnoDB transaction; on SQLite, 1 if another connection holds
/// the write lock for more than 150 ms (a fresh `BEGIN IMMEDIATE` waits that long and
/// fails), else 0. The service's own jobs (the relay's claims, the flows' due reads)
/// take the write lock for a moment now and then; a transaction held open by a request
/// (`sku-slow` holds one for 800 ms) outlasts the wait.
pub async fn open_transactions(db: &str) -> i64 {
    transactions(db, false).await
}

/// [`open_transactions`], counting on PostgreSQL and MariaDB only the transactions open
/// for a second or more: one a request left behind, not one of the service's own jobs
/// caught between two statements.
pub async fn stuck_transactions(db: &str) -> i64 {
    transactions(db, true).await
}

async fn transactions(db: &str, stuck: bool) -> i64 {
    if db.starts_with("sqlite:") {
        let options = orderly::backend::sqlite::connect_options(db)
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
    } else if db.starts_with("mysql:") {
        let sql = if stuck {
            "SELECT COUNT(*) FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID() AND p.command = 'Sleep' \
               AND t.trx_started <= NOW() - INTERVAL 1 SECOND"
        } else {
            "SELECT COUNT(*) FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID() AND p.command = 'Sleep'"
        };
        scalar(db, sql).await
    } else {
        let sql = if stuck {
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid() \
             AND state_change <= clock_timestamp() - interval '1 second'"
        } else {
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
        };
        scalar(db, sql).await
    }
}

/// A PostgreSQL database of the caller's own, created afresh: its URL. Dropped by
/// [`drop_pg_db`].
pub async fn pg_db(name: &str) -> String {
    let admin = pg_admin();
    let mut conn = sqlx::PgConnection::connect(&admin)
        .await
        .expect("PostgreSQL is reachable");
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    admin.rsplit_once('/').unwrap().0.to_string() + "/" + name
}

/// Drops a database [`pg_db`] made.
pub async fn drop_pg_db(name: &str) {
    let mut conn = sqlx::PgConnection::connect(&pg_admin()).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}

pub fn pg_admin() -> String {
    std::env::var("ORDERLY_PG_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A MariaDB database of the caller's own, created afresh: its URL. Dropped by
/// [`drop_mysql_db`].
pub async fn mysql_db(name: &str) -> String {
    let admin = mysql_admin();
    let mut conn = sqlx::MySqlConnection::connect(&admin)
        .await
        .expect("MariaDB is reachable");
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    admin.rsplit_once('/').unwrap().0.to_string() + "/" + name
}

/// Drops a database [`mysql_db`] made.
pub async fn drop_mysql_db(name: &str) {
    let mut conn = sqlx::MySqlConnection::connect(&mysql_admin())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}

fn mysql_admin() -> String {
    std::env::var("ORDERLY_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}
