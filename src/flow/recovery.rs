//! What runs flows nobody is running: the recovery job (claims due flows by a token CAS
//! and resumes them), the purge of finished flows, and the inspection of flows. The
//! operator's [`Flows::resume`] of a parked flow is in `resume.rs`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tracing::Instrument;

use futures_util::FutureExt;

use super::flows::{Flows, Held, millis};
use super::outcome::{FlowOutcome, FlowView, Listed};
use super::{FlowStore, Listing, TakeDue};
use crate::error::Error;
use crate::error::Result;
use crate::store::{Lease, db_error};

/// What one round of the recovery job did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowsRecovered {
    /// Due flows this job claimed (a flow another job claimed first is not counted).
    pub taken: usize,
    /// Of those, completed.
    pub completed: usize,
    /// Compensated.
    pub compensated: usize,
    /// Waiting for a step's retry.
    pub waiting: usize,
    /// Asleep at a wait step, for the timer job to wake.
    pub sleeping: usize,
    /// Parked for an operator.
    pub parked: usize,
    /// Lost to another runner before they finished (their lease ran out).
    pub lost: usize,
    /// Failed with a database error or a panicking step: due again once this job's lease
    /// runs out.
    pub errors: usize,
}

/// How many due flows the recovery job claims, and drives together, at a time.
const CHUNK: usize = 8;

impl FlowsRecovered {
    fn add(&mut self, other: FlowsRecovered) {
        self.taken += other.taken;
        self.completed += other.completed;
        self.compensated += other.compensated;
        self.waiting += other.waiting;
        self.sleeping += other.sleeping;
        self.parked += other.parked;
        self.lost += other.lost;
        self.errors += other.errors;
    }

    fn count(&mut self, outcome: &Result<FlowOutcome>) {
        match outcome {
            Ok(FlowOutcome::Completed(_)) => self.completed += 1,
            Ok(FlowOutcome::Compensated { .. }) => self.compensated += 1,
            Ok(FlowOutcome::Waiting { .. }) => self.waiting += 1,
            Ok(FlowOutcome::Sleeping { .. }) => self.sleeping += 1,
            Ok(FlowOutcome::Parked { .. }) => self.parked += 1,
            Err(Error::LeaseLost { .. }) => self.lost += 1,
            Err(_) => self.errors += 1,
        }
    }
}

