//! The outbox relay to a real NATS JetStream (`ORDERLY_NATS_URL`, default
//! `nats://127.0.0.1:4222`, started with `-js`) and, for the outage, a nats-server of the
//! test's own that it kills by pid. A broker that cannot be reached fails these tests;
//! they never skip. Opt-in (`--include-ignored`): `.ci/run` runs them.

mod server;

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use orderly::outbox::{Message, NatsSink, Outbox, Relay, RelayConfig, Sink};
use orderly::{PgStore, SqliteStore};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions};

fn nats_url() -> String {
    server::url("ORDERLY_NATS_URL", "nats://127.0.0.1:4222")
}

/// A stream of its own capturing `{prefix}.>`, with a two-minute duplicate window.
async fn stream_for(js: &jetstream::Context, prefix: &str) -> stream::Stream {
    js.get_or_create_stream(stream::Config {
        name: prefix.to_string(),
        subjects: vec![format!("{prefix}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .expect("the JetStream of these tests accepts a stream")
}

async fn connect(url: &str) -> jetstream::Context {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("NATS at {url} is required for this suite: {e}"));
    jetstream::new(client)
}

/// Every message of the stream, in stream order: `(entity, version)`.
async fn stream_events(stream: &mut stream::Stream) -> Vec<(i64, i64)> {
    let count = stream.info().await.unwrap().state.messages;
    let mut events = Vec::new();
    for seq in 1..=count {
        let m = stream.get_raw_message(seq).await.unwrap();
        let header = |name: &str| -> i64 {
            m.headers
                .get(name)
                .unwrap_or_else(|| panic!("no {name} header"))
                .as_str()
                .parse()
                .unwrap()
        };
        events.push((header("Orderly-Entity"), header("Orderly-Version")));
    }
    events
}

/// The inserts of `per_entity` events for each of `entities` entities, written straight
/// to the outbox.
fn seed_sql(entities: i64, per_entity: i64) -> Vec<String> {
    let mut rows = Vec::new();
    for entity in 1..=entities {
        for version in 1..=per_entity {
            rows.push(format!(
                "('OrderMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', 'Paid', 'r-{entity}-{version}')"
            ));
        }
    }
    rows.chunks(1000)
        .map(|chunk| {
            format!(
                "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
                 VALUES {}",
                chunk.join(", ")
            )
        })
        .collect()
}

/// Asserts that `events` holds each of `entities` × `per_entity` events once, each
/// entity's in version order.
fn assert_in_order(events: &[(i64, i64)], entities: i64, per_entity: i64) {
    assert_eq!(
        events.len() as i64,
        entities * per_entity,
        "each event once in the stream"
    );
    let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
    for (entity, version) in events {
        seen.entry(*entity).or_default().push(*version);
    }
    for entity in 1..=entities {
        assert_eq!(
            seen.get(&entity),
            Some(&(1..=per_entity).collect::<Vec<_>>()),
            "entity {entity}'s events as the stream holds them"
        );
    }
}

fn config(batch: u32) -> RelayConfig {
    RelayConfig {
        batch,
        lease: Duration::from_secs(5),
        publish_timeout: Duration::from_secs(2),
        max_attempts: 1000,
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(500),
        idle: Duration::from_millis(20),
    }
}

/// Eight relays (each its own pool and NATS connection) race over 10,000 events of 200
/// entities on PostgreSQL: the stream holds every event once, each entity's in version
/// order, and the outbox ends with everything published. One relay is dropped after
/// 300 ms (what it held then is published by the others once its lease runs out; a
/// message the stream had already taken is dropped by its duplicate window, so the exact
/// count shows none was stored twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs NATS with JetStream; .ci/run runs it"]
async fn eight_relays_publish_10000_events_in_order() {
    let (entities, per_entity) = (200, 50);
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
    orderly::store::postgres::migrate(&pool).await.unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }

    let prefix = format!("o{name}");
    let js = connect(&nats_url()).await;
    let mut stream = stream_for(&js, &prefix).await;
    let mut relays = Vec::new();
    for _ in 0..8 {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .unwrap();
        let sink = NatsSink::connect(&nats_url(), &prefix).await.unwrap();
        let relay = Relay::new(PgStore::new(pool), sink)
            .with_config(config(32))
            .unwrap();
        relays.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let round = relay.relay_once().await.unwrap();
                if round.claimed == 0 && relay.outbox().stats().await.unwrap().pending == 0 {
                    return;
                }
                assert!(Instant::now() < deadline, "the outbox never drained");
            }
        }));
    }
    // One relay dropped part-way: whatever it held is published by the others once its
    // lease runs out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    relays[0].abort();
    for relay in relays.drain(1..) {
        relay.await.unwrap();
    }
    let outbox = Outbox::new(PgStore::new(pool.clone()));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
    let events = stream_events(&mut stream).await;
    assert_in_order(&events, entities, per_entity);
    js.delete_stream(&prefix).await.unwrap();
    pool.close().await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)")))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// A message published twice (a relay that died between publish and mark) is stored
