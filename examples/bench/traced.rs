//! The relay to Kafka (`--kafka BROKERS`, feature `kafka`) and the cost of tracing
//! (`--traced`, feature `otel`): the outbox and relay passes run again with a
//! `tracing-opentelemetry` layer recording every span (OpenTelemetry's SDK, a simple
//! processor, an in-memory exporter emptied between passes), compared through their
//! hand-written loops, which make no spans. Their lines are `relay_kafka backend=…
//! relay_vs_hand=… lease_vs_hand=…` and `traced backend=… c=… outbox_traced_vs_plain=…
//! relay_traced_vs_plain=… spans=…`.

use super::*;

/// A sink the relays of a pass share (one producer).
pub(crate) struct Shared<K>(pub(crate) Arc<K>);

impl<K> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<K: Sink> Sink for Shared<K> {
    fn publish(
        &self,
        message: &Message,
    ) -> impl Future<Output = Result<(), orderly::outbox::SinkError>> + Send {
        self.0.publish(message)
    }

    fn max_message_bytes(&self) -> Option<usize> {
        self.0.max_message_bytes()
    }
}

/// The relay to the Kafka-protocol broker at `brokers`: a topic of the bench's own (four
/// partitions), created first and deleted after. Returns the `relay_kafka …` line.
pub(crate) async fn relay_kafka<B: BenchDb>(
    db: &Arc<B>,
    brokers: &str,
    args: &Args,
) -> Result<String, BoxError> {
    #[cfg(feature = "kafka")]
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        let topic = format!("orderly_bench_{}", std::process::id());
        let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let created = admin
            .create_topics(
                &[NewTopic::new(&topic, 4, TopicReplication::Fixed(1))],
                &options,
            )
            .await?;
        for result in created {
            result.map_err(|(topic, e)| format!("creating the topic {topic}: {e}"))?;
        }
        let sink = Shared(Arc::new(
            orderly::outbox::KafkaSink::connect(brokers, &topic).await?,
        ));
        let line = relay_pass(db, sink, "kafka", args).await;
        // A broker that deletes no topic leaves it: the bench's run is over either way.
        let _ = admin.delete_topics(&[&topic], &options).await;
        Ok(line?.replacen("relay ", "relay_kafka ", 1))
    }
    #[cfg(not(feature = "kafka"))]
    {
        let _ = (db, brokers, args);
        Err("--kafka needs the bench built with --features kafka".into())
    }
}

/// The value of `key=` in one of the bench's lines.
fn value_of(line: &str, key: &str) -> Result<f64, BoxError> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .ok_or_else(|| format!("no {key}= in {line:?}").into())
}

/// The outbox pass at `c` callers and the relay pass again, every span recorded; `plain`
/// holds the lines the same passes printed without. Returns the `traced …` line.
pub(crate) async fn traced_pass<B: BenchDb>(
    db: &Arc<B>,
    emitting: &Engine<EmitMachine, B::S>,
    c: usize,
    args: &Args,
    plain: &[String],
) -> Result<String, BoxError> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
        use tracing_subscriber::layer::SubscriberExt;
        let find = |prefix: String| {
            plain
                .iter()
                .find(|l| l.starts_with(&prefix))
                .cloned()
                .ok_or_else(|| BoxError::from(format!("no plain line {prefix:?}")))
        };
        let plain_outbox = find(format!("outbox backend={} c={c} ", args.backend))?;
        let plain_relay = find(format!("relay backend={} ", args.backend))?;
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("orderly-bench")));
        tracing::subscriber::set_global_default(subscriber)?;
        let outbox = outbox_pass(db, emitting, c, args).await?;
        let mut spans = exporter.get_finished_spans()?.len();
        exporter.reset();
        let relay = match &args.nats {
            Some(url) => relay_nats(db, url, args).await?,
            None => {
                let (sink, mut rx) = ChannelSink::new();
                tokio::spawn(async move { while rx.recv().await.is_some() {} });
                relay_pass(db, sink, "channel", args).await?
            }
        };
        spans += exporter.get_finished_spans()?.len();
        exporter.reset();
        if spans == 0 {
            return Err("--traced: no span was recorded".into());
        }
        Ok(format!(
            "traced backend={} c={c} outbox_traced_vs_plain={:.2} relay_traced_vs_plain={:.2} spans={spans}",
            args.backend,
            value_of(&outbox, "outbox_vs_hand")? / value_of(&plain_outbox, "outbox_vs_hand")?,
            value_of(&relay, "relay_vs_hand")? / value_of(&plain_relay, "relay_vs_hand")?,
        ))
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (db, emitting, c, args, plain);
        Err("--traced needs the bench built with --features otel".into())
    }
}
