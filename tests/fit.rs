//! orderly inside an application that already exists: the application's own sqlx
//! migrations (`tests/fit/migrations/<backend>/`: a `refunds` table with business
//! columns, then its own `orders`, `outbox` and `timers`) beside orderly's, which keep
//! to their namespace, run in either order on a fresh database, then orderly upgraded
//! by one migration; the application's rows untouched, its orders' stored states
//! (`'new'`, `'paid'`) read and written; and a database an earlier orderly migrated
//! (its tables under the common names, its migrations in `_sqlx_migrations`) moved into
//! the namespace. On SQLite, PostgreSQL and MySQL.
//!
//! Servers: `ORDERLY_PG_URL` and `ORDERLY_MYSQL_URL`, as for their suites; each test
//! makes a database of its own.

mod server;

use std::str::FromStr;

use orderly::{Engine, Tables};
use sqlx::{AssertSqlSafe, Connection};

orderly::state_machine! {
    /// The application's refunds.
    pub RefundMachine {
        states: RefundState { Requested, Approved, Rejected }
        events: RefundEvent { Approve, Reject }
        initial: Requested;
        terminal: [Approved, Rejected];
        transitions: {
            Requested + Approve => Approved,
            Requested + Reject  => Rejected,
        }
    }
}

orderly::state_machine! {
    /// The application's orders, whose rows say `'new'` and `'paid'`.
    pub PayMachine {
        states: PayState { New = "new", Paid = "paid" }
        events: PayEvent { Pay }
        initial: New;
        terminal: [Paid];
        transitions: {
            New + Pay => Paid,
        }
    }
}

