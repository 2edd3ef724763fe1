//! A kit that tests your own flows: it runs your definition, with your step code, and
//! stops, holds up or fails it at every point its runner records, then checks that the
//! flow ended where the table of ends allows and that every effect happened once.
//!
//! - [`Kit`]: one flow, one input. [`Kit::exhaustive`] runs it once with no fault, then
//!   once for each point that run reached and each fault that fits there;
//!   [`Kit::run`] runs one [`Plan`] (several faults); [`plans`] is a proptest strategy
//!   over plans, which proptest shrinks, and [`Kit::minimize`] takes out every fault a
//!   failing plan does not need.
//! - [`Doubles`]: the downstreams your steps call in a test: [`KeyedFake`] (takes an
//!   idempotency key; a repeat takes no second effect) and [`UnsafeFake`] (every call
//!   an effect). Build your definition over them in the closure you give the kit.
//! - The faults ([`Fault`]): a crash (the runner stops; the recovery job takes over
//!   once the lease runs out), a hang past the lease, a retryable error (or a commit's
//!   acknowledgement lost), and at a call a lost answer.
//! - The checks: the end is one the table allows for the plan (that of the run with no
//!   fault; or parked for reconciliation when a fault touches an unsafe step's call);
//!   every local step committed and every call's effect taken at most once, and on a
//!   completed flow each local step once; every call made with its step's stable key;
//!   no step declared keyed (nor its compensation) calling a downstream that takes no
//!   key; on a compensated flow, exactly the steps that took effect compensated, in
//!   reverse order; the flow finished within the limit (nothing left claimed); the
//!   start's answer, when it gave an end, the end the database holds; and your own
//!   checks ([`Kit::after`]).
//! - [`WorkKit`]: the same for a request's work ([`Records::run`](crate::Records::run)),
//!   run by a client that retries.
//! - [`versions`]: the unfinished flows of a store saved, and checked against the
//!   definitions a new release registers.
//!
//! The plan is given to the run's own runner, so runs (and tests) go in parallel.

mod after;
mod calls;
mod check;
mod doubles;
mod plan;
mod report;
pub mod versions;
mod work;
mod work_report;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::support::hook::{Phase, Point, Record, When};
pub use after::Finished;
pub use check::{End, Judged, RunReport};
pub use doubles::{Call, CallError, Doubles, KeyedFake, UnsafeFake};
pub use plan::{BadPlan, Fault, Plan, Reached, plans};
pub use report::Report;
pub use work::{WorkFn, WorkKit};
pub use work_report::WorkReport;

use crate::error::Result;
use crate::flow::{Definition, Flow, FlowConfig, FlowOutcome, FlowStore, Flows};
use after::{After, after_fn};
use check::{Seen, allowed, problems};
use doubles::RunState;

pub(super) type MakeStore<S> = Arc<dyn Fn() -> LocalBoxFuture<'static, Result<S>> + Send + Sync>;
type Define<S, I> = Arc<dyn Fn(&Doubles) -> Definition<S, I> + Send + Sync>;

/// The flow `D` with one input, under test.
pub struct Kit<S: FlowStore, D: Flow, I> {
    flow: D,
    input: Arc<I>,
    store: MakeStore<S>,
    define: Define<S, I>,
    config: FlowConfig,
    limit: Duration,
    parallel: usize,
    baseline: Arc<tokio::sync::OnceCell<End>>,
    after: Vec<After<S>>,
    expect: Option<End>,
    may_stay: Vec<&'static str>,
}

impl<S: FlowStore, D: Flow, I> Clone for Kit<S, D, I>
where
    D: Copy,
{
    fn clone(&self) -> Self {
        Kit {
            flow: self.flow,
            input: Arc::clone(&self.input),
            store: Arc::clone(&self.store),
            define: Arc::clone(&self.define),
            config: self.config,
            limit: self.limit,
            parallel: self.parallel,
            baseline: Arc::clone(&self.baseline),
            after: self.after.clone(),
            expect: self.expect.clone(),
            may_stay: self.may_stay.clone(),
        }
    }
}

impl<S: FlowStore, D: Flow, I> std::fmt::Debug for Kit<S, D, I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kit")
            .field("flow", &D::KIND)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, D, I> Kit<S, D, I>
