//! The recovery job (the seeds' 补偿 JOB) and the purge: what finds requests stuck half
//! way because their server died, and what removes records past their retention.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use tracing::Instrument;

use futures_util::FutureExt;

use super::{Claimed, Failure, RecordStore, Records, TakeOver, millis};
use crate::error::Error;
use crate::error::Result;
use crate::store::{Lease, db_error};

/// A record the recovery job took over: the request it stands for was claimed, and its
/// holder's lease ran out before it completed, failed or released it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stuck {
    /// The record, held by the recovery job now (a new token, a new lease).
    pub held: Claimed,
    /// The fingerprint of the payload it was claimed with.
    pub payload_hash: Option<String>,
}

/// What happened downstream to a stuck request, as the reconciler found out.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// It did its work: complete the record with this result (replayed to later claims).
    Succeeded(serde_json::Value),
    /// It failed: store the failure, replayed if terminal, claimable again if retryable.
    Failed(serde_json::Value, Failure),
    /// Nothing happened downstream, or nothing that cannot be done again: release the
    /// record, so the next claim runs the request again.
    Unknown,
    /// The reconciler cannot tell yet (the downstream service is unreachable): leave the
    /// record held; it is stuck again once the recovery job's lease runs out.
    Later,
}

/// Asks what happened downstream to a stuck request. Any
/// `Fn(Stuck) -> impl Future<Output = Reconciled>` is one.
pub trait Reconciler: Send + Sync {
    /// The reconciliation of one stuck request.
    fn reconcile(&self, stuck: &Stuck) -> impl Future<Output = Reconciled> + Send;
}

impl<F, Fut> Reconciler for F
where
    F: Fn(Stuck) -> Fut + Send + Sync,
    Fut: Future<Output = Reconciled> + Send,
{
    fn reconcile(&self, stuck: &Stuck) -> impl Future<Output = Reconciled> + Send {
        self(stuck.clone())
    }
}

/// The records of a scope held right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Records in PROCESSING, inside their retention.
    pub count: u64,
    /// How long the oldest of them has been held, from its claim.
    pub oldest: Duration,
}

/// What one round of recovery did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Stuck records found.
    pub found: usize,
    /// Of those, taken over by this job (the others were taken by someone else first).
    pub taken: usize,
    /// Completed with the reconciler's result.
    pub succeeded: usize,
    /// Failed with the reconciler's failure.
    pub failed: usize,
    /// Released for a re-run.
    pub released: usize,
    /// Left held for a later round.
    pub later: usize,
    /// Taken over, then lost again before the reconciler answered (its lease ran out).
    pub lost: usize,
    /// Records whose takeover or finishing write failed with a database error, or whose
    /// reconciler panicked (they are stuck again once this job's lease runs out).
    pub errors: usize,
}

impl Recovered {
    fn add(&mut self, other: Recovered) {
        self.found += other.found;
        self.taken += other.taken;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.released += other.released;
        self.later += other.later;
        self.lost += other.lost;
        self.errors += other.errors;
    }
}

