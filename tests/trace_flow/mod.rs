//! A payment's trace end to end through the outbox, on a real broker: a request span, the
//! transition under it (which stores its context with the event), a relay process that
//! publishes part of the events and is killed with SIGKILL, a relay in this process that
//! publishes the rest (each publish a PRODUCER span, a child of the stored context,
//! linked to its round's span), the broker, and a consumer whose work (a transition of
//! another engine) runs in `consume_span` (a CONSUMER span, a child of the message's
//! context). Every span is recorded by OpenTelemetry's in-memory exporter and checked:
//! one trace per payment, each span's parent the one before it. Included by the NATS,
//! RabbitMQ and Kafka suites, each with its own sink and its own read-back.

use std::collections::{HashMap, HashSet};
use std::future::IntoFuture;
use std::path::Path;
use std::time::{Duration, Instant};

use opentelemetry::trace::{SpanId, SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use orderly::outbox::{Claim, Message, Relay, RelayConfig, Sink, SinkError, consume_span};
use orderly::{Engine, Outcome, SqliteStore};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

orderly::state_machine! {
    /// The shop's side: a payment emits `OrderPaid`.
    pub TraceOrder {
        states: TraceOrderState { Created, Paid }
        events: TraceOrderEvent { Pay }
        initial: Created;
        terminal: [Paid];
        transitions: {
            Created + Pay => Paid emits OrderPaid,
        }
    }
}

orderly::state_machine! {
    /// The consumer's side: the warehouse picks a paid order.
    pub TracePick {
        states: TracePickState { Waiting, Picking }
        events: TracePickEvent { Pick }
        initial: Waiting;
        terminal: [Picking];
        transitions: {
            Waiting + Pick => Picking,
        }
    }
}

/// The payments, one event each.
pub const PAYMENTS: i64 = 60;

/// How far apart the entities of the suite's tests are (they share one process and its
/// subscriber: each test's entities, and so its message ids, are its own).
pub const SPAN: i64 = 1000;

/// The environment variable that makes a suite's test binary the relay child: the
/// SQLite file, `|`, and what the suite's child needs to reach its broker.
pub const CHILD: &str = "ORDERLY_TRACE_RELAY_CHILD";

/// One message as the suite's consumer read it from the broker.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Its message id (`{machine}:{entity}:{version}`).
    pub id: String,
    /// Its `traceparent` header, if it had one.
    pub traceparent: Option<String>,
    /// Its `tracestate` header, if it had one.
    pub tracestate: Option<String>,
}

/// A sink that waits 30 ms after each publish before it answers: the child holds its
/// claim most of the time, so a kill finds events published and not recorded.
struct Slow<K>(K);

impl<K: Sink> Sink for Slow<K> {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let out = self.0.publish(message).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        out
    }
}

/// The relay child: a slow relay over the SQLite file `db` publishing through `sink`,
/// until it is killed. It records no spans (no OpenTelemetry layer here, as in a relay
/// process whose spans die with it): its messages carry the stored contexts.
pub async fn child_relay<K: Sink>(db: &str, sink: K) {
    let store = SqliteStore::demo(&format!("sqlite://{db}")).await.unwrap();
    let relay = Relay::new(store, Slow(sink))
        .with_config(relay_config().batch(8))
        .unwrap();
    loop {
        relay.relay_once().await.unwrap();
    }
}

fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .claim(Claim::Lease)
        .lease(Duration::from_secs(2))
        .publish_timeout(Duration::from_millis(900))
        .min_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(50))
}

/// The process's subscriber, installed by the first test that asks: every span recorded
/// by OpenTelemetry's in-memory exporter. Global, as an application installs it: with a
/// subscriber of one thread only (`set_default`), a span whose child ends on another
/// thread (a connection worker's) is never told its child ended, and never ends itself.
/// The suite's tests share it; each looks at its own spans.
fn traced() -> (SdkTracerProvider, InMemorySpanExporter) {
    static TRACED: std::sync::OnceLock<(SdkTracerProvider, InMemorySpanExporter)> =
        std::sync::OnceLock::new();
    TRACED
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let tracer = provider.tracer("orderly-trace-test");
            let subscriber = tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(tracer));
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other subscriber in the trace suite");
            (provider, exporter)
        })
        .clone()
}

/// The attribute `key` of a span, as text.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The parent id of a `traceparent`.
fn parent_of(traceparent: &str) -> SpanId {
    SpanId::from_hex(&traceparent[36..52]).unwrap()
}

