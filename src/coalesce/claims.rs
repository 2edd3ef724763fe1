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
//! lease runs out, as the record of any claim whose caller went away does. A caller
//! that stops waiting while its claim goes alone hands the claims queued behind it on
//! to a drain of their own (`src/coalesce/queue.rs`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::oneshot;

use super::queue::{self, Drain, Entered, Queue, Turn};
use crate::store::{Lease, Store};

/// The most claims in one batch.
const MAX_BATCH: usize = 64;

/// A claim that can wait in the queue (it owns its values), and the statement that
/// writes a batch of them on store `S`.
pub(crate) trait Queued<S: Store>: Send + Sync + Sized + 'static {
    /// The owner token the claim minted.
    fn token(&self) -> &str;
    /// Whether its caller stopped waiting: it is left out of the next batch, never sent.
    fn left(&self) -> bool {
        false
    }
    /// Inserts the claims whose records do not exist yet, in one statement where the
    /// store can: the tokens of those that hold their records now, with their attempts.
    fn write(
        store: &S,
        conn: &mut S::Conn,
        batch: &[Self],
    ) -> impl Future<Output = Result<Vec<(String, i32)>, sqlx::Error>> + Send;

    /// Gives up a claim this batch granted to a caller that had left (its receiver
    /// dropped while the batch was on its way), so its record is not held until its
    /// lease runs out. The default leaves it to the lease.
    fn release(
        store: &S,
        conn: &mut S::Conn,
        claim: &Self,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (store, conn, claim);
        std::future::ready(Ok(()))
    }
}

/// The claims of one [`Records`](crate::Records) or [`Flows`](crate::Flows) and its
/// clones.
pub(crate) struct Claims<S, Q> {
    store: S,
    /// A batch's statement that takes longer than this is dropped (its connection
    /// closed), and its claims go the ordinary way.
    limit: Duration,
    queue: Queue<Waiting<Q>>,
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

/// A queued claim. Its answer: `Some(attempt)` if the batch's statement made it the
/// record's holder, `None` if it wrote nothing for it; the sender dropped if the batch
/// failed.
pub(crate) struct Waiting<Q> {
    claim: Q,
    reply: oneshot::Sender<Option<i32>>,
}

/// A claim's place: the turn (no statement was in flight: this claim goes at once,
/// alone, and hands the turn on when its statement is done), or queued for the next
/// batch, whose answer comes on the receiver.
pub(crate) type Place<S, Q> = Entered<Claims<S, Q>, oneshot::Receiver<Option<i32>>>;

impl<S: Store, Q: Queued<S>> Claims<S, Q> {
    pub(crate) fn new(store: S, limit: Duration) -> Arc<Self> {
        Arc::new(Claims {
            store,
            limit,
            queue: Queue::default(),
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
    pub(crate) fn turn(self: &Arc<Self>, claim: impl FnOnce() -> Q) -> Place<S, Q> {
        Queue::enter(self, || {
            let (reply, answer) = oneshot::channel();
            let claim = claim();
            (Waiting { claim, reply }, answer)
        })
    }
}

impl<S: Store, Q: Queued<S>> Drain for Claims<S, Q> {
    type Item = Waiting<Q>;

    fn queue(&self) -> &Queue<Waiting<Q>> {
        &self.queue
    }

    /// Writes the queue in batches until it is empty.
    async fn drain(self: Arc<Self>, mut turn: Turn<Self>) {
        // A caller that stopped waiting has dropped its receiver: its claim is left out,
        // never sent.
        while let Some(batch) = Queue::next(&mut turn, |waiting| {
            queue::first(waiting, MAX_BATCH, |w: &Waiting<Q>| {
                !w.reply.is_closed() && !w.claim.left()
            })
        }) {
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
                    let mut left = Vec::new();
                    for (claim, reply) in claims.iter().zip(replies) {
                        let attempt = held
                            .iter()
                            .find(|(token, _)| token == claim.token())
                            .map(|(_, attempt)| *attempt);
                        // A caller that has given up has dropped its receiver: a claim
                        // granted to it is given up.
                        if reply.send(attempt).is_err() && attempt.is_some() {
                            left.push(claim);
                        }
                    }
                    if !left.is_empty() {
                        let release = async {
                            let mut lease = Lease::acquire_for_write(&self.store).await?;
                            let mut out = Ok(());
                            for claim in left {
                                out = Q::release(&self.store, lease.conn(), claim).await;
                                if out.is_err() {
                                    break;
                                }
                            }
                            lease.release_after(&out);
                            out
                        };
                        if let Ok(Err(e)) | Err(e) = tokio::time::timeout(self.limit, release)
                            .await
                            .map_err(|_| sqlx::Error::PoolTimedOut)
                        {
                            tracing::warn!(error = %e, "releasing claims granted to callers that left failed; they are claimable again when their leases run out");
                        }
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
}
