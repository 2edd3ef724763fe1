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

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::store::{Key, Lease, OwnedKey, Prior, Store, Txn};

/// The most requests one batch takes from the queue; the store may read them in several
/// statements (at most `Store::BATCH_READ_MAX` in one).
const MAX_BATCH: usize = 128;

/// The read-first reads of one engine and its clones.
pub(crate) struct Reads<S> {
    store: S,
    state: Mutex<State>,
}

struct Waiting {
    key: OwnedKey,
    reply: oneshot::Sender<Option<Prior>>,
}

/// One read is in flight at a time (`busy`), and the requests that arrive meanwhile
/// queue for the next. One at a time makes the batches as large as the concurrency
/// allows; measured on PostgreSQL at 8 and 32 callers, two in flight were slower.
#[derive(Default)]
struct State {
    queue: Vec<Waiting>,
    busy: bool,
}

impl<S: Store> Reads<S> {
    pub(crate) fn new(store: S) -> Arc<Self> {
        Arc::new(Reads {
            store,
            state: Mutex::default(),
        })
    }

    /// The request's history row: `Some(prior)` if it was read (`prior` is `None` for a
    /// request never recorded), `None` if it could not be.
    pub(crate) async fn prior(self: &Arc<Self>, key: Key<'_>) -> Option<Option<Prior>> {
        let queued = {
            let mut state = self.lock();
            if state.busy {
                let (reply, answer) = oneshot::channel();
                state.queue.push(Waiting {
                    key: OwnedKey::from(key),
                    reply,
                });
                Some(answer)
            } else {
                state.busy = true;
                None
            }
        };
        if let Some(answer) = queued {
            return answer.await.ok();
        }
        // Nothing in flight: read this request alone, at once, on this task.
        let slot = Slot {
            reads: Arc::clone(self),
            held: true,
        };
        let read = self.read(&[OwnedKey::from(key)]).await;
        slot.hand_on();
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

    /// Reads the queue in batches until it is empty, then frees the slot (`slot`, made
    /// before the task was spawned: a task dropped before it first ran frees it too).
    async fn drain(self: Arc<Self>, slot: Slot<S>) {
        loop {
            let batch: Vec<Waiting> = {
                let mut state = self.lock();
                if state.queue.is_empty() {
                    state.busy = false;
                    slot.release();
                    return;
                }
                let n = state.queue.len().min(MAX_BATCH);
                state.queue.drain(..n).collect()
            };
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

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a queue and a flag, consistent after every statement that holds
        // the lock, so a panic elsewhere while it was held leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The right to read (`State::busy`), held by one task at a time. If its holder ends
/// without handing it on (a caller that gives up mid-read, a panic, the runtime shutting
/// down), it is freed here, and the requests queued behind it are answered "not read"
/// (their senders dropped) rather than left waiting for a read that will not come.
struct Slot<S: Store> {
    reads: Arc<Reads<S>>,
    held: bool,
}

impl<S: Store> Slot<S> {
    /// After a lone read: to a drain for the requests that queued meanwhile, if any.
    fn hand_on(mut self) {
        {
            let mut state = self.reads.lock();
            if state.queue.is_empty() {
                state.busy = false;
                self.held = false;
                return;
            }
        }
        // Spawned, not run here: this caller's answer must not wait for theirs, and a
        // caller that gives up must not strand them. The slot goes with the task, outside
        // the state's lock (a task dropped unpolled frees it as it drops).
        let reads = Arc::clone(&self.reads);
        tokio::spawn(reads.drain(self));
    }

    /// Freed by its holder, with the state's lock held.
    fn release(mut self) {
        self.held = false;
    }
}

impl<S: Store> Drop for Slot<S> {
    fn drop(&mut self) {
        if self.held {
            let mut state = self.reads.lock();
            state.busy = false;
            state.queue.clear();
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use tokio::sync::oneshot;

    use super::{Reads, Slot, Waiting};
    use crate::SqliteStore;
    use crate::store::OwnedKey;

    /// As for the coalesced writes: a drain dropped before it first ran (its runtime shut
    /// down) frees the read slot and answers the queued read "not read".
    #[test]
    fn a_drain_dropped_before_it_ran_frees_the_slot() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = runtime.block_on(async {
            SqliteStore::new(sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap())
        });
        let reads = Reads::new(store);
        let (reply, answer) = oneshot::channel();
        {
            let mut state = reads.lock();
            state.busy = true;
            state.queue.push(Waiting {
                key: OwnedKey {
                    order_id: 2,
                    event: "Pay",
                    ref_id: "pay".into(),
                },
                reply,
            });
        }
        let slot = Slot {
            reads: reads.clone(),
            held: true,
        };
        runtime.block_on(async { slot.hand_on() });
        assert!(reads.lock().busy, "the drain did not take the slot");
        drop(runtime);
        assert!(!reads.lock().busy, "the slot stayed taken");
        assert!(
            answer.blocking_recv().is_err(),
            "the queued read was answered"
        );
    }
}
