//! The points a held flow's runner (or a request's run) records at, where the testing
//! kit (`orderly::testing::flows`) stops, holds up or fails it. Without a hook (every
//! run outside a test) they are passed by.

// Without the kit, nothing reaches a call's point (the doubles' own).
#![cfg_attr(not(feature = "testing"), allow(dead_code))]

use std::fmt;

use futures_util::future::BoxFuture;

/// Forward or compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// The step itself.
    Forward,
    /// Its compensation.
    Undo,
}

/// What is recorded at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Record {
    /// The runner holds the flow: a start's insert or a recovery's claim committed.
    Claim,
    /// A call's start, recorded before the call is made.
    Start,
    /// The call to a downstream (a test double's point, not the runner's).
    Call,
    /// A call's result, recorded after it returned.
    Result,
    /// A local step's (or compensation's) checkpoint transaction: its writes and record.
    Commit,
    /// A step's wait for its retry.
    Retry,
    /// A step's failure (the flow turns to compensating), a compensation given up, or
    /// a request's failure stored.
    Failed,
    /// A wait step's waking.
    Wait,
    /// The flow parked (with the step's record that led to it, if any).
    Park,
    /// The flow completed by a write of its own (a step's result usually completes it
    /// in the same commit: then that result is the point).
    Complete,
    /// The flow compensated.
    Compensated,
}

/// Before or after the record is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum When {
    /// Before: nothing of it is written.
    Before,
    /// After its commit.
    After,
    /// During (a call).
    At,
}

/// A recorded point of a flow's run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Point {
    /// Before, at or after.
    pub when: When,
    /// What is recorded.
    pub record: Record,
    /// The step, if the record is one step's.
    pub step: Option<String>,
    /// Forward or compensation.
    pub phase: Phase,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = match self.when {
            When::Before => "before",
            When::After => "after",
            When::At => "at",
        };
        let record = match self.record {
            Record::Claim => "claim",
            Record::Start => "start",
            Record::Call => "call",
            Record::Result => "result",
            Record::Commit => "commit",
            Record::Retry => "retry",
            Record::Failed => "failed",
            Record::Wait => "wait",
            Record::Park => "park",
            Record::Complete => "complete",
            Record::Compensated => "compensated",
        };
        write!(f, "{when} {record}")?;
        if let Some(step) = &self.step {
            write!(f, " of {step}")?;
        }
        if self.phase == Phase::Undo {
            f.write_str(" (undo)")?;
        }
        Ok(())
    }
}

/// How a hook stops a run.
#[derive(Debug)]
pub(crate) enum Stop {
    /// As a crash: nothing more is written.
    Crash(crate::error::Error),
    /// As a retryable error of the database at that point: the run handles it as it
    /// handles one.
    Error(crate::error::Error),
}

impl Stop {
    pub(crate) fn into_error(self) -> crate::error::Error {
        match self {
            Stop::Crash(e) | Stop::Error(e) => e,
        }
    }
}

/// What a run asks at each point: `Ok` goes on (perhaps after a while); a stop ends
/// the run there.
pub(crate) trait Hook: Send + Sync {
    /// `key`: the flow key, or the request's idempotency key.
    fn at<'a>(&'a self, key: &'a str, point: Point)
    -> BoxFuture<'a, std::result::Result<(), Stop>>;
}

/// The hook a run asks, if any.
#[derive(Clone, Default)]
pub(crate) struct Slot(pub(crate) Option<std::sync::Arc<dyn Hook>>);

impl Slot {
    /// Asks the hook, if there is one, at `point` of the run of `key`.
    pub(crate) async fn at(&self, key: &str, point: Point) -> std::result::Result<(), Stop> {
        match &self.0 {
            Some(hook) => hook.at(key, point).await,
            None => Ok(()),
        }
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Slot(hook)"
        } else {
            "Slot(none)"
        })
    }
}

/// The step whose code runs, as the runner gives it while a hook is set: the testing
/// kit's doubles read it to know which step, and which attempt of it, made a call,
/// whatever key the call carries.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// The flow key of the run.
    pub(crate) key: String,
    /// The step's name.
    pub(crate) step: &'static str,
    /// Forward or compensation.
    pub(crate) phase: Phase,
    /// This entry into the step's code: unique in the process.
    pub(crate) attempt: u64,
}

tokio::task_local! {
    static RUNNING: Running;
}

impl Running {
    /// `work`, run as `step`'s code of the flow `key`, when `hook` is set; else as is.
    pub(crate) async fn scope<F: std::future::Future>(
        hook: &Slot,
        key: &str,
        step: &'static str,
        phase: Phase,
        work: F,
    ) -> F::Output {
        static ENTRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if hook.0.is_none() {
            return work.await;
        }
        let running = Running {
            key: key.to_string(),
            step,
            phase,
            attempt: ENTRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        RUNNING.scope(running, work).await
    }

    /// The step whose code calls, if a runner with a hook runs one on this task.
    pub(crate) fn current() -> Option<Running> {
        RUNNING.try_with(Clone::clone).ok()
    }
}
