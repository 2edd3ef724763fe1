//! Coalesced apply-first writes: while one write unit is in flight, the new requests
//! that arrive wait and go together in the next unit, one commit for all.
//!
//! A commit is the expensive part of a new request: a WAL flush on PostgreSQL, the write
//! lock on SQLite. Writing the requests waiting at that moment in one unit shares it.
//! Nothing waits on purpose: a request that finds no write in flight goes at once, on its
//! own connection, exactly as it would without coalescing, so a lone caller pays what it
//! always paid; batches form only from callers that would otherwise queue for
//! connections or locks.
//!
//! A batch holds at most one request per entity (the others wait for a later batch), so
//! it never races itself. Each request is answered on its own, from what the store's
//! unit says of it: applied, or not applied (the caller then reads and judges, exactly
//! as after its own apply-first write). A batch that fails (a dropped connection, a
//! deadlock, one request's bad data) answers each of its requests "failed", and each
//! goes on along the ordinary path: its own apply-first write, which the history's
//! unique key stops if the batch committed after all, and its read, which then finds
//! the request recorded under its own write id.
//!
//! A caller that stops waiting while its request is queued is left out of the batch
//! (its write is never sent, as its answer said); one that stops waiting while its batch
//! is in flight does not cancel the batch for the others: the batch runs on a task of
//! its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::oneshot;

use super::queue::{Drain, Entered, Queue, Turn};
use crate::store::{Audit, FirstWrite, Key, Lease, OwnedKey, Request, Store, Unpooled};
use crate::support::detach::Stage;
use crate::support::trace::TraceContext;

/// The most requests in one batch.
const MAX_BATCH: usize = 64;

/// The apply-first writes of one engine and its clones.
pub(crate) struct Writes<S> {
    store: S,
    /// A batch that takes longer than this is dropped (its connection closed) and its
    /// requests answered "failed".
    limit: Duration,
    queue: Queue<Queued>,
    /// Units written for two requests or more, the requests they carried, and the units
    /// that failed.
    units: AtomicU64,
    carried: AtomicU64,
    failed: AtomicU64,
}

/// How many write units of an engine carried several requests, and how many requests
/// they carried in all (see [`Engine::coalesced_writes`](crate::Engine::coalesced_writes)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalescedWrites {
    /// Write units that carried two requests or more.
    pub units: u64,
    /// The requests those units carried.
    pub requests: u64,
    /// Units of queued requests that failed (a lost connection, a deadlock, a timeout),
    /// whose requests each went their own way.
    pub failed: u64,
}

/// What a queued request is told.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The batch's unit ran and said this of the request.
    Written(FirstWrite),
    /// The caller had stopped waiting before its batch was formed: nothing was sent.
    Abandoned,
    /// The batch failed, or was never run: the request may or may not have been
    /// written. The caller goes on along the ordinary path.
    Failed,
}

/// A request waiting for the next batch, with what it owns of its [`Request`].
pub(crate) struct Queued {
    key: OwnedKey,
    from_states: Vec<&'static str>,
    to_states: Vec<&'static str>,
    emits: Vec<Option<&'static str>>,
    payload_hash: Option<String>,
    payload: Option<String>,
    write_id: i64,
    actor: Option<String>,
    reason: Option<String>,
    machine: &'static str,
    event_body: Option<String>,
    trace: Option<TraceContext>,
    stage: Arc<Stage>,
    reply: oneshot::Sender<Answer>,
}

impl Queued {
    fn request(&self) -> Request<'_> {
        Request {
            key: self.key.as_key(),
            from_states: &self.from_states,
            to_states: &self.to_states,
            payload_hash: self.payload_hash.as_deref(),
            payload: self.payload.as_deref(),
            write_id: self.write_id,
            audit: Audit {
                actor: self.actor.as_deref(),
                reason: self.reason.as_deref(),
            },
            emits: &self.emits,
            machine: self.machine,
            event_body: self.event_body.as_deref(),
            trace: self.trace.as_ref(),
        }
    }
}

/// A request's place: the write turn (no write was in flight: it writes at once, alone,
/// on its own connection, and hands the turn on when its write is done, or it gives
/// up), or queued for the next batch, whose answer comes on the receiver. A dropped
/// sender (the batch's task ended without answering) means [`Answer::Failed`].
pub(crate) type Place<S> = Entered<Writes<S>, oneshot::Receiver<Answer>>;

/// The write turn of a request that writes alone.
pub(crate) type Slot<S> = Turn<Writes<S>>;

