//! Coalesced claims of records (an idempotency record's claim, a flow's start): while one
//! claim statement is in flight, the new claims that arrive wait and go together in the
//! next, one statement and one commit for all, as the engine's writes do (docs/design.md,
//! "Why coalesce writes, and why without a timer?").
//!
//! Nothing waits on purpose: a claim that finds no statement in flight goes at once, with
//! the ordinary claim statement, on its own task, exactly as without coalescing. A queued
//! claim goes in the next batch, whose one statement inserts the records that do not
//! exist yet. A claim whose record exists (done, in flight, past its lease or retention,
//! another input's), and every claim of a batch that failed, goes on along the ordinary
//! path: the record's read and its judgement, then its own claim statement if the
//! record can be taken. A batch that committed after all is found by that read: the
//! record is under the claim's own token.
//!
//! A caller that stops waiting while its claim is queued is left out of the batch (its
//! claim is never sent). Once its batch is in flight, the batch runs for the others on
//! a task of its own, and the claim may commit: its record then stays held until its
//! lease runs out, as the record of any claim whose caller went away does.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

use std::future::Future;

use super::{Lease, Store};

/// The most claims in one batch.
const MAX_BATCH: usize = 64;

/// A claim that can wait in the queue (it owns its values), and the statement that
/// writes a batch of them on store `S`.
pub(crate) trait Queued<S: Store>: Send + Sync + Sized + 'static {
    /// The owner token the claim minted.
    fn token(&self) -> &str;
    /// Inserts the claims whose records do not exist yet, in one statement where the
    /// store can: the tokens of those that hold their records now, with their attempts.
    fn write(
        store: &S,
        conn: &mut S::Conn,
        batch: &[Self],
    ) -> impl Future<Output = Result<Vec<(String, i32)>, sqlx::Error>> + Send;
}

/// The claims of one [`Records`](crate::Records) or [`Flows`](crate::Flows) and its
/// clones.
pub(crate) struct Claims<S, Q> {
    store: S,
    /// A batch's statement that takes longer than this is dropped (its connection
    /// closed), and its claims go the ordinary way.
    limit: Duration,
    state: Mutex<State<Q>>,
    /// Batches of two claims or more, and the claims they carried.
    batches: AtomicU64,
    carried: AtomicU64,
}

impl<S, Q> std::fmt::Debug for Claims<S, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claims")
            .field("batches", &self.batches.load(Relaxed))
            .field("carried", &self.carried.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// How many claims went in batches of two or more (see
/// [`Records::coalesced_claims`](crate::Records::coalesced_claims) and
/// [`Flows::coalesced_starts`](crate::Flows::coalesced_starts)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalescedClaims {
    /// Statements that carried two claims or more.
    pub batches: u64,
    /// The claims those statements carried.
    pub claims: u64,
}

/// One statement in flight at a time (`busy`); the claims that arrive meanwhile queue for
/// the next.
struct State<Q> {
    queue: Vec<Waiting<Q>>,
    busy: bool,
}

impl<Q> Default for State<Q> {
    fn default() -> Self {
        State {
            queue: Vec::new(),
            busy: false,
        }
    }
}

/// A queued claim. Its answer: `Some(attempt)` if the batch's statement made it the
/// record's holder, `None` if it wrote nothing for it; the sender dropped if the batch
/// failed.
struct Waiting<Q> {
    claim: Q,
    reply: oneshot::Sender<Option<i32>>,
}

/// A claim's turn.
pub(crate) enum Turn<S: Store, Q: Queued<S>> {
    /// No statement was in flight: this claim goes at once, alone, and hands the turn on
    /// when its statement is done.
    Alone(Slot<S, Q>),
    /// Queued for the next batch: its answer comes here.
    Queued(oneshot::Receiver<Option<i32>>),
}

impl<S: Store, Q: Queued<S>> Claims<S, Q> {
    pub(crate) fn new(store: S, limit: Duration) -> Arc<Self> {
        Arc::new(Claims {
            store,
            limit,
            state: Mutex::default(),
            batches: AtomicU64::new(0),
            carried: AtomicU64::new(0),
        })
    }

    pub(crate) fn coalesced(&self) -> CoalescedClaims {
        CoalescedClaims {
            batches: self.batches.load(Relaxed),
            claims: self.carried.load(Relaxed),
        }
    }

