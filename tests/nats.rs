//! The outbox relay to a real NATS JetStream (`ORDERLY_NATS_URL`, default
//! `nats://127.0.0.1:4222`, started with `-js`) and, for the outage, a nats-server of the
//! test's own that it kills by pid. A broker that cannot be reached fails these tests;
//! they never skip. Opt-in (`--include-ignored`): `.ci/run` runs them.

mod server;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use orderly::outbox::{Claim, Message, NatsSink, Outbox, Relay, RelayConfig, Sink, SinkError};
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
                "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
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

/// Runs `relay` until the outbox is drained.
fn drain<K: Sink>(relay: Relay<PgStore, K>) -> tokio::task::JoinHandle<()> {
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

/// [`config`], claiming by lease.
fn leased(batch: u32) -> RelayConfig {
    config(batch).claim(Claim::Lease)
}

fn config(batch: u32) -> RelayConfig {
    RelayConfig::default()
        .batch(batch)
        .lease(Duration::from_secs(5))
        .publish_timeout(Duration::from_secs(2))
        .max_attempts(1000)
        .min_backoff(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(500))
        .idle(Duration::from_millis(20))
}

/// A sink that publishes through NATS until `hold` is set; a publish after that reaches
/// the stream and then never returns, so its relay is stuck holding its claim (published,
/// not recorded). The ids it held are kept, and `stuck` is told.
struct Stalling {
    inner: NatsSink,
    hold: Arc<AtomicBool>,
    stuck: Arc<tokio::sync::Notify>,
    held: Arc<Mutex<Vec<String>>>,
}

impl Sink for Stalling {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let out = self.inner.publish(message).await;
        if self.hold.load(Ordering::SeqCst) {
            self.held.lock().unwrap().push(message.id.clone());
            self.stuck.notify_one();
            std::future::pending::<()>().await;
        }
        out
    }

    fn max_message_bytes(&self) -> Option<usize> {
        self.inner.max_message_bytes()
    }
}

/// Eight relays (each its own pool and NATS connection) race over 10,000 events of 200
/// entities on PostgreSQL: the stream holds every event once, each entity's in version
/// order, and the outbox ends with everything published. One relay is dropped after
/// 300 ms, mid-publish, holding a claim on events the stream already took: the others
/// publish them again once its lease runs out (each was claimed twice), and the stream's
/// duplicate window drops them, so the exact count shows none was stored twice. The
/// relays claim by lease, whose takeover this shows (a claim by lock is released with its
/// connection: the conformance suite's locked-relay tests).
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
    orderly::backend::postgres::migrate(&pool).await.unwrap();
    for sql in seed_sql(entities, per_entity) {
        sqlx::raw_sql(AssertSqlSafe(server::in_schema(&sql)))
            .execute(&pool)
            .await
            .unwrap();
    }

    let prefix = format!("o{name}");
    let js = connect(&nats_url()).await;
    let mut stream = stream_for(&js, &prefix).await;
    let (hold, stuck, held) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(Mutex::new(Vec::new())),
    );
    let mut relays = Vec::new();
    for n in 0..8 {
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .unwrap();
        let store = PgStore::new(pool, orderly::Tables::new("orders").unwrap());
        let sink = NatsSink::connect(&nats_url(), &prefix).await.unwrap();
        let task = if n == 0 {
            let sink = Stalling {
                inner: sink,
                hold: hold.clone(),
                stuck: stuck.clone(),
                held: held.clone(),
            };
            drain(Relay::new(store, sink).with_config(leased(32)).unwrap())
        } else {
            drain(Relay::new(store, sink).with_config(leased(32)).unwrap())
        };
        relays.push(task);
    }
    // One relay dropped part-way, stuck in a publish (its claim held): whatever it held
    // is published by the others once its lease runs out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(60), stuck.notified())
        .await
        .expect("the first relay published nothing after 300 ms");
    let dropped = relays.remove(0);
    dropped.abort();
    let ended = dropped.await;
    assert!(
        ended.as_ref().is_err_and(|e| e.is_cancelled()),
        "the dropped relay ended on its own: {ended:?}"
    );
    let held = held.lock().unwrap().clone();
    let held_keys = held
        .iter()
        .map(|id| {
            let (_, rest) = id.split_once(':').unwrap();
            format!("({})", rest.replace(':', ", "))
        })
        .collect::<Vec<_>>()
        .join(", ");
    // Claimed by the dropped relay and not recorded: still pending under its claim.
    let still_held: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM orderly.outbox WHERE status = 'PENDING' AND owner_token IS NOT NULL \
         AND (entity_id, version) IN ({held_keys})"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(still_held > 0, "the dropped relay held no claim: {held:?}");
    for relay in relays {
        relay.await.unwrap();
    }
    let outbox = Outbox::new(PgStore::new(
        pool.clone(),
        orderly::Tables::new("orders").unwrap(),
    ));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
    let events = stream_events(&mut stream).await;
    assert_in_order(&events, entities, per_entity);
    // What the dropped relay held was taken over: claimed again by another relay.
    let taken_over: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM orderly.outbox WHERE status = 'PUBLISHED' AND attempts >= 2 \
         AND (entity_id, version) IN ({held_keys})"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        taken_over,
        held.len() as i64,
        "the dropped relay's claims were not taken over: {held:?}"
    );
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
        trace: Some(
            orderly::TraceContext::parse(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Some("vendor=v1"),
            )
            .unwrap(),
        ),
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
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        ("tracestate", "vendor=v1"),
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
    let store = SqliteStore::demo(&db).await.unwrap();
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
        .with_config(
            config(entities as u32)
                .publish_timeout(Duration::from_millis(500))
                .lease(Duration::from_secs(2)),
        )
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

