//! Coalesced writes of records: claims (an idempotency record's claim, a flow's start)
//! and holders' finishes (an idempotency record's completion, failure or release). While
//! one statement of a kind is in flight, the new writes of that kind that arrive wait
//! and go together in the next batch, one commit for all (one statement where the store
//! can), as the engine's writes do (docs/design.md, "Why coalesce writes, and why without
//! a timer?"). Claims are the case described below. A finish is marked sent as its batch
//! goes (past its caller's deadline it is then in doubt, not unsent), and a batch that
//! wrote nothing for it, or failed, leaves it to its ordinary path: the fenced write and,
//! where that writes nothing, the read-back of what became of it
//! (`src/idempotency/finish.rs`).
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
//! claim is never sent). Once its batch holds a connection, its claim is marked sent
//! (past its deadline the caller is told it is in doubt) and goes on off the caller's
//! task: a claim the batch answers held is released, and one it answers not held
//! (MySQL's count that falls short) reads its record, finds it its own and releases it.
//! A caller that stops waiting while its claim goes alone hands the claims queued behind
//! it on to a drain of their own (`src/coalesce/queue.rs`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::oneshot;

use super::queue::{self, Drain, Entered, Queue, Turn};
use crate::store::{Lease, Store};

/// The most writes in one batch.
const MAX_BATCH: usize = 64;

/// A write that can wait in the queue (it owns its values), and the statement that
/// writes a batch of them on store `S`.
pub(crate) trait Queued<S: Store>: Send + Sync + Sized + 'static {
    /// What the batch's statement tells a write it wrote (a claim's attempt number).
    type Answer: Copy + Send + 'static;
    /// Whether a write the batch wrote for a caller that had left is undone
    /// ([`release`](Self::release)).
    const RELEASES: bool = false;

    /// Whether its caller stopped waiting: it is left out of the next batch, never sent.
    fn left(&self) -> bool {
        false
    }
    /// Called for each write of a batch about to be sent: whether it goes (`false`: its
    /// caller left, and it is never sent). A write whose caller's answer depends on
    /// whether it was sent marks it here.
    fn send(&self) -> bool {
        !self.left()
    }
    /// Writes the batch, in one statement where the store can: an answer for each write,
    /// in the batch's order, `Some` for those that landed (claims: that hold their
    /// records now, with their attempts).
    fn write(
        store: &S,
        conn: &mut S::Conn,
        batch: &[Self],
    ) -> impl Future<Output = Result<Vec<Option<Self::Answer>>, sqlx::Error>> + Send;

    /// Undoes a write this batch landed for a caller that had left (its receiver
    /// dropped while the batch was on its way), where [`RELEASES`](Self::RELEASES): a
    /// claim is given up, so its record is not held until its lease runs out.
    fn release(
        store: &S,
        conn: &mut S::Conn,
        claim: &Self,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (store, conn, claim);
        std::future::ready(Ok(()))
    }
}

/// The queued writes of one kind of one [`Records`](crate::Records) or
/// [`Flows`](crate::Flows) and its clones.
pub(crate) struct Batched<S, Q, A> {
    store: S,
    /// A batch's statement that takes longer than this is dropped (its connection
    /// closed), and its writes go the ordinary way.
    limit: Duration,
    queue: Queue<Waiting<Q, A>>,
    /// Batches of two claims or more, and the claims they carried.
    batches: AtomicU64,
    carried: AtomicU64,
}

impl<S, Q, A> std::fmt::Debug for Batched<S, Q, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batched")
            .field("batches", &self.batches.load(Relaxed))
            .field("carried", &self.carried.load(Relaxed))
            .finish_non_exhaustive()
    }
}

/// How many claims (or finishes) went in batches of two or more (see
/// [`Records::coalesced_claims`](crate::Records::coalesced_claims),
/// [`Records::coalesced_finishes`](crate::Records::coalesced_finishes) and
/// [`Flows::coalesced_starts`](crate::Flows::coalesced_starts)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalescedClaims {
    /// Batches that carried two claims (or finishes) or more.
    pub batches: u64,
    /// The claims (or finishes) those batches carried.
    pub claims: u64,
}

