//! The outbox relay to a Kafka-protocol broker (`ORDERLY_KAFKA_BROKERS`, default
//! `127.0.0.1:9092`: the one-node Tansu broker `.ci/tansu.sh start` runs), read back by an
//! independent consumer (`tests/kafka/read_back.py`, Python's confluent-kafka). A broker
//! that cannot be reached fails these tests; they never skip. Opt-in
//! (`--include-ignored`): `.ci/run` runs them.

mod server;

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orderly::outbox::{Claim, KafkaSink, Message, Outbox, Relay, RelayConfig, Sink, SinkError};
use orderly::{PgStore, SqliteStore};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions};

fn brokers() -> String {
    server::url("ORDERLY_KAFKA_BROKERS", "127.0.0.1:9092")
}

/// Runs `tests/kafka/read_back.py` with `args` on the suite's broker; its standard
/// output.
fn read_back(args: &[&str]) -> String {
    read_back_at(&brokers(), args)
}

/// [`read_back`] on the broker at `brokers`.
fn read_back_at(brokers: &str, args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kafka/read_back.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(brokers)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "read_back.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A topic of its own with `partitions` partitions, created by the independent client.
fn topic(partitions: u32) -> String {
    let name = format!("o{}", server::unique_db_name());
    read_back(&["create", &name, &partitions.to_string()]);
    name
}

/// One record as the independent consumer read it.
#[derive(Debug, Clone)]
struct Record {
    partition: i64,
    key: String,
    headers: HashMap<String, String>,
    value_len: usize,
}

impl Record {
    fn entity(&self) -> i64 {
        self.headers["Orderly-Entity"].parse().unwrap()
    }

    fn version(&self) -> i64 {
        self.headers["Orderly-Version"].parse().unwrap()
    }
}

/// The records of `topic`, each partition's in offset order: read until `expect` came
/// and then none for 2 s (or none for 15 s).
fn records(topic: &str, expect: usize) -> Vec<Record> {
    records_at(&brokers(), topic, expect)
}

/// [`records`] from the broker at `brokers`.
fn records_at(brokers: &str, topic: &str, expect: usize) -> Vec<Record> {
    read_back_at(brokers, &["read", topic, &expect.to_string()])
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            Record {
                partition: v["partition"].as_i64().unwrap(),
                key: v["key"].as_str().unwrap().to_string(),
                headers: serde_json::from_value(v["headers"].clone()).unwrap(),
                value_len: v["value_len"].as_u64().unwrap() as usize,
            }
        })
        .collect()
}

/// Checks what every record must hold whatever happened: its key is its entity, its
/// `Orderly-Id` names its entity and version, and one entity's records share one
/// partition. Returns each entity's versions in the order the topic holds them.
fn by_entity(records: &[Record]) -> HashMap<i64, Vec<i64>> {
    let mut versions: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut partition_of: HashMap<i64, i64> = HashMap::new();
    for r in records {
        let (entity, version) = (r.entity(), r.version());
        assert_eq!(r.key, entity.to_string(), "the key is the entity: {r:?}");
        assert_eq!(
            r.headers["Orderly-Id"],
            format!("OrderMachine:{entity}:{version}"),
            "{r:?}"
        );
        let first = *partition_of.entry(entity).or_insert(r.partition);
        assert_eq!(first, r.partition, "entity {entity} on two partitions");
        versions.entry(entity).or_default().push(version);
    }
    versions
}

/// How many times each message id is there.
fn copies_of(records: &[Record]) -> HashMap<&str, usize> {
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for r in records {
        *copies.entry(r.headers["Orderly-Id"].as_str()).or_default() += 1;
    }
    copies
}

