//! A flow's actions: what each declared step does, and what undoes it, attached to the
//! declaration by a [`Definition`]; what an action is given ([`Ctx`]) and how it fails
//! ([`StepError`]).

use std::any::{TypeId, type_name};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Flow, FlowStep, FlowStore, StepClass, StepSpec, Undo};
use crate::error::Error;
use crate::error::Result;
use crate::idempotency::Work;

pub use crate::support::text::MAX_ERROR_BYTES;
pub(crate) use crate::support::text::{bounded, bounded_str};

/// Why a step (or a compensation) did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// It may succeed later (a timeout, a database busy): the flow waits, with backoff,
    /// and runs it again: a keyed step with the same key. An unsafe step is never run
    /// again automatically: the flow parks for reconciliation.
    Retry(String),
    /// It will not succeed (a coupon already used, a card declined): the completed steps
    /// are compensated in reverse order. A compensation that fails so is given up, the
    /// others still run, and the flow parks as
    /// [`CompensationFailed`](super::ParkReason::CompensationFailed).
    Fail(String),
}

impl StepError {
    /// A failure worth retrying.
    pub fn retry(e: impl fmt::Display) -> Self {
        StepError::Retry(e.to_string())
    }

    /// A failure that stays one.
    pub fn fail(e: impl fmt::Display) -> Self {
        StepError::Fail(e.to_string())
    }

    /// The same error, its text cut to [`MAX_ERROR_BYTES`].
    pub(super) fn bounded(self) -> Self {
        match self {
            StepError::Retry(m) => StepError::Retry(bounded(m)),
            StepError::Fail(m) => StepError::Fail(bounded(m)),
        }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Retry(m) => write!(f, "retry: {m}"),
            StepError::Fail(m) => write!(f, "failed: {m}"),
        }
    }
}

impl std::error::Error for StepError {}

/// A database error in a step: retried (the step's writes were rolled back).
impl From<sqlx::Error> for StepError {
    fn from(e: sqlx::Error) -> Self {
        StepError::retry(e)
    }
}

/// An orderly error in a step (a `transition_in`): retried if it is retryable, a
/// failure otherwise (an invalid transition, a payment that lost to another).
impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        if e.is_retryable() {
            StepError::retry(e)
        } else {
            StepError::fail(e)
        }
    }
}

/// What an action is given: the flow's input, the outputs of the steps before it, and
/// the key to call another service with.
#[derive(Debug)]
pub struct Ctx<I> {
    pub(super) input: Arc<I>,
    pub(super) flow_key: String,
    pub(super) step: &'static str,
    pub(super) key: String,
    pub(super) attempt: i32,
    pub(super) outputs: Arc<BTreeMap<&'static str, String>>,
}

impl<I> Ctx<I> {
    /// The flow's input.
    pub fn input(&self) -> &I {
        &self.input
    }

    /// The flow key.
    pub fn flow_key(&self) -> &str {
        &self.flow_key
    }

    /// The step's name.
    pub fn step(&self) -> &'static str {
        self.step
    }

    /// The idempotency key to call another service with: `"{kind}:{flow_key}:{step}"`
    /// for the step, `"{kind}:{flow_key}:{step}:undo"` for its compensation. The same on
    /// every attempt; the kind keeps flows of two kinds under one flow key apart.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Which attempt at this step (or compensation) this is, from 1.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The output of an earlier step, as `T`. A step that has not run (or an output that
    /// does not parse as `T`) is [`StepError::Fail`]: a bug in the flow.
    pub fn output<T: DeserializeOwned>(&self, step: impl FlowStep) -> Result<T, StepError> {
        let text = self
            .outputs
            .get(step.name())
            .ok_or_else(|| StepError::fail(format!("step {} has no output yet", step.name())))?;
        serde_json::from_str(text).map_err(|e| {
            StepError::fail(format!(
                "the output of step {} does not parse: {e}",
                step.name()
            ))
        })
    }
}

/// A local action: runs inside the step's checkpoint transaction, on its connection.
pub(super) trait LocalAction<S: FlowStore, I>: Send + Sync {
    fn run<'c>(
        &'c self,
        conn: &'c mut S::Conn,
        ctx: &'c Ctx<I>,
    ) -> Work<'c, Result<String, StepError>>;
}

/// A call to another service (a keyed or unsafe step, or its compensation).
pub(super) trait CallAction<I>: Send + Sync {
    fn run<'c>(&'c self, ctx: &'c Ctx<I>) -> Work<'c, Result<String, StepError>>;
}

struct Local<F, R>(F, PhantomData<fn() -> R>);
struct Call<F, R>(F, PhantomData<fn() -> R>);