impl<S: RecordStore> Records<S> {
    /// One round of recovery in `scope`: finds up to `limit` records stuck in PROCESSING
    /// past their lease, takes each over by its token (a conditional update, so two jobs
    /// never act on the same record), asks `reconciler` what happened, and completes,
    /// fails or releases the record accordingly. One record's failure (a database error,
    /// a reconciler that panics) does not stop the others; an error finding them is
    /// returned.
    pub async fn recover<R: Reconciler>(
        &self,
        scope: &str,
        limit: u32,
        reconciler: &R,
    ) -> Result<Recovered> {
        let span = tracing::info_span!(
            "orderly.recovery",
            job = "records",
            scope,
            found = tracing::field::Empty,
            taken = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let out = self
            .recover_round(scope, limit, reconciler)
            .instrument(span.clone())
            .await;
        match &out {
            Ok(round) => {
                span.record("found", round.found);
                span.record("taken", round.taken);
                span.record("outcome", "ok");
                crate::observe::recovery_round("records", round.found, round.taken, false);
            }
            Err(e) => {
                span.record("outcome", crate::observe::error_label(e));
                crate::observe::recovery_round("records", 0, 0, true);
            }
        }
        out
    }

    async fn recover_round<R: Reconciler>(
        &self,
        scope: &str,
        limit: u32,
        reconciler: &R,
    ) -> Result<Recovered> {
        let config = self.config(scope)?;
        let rows = {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self
                .store
                .stuck(lease.conn(), scope, i64::from(limit))
                .await;
            lease.release_after(&out);
            out.map_err(db_error::<S>)?
        };
        let mut done = Recovered {
            found: rows.len(),
            ..Recovered::default()
        };
        for row in rows {
            let Some(from) = row.owner_token.as_deref() else {
                continue;
            };
            let token = uuid::Uuid::new_v4().simple().to_string();
            let take = TakeOver {
                scope,
                key: &row.idem_key,
                from,
                token: &token,
                lease_ms: millis(config.lease),
                retention_ms: millis(config.retention),
            };
            let taken = async {
                let mut lease = Lease::acquire(&self.store).await?;
                let out = self.store.take_over(lease.conn(), &take).await;
                lease.release_after(&out);
                out
            };
            let attempt = match taken.await {
                Ok(Some(attempt)) => attempt,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, scope, key = row.idem_key, "recovery: takeover failed");
                    done.errors += 1;
                    continue;
                }
            };
            done.taken += 1;
            let stuck = Stuck {
                held: Claimed {
                    scope: scope.to_string(),
                    key: row.idem_key.clone(),
                    token,
                    attempt,
                    marker: None,
                },
                payload_hash: row.payload_hash,
            };
            let reconciled = AssertUnwindSafe(reconciler.reconcile(&stuck)).catch_unwind();
            let Ok(verdict) = reconciled.await else {
                tracing::error!(
                    scope,
                    key = stuck.held.key(),
                    "recovery: the reconciler panicked; the record stays held until this job's lease runs out"
                );
                done.errors += 1;
                continue;
            };
            let held = &stuck.held;
            let written = match &verdict {
                Reconciled::Succeeded(result) => self.complete(held, result).await,
                Reconciled::Failed(failure, kind) => self.fail(held, failure, *kind).await,
                Reconciled::Unknown => self.release(held).await,
                Reconciled::Later => Ok(()),
            };
            match written {
                Ok(()) => match verdict {
                    Reconciled::Succeeded(_) => done.succeeded += 1,
                    Reconciled::Failed(..) => done.failed += 1,
                    Reconciled::Unknown => done.released += 1,
                    Reconciled::Later => done.later += 1,
                },
                Err(Error::LeaseLost { .. }) => done.lost += 1,
                Err(e) => {
                    tracing::warn!(error = %e, scope, key = held.key, "recovery: finishing write failed");
                    done.errors += 1;
                }
            }
        }
        Ok(done)
    }

    /// Releases one record stuck in PROCESSING past its lease, as an operator decides
    /// that nothing happened downstream (or nothing that cannot be done again): takes it
    /// over from the token it is held under, in one conditional update as the recovery
    /// job does, then releases it, so that the next claim runs the request again.
    /// `false` if it is not stuck (absent, finished, past its retention, or under a live
    /// lease) or someone took it over first. An error after the takeover (the release
    /// failed, or its lease was lost first: [`Error::LeaseLost`]) leaves the record held
    /// under a lease of the scope's length: it is stuck again after it.
    pub async fn release_stuck(&self, scope: &str, key: &str) -> Result<bool> {
        let config = self.config(scope)?;
        crate::support::input::validate_reference("an idempotency key", key)?;
        let row = self.read(scope, key).await.map_err(db_error::<S>)?;
        let Some(row) = row else {
            return Ok(false);
        };
        let stuck = row.status == "PROCESSING" && row.lease_left_ms <= 0 && row.expired == 0;
        let (true, Some(from)) = (stuck, row.owner_token.as_deref()) else {
            return Ok(false);
        };
        let token = uuid::Uuid::new_v4().simple().to_string();
        let take = TakeOver {
            scope,
            key,
            from,
            token: &token,
            lease_ms: millis(config.lease),
            retention_ms: millis(config.retention),
        };
        let taken = {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self.store.take_over(lease.conn(), &take).await;
            lease.release_after(&out);
            out.map_err(db_error::<S>)?
        };
        let Some(attempt) = taken else {
            return Ok(false);
        };
        let held = Claimed {
            scope: scope.to_string(),
            key: key.to_string(),
            token,
            attempt,
            marker: None,
        };
        self.release(&held).await.map(|()| true)
    }

    /// How many records of `scope` are held right now, and how long the oldest has been
    /// (from its claim); also set as the `orderly_records_held` and
    /// `orderly_records_oldest_held_seconds` gauges. With the `metrics` feature,
    /// [`recovery_loop`](Self::recovery_loop) reads it every round.
    pub async fn held(&self, scope: &str) -> Result<Held> {
        self.config(scope)?;
        let (held, oldest_ms) = {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self.store.held(lease.conn(), scope).await;
            lease.release_after(&out);
            out.map_err(db_error::<S>)?
        };
        let held = Held {
            count: u64::try_from(held).unwrap_or(0),
            oldest: Duration::from_millis(u64::try_from(oldest_ms).unwrap_or(0)),
        };
        crate::observe::records_held(scope, held.count, held.oldest);
        Ok(held)
    }

    /// Runs [`recover`](Self::recover) in rounds of `batch` until `shutdown` resolves:
    /// a full round is followed at once by the next, a partial one by a pause of `idle`.
    /// A round that fails (the database is down) is logged and retried after `idle`.
    /// Shutdown is checked between rounds and during the pause, so a round in progress
    /// finishes first. Returns the totals. Spawn it on a tokio task.
    pub async fn recovery_loop<R: Reconciler>(
        &self,
        scope: &str,
        batch: u32,
        idle: Duration,
        reconciler: R,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<Recovered> {
        self.config(scope)?;
        if batch == 0 {
            return Err(Error::InvalidInput(
                "a recovery batch must be positive".into(),
            ));
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = Recovered::default();
        loop {
            // The held-records gauges, with the metrics feature (a read every round).
            #[cfg(feature = "metrics")]
            if let Err(e) = self.held(scope).await {
                tracing::debug!(error = %e, scope, "reading the held records failed");
            }
            let pause = match self.recover(scope, batch, &reconciler).await {
                Ok(round) => {
                    total.add(round);
                    // Nothing taken: what is left is someone else's, or failing.
                    round.found < batch as usize || round.taken == 0
                }
                Err(e) => {
                    tracing::warn!(error = %e, scope, "recovery round failed");
                    true
                }
            };
            let wait = if pause { idle } else { Duration::ZERO };
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(total),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Deletes what is past its retention, in batches of at most `batch` rows per
    /// statement (each a short transaction of its own, so no lock is held for long):
    /// records no longer under a live lease, and expired one-time tokens. Returns how
    /// many rows went. Run it now and then; expired records already count as absent.
    pub async fn purge(&self, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::InvalidInput("a purge batch must be positive".into()));
        }
        let mut total = 0;
        loop {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self.store.purge(lease.conn(), i64::from(batch)).await;
            lease.release_after(&out);
            let gone = out.map_err(db_error::<S>)?;
            total += gone;
            if gone == 0 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }
}
