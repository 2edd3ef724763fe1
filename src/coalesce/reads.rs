//! Coalesced read-first reads: while one statement reading requests' history rows is on
//! its way, the reads that arrive wait and go together in the next one.
//!
//! In a storm of duplicates (the situation `ReadFirst` reads first for), every replay is
//! answered by its history row, which never changes once written. Reading one row per
//! round trip makes the round trip's fixed cost (driver, pool, protocol, the server's
//! per-statement work) the whole cost of a replay; reading the rows of all the requests
//! waiting at that moment in one statement shares it. Nothing waits on purpose: a read
//! that finds no statement in flight starts one at once, so a lone caller pays one round
//! trip as before, and batches form only from callers that would otherwise queue for
//! connections.
//!
//! A batch that fails (a dropped connection, a pool timeout) answers every request in
//! it with "not read", and each goes on along the ordinary path (the apply-first write,
//! then a read if that settled nothing), which reports its own errors.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::queue::{self, Drain, Entered, Queue, Turn};
use crate::store::{Key, Lease, OwnedKey, Prior, Store, Txn};

/// The most requests one batch takes from the queue; the store may read them in several
/// statements (at most `Store::BATCH_READ_MAX` in one).
const MAX_BATCH: usize = 128;

/// The read-first reads of one engine and its clones. One read is in flight at a time,
/// and the requests that arrive meanwhile queue for the next. One at a time makes the
/// batches as large as the concurrency allows; measured on PostgreSQL at 8 and 32
/// callers, two in flight were slower.
pub(crate) struct Reads<S> {
    store: S,
    queue: Queue<Waiting>,
}

pub(crate) struct Waiting {
    key: OwnedKey,
    reply: oneshot::Sender<Option<Prior>>,
}

impl<S: Store> Reads<S> {
    pub(crate) fn new(store: S) -> Arc<Self> {
        Arc::new(Reads {
            store,
            queue: Queue::default(),
        })
    }

    /// The request's history row: `Some(prior)` if it was read (`prior` is `None` for a
    /// request never recorded), `None` if it could not be.
    pub(crate) async fn prior(self: &Arc<Self>, key: Key<'_>) -> Option<Option<Prior>> {
        let turn = match Queue::enter(self, || {
            let (reply, answer) = oneshot::channel();
            let key = OwnedKey::from(key);
            (Waiting { key, reply }, answer)
        }) {
            Entered::Queued(answer) => return answer.await.ok(),
            Entered::Alone(turn) => turn,
        };
        // Nothing in flight: read this request alone, at once, on this task.
        let read = self.read(&[OwnedKey::from(key)]).await;
        turn.hand_on();
        read.and_then(|mut priors| priors.pop())
    }

    /// One statement for `keys`; `None` if it failed or answered the wrong number.
    async fn read(&self, keys: &[OwnedKey]) -> Option<Vec<Option<Prior>>> {
        let read = async {
            let mut lease = Lease::acquire(&self.store).await?;
            let priors = self.read_on(lease.conn(), keys).await;
            lease.release_after(&priors);
            priors
        };
        match read.await {
            Ok(priors) if priors.len() == keys.len() => Some(priors),
            Ok(priors) => {
                tracing::warn!(
                    asked = keys.len(),
                    answered = priors.len(),
                    "batched read answered the wrong number of requests"
                );
                None
            }
            Err(error) => {
                tracing::debug!(%error, size = keys.len(), "batched read failed");
                None
            }
        }
    }

    /// `keys` in statements of at most `S::BATCH_READ_MAX`; a lone request with the plain
    /// read, which the stores serve cheaper.
    async fn read_on(
        &self,
        conn: &mut S::Conn,
        keys: &[OwnedKey],
    ) -> Result<Vec<Option<Prior>>, sqlx::Error> {
        let mut priors = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(S::BATCH_READ_MAX) {
            match chunk {
                [key] => priors.push(self.store.prior(conn, key.as_key(), Txn::Own).await?),
                _ => priors.extend(self.store.priors(conn, chunk).await?),
            }
        }
        Ok(priors)
    }
}

impl<S: Store> Drain for Reads<S> {
    type Item = Waiting;

    fn queue(&self) -> &Queue<Waiting> {
        &self.queue
    }

    /// Reads the queue in batches until it is empty.
    async fn drain(self: Arc<Self>, mut turn: Turn<Self>) {
        // A caller that stopped waiting has dropped its receiver: its read is left out.
        while let Some(batch) = Queue::next(&mut turn, |waiting| {
            queue::first(waiting, MAX_BATCH, |w: &Waiting| !w.reply.is_closed())
        }) {
            let keys: Vec<OwnedKey> = batch.iter().map(|w| w.key.clone()).collect();
            if let Some(priors) = self.read(&keys).await {
                for (waiting, prior) in batch.into_iter().zip(priors) {
                    // A caller that has given up has dropped its receiver.
                    let _ = waiting.reply.send(prior);
                }
            }
            // Otherwise the batch's senders are dropped with it: each of its callers goes
            // on along the ordinary path.
            //
            // The callers just answered come back with their next requests once they
            // run; letting them run first makes the next batch theirs too, rather than
            // splitting the callers into two alternating halves.
            tokio::task::yield_now().await;
        }
    }
}
