//! The outbox: events written with the transitions that emit them, relayed in order to a
//! broker, and consumed once.
//!
//! An edge of [`state_machine!`](crate::state_machine!) that names an event (`Created +
//! Pay => Paid emits OrderPaid`) writes an outbox row in the transition's own atomic
//! unit. A [`Relay`] claims unpublished rows (per entity, lowest version first; many
//! entities at once), publishes each as a [`Message`] through a [`Sink`] and records the
//! outcome fenced by its claim: published, retried with backoff, or, after
//! [`RelayConfig::max_attempts`], dead until an operator requeues it
//! ([`Outbox::requeue`]). [`Outbox`] shows what waits and purges what was published. On
//! the consuming side, a consumer that applies transitions dedupes with `ref_id` =
//! [`Message::id`]; one whose work is not a transition records the message in an
//! [`Inbox`] inside its own transaction. The model and its guarantees are in
//! `docs/outbox.md`.

use std::future::Future;
use std::time::Duration;

/// The longest lease a relay may take: a claim running past it was made by no relay.
const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

use crate::support::retry::millis;

mod inbox;
#[cfg(feature = "kafka")]
mod kafka;
mod message;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod relay;
mod seam;
mod view;

pub use inbox::{Inbox, consume_span};
#[cfg(feature = "kafka")]
pub use kafka::KafkaSink;
pub use message::{ChannelSink, Message};
#[cfg(feature = "nats")]
pub use nats::NatsSink;
#[cfg(feature = "rabbitmq")]
pub use rabbitmq::RabbitSink;
pub use relay::{Claim, Relay, RelayConfig, RelayRound};
pub use seam::{
    ClaimEvents, ClaimedEvent, CorruptEvent, CorruptRow, EventKey, EventRow, FailedEvent,
    OutboxStore, StatsRow,
};
pub use view::{Outbox, OutboxStats};

/// Where the relay publishes: a broker, or anything that takes a message and says when it
/// holds it.
///
/// `publish` returns `Ok` only once the destination has taken responsibility for the
/// message (a JetStream acknowledgement, a RabbitMQ publisher confirm); the relay marks
/// the event published only then. It may be called concurrently for events of different
/// entities, never for two events of one entity at once.
pub trait Sink: Send + Sync + 'static {
    /// Publishes one message.
    fn publish(&self, message: &Message) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// The largest message the destination takes, headers included, if it has a limit
    /// (NATS: the server's `max_payload`). Event bodies are checked when they are written,
    /// against [`EngineConfig::max_event_body`](crate::EngineConfig::max_event_body): set
    /// that below this, with room for the headers. `None` (the default): no known limit.
    fn max_message_bytes(&self) -> Option<usize> {
        None
    }
}

/// A publish that did not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    /// What the sink said.
    pub message: String,
    /// The destination refused this message for good (it will never take it): the event
    /// goes to the dead state at once instead of being retried.
    pub permanent: bool,
}

impl SinkError {
    /// A failure worth retrying (the broker unreachable, a timeout, a negative
    /// acknowledgement).
    pub fn retry(message: impl std::fmt::Display) -> Self {
        SinkError {
            message: message.to_string(),
            permanent: false,
        }
    }

    /// A refusal for good: the event goes to the dead state.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        SinkError {
            message: message.to_string(),
            permanent: true,
        }
    }
}