/// Each of `entities` entities' first copies are its `per_entity` versions in order.
fn assert_firsts_in_order(versions: &HashMap<i64, Vec<i64>>, entities: i64, per_entity: i64) {
    for entity in 1..=entities {
        let mut seen = HashSet::new();
        let firsts: Vec<i64> = versions[&entity]
            .iter()
            .copied()
            .filter(|v| seen.insert(*v))
            .collect();
        assert_eq!(
            firsts,
            (1..=per_entity).collect::<Vec<_>>(),
            "entity {entity}'s events as the topic holds them"
        );
    }
}

/// The ids of the events whose rows count more than one attempt: the only ones a record
/// may be there twice of.
async fn retried(store: &SqliteStore) -> HashSet<String> {
    sqlx::query_as::<_, (i64, i64)>(
        "SELECT entity_id, version FROM orderly_outbox WHERE attempts > 1",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .map(|(e, v)| format!("OrderMachine:{e}:{v}"))
    .collect()
}

/// Every record there more than once is one of `retried`; returns how many are.
fn assert_twice_only_if_retried(records: &[Record], retried: &HashSet<String>) -> usize {
    let twice: HashSet<String> = copies_of(records)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id.to_string())
        .collect();
    assert!(
        twice.is_subset(retried),
        "a record twice whose publish was never tried again: {:?}",
        twice.difference(retried).collect::<Vec<_>>()
    );
    twice.len()
}

/// The trace context stored with an event of `seed_sql`: its entity in the trace id, its
/// version in the parent id.
fn traceparent(entity: i64, version: i64) -> String {
    format!("00-{entity:032x}-{version:016x}-01")
}

/// The inserts of `per_entity` events for each of `entities` entities, written straight
/// to the outbox, each with a trace context.
fn seed_sql(entities: i64, per_entity: i64) -> Vec<String> {
    let mut rows = Vec::new();
    for entity in 1..=entities {
        for version in 1..=per_entity {
            rows.push(format!(
                "('OrderMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', 'Paid', 'r-{entity}-{version}', '{}')",
                traceparent(entity, version)
            ));
        }
    }
    rows.chunks(1000)
        .map(|chunk| {
            format!(
                "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id, traceparent) \
                 VALUES {}",
                chunk.join(", ")
            )
        })
        .collect()
}

fn config(batch: u32) -> RelayConfig {
    RelayConfig::default()
        .batch(batch)
        .lease(Duration::from_secs(20))
        .publish_timeout(Duration::from_secs(10))
        .max_attempts(1000)
        .min_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(500))
        .idle(Duration::from_millis(20))
}

/// Runs `relay` until the outbox has nothing pending.
fn drain<S, K>(relay: Relay<S, K>) -> tokio::task::JoinHandle<()>
where
    S: orderly::outbox::OutboxStore,
    K: Sink,
{
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let round = relay.relay_once().await.unwrap();
            if round.claimed == 0 && relay.outbox().stats().await.unwrap().pending == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "the outbox never drained");
        }
    })
}

/// A sink that publishes through Kafka until `hold` is set; a publish after that reaches
/// the broker and then never returns, so its relay is stuck holding its claim
/// (published, not recorded). The ids it held are kept, and `stuck` is told; so is
/// every id it began to publish.
struct Stalling {
    inner: Arc<KafkaSink>,
    hold: Arc<AtomicBool>,
    stuck: Arc<tokio::sync::Notify>,
    held: Arc<Mutex<Vec<String>>>,
    started: Arc<Mutex<HashSet<String>>>,
}

impl Sink for Stalling {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        self.started.lock().unwrap().insert(message.id.clone());
        let out = self.inner.publish(message).await;
        if self.hold.load(Ordering::SeqCst) && out.is_ok() {
            self.held.lock().unwrap().push(message.id.clone());
            self.stuck.notify_one();
            std::future::pending::<()>().await;
        }
        out
    }
}

