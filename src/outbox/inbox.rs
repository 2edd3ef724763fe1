//! The consumer's inbox: which messages a consumer has handled, recorded in the
//! consumer's own transaction.

use std::time::Duration;

use super::OutboxStore;
use crate::error::Error;
use crate::error::Result;
use crate::store::{Lease, db_error};

/// The longest consumer name, in bytes.
const MAX_CONSUMER: usize = 128;
/// The longest message id, in bytes.
const MAX_MESSAGE_ID: usize = 255;

/// The inbox of one consumer: for work that is not a transition (a transition dedupes by
/// itself with `ref_id` = the message id). [`receive`](Inbox::receive) inside the
/// transaction that does the work: the work and the record commit together, so a
/// redelivery finds the record and is skipped.
#[derive(Debug, Clone)]
pub struct Inbox<S> {
    store: S,
    consumer: String,
}

impl<S: OutboxStore> Inbox<S> {
    /// The inbox of `consumer` (at most 128 bytes) in `store`.
    pub fn new(store: S, consumer: impl Into<String>) -> Result<Self> {
        let consumer = consumer.into();
        if consumer.is_empty() || consumer.len() > MAX_CONSUMER {
            return Err(Error::InvalidInput(format!(
                "an inbox consumer name must be 1 to {MAX_CONSUMER} bytes"
            )));
        }
        Ok(Inbox { store, consumer })
    }

    /// Records `message_id` (at most 255 bytes) as received, on `conn`, which should be
    /// inside the transaction that does the message's work: `true` the first time (do
    /// the work), `false` for a redelivery (skip it). Rolled back with the work.
    pub async fn receive(&self, conn: &mut S::Conn, message_id: &str) -> Result<bool> {
        if message_id.is_empty() || message_id.len() > MAX_MESSAGE_ID {
            return Err(Error::InvalidInput(format!(
                "a message id must be 1 to {MAX_MESSAGE_ID} bytes"
            )));
        }
        self.store
            .inbox_insert(conn, &self.consumer, message_id)
            .await
            .map_err(db_error::<S>)
    }

    /// Deletes up to `batch` entries of every consumer received more than `retention`
    /// ago (keep it longer than any redelivery can come late); how many went.
    pub async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::InvalidInput("a purge batch must be positive".into()));
        }
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self
            .store
            .inbox_purge(lease.conn(), retention, i64::from(batch))
            .await;
        lease.release_after(&out);
        out.map_err(db_error::<S>)
    }
}

/// The span of a consumer's work on one message (`orderly.consume`, kind CONSUMER), from
/// the message's id and its `traceparent` and `tracestate` headers: run the work in it
/// (`Instrument::instrument`), and a transition made there is its child. With the `otel`
/// feature and a `tracing-opentelemetry` layer, the span is a child of the message's
/// context (the relay's publish span), so the consumer's work joins the trace of the
/// request that wrote the event. A `traceparent` that does not read is ignored with a
/// warning: the span then starts where the caller is.
pub fn consume_span(
    message_id: &str,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "orderly.consume",
        otel.kind = "consumer",
        messaging.message.id = message_id,
    );
    let context = crate::support::trace::TraceContext::from_values(traceparent, tracestate);
    if context.is_none()
        && let Some(bad) = traceparent
    {
        tracing::warn!(
            message_id,
            traceparent = bad,
            "a message's traceparent does not read: its trace context is ignored"
        );
    }
    #[cfg(feature = "otel")]
    if let Some(context) = &context {
        context.set_parent_of(&span);
    }
    span
}
