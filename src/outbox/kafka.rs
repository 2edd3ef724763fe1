//! A sink to Kafka: each event a record keyed by its entity id, so one entity's events
//! share a partition and keep their order, published by an idempotent producer and
//! counted as published only once every in-sync replica has it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::{Message, Sink, SinkError};

/// Publishes to one Kafka topic, each event a record whose key is the entity id (one
/// entity's events on one partition, in order), whose value is the event's body, and
/// whose headers are the event's fields as `Orderly-*` headers (the message id as
/// `Orderly-Id`).
///
/// The producer is idempotent (`enable.idempotence`, `acks=all`): the broker drops a
/// retry of a record it already holds, so the producer's own retries add no duplicate.
/// A relay that publishes an event again (its claim ran out, or it died before
/// recording) publishes a new record: a consumer dedupes by `Orderly-Id` (a transition
/// with `ref_id` = the message id, or an [`Inbox`](super::Inbox)).
///
/// A record the producer refuses when it is queued for good (larger than the producer's
/// `message.max.bytes`) or that the broker calls invalid is a permanent failure: the
/// relay sets the event aside dead, and that entity's later events wait behind it.
/// Everything else is retried, up to the relay's `max_attempts`: a broker refuses a
/// whole batch, which may hold other entities' events (a batch over the topic's
/// `max.message.bytes`: set the producer's `message.max.bytes` no higher, so a large
/// record is caught alone), and a missing right or topic is the sink's, not the event's.
/// The application creates its topics: the sink never has one created.
pub struct KafkaSink {
    config: ClientConfig,
    topic: String,
    max_bytes: usize,
    /// The producer in use, and since when it has not failed every publish: since it
    /// was made, or its last delivery.
    producer: Mutex<(Arc<FutureProducer>, Instant)>,
    /// How long a producer may fail every publish before it is replaced.
    stuck_after: Duration,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// The largest record the producer sends unless told otherwise (librdkafka's
/// `message.max.bytes` default).
const MAX_BYTES: usize = 1_000_000;

/// How long the producer tries one record, its own retries included, before it reports
/// the publish failed, unless `message.timeout.ms` is given: with the second a publish
/// may wait for room in the producer's queue, below the relay's default publish timeout
/// (10 s). A relay that stops waiting first leaves the record in the producer, which may
/// still deliver it: a duplicate, as any publish stored after its relay gave up.
const DELIVERY_MS: &str = "8000";

/// How long a publish waits for room in the producer's queue.
const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Settings the sink makes itself, which `connect_with` refuses: they would break its
/// promises (idempotence, every in-sync replica, one entity on one partition, no topic
/// created by a publish, no transaction).
const PINNED: [&str; 9] = [
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "partitioner",
    "partitioner_cb",
    "transactional.id",
    "allow.auto.create.topics",
    "delivery.timeout.ms",
    "bootstrap.servers",
];

impl KafkaSink {
    /// A sink publishing to `topic` through the brokers `brokers` (`host:port`, comma
    /// separated). The brokers are asked for the topic's partitions now, so brokers that
    /// cannot be reached are an error here.
    pub async fn connect(brokers: &str, topic: &str) -> Result<Self, SinkError> {
        Self::connect_with(brokers, topic, []).await
    }

