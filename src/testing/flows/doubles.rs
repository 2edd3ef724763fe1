//! What one run of the kit shares: its plan, the points its runners reached (the hook
//! the runners ask), and the calls its test doubles took.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::plan::{Fault, Plan, Reached};
use super::{Phase, Point, Record, When};
use crate::error::Error;
use crate::flow::StepError;
use crate::support::hook::{Hook, Running, Stop};

/// One call a double took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The double's name.
    pub double: String,
    /// Whether the double is keyed (a repeat of a key takes no second effect).
    pub keyed: bool,
    /// The key it was called with.
    pub key: String,
    /// Whether this call took an effect.
    pub effect: bool,
    /// Its place among the points the run reached (its call's point), from 0.
    pub at: usize,
    /// The step whose code made the call (forward or compensation, as `phase` says);
    /// `None` for a call made outside a step's code, or in a request's work.
    pub step: Option<String>,
    /// Forward or compensation, of `step`.
    pub phase: Phase,
    /// Which entry into the step's code made the call (unique in the process).
    pub(super) attempt: Option<u64>,
}

/// What the runners and the doubles of one run share.
pub(super) struct RunState {
    plan: Plan,
    /// How long a hang holds up.
    hang: Duration,
    /// `"{kind}:{flow_key}:"`: what the stable keys of the flow's steps begin with;
    /// `None` for a request's work, whose calls' points are named by their double.
    prefix: Option<String>,
    /// The run's flow key, or its request's key: points of another's are passed by.
    key: String,
    inner: Mutex<Inner>,
    /// Hangs not yet over.
    hanging: AtomicUsize,
    /// A crash at a call in a request's work: the attempt waiting on it is dropped.
    pub(super) dropped: tokio::sync::Notify,
}

#[derive(Default)]
struct Inner {
    hits: HashMap<Point, u32>,
    trace: Vec<Reached>,
    fired: Vec<(Reached, Fault)>,
    /// A crash at a call stops the runner at its next point.
    crash_next: bool,
    calls: Vec<Call>,
    /// Every key a keyed double answered, and its answer.
    answers: HashMap<(String, String), std::result::Result<String, String>>,
    /// How many times a request's work began.
    works: usize,
    /// Whether a request's work stored a retryable failure (a repeat runs it again).
    retryable_failure: bool,
}

impl RunState {
    pub(super) fn new(plan: Plan, hang: Duration, prefix: Option<String>, key: String) -> Self {
        RunState {
            plan,
            hang,
            prefix,
            key,
            inner: Mutex::default(),
            hanging: AtomicUsize::new(0),
            dropped: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes `point` reached; the fault planned there, if any, and the point's place.
    fn reach(&self, point: Point) -> (Reached, Option<Fault>, usize) {
        let mut inner = self.lock();
        let n = inner.hits.entry(point.clone()).or_insert(0);
        *n += 1;
        let reached = Reached { point, nth: *n };
        let place = inner.trace.len();
        inner.trace.push(reached.clone());
        let fault = self.plan.at(&reached.point, reached.nth);
        if let Some(fault) = fault {
            inner.fired.push((reached.clone(), fault));
        }
        (reached, fault, place)
    }

    pub(super) fn trace(&self) -> Vec<Reached> {
        self.lock().trace.clone()
    }

    pub(super) fn fired(&self) -> Vec<(Reached, Fault)> {
        self.lock().fired.clone()
    }

    pub(super) fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Whether a hang is still holding a runner or a call up.
    pub(super) fn hanging(&self) -> bool {
        self.hanging.load(Ordering::SeqCst) > 0
    }

    pub(super) fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or_default()
    }

    /// How many times a request's work began.
    pub(super) fn works(&self) -> usize {
        self.lock().works
    }

    pub(super) fn work_began(&self) {
        self.lock().works += 1;
    }

    pub(super) fn stored_retryable_failure(&self) {
        self.lock().retryable_failure = true;
    }

    pub(super) fn retryable_failure(&self) -> bool {
        self.lock().retryable_failure
    }

    async fn hold_up(&self) {
        self.hanging.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.hang).await;
        self.hanging.fetch_sub(1, Ordering::SeqCst);
    }