impl<S: FlowStore> Flows<S> {
    /// One round of the recovery job: claims up to `limit` due flows (running or
    /// compensating, not parked, lease run out) of the kinds and versions registered
    /// here, by a token CAS (`SKIP LOCKED` where the backend has it, so two jobs never
    /// claim one flow), a few at a time, and resumes them together where their records
    /// say: a started keyed step runs again with its key, a started unsafe step parks
    /// the flow, a compensation goes on in reverse. One flow's failure (a database
    /// error, a step that panics) does not stop the others, nor does one kind's failing
    /// claim; a round that could claim nothing because every claim failed is an error.
    /// Flows of versions not registered here are left alone.
    pub async fn recover(&self, limit: u32) -> Result<FlowsRecovered> {
        let span = tracing::info_span!(
            "orderly.recovery",
            job = "flows",
            taken = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        let out = self.recover_round(limit).instrument(span.clone()).await;
        match &out {
            Ok(round) => {
                span.record("taken", round.taken);
                span.record("outcome", "ok");
                crate::observe::recovery_round("flows", round.taken, round.taken, false);
            }
            Err(e) => {
                span.record("outcome", crate::observe::error_label(e));
                crate::observe::recovery_round("flows", 0, 0, true);
            }
        }
        out
    }

    async fn recover_round(&self, limit: u32) -> Result<FlowsRecovered> {
        let mut done = FlowsRecovered::default();
        let mut ids: Vec<_> = self.defs.keys().copied().collect();
        ids.sort_unstable();
        // Each round starts at the next kind, so a busy one cannot starve the others.
        let first = self.rounds.fetch_add(1, Ordering::Relaxed) % ids.len().max(1);
        ids.rotate_left(first);
        let mut failures = Vec::new();
        for (kind, version) in ids {
            let Some(def) = self.defs.get(&(kind, version)).cloned() else {
                continue;
            };
            // Claimed a chunk at a time and driven together, so that every flow claimed
            // is run well inside the lease it was claimed under.
            loop {
                let left = (limit as usize).saturating_sub(done.taken);
                if left == 0 {
                    return Ok(done);
                }
                let token = uuid::Uuid::new_v4().simple().to_string();
                let due = TakeDue {
                    kind,
                    version: i32::try_from(version).unwrap_or(i32::MAX),
                    token: &token,
                    lease_ms: millis(self.config.lease),
                    limit: i64::try_from(left.min(CHUNK)).unwrap_or(1),
                };
                let claimed = async {
                    let mut lease = Lease::acquire(&self.store).await?;
                    let out = self.store.take_due(lease.conn(), &due).await;
                    lease.release_after(&out);
                    out
                };
                let claimed = match claimed.await {
                    Ok(claimed) => claimed,
                    // One kind's failing claim does not stop the others'.
                    Err(e) => {
                        tracing::warn!(error = %e, kind, "claiming due flows failed");
                        failures.push(db_error::<S>(e));
                        break;
                    }
                };
                let full = claimed.len() == left.min(CHUNK);
                done.taken += claimed.len();
                let runs = claimed.into_iter().map(|(key, attempt)| {
                    let held = Held {
                        kind: kind.to_string(),
                        key,
                        token: token.clone(),
                        attempt,
                        input: None,
                    };
                    let def = def.clone();
                    async move {
                        let key = held.key.clone();
                        let outcome = AssertUnwindSafe(def.drive(self, held, false))
                            .catch_unwind()
                            .await
                            .unwrap_or_else(|_| {
                                Err(Error::InvalidInput(format!(
                                    "a step of flow {kind} {key} panicked"
                                )))
                            });
                        if let Err(e) = &outcome {
                            tracing::warn!(error = %e, kind, key, "recovering a flow failed");
                        }
                        outcome
                    }
                });
                for outcome in futures_util::future::join_all(runs).await {
                    done.count(&outcome);
                }
                if !full {
                    break;
                }
            }
        }
        // Nothing could even be claimed: the round failed.
        match failures.into_iter().next() {
            Some(e) if done.taken == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Runs [`recover`](Self::recover) in rounds of `batch` until `shutdown` resolves: a
    /// full round is followed at once by the next, a partial one by a pause of `idle`. A
    /// round that fails (the database is down) is logged and retried after `idle`.
    /// Shutdown is checked between rounds and during the pause, so a round in progress
    /// finishes first. Returns the totals. Spawn it on a tokio task.
    pub async fn recovery_loop(
        &self,
        batch: u32,
        idle: Duration,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<FlowsRecovered> {
        if batch == 0 {
            return Err(Error::InvalidInput(
                "a recovery batch must be positive".into(),
            ));
        }
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = FlowsRecovered::default();
        loop {
            let pause = match self.recover(batch).await {
                Ok(round) => {
                    total.add(round);
                    round.taken < batch as usize
                }
                Err(e) => {
                    tracing::warn!(error = %e, "flow recovery round failed");
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

    /// Deletes finished flows (completed or compensated) last written at least `age`
    /// ago, with their step rows, in batches of at most `batch` flows (each a short
    /// transaction of its own); how many flows went. A purged flow is forgotten: a start
    /// under its key runs it as a new flow. Running, waiting and parked flows are never
    /// purged. Run it now and then, with an age longer than any client retries.
    pub async fn purge(&self, age: Duration, batch: u32) -> Result<u64> {
        if batch == 0 {
            return Err(Error::InvalidInput("a purge batch must be positive".into()));
        }
        let age_ms = millis(age.min(crate::idempotency::MAX_SPAN));
        let mut gone = 0;
        loop {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self
                .store
                .purge_flows(lease.conn(), age_ms, i64::from(batch))
                .await;
            lease.release_after(&out);
            let n = out.map_err(db_error::<S>)?;
            gone += n;
            if n < u64::from(batch) {
                return Ok(gone);
            }
        }
    }

    /// A flow's record and its steps (each step's attempts, output, error and times), or
    /// `None` if there is no such flow.
    pub async fn get(&self, kind: &str, key: &str) -> Result<Option<FlowView>> {
        let Some(flow) = self.read_flow(kind, key).await? else {
            return Ok(None);
        };
        let steps = self.read_steps(kind, key).await?;
        let known = self.def(kind, flow.version).is_some();
        let waits = FlowView::wait_of(&flow, &steps);
        Ok(Some(FlowView {
            flow,
            steps,
            known,
            waits,
        }))
    }

    /// How many flows match `which` (one count over the flow table).
    pub async fn count(&self, which: Listing) -> Result<u64> {
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self.store.count_flows(lease.conn(), which).await;
        lease.release_after(&out);
        Ok(u64::try_from(out.map_err(db_error::<S>)?).unwrap_or(0))
    }

    /// Up to `limit` flows matching `which`, ordered by kind and key, after `after` (the
    /// `(kind, key)` of the previous page's last flow), each marked with whether this
    /// runner knows its version.
    pub async fn list(
        &self,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: u32,
    ) -> Result<Vec<Listed>> {
        let rows = {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self
                .store
                .list_flows(lease.conn(), which, after, i64::from(limit))
                .await;
            lease.release_after(&out);
            out.map_err(db_error::<S>)?
        };
        Ok(rows
            .into_iter()
            .map(|flow| {
                let known = self.def(&flow.kind, flow.version).is_some();
                Listed { flow, known }
            })
            .collect())
    }
}
