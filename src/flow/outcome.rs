//! What a flow's caller and operator are told: where a flow stands, why it is parked,
//! what it produced, and how it reads back; and the recorded outcome of a flow no runner
//! is moving.

use std::time::Duration;

use serde::de::DeserializeOwned;

use super::{FlowRow, FlowStep, StepRow, StepSpec};
use crate::error::Error;
use crate::error::Result;

/// Why a flow is parked: it waits for an operator's [`Flows::resume`](super::Flows::resume).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumString, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ParkReason {
    /// An unsafe step (or its compensation) started and nobody knows whether it took
    /// effect (its runner died, it asked to be retried, or it returned an output that
    /// could not be recorded): find out downstream, then resume with [`Resume::Applied`],
    /// [`Resume::Retry`] or [`Resume::Compensate`].
    NeedsReconciliation,
    /// A compensation kept failing and was given up; the others ran. Resume with
    /// [`Resume::Retry`] to run the given-up compensations again.
    CompensationFailed,
    /// The flow was claimed [`FlowConfig::attempts`](super::FlowConfig::attempts) times without progress (a step
    /// that keeps failing or crashing its runner, or a keyed call whose output keeps
    /// failing to be recorded).
    AttemptsExhausted,
    /// A step at or after the pivot failed: nothing before it is compensated, and the
    /// flow cannot go on by itself.
    FailedPastPivot,
}

/// An operator's decision for a parked flow.
#[derive(Debug, Clone, PartialEq)]
pub enum Resume {
    /// Run again what was started or given up (the step a runner died in, given-up
    /// compensations): the downstream effect is known not to have happened, or a keyed
    /// step is safe to repeat.
    Retry,
    /// The started step (or compensation) did take effect, with this output: record it
    /// and go on.
    Applied(serde_json::Value),
    /// The started step did not take effect and the flow should not go on: compensate the
    /// steps before it.
    Compensate,
}

/// The outputs of a completed flow's steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outputs(pub(crate) serde_json::Map<String, serde_json::Value>);

impl Outputs {
    /// The output of `step`, as `T`.
    pub fn get<T: DeserializeOwned>(&self, step: impl FlowStep) -> Result<T> {
        let value = self.0.get(step.name()).ok_or_else(|| {
            Error::InvalidInput(format!("the flow has no output of step {}", step.name()))
        })?;
        T::deserialize(value).map_err(|e| {
            Error::InvalidInput(format!(
                "the output of step {} does not parse: {e}",
                step.name()
            ))
        })
    }

    /// Every step's output, by name.
    pub fn as_map(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.0
    }
}

/// Where a flow stands after a runner's turn.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowOutcome {
    /// Every step succeeded.
    Completed(Outputs),
    /// `step` failed with `error`, and the steps before it were compensated.
    Compensated {
        /// The step that failed.
        step: String,
        /// Its error.
        error: String,
    },
    /// `step` (or its compensation) asked to be retried; the recovery job runs it again
    /// after `retry_after` (a start of the flow after that does too).
    Waiting {
        /// The step.
        step: String,
        /// Its error.
        error: String,
        /// When it is due.
        retry_after: Duration,
    },
    /// Parked for an operator.
    Parked {
        /// Why.
        reason: ParkReason,
        /// The step it is parked at.
        step: String,
    },
    /// Asleep at a wait step: the timer job wakes it after `wakes_after` and it goes on
    /// from the next step. A start re-sent meanwhile is [`Error::InFlight`].
    Sleeping {
        /// The wait step.
        step: String,
        /// How long it sleeps.
        wakes_after: Duration,
    },
}

impl FlowOutcome {
    /// The outcome's name, a label of the library's metrics.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            FlowOutcome::Completed(_) => "completed",
            FlowOutcome::Compensated { .. } => "compensated",
            FlowOutcome::Waiting { .. } => "waiting",
            FlowOutcome::Parked { .. } => "parked",
            FlowOutcome::Sleeping { .. } => "sleeping",
        }
    }
}

/// What [`Flows::start`](super::Flows::start) answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    /// Where the flow stands.
    pub outcome: FlowOutcome,
    /// Whether this is a finished (or parked) flow's recorded outcome, not this start's
    /// work.
    pub replayed: bool,
}

