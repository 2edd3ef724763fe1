//! A fresh database on the Galera cluster of `.ci/galera.sh`, with a store per node.
#![allow(dead_code)]

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use orderly::{Engine, MySqlStore};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPoolOptions};
use sqlx::{AssertSqlSafe, Connection};

use crate::server;

/// The cluster's client URLs: `ORDERLY_GALERA_URLS` (comma-separated), by default the
/// script's ports 4306, 4307, 4308.
pub fn node_urls() -> Vec<String> {
    let urls = server::url(
        "ORDERLY_GALERA_URLS",
        "mysql://root@127.0.0.1:4306/test,mysql://root@127.0.0.1:4307/test,mysql://root@127.0.0.1:4308/test",
    );
    urls.split(',').map(str::to_string).collect()
}

/// A fresh database, created on node 1 (Galera replicates it), and a store per node.
pub struct Cluster {
    pub name: String,
    pub stores: Vec<MySqlStore>,
}

impl Cluster {
    pub async fn fresh() -> Cluster {
        let urls = node_urls();
        let name = server::unique_db_name();
        let admin = MySqlConnectOptions::from_str(&urls[0]).unwrap();
        let mut conn = MySqlConnection::connect_with(&admin)
            .await
            .unwrap_or_else(|e| panic!("the Galera cluster at {} is required: {e}", urls[0]));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let mut stores = Vec::new();
        for url in &urls {
            let options = MySqlConnectOptions::from_str(url).unwrap().database(&name);
            let pool = MySqlPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options)
                .await
                .unwrap();
            if stores.is_empty() {
                orderly::backend::mysql::migrate(&pool).await.unwrap();
                for sql in orderly::Schema::create_tables_sql(&MySqlStore::new(
                    pool.clone(),
                    orderly::Tables::new("orders").unwrap(),
                )) {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&pool)
                        .await
                        .unwrap();
                }
            }
            let store = MySqlStore::new(pool, orderly::Tables::new("orders").unwrap());
            // Borrowing a connection tells the store it is on Galera.
            drop(orderly::Store::acquire(&store).await.unwrap());
            assert_eq!(
                store.causal_reads(),
                Some(true),
                "{url} is not a Galera node"
            );
            stores.push(store);
        }
        Cluster { name, stores }
    }

    /// Engines with the default deadline: for the failover test, which proves the
    /// deadline cuts off calls to a killed node.
    pub fn engines<M: orderly::StateMachine>(&self) -> Vec<Engine<M, MySqlStore>> {
        self.stores
            .iter()
            .map(|s| Engine::new(s.clone()).unwrap())
            .collect()
    }

    /// [`engines`](Self::engines) whose calls wait up to 30 s: for every test that judges
    /// what the nodes answer, not how fast, with three nodes and the tests' load on two
    /// cores (CI saw answers of `DeadlineExceeded` after 5 s, in doubt, in four of them).
    pub fn patient_engines<M: orderly::StateMachine>(&self) -> Vec<Engine<M, MySqlStore>> {
        self.stores.iter().map(|s| patient(s.clone())).collect()
    }

    /// Each node's checksum of the orders and the history, in key order, read causally
    /// (`wsrep_sync_wait`): a node still applying what another certified waits for it.
    pub async fn node_digests(&self) -> Vec<(i64, String)> {
        let mut digests = Vec::new();
        for store in &self.stores {
            let pool = store.pool();
            let orders: (i64, Option<String>) = sqlx::query_as(
                "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*), SHA2(GROUP_CONCAT(CONCAT_WS(':', id, status, version) ORDER BY id SEPARATOR ','), 256) \
                 FROM (SELECT * FROM orders ORDER BY id) o",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            let history: (i64, Option<String>) = sqlx::query_as(
                "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*), SHA2(GROUP_CONCAT(CONCAT_WS(':', order_id, seq, from_status, to_status, event, ref_id) \
                 ORDER BY order_id, seq SEPARATOR ','), 256) FROM orderly_transitions",
            )
            .fetch_one(pool)
            .await
            .unwrap();
            digests.push((
                orders.0 + history.0,
                format!("{:?}/{:?}", orders.1, history.1),
            ));
        }
        digests
    }

    pub async fn cleanup(self) {
        for store in &self.stores {
            store.pool().close().await;
        }
        let admin = MySqlConnectOptions::from_str(&node_urls()[0]).unwrap();
        let mut conn = MySqlConnection::connect_with(&admin).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {}",
            self.name
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}

/// Runs `.ci/galera.sh COMMAND NODE` (kill, restart) on the cluster's node.
pub fn galera_script(command: &str, node: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/galera.sh");
    let status = std::process::Command::new("bash")
        .arg(script)
        .args([command, node])
        .status()
        .unwrap();
    assert!(status.success(), ".ci/galera.sh {command} {node} failed");
}

/// Whether `err` is a write set that lost in Galera's certification to another node's:
/// error 1213 (Galera reports a certification failure as a deadlock), retryable.
pub fn certification_collision(err: &orderly::Error) -> bool {
    match err {
        orderly::Error::Database {
            source: sqlx::Error::Database(db),
            retryable: true,
        } => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| e.number() == 1213),
        _ => false,
    }
}

/// An engine on `store` whose calls wait up to 30 s (the default is 5 s).
pub fn patient<M: orderly::StateMachine>(store: MySqlStore) -> Engine<M, MySqlStore> {
    let config = orderly::EngineConfig::default().deadline(std::time::Duration::from_secs(30));
    Engine::with_config(store, config).unwrap()
}
