//! A sink to RabbitMQ: each event published persistent and mandatory on a channel in
//! confirm mode, and counted as published only once the broker confirmed it.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::{Message, Sink, SinkError};

/// Publishes to a RabbitMQ exchange with the routing key `{machine}.{event}`, the
/// message id as the AMQP `message-id` property and the event's fields as `Orderly-*`
/// headers. Publishes are mandatory: a message no queue takes is a failure, retried.
/// After a failure the sink reconnects on the next publish. RabbitMQ has no dedupe by
/// message id: a consumer dedupes (a transition with `ref_id` = the message id, or an
/// [`Inbox`](super::Inbox)).
#[derive(Debug)]
pub struct RabbitSink {
    url: String,
    exchange: String,
    channel: Mutex<Option<(Connection, Channel)>>,
}

impl RabbitSink {
    /// Connects to `url` (`amqp://guest:guest@127.0.0.1:5672/%2f`) to publish to
    /// `exchange` (declared by the application; `""` is the default exchange, which
    /// routes by queue name).
    pub async fn connect(url: &str, exchange: &str) -> Result<Self, SinkError> {
        let sink = RabbitSink {
            url: url.to_string(),
            exchange: exchange.to_string(),
            channel: Mutex::new(None),
        };
        let opened = open(&sink.url).await?;
        *sink.channel.lock().await = Some(opened);
        Ok(sink)
    }

    /// The routing key of an event.
    pub fn routing_key(message: &Message) -> String {
        format!("{}.{}", message.machine, message.event)
    }

    /// A channel in confirm mode, opened again if the last one failed.
    async fn channel(&self) -> Result<Channel, SinkError> {
        let mut held = self.channel.lock().await;
        if let Some((conn, channel)) = held.as_ref()
            && conn.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        *held = None;
        let (conn, channel) = open(&self.url).await?;
        *held = Some((conn, channel.clone()));
        Ok(channel)
    }

    /// Forgets a channel that failed, so the next publish opens another.
    async fn forget(&self) {
        *self.channel.lock().await = None;
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

impl Sink for RabbitSink {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let channel = self.channel().await?;
        let mut headers = FieldTable::default();
        for (name, value) in message.headers() {
            headers.insert(ShortString::from(name), AMQPValue::LongString(value.into()));
        }
        let properties = BasicProperties::default()
            .with_message_id(message.id.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirmed = async {
            channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    Self::routing_key(message).as_str().into(),
                    options,
                    message.body.as_bytes(),
                    properties,
                )
                .await?
                .await
        };
        match confirmed.await {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(_))) => Err(SinkError::retry(
                "RabbitMQ returned the message: no queue is bound for its routing key",
            )),
            Ok(Confirmation::Nack(_)) => Err(SinkError::retry("RabbitMQ refused the message")),
            Ok(Confirmation::NotRequested) => {
                Err(SinkError::retry("the channel is not in confirm mode"))
            }
            Err(e) => {
                self.forget().await;
                Err(SinkError::retry(format!("RabbitMQ publish: {e}")))
            }
        }
    }
}