/// Four relays (each its own pool and producer) race over 2,000 events of 100 entities
/// on PostgreSQL, claiming by lease, into a topic of 4 partitions. One relay is dropped
/// after 300 ms, stuck after publishing, holding a claim on events the broker already
/// acknowledged: the others publish them again once its lease runs out. Read back by an
/// independent consumer: every record's key is its entity and one entity's records share
/// a partition; every event is there, each entity's first copies in version order; each
/// event the dropped relay held is there twice (a republish is a new record: the
/// consumer dedupes by `Orderly-Id`), every record there twice is one the dropped relay
/// began to publish (the rest of its batch), and none is there three times (the
/// idempotent producer's own retries add none).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Kafka-protocol broker; .ci/run runs it"]
async fn four_relays_publish_2000_events_in_order_per_entity() {
    let (entities, per_entity) = (100, 20);
    let admin = PgConnectOptions::from_str(&server::url(
        "ORDERLY_PG_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    ))
    .unwrap();
    let name = server::unique_db_name();
    let mut conn = admin.connect().await.expect("PostgreSQL is reachable");
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let options = admin.clone().database(&name);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await
        .unwrap();
    orderly::backend::postgres::migrate(&pool).await.unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(server::in_schema(&sql)))
            .execute(&pool)
            .await
            .unwrap();
    }
    let topic = topic(4);
    let (hold, stuck, held, started) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(HashSet::new())),
    );
    let mut relays = Vec::new();
    for n in 0..4 {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .unwrap();
        let store = PgStore::new(pool, orderly::Tables::new("orders").unwrap());
        // The producer gives up on a record within the relay's publish timeout.
        let sink = KafkaSink::connect_with(&brokers(), &topic, [("message.timeout.ms", "1000")])
            .await
            .expect("the Kafka broker is reachable");
        let config = config(16).claim(Claim::Lease).lease(Duration::from_secs(3));
        let config = config.publish_timeout(Duration::from_millis(1500));
        let task = if n == 0 {
            let sink = Stalling {
                inner: Arc::new(sink),
                hold: hold.clone(),
                stuck: stuck.clone(),
                held: held.clone(),
                started: started.clone(),
            };
            drain(Relay::new(store, sink).with_config(config).unwrap())
        } else {
            drain(Relay::new(store, sink).with_config(config).unwrap())
        };
        relays.push(task);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(60), stuck.notified())
        .await
        .expect("the first relay published nothing after 300 ms");
    let dropped = relays.remove(0);
    dropped.abort();
    assert!(
        dropped.await.is_err_and(|e| e.is_cancelled()),
        "the dropped relay ended on its own"
    );
    for relay in relays {
        relay.await.unwrap();
    }
    let outbox = Outbox::new(PgStore::new(
        pool.clone(),
        orderly::Tables::new("orders").unwrap(),
    ));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));

    let held: HashSet<String> = held.lock().unwrap().iter().cloned().collect();
    let records = records(&topic, (entities * per_entity) as usize + held.len());
    let versions = by_entity(&records);
    assert!(!held.is_empty(), "the dropped relay held nothing");
    let copies = copies_of(&records);
    let twice: HashSet<String> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id.to_string())
        .collect();
    assert!(copies.values().all(|n| *n <= 2), "a record thrice");
    assert!(held.is_subset(&twice), "each held event is there twice");
    let started = started.lock().unwrap().clone();
    assert!(
        twice.is_subset(&started),
        "a record twice that the dropped relay never began: {:?}",
        twice.difference(&started).collect::<Vec<_>>()
    );
    assert_firsts_in_order(&versions, entities, per_entity);
    assert_eq!(
        records.len(),
        (entities * per_entity) as usize + twice.len(),
        "every event, the dropped relay's twice"
    );
    pool.close().await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)")))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// A record the producer refuses for good (its body past `message.max.bytes`) is set
