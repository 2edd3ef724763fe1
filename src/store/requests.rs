//! What the seam's operations take and return: where an operation runs ([`Txn`]), a
//! request's identity ([`Key`]) and what it asks ([`Request`], with who and why:
//! [`Audit`]), the write after a read ([`Apply`]), and what the stores answer
//! ([`FirstWrite`], [`Written`], [`Observed`]).

use super::rows::{Entity, Prior};
use crate::support::trace::TraceContext;

/// Where an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Txn {
    /// On a connection of the engine's own: each read stands alone, and a write unit is
    /// its own transaction.
    Own,
    /// Inside the caller's transaction: reads see the latest commits, and a write unit is
    /// a savepoint.
    Caller,
}

/// The identity of a transition request.
#[derive(Debug, Clone, Copy)]
pub struct Key<'a> {
    /// The entity.
    pub order_id: i64,
    /// The event name.
    pub event: &'static str,
    /// The caller's reference.
    pub ref_id: &'a str,
}

/// A [`Key`] that owns its reference, for a request queued for a batched read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedKey {
    /// The entity.
    pub order_id: i64,
    /// The event name.
    pub event: &'static str,
    /// The caller's reference.
    pub ref_id: String,
}

impl OwnedKey {
    /// Borrowed again.
    pub fn as_key(&self) -> Key<'_> {
        Key {
            order_id: self.order_id,
            event: self.event,
            ref_id: &self.ref_id,
        }
    }
}

impl From<Key<'_>> for OwnedKey {
    fn from(key: Key<'_>) -> Self {
        OwnedKey {
            order_id: key.order_id,
            event: key.event,
            ref_id: key.ref_id.to_string(),
        }
    }
}

/// Who asked for a transition and why, stored with the history row it writes (for
/// support and audit); not part of the request's identity, so a repeat carrying another
/// actor or reason is still a replay, and the row keeps the first call's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audit<'a> {
    /// Who asked: a user, an operator, a service (at most 255 characters).
    pub actor: Option<&'a str>,
    /// Why (at most 1,000 characters).
    pub reason: Option<&'a str>,
}

/// A transition request as the apply-first unit sees it: the key, the edges its event
/// may take, and the payload.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The request's identity.
    pub key: Key<'a>,
    /// States the event leaves from, in the same order as `to_states`.
    pub from_states: &'a [&'static str],
    /// The state each of `from_states` leads to on this event.
    pub to_states: &'a [&'static str],
    /// Payload fingerprint.
    pub payload_hash: Option<&'a str>,
    /// Payload JSON text.
    pub payload: Option<&'a str>,
    /// The call's write id, stored with the history row it writes, so that a read-back
    /// after a lost connection tells this call's own write from an earlier one.
    pub write_id: i64,
    /// Who asked and why, stored with the history row.
    pub audit: Audit<'a>,
    /// The domain event each edge emits (parallel to `from_states`): an outbox row is
    /// written, in the same unit, for an edge that names one.
    pub emits: &'a [Option<&'static str>],
    /// The machine's name, the outbox row's first key.
    pub machine: &'static str,
    /// The request's own event body (JSON text), stored in the outbox row if an edge
    /// emits.
    pub event_body: Option<&'a str>,
    /// The request's trace context, stored in the outbox row if an edge emits, for the
    /// relay to carry to the broker.
    pub trace: Option<&'a TraceContext>,
}

