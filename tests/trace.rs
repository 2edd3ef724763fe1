//! A payment's trace from its request to the consumer's work, through each broker
//! (`tests/trace_flow/mod.rs`): NATS JetStream (`ORDERLY_NATS_URL`), RabbitMQ
//! (`ORDERLY_AMQP_URL`) and a Kafka-protocol broker (`ORDERLY_KAFKA_BROKERS`, read back by
//! the independent consumer `tests/kafka/read_back.py`). A broker that cannot be reached
//! fails these tests; they never skip. Opt-in (`--include-ignored`): `.ci/run` runs them.
//! They share this binary's process and its one OpenTelemetry subscriber, so no other
//! suite's headers are changed by it.

mod server;
#[path = "trace_flow/mod.rs"]
mod trace_flow;

use async_nats::jetstream::{self, stream};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use orderly::outbox::{KafkaSink, NatsSink, RabbitSink};
use trace_flow::{CHILD, Delivery, SPAN, child_relay, trace_survives_a_killed_relay};

fn nats_url() -> String {
    server::url("ORDERLY_NATS_URL", "nats://127.0.0.1:4222")
}

fn amqp_url() -> String {
    server::url("ORDERLY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

fn brokers() -> String {
    server::url("ORDERLY_KAFKA_BROKERS", "127.0.0.1:9092")
}

/// The relay child's broker end, when this process is one: the SQLite file and what the
/// test's sink needs (`db|target`).
fn child_spec() -> Option<(String, String)> {
    let spec = std::env::var(CHILD).ok()?;
    let (db, target) = spec.split_once('|')?;
    Some((db.to_string(), target.to_string()))
}

/// Through NATS JetStream: read back from a stream of the test's own.
#[tokio::test]
#[ignore = "needs NATS with JetStream; .ci/run runs it"]
async fn through_nats() {
    if let Some((db, prefix)) = child_spec() {
        let sink = NatsSink::connect(&nats_url(), &prefix).await.unwrap();
        return child_relay(&db, sink).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("trace{}", server::unique_db_name());
    let url = nats_url();
    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("NATS at {url} is required for this suite: {e}"));
    let js = jetstream::new(client);
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: prefix.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    let sink = NatsSink::connect(&url, &prefix).await.unwrap();
    let name = prefix.clone();
    let read = move |_expect: usize| async move {
        let count = stream.info().await.unwrap().state.messages;
        let mut deliveries = Vec::new();
        for seq in 1..=count {
            let m = stream.get_raw_message(seq).await.unwrap();
            let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_string());
            deliveries.push(Delivery {
                id: header("Orderly-Id").expect("an Orderly-Id header"),
                traceparent: header("traceparent"),
                tracestate: header("tracestate"),
            });
        }
        js.delete_stream(&name).await.unwrap();
        deliveries
    };
    trace_survives_a_killed_relay(0, "through_nats", dir.path(), &prefix, sink, read).await;
}

/// Through RabbitMQ: read back from a queue bound to an exchange of the test's own.
#[tokio::test]
#[ignore = "needs RabbitMQ; .ci/run runs it"]
async fn through_rabbitmq() {
    if let Some((db, exchange)) = child_spec() {
        let sink = RabbitSink::connect(&amqp_url(), &exchange).await.unwrap();
        return child_relay(&db, sink).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = amqp_url();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ at {url} is required for this suite: {e}"));
    let channel = conn.create_channel().await.unwrap();
    let name = format!("trace{}", server::unique_db_name());
    channel
        .exchange_declare(
            name.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
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
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let sink = RabbitSink::connect(&url, &name).await.unwrap();
    let queue = name.clone();
    let read = move |_expect: usize| async move {
        let mut deliveries = Vec::new();
        while let Some(got) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let headers = got
                .delivery
                .properties
                .headers()
                .as_ref()
                .expect("headers")
                .inner();
            let header = |key: &str| match headers.get(key) {
                Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                _ => None,
            };
            deliveries.push(Delivery {
                id: header("Orderly-Id").expect("an Orderly-Id header"),
                traceparent: header("traceparent"),
                tracestate: header("tracestate"),
            });
        }
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        channel
            .exchange_delete(queue.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        drop(conn);
        deliveries
    };
    trace_survives_a_killed_relay(SPAN, "through_rabbitmq", dir.path(), &name, sink, read).await;
}

/// Runs `tests/kafka/read_back.py` with `args` on the suite's broker; its standard
/// output.
fn read_back(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kafka/read_back.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(brokers())
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

/// Through Kafka: read back by the independent consumer from a topic of the test's own
/// (duplicates kept, as Kafka keeps them).
#[tokio::test]
#[ignore = "needs a Kafka-protocol broker; .ci/run runs it"]
async fn through_kafka() {
    if let Some((db, topic)) = child_spec() {
        let sink = KafkaSink::connect_with(&brokers(), &topic, [("message.timeout.ms", "1000")])
            .await
            .unwrap();
        return child_relay(&db, sink).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let topic = format!("trace{}", server::unique_db_name());
    read_back(&["create", &topic, "3"]);
    let sink = KafkaSink::connect(&brokers(), &topic).await.unwrap();
    let name = topic.clone();
    let read = move |expect: usize| async move {
        read_back(&["read", &name, &expect.to_string()])
            .lines()
            .map(|line| {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                let header = |key: &str| v["headers"][key].as_str().map(str::to_string);
                Delivery {
                    id: header("Orderly-Id").expect("an Orderly-Id header"),
                    traceparent: header("traceparent"),
                    tracestate: header("tracestate"),
                }
            })
            .collect()
    };
    trace_survives_a_killed_relay(2 * SPAN, "through_kafka", dir.path(), &topic, sink, read).await;
}