/// The three scenarios, on one backend: `$fresh` is an empty database's pool (and
/// whatever keeps it alive), `$app` the application's migrations.
macro_rules! fit_suite {
    ($backend:ident, $Pool:ty, $Store:ty, $app:literal, $legacy:literal, $ours:literal, $ns:literal, $fresh:path) => {
        mod $backend {
            use super::*;
            use orderly::backend::$backend::{migrate, migrator};
            use sqlx::migrate::Migrator;

            static APP: Migrator = sqlx::migrate!($app);
            /// Where orderly records its migrations.
            const MIGRATIONS_TABLE: &str = $ours;

            /// One of orderly's tables as this backend names it.
            fn ns(table: &str) -> String {
                format!("{}{table}", $ns)
            }

            async fn count(pool: &$Pool, sql: &str) -> i64 {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_string()))
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }

            async fn versions(pool: &$Pool, table: &str) -> Vec<i64> {
                let sql = format!("SELECT version FROM {table} ORDER BY version");
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }

            fn ours() -> Vec<i64> {
                migrator().iter().map(|m| m.version).collect()
            }

            fn app() -> Vec<i64> {
                APP.iter().map(|m| m.version).collect()
            }

            /// orderly works on the application's own `orders`: an order the application
            /// inserted (born `'new'`) paid once, its row saying `'paid'`; the
            /// application's own `outbox` and `timers` rows untouched, and orderly's
            /// history in its namespace.
            async fn works(pool: &$Pool) {
                let engine: Engine<PayMachine, $Store> =
                    Engine::new(<$Store>::new(pool.clone(), Tables::new("orders").unwrap()))
                        .unwrap();
                engine.check_tables().await.unwrap();
                sqlx::raw_sql(
                    "INSERT INTO orders (id, customer, amount_cents) VALUES (1, 'ana', 1250)",
                )
                .execute(pool)
                .await
                .unwrap();
                assert_eq!(engine.get(1).await.unwrap().state, PayState::New);
                let paid = engine.transition(1, PayEvent::Pay, "pay-1").await.unwrap();
                assert!(paid.is_applied(), "{paid:?}");
                let replay = engine.transition(1, PayEvent::Pay, "pay-1").await.unwrap();
                assert!(matches!(replay, orderly::Outcome::Replayed { .. }), "{replay:?}");
                let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE id = 1")
                    .fetch_one(pool)
                    .await
                    .unwrap();
                assert_eq!(status, "paid");
                let history = format!("SELECT COUNT(*) FROM {} WHERE order_id = 1", ns("transitions"));
                assert_eq!(count(pool, &history).await, 1);
                assert_eq!(
                    count(pool, "SELECT COUNT(*) FROM outbox WHERE topic = 'newsletter' AND payload = 'the application''s own event'").await,
                    1
                );
                assert_eq!(count(pool, "SELECT COUNT(*) FROM outbox").await, 1);
                assert_eq!(
                    count(pool, "SELECT COUNT(*) FROM timers WHERE name = 'nightly-report' AND fire_at = 86400000").await,
                    1
                );
                assert_eq!(count(pool, "SELECT COUNT(*) FROM timers").await, 1);
            }

            /// orderly in another namespace (`billing`): its migrations make its tables
            /// there and none in the default one, record themselves there, run again as
            /// nothing; an engine whose tables name the namespace writes its history
            /// there, beside the application's own `outbox` and `timers`.
            #[tokio::test]
            async fn another_namespace_holds_orderlys_tables() {
                use orderly::backend::$backend::migrate_in;
                let (pool, _keep) = $fresh().await;
                APP.run(&pool).await.unwrap();
                migrate_in(&pool, "billing").await.unwrap();
                migrate_in(&pool, "billing").await.expect("again, as nothing");
                let billing = |table: &str| format!("{}{table}", $ns.replace("orderly", "billing"));
                let ours_in_billing = billing("migrations");
                assert_eq!(versions(&pool, &ours_in_billing).await, ours());
                for table in ["transitions", "outbox", "timers", "flows", "idempotency_records"] {
                    let there = format!("SELECT COUNT(*) FROM {}", billing(table));
                    assert_eq!(count(&pool, &there).await, 0, "{table} in billing");
                    let default = format!("SELECT COUNT(*) FROM {}", ns(table));
                    assert!(
                        sqlx::query(AssertSqlSafe(default)).fetch_one(&pool).await.is_err(),
                        "{table} made in the default namespace"
                    );
                }
                let tables = Tables::new("orders").unwrap().in_namespace("billing").unwrap();
                let engine: Engine<PayMachine, $Store> =
                    Engine::new(<$Store>::new(pool.clone(), tables)).unwrap();
                engine.check_tables().await.unwrap();
                sqlx::raw_sql("INSERT INTO orders (id, customer, amount_cents) VALUES (7, 'bo', 990)")
                    .execute(&pool)
                    .await
                    .unwrap();
                let paid = engine.transition(7, PayEvent::Pay, "pay-7").await.unwrap();
                assert!(paid.is_applied(), "{paid:?}");
                let history = format!("SELECT COUNT(*) FROM {} WHERE order_id = 7", billing("transitions"));
                assert_eq!(count(&pool, &history).await, 1);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM outbox").await, 1);
                assert_eq!(count(&pool, "SELECT COUNT(*) FROM timers").await, 1);
            }

            #[tokio::test]
            async fn the_applications_migrations_first_then_orderlys() {
                let (pool, _keep) = $fresh().await;
                APP.run(&pool).await.unwrap();
                migrate(&pool)
                    .await
                    .expect("orderly's migrations after the application's");
                APP.run(&pool)
                    .await
                    .expect("the application's migrations again");
                migrate(&pool).await.expect("orderly's migrations again");
                assert_eq!(versions(&pool, "_sqlx_migrations").await, app());
                assert_eq!(versions(&pool, MIGRATIONS_TABLE).await, ours());
                works(&pool).await;
            }

            #[tokio::test]
            async fn orderlys_first_then_the_applications_then_orderly_upgraded_by_one() {
                let (pool, _keep) = $fresh().await;
                let all = ours();
                let (last, earlier) = all.split_last().unwrap();
                migrator()
                    .run_to(*earlier.last().unwrap(), &pool)
                    .await
                    .unwrap();
                APP.run(&pool)
                    .await
                    .expect("the application's migrations after orderly's");
                assert_eq!(versions(&pool, MIGRATIONS_TABLE).await, earlier);
                migrate(&pool)
                    .await
                    .expect("orderly upgraded by one migration");
                APP.run(&pool)
                    .await
                    .expect("the application's migrations again");
                assert_eq!(versions(&pool, "_sqlx_migrations").await, app());
                let now = versions(&pool, MIGRATIONS_TABLE).await;
                assert_eq!(now.last(), Some(last));
                assert_eq!(now, all);
                works(&pool).await;
            }

            /// The application's own `refunds` (business columns `NOT NULL`) driven with a
            /// history table of its own name that the library creates, a refund created
            /// inside the application's transaction after its own insert, and the
            /// history table upgraded by the library when it lacks a column.
            #[tokio::test]
            async fn the_applications_own_tables_made_and_upgraded_by_the_library() {
                let (pool, _keep) = $fresh().await;
                APP.run(&pool).await.unwrap();
                migrate(&pool).await.unwrap();
                let tables = Tables::new("refunds").and_then(|t| t.with_history("refund_log")).unwrap();
                let engine: Engine<RefundMachine, $Store> =
                    Engine::new(<$Store>::new(pool.clone(), tables)).unwrap();
                let statements = engine.tables_sql();
                assert!(
                    statements.iter().any(|s| s.contains("refund_log")),
                    "{statements:?}"
                );
                engine.create_tables().await.unwrap();
                engine.create_tables().await.expect("idempotent");
                engine.check_tables().await.unwrap();

                // A refund the application inserts with its business columns, at the
                // initial state's stored form and version 0, then created in the same
                // transaction: committed together, or rolled back together.
                let insert = |id: i64| {
                    format!(
                        "INSERT INTO refunds (id, payment_ref, amount_cents, currency, status, version) \
                         VALUES ({id}, 'pay_{id}', 1250, 'EUR', '{}', 0)",
                        RefundState::Requested.as_ref()
                    )
                };
                let mut tx = pool.begin().await.unwrap();
                sqlx::raw_sql(AssertSqlSafe(insert(7)))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let created = engine.create(7).within(&mut tx).await.unwrap();
                assert_eq!((created.state, created.version), (RefundState::Requested, 0));
                tx.commit().await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                sqlx::raw_sql(AssertSqlSafe(insert(8)))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                engine.create(8).within(&mut tx).await.unwrap();
                tx.rollback().await.unwrap();
                assert!(matches!(
                    engine.get(8).await,
                    Err(orderly::Error::NotFound { .. })
                ));
                // Without the application's row, the insert of `(id, status, version)`
                // meets the business columns' NOT NULL: the database's refusal, not
                // retryable, and nothing written.
                let refused = engine.create(10).await.unwrap_err();
                assert!(
                    matches!(refused, orderly::Error::Database { retryable: false, .. }),
                    "{refused:?}"
                );
                assert!(matches!(
                    engine.get(10).await,
                    Err(orderly::Error::NotFound { .. })
                ));

                let approved = engine
                    .transition(7, RefundEvent::Approve, "ticket-7")
                    .actor("agent:ana")
                    .reason("within the captured amount")
                    .await
                    .unwrap();
                assert!(approved.is_applied(), "{approved:?}");
                let history = engine.history(7).await.unwrap();
                assert_eq!(history.len(), 1);
                assert_eq!(
                    (history[0].actor.as_deref(), history[0].reason.as_deref()),
                    (Some("agent:ana"), Some("within the captured amount"))
                );
                let amount: i64 =
                    sqlx::query_scalar("SELECT amount_cents FROM refunds WHERE id = 7")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                assert_eq!(amount, 1250, "business columns left alone");

                // A history table made before a column existed: refused, then upgraded.
                sqlx::raw_sql("ALTER TABLE refund_log DROP COLUMN write_id")
                    .execute(&pool)
                    .await
                    .unwrap();
                assert!(matches!(
                    engine.check_tables().await,
                    Err(orderly::Error::MissingColumn { ref column, .. }) if column == "write_id"
                ));
                engine.create_tables().await.expect("the missing column added");
                engine.check_tables().await.unwrap();
                sqlx::raw_sql(AssertSqlSafe(insert(9)))
                    .execute(&pool)
                    .await
                    .unwrap();
                let rejected = engine
                    .transition(9, RefundEvent::Reject, "ticket-9")
                    .await
                    .unwrap();
                assert!(rejected.is_applied(), "{rejected:?}");
                assert_eq!(engine.history(7).await.unwrap().len(), 1);
            }

            /// The property-testing kit over the application's own table: random
            /// duplicate-heavy sequences over refunds the application inserted (with
            /// its business columns), ids that no other test or run uses.
            #[test]
            fn the_testing_kit_runs_on_the_applications_table() {
                use orderly::testing::{check_entities, no_payload, payload, steps_with, unique_ids};
                use proptest::prelude::*;
                use proptest::test_runner::{Config, TestCaseError, TestRunner};
                let rt = tokio::runtime::Runtime::new().unwrap();
                let (pool, _keep, engine) = rt.block_on(async {
                    let (pool, keep) = $fresh().await;
                    APP.run(&pool).await.unwrap();
                    migrate(&pool).await.unwrap();
                    let tables = Tables::new("refunds").and_then(|t| t.with_history("refund_log")).unwrap();
                    let engine: Engine<RefundMachine, $Store> =
                        Engine::new(<$Store>::new(pool.clone(), tables)).unwrap();
                    engine.create_tables().await.unwrap();
                    (pool, keep, engine)
                });
                let mut runner = TestRunner::new(Config {
                    cases: 12,
                    failure_persistence: None,
                    ..Config::default()
                });
                let cases = std::sync::atomic::AtomicUsize::new(0);
                runner
                    .run(&steps_with::<RefundMachine>(3, 3, 1..40, |event| match event {
                        // As the README's example gives its payment an amount, this machine's approval carries one.
                        RefundEvent::Approve => {
                            prop_oneof![payload(Just(500_i64)), payload(Just(450_i64))].boxed()
                        }
                        _ => no_payload(),
                    }), |seq| {
                        cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        rt.block_on(async {
                            let mut ids = unique_ids(4);
                            let missing = ids.pop().unwrap();
                            for &id in &ids {
                                let sql = format!(
                                    "INSERT INTO refunds (id, payment_ref, amount_cents, currency, status, version) \
                                     VALUES ({id}, 'pay_{id}', 500, 'EUR', '{}', 0)",
                                    RefundState::Requested.as_ref()
                                );
                                sqlx::raw_sql(AssertSqlSafe(sql))
                                    .execute(&pool)
                                    .await
                                    .unwrap();
                            }
                            check_entities(&engine, &ids, missing, &seq).await
                        })
                        .map_err(TestCaseError::fail)
                    })
                    .unwrap();
                assert!(cases.into_inner() >= 12, "every case ran");
            }

            /// A database an earlier orderly migrated through `_sqlx_migrations`, its
            /// tables under the common names, one migration short: three processes'
            /// worth of `migrate` at once finish its migrations, move its tables into the
            /// namespace with their rows, and leave `_sqlx_migrations`, `orders` and the
            /// common names to the application.
            #[tokio::test]
            async fn an_earlier_orderlys_tables_move_into_the_namespace() {
                let (pool, _keep) = $fresh().await;
                let mut legacy = sqlx::migrate!($legacy);
                legacy.dangerous_set_table_name("_sqlx_migrations");
                let all: Vec<i64> = legacy.iter().map(|m| m.version).collect();
                legacy
                    .run_to(all[all.len() - 2], &pool)
                    .await
                    .unwrap();
                for sql in [
                    "INSERT INTO orders (id, status, version) VALUES (5, 'paid', 1)",
                    "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) \
                     VALUES (5, 1, 'new', 'paid', 'Pay', 'pay-5')",
                    "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
                     VALUES ('PayMachine', 5, 1, 'Paid', 'Pay', 'new', 'paid', 'pay-5')",
                ] {
                    sqlx::raw_sql(sql).execute(&pool).await.unwrap();
                }
                let (a, b, c) = tokio::join!(migrate(&pool), migrate(&pool), migrate(&pool));
                for upgraded in [a, b, c] {
                    upgraded.expect("an earlier orderly's database upgraded");
                }
                assert_eq!(versions(&pool, "_sqlx_migrations").await, Vec::<i64>::new());
                assert_eq!(versions(&pool, MIGRATIONS_TABLE).await, ours());
                // The rows moved with their tables; the common names are free.
                let moved = format!("SELECT COUNT(*) FROM {} WHERE ref_id = 'pay-5'", ns("outbox"));
                assert_eq!(count(&pool, &moved).await, 1);
                for free in ["outbox", "order_transitions", "timers", "flows", "inbox"] {
                    sqlx::raw_sql(AssertSqlSafe(format!("CREATE TABLE {free} (id INTEGER)")))
                        .execute(&pool)
                        .await
                        .unwrap_or_else(|e| panic!("{free} is still taken: {e}"));
                }
                // The earlier entity table stays the application's, its history readable.
                let engine: Engine<PayMachine, $Store> =
                    Engine::new(<$Store>::new(pool.clone(), Tables::new("orders").unwrap()))
                        .unwrap();
                let history = engine.history(5).await.unwrap();
                assert_eq!(history.len(), 1);
                assert_eq!(history[0].ref_id, "pay-5");
                let replay = engine.transition(5, PayEvent::Pay, "pay-5").await.unwrap();
                assert!(matches!(replay, orderly::Outcome::Replayed { .. }), "{replay:?}");
                migrate(&pool).await.expect("idempotent after the move");
            }
        }
    };
}