impl<S, I, F, R> LocalAction<S, I> for Local<F, R>
where
    S: FlowStore,
    I: Send + Sync,
    R: Serialize,
    F: for<'c> Fn(&'c mut S::Conn, &'c Ctx<I>) -> Work<'c, Result<R, StepError>> + Send + Sync,
{
    fn run<'c>(
        &'c self,
        conn: &'c mut S::Conn,
        ctx: &'c Ctx<I>,
    ) -> Work<'c, Result<String, StepError>> {
        let work = (self.0)(conn, ctx);
        Box::pin(async move {
            let out = work.await.map_err(StepError::bounded)?;
            // Its writes roll back with this failure: it had no effect.
            serde_json::to_string(&out).map_err(|e| {
                StepError::fail(format!("the output does not serialize as JSON: {e}")).bounded()
            })
        })
    }
}

impl<I, F, R> CallAction<I> for Call<F, R>
where
    I: Send + Sync,
    R: Serialize,
    F: for<'c> Fn(&'c Ctx<I>) -> Work<'c, Result<R, StepError>> + Send + Sync,
{
    fn run<'c>(&'c self, ctx: &'c Ctx<I>) -> Work<'c, Result<String, StepError>> {
        let work = (self.0)(ctx);
        Box::pin(async move {
            let out = work.await.map_err(StepError::bounded)?;
            // The call returned: its effect may have happened (the card was charged). An
            // output that cannot be recorded is a failure to record, not of the step, so
            // never `Fail` (which is compensated around as having had no effect) but
            // `Retry`: a keyed call is made again with its one key, counted towards the
            // attempt cap; an unsafe one parks for reconciliation, left started.
            serde_json::to_string(&out).map_err(|e| {
                StepError::retry(format!(
                    "the call returned, but its output could not be recorded: it does not \
                     serialize as JSON: {e}"
                ))
                .bounded()
            })
        })
    }
}

/// What runs for a step, or for its compensation.
pub(super) enum Action<S: FlowStore, I> {
    Local(Arc<dyn LocalAction<S, I>>),
    Call(Arc<dyn CallAction<I>>),
    /// A wait step's duration.
    Wait(Duration),
}

/// A flow's actions, attached to its declaration: for each step its forward action,
/// and its compensation where it declares `+ undo`. Registered with
/// [`Flows::register`](super::Flows::register), which checks it is complete.
///
/// `I` is the flow's input, given to every action ([`Ctx::input`]).
pub struct Definition<S: FlowStore, I> {
    pub(super) kind: &'static str,
    pub(super) version: u32,
    pub(super) specs: &'static [StepSpec],
    pub(super) pivot: Option<usize>,
    /// The flow's step enum: a step of any other type is another flow's.
    step_type: (TypeId, &'static str),
    pub(super) forward: Vec<Option<Action<S, I>>>,
    pub(super) undo: Vec<Option<Action<S, I>>>,
    problems: Vec<String>,
}

impl<S: FlowStore, I: DeserializeOwned + Send + Sync + 'static> Definition<S, I> {
    /// The actions of flow `D`, none attached yet.
    pub fn new<D: Flow>(_flow: D) -> Self {
        let n = D::STEPS.len();
        Definition {
            kind: D::KIND,
            version: D::VERSION,
            specs: D::STEPS,
            pivot: D::PIVOT,
            step_type: (TypeId::of::<D::Step>(), type_name::<D::Step>()),
            forward: (0..n).map(|_| None).collect(),
            undo: (0..n).map(|_| None).collect(),
            problems: Vec::new(),
        }
    }

    /// The forward action of a local step: `|conn, ctx| Box::pin(async move { … })`,
    /// run in the step's checkpoint transaction on `conn`, its writes committed with the
    /// step's record (or rolled back with a failure). Its output is recorded (JSON).
    pub fn local<R, F>(self, step: impl FlowStep, f: F) -> Self
    where
        R: Serialize + 'static,
        F: for<'c> Fn(&'c mut S::Conn, &'c Ctx<I>) -> Work<'c, Result<R, StepError>>
            + Send
            + Sync
            + 'static,
    {
        let action = Action::Local(Arc::new(Local(f, PhantomData)));
        self.attach(step, false, &[StepClass::Local], action)
    }

