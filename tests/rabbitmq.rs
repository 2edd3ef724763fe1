//! The outbox relay to a real RabbitMQ (`ORDERLY_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), with publisher confirms. A broker that
//! cannot be reached fails these tests; they never skip. Opt-in (`--include-ignored`):
//! `.ci/run` runs them.

mod server;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use orderly::SqliteStore;
use orderly::outbox::{RabbitSink, Relay, RelayConfig};
use sqlx::AssertSqlSafe;

fn amqp_url() -> String {
    server::url("ORDERLY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

async fn channel() -> (Connection, Channel) {
    let url = amqp_url();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ at {url} is required for this suite: {e}"));
    let channel = conn.create_channel().await.unwrap();
    (conn, channel)
}

/// A topic exchange of the test's own, and (if `bound`) a queue taking all of it.
async fn exchange(channel: &Channel, name: &str, bound: bool) {
    channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    if bound {
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                name.into(),
                name.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
}

/// Deletes the test's queue and exchange.
async fn remove(channel: &Channel, name: &str) {
    channel
        .queue_delete(name.into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    channel
        .exchange_delete(name.into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
}

/// The trace context stored with an event of `store_with`: its entity in the trace id,
/// its version in the parent id.
fn traceparent(entity: i64, version: i64) -> String {
    format!("00-{entity:032x}-{version:016x}-01")
}

async fn store_with(dir: &tempfile::TempDir, entities: i64, per_entity: i64) -> SqliteStore {
    let db = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let store = SqliteStore::demo(&db).await.unwrap();
    let mut rows = Vec::new();
    for entity in 1..=entities {
        for version in 1..=per_entity {
            rows.push(format!(
                "('OrderMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', 'Paid', 'r-{entity}-{version}', '{}')",
                traceparent(entity, version)
            ));
        }
    }
    for chunk in rows.chunks(500) {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id, traceparent) \
             VALUES {}",
            chunk.join(", ")
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }
    store
}

fn config() -> RelayConfig {
    RelayConfig::default()
        .batch(16)
        .min_backoff(Duration::from_millis(10))
        .max_backoff(Duration::from_millis(50))
        .max_attempts(100)
}

/// Four relays race over 300 events of 30 entities into a queue that holds at most 20
/// messages and refuses (negatively confirms) a publish beyond that; nothing is taken off
/// it until it has refused one. The queue receives each event once (no relay died, none
/// refused was taken for published), each entity's in version order, persistent, with
/// its message id and `Orderly-*` headers. Every publish was confirmed before it was
/// marked published: some were refused and retried. The relays raced: two or more ran a
/// round at once, and two or more published.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs RabbitMQ; .ci/run runs it"]
async fn relays_publish_with_confirms_in_order() {
    let (entities, per_entity) = (30, 10);
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(&dir, entities, per_entity).await;
    let name = format!("orderly_t_{}", server::unique_db_name());
    let (_conn, channel) = channel().await;
    exchange(&channel, &name, false).await;
    let mut bounded = FieldTable::default();
    bounded.insert("x-max-length".into(), AMQPValue::LongInt(20));
    bounded.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions::default(),
            bounded,
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let refused = Arc::new(AtomicUsize::new(0));
    let (in_round, most_in_round) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut relays = Vec::new();
    for _ in 0..4 {
        let sink = RabbitSink::connect(&amqp_url(), &name).await.unwrap();
        let relay = Relay::new(store.clone(), sink)
            .with_config(config())
            .unwrap();
        let (refused, in_round, most_in_round) =
            (refused.clone(), in_round.clone(), most_in_round.clone());
        relays.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut published = 0;
            loop {
                let now = in_round.fetch_add(1, Ordering::SeqCst) + 1;
                most_in_round.fetch_max(now, Ordering::SeqCst);
                let round = relay.relay_once().await.unwrap();
                in_round.fetch_sub(1, Ordering::SeqCst);
                published += round.published;
                refused.fetch_add(round.retried, Ordering::SeqCst);
                if round.claimed == 0 && relay.outbox().stats().await.unwrap().pending == 0 {
                    return published;
                }
                assert!(Instant::now() < deadline, "the outbox never drained");
            }
        }));
    }
    // The consumer: waits until the full queue refused a publish, then takes everything.
    let done = Arc::new(AtomicBool::new(false));
    let consumer = tokio::spawn({
        let (channel, name, refused, done) =
            (channel.clone(), name.clone(), refused.clone(), done.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while refused.load(Ordering::SeqCst) == 0 {
                assert!(
                    Instant::now() < deadline,
                    "the full queue refused no publish: confirms were never checked"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut deliveries = Vec::new();
            loop {
                let finished = done.load(Ordering::SeqCst);
                match channel
                    .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap()
                {
                    Some(got) => deliveries.push(got.delivery),
                    None if finished => return deliveries,
                    None => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
        }
    });
    let mut published = Vec::new();
    for relay in relays {
        published.push(relay.await.unwrap());
    }
    done.store(true, Ordering::SeqCst);
    let deliveries = consumer.await.unwrap();
    assert!(refused.load(Ordering::SeqCst) > 0);
    assert!(
        most_in_round.load(Ordering::SeqCst) >= 2,
        "the relays never ran a round at once"
    );
    assert!(
        published.iter().filter(|n| **n > 0).count() >= 2,
        "one relay published everything: {published:?}"
    );
    let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut count = 0;
    for delivery in &deliveries {
        count += 1;
        let props = &delivery.properties;
        assert_eq!(*props.delivery_mode(), Some(2), "persistent");
        let headers = props.headers().as_ref().expect("headers").inner();
        let header = |name: &str| match headers.get(name) {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("{name}: {other:?}"),
        };
        let (entity, version): (i64, i64) = (
            header("Orderly-Entity").parse().unwrap(),
            header("Orderly-Version").parse().unwrap(),
        );
        assert_eq!(
            props.message_id().as_ref().map(|s| s.to_string()),
            Some(format!("OrderMachine:{entity}:{version}"))
        );
        assert_eq!(header("Orderly-Event"), "OrderPaid");
        assert_eq!(header("traceparent"), traceparent(entity, version));
        assert_eq!(delivery.routing_key.as_str(), "OrderMachine.OrderPaid");
        seen.entry(entity).or_default().push(version);
    }
    assert_eq!(count, entities * per_entity, "each event once");
    for entity in 1..=entities {
        assert_eq!(
            seen.get(&entity),
            Some(&(1..=per_entity).collect::<Vec<_>>()),
            "entity {entity}"
        );
    }
    remove(&channel, &name).await;
}

/// An event no queue takes (a mandatory publish returned by the broker) is not marked
/// published: it waits, retried, with the broker's answer as its last error; once a
/// queue is bound it goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ; .ci/run runs it"]
async fn an_unroutable_event_waits_until_a_queue_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(&dir, 1, 2).await;
    let name = format!("orderly_t_{}", server::unique_db_name());
    let (_conn, channel) = channel().await;
    exchange(&channel, &name, false).await;
    let sink = RabbitSink::connect(&amqp_url(), &name).await.unwrap();
    let relay = Relay::new(store.clone(), sink)
        .with_config(config())
        .unwrap();
    let round = relay.relay_once().await.unwrap();
    assert_eq!(
        (round.claimed, round.published, round.retried),
        (1, 0, 1),
        "{round:?}"
    );
    let pending = relay.outbox().pending(10).await.unwrap();
    assert_eq!(pending.len(), 2);
    let error = pending[0].last_error.as_deref().unwrap_or_default();
    assert!(error.contains("no queue is bound"), "{error}");
    exchange(&channel, &name, true).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while relay.outbox().stats().await.unwrap().pending > 0 {
        relay.relay_once().await.unwrap();
        assert!(Instant::now() < deadline, "never published");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut versions = Vec::new();
    while let Some(got) = channel
        .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        versions.push(
            got.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(versions, ["OrderMachine:1:1", "OrderMachine:1:2"]);
    remove(&channel, &name).await;
}

/// In one batch, events a queue takes and events none takes, published concurrently: each
/// unroutable event is retried (its own return, never another's), each routable one is
/// published once; the queue holds exactly the routable ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs RabbitMQ; .ci/run runs it"]
async fn returns_are_never_mistaken_for_another_publish() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(&dir, 40, 1).await;
    // Odd entities emit an event no binding takes.
    sqlx::raw_sql("UPDATE orderly_outbox SET event = 'OrderLost' WHERE entity_id % 2 = 1")
        .execute(store.pool())
        .await
        .unwrap();
    let name = format!("orderly_t_{}", server::unique_db_name());
    let (_conn, channel) = channel().await;
    exchange(&channel, &name, false).await;
    channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            name.as_str().into(),
            name.as_str().into(),
            "OrderMachine.OrderPaid".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let sink = RabbitSink::connect(&amqp_url(), &name).await.unwrap();
    let relay = Relay::new(store.clone(), sink)
        .with_config(config().batch(40))
        .unwrap();
    let round = relay.relay_once().await.unwrap();
    assert_eq!(
        (round.claimed, round.published, round.retried),
        (40, 20, 20),
        "{round:?}"
    );
    for pending in relay.outbox().pending(40).await.unwrap() {
        assert_eq!(
            pending.entity_id % 2,
            1,
            "a routable event was not published"
        );
        let error = pending.last_error.unwrap_or_default();
        assert!(error.contains("no queue is bound"), "{error}");
    }
    let mut ids = Vec::new();
    while let Some(got) = channel
        .basic_get(name.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        ids.push(
            got.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string(),
        );
    }
    ids.sort();
    let mut want: Vec<String> = (1..=40)
        .filter(|e| e % 2 == 0)
        .map(|e| format!("OrderMachine:{e}:1"))
        .collect();
    want.sort();
    assert_eq!(ids, want);
    remove(&channel, &name).await;
}
