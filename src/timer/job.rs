//! The timer job: claim → fire through the engine → record.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;

use super::batch::Batch;
use super::config::{TimerRound, TimersConfig};
use super::fire::{Fire, FireFuture, Fired, FiredRow, count_fired};
use super::{ClaimTimers, ClaimedTimer, FailedTimer, FiredTimer, TimerRow, TimerStats, TimerStore};
use crate::engine::Engine;
use crate::error::Error;
use crate::error::Result;
use crate::flow::{FlowStore, Flows, WAIT_MACHINE};
use crate::machine::StateMachine;
use crate::store::Lease;
use crate::support::retry::{millis, retried};
use crate::support::text::bounded;

/// How many times a round tries to record its outcomes (its firings are done: left
/// unrecorded, they would wait out the lease and be fired again, `Replayed`).
const RECORD_TRIES: i32 = 5;

/// A timer job: claims the due timers of the machines it was given engines for, fires
/// each through its machine's engine with the timer's reference, and records each
/// outcome fenced by its claim. Run several (tasks or processes) over one database: the
/// engine fires each timer's event at most once whatever they do, and one entity's timers
/// fire one after another in due order.
pub struct Timers<S: TimerStore> {
    pub(super) store: S,
    engines: BTreeMap<&'static str, Arc<dyn Fire<S>>>,
    config: TimersConfig,
}

