//! orderly inside an application that already exists: the application's own sqlx
//! migrations (`tests/fit/migrations/<backend>/`, a `refunds` table with business
//! columns) beside orderly's, run in either order, then orderly upgraded by one
//! migration; and a database an earlier orderly migrated through the application's
//! `_sqlx_migrations`, moved to orderly's own table. On SQLite, PostgreSQL and MySQL.
//!
//! Servers: `ORDERLY_PG_URL` and `ORDERLY_MYSQL_URL`, as for their suites; each test
//! makes a database of its own.

mod server;

use std::str::FromStr;

use orderly::Engine;
use orderly::store::MIGRATIONS_TABLE;
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

/// The three scenarios, on one backend: `$fresh` is an empty database's pool (and
/// whatever keeps it alive), `$app` the application's migrations.
macro_rules! fit_suite {
    ($backend:ident, $Pool:ty, $Store:ty, $app:literal, $fresh:path) => {
        mod $backend {
            use super::*;
            use orderly::store::$backend::{migrate, migrator};
            use sqlx::migrate::Migrator;

            static APP: Migrator = sqlx::migrate!($app);

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

            /// orderly works on the database: a refund created and approved once.
            async fn works(pool: &$Pool) {
                let engine: Engine<RefundMachine, $Store> =
                    Engine::new(<$Store>::new(pool.clone())).unwrap();
                engine.create(1).await.unwrap();
                let approved = engine
                    .transition(1, RefundEvent::Approve, "ticket-1")
                    .await
                    .unwrap();
                assert!(approved.is_applied(), "{approved:?}");
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

            /// A database an earlier orderly migrated through `_sqlx_migrations`: three
            /// processes' worth of `migrate` at once move its rows over exactly once,
            /// apply the newest migration, and leave the table to the application.
            #[tokio::test]
            async fn an_earlier_orderlys_rows_move_out_of_the_applications_table() {
                let (pool, _keep) = $fresh().await;
                let all = ours();
                let earlier = &all[..all.len() - 1];
                let mut legacy = migrator();
                legacy.dangerous_set_table_name("_sqlx_migrations");
                legacy
                    .run_to(*earlier.last().unwrap(), &pool)
                    .await
                    .unwrap();
                assert_eq!(versions(&pool, "_sqlx_migrations").await, earlier);
                let (a, b, c) = tokio::join!(migrate(&pool), migrate(&pool), migrate(&pool));
                for upgraded in [a, b, c] {
                    upgraded.expect("an earlier orderly's database upgraded");
                }
                assert_eq!(versions(&pool, "_sqlx_migrations").await, Vec::<i64>::new());
                assert_eq!(versions(&pool, MIGRATIONS_TABLE).await, all);
                APP.run(&pool)
                    .await
                    .expect("the application's migrations, once orderly's rows moved");
                assert_eq!(versions(&pool, "_sqlx_migrations").await, app());
                works(&pool).await;
            }
        }
    };
}

async fn fresh_sqlite() -> (sqlx::SqlitePool, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let options = orderly::store::sqlite::connect_options(&url).unwrap();
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
    fresh_sqlite
);
fit_suite!(
    postgres,
    sqlx::PgPool,
    orderly::store::postgres::PgStore,
    "tests/fit/migrations/postgres",
    fresh_postgres
);
fit_suite!(
    mysql,
    sqlx::MySqlPool,
    orderly::store::mysql::MySqlStore,
    "tests/fit/migrations/mysql",
    fresh_mysql
);