async fn fresh_sqlite() -> (sqlx::SqlitePool, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let options = orderly::backend::sqlite::connect_options(&url).unwrap();
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    (pool, dir)
}

async fn fresh_postgres() -> (sqlx::PgPool, ()) {
    let url = server::url(
        "ORDERLY_PG_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    );
    let admin = sqlx::postgres::PgConnectOptions::from_str(&url).unwrap();
    let name = server::unique_db_name();
    let mut conn = sqlx::PgConnection::connect_with(&admin)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required for this suite: {e}"));
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(admin.database(&name))
        .await
        .unwrap();
    (pool, ())
}

async fn fresh_mysql() -> (sqlx::MySqlPool, ()) {
    let url = server::url("ORDERLY_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let admin = sqlx::mysql::MySqlConnectOptions::from_str(&url).unwrap();
    let name = server::unique_db_name();
    let mut conn = sqlx::MySqlConnection::connect_with(&admin)
        .await
        .unwrap_or_else(|e| panic!("MySQL/MariaDB at {url} is required for this suite: {e}"));
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(4)
        .connect_with(admin.database(&name))
        .await
        .unwrap();
    (pool, ())
}

fit_suite!(
    sqlite,
    sqlx::SqlitePool,
    orderly::SqliteStore,
    "tests/fit/migrations/sqlite",
    "migrations/legacy/sqlite",
    "orderly_migrations",
    "orderly_",
    fresh_sqlite
);
fit_suite!(
    postgres,
    sqlx::PgPool,
    orderly::backend::postgres::PgStore,
    "tests/fit/migrations/postgres",
    "migrations/legacy/postgres",
    "orderly.migrations",
    "orderly.",
    fresh_postgres
);
fit_suite!(
    mysql,
    sqlx::MySqlPool,
    orderly::backend::mysql::MySqlStore,
    "tests/fit/migrations/mysql",
    "migrations/legacy/mysql",
    "orderly_migrations",
    "orderly_",
    fresh_mysql
);