    /// The point of a call to `double` with `key`: the step its stable key names (or
    /// the whole key, if it does not begin as the flow's keys do); in a request's work,
    /// the double.
    fn call_point(&self, double: &str, key: &str, running: Option<&Running>) -> Point {
        let (step, phase) = match (&self.prefix, running) {
            (None, _) => (double, Phase::Forward),
            (Some(_), Some(running)) => (running.step, running.phase),
            (Some(prefix), None) => split_key(prefix, key).unwrap_or((key, Phase::Forward)),
        };
        Point {
            when: When::At,
            record: Record::Call,
            step: Some(step.to_string()),
            phase,
        }
    }

    /// A call to a double: the plan's fault at it, the effect (taken, or answered
    /// again for a keyed double's repeat), the call noted.
    async fn call(
        &self,
        double: &str,
        keyed: bool,
        key: &str,
        answer: impl FnOnce() -> std::result::Result<String, String>,
    ) -> std::result::Result<String, CallError> {
        // The step whose code calls: a runner of this run's flow gives it.
        let running = Running::current().filter(|r| r.key == self.key);
        let (reached, fault, place) = self.reach(self.call_point(double, key, running.as_ref()));
        let answered = {
            let mut inner = self.lock();
            let slot = (double.to_string(), key.to_string());
            let (answered, effect) = match inner.answers.get(&slot) {
                // Unavailable: the call is made, and takes no effect.
                _ if fault == Some(Fault::Error) => {
                    (Err(format!("testing kit: error {reached}")), false)
                }
                Some(a) if keyed => (a.clone(), false),
                _ => {
                    // A refusal takes no effect.
                    let a = answer();
                    if keyed {
                        inner.answers.insert(slot, a.clone());
                    }
                    let effect = a.is_ok();
                    (a, effect)
                }
            };
            inner.calls.push(Call {
                double: double.to_string(),
                keyed,
                key: key.to_string(),
                effect,
                at: place,
                step: running.as_ref().map(|r| r.step.to_string()),
                phase: running.as_ref().map_or(Phase::Forward, |r| r.phase),
                attempt: running.as_ref().map(|r| r.attempt),
            });
            if fault == Some(Fault::Crash) {
                inner.crash_next = true;
            }
            answered
        };
        if fault == Some(Fault::Crash) && self.prefix.is_none() {
            // In a request's work: the attempt is dropped here, its transaction rolled
            // back, as a client hanging up or a task cancelled would.
            self.dropped.notify_one();
            std::future::pending::<()>().await;
        }
        match fault {
            Some(Fault::Error) => Err(CallError::Unavailable(answered.err().unwrap_or_default())),
            Some(Fault::Crash | Fault::LostAnswer) => Err(CallError::Lost(format!(
                "testing kit: {} {reached}",
                fault_word(fault)
            ))),
            Some(Fault::Hang) => {
                self.hold_up().await;
                answered.map_err(CallError::Refused)
            }
            _ => answered.map_err(CallError::Refused),
        }
    }
}

fn fault_word(fault: Option<Fault>) -> String {
    fault.map_or_else(String::new, |f| f.to_string())
}

/// The error the kit's crash and errors stop a runner with: retryable, as a lost
/// connection is.
fn stopped(fault: Fault, at: &Reached) -> Error {
    Error::Database {
        source: sqlx::Error::Protocol(format!("testing kit: {fault} {at}")),
        retryable: true,
    }
}

impl Hook for RunState {
    fn at<'a>(
        &'a self,
        key: &'a str,
        point: Point,
    ) -> BoxFuture<'a, std::result::Result<(), Stop>> {
        Box::pin(async move {
            if key != self.key {
                // Another run's, on a shared database: not this run's to judge.
                return Ok(());
            }
            let (reached, fault, _) = self.reach(point);
            // A crash at a call stops the runner at its first point after it.
            if std::mem::take(&mut self.lock().crash_next) {
                return Err(Stop::Crash(stopped(Fault::Crash, &reached)));
            }
            match fault {
                None => Ok(()),
                Some(Fault::Hang) => {
                    self.hold_up().await;
                    Ok(())
                }
                Some(Fault::Error) => Err(Stop::Error(stopped(Fault::Error, &reached))),
                Some(fault) => Err(Stop::Crash(stopped(fault, &reached))),
            }
        })
    }
}

/// The step and phase a flow's call key names: `{prefix}{step}` or
/// `{prefix}{step}:undo`; `None` for a key that does not begin with `prefix`.
pub(super) fn split_key<'k>(prefix: &str, key: &'k str) -> Option<(&'k str, Phase)> {
    let rest = key.strip_prefix(prefix)?;
    Some(match rest.strip_suffix(":undo") {
        Some(step) => (step, Phase::Undo),
        None => (rest, Phase::Forward),
    })
}

