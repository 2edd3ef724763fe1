//! What the files of a request's way share (`attempt.rs`, `writes.rs`, `settle.rs`): the
//! validated request, where its connection comes from, and the answers each of them may
//! give without the others.

use std::sync::Arc;

use super::detach::Stage;
use super::input::Payload;
use crate::error::Error;
use crate::machine::StateMachine;
use crate::store::{Apply, Audit, Key, Lease, Store, Txn};
use crate::support::trace::TraceContext;

/// A validated request.
pub(super) struct Req<'r, M: StateMachine> {
    pub(super) key: Key<'r>,
    pub(super) event: M::Event,
    pub(super) payload: Option<&'r Payload>,
    /// Stored with every history row this call writes: the read-back after a lost
    /// connection answers `Applied` only for a row that carries it.
    pub(super) write_id: i64,
    /// Who asked and why, stored with the history row.
    pub(super) audit: Audit<'r>,
    /// How far the call got, for the answer if its deadline passes.
    pub(super) stage: &'r Arc<Stage>,
    /// The request's own event body (JSON text), for the outbox row of an emitting edge.
    pub(super) event_body: Option<&'r str>,
    /// The request's trace context, for the outbox row of an emitting edge.
    pub(super) trace: Option<&'r TraceContext>,
    /// Set when a guarded unit judged the request unrecorded from the entity's state
    /// alone and then lost its write (the history held the request after all: an entity
    /// whose state disagrees with its history): every later attempt reads the history.
    pub(super) read_history: std::sync::atomic::AtomicBool,
    /// A timer's firing: the version the entity must still be at (the one its state's
    /// timer was armed at), else the answer is [`Error::Moot`]. Judged in a unit of its
    /// own.
    pub(super) at_version: Option<i64>,
    /// The state the timer was armed in, with [`at_version`](Self::at_version): inside
    /// a caller's transaction, an edge with no rules is written first with both as its
    /// predicate (`attempt.rs`).
    pub(super) armed_in: Option<M::State>,
}

/// A fresh write id: 64 random bits (the two halves of a random UUID folded, so that
/// its fixed version bits are mixed with random ones). Two calls of one request sharing
/// one would need a collision of two random 64-bit numbers.
pub(super) fn write_id() -> i64 {
    let (high, low) = uuid::Uuid::new_v4().as_u64_pair();
    (high ^ low) as i64
}

/// The answer of a call whose caller stopped waiting before it sent a write: nobody
/// receives it, and nothing is written.
pub(super) fn abandoned<M: StateMachine>(req: &Req<'_, M>) -> Error {
    tracing::debug!(
        order_id = req.key.order_id,
        event = req.key.event,
        "caller gone before the write: not sent"
    );
    Error::DeadlineExceeded {
        deadline: std::time::Duration::ZERO,
        in_doubt: false,
    }
}

impl<M: StateMachine> Req<'_, M> {
    /// Whether the request is judged and written in a unit of its own (`guarded.rs`).
    pub(super) fn own_unit<S: crate::store::Store>(&self, engine: &super::Engine<M, S>) -> bool {
        self.at_version.is_some() || engine.has_rules(self.event)
    }

    pub(super) fn hash(&self) -> Option<&str> {
        self.payload.map(|p| p.hash.as_str())
    }

    /// The write after a read that judged the entity at `from` and `version`: the move
    /// to `to`, its history row and its outbox row.
    pub(super) fn apply(&self, from: M::State, to: M::State, version: i64) -> Apply<'_> {
        Apply {
            key: self.key,
            from: from.into(),
            to: to.into(),
            version,
            payload_hash: self.hash(),
            payload: self.payload.map(|p| p.json.as_str()),
            write_id: self.write_id,
            audit: self.audit,
            emits: M::emits(from, self.event),
            machine: M::NAME,
            event_body: self.event_body,
            trace: self.trace,
        }
    }
}

/// Where a request's connection comes from.
pub(super) enum Conn<'c, S: Store> {
    /// The engine's own, from the pool, taken when first needed and replaced after a
    /// failure that lost it. Dropped mid-request, it is closed (see [`Lease`]).
    Pooled(Option<Lease<S>>),
    /// The caller's transaction.
    Caller(&'c mut S::Conn),
}

impl<S: Store> Conn<'_, S> {
    pub(super) fn txn(&self) -> Txn {
        match self {
            Conn::Pooled(_) => Txn::Own,
            Conn::Caller(_) => Txn::Caller,
        }
    }

    pub(super) async fn get(&mut self, store: &S) -> Result<&mut S::Conn, sqlx::Error> {
        self.get_for(store, false).await
    }

    /// The connection; for a unit of its own (`write`), with the store's writer's turn
    /// where the store hands them out (SQLite: its units then queue in the process
    /// instead of spinning on the database's busy lock). A connection held without the
    /// turn is put back first: the turn is taken before a connection, never while
    /// holding one.
    pub(super) async fn get_for(
        &mut self,
        store: &S,
        write: bool,
    ) -> Result<&mut S::Conn, sqlx::Error> {
        match self {
            Conn::Caller(conn) => Ok(conn),
            Conn::Pooled(lease) => {
                if write && let Some(held) = lease.take_if(|held| !held.for_write()) {
                    held.release();
                }
                let held = match lease.take() {
                    Some(held) => held,
                    None if write => Lease::acquire_for_write(store).await?,
                    None => Lease::acquire(store).await?,
                };
                Ok(lease.insert(held).conn())
            }
        }
    }

    /// Returns a pooled connection to the pool while the request waits for something
    /// else (its place in a batch); it takes one again when next needed.
    pub(super) fn put_back(&mut self) {
        if let Conn::Pooled(lease) = self
            && let Some(lease) = lease.take()
        {
            lease.release();
        }
    }

    /// The connection failed: closed, and replaced when next needed.
    pub(super) fn lost(&mut self) {
        if let Conn::Pooled(lease) = self {
            *lease = None;
        }
    }

    /// The request ran to its end: a pooled connection goes back to the pool.
    pub(super) fn finish(self) {
        if let Conn::Pooled(Some(lease)) = self {
            lease.release();
        }
    }
}

/// The outbox already holds an event of the entity at the version the write would make:
/// its version was reused (its history deleted, or two entity tables under one machine
/// name). Nothing was written; a person must look.
pub(super) fn outbox_taken(key: Key<'_>) -> Error {
    Error::CorruptState {
        order_id: key.order_id,
        value: "an outbox row at the next version already exists".into(),
    }
}