    /// The forward action of a keyed or unsafe step: `|ctx| Box::pin(async move { … })`,
    /// calling another service with [`Ctx::key`]. Its start is recorded before it runs,
    /// its output after. Once the call returned, an output that cannot be recorded (it
    /// does not serialize) is a failure to record, never compensated around: a keyed step
    /// is retried with its key, an unsafe one parks for reconciliation.
    pub fn call<R, F>(self, step: impl FlowStep, f: F) -> Self
    where
        R: Serialize + 'static,
        F: for<'c> Fn(&'c Ctx<I>) -> Work<'c, Result<R, StepError>> + Send + Sync + 'static,
    {
        let action = Action::Call(Arc::new(Call(f, PhantomData)));
        self.attach(step, false, &[StepClass::Keyed, StepClass::Unsafe], action)
    }

    /// The duration of a wait step: on reaching it, the flow records that it waits (its
    /// step row `WAITING`, a timer due `wait` from now by the database's clock, in one
    /// fenced commit) and its runner stops; the timer job
    /// ([`Timers::flows`](crate::timer::Timers::flows)) wakes it when the timer is due,
    /// and the flow goes on from the next step. A duration under a millisecond or over
    /// [`MAX_TIMER_MS`](crate::machine::MAX_TIMER_MS) is a problem
    /// [`Flows::register`](super::Flows::register) names.
    pub fn wait(mut self, step: impl FlowStep, wait: Duration) -> Self {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 || ms > crate::machine::MAX_TIMER_MS {
            self.problems.push(format!(
                "step {} waits {wait:?}: a wait is from 1 ms to {} days",
                step.name(),
                crate::machine::MAX_TIMER_MS / 86_400_000
            ));
            return self;
        }
        self.attach(step, false, &[StepClass::Wait], Action::Wait(wait))
    }

    /// The compensation of a local step, in a transaction of its own with its record.
    pub fn undo_local<R, F>(self, step: impl FlowStep, f: F) -> Self
    where
        R: Serialize + 'static,
        F: for<'c> Fn(&'c mut S::Conn, &'c Ctx<I>) -> Work<'c, Result<R, StepError>>
            + Send
            + Sync
            + 'static,
    {
        let action = Action::Local(Arc::new(Local(f, PhantomData)));
        self.attach(step, true, &[StepClass::Local], action)
    }

    /// The compensation of a keyed or unsafe step, called with its own key
    /// (`"{kind}:{flow_key}:{step}:undo"`).
    pub fn undo_call<R, F>(self, step: impl FlowStep, f: F) -> Self
    where
        R: Serialize + 'static,
        F: for<'c> Fn(&'c Ctx<I>) -> Work<'c, Result<R, StepError>> + Send + Sync + 'static,
    {
        let action = Action::Call(Arc::new(Call(f, PhantomData)));
        self.attach(step, true, &[StepClass::Keyed, StepClass::Unsafe], action)
    }

    fn attach<T: FlowStep>(
        mut self,
        step: T,
        undo: bool,
        classes: &[StepClass],
        action: Action<S, I>,
    ) -> Self {
        let (index, name) = (step.index(), step.name());
        let what = if undo { "compensation" } else { "action" };
        // By its type first: another flow's step may have this flow's step's name and
        // position.
        if TypeId::of::<T>() != self.step_type.0 {
            self.problems.push(format!(
                "step {name} is a step of another flow ({}), not of flow {} ({}): its {what} \
                 is not attached",
                type_name::<T>(),
                self.kind,
                self.step_type.1
            ));
            return self;
        }
        let Some(spec) = self.specs.get(index).filter(|s| s.name == name) else {
            self.problems
                .push(format!("step {name} is not a step of flow {}", self.kind));
            return self;
        };
        if !classes.contains(&spec.class) {
            let with = match (spec.class, undo) {
                (StepClass::Local, true) => "undo_local",
                (StepClass::Local, false) => "local",
                (StepClass::Wait, _) => "wait",
                (_, true) => "undo_call",
                (_, false) => "call",
            };
            self.problems.push(format!(
                "step {name} is {:?}: its {what} is attached with {with}",
                spec.class
            ));
            return self;
        }
        if undo && spec.undo != Undo::Compensated {
            self.problems.push(format!(
                "step {name} declares no `+ undo`, so it takes no compensation"
            ));
            return self;
        }
        let slot = if undo {
            &mut self.undo[index]
        } else {
            &mut self.forward[index]
        };
        if slot.is_some() {
            self.problems
                .push(format!("step {name}'s {what} is attached twice"));
        }
        *slot = Some(action);
        self
    }

    /// Every step has its action and every `+ undo` its compensation, each attached
    /// once and to a step of this flow.
    pub(super) fn check(&self) -> Result<()> {
        let mut problems = self.problems.clone();
        for (i, spec) in self.specs.iter().enumerate() {
            if self.forward[i].is_none() {
                problems.push(format!("step {} has no action", spec.name));
            }
            if spec.undo == Undo::Compensated && self.undo[i].is_none() {
                problems.push(format!(
                    "step {} declares `+ undo` but has no compensation",
                    spec.name
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "flow {} v{}: {}",
                self.kind,
                self.version,
                problems.join("; ")
            )))
        }
    }
}