impl<S: TimerStore> std::fmt::Debug for Timers<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timers")
            .field("machines", &self.engines.keys().collect::<Vec<_>>())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: TimerStore> Timers<S> {
    /// A job over `store`'s timers, with the default [`TimersConfig`] and no machine yet:
    /// add each machine's engine with [`fire`](Self::fire).
    pub fn new(store: S) -> Self {
        Timers {
            store,
            engines: BTreeMap::new(),
            config: TimersConfig::default(),
        }
    }

    /// The same job with `config`; [`Error::InvalidInput`] naming every problem if the
    /// config cannot work.
    pub fn with_config(mut self, config: TimersConfig) -> Result<Self> {
        config.check()?;
        self.config = config;
        Ok(self)
    }

    /// The same job firing the timers of `M` through `engine` (a clone of the
    /// application's engine: its rules, its config). The job claims only the timers of
    /// the machines it was given.
    pub fn fire<M: StateMachine>(mut self, engine: Engine<M, S>) -> Self {
        self.engines.insert(M::NAME, Arc::new(engine));
        self
    }

    /// The same job waking the flows of `flows` that sleep at a wait step (their timers,
    /// of machine [`WAIT_MACHINE`]), once each: a flow still asleep at the step is handed
    /// to the job and runs on from the next step on a task of its own (`applied`); one
    /// woken already, or taken over by the recovery job after its lease, is `moot`.
    pub fn flows(mut self, flows: Flows<S>) -> Self
    where
        S: FlowStore,
    {
        self.engines.insert(WAIT_MACHINE, Arc::new(flows));
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One round: for each machine, claims up to [`TimersConfig::batch`] due timers (the
    /// earliest pending timer of each entity), fires them concurrently, and records each
    /// outcome.
    ///
    /// A machine whose round fails (the database unreachable) does not hold back the
    /// others: every machine's round runs, and the first error is returned after them.
    pub async fn fire_once(&self) -> Result<TimerRound> {
        self.round(&AtomicBool::new(false)).await
    }

    /// [`fire_once`](Self::fire_once), that stops firing once `stop` is set: the firings
    /// under way finish and every outcome the round has is recorded; the timers not yet
    /// fired are handed back, for the next job.
    async fn round(&self, stop: &AtomicBool) -> Result<TimerRound> {
        let mut round = TimerRound::default();
        let mut failed = None;
        for (machine, engine) in &self.engines {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match self.machine_round(machine, engine.as_ref(), stop).await {
                Ok(r) => round.add(r),
                Err(e) => {
                    tracing::warn!(machine, error = %e, "a timer round failed");
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(round),
        }
    }

    async fn machine_round(
        &self,
        machine: &str,
        engine: &dyn Fire<S>,
        stop: &AtomicBool,
    ) -> Result<TimerRound> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let claim = ClaimTimers {
            machine,
            token: &token,
            lease_ms: millis(self.config.lease),
            limit: i64::from(self.config.batch),
        };
        let store = &self.store;
        let mut round = TimerRound::default();
        // The claim, the firings that are only writes and their records in one
        // transaction; what it cannot fire is left claimed for the firings one by one.
        let batched = match engine.batch_deadline() {
            Some(deadline) => self.batch(&claim, engine, deadline, stop).await?,
            None => Batch::Undone,
        };
        let claimed: Vec<ClaimedTimer> = match batched {
            Batch::Stopping => return Ok(round),
            Batch::Done {
                claimed,
                fired,
                rest,
            } => {
                round.claimed = claimed;
                count_fired(machine, &fired, &mut round);
                rest
            }
            Batch::Undone => {
                let claimed =
                    Lease::run(store, async |c| store.claim_timers(c, &claim).await).await?;
                round.claimed = claimed.len();
                claimed
            }
        };
        if claimed.is_empty() {
            return Ok(round);
        }
        let (rows, corrupt): (Vec<_>, Vec<_>) = claimed.into_iter().partition(|r| r.is_ok());
        let rows: Vec<TimerRow> = rows.into_iter().flatten().collect();
        // At most `concurrency` firings at once, each answered in its place; none starts
        // once the job is stopping.
        let firings: Vec<FireFuture<'_>> = rows
            .iter()
            .map(|row| -> FireFuture<'_> {
                Box::pin(async move {
                    if stop.load(Ordering::Relaxed) {
                        Fired::Skipped
                    } else {
                        engine.fire(row).await
                    }
                })
            })
            .collect();
        let fired: Vec<Fired> = futures_util::stream::iter(firings)
            .buffered(self.config.concurrency)
            .collect()
            .await;
        // Each outcome with the row's id, its attempts and its lateness (none for a row
        // that did not read).
        let mut outcomes: Vec<(i64, i32, Option<i64>, Fired)> = rows
            .iter()
            .zip(fired)
            .map(|(row, fired)| (row.id, row.attempts, Some(row.late_ms), fired))
            .collect();
        for c in corrupt.into_iter().filter_map(|c| c.err()) {
            tracing::error!(id = ?c.id, reason = %c.reason, "a corrupt timer row is set aside, not fired");
            if let Some(id) = c.id {
                outcomes.push((id, i32::MAX, None, Fired::Dead(c.reason)));
            }
        }
        let mut fired_rows: Vec<FiredRow> = Vec::new();
        let mut failures: Vec<(i64, i32, String, bool)> = Vec::new();
        let mut skipped: Vec<i64> = Vec::new();
        for (id, attempts, late_ms, fired) in outcomes {
            match fired {
                Fired::Outcome(outcome, note) => {
                    fired_rows.push(FiredRow::new(id, outcome, note, late_ms));
                }
                Fired::Retry(error) => {
                    let dead =
                        u32::try_from(attempts).unwrap_or(u32::MAX) >= self.config.max_attempts;
                    failures.push((id, attempts, error, dead));
                }
                Fired::Dead(error) => failures.push((id, attempts, error, true)),
                Fired::Skipped => skipped.push(id),
            }
        }
        // Every outcome the round has is recorded whatever one record does: an error
        // is returned after them all (a firing left unrecorded stays claimed, and is
        // fired again, `Replayed`, by the job that takes it over after the lease).
        let mut error = None;
        let recorded = self
            .record_fired(machine, &token, &fired_rows, &mut round)
            .await;
        if let Err(e) = recorded {
            error.get_or_insert(e);
        }
        for (id, attempts, failure, dead) in failures {
            match self
                .record_failure(id, &token, failure, dead, attempts, &mut round)
                .await
            {
                Ok(true) => {}
                Ok(false) => round.lost += 1,
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        // The timers the job stopped before firing: handed back for the next job at once.
        if !skipped.is_empty() {
            let released = Lease::run(store, async |c| {
                store.release_timers(c, &token, &skipped).await
            })
            .await;
            if let Err(e) = released {
                error.get_or_insert(e);
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(round),
        }
    }

    /// Records the round's fired timers in one statement, and counts them.
    async fn record_fired(
        &self,
        machine: &str,
        token: &str,
        fired_rows: &[FiredRow],
        round: &mut TimerRound,
    ) -> Result<()> {
        if fired_rows.is_empty() {
            return Ok(());
        }
        let store = &self.store;
        let fired: Vec<FiredTimer<'_>> = fired_rows.iter().map(FiredRow::mark).collect();
        let marked = retried(RECORD_TRIES, || {
            Lease::run(store, async |c| store.mark_fired(c, token, &fired).await)
        })
        .await?;
        let lost = fired
            .len()
            .saturating_sub(usize::try_from(marked).unwrap_or(usize::MAX));
        round.lost += lost;
        // Counted as recorded. A round that lost some of its claims does not know which:
        // it counts none of its firings (the job that took them over counts them).
        if lost == 0 {
            count_fired(machine, fired_rows, round);
        }
        Ok(())
    }

    /// Records a failed firing: back to pending after a backoff, or dead.
    async fn record_failure(
        &self,
        id: i64,
        token: &str,
        error: String,
        dead: bool,
        attempts: i32,
        round: &mut TimerRound,
    ) -> Result<bool> {
        let error = bounded(error.replace('\0', "\u{FFFD}"));
        tracing::warn!(id, attempts, dead, error = %error, "firing a timer failed");
        let failed = FailedTimer {
            id,
            token,
            error: &error,
            retry_in_ms: millis(self.backoff(attempts)),
            dead,
        };
        let store = &self.store;
        let wrote = retried(RECORD_TRIES, || {
            Lease::run(store, async |c| store.mark_timer_failed(c, &failed).await)
        })
        .await?;
        // Counted as recorded: a failure whose claim was taken over is only `lost`.
        if wrote && dead {
            round.dead += 1;
        } else if wrote {
            round.retried += 1;
        }
        Ok(wrote)
    }

    /// Runs rounds until `shutdown` completes: back to back while there is work; when
    /// there is none, after a pause until the next timer falls due, at most
    /// [`TimersConfig::idle`] (and the whole pause after a round that failed: a database
    /// error is logged and tried again). When `shutdown` completes during a round, no more timer
    /// of it is fired: the firings under way finish (each within the engine's deadline)
    /// and are recorded, and the timers not fired are handed back, unfired and under no
    /// claim, for another job to fire (one the job could not hand back waits for its
    /// lease to end). Returns what all rounds did.
    pub async fn run(&self, shutdown: impl Future<Output = ()> + Send) -> Result<TimerRound> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut total = TimerRound::default();
        let stop = AtomicBool::new(false);
        loop {
            let done = {
                let mut round = std::pin::pin!(self.round(&stop));
                tokio::select! {
                    biased;
                    done = &mut round => done,
                    () = &mut shutdown => {
                        stop.store(true, Ordering::Relaxed);
                        round.await
                    }
                }
            };
            let done_ok = done.is_ok();
            let idle = match done {
                Ok(round) => {
                    total.add(round);
                    round.claimed == 0
                }
                Err(e) => {
                    tracing::warn!(error = %e, "timer round failed");
                    false
                }
            };
            if stop.load(Ordering::Relaxed) {
                return Ok(total);
            }
            let pause = async {
                let wait = match done_ok {
                    _ if idle => self.idle_pause().await,
                    true => Duration::ZERO,
                    false => self.config.idle,
                };
                tokio::time::sleep(wait).await;
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(total),
                () = pause => {}
            }
        }
    }

    /// How long an idle job sleeps: until the next pending timer of its machines falls
    /// due, at most [`TimersConfig::idle`] (a timer whose claim another job holds, or one
    /// behind its entity's earlier timer, is found by the next round after the pause). A
    /// store that cannot tell, or fails to, leaves the whole pause.
    async fn idle_pause(&self) -> Duration {
        let idle = self.config.idle;
        let store = &self.store;
        let mut pause = idle;
        for machine in self.engines.keys() {
            let next = Lease::run(store, async |c| store.next_due_in_ms(c, machine).await).await;
            // A pause of none (a due time that is no integer, on SQLite) would spin.
            if let Ok(Some(ms)) = next
                && let Ok(ms) = u64::try_from(ms)
                && ms > 0
            {
                pause = pause.min(Duration::from_millis(ms));
            }
        }
        pause
    }

    /// Counts of the timers as they are now (the overdue gauge is set from them).
    pub async fn stats(&self) -> Result<TimerStats> {
        let store = &self.store;
        let stats = Lease::run(store, async |c| store.timer_stats(c).await).await?;
        crate::observe::timers_overdue(stats.due, stats.oldest_late_ms);
        Ok(stats)
    }

    /// Up to `limit` (1 to 1000) timers in the dead state, earliest due first.
    pub async fn dead(&self, limit: i64) -> Result<Vec<ClaimedTimer>> {
        check_limit(limit)?;
        let store = &self.store;
        Lease::run(store, async |c| store.list_timers(c, "DEAD", limit).await).await
    }

    /// Puts a dead timer back to pending, due now; whether it was dead.
    pub async fn rearm(&self, key: &super::TimerKey<'_>) -> Result<bool> {
        let store = &self.store;
        Lease::run(store, async |c| store.rearm_timer(c, key).await).await
    }

    /// Deletes up to `limit` (1 to 100,000) fired or cancelled timers that ended more
    /// than `retention` ago; how many went.
    pub async fn purge(&self, retention: Duration, limit: i64) -> Result<u64> {
        if !(1..=100_000).contains(&limit) {
            return Err(Error::InvalidInput(
                "purge limit must be 1 to 100000".into(),
            ));
        }
        let store = &self.store;
        let retention_ms = millis(retention);
        Lease::run(store, async |c| {
            store.purge_timers(c, retention_ms, limit).await
        })
        .await
    }

    /// The delay before the next try of a timer claimed `attempts` times.
    fn backoff(&self, attempts: i32) -> Duration {
        crate::support::retry::delay(self.config.min_backoff, self.config.max_backoff, attempts)
    }
}

/// A list's limit, 1 to 1000.
fn check_limit(limit: i64) -> Result<()> {
    if (1..=1000).contains(&limit) {
        Ok(())
    } else {
        Err(Error::InvalidInput("limit must be 1 to 1000".into()))
    }
}
