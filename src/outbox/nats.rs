//! A sink to NATS JetStream: each event published with its message id as `Nats-Msg-Id`,
//! so the stream's duplicate window drops a republish, and counted as published only
//! once the stream acknowledged it.

use async_nats::jetstream::{self, context::Context, message::PublishMessage};
use async_nats::{HeaderMap, HeaderValue, header::NATS_MESSAGE_ID};

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

/// A header value, or a permanent refusal for text a header cannot carry (a line break
/// in a value read from the database).
fn value(name: &str, text: &str) -> Result<HeaderValue, SinkError> {
    text.parse()
        .map_err(|_| SinkError::permanent(format!("{name} {text:?} cannot be a NATS header value")))
}

/// Whether `token` can be one token of a subject.
fn is_token(token: &str) -> bool {
    !token.is_empty()
        && token
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '.' | '*' | '>'))
}

impl Sink for NatsSink {
    /// The server's `max_payload` (1 MiB by default), as it announced it on connect
    /// (`None` before the client heard from it).
    fn max_message_bytes(&self) -> Option<usize> {
        Some(self.js.client().server_info().max_payload).filter(|n| *n > 0)
    }

    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        if !is_token(&message.machine) || !is_token(&message.event) {
            return Err(SinkError::permanent(format!(
                "machine {:?} and event {:?} cannot be NATS subject tokens",
                message.machine, message.event
            )));
        }
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, value("message id", &message.id)?);
        for (name, text) in message.headers() {
            headers.insert(name, value(name, &text)?);
        }
        let publish = PublishMessage::build()
            .payload(message.body.clone().into())
            .headers(headers);
        let ack = self
            .js
            .send_publish(self.subject(message), publish)
            .await
            .map_err(|e| {
                use async_nats::jetstream::context::PublishErrorKind;
                // A message the server can never take (too large) is refused for good.
                match e.kind() {
                    PublishErrorKind::MaxPayloadExceeded => {
                        SinkError::permanent(format!("JetStream publish: {e}"))
                    }
                    _ => SinkError::retry(format!("JetStream publish: {e}")),
                }
            })?;
        // A duplicate acknowledgement is a success: the stream holds the message already.
        ack.await
            .map(|_| ())
            .map_err(|e| SinkError::retry(format!("JetStream acknowledgement: {e}")))
    }
}