/// aside dead at its first try, with the reason, and parks its entity: that entity's
/// later events are not published past it (no 2, 3 before 1), while every other
/// entity's go out whole. The sink's headers carry the event's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kafka-protocol broker; .ci/run runs it"]
async fn an_oversized_record_parks_its_entity() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::demo(&format!("sqlite://{}", dir.path().join("o.db").display()))
        .await
        .unwrap();
    for sql in seed_sql(3, 3) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .unwrap();
    }
    // Entity 2's second event: a 50 KB body, past the producer's 20,000 bytes.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "UPDATE orderly_outbox SET body = '\"{}\"' WHERE entity_id = 2 AND version = 2",
        "x".repeat(50_000)
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let topic = topic(2);
    let sink = KafkaSink::connect_with(&brokers(), &topic, [("message.max.bytes", "20000")])
        .await
        .expect("the Kafka broker is reachable");
    assert_eq!(sink.max_message_bytes(), Some(20_000));
    let relay = Relay::new(store.clone(), sink)
        .with_config(config(8).max_attempts(5))
        .unwrap();
    let mut dead = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let round = relay.relay_once().await.unwrap();
        dead += round.dead;
        if round.claimed == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the relay never went quiet");
    }
    assert_eq!(dead, 1, "the oversized record, dead at its first try");
    let (status, attempts, error): (String, i64, String) = sqlx::query_as(
        "SELECT status, attempts, last_error FROM orderly_outbox WHERE entity_id = 2 AND version = 2",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!((status.as_str(), attempts), ("DEAD", 1), "{error}");
    assert!(error.contains("refuses the record"), "{error}");
    let stats = Outbox::new(store.clone()).stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead),
        (1, 1),
        "entity 2's third waits"
    );

    let records = records(&topic, 7);
    let versions = by_entity(&records);
    assert_eq!(versions.get(&1), Some(&vec![1, 2, 3]));
    assert_eq!(versions.get(&3), Some(&vec![1, 2, 3]));
    assert_eq!(
        versions.get(&2),
        Some(&vec![1]),
        "nothing past the dead one"
    );
    let first = records.iter().find(|r| r.entity() == 1).unwrap();
    for (name, value) in [
        ("Orderly-Machine", "OrderMachine"),
        ("Orderly-Event", "OrderPaid"),
        ("Orderly-Transition", "Pay"),
        ("Orderly-From", "Created"),
        ("Orderly-To", "Paid"),
        ("Orderly-Ref", "r-1-1"),
        ("traceparent", traceparent(1, 1).as_str()),
    ] {
        assert_eq!(first.headers[name], value, "{first:?}");
    }
    assert!(first.value_len > 0, "the body is the record's value");
}

