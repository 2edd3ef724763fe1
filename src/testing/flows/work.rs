//! The kit for a request's work ([`Records::run`]): the work run by a client that
//! retries, with the faults of a plan at the run's recorded points (after the claim,
//! before and after the commit of the work with its record, before and after a stored
//! failure) and at the calls the work makes to the kit's doubles.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::doubles::RunState;
use super::plan::{self, Plan};
use super::work_report::Baseline;
use super::{Doubles, MakeStore, Record, Report, When, WorkReport};
use crate::error::Result;
use crate::idempotency::{Done, Failure, Ran, RecordStore, Records, ScopeConfig, Work};

/// The scope the kit's requests run in.
const SCOPE: &str = "kit";

/// A request's work under test: given the run's doubles (a handle, cheap to clone, that
/// also knows the request's key: [`Doubles::key`]) and the transaction's connection.
pub type WorkFn<S, R, F> = dyn for<'c> Fn(Doubles, &'c mut <S as crate::store::Store>::Conn) -> Work<'c, Result<Done<R, F>>>
    + Send
    + Sync;

/// A request's work, run with [`Records::run`] under test: `payload` is its request.
pub struct WorkKit<S: RecordStore, P, R, F> {
    payload: Arc<P>,
    store: MakeStore<S>,
    work: Arc<WorkFn<S, R, F>>,
    lease: Duration,
    limit: Duration,
    parallel: usize,
    baseline: Arc<tokio::sync::OnceCell<Option<Baseline>>>,
}

impl<S: RecordStore, P, R, F> fmt::Debug for WorkKit<S, P, R, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkKit")
            .field("lease", &self.lease)
            .finish()
    }
}