    /// [`connect`](Self::connect) with more producer settings (librdkafka's names:
    /// `message.max.bytes`, `message.timeout.ms`, `security.protocol`, …). The sink's own
    /// (`enable.idempotence=true`, `acks=all`, the default partitioner, which hashes the
    /// key, `allow.auto.create.topics=false`, no `transactional.id`) cannot be given: a
    /// setting that names one is refused, as is `delivery.timeout.ms` (give
    /// `message.timeout.ms`, below the relay's `publish_timeout`).
    pub async fn connect_with<'a>(
        brokers: &str,
        topic: &str,
        settings: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, SinkError> {
        if topic.is_empty()
            || topic == "."
            || topic == ".."
            || topic.len() > 249
            || !topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(SinkError::permanent(format!(
                "{topic:?} is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-'; not . or ..)"
            )));
        }
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("message.timeout.ms", DELIVERY_MS)
            .set("linger.ms", "1");
        for (name, value) in settings {
            if PINNED.contains(&name) {
                return Err(SinkError::permanent(format!(
                    "{name} is the Kafka sink's own setting"
                )));
            }
            config.set(name, value);
        }
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("allow.auto.create.topics", "false");
        let max_bytes = match config.get("message.max.bytes") {
            Some(n) => n.parse().map_err(|_| {
                SinkError::permanent(format!("message.max.bytes {n:?} is not a number"))
            })?,
            None => MAX_BYTES,
        };
        let delivery = config.get("message.timeout.ms").unwrap_or(DELIVERY_MS);
        let delivery_ms: u64 = delivery.parse().map_err(|_| {
            SinkError::permanent(format!("message.timeout.ms {delivery:?} is not a number"))
        })?;
        let producer = create(&config)?;
        let sink = KafkaSink {
            config,
            topic: topic.to_string(),
            max_bytes,
            producer: Mutex::new((producer.clone(), Instant::now())),
            stuck_after: Duration::from_millis(delivery_ms.saturating_mul(3)),
        };
        let topic = sink.topic.clone();
        let known = tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&topic), Duration::from_secs(10))
                .map_err(|e| format!("asking Kafka for its metadata: {e}"))?;
            match metadata.topics().iter().find(|t| t.name() == topic) {
                Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(()),
                Some(t) => Err(format!(
                    "Kafka has no topic {topic:?} to publish to ({:?}): the application creates it",
                    t.error()
                )),
                None => Err(format!("Kafka did not answer for the topic {topic:?}")),
            }
        })
        .await
        .map_err(|e| SinkError::retry(format!("asking Kafka for its metadata: {e}")))?;
        known.map_err(SinkError::retry)?;
        Ok(sink)
    }

    /// The topic it publishes to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The producer in use; a new one in place of one that met a fatal error (an
    /// idempotent producer whose sequence the broker no longer accepts is unusable), or
    /// that has failed every publish for three times `message.timeout.ms` (an idempotent
    /// producer whose broker lost its state, a broker started again empty, can wait on
    /// it for good). Replacing one loses nothing: a record it still held is dropped with
    /// it, unacknowledged, and its event published again by the relay.
    fn producer(&self) -> Result<Arc<FutureProducer>, SinkError> {
        let mut held = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        let fatal = held.0.client().fatal_error();
        let stuck = held.1.elapsed() > self.stuck_after;
        if fatal.is_some() || stuck {
            match fatal {
                Some((code, reason)) => {
                    tracing::warn!(?code, %reason, "the Kafka producer met a fatal error: a new one takes its place")
                }
                None => {
                    tracing::warn!(failing = ?held.1.elapsed(), "the Kafka producer has failed every publish: a new one takes its place")
                }
            }
            // The settings made one before: a failure now is the moment's, retried.
            let fresh = create(&self.config).map_err(|e| SinkError::retry(e.message))?;
            let old = std::mem::replace(&mut *held, (fresh, Instant::now()));
            // Dropping a producer waits for its threads: not on the runtime's.
            tokio::task::spawn_blocking(move || drop(old));
        }
        Ok(held.0.clone())
    }

    /// Notes a delivery: the producer in use works.
    fn delivered(&self, by: &Arc<FutureProducer>) {
        let mut held = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::ptr_eq(&held.0, by) {
            held.1 = Instant::now();
        }
    }
}

fn create(config: &ClientConfig) -> Result<Arc<FutureProducer>, SinkError> {
    config
        .create::<FutureProducer>()
        .map(Arc::new)
        .map_err(|e| SinkError::permanent(format!("creating the Kafka producer: {e}")))
}

/// Whether the producer refuses to queue the record for good: sending it again cannot
/// succeed.
fn unqueueable(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(code, C::MessageSizeTooLarge | C::InvalidRecord)
}

/// Whether the broker's refusal is of this record alone, for good. A refusal of its size
/// is of the batch it went in (other entities' records too), and one of rights or of the
/// topic is the sink's: those are retried.
fn invalid_record(code: RDKafkaErrorCode) -> bool {
    matches!(code, RDKafkaErrorCode::InvalidRecord)
}

impl Sink for KafkaSink {
    /// The producer's `message.max.bytes` (1,000,000 unless set).
    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.max_bytes)
    }

    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let key = message.entity_id.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(11);
        for (name, value) in message.headers() {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        let record = FutureRecord::to(&self.topic)
            .key(&key)
            .payload(&message.body)
            .headers(headers);
        let producer = self.producer()?;
        let waited = std::time::Instant::now();
        let mut record = record;
        let delivery = loop {
            match producer.send_result(record) {
                Ok(delivery) => break delivery,
                Err((e, back)) => match e.rdkafka_error_code() {
                    Some(RDKafkaErrorCode::QueueFull) if waited.elapsed() < QUEUE_WAIT => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Some(code) if unqueueable(code) => {
                        return Err(SinkError::permanent(format!(
                            "the Kafka producer refuses the record: {e}"
                        )));
                    }
                    _ => return Err(SinkError::retry(format!("Kafka publish: {e}"))),
                },
            }
        };
        match delivery.await {
            Ok(Ok(_)) => {
                self.delivered(&producer);
                Ok(())
            }
            Ok(Err((e, _))) => Err(match e.rdkafka_error_code() {
                Some(code) if invalid_record(code) => {
                    SinkError::permanent(format!("Kafka refused the record: {e}"))
                }
                _ => SinkError::retry(format!("Kafka publish: {e}")),
            }),
            Err(_) => Err(SinkError::retry("the Kafka producer went away")),
        }
    }
}