    /// Takes the turn if no statement is in flight, else queues the claim (`claim()`) for
    /// the next.
    pub(crate) fn turn(self: &Arc<Self>, claim: impl FnOnce() -> Q) -> Turn<S, Q> {
        let mut state = self.lock();
        if state.busy {
            let (reply, answer) = oneshot::channel();
            state.queue.push(Waiting {
                claim: claim(),
                reply,
            });
            Turn::Queued(answer)
        } else {
            state.busy = true;
            Turn::Alone(Slot {
                claims: Arc::clone(self),
                held: true,
            })
        }
    }

    /// Writes the queue in batches until it is empty, then frees the turn (`slot`, made
    /// before the task was spawned: a task dropped before it first ran frees it too).
    async fn drain(self: Arc<Self>, slot: Slot<S, Q>) {
        loop {
            let batch: Vec<Waiting<Q>> = {
                let mut state = self.lock();
                // A caller that stopped waiting has dropped its receiver: its claim is
                // left out, never sent.
                state.queue.retain(|w| !w.reply.is_closed());
                if state.queue.is_empty() {
                    state.busy = false;
                    slot.release();
                    return;
                }
                let n = state.queue.len().min(MAX_BATCH);
                state.queue.drain(..n).collect()
            };
            let (claims, replies): (Vec<Q>, Vec<_>) =
                batch.into_iter().map(|w| (w.claim, w.reply)).unzip();
            let write = async {
                let mut lease = Lease::acquire_for_write(&self.store).await?;
                let out = Q::write(&self.store, lease.conn(), &claims).await;
                lease.release_after(&out);
                out
            };
            match tokio::time::timeout(self.limit, write).await {
                Ok(Ok(held)) => {
                    if claims.len() > 1 {
                        self.batches.fetch_add(1, Relaxed);
                        self.carried.fetch_add(claims.len() as u64, Relaxed);
                    }
                    for (claim, reply) in claims.iter().zip(replies) {
                        let attempt = held
                            .iter()
                            .find(|(token, _)| token == claim.token())
                            .map(|(_, attempt)| *attempt);
                        // A caller that has given up has dropped its receiver.
                        let _ = reply.send(attempt);
                    }
                }
                // The batch's senders are dropped with it: each of its claims goes on
                // along the ordinary path, whose read finds a record this batch wrote.
                Ok(Err(error)) => {
                    tracing::debug!(%error, size = claims.len(), "coalesced claims failed");
                }
                Err(_) => {
                    tracing::debug!(size = claims.len(), "coalesced claims timed out");
                }
            }
            // The callers just answered come back with their next claims once they run;
            // letting them run first makes the next batch theirs too.
            tokio::task::yield_now().await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<Q>> {
        // The state is a queue and a flag, consistent after every statement that holds
        // the lock, so a panic elsewhere while it was held leaves it usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The turn (`State::busy`), held by one task at a time. If its holder ends without
/// handing it on (a caller that gives up mid-claim, a panic), it is freed here, and the
/// claims queued behind it are answered "failed" (their senders dropped): each goes on
/// along the ordinary path.
pub(crate) struct Slot<S: Store, Q: Queued<S>> {
    claims: Arc<Claims<S, Q>>,
    held: bool,
}

impl<S: Store, Q: Queued<S>> Slot<S, Q> {
    /// After a lone claim: to a drain for the claims that queued meanwhile, if any.
    pub(crate) fn hand_on(mut self) {
        {
            let mut state = self.claims.lock();
            if state.queue.is_empty() {
                state.busy = false;
                self.held = false;
                return;
            }
        }
        // Spawned, not run here: this caller's answer must not wait for theirs, and a
        // caller that gives up must not strand them. The turn goes with the task, outside
        // the state's lock (a task dropped unpolled frees it as it drops).
        let claims = Arc::clone(&self.claims);
        tokio::spawn(claims.drain(self));
    }

    /// Freed by its holder, with the state's lock held.
    fn release(mut self) {
        self.held = false;
    }
}

impl<S: Store, Q: Queued<S>> Drop for Slot<S, Q> {
    fn drop(&mut self) {
        if self.held {
            let mut state = self.claims.lock();
            state.busy = false;
            state.queue.clear();
        }
    }
}