/// How a call to a double failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The downstream's own answer, a failure that stays one (a card declined): what the
    /// call's `answer` gave as `Err`.
    Refused(String),
    /// The downstream could not be reached: no effect was taken.
    Unavailable(String),
    /// The answer was lost: the effect may have been taken.
    Lost(String),
}

impl CallError {
    /// Whether the call may succeed if made again: all but [`CallError::Refused`].
    pub fn is_retryable(&self) -> bool {
        !matches!(self, CallError::Refused(_))
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Refused(m) => write!(f, "refused: {m}"),
            CallError::Unavailable(m) => write!(f, "unavailable: {m}"),
            CallError::Lost(m) => write!(f, "answer lost: {m}"),
        }
    }
}

impl std::error::Error for CallError {}

/// A refusal fails the step; the rest retry it.
impl From<CallError> for StepError {
    fn from(e: CallError) -> Self {
        if e.is_retryable() {
            StepError::retry(e)
        } else {
            StepError::fail(e)
        }
    }
}

/// The test doubles of one run: the definition under test is built with them (see
/// [`Kit::new`](super::Kit::new)), and the kit inspects them after the run.
#[derive(Clone)]
pub struct Doubles {
    pub(super) state: Arc<RunState>,
    /// The run's flow key, or its request's idempotency key.
    pub(super) key: String,
}

impl fmt::Debug for Doubles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doubles")
            .field("calls", &self.state.calls().len())
            .finish()
    }
}

impl Doubles {
    /// The run's flow key, or, for a request's work, its idempotency key: what a
    /// downstream's key is made from.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A downstream that takes an idempotency key: the first call with a key takes its
    /// effect, a repeat answers what the first did.
    pub fn keyed(&self, name: &str) -> KeyedFake {
        KeyedFake {
            name: name.to_string(),
            state: Arc::clone(&self.state),
        }
    }

    /// A downstream that cannot be made safe to repeat: every call takes its effect.
    pub fn unsafe_fake(&self, name: &str) -> UnsafeFake {
        UnsafeFake {
            name: name.to_string(),
            state: Arc::clone(&self.state),
        }
    }

    /// Every call of the run so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.state.calls()
    }
}

/// A keyed downstream (see [`Doubles::keyed`]).
#[derive(Clone)]
pub struct KeyedFake {
    name: String,
    state: Arc<RunState>,
}

impl fmt::Debug for KeyedFake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedFake")
            .field("name", &self.name)
            .finish()
    }
}

impl KeyedFake {
    /// Calls it with `key` (the step's [`Ctx::key`](crate::flow::Ctx::key)): the first
    /// call with a key runs `answer`, its effect, and keeps what it gave; a repeat
    /// answers that again. `Err` from `answer` is the downstream's refusal.
    pub async fn call(
        &self,
        key: &str,
        answer: impl FnOnce() -> std::result::Result<String, String>,
    ) -> std::result::Result<String, CallError> {
        self.state.call(&self.name, true, key, answer).await
    }

    /// The effects taken with `key`: 0 or 1.
    pub fn effects(&self, key: &str) -> usize {
        effects(&self.state, &self.name, key)
    }
}

/// An unsafe downstream (see [`Doubles::unsafe_fake`]).
#[derive(Clone)]
pub struct UnsafeFake {
    name: String,
    state: Arc<RunState>,
}

impl fmt::Debug for UnsafeFake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnsafeFake")
            .field("name", &self.name)
            .finish()
    }
}

impl UnsafeFake {
    /// Calls it: `answer` runs every time, an effect each. `key` names the step
    /// calling (its [`Ctx::key`](crate::flow::Ctx::key)); the downstream ignores it.
    pub async fn call(
        &self,
        key: &str,
        answer: impl FnOnce() -> std::result::Result<String, String>,
    ) -> std::result::Result<String, CallError> {
        self.state.call(&self.name, false, key, answer).await
    }

    /// The effects taken for `key`.
    pub fn effects(&self, key: &str) -> usize {
        effects(&self.state, &self.name, key)
    }
}

fn effects(state: &RunState, double: &str, key: &str) -> usize {
    state
        .calls()
        .iter()
        .filter(|c| c.effect && c.double == double && c.key == key)
        .count()
}