impl Request<'_> {
    /// The `traceparent` stored with the outbox row, if the request has a trace context.
    pub fn traceparent(&self) -> Option<&str> {
        self.trace.map(TraceContext::traceparent)
    }

    /// The `tracestate` stored with the outbox row, if the request's context has one.
    pub fn tracestate(&self) -> Option<&str> {
        self.trace.and_then(TraceContext::tracestate)
    }

    /// Whether any edge of the request emits an event (its unit then writes the outbox
    /// row too).
    pub fn emits_any(&self) -> bool {
        self.emits.iter().any(Option::is_some)
    }

    /// Whether the event has exactly one source state: a store whose update cannot return
    /// the row it matched can record `from` only then.
    pub fn has_one_edge(&self) -> bool {
        matches!((self.from_states, self.to_states), ([_], [_]))
    }

    /// The write of this request along the edge `from` → `to`, from `version`.
    pub fn apply(
        &self,
        from: &'static str,
        to: &'static str,
        version: i64,
        emits: Option<&'static str>,
    ) -> Apply<'_> {
        Apply {
            key: self.key,
            from,
            to,
            version,
            payload_hash: self.payload_hash,
            payload: self.payload,
            write_id: self.write_id,
            audit: self.audit,
            emits,
            machine: self.machine,
            event_body: self.event_body,
            trace: self.trace,
        }
    }
}

/// What the apply-first unit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstWrite {
    /// It wrote the transition: `from`, `to` and the version after it.
    Applied {
        /// State before.
        from: String,
        /// State after.
        to: String,
        /// Version after.
        version: i64,
    },
    /// Nothing matched, or the request was recorded before: nothing was written.
    NotApplied,
    /// This store does not try such a request before reading (for example an event with
    /// several source states, whose recorded `from` would need the matched row).
    NotTried,
    /// The outbox already holds an event of this entity at the version the write would
    /// make (the entity's version was reused behind orderly's back): nothing was written.
    OutboxTaken,
}

/// What a store's own writer did with an apply-first unit
/// ([`Store::apply_first_unpooled`](super::Store::apply_first_unpooled)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unpooled {
    /// The unit went: one answer per request, in order, as
    /// [`apply_first`](super::Store::apply_first) gives them.
    Written(Vec<FirstWrite>),
    /// Nothing was written: a row met a unique key the writer does not tell apart (the
    /// history's, a request recorded before; or the outbox's, a version reused). The unit
    /// goes through a connection, whose [`apply_first`](super::Store::apply_first) tells
    /// which.
    KeyMet,
    /// Nothing was sent: the store has no writer free now (none, gone, or busy). The unit
    /// goes through a connection of the pool's.
    NoWriter,
}

/// A conditional write the engine has decided on after reading.
#[derive(Debug, Clone, Copy)]
pub struct Apply<'a> {
    /// The request.
    pub key: Key<'a>,
    /// Expected current status.
    pub from: &'static str,
    /// New status.
    pub to: &'static str,
    /// Expected current version; the new one is `version + 1`.
    pub version: i64,
    /// Payload fingerprint.
    pub payload_hash: Option<&'a str>,
    /// Payload JSON text.
    pub payload: Option<&'a str>,
    /// The call's write id (see [`Request::write_id`]).
    pub write_id: i64,
    /// Who asked and why, stored with the history row.
    pub audit: Audit<'a>,
    /// The domain event the edge emits: an outbox row is written with the history row.
    pub emits: Option<&'static str>,
    /// The machine's name, the outbox row's first key.
    pub machine: &'static str,
    /// The request's own event body (JSON text), stored in the outbox row.
    pub event_body: Option<&'a str>,
    /// The request's trace context, stored in the outbox row.
    pub trace: Option<&'a TraceContext>,
}

impl Apply<'_> {
    /// The `traceparent` stored with the outbox row, if the request has a trace context.
    pub fn traceparent(&self) -> Option<&str> {
        self.trace.map(TraceContext::traceparent)
    }

    /// The `tracestate` stored with the outbox row, if the request's context has one.
    pub fn tracestate(&self) -> Option<&str> {
        self.trace.and_then(TraceContext::tracestate)
    }
}

/// What the write unit after a read did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Both rows are written.
    Applied,
    /// Someone moved first (the guarded update matched nothing, or a twin's history row
    /// holds the unique key): nothing was written.
    Lost,
    /// The outbox already holds an event of this entity at the new version: nothing was
    /// written.
    OutboxTaken,
}

/// What the judge reads: the entity and this request's history row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The entity.
    pub entity: Entity,
    /// The history row of this exact `(order, event, ref)`, if any.
    pub prior: Option<Prior>,
}