/// The whole journey (see the module's comment), on entities after `first`. `test` is
/// the calling test's name (the child is this binary running it again, with [`CHILD`]
/// set to `db|child_spec`);
/// `sink` publishes in this process; `read` returns what the broker holds once every
/// relay is done, given how many messages to expect at least.
pub async fn trace_survives_a_killed_relay<K, F, Fut>(
    first: i64,
    test: &str,
    dir: &Path,
    child_spec: &str,
    sink: K,
    read: F,
) where
    K: Sink,
    F: FnOnce(usize) -> Fut,
    Fut: std::future::Future<Output = Vec<Delivery>>,
{
    let (provider, exporter) = traced();
    let payments = first + 1..=first + PAYMENTS;
    let db = dir.join("shop.db");
    let shop = SqliteStore::demo(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let orders: Engine<TraceOrder, SqliteStore> = Engine::new(shop.clone()).unwrap();
    // Each payment in a request span of its own: no context is passed to the call, the
    // engine takes it from its span.
    for entity in payments.clone() {
        orders.create(entity).await.unwrap();
        let request = tracing::info_span!("request", entity);
        let out = orders
            .transition(entity, TraceOrderEvent::Pay, &format!("pay-{entity}"))
            .into_future()
            .instrument(request)
            .await
            .unwrap();
        assert!(out.is_applied());
    }
    // A payment whose stored context was mangled: published all the same, with none.
    let mangled = first + PAYMENTS + 1;
    orders.create(mangled).await.unwrap();
    orders
        .transition(mangled, TraceOrderEvent::Pay, "pay-mangled")
        .into_future()
        .instrument(tracing::info_span!("request", entity = mangled))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE orderly_outbox SET traceparent = 'not-a-traceparent' WHERE entity_id = {mangled}"
    )))
    .execute(shop.pool())
    .await
    .unwrap();

    // The relay process, killed with SIGKILL once it published some and holds claims.
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--include-ignored", "--test-threads=1"])
        .env(CHILD, format!("{}|{child_spec}", db.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let count = |sql: &'static str| {
        let pool = shop.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while count("SELECT count(*) FROM orderly_outbox WHERE status = 'PUBLISHED'").await < 10
        || count(
            "SELECT count(*) FROM orderly_outbox WHERE status = 'PENDING' AND owner_token IS NOT NULL",
        )
        .await
            == 0
    {
        assert!(child.try_wait().unwrap().is_none(), "the child exited early");
        assert!(Instant::now() < deadline, "the child published too little");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap(); // SIGKILL, the test's own child only
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");
    let by_child = count("SELECT count(*) FROM orderly_outbox WHERE status = 'PUBLISHED'").await;
    assert!(
        by_child < PAYMENTS,
        "the child published everything before it was killed"
    );

    // This process's relay publishes the rest, once the dead one's leases run out.
    let relay = Relay::new(shop.clone(), sink)
        .with_config(relay_config().batch(16))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("SELECT count(*) FROM orderly_outbox WHERE status <> 'PUBLISHED'").await > 0 {
        assert!(Instant::now() < deadline, "the relay did not finish");
        if relay.relay_once().await.unwrap().claimed == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // The consumer: each delivery's work in its consume span.
    let deliveries = read(usize::try_from(PAYMENTS + 1).unwrap()).await;
    let depot = SqliteStore::demo("sqlite::memory:").await.unwrap();
    let warehouse: Engine<TracePick, SqliteStore> = Engine::new(depot).unwrap();
    for entity in first + 1..=mangled + 1 {
        warehouse.create(entity).await.unwrap();
    }
    for d in &deliveries {
        let entity: i64 = d.id.rsplit(':').nth(1).unwrap().parse().unwrap();
        let span = consume_span(&d.id, d.traceparent.as_deref(), d.tracestate.as_deref());
        let out = warehouse
            .transition(entity, TracePickEvent::Pick, &d.id)
            .into_future()
            .instrument(span)
            .await
            .unwrap();
        assert!(matches!(
            out,
            Outcome::Applied { .. } | Outcome::Replayed { .. }
        ));
    }
    // A received context that does not read is ignored: the work runs, its span a root.
    let bad_id = format!("bad-header-{first}");
    let out = warehouse
        .transition(mangled + 1, TracePickEvent::Pick, &bad_id)
        .into_future()
        .instrument(consume_span(&bad_id, Some("00-nothing-here"), None))
        .await
        .unwrap();
    assert!(out.is_applied());

    // A span is exported once it ends, when nothing holds it: the stores' connections
    // and the engines' background tasks may hold a span of the last work they did for a
    // while, so the stores are closed and the spans read once every consume span ended
    // (or 10 s passed: the checks below then say which is missing).
    shop.pool().close().await;
    warehouse.store().pool().close().await;
    drop((warehouse, orders, relay, shop));
    let deadline = Instant::now() + Duration::from_secs(10);
    let spans = loop {
        provider.force_flush().unwrap();
        let spans = exporter.get_finished_spans().unwrap();
        let ended = spans
            .iter()
            .filter(|s| s.name == "orderly.consume")
            .filter(|s| {
                attr(s, "messaging.message.id")
                    .is_some_and(|id| id == bad_id || deliveries.iter().any(|d| d.id == id))
            })
            .count();
        if ended > deliveries.len() || Instant::now() > deadline {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let by_id: HashMap<SpanId, &SpanData> = spans
        .iter()
        .map(|s| (s.span_context.span_id(), s))
        .collect();
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);
    let rounds: HashSet<SpanId> = named("orderly.relay")
        .map(|s| s.span_context.span_id())
        .collect();
    assert!(!rounds.is_empty(), "this process's relay recorded no round");

    let ids: HashSet<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids.len() as i64,
        PAYMENTS + 1,
        "every event delivered: {ids:?}"
    );
    let (mut from_child, mut from_here) = (0, 0);
    for entity in payments {
        let request = named("request")
            .find(|s| attr(s, "entity").as_deref() == Some(&entity.to_string()))
            .unwrap_or_else(|| panic!("no request span of {entity}"));
        let trace = request.span_context.trace_id();
        let transition = named("orderly.transition")
            .find(|s| s.parent_span_id == request.span_context.span_id())
            .unwrap_or_else(|| panic!("no transition under the request of {entity}"));
        assert_eq!(transition.span_context.trace_id(), trace);
        let id = format!("TraceOrder:{entity}:1");
        for d in deliveries.iter().filter(|d| d.id == id) {
            let tp = d
                .traceparent
                .as_deref()
                .unwrap_or_else(|| panic!("{id} came with no traceparent"));
            assert_eq!(&tp[3..35], format!("{trace:032x}"), "{id}: another trace");
            let parent = parent_of(tp);
            if parent == transition.span_context.span_id() {
                // Published by the killed child, whose spans died with it: the message
                // carries the stored context, the transition's.
                from_child += 1;
            } else {
                let publish = by_id
                    .get(&parent)
                    .unwrap_or_else(|| panic!("{id}: its parent {parent:?} is no span here"));
                assert_eq!(publish.name, "orderly.publish", "{id}");
                assert_eq!(publish.span_kind, SpanKind::Producer, "{id}");
                assert_eq!(publish.span_context.trace_id(), trace, "{id}");
                assert_eq!(
                    publish.parent_span_id,
                    transition.span_context.span_id(),
                    "{id}: the publish is not the transition's child"
                );
                assert!(
                    publish
                        .links
                        .iter()
                        .any(|l| rounds.contains(&l.span_context.span_id())),
                    "{id}: the publish is not linked to its round"
                );
                from_here += 1;
            }
            let consume = named("orderly.consume")
                .find(|s| {
                    attr(s, "messaging.message.id").as_deref() == Some(id.as_str())
                        && s.parent_span_id == parent
                })
                .unwrap_or_else(|| panic!("{id}: no consume span under its message's context"));
            assert_eq!(consume.span_kind, SpanKind::Consumer);
            assert_eq!(consume.span_context.trace_id(), trace, "{id}");
            let pick = named("orderly.transition")
                .find(|s| s.parent_span_id == consume.span_context.span_id())
                .unwrap_or_else(|| panic!("{id}: the warehouse's transition is not its child"));
            assert_eq!(pick.span_context.trace_id(), trace, "{id}");
        }
    }
    assert!(
        from_child > 0 && from_here > 0,
        "both relays published: the child {from_child}, this process {from_here}"
    );
    // The mangled context: published all the same, without it: with none (by the child,
    // which records no spans), or with this process's publish span's own, which has no
    // parent from the row (its parent is local: the round).
    let mangled_id = format!("TraceOrder:{mangled}:1");
    for d in deliveries.iter().filter(|d| d.id == mangled_id) {
        if let Some(tp) = &d.traceparent {
            let publish = by_id
                .get(&parent_of(tp))
                .unwrap_or_else(|| panic!("{d:?}: not a publish span's context"));
            assert_eq!(publish.name, "orderly.publish", "{d:?}");
            assert!(
                !publish.parent_span_is_remote,
                "{d:?}: a parent from the row"
            );
        }
    }
    let bad = named("orderly.consume")
        .find(|s| attr(s, "messaging.message.id").as_deref() == Some(bad_id.as_str()))
        .unwrap();
    assert_eq!(
        bad.parent_span_id,
        SpanId::INVALID,
        "a bad header gave a parent"
    );
}