impl<S: Store> Writes<S> {
    pub(crate) fn new(store: S, limit: Duration) -> Arc<Self> {
        Arc::new(Writes {
            store,
            limit,
            queue: Queue::default(),
            units: AtomicU64::new(0),
            carried: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// The units so far that carried several requests.
    pub(crate) fn coalesced(&self) -> CoalescedWrites {
        CoalescedWrites {
            units: self.units.load(Relaxed),
            requests: self.carried.load(Relaxed),
            failed: self.failed.load(Relaxed),
        }
    }

    /// Takes the write turn for `request`, or queues it.
    pub(crate) fn turn(self: &Arc<Self>, request: &Request<'_>, stage: &Arc<Stage>) -> Place<S> {
        Queue::enter(self, || {
            let (reply, answer) = oneshot::channel();
            let queued = Queued {
                key: OwnedKey::from(request.key),
                from_states: request.from_states.to_vec(),
                to_states: request.to_states.to_vec(),
                emits: request.emits.to_vec(),
                payload_hash: request.payload_hash.map(str::to_string),
                payload: request.payload.map(str::to_string),
                write_id: request.write_id,
                actor: request.audit.actor.map(str::to_string),
                reason: request.audit.reason.map(str::to_string),
                machine: request.machine,
                event_body: request.event_body.map(str::to_string),
                trace: request.trace.cloned(),
                stage: stage.clone(),
                reply,
            };
            (queued, answer)
        })
    }

    /// The requests of `batch` whose callers still wait, each marked as sent; the others
    /// are told they were left out.
    fn to_send(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let (sent, gone): (Vec<Queued>, Vec<Queued>) =
            batch.into_iter().partition(|q| q.stage.wrote());
        for queued in gone {
            let _ = queued.reply.send(Answer::Abandoned);
        }
        sent
    }

    /// One unit for `batch` (its requests in the order of their entities, so that two
    /// batches lock rows in the same order), and each request's answer. A request whose
    /// caller stopped waiting before the unit was ready to go (its connection taken, or,
    /// on a writer of the store's own, at once) is left out: nothing is sent for it, as
    /// its caller was told.
    async fn write(&self, mut batch: Vec<Queued>) {
        batch.sort_by_key(|q| q.key.order_id);
        let unit = async {
            // On a writer of the store's own, the unit takes no connection of the pool's.
            let unpooled = self.store.writes_unpooled();
            let mut lease = match unpooled {
                true => None,
                false => Some(Lease::acquire(&self.store).await?),
            };
            batch = self.to_send(std::mem::take(&mut batch));
            if batch.is_empty() {
                if let Some(lease) = lease {
                    lease.release();
                }
                return Ok(Vec::new());
            }
            let mut requests: Vec<Request<'_>> = batch.iter().map(Queued::request).collect();
            let unpooled = match unpooled {
                true => self.store.apply_first_unpooled(&requests).await,
                false => Ok(Unpooled::NoWriter),
            };
            let written = match unpooled {
                Ok(Unpooled::Written(written)) => Ok(written),
                Err(e) => Err(e),
                // Through a connection: the store's unit, or one request at a time where
                // a row met a unique key.
                Ok(other) => {
                    let mut lease = match lease.take() {
                        Some(lease) => lease,
                        None => {
                            drop(requests);
                            // No writer was free: nothing was sent (a queued caller has
                            // sent no write before its batch). The callers still waiting
                            // once a connection is had go.
                            if other == Unpooled::NoWriter {
                                batch.iter().for_each(|q| q.stage.wrote_nothing());
                            }
                            let lease = Lease::acquire(&self.store).await?;
                            if other == Unpooled::NoWriter {
                                batch = self.to_send(std::mem::take(&mut batch));
                                if batch.is_empty() {
                                    lease.release();
                                    return Ok(Vec::new());
                                }
                            }
                            requests = batch.iter().map(Queued::request).collect();
                            lease
                        }
                    };
                    let written = self.store.apply_first(lease.conn(), &requests).await;
                    lease.release_after(&written);
                    written
                }
            };
            if written.is_ok() {
                if requests.len() > 1 {
                    self.units.fetch_add(1, Relaxed);
                    self.carried.fetch_add(requests.len() as u64, Relaxed);
                }
                crate::observe::write_unit(S::BACKEND, requests.len());
            }
            written
        };
        let written = match tokio::time::timeout(self.limit, unit).await {
            Ok(Ok(written)) if written.len() == batch.len() => Some(written),
            Ok(Ok(written)) => {
                tracing::warn!(
                    asked = batch.len(),
                    answered = written.len(),
                    "batched write answered the wrong number of requests"
                );
                None
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, size = batch.len(), "batched write failed");
                None
            }
            Err(_) => {
                tracing::debug!(size = batch.len(), "batched write outlived its limit");
                None
            }
        };
        match written {
            Some(written) => {
                for (queued, write) in batch.into_iter().zip(written) {
                    // A caller that has given up has dropped its receiver.
                    let _ = queued.reply.send(Answer::Written(write));
                }
            }
            None => {
                self.failed.fetch_add(1, Relaxed);
                for queued in batch {
                    let _ = queued.reply.send(Answer::Failed);
                }
            }
        }
    }
}

impl<S: Store> Drain for Writes<S> {
    type Item = Queued;

    fn queue(&self) -> &Queue<Queued> {
        &self.queue
    }

    /// Writes the queue in batches until it is empty.
    async fn drain(self: Arc<Self>, mut turn: Turn<Self>) {
        while let Some(batch) = Queue::next(&mut turn, next_batch) {
            self.write(batch).await;
            // The callers just answered come back with their next requests once they
            // run; letting them run first makes the next batch theirs too.
            tokio::task::yield_now().await;
        }
    }
}

/// The next batch: up to [`MAX_BATCH`] queued requests, the first of each entity in the
/// order they came; the others stay queued, in their order.
fn next_batch(queue: &mut Vec<Queued>) -> Vec<Queued> {
    let mut batch: Vec<Queued> = Vec::new();
    let mut rest: Vec<Queued> = Vec::new();
    for queued in queue.drain(..) {
        let taken = batch
            .iter()
            .any(|b| same_entity(b.key.as_key(), queued.key.as_key()));
        if taken || batch.len() == MAX_BATCH {
            rest.push(queued);
        } else {
            batch.push(queued);
        }
    }
    *queue = rest;
    batch
}

fn same_entity(a: Key<'_>, b: Key<'_>) -> bool {
    a.order_id == b.order_id
}
