//! What a relay publishes: an outbox row as a message with a stable id and headers, and
//! an in-process sink.

use tokio::sync::mpsc;

use super::{EventRow, Sink, SinkError};
use crate::support::trace::TraceContext;

/// One event, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `{machine}:{entity_id}:{version}`: the same for every publish of the event, so a
    /// consumer (or the broker's dedupe window) recognises a republish.
    pub id: String,
    /// The machine's name.
    pub machine: String,
    /// The domain event the edge emits.
    pub event: String,
    /// The machine's event (the transition) that emitted it.
    pub transition: String,
    /// The entity.
    pub entity_id: i64,
    /// The entity's version after the transition: orders one entity's events.
    pub version: i64,
    /// The state before.
    pub from: String,
    /// The state after.
    pub to: String,
    /// The request's reference.
    pub ref_id: String,
    /// The body: the request's own event body if it attached one, else a JSON object of
    /// the fields above.
    pub body: String,
    /// The trace context of the request that wrote the event, if it had one: sent as the
    /// W3C `traceparent` and `tracestate` headers.
    pub trace: Option<TraceContext>,
}

impl Message {
    /// The message of an outbox row.
    pub fn from_row(row: &EventRow) -> Self {
        let body = match &row.body {
            Some(body) => body.clone(),
            None => serde_json::json!({
                "id": Self::id_of(&row.machine, row.entity_id, row.version),
                "machine": row.machine,
                "event": row.event,
                "transition": row.transition,
                "entity_id": row.entity_id,
                "version": row.version,
                "from": row.from_status,
                "to": row.to_status,
                "ref_id": row.ref_id,
            })
            .to_string(),
        };
        Message {
            id: Self::id_of(&row.machine, row.entity_id, row.version),
            machine: row.machine.clone(),
            event: row.event.clone(),
            transition: row.transition.clone(),
            entity_id: row.entity_id,
            version: row.version,
            from: row.from_status.clone(),
            to: row.to_status.clone(),
            ref_id: row.ref_id.clone(),
            body,
            trace: row.trace.clone(),
        }
    }

    /// The message id of an event: `{machine}:{entity_id}:{version}`.
    pub fn id_of(machine: &str, entity_id: i64, version: i64) -> String {
        format!("{machine}:{entity_id}:{version}")
    }

    /// The headers a broker adapter sends: the message id and each field but the body,
    /// under `Orderly-*` names, then the trace context's `traceparent` and `tracestate`
    /// if the event has one.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![
            ("Orderly-Id", self.id.clone()),
            ("Orderly-Machine", self.machine.clone()),
            ("Orderly-Event", self.event.clone()),
            ("Orderly-Transition", self.transition.clone()),
            ("Orderly-Entity", self.entity_id.to_string()),
            ("Orderly-Version", self.version.to_string()),
            ("Orderly-From", self.from.clone()),
            ("Orderly-To", self.to.clone()),
            ("Orderly-Ref", self.ref_id.clone()),
        ];
        if let Some(trace) = &self.trace {
            headers.extend(trace.headers());
        }
        headers
    }
}

/// An in-process sink: each message is sent on a tokio channel, for tests, examples and
/// a consumer in the same process. A publish fails (to be retried) once the receiver is
/// gone.
#[derive(Debug, Clone)]
pub struct ChannelSink {
    tx: mpsc::UnboundedSender<Message>,
}

impl ChannelSink {
    /// A sink and the receiving end of its channel.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Message>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ChannelSink { tx }, rx)
    }
}

impl Sink for ChannelSink {
    async fn publish(&self, message: &Message) -> Result<(), SinkError> {
        self.tx
            .send(message.clone())
            .map_err(|_| SinkError::retry("the channel's receiver is gone"))
    }
}
