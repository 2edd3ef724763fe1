//! The operator's view of the outbox: what waits, what died, requeue and purge.

use std::time::Duration;

use super::{CorruptRow, EventKey, EventRow, OutboxStore};
use super::{MAX_LEASE, millis};
use crate::error::Error;
use crate::error::Result;
use crate::store::Lease;

/// Counts of the outbox as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxStats {
    /// Events waiting to be published.
    pub pending: u64,
    /// Events in the dead state, waiting for an operator.
    pub dead: u64,
    /// How long the oldest pending event has waited (zero if none).
    pub oldest_pending: Duration,
    /// Rows orderly never writes, which no relay publishes: a status other than
    /// `PENDING`, `PUBLISHED` and `DEAD` (it holds back its entity's later events), a
    /// claim whose lease runs past the longest a relay takes, on SQLite a key or column
    /// of the wrong type. [`Outbox::corrupt`] lists them.
    pub corrupt: u64,
}

/// The outbox of one store: what waits, what died, requeue and purge.
#[derive(Debug, Clone)]
pub struct Outbox<S> {
    store: S,
}

impl<S: OutboxStore> Outbox<S> {
    /// The outbox of `store` (its migrations create the table).
    pub fn new(store: S) -> Self {
        Outbox { store }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Pending and dead counts, and the oldest pending event's age.
    pub async fn stats(&self) -> Result<OutboxStats> {
        let max_lease = millis(MAX_LEASE);
        let row = Lease::run(&self.store, async |c| {
            self.store.outbox_stats(c, max_lease).await
        })
        .await?;
        let stats = OutboxStats {
            pending: u64::try_from(row.pending).unwrap_or(0),
            dead: u64::try_from(row.dead).unwrap_or(0),
            oldest_pending: Duration::from_millis(
                u64::try_from(row.oldest_pending_ms).unwrap_or(0),
            ),
            corrupt: u64::try_from(row.corrupt).unwrap_or(0),
        };
        crate::observe::outbox(
            stats.pending,
            stats.dead,
            stats.oldest_pending,
            stats.corrupt,
        );
        if stats.corrupt > 0 {
            tracing::error!(
                corrupt = stats.corrupt,
                "the outbox holds rows orderly never writes; no relay publishes them (Outbox::corrupt lists them)"
            );
        }
        Ok(stats)
    }

    /// Up to `limit` rows orderly never writes, as text, each with why (see
    /// [`OutboxStats::corrupt`]). A row the relay claimed and could not publish is
    /// moved to the dead state with its reason, and listed by [`dead`](Self::dead).
    pub async fn corrupt(&self, limit: u32) -> Result<Vec<CorruptRow>> {
        let max_lease = millis(MAX_LEASE);
        Lease::run(&self.store, async |c| {
            self.store
                .list_corrupt(c, max_lease, i64::from(limit))
                .await
        })
        .await
    }

    /// Up to `limit` events in the dead state, with their last errors.
    pub async fn dead(&self, limit: u32) -> Result<Vec<EventRow>> {
        Lease::run(&self.store, async |c| {
            self.store.list_events(c, "DEAD", i64::from(limit)).await
        })
        .await
    }

    /// Up to `limit` events waiting to be published.
    pub async fn pending(&self, limit: u32) -> Result<Vec<EventRow>> {
        Lease::run(&self.store, async |c| {
            self.store.list_events(c, "PENDING", i64::from(limit)).await
        })
        .await
    }

    /// Puts a dead event back in line (due now, its attempts reset); whether it was dead.
    /// The entity's later events follow it once it is published.
    pub async fn requeue(&self, key: &EventKey) -> Result<bool> {
        Lease::run(&self.store, async |c| {
            self.store.requeue_event(c, key).await
        })
        .await
    }

    /// Deletes a dead event: it is never published, and the entity's later events are
    /// published without it. Whether it was dead (a pending or published event, or one
    /// requeued meanwhile, is left as it is).
    pub async fn discard(&self, key: &EventKey) -> Result<bool> {
        Lease::run(&self.store, async |c| {
            self.store.discard_event(c, key).await
        })
        .await
    }

    /// Deletes up to `batch` events published more than `retention` ago (never a pending
    /// or dead one); how many went. Call it until it returns less than `batch`.
    pub async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::InvalidInput("a purge batch must be positive".into()));
        }
        let retention = millis(retention);
        Lease::run(&self.store, async |c| {
            self.store
                .purge_published(c, retention, i64::from(batch))
                .await
        })
        .await
    }
}