where
    S: FlowStore,
    D: Flow + Copy,
    I: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Flow `flow` started with `input`, on a store `store` makes for each run, with the
    /// definition `define` builds over the run's doubles. Each run drives the recovery
    /// job of its own runners, which claims any due flow of the kind: give each run a
    /// database of its own, or runs sharing one a [`parallel`](Self::parallel) of 1.
    pub fn new<F, Fut>(
        flow: D,
        input: I,
        store: F,
        define: impl Fn(&Doubles) -> Definition<S, I> + Send + Sync + 'static,
    ) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S>> + 'static,
    {
        Kit {
            flow,
            input: Arc::new(input),
            store: Arc::new(move || Box::pin(store())),
            define: Arc::new(define),
            config: FlowConfig {
                lease: Duration::from_millis(200),
                attempts: 10,
                backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(20),
                deadline: Duration::from_secs(10),
            },
            limit: Duration::from_secs(10),
            parallel: 8,
            baseline: Arc::default(),
            after: Vec::new(),
            expect: None,
            may_stay: Vec::new(),
        }
    }

    /// A check of your own, made after every run: given the run's store, its flow key
    /// and where the flow ended, it answers what is wrong (nothing, if empty). The kit
    /// sees its runners' commits, not the rows your local steps wrote: check those here
    /// (`|store, key, end| Box::pin(async move { … })`).
    pub fn after<F>(mut self, check: F) -> Self
    where
        F: for<'a> Fn(&'a S, &'a str, &'a End) -> LocalBoxFuture<'a, Vec<String>>
            + Send
            + Sync
            + 'static,
    {
        self.after.push(after_fn(move |run: Finished<'_, S>| {
            check(run.store, run.key, run.end)
        }));
        self
    }

    /// [`Kit::after`] given the run's calls too ([`Finished`]): to hold what your code
    /// wrote outside the kit's sight against the effects the doubles took (a `payments`
    /// row for each charge the bank took, none left on a compensated flow).
    pub fn after_run<F>(mut self, check: F) -> Self
    where
        F: for<'a> Fn(Finished<'a, S>) -> LocalBoxFuture<'a, Vec<String>> + Send + Sync + 'static,
    {
        self.after.push(Arc::new(check));
        self
    }

    /// The end the flow must reach with this input and no fault (a declined card:
    /// [`End::Compensated`]). Without it the kit judges every faulted run by the run
    /// with no fault, so a flow already wrong without a fault (an error swallowed as
    /// success) would pass; with it, that run is checked too, and the faulted runs are
    /// judged by this end.
    pub fn expect(mut self, end: End) -> Self {
        self.expect = Some(end);
        self
    }

    /// Step `step` is declared `nothing_to_undo` and its downstream effect may stay
    /// when the flow is compensated (a notice sent). Without it, a compensated flow in
    /// which such a step took an effect is a problem the kit names.
    pub fn may_stay(mut self, step: impl crate::flow::FlowStep) -> Self {
        self.may_stay.push(step.name());
        self
    }

    /// The runners' lease (default 200 ms): a crash costs a run one lease, a hang holds
    /// up for four.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease.max(Duration::from_millis(10));
        self
    }

    /// How long one run may take before its flow is reported unfinished (default 10 s).
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// How many runs [`Kit::exhaustive`] makes at once (default 8).
    pub fn parallel(mut self, n: usize) -> Self {
        self.parallel = n.max(1);
        self
    }

    /// The end of the run with no fault, which every plan's ends are judged from.
    async fn baseline(&self) -> Option<End> {
        let end = self
            .baseline
            .get_or_init(|| async { self.run_against(&Plan::none(), None).await.end })
            .await;
        end.finished().then(|| end.clone())
    }

    /// The points a run with no fault reaches, each once, in order: where
    /// [`plans`] may put faults.
    pub async fn points(&self) -> Vec<Point> {
        let run = self.run_against(&Plan::none(), None).await;
        let mut points: Vec<Point> = Vec::new();
        for r in run.trace {
            if !points.contains(&r.point) {
                points.push(r.point);
            }
        }
        points
    }

    /// One run with the faults of `plan`, checked.
    pub async fn run(&self, plan: &Plan) -> RunReport {
        let baseline = self.baseline().await;
        self.run_against(plan, baseline.as_ref()).await
    }

    /// `plan` with every fault it does not need taken out: each is dropped in turn, and
    /// left out if the run without it still fails. No single fault of the answer can be
    /// dropped (proptest's shrinking tries each deletion once, before it shrinks the
    /// faults that remain, so its smallest plan may still hold one that is not needed).
    pub async fn minimize(&self, plan: &Plan) -> Plan {
        let mut plan = plan.clone();
        let mut i = 0;
        while i < plan.faults.len() && plan.faults.len() > 1 {
            let mut fewer = plan.clone();
            fewer.faults.remove(i);
            if self.run(&fewer).await.ok() {
                i += 1;
            } else {
                plan = fewer;
            }
        }
        plan
    }

    /// The run with no fault, then one run for each point it reached (each time it
    /// reached it) and each fault that fits there, `parallel` at a time.
    pub async fn exhaustive(&self) -> Report {
        let began = Instant::now();
        let baseline_run = self.run_against(&Plan::none(), None).await;
        let baseline = Some(baseline_run.end.clone()).filter(End::finished);
        if let Some(end) = &baseline {
            let _ = self.baseline.set(end.clone());
        }
        let points = baseline_run.trace.clone();
        let plans = plan::each_fault_at(&points);
        let runs = plans.len() + 1;
        let baseline_ref = baseline.as_ref();
        let mut failures: Vec<RunReport> = futures_util::stream::iter(plans)
            .map(|plan| async move { self.run_against(&plan, baseline_ref).await })
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

    async fn run_against(&self, plan: &Plan, baseline: Option<&End>) -> RunReport {
        let faulted = !plan.faults.is_empty();
        // The end stated for the input judges every faulted run; the run with no fault
        // is checked against it.
        let judge = self.expect.as_ref().filter(|_| faulted).or(baseline);
        let mut report = self.run_once(plan, judge).await;
        if let Some(expect) = self.expect.as_ref().filter(|_| !faulted)
            && *expect != report.end
        {
            report.problems.insert(
                0,
                format!(
                    "the run with no fault ended {}, where the kit expects {expect} for this \
                     input (Kit::expect)",
                    report.end
                ),
            );
        }
        if judge.is_none() && faulted {
            report.problems.push(
                "the run with no fault did not finish: there is no end to judge this one's by"
                    .into(),
            );
        }
        report
    }

    async fn run_once(&self, plan: &Plan, baseline: Option<&End>) -> RunReport {
        let began = Instant::now();
        let key = run_key();
        let state = Arc::new(RunState::new(
            plan.clone(),
            self.config.lease * 4,
            Some(format!("{}:{key}:", D::KIND)),
            key.clone(),
        ));
        let report = |end: End, answer: String, problems: Vec<String>| RunReport {
            plan: plan.clone(),
            fired: state
                .fired()
                .iter()
                .map(|(at, f)| format!("{f} {at}"))
                .collect(),
            allowed: allowed(D::STEPS, plan, baseline),
            end,
            answer,
            problems,
            trace: state.trace(),
            calls: state.calls(),
            took: began.elapsed(),
        };
        let flows = match self.flows(&state, &key).await {
            Ok(flows) => flows,
            Err(e) => {
                let problem = format!("the kit could not set the run up: {e}");
                return report(
                    End::Unfinished("never started".into()),
                    String::new(),
                    vec![problem],
                );
            }
        };
        let started = {
            let (flows, key, input, flow) = (
                flows.clone(),
                key.clone(),
                Arc::clone(&self.input),
                self.flow,
            );
            tokio::spawn(async move { flows.start(flow, &key, &*input).await })
        };
        let until = began + self.limit;
        let mut row = None;
        // The recovery job: a round every quarter lease, each on a task of its own, so
        // that a runner held up in one round is taken over by a later one.
        let mut rounds = Vec::new();
        loop {
            if let Ok(view) = flows.get(D::KIND, &key).await {
                row = view.map(|v| v.flow);
            }
            let end = End::of(row.as_ref());
            rounds.retain(|r: &tokio::task::JoinHandle<_>| !r.is_finished());
            let settled =
                end.finished() && !state.hanging() && started.is_finished() && rounds.is_empty();
            if settled || Instant::now() > until {
                break;
            }
            tokio::time::sleep(self.config.lease / 4).await;
            if !end.finished() {
                let flows = flows.clone();
                rounds.push(tokio::spawn(async move { flows.recover(8).await }));
            }
        }
        for round in rounds {
            round.abort();
        }
        let (answer, answered) = if started.is_finished() {
            match started.await {
                Ok(Ok(started)) => {
                    let end = match &started.outcome {
                        FlowOutcome::Completed(_) => Some(End::Completed),
                        FlowOutcome::Compensated { .. } => Some(End::Compensated),
                        FlowOutcome::Parked { reason, .. } => Some(End::Parked(*reason)),
                        _ => None,
                    };
                    (format!("{:?}", started.outcome), end)
                }
                Ok(Err(e)) => (format!("error: {e}"), None),
                Err(e) => (format!("the start panicked: {e}"), None),
            }
        } else {
            started.abort();
            ("none within the kit's limit".to_string(), None)
        };
        let end = End::of(row.as_ref());
        let (trace, calls) = (state.trace(), state.calls());
        let found = problems(&Seen {
            specs: D::STEPS,
            pivot: D::PIVOT,
            prefix: state.prefix(),
            plan,
            baseline,
            end: &end,
            answered,
            trace: &trace,
            calls: &calls,
            may_stay: &self.may_stay,
        });
        let mut found = found;
        for check in &self.after {
            let run = Finished {
                store: flows.store(),
                key: &key,
                end: &end,
                calls: &calls,
            };
            found.extend(check(run).await);
        }
        report(end, answer, found)
    }

    async fn flows(&self, state: &Arc<RunState>, key: &str) -> Result<Flows<S>> {
        let store = (self.store)().await?;
        let doubles = Doubles {
            state: Arc::clone(state),
            key: key.to_string(),
        };
        let def = (self.define)(&doubles);
        Flows::new(store, self.config)?
            .with_hook(Arc::clone(state) as Arc<dyn crate::support::hook::Hook>)
            .register(def)
    }
}

/// A run's own key: its flow key, or its request's idempotency key.
pub(super) fn run_key() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("kit-{}", &id[..12])
}
