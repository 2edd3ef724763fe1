//! A sink to RabbitMQ: each event published persistent and mandatory on a channel in
//! confirm mode, and counted as published only once the broker confirmed it.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Mutex;

use super::{Message, Sink, SinkError};

/// Publishes to a RabbitMQ exchange with the routing key `{machine}.{event}`, the
/// message id as the AMQP `message-id` property and the event's fields as `Orderly-*`
/// headers. Publishes are mandatory: a message no queue takes is a failure, retried.
///
/// RabbitMQ confirms on a channel may cover several publishes at once, and a returned
/// (unroutable) message is not tied to its confirm by the client, so each channel carries
/// one unconfirmed publish at a time: the sink keeps a few channels in confirm mode
/// (`CHANNELS`, each on a connection of its own) and publishes on whichever is free. A
/// channel whose publish did not finish (its caller gave up, or it failed) is closed and
/// opened again for the next publish. RabbitMQ has no dedupe by message id: a consumer
/// dedupes (a transition with `ref_id` = the message id, or an
/// [`Inbox`](super::Inbox)).
#[derive(Debug)]
pub struct RabbitSink {
    url: String,
    exchange: String,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
}

/// How many channels a sink publishes on at once.
const CHANNELS: usize = 8;

/// A channel in confirm mode, and whether the last publish on it finished.
#[derive(Debug, Default)]
struct Slot {
    open: Option<(Connection, Channel)>,
    /// A publish began on the channel and did not finish: its confirm (or return) may
    /// still arrive, so the channel is not used again.
    dirty: bool,
}

impl RabbitSink {
    /// Connects to `url` (`amqp://guest:guest@127.0.0.1:5672/%2f`) to publish to
    /// `exchange` (declared by the application; `""` is the default exchange, which
    /// routes by queue name). The first channel is opened now, so a broker that cannot be
    /// reached is an error here.
    pub async fn connect(url: &str, exchange: &str) -> Result<Self, SinkError> {
        let sink = RabbitSink {
            url: url.to_string(),
            exchange: exchange.to_string(),
            slots: (0..CHANNELS).map(|_| Mutex::new(Slot::default())).collect(),
            next: AtomicUsize::new(0),
        };
        sink.slots[0].lock().await.open = Some(open(&sink.url).await?);
        Ok(sink)
    }

    /// The routing key of an event.
    pub fn routing_key(message: &Message) -> String {
        format!("{}.{}", message.machine, message.event)
    }
}

async fn open(url: &str) -> Result<(Connection, Channel), SinkError> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| SinkError::retry(format!("connecting to RabbitMQ: {e}")))?;
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| SinkError::retry(format!("opening a RabbitMQ channel: {e}")))?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| SinkError::retry(format!("enabling publisher confirms: {e}")))?;
    Ok((conn, channel))
}

/// An AMQP short string (at most 255 bytes), or a permanent refusal.
fn short(what: &str, text: &str) -> Result<ShortString, SinkError> {
    if text.len() > 255 {
        return Err(SinkError::permanent(format!(
            "{what} is {} bytes, more than an AMQP short string holds",
            text.len()
        )));
    }
    Ok(text.into())
}

impl Sink for RabbitSink {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let routing_key = short("the routing key", &Self::routing_key(message))?;
        let message_id = short("the message id", &message.id)?;
        let mut headers = FieldTable::default();
        for (name, value) in message.headers() {
            headers.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
        }
        let properties = BasicProperties::default()
            .with_message_id(message_id)
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[at].lock().await;
        let usable = !slot.dirty
            && matches!(&slot.open, Some((conn, channel))
                if conn.status().connected() && channel.status().connected());
        if !usable {
            if let Some((conn, _)) = slot.open.take() {
                // Closing it drops whatever confirm or return was still on its way.
                let _ = conn.close(0, "orderly: channel reset".into()).await;
            }
            slot.dirty = false;
            slot.open = Some(open(&self.url).await?);
        }
        let Some((_, channel)) = slot.open.as_ref() else {
            return Err(SinkError::retry("no RabbitMQ channel"));
        };
        let channel = channel.clone();
        // Set until the confirm arrives: a caller that stops waiting leaves it set.
        slot.dirty = true;
        let confirmed = async {
            channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    routing_key,
                    options,
                    message.body.as_bytes(),
                    properties,
                )
                .await?
                .await
        }
        .await;
        let outcome = match confirmed {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => {
                let theirs = returned
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.to_string());
                if theirs.as_deref() == Some(message.id.as_str()) {
                    Err(SinkError::retry(
                        "RabbitMQ returned the message: no queue is bound for its routing key",
                    ))
                } else {
                    // Another message's return: this channel's confirms cannot be trusted.
                    return Err(SinkError::retry(
                        "RabbitMQ returned a message that is not this one",
                    ));
                }
            }
            Ok(Confirmation::Nack(_)) => Err(SinkError::retry("RabbitMQ refused the message")),
            Ok(Confirmation::NotRequested) => {
                Err(SinkError::retry("the channel is not in confirm mode"))
            }
            Err(e) => return Err(SinkError::retry(format!("RabbitMQ publish: {e}"))),
        };
        slot.dirty = false;
        outcome
    }
}
