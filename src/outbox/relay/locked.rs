//! The round whose claim is the batch's row locks, held across the publish in one
//! transaction: nothing is written for the claim itself.

use super::{Relay, RelayRound, set_aside, sort_out};
use crate::error::Result;
use crate::outbox::{EventKey, FailedEvent, OutboxStore, Sink};
use crate::store::{Lease, db_error};
use crate::support::text::bounded;

impl<S: OutboxStore, K: Sink> Relay<S, K> {
    /// A round whose claim is the batch's row locks, held across the publish; `None` if
    /// the store holds no claims by lock. Any error, and a drop, closes the connection:
    /// the server rolls back what did not commit, and the events are claimable again.
    pub(super) async fn locked_round(&self) -> Result<Option<RelayRound>> {
        let store = self.outbox.store();
        let mut lease = Lease::<S>::acquire(store).await.map_err(db_error::<S>)?;
        let limit = i64::from(self.config.batch);
        let Some(locked) = store
            .lock_events(lease.conn(), limit)
            .await
            .map_err(db_error::<S>)?
        else {
            lease.release();
            return Ok(None);
        };
        let mut round = RelayRound {
            claimed: locked.len(),
            ..RelayRound::default()
        };
        let (mut rows, corrupt) = sort_out(locked);
        // The attempt being made, as a leased claim would have counted it.
        for row in &mut rows {
            row.attempts = row.attempts.max(0).saturating_add(1);
        }
        let mut failures: Vec<(EventKey, String, i64, bool)> = Vec::new();
        for (key, reason) in corrupt {
            if let Some(key) = set_aside(key, &reason) {
                failures.push((key, bounded(format!("corrupt row: {reason}")), 0, true));
            }
            round.corrupt += 1;
        }
        let (published, failed) = self.publish_batch(&rows).await;
        for (key, attempts, error) in failed {
            let (error, retry_in_ms, dead) = self.failure(&key, attempts, error);
            if dead {
                round.dead += 1;
            } else {
                round.retried += 1;
            }
            failures.push((key, error, retry_in_ms, dead));
        }
        let failed: Vec<FailedEvent<'_>> = failures
            .iter()
            .map(|(key, error, retry_in_ms, dead)| FailedEvent {
                key,
                token: "",
                error,
                retry_in_ms: *retry_in_ms,
                dead: *dead,
            })
            .collect();
        let marked = store
            .settle_locked(lease.conn(), &published, &failed)
            .await
            .map_err(db_error::<S>)?;
        lease.release();
        let marked = usize::try_from(marked).unwrap_or(0);
        round.published = marked;
        // Locked rows cannot be taken over; were one not marked, it is due again.
        round.lost = published.len().saturating_sub(marked);
        Ok(Some(round))
    }
}
