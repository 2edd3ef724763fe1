//! A round's batch: the claim, the firings whose edges are only writes, and their
//! records, in one transaction (one commit where each firing would take its own).

use std::sync::atomic::{AtomicBool, Ordering};

use super::fire::{Fire, Fired, FiredRow};
use super::job::Timers;
use super::{ClaimTimers, ClaimedTimer, FiredTimer, TimerRow, TimerStore};
use crate::error::Result;
use crate::store::{ErrorClass, Lease, db_error};

/// What a round's batch transaction left to the round.
pub(super) enum Batch {
    /// Committed: the timers it claimed, the firings it recorded with them, and the
    /// claimed timers it did not fire (their edges name a guard or an effect, or their
    /// rows do not read), left claimed under the round's token for the round to fire one
    /// by one.
    Done {
        claimed: usize,
        fired: Vec<FiredRow>,
        rest: Vec<ClaimedTimer>,
    },
    /// Undone, nothing of it kept: a firing failed, the transaction ran past the
    /// engine's deadline, or the store runs no batches. The round claims and fires
    /// one by one instead.
    Undone,
    /// Undone: the job is stopping. Nothing was fired or claimed.
    Stopping,
}

impl<S: TimerStore> Timers<S> {
    /// Claims `claim`'s timers, fires those `engine` can fire in the transaction, and
    /// records them, in one transaction that commits once, each of its lock waits
    /// within `deadline` and the whole within twice it. A
    /// transaction that does not commit leaves nothing: its claims, transitions and
    /// records are undone together.
    pub(super) async fn batch(
        &self,
        claim: &ClaimTimers<'_>,
        engine: &dyn Fire<S>,
        deadline: std::time::Duration,
        stop: &AtomicBool,
    ) -> Result<Batch> {
        let store = &self.store;
        let work = async {
            let mut lease = Lease::acquire_for_write(store).await?;
            let Some(depth) = store.begin_timer_batch(lease.conn(), deadline).await? else {
                lease.release();
                return Ok(Batch::Undone);
            };
            let claimed = store.claim_timers(lease.conn(), claim).await?;
            let count = claimed.len();
            let (batch, rest): (Vec<_>, Vec<_>) = claimed
                .into_iter()
                .partition(|c| c.as_ref().is_ok_and(|row| engine.batchable(row)));
            if stop.load(Ordering::Relaxed) {
                undo(store, lease, depth).await;
                return Ok(Batch::Stopping);
            }
            // The claimed timers are of distinct entities (each entity's earliest).
            let rows: Vec<&TimerRow> = batch.iter().flatten().collect();
            let answers = engine.fire_many_within(lease.conn(), &rows).await;
            let mut fired: Vec<FiredRow> = Vec::with_capacity(rows.len());
            for (row, answer) in rows.iter().zip(answers) {
                match answer {
                    Fired::Outcome(outcome, note) => {
                        fired.push(FiredRow::new(row.id, outcome, note, Some(row.late_ms)));
                    }
                    Fired::Retry(e) | Fired::Dead(e) => {
                        tracing::debug!(id = row.id, error = %e, "a timer's batch is undone");
                        undo(store, lease, depth).await;
                        return Ok(Batch::Undone);
                    }
                    Fired::Skipped => {
                        undo(store, lease, depth).await;
                        return Ok(Batch::Undone);
                    }
                }
            }
            // Every row answered, or the batch is undone.
            if fired.len() != rows.len() {
                undo(store, lease, depth).await;
                return Ok(Batch::Undone);
            }
            if !fired.is_empty() {
                let marks: Vec<FiredTimer<'_>> = fired.iter().map(FiredRow::mark).collect();
                let marked = store.mark_fired(lease.conn(), claim.token, &marks).await?;
                // The claims are this transaction's own: every one is marked.
                if usize::try_from(marked).ok() != Some(fired.len()) {
                    undo(store, lease, depth).await;
                    return Ok(Batch::Undone);
                }
            }
            store.end_timer_batch(lease.conn(), true, depth).await?;
            lease.release();
            Ok::<_, sqlx::Error>(Batch::Done {
                claimed: count,
                fired,
                rest,
            })
        };
        // Past the deadline (rows locked by the application's transactions), the work
        // is dropped: its connection is closed, and the server undoes the transaction.
        // An error leaves it so too (a lease dropped closes its connection). One the
        // database answered as contention (a deadlock, a cluster's certification
        // failure at the commit) undid the transaction: the round goes one by one. A
        // lost connection may have lost the answer to a commit: the round fails, and
        // what the database holds is the batch whole or nothing of it.
        // Each lock wait ends within the deadline in the database (an error, which undoes
        // the batch there and here); the batch as a whole within twice it.
        match tokio::time::timeout(deadline.saturating_mul(2), work).await {
            Err(_) => Ok(Batch::Undone),
            Ok(Ok(batch)) => Ok(batch),
            Ok(Err(e)) if S::classify(&e) == ErrorClass::Retryable => {
                tracing::debug!(error = %e, "a timer batch is undone");
                Ok(Batch::Undone)
            }
            Ok(Err(e)) => Err(db_error::<S>(e)),
        }
    }
}

/// Rolls the batch's transaction back; a connection that cannot is closed (the server
/// then rolls back).
async fn undo<S: TimerStore>(store: &S, mut lease: Lease<S>, depth: usize) {
    if store
        .end_timer_batch(lease.conn(), false, depth)
        .await
        .is_ok()
    {
        lease.release();
    }
}