impl<S, P, R, F> WorkKit<S, P, R, F>
where
    S: RecordStore,
    P: Serialize + Send + Sync + 'static,
    R: Serialize + DeserializeOwned + Send + Sync + 'static,
    F: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// The work `work` for the request `payload`, on a store `store` makes for each run.
    pub fn new<M, Fut, W>(payload: P, store: M, work: W) -> Self
    where
        M: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S>> + 'static,
        W: for<'c> Fn(Doubles, &'c mut S::Conn) -> Work<'c, Result<Done<R, F>>>
            + Send
            + Sync
            + 'static,
    {
        WorkKit {
            payload: Arc::new(payload),
            store: Arc::new(move || Box::pin(store())),
            work: Arc::new(work),
            lease: Duration::from_millis(200),
            limit: Duration::from_secs(10),
            parallel: 8,
            baseline: Arc::default(),
        }
    }

    /// The records' lease (default 200 ms).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(10));
        self
    }

    /// The run with no fault, then one run for each point it reached and each fault that
    /// fits there, `parallel` at a time.
    pub async fn exhaustive(&self) -> Report<WorkReport> {
        let began = Instant::now();
        let (baseline_run, baseline) = self.run_against(&Plan::none(), None).await;
        let _ = self.baseline.set(baseline.clone());
        let points =
            baseline_run.trace[..baseline_run.repeat_from.min(baseline_run.trace.len())].to_vec();
        let plans = plan::each_fault_at(&points);
        let runs = plans.len() + 1;
        let judged = baseline.as_ref();
        let mut failures: Vec<WorkReport> = futures_util::stream::iter(plans)
            .map(|plan| async move { self.run_against(&plan, judged).await.0 })
            .buffer_unordered(self.parallel)
            .filter(|r| std::future::ready(!r.ok()))
            .collect()
            .await;
        if !baseline_run.ok() {
            failures.insert(0, baseline_run.clone());
        }
        Report {
            baseline: baseline_run,
            points,
            runs,
            failures,
            took: began.elapsed(),
        }
    }

    /// One run with the faults of `plan`, checked.
    pub async fn run(&self, plan: &Plan) -> WorkReport {
        let baseline = self
            .baseline
            .get_or_init(|| async { self.run_against(&Plan::none(), None).await.1 })
            .await;
        self.run_against(plan, baseline.as_ref()).await.0
    }

    async fn run_against(
        &self,
        plan: &Plan,
        baseline: Option<&Baseline>,
    ) -> (WorkReport, Option<Baseline>) {
        let began = Instant::now();
        let key = super::run_key();
        let state = Arc::new(RunState::new(
            plan.clone(),
            self.lease * 4,
            None,
            key.clone(),
        ));
        let mut report = WorkReport {
            plan: plan.clone(),
            fired: Vec::new(),
            outcome: None,
            answers: Vec::new(),
            works: 0,
            problems: Vec::new(),
            trace: Vec::new(),
            repeat_from: 0,
            calls: Vec::new(),
            took: Duration::ZERO,
        };
        let records = match self.records(&state).await {
            Ok(records) => records,
            Err(e) => {
                report
                    .problems
                    .push(format!("the kit could not set the run up: {e}"));
                return (report, None);
            }
        };
        let attempt = |records: &Records<S>| {
            let (records, key, payload) = (records.clone(), key.clone(), Arc::clone(&self.payload));
            let doubles = Doubles {
                state: Arc::clone(&state),
                key: key.clone(),
            };
            let work = Arc::clone(&self.work);
            let state = Arc::clone(&doubles.state);
            tokio::spawn(async move {
                let run = records.run(SCOPE, &key, &*payload, move |conn| {
                    let state = Arc::clone(&doubles.state);
                    state.work_began();
                    let work = work(doubles.clone(), conn);
                    Box::pin(async move {
                        let out = work.await;
                        if let Ok(Done::Failed(_, Failure::Retryable)) = &out {
                            state.stored_retryable_failure();
                        }
                        out
                    }) as Work<'_, _>
                });
                tokio::select! {
                    ran = run => Some(ran),
                    () = state.dropped.notified() => None,
                }
            })
        };
        // The client: an attempt; another after a retryable error, or beside one that has
        // not answered within two leases (the client timed out).
        let until = began + self.limit;
        let mut running = vec![(attempt(&records), Instant::now())];
        let mut first: Option<serde_json::Value> = None;
        let mut outcomes: Vec<serde_json::Value> = Vec::new();
        loop {
            let mut still = Vec::new();
            for (task, since) in running {
                if !task.is_finished() {
                    still.push((task, since));
                    continue;
                }
                match task.await {
                    Ok(None) => report.answers.push("dropped at its call".into()),
                    Ok(Some(Ok(ran))) => {
                        let value = outcome_json(&ran);
                        report.answers.push(format!(
                            "{value}{}",
                            if ran.replayed { " (replayed)" } else { "" }
                        ));
                        first.get_or_insert_with(|| value.clone());
                        outcomes.push(value);
                    }
                    Ok(Some(Err(e))) => report.answers.push(format!("error: {e}")),
                    Err(e) => report.answers.push(format!("the attempt panicked: {e}")),
                }
            }
            running = still;
            if first.is_some() && running.is_empty() && !state.hanging() {
                break;
            }
            if Instant::now() > until {
                for (task, _) in &running {
                    task.abort();
                }
                break;
            }
            let waited = running
                .iter()
                .all(|(_, since)| since.elapsed() > self.lease * 2);
            if first.is_none() && waited {
                running.push((attempt(&records), Instant::now()));
            }
            tokio::time::sleep(self.lease / 4).await;
        }
        // Once all is over: a repeat is answered from the record, the work not run again.
        let works = state.works();
        let reached_before = state.trace().len();
        // The repeat asks no hook: the plan's faults are the attempts'.
        let plain = Records::new(records.store().clone()).scope(SCOPE, self.scope_config());
        let again = match plain {
            Ok(plain) => attempt(&plain).await,
            Err(e) => Ok(Some(Err(e))),
        };
        report.repeat_from = reached_before;
        report.works = state.works();
        report.outcome = first.as_ref().map(ToString::to_string);
        let calls = state.calls();
        let succeeded = first.as_ref().map(|v| v.get("Ok").is_some());
        let problems = &mut report.problems;
        // A stored retryable failure is run again by the next claim: the repeat then
        // runs the work, and may be answered otherwise.
        let rerun = state.retryable_failure();
        match (&first, &again) {
            (None, _) => problems.push("no attempt was answered within the kit's limit".into()),
            (Some(_), Ok(Some(Ok(_)))) if rerun => {}
            (Some(first), Ok(Some(Ok(ran)))) => {
                let value = outcome_json(ran);
                if !ran.replayed || &value != first {
                    problems.push(format!(
                        "a repeat after the run was answered {value} (replayed: {}), not the \
                         first answer {first} replayed",
                        ran.replayed
                    ));
                }
            }
            (Some(_), Ok(Some(Err(e)))) => problems.push(format!(
                "a repeat after the run was answered {e}: the record is still held, or lost"
            )),
            (Some(_), Ok(None)) => problems.push("a repeat after the run was dropped".into()),
            (Some(_), Err(e)) => problems.push(format!("a repeat after the run panicked: {e}")),
        }
        if let Some(first) = &first
            && outcomes.iter().any(|o| o != first)
        {
            problems.push(format!(
                "the attempts were answered different outcomes: {}",
                report.answers.join(" | ")
            ));
        }
        if state.works() != works && !rerun {
            problems.push("a repeat after the run ran the work again".into());
        }
        let trace = state.trace();
        let commits = trace[..reached_before.min(trace.len())]
            .iter()
            .filter(|r| (r.point.when, r.point.record) == (When::After, Record::Commit))
            .count();
        match succeeded {
            Some(true) if commits != 1 => problems.push(format!(
                "the request succeeded, and its work committed {commits} times: exactly once"
            )),
            Some(false) if commits != 0 => problems.push(format!(
                "the request failed, and its work committed {commits} times: never"
            )),
            _ => {}
        }
        let this = succeeded.map(|s| Baseline::of(s, &calls));
        if let (Some(this), Some(base)) = (&this, baseline) {
            if this.succeeded != base.succeeded {
                let word = |s: bool| if s { "succeeded" } else { "failed" };
                problems.push(format!(
                    "the request {}, where the run with no fault {}",
                    word(this.succeeded),
                    word(base.succeeded)
                ));
            }
            for (double, n) in &this.unsafe_effects {
                let was = base.unsafe_effects.get(double).copied().unwrap_or(0);
                if *n > was {
                    problems.push(format!(
                        "the work's calls to the unsafe double {double} took {n} effects, where \
                         the run with no fault took {was}: a request's work runs again when an \
                         attempt did not commit, so a downstream it calls must take a key"
                    ));
                }
            }
            for (double, n) in &this.keyed_keys {
                let was = base.keyed_keys.get(double).copied().unwrap_or(0);
                if *n > was {
                    problems.push(format!(
                        "the work called the keyed double {double} with {n} keys that took \
                         effect, where the run with no fault used {was}: a key that changes \
                         between attempts lets a repeat take its effect again"
                    ));
                }
            }
        }
        report.fired = state
            .fired()
            .iter()
            .map(|(at, f)| format!("{f} {at}"))
            .collect();
        report.trace = trace;
        report.calls = calls;
        report.took = began.elapsed();
        (report, this)
    }

    fn scope_config(&self) -> ScopeConfig {
        ScopeConfig {
            lease: self.lease,
            retention: Duration::from_secs(3600),
        }
    }

    async fn records(&self, state: &Arc<RunState>) -> Result<Records<S>> {
        let store = (self.store)().await?;
        Ok(Records::new(store)
            .scope(SCOPE, self.scope_config())?
            .with_hook(Arc::clone(state) as Arc<dyn crate::support::hook::Hook>))
    }
}

fn outcome_json<R: Serialize, F: Serialize>(ran: &Ran<R, F>) -> serde_json::Value {
    match &ran.outcome {
        Ok(r) => serde_json::json!({ "Ok": r }),
        Err(f) => serde_json::json!({ "Err": f }),
    }
}