/// A flow as recorded, with its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowView {
    /// The flow record.
    pub flow: FlowRow,
    /// One row per step run and per compensation.
    pub steps: Vec<StepRow>,
    /// Whether this runner knows the flow's kind at its version; a runner leaves flows
    /// it does not know alone.
    pub known: bool,
    /// What the flow waits for, if it sleeps at a wait step.
    pub waits: Option<FlowWait>,
}

/// What a sleeping flow waits for, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowWait {
    /// The wait step.
    pub step: String,
    /// When its timer is due, in milliseconds since the epoch (the database's clock).
    pub until_ms: i64,
}

impl FlowView {
    /// The wait a running, unparked flow sleeps in: the `WAITING` row of the step it
    /// stands at, due its start plus the wait it recorded.
    pub(super) fn wait_of(flow: &FlowRow, steps: &[StepRow]) -> Option<FlowWait> {
        if flow.status != "RUNNING" || flow.park_reason.is_some() {
            return None;
        }
        let row = steps
            .iter()
            .find(|s| s.phase == "F" && s.step_index == flow.step_at && s.status == "WAITING")?;
        let wait_ms = row
            .output
            .as_deref()
            .and_then(|o| serde_json::from_str::<serde_json::Value>(o).ok())
            .and_then(|v| v.get("wait_ms").and_then(serde_json::Value::as_i64))?;
        Some(FlowWait {
            step: row.name.clone(),
            until_ms: row.started_at.saturating_add(wait_ms),
        })
    }
}

/// A flow in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The flow record.
    pub flow: FlowRow,
    /// Whether this runner knows the flow's kind at its version.
    pub known: bool,
}

/// Running or compensating: a runner may hold it.
pub(super) fn is_live(status: &str) -> bool {
    matches!(status, "RUNNING" | "COMPENSATING")
}

/// The recorded outcome of a flow that no runner is moving: completed, compensated or
/// parked. `None` for a flow that runs or is due. A status or park reason orderly never
/// writes is [`Error::CorruptRecord`]: the one answer a start and a resume give of the
/// row.
pub(super) fn recorded(row: &FlowRow, specs: &[StepSpec]) -> Result<Option<FlowOutcome>> {
    let corrupt = |value: &str| Error::CorruptRecord {
        scope: format!("flow {}", row.kind),
        key: row.flow_key.clone(),
        value: value.to_string(),
    };
    let step = || match usize::try_from(row.step_at) {
        Ok(i) => step_name(specs, i),
        Err(_) => format!("#{}", row.step_at),
    };
    if !matches!(
        row.status.as_str(),
        "RUNNING" | "COMPENSATING" | "COMPLETED" | "COMPENSATED"
    ) {
        return Err(corrupt(&row.status));
    }
    if let Some(reason) = &row.park_reason {
        let reason: ParkReason = reason.parse().map_err(|_| corrupt(reason))?;
        return Ok(Some(FlowOutcome::Parked {
            reason,
            step: step(),
        }));
    }
    match row.status.as_str() {
        "COMPLETED" => {
            let text = row.output.as_deref().unwrap_or("{}");
            let map = serde_json::from_str(text).map_err(|_| corrupt(text))?;
            Ok(Some(FlowOutcome::Completed(Outputs(map))))
        }
        "COMPENSATED" => {
            let text = row.output.as_deref().unwrap_or("{}");
            let failure: Failure = serde_json::from_str(text).map_err(|_| corrupt(text))?;
            Ok(Some(FlowOutcome::Compensated {
                step: failure.step,
                error: failure.error,
            }))
        }
        "RUNNING" | "COMPENSATING" => Ok(None),
        other => Err(corrupt(other)),
    }
}

/// A compensated flow's recorded failure.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Failure {
    pub(super) step: String,
    pub(super) error: String,
}

/// A step's name, or its position if the definition has no such step.
pub(super) fn step_name(specs: &[StepSpec], i: usize) -> String {
    specs
        .get(i)
        .map_or_else(|| format!("#{i}"), |s| s.name.to_string())
}