/// once: its id is the stream's `Nats-Msg-Id`. Headers carry the event's fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs NATS with JetStream; .ci/run runs it"]
async fn a_republished_event_is_stored_once() {
    let prefix = format!("o{}", server::unique_db_name());
    let js = connect(&nats_url()).await;
    let mut stream = stream_for(&js, &prefix).await;
    let sink = NatsSink::connect(&nats_url(), &prefix).await.unwrap();
    let message = Message {
        id: Message::id_of("OrderMachine", 7, 3),
        machine: "OrderMachine".into(),
        event: "OrderPaid".into(),
        transition: "Pay".into(),
        entity_id: 7,
        version: 3,
        from: "Created".into(),
        to: "Paid".into(),
        ref_id: "pay-7".into(),
        body: "{}".into(),
    };
    sink.publish(&message).await.unwrap();
    sink.publish(&message).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    let stored = stream.get_raw_message(1).await.unwrap();
    assert_eq!(
        stored.subject.as_str(),
        format!("{prefix}.OrderMachine.OrderPaid")
    );
    for (name, want) in [
        ("Nats-Msg-Id", "OrderMachine:7:3"),
        ("Orderly-Machine", "OrderMachine"),
        ("Orderly-Event", "OrderPaid"),
        ("Orderly-From", "Created"),
        ("Orderly-To", "Paid"),
        ("Orderly-Ref", "pay-7"),
        ("Orderly-Version", "3"),
    ] {
        assert_eq!(
            stored.headers.get(name).map(|v| v.as_str()),
            Some(want),
            "{name}"
        );
    }
    // A value read from the database that a header cannot carry is refused for good,
    // never a panic.
    let broken = Message {
        ref_id: "pay\r\n7".into(),
        id: Message::id_of("OrderMachine", 7, 4),
        version: 4,
        ..message.clone()
    };
    let refused = sink.publish(&broken).await.unwrap_err();
    assert!(refused.permanent, "{refused:?}");
    let dotted = Message {
        event: "Order.Paid".into(),
        ..message.clone()
    };
    assert!(sink.publish(&dotted).await.unwrap_err().permanent);
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    assert!(NatsSink::new(js.clone(), "bad prefix").is_err());
    assert!(NatsSink::new(js.clone(), "a.>").is_err());
    js.delete_stream(&prefix).await.unwrap();
}

/// A nats-server of the test's own, killed (SIGKILL, by pid) while a relay publishes:
/// the events wait in the outbox (pending, none dead), nothing is lost, and once the
/// server is back (same port, same store) publishing resumes and the stream holds every
/// event once, in order per entity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server; .ci/run runs it"]
async fn the_relay_waits_through_a_broker_outage() {
    let (entities, per_entity) = (5, 40);
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let start = || {
        std::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("js"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server is installed")
    };
    let url = format!("nats://127.0.0.1:{port}");
    let mut broker = start();
    assert!(
        server::eventually(Duration::from_secs(10), || async {
            async_nats::connect(&url).await.is_ok()
        })
        .await,
        "the test's own nats-server did not start"
    );
    let db = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let store = SqliteStore::connect(&db).await.unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let prefix = "outage";
    let js = connect(&url).await;
    stream_for(&js, prefix).await;
    let sink = NatsSink::connect(&url, prefix).await.unwrap();
    // One event per entity per round, a round every 20 ms at most: the outage lands in
    // the middle of the work.
    let relay = Relay::new(store.clone(), sink)
        .with_config(RelayConfig {
            publish_timeout: Duration::from_millis(500),
            lease: Duration::from_secs(2),
            ..config(entities as u32)
        })
        .unwrap();
    let outbox = relay.outbox().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                stopped.await.ok();
            })
            .await
    });
    assert!(
        server::eventually(Duration::from_secs(30), || async {
            outbox.stats().await.unwrap().pending < (entities * per_entity - 20) as u64
        })
        .await,
        "the relay published nothing"
    );
    broker.kill().unwrap(); // SIGKILL, this test's own server only
    broker.wait().unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = outbox.stats().await.unwrap();
    assert!(
        waiting.pending > 0,
        "everything was published before the outage: {waiting:?}"
    );
    assert_eq!(waiting.dead, 0);
    let stalled = outbox.stats().await.unwrap().pending;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        outbox.stats().await.unwrap().pending,
        stalled,
        "published with the broker down"
    );

    let mut broker = start();
    assert!(
        server::eventually(Duration::from_secs(60), || async {
            outbox.stats().await.unwrap().pending == 0
        })
        .await,
        "publishing did not resume: {:?}",
        outbox.stats().await.unwrap()
    );
    stop.send(()).unwrap();
    let total = running.await.unwrap().unwrap();
    assert!(
        total.retried > 0,
        "no publish failed during the outage: {total:?}"
    );
    let js = connect(&url).await;
    let mut stream = js.get_stream(prefix).await.unwrap();
    let events = stream_events(&mut stream).await;
    assert_in_order(&events, entities, per_entity);
    broker.kill().unwrap();
    broker.wait().unwrap();
}