/// A topic name Kafka does not allow and a setting of the sink's own are refused when the
/// sink is made; a topic the broker does not have and brokers that cannot be reached are
/// errors to retry when it connects (no topic is created), not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kafka-protocol broker; .ci/run runs it"]
async fn bad_topics_and_unreachable_brokers_are_errors() {
    for bad in ["", ".", "..", "a b", "ü", &"t".repeat(250)] {
        let e = KafkaSink::connect(&brokers(), bad).await.unwrap_err();
        assert!(e.permanent, "{bad:?}: {e}");
    }
    for pinned in [
        "acks",
        "enable.idempotence",
        "partitioner",
        "transactional.id",
    ] {
        let e = KafkaSink::connect_with(&brokers(), "orders", [(pinned, "x")])
            .await
            .unwrap_err();
        assert!(e.permanent && e.message.contains(pinned), "{e}");
    }
    let missing = format!("o{}", server::unique_db_name());
    let e = KafkaSink::connect(&brokers(), &missing).await.unwrap_err();
    assert!(!e.permanent && e.message.contains("no topic"), "{e}");
    // Asked for, it was not created.
    let again = KafkaSink::connect(&brokers(), &missing).await.unwrap_err();
    assert!(again.message.contains("no topic"), "{again}");
    let started = Instant::now();
    let e = KafkaSink::connect("127.0.0.1:1", "orders")
        .await
        .unwrap_err();
    assert!(!e.permanent, "{e}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// The child process of [`a_relay_killed_with_sigkill_another_finishes`]: a relay over
/// the SQLite file `db` publishing to `topic`, run until it is killed.
const CHILD: &str = "ORDERLY_KAFKA_RELAY_CHILD";

async fn relay_child(spec: &str) {
    let (db, topic) = spec.split_once('|').unwrap();
    let store = SqliteStore::demo(&format!("sqlite://{db}")).await.unwrap();
    let sink = KafkaSink::connect_with(&brokers(), topic, [("message.timeout.ms", "1000")])
        .await
        .unwrap();
    let relay = Relay::new(store, Slow(sink))
        .with_config(
            config(16)
                .claim(Claim::Lease)
                .lease(Duration::from_secs(3))
                .publish_timeout(Duration::from_millis(1500)),
        )
        .unwrap();
    loop {
        relay.relay_once().await.unwrap();
    }
}

/// A sink that waits 30 ms after each publish before it answers: its relay holds its
/// claim most of the time, so a kill finds events published and not recorded.
struct Slow(KafkaSink);

impl Sink for Slow {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let out = self.0.publish(message).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        out
    }
}

/// A relay process publishing 1,000 events of 50 entities from SQLite is killed with
/// SIGKILL part-way (after at least 200 were recorded published, with events still
/// pending and some claimed by it); a relay in this process finishes once the dead one's
/// leases run out. Read back by the independent consumer: every event is there, each
/// entity's first copies in version order, none three times, and every record there
/// twice is one the killed relay held claimed when it died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Kafka-protocol broker; .ci/run runs it"]
async fn a_relay_killed_with_sigkill_another_finishes() {
    if let Ok(spec) = std::env::var(CHILD) {
        return relay_child(&spec).await;
    }
    let (entities, per_entity) = (50, 20);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    let store = SqliteStore::demo(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let topic = topic(3);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_relay_killed_with_sigkill_another_finishes",
            "--exact",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{}|{topic}", db.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let count = |sql: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while count("SELECT count(*) FROM orderly_outbox WHERE status = 'PUBLISHED'").await < 200
        || count(
            "SELECT count(*) FROM orderly_outbox WHERE status = 'PENDING' AND owner_token IS NOT NULL",
        )
        .await
            == 0
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        assert!(Instant::now() < deadline, "the child published too little");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let pending = count("SELECT count(*) FROM orderly_outbox WHERE status = 'PENDING'").await;
    assert!(pending > 0, "the child had finished before it was killed");
    let held: HashSet<String> = sqlx::query_as::<_, (String, i64, i64)>(
        "SELECT machine, entity_id, version FROM orderly_outbox \
         WHERE status = 'PENDING' AND owner_token IS NOT NULL",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .map(|(m, e, v)| Message::id_of(&m, e, v))
    .collect();
    assert!(!held.is_empty(), "the killed relay held no claim");

    let sink = KafkaSink::connect_with(&brokers(), &topic, [("message.timeout.ms", "1000")])
        .await
        .unwrap();
    let relay = Relay::new(store.clone(), sink)
        .with_config(
            config(16)
                .claim(Claim::Lease)
                .lease(Duration::from_secs(3))
                .publish_timeout(Duration::from_millis(1500)),
        )
        .unwrap();
    drain(relay).await.unwrap();
    let stats = Outbox::new(store.clone()).stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));

    // At most every held event twice.
    let records = records(&topic, (entities * per_entity) as usize);
    let versions = by_entity(&records);
    let copies = copies_of(&records);
    assert!(copies.values().all(|n| *n <= 2), "a record thrice");
    let twice: HashSet<String> = copies
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id.to_string())
        .collect();
    eprintln!(
        "killed holding {} claims, {} pending; {} records there twice",
        held.len(),
        pending,
        twice.len()
    );
    assert!(
        twice.is_subset(&held),
        "a record twice the killed relay did not hold: {:?}",
        twice.difference(&held).collect::<Vec<_>>()
    );
    assert_firsts_in_order(&versions, entities, per_entity);
    assert_eq!(
        records.len(),
        (entities * per_entity) as usize + twice.len()
    );
}