/// A queued write. Its answer: `Some` if the batch's statement landed it (a claim: made
/// it the record's holder, with this attempt), `None` if it wrote nothing for it; the
/// sender dropped if the batch failed or the write was left out.
pub(crate) struct Waiting<Q, A> {
    claim: Q,
    reply: oneshot::Sender<Option<A>>,
}

/// A write's place: the turn (no statement was in flight: this write goes at once,
/// alone, and hands the turn on when its statement is done), or queued for the next
/// batch, whose answer comes on the receiver.
pub(crate) type Place<S, Q, A> = Entered<Batched<S, Q, A>, oneshot::Receiver<Option<A>>>;

impl<S: Store, Q: Queued<S, Answer = A>, A: Copy + Send + 'static> Batched<S, Q, A> {
    pub(crate) fn new(store: S, limit: Duration) -> Arc<Self> {
        Arc::new(Batched {
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
    pub(crate) fn turn(self: &Arc<Self>, claim: impl FnOnce() -> Q) -> Place<S, Q, A> {
        Queue::enter(self, || {
            let (reply, answer) = oneshot::channel();
            let claim = claim();
            (Waiting { claim, reply }, answer)
        })
    }
}

impl<S: Store, Q: Queued<S, Answer = A>, A: Copy + Send + 'static> Drain for Batched<S, Q, A> {
    type Item = Waiting<Q, A>;

    fn queue(&self) -> &Queue<Waiting<Q, A>> {
        &self.queue
    }

    /// Writes the queue in batches until it is empty.
    async fn drain(self: Arc<Self>, mut turn: Turn<Self>) {
        // A caller that stopped waiting has dropped its receiver: its claim is left out,
        // never sent.
        while let Some(batch) = Queue::next(&mut turn, |waiting| {
            queue::first(waiting, MAX_BATCH, |w: &Waiting<Q, A>| {
                !w.reply.is_closed() && !w.claim.left()
            })
        }) {
            let size = batch.len();
            // Once the batch holds a connection, each write is marked sent, or left out
            // (its sender dropped: it goes its ordinary way, which sends nothing for a
            // caller that left) if its caller left meanwhile. A batch that gets no
            // connection sends nothing: its senders are dropped with it.
            let write = async {
                let mut lease = Lease::acquire_for_write(&self.store).await?;
                let (claims, replies): (Vec<Q>, Vec<_>) = batch
                    .into_iter()
                    .filter(|w| w.claim.send())
                    .map(|w| (w.claim, w.reply))
                    .unzip();
                if claims.is_empty() {
                    lease.release();
                    return Ok((claims, replies, Vec::new()));
                }
                let out = Q::write(&self.store, lease.conn(), &claims).await;
                lease.release_after(&out);
                out.map(|answers| (claims, replies, answers))
            };
            match tokio::time::timeout(self.limit, write).await {
                Ok(Ok((claims, replies, answers))) => {
                    if claims.len() > 1 {
                        self.batches.fetch_add(1, Relaxed);
                        self.carried.fetch_add(claims.len() as u64, Relaxed);
                    }
                    let mut left = Vec::new();
                    // (A write without an answer, were the store to give fewer, has its
                    // sender dropped: it goes its ordinary way.)
                    for ((claim, reply), attempt) in claims.iter().zip(replies).zip(answers) {
                        // A caller that has given up has dropped its receiver: a claim
                        // granted to it is given up.
                        if reply.send(attempt).is_err() && attempt.is_some() && Q::RELEASES {
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
                    tracing::debug!(%error, size, "coalesced writes failed");
                }
                Err(_) => {
                    tracing::debug!(size, "coalesced writes timed out");
                }
            }
            // The callers just answered come back with their next claims once they run;
            // letting them run first makes the next batch theirs too.
            tokio::task::yield_now().await;
        }
    }
}

/// Each write's answer, in `batch`'s order, from a statement's answers by owner token
/// (claims mint a token each, so no two in a batch share one).
pub(crate) fn by_token<Q, A: Copy>(
    batch: &[Q],
    token: impl Fn(&Q) -> &str,
    answers: &[(String, A)],
) -> Vec<Option<A>> {
    batch
        .iter()
        .map(|q| answers.iter().find(|(t, _)| t == token(q)).map(|(_, a)| *a))
        .collect()
}