orderly::state_machine! {
    /// A payment, for the body-size test.
    pub PaymentMachine {
        states: PaymentState { Pending, Settled }
        events: PaymentEvent { Settle }
        initial: Pending;
        terminal: [Settled];
        transitions: {
            Pending + Settle => Settled emits PaymentSettled,
        }
    }
}

/// The sink states the server's limit (`max_payload`, 1 MiB on a default server), and an
/// engine whose `max_event_body` is set from it (less room for the headers) refuses a
/// larger body when it is written (nothing written) and writes one of the largest size it
/// allows, which the relay publishes to the stream: it does not go dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs NATS with JetStream; .ci/run runs it"]
async fn event_bodies_fit_the_servers_max_payload() {
    let prefix = format!("o{}", server::unique_db_name());
    let js = connect(&nats_url()).await;
    let mut stream = stream_for(&js, &prefix).await;
    let sink = NatsSink::connect(&nats_url(), &prefix).await.unwrap();
    let max = sink
        .max_message_bytes()
        .expect("the server announced max_payload");
    assert_eq!(max, 1 << 20, "a default server's max_payload");
    let max_event_body = max - 16 * 1024;
    assert_eq!(max_event_body, orderly::DEFAULT_MAX_EVENT_BODY);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::demo(&format!("sqlite://{}", dir.path().join("o.db").display()))
        .await
        .unwrap();
    let engine = orderly::Engine::<PaymentMachine, _>::with_config(
        store.clone(),
        orderly::EngineConfig::default().max_event_body(max_event_body),
    )
    .unwrap();
    // A JSON string of n bytes: n - 2 characters between its quotes.
    let body_of = |n: usize| "x".repeat(n - 2);
    engine.create(1).await.unwrap();
    let refused = engine
        .transition(1, PaymentEvent::Settle, "s-1")
        .event_body(&body_of(max_event_body + 1))
        .await;
    assert!(
        matches!(refused, Err(orderly::Error::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(engine.get(1).await.unwrap().version, 0, "nothing written");
    engine
        .transition(1, PaymentEvent::Settle, "s-1")
        .event_body(&body_of(max_event_body))
        .await
        .unwrap();
    let relay = Relay::new(store, sink)
        .with_config(RelayConfig::default().max_attempts(1))
        .unwrap();
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.published, round.dead), (1, 0), "{round:?}");
    let stored = stream.get_raw_message(1).await.unwrap();
    assert_eq!(stored.payload.len(), max_event_body);
    assert_eq!(stream.info().await.unwrap().state.messages, 1);
    js.delete_stream(&prefix).await.unwrap();
}
