//! The README's guard, as the README writes it (`tests/readme/guard_pg.rs` is the
//! README's fragment, checked word for word; `guard_mysql.rs` the same text with the
//! connection, the store and the placeholder of MariaDB, checked too): 64 paid orders
//! race to ship with 10 lamps in stock, on PostgreSQL and on MariaDB. Exactly 10 ship,
//! 54 are refused `out_of_stock`, the stock ends at 0. The race is shown to have happened
//! by the serialization failures (PostgreSQL 40001) and deadlocks (MariaDB 1213) the
//! engine retried, counted by the `metrics` feature.
//!
//! Servers: `ORDERLY_PG_URL` and `ORDERLY_MYSQL_URL`, as for their suites; the test makes
//! a database of its own on each.

mod server;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use orderly::{Error, Outcome};
use sqlx::{AssertSqlSafe, Connection};

mod pg {
    include!("readme/guard_pg.rs");
}

mod my {
    include!("readme/guard_mysql.rs");
}

const ORDERS: i64 = 64;
const LAMPS: i64 = 10;

#[test]
fn the_readme_shows_the_guard_this_test_runs() {
    let readme = include_str!("../README.md");
    let pg = include_str!("readme/guard_pg.rs");
    assert!(
        readme.contains(&format!("```rust,no_run\n{pg}```")),
        "the README's guard fragment is not tests/readme/guard_pg.rs"
    );
    let my = include_str!("readme/guard_mysql.rs");
    assert_eq!(
        my,
        pg.replace("PgConnection", "MySqlConnection")
            .replace("PgStore", "MySqlStore")
            .replace("$1", "?"),
        "the MariaDB copy differs from the README's in more than its types and placeholder"
    );
}

/// The retried database errors of `backend` with `code` since the last snapshot.
fn retried(snap: &Snapshotter, backend: &str, codes: &[&str]) -> u64 {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let label = |name: &str| {
                key.labels()
                    .find(|l| l.key() == name)
                    .map(|l| l.value().to_string())
            };
            let hit = key.name() == "orderly_db_retryable_errors_total"
                && label("backend").as_deref() == Some(backend)
                && label("code").is_some_and(|c| codes.contains(&c.as_str()));
            match value {
                DebugValue::Counter(n) if hit => Some(n),
                _ => None,
            }
        })
        .sum()
}

/// 64 paid orders ship at once on `$engine` (of the README's machine in module `$m`,
/// business tables made on `$pool`), each caller re-sending while its answer is
/// retryable: `(applied, refused out of stock, stock left, shipments recorded)`.
macro_rules! race {
    ($m:ident, $engine:expr, $pool:expr) => {{
        let engine = $engine;
        let pool = $pool;
        for sql in [
            "CREATE TABLE shop_due (id BIGINT PRIMARY KEY, due BIGINT NOT NULL)".to_string(),
            "CREATE TABLE shop_stock (sku VARCHAR(20) PRIMARY KEY, qty BIGINT NOT NULL)".into(),
            format!("INSERT INTO shop_stock (sku, qty) VALUES ('lamp', {LAMPS})"),
        ] {
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .unwrap();
        }
        for id in 1..=ORDERS {
            sqlx::raw_sql(AssertSqlSafe(format!(
                "INSERT INTO shop_due (id, due) VALUES ({id}, 4900)"
            )))
            .execute(&pool)
            .await
            .unwrap();
            engine.create(id).await.unwrap();
            let paid = engine
                .transition(id, $m::ShopEvent::Pay, &format!("pay-{id}"))
                .payload(&4900)
                .await
                .unwrap();
            assert!(paid.is_applied());
        }
        let start = Arc::new(tokio::sync::Barrier::new(ORDERS as usize));
        let tasks: Vec<_> = (1..=ORDERS)
            .map(|id| {
                let (engine, start) = (engine.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    for _ in 0..200 {
                        match engine
                            .transition(id, $m::ShopEvent::Ship, &format!("ship-{id}"))
                            .await
                        {
                            Err(e) if e.is_retryable() => {
                                tokio::time::sleep(Duration::from_millis(5)).await
                            }
                            answer => return answer,
                        }
                    }
                    panic!("order {id}: retryable answers for 200 sends")
                })
            })
            .collect();
        let (mut applied, mut refused) = (0, 0);
        for task in tasks {
            match task.await.unwrap() {
                Ok(Outcome::Applied { .. }) => applied += 1,
                Err(Error::Refused { code, .. }) if code == "out_of_stock" => refused += 1,
                other => panic!("a shipment answered {other:?}"),
            }
        }
        let left: i64 = sqlx::query_scalar("SELECT qty FROM shop_stock WHERE sku = 'lamp'")
            .fetch_one(&pool)
            .await
            .unwrap();
        let mut shipped = 0;
        for id in 1..=ORDERS {
            shipped += engine.history(id).await.unwrap().len() as i64 - 1;
        }
        (applied, refused, left, shipped)
    }};
}

/// On a database of its own on the server at `$env` (or `$default`): the race of the
/// README's machine in module `$m` over `$Store`, its answers, and the retried errors of
/// `$backend` with `$codes` that show the race happened; the database dropped by
/// `$drop` after.
macro_rules! on_server {
    ($snap:expr, $name:literal, $Conn:ty, $Store:ty, $m:ident, $env:literal, $default:literal,
     $backend:literal, $codes:expr, $drop:literal) => {{
        let url = server::url($env, $default);
        let admin = <$Conn as Connection>::Options::from_str(&url).unwrap();
        let db = server::unique_db_name();
        let mut conn = <$Conn>::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("{} at {url} is required for this test: {e}", $name));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {db}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let db_url = format!("{}/{db}", url.rsplit_once('/').unwrap().0);
        let store = <$Store>::demo(&db_url).await.unwrap();
        let pool = store.pool().clone();
        let _ = retried($snap, $backend, $codes);
        let (applied, refused, left, shipped) = race!($m, $m::shop(store).unwrap(), pool.clone());
        let conflicts = retried($snap, $backend, $codes);
        println!(
            "{}: applied {applied}, refused {refused}, stock {left}, shipped {shipped}, \
             retried conflicts {conflicts}",
            $name
        );
        assert_eq!(
            (applied, refused, left, shipped),
            (10, 54, 0, 10),
            "{}",
            $name
        );
        assert!(
            conflicts > 0,
            "{}: no two shipments met: the race did not happen",
            $name
        );
        pool.close().await;
        sqlx::raw_sql(AssertSqlSafe(format!($drop, db = db)))
            .execute(&mut conn)
            .await
            .unwrap();
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_readmes_guard_ships_ten_lamps_to_sixty_four_orders() {
    // One recorder for the binary: the two races run one after the other, each counted
    // from its own snapshot.
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    recorder.install().unwrap();
    on_server!(
        &snap,
        "PostgreSQL",
        sqlx::PgConnection,
        orderly::PgStore,
        pg,
        "ORDERLY_PG_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
        "postgres",
        &["40001", "40P01"],
        "DROP DATABASE {db} WITH (FORCE)"
    );
    on_server!(
        &snap,
        "MariaDB",
        sqlx::MySqlConnection,
        orderly::MySqlStore,
        my,
        "ORDERLY_MYSQL_URL",
        "mysql://root@127.0.0.1:3306/test",
        "mysql",
        &["1213", "1205"],
        "DROP DATABASE {db}"
    );
}
