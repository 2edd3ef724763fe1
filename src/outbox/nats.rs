//! A sink to NATS JetStream: each event published with its message id as `Nats-Msg-Id`,
//! so the stream's duplicate window drops a republish, and counted as published only
//! once the stream acknowledged it.

use async_nats::jetstream::{self, context::Context, message::PublishMessage};

use super::{Message, Sink, SinkError};

/// Publishes to JetStream on the subject `{prefix}.{machine}.{event}`, with the event's
/// fields as `Orderly-*` headers and its id as `Nats-Msg-Id`. A stream must capture the
/// subjects (for example `{prefix}.>`); its duplicate window (two minutes by default)
/// bounds how late a republish is still recognised.
#[derive(Debug, Clone)]
pub struct NatsSink {
    js: Context,
    prefix: String,
}

impl NatsSink {
    /// Connects to the NATS server at `url` (the client reconnects by itself).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, SinkError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| SinkError::retry(format!("connecting to NATS at {url}: {e}")))?;
        Self::new(jetstream::new(client), prefix)
    }

    /// A sink over a JetStream context; `prefix` is the subjects' first token(s): not
    /// empty, no spaces or wildcards.
    pub fn new(js: Context, prefix: &str) -> Result<Self, SinkError> {
        let valid = !prefix.is_empty()
            && !prefix.starts_with('.')
            && !prefix.ends_with('.')
            && !prefix.contains("..")
            && prefix
                .chars()
                .all(|c| c.is_ascii_graphic() && c != '*' && c != '>');
        if !valid {
            return Err(SinkError::permanent(format!(
                "{prefix:?} is not a NATS subject prefix"
            )));
        }
        Ok(NatsSink {
            js,
            prefix: prefix.to_string(),
        })
    }

    /// The subject an event is published on.
    pub fn subject(&self, message: &Message) -> String {
        format!("{}.{}.{}", self.prefix, message.machine, message.event)
    }

    /// The JetStream context.
    pub fn context(&self) -> &Context {
        &self.js
    }
}

impl Sink for NatsSink {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        let mut publish = PublishMessage::build()
            .payload(message.body.clone().into())
            .message_id(&message.id);
        for (name, value) in message.headers() {
            publish = publish.header(name, value.as_str());
        }
        let ack = self
            .js
            .send_publish(self.subject(message), publish)
            .await
            .map_err(|e| SinkError::retry(format!("JetStream publish: {e}")))?;
        // A duplicate acknowledgement is a success: the stream holds the message already.
        ack.await
            .map(|_| ())
            .map_err(|e| SinkError::retry(format!("JetStream acknowledgement: {e}")))
    }
}