/// Where an [`OwnBroker`] keeps its topics and records.
#[derive(Clone, Copy)]
enum Storage {
    /// In its memory: a restart starts it empty.
    Memory,
    /// In the bucket `tansu` of the S3 endpoint on this loopback port ([`OwnS3`]): a
    /// restart finds them there.
    S3(u16),
}

/// A Tansu broker of the test's own on a free loopback port, killed by pid when dropped.
struct OwnBroker {
    port: u16,
    child: std::process::Child,
}

impl OwnBroker {
    fn start(port: u16, storage: Storage) -> Self {
        Self::start_advertising(port, port, storage)
    }

    /// Listening on `port`, telling clients to connect to `advertised` (a forwarder in
    /// front of it).
    fn start_advertising(port: u16, advertised: u16, storage: Storage) -> Self {
        let out = std::process::Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/tansu.sh"))
            .arg("path")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised = format!("tcp://127.0.0.1:{advertised}");
        let mut command = std::process::Command::new(&bin);
        command.args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &advertised,
        ]);
        match storage {
            Storage::Memory => command.args(["--storage-engine", "memory://tansu/"]),
            Storage::S3(s3) => command
                .args(["--storage-engine", "s3://tansu/"])
                .env("AWS_ENDPOINT", format!("http://127.0.0.1:{s3}"))
                .env("AWS_ALLOW_HTTP", "true")
                .env("AWS_ACCESS_KEY_ID", "orderly")
                .env("AWS_SECRET_ACCESS_KEY", "orderly")
                .env("AWS_DEFAULT_REGION", "us-east-1"),
        };
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed by its Drop if it never answers.
        let broker = OwnBroker { port, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = std::process::Command::new(&bin)
                .args(["topic", "list", "--broker", &url])
                .output()
                .unwrap();
            if up.status.success() {
                return broker;
            }
            assert!(Instant::now() < deadline, "Tansu never answered on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL, and waits for it to be gone.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The broker is killed with SIGKILL while a relay publishes 600 events of 20 entities
/// from SQLite, and started again (empty: the topic is created again) 3 s later. While it
/// is down the relay records nothing published and its events wait pending, retried;
/// after, the relay (whose idempotent producer the new broker does not know) goes on by
/// itself and drains the outbox. Read back from the new broker: every event that was not
/// recorded published when the broker came back is there, each entity's first copies in
/// version order, none three times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Tansu binary (.ci/tansu.sh); .ci/run runs it"]
async fn the_relay_waits_through_a_broker_outage() {
    through_a_broker_kill(Storage::Memory).await;
}

/// The same outage, with a broker that keeps its topics and records in S3 (an endpoint of
/// the test's own): it comes back with what it acknowledged before the kill, and the
/// topic is not created again. Read back across the restart: every one of the 600 events
/// is there (those recorded published before the kill only in what the broker kept), each
/// entity's first copies in version order, and every record there twice is one whose
/// publish was tried again (its row counts more than one attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Tansu binary (.ci/tansu.sh) and moto's S3 server; .ci/run runs it"]
async fn a_broker_restarted_on_its_kept_data_loses_and_reorders_nothing() {
    let s3 = OwnS3::start();
    through_a_broker_kill(Storage::S3(s3.port)).await;
}

/// The body of the two outage tests: the broker keeps its data in `storage`.
async fn through_a_broker_kill(storage: Storage) {
    let (entities, per_entity) = (20, 30);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let broker = OwnBroker::start(port, storage);
    let brokers = broker.brokers();
    let topic = format!("o{}", server::unique_db_name());
    read_back_at(&brokers, &["create", &topic, "2"]);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::demo(&format!("sqlite://{}", dir.path().join("o.db").display()))
        .await
        .unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let sink = KafkaSink::connect_with(&brokers, &topic, [("message.timeout.ms", "1000")])
        .await
        .unwrap();
    let relay = Relay::new(store.clone(), Slow(sink))
        .with_config(
            config(4)
                .claim(Claim::Lease)
                .lease(Duration::from_secs(3))
                .publish_timeout(Duration::from_millis(1500))
                .max_backoff(Duration::from_millis(200)),
        )
        .unwrap();
    let count = |sql: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    const PUBLISHED: &str = "SELECT count(*) FROM orderly_outbox WHERE status = 'PUBLISHED'";
    let task = drain(relay);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(PUBLISHED).await < 50 {
        assert!(Instant::now() < deadline, "the relay published too little");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    broker.kill();
    // What was acknowledged before the kill is recorded once its round's other
    // publishes have timed out (1.5 s); then nothing, while events are tried again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = count(PUBLISHED).await;
    let outage = Instant::now();
    while count("SELECT count(*) FROM orderly_outbox WHERE status = 'PENDING' AND attempts >= 2")
        .await
        == 0
    {
        assert!(
            outage.elapsed() < Duration::from_secs(30),
            "no event was tried again during the outage"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        count(PUBLISHED).await,
        before,
        "recorded published with no broker"
    );
    assert!(before < entities * per_entity, "nothing left to publish");
    assert_eq!(
        count("SELECT count(*) FROM orderly_outbox WHERE status = 'DEAD'").await,
        0
    );

    let broker = OwnBroker::start(port, storage);
    if let Storage::Memory = storage {
        read_back_at(&brokers, &["create", &topic, "2"]);
    }
    let at_restart: HashSet<(i64, i64)> = sqlx::query_as::<_, (i64, i64)>(
        "SELECT entity_id, version FROM orderly_outbox WHERE status = 'PUBLISHED'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let drained = tokio::time::timeout(Duration::from_secs(60), task).await;
    if drained.is_err() {
        let errors: Vec<(String, i64, Option<String>, i64)> = sqlx::query_as(
            "SELECT status, attempts, last_error, count(*) FROM orderly_outbox \
             GROUP BY status, attempts, last_error",
        )
        .fetch_all(store.pool())
        .await
        .unwrap();
        panic!("the relay never drained after the broker came back: {errors:#?}");
    }
    drained.unwrap().unwrap();
    let stats = Outbox::new(store.clone()).stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));

    if let Storage::S3(_) = storage {
        let records = records_at(&brokers, &topic, (entities * per_entity) as usize);
        assert_firsts_in_order(&by_entity(&records), entities, per_entity);
        let twice = assert_twice_only_if_retried(&records, &retried(&store).await);
        eprintln!(
            "{} events recorded published before the kill, {twice} records there twice",
            at_restart.len()
        );
        return;
    }
    let left = (entities * per_entity) as usize - at_restart.len();
    let records = records_at(&brokers, &topic, left);
    let versions = by_entity(&records);
    let mut copies: HashMap<(i64, i64), usize> = HashMap::new();
    for r in &records {
        *copies.entry((r.entity(), r.version())).or_default() += 1;
    }
    assert!(copies.values().all(|n| *n <= 2), "a record thrice");
    for entity in 1..=entities {
        let expected: Vec<i64> = (1..=per_entity)
            .filter(|v| !at_restart.contains(&(entity, *v)))
            .collect();
        let mut seen = HashSet::new();
        let firsts: Vec<i64> = versions
            .get(&entity)
            .map(|vs| vs.iter().copied().filter(|v| seen.insert(*v)).collect())
            .unwrap_or_default();
        // An event whose acknowledgement the kill cut was recorded pending and is
        // published again: it may be there although the old broker had it too.
        let firsts: Vec<i64> = firsts
            .into_iter()
            .filter(|v| !at_restart.contains(&(entity, *v)))
            .collect();
        assert_eq!(firsts, expected, "entity {entity} after the restart");
    }
    drop(broker);
}

/// An S3 endpoint of the test's own on a free loopback port (moto's server, from PyPI; it
/// keeps its objects in its memory, so they outlive a broker, not it) with the bucket
/// `tansu`; killed by pid when dropped.
struct OwnS3 {
    port: u16,
    child: std::process::Child,
}

impl OwnS3 {
    fn start() -> Self {
        let port = free_port();
        let child = std::process::Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs");
        let s3 = OwnS3 { port, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match s3.put("/tansu") {
                Ok(status) => {
                    assert!(status.contains(" 200 "), "creating the bucket: {status}");
                    return s3;
                }
                Err(e) => assert!(Instant::now() < deadline, "moto never answered: {e}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An empty `PUT` of `path`; the answer's status line.
    fn put(&self, path: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port))?;
        write!(
            stream,
            "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer.lines().next().unwrap_or_default().to_string())
    }
}

impl Drop for OwnS3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP forwarder on loopback in front of a broker, which cuts every connection through
/// it when told (both sockets dropped: the client's request, or its answer, is lost
/// half-way).
struct Cutter {
    live: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Cutter {
    /// A forwarder to `upstream`, on the free port `port`.
    async fn start(port: u16, upstream: u16) -> Cutter {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let live: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let live = live.clone();
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let task = tokio::spawn(async move {
                        if let Ok(mut server) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    live.lock().unwrap().push(task);
                }
            }
        });
        Cutter { live, accept }
    }

    /// Cuts every connection open now: how many were.
    fn cut(&self) -> usize {
        let mut live = self.live.lock().unwrap();
        let open = live.iter().filter(|t| !t.is_finished()).count();
        for task in live.drain(..) {
            task.abort();
        }
        open
    }
}

impl Drop for Cutter {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every connection to the broker is cut every 250 ms while a relay publishes 600 events
/// of 20 entities from SQLite (through a forwarder the broker advertises, so the producer
/// reconnects through it). Read back once the relay drained the outbox: every event is
/// there, each entity's first copies in version order, and every record there twice is
/// one whose publish was tried again (its row counts more than one attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Tansu binary (.ci/tansu.sh); .ci/run runs it"]
async fn cut_connections_lose_and_reorder_nothing() {
    let (entities, per_entity) = (20, 30);
    let (broker_port, cutter_port) = (free_port(), free_port());
    let cutter = Cutter::start(cutter_port, broker_port).await;
    let _broker = OwnBroker::start_advertising(broker_port, cutter_port, Storage::Memory);
    let brokers = format!("127.0.0.1:{cutter_port}");
    let topic = format!("o{}", server::unique_db_name());
    read_back_at(&brokers, &["create", &topic, "2"]);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::demo(&format!("sqlite://{}", dir.path().join("o.db").display()))
        .await
        .unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let sink = KafkaSink::connect_with(&brokers, &topic, [("message.timeout.ms", "1000")])
        .await
        .unwrap();
    let relay = Relay::new(store.clone(), sink)
        .with_config(
            config(8)
                .claim(Claim::Lease)
                .lease(Duration::from_secs(3))
                .publish_timeout(Duration::from_millis(1500))
                .max_backoff(Duration::from_millis(200)),
        )
        .unwrap();
    let task = drain(relay);
    let (mut cuts, mut open_at_cut) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(180);
    while !task.is_finished() {
        assert!(Instant::now() < deadline, "the relay never drained");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let open = cutter.cut();
        cuts += 1;
        open_at_cut += open;
    }
    task.await.unwrap();
    assert!(
        cuts >= 4 && open_at_cut >= 4,
        "{cuts} cuts found {open_at_cut} connections open: nothing was cut mid-publish"
    );
    let retried = retried(&store).await;
    let stats = Outbox::new(store.clone()).stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));

    let records = records_at(&brokers, &topic, (entities * per_entity) as usize);
    let twice = assert_twice_only_if_retried(&records, &retried);
    eprintln!(
        "{cuts} cuts ({open_at_cut} connections cut), {} events tried again, {twice} records there more than once",
        retried.len(),
    );
    let versions = by_entity(&records);
    assert_firsts_in_order(&versions, entities, per_entity);
}
