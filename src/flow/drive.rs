//! The engine of a held flow: its steps forward in order, or the compensations of the
//! completed ones in reverse, every recorded point a transaction fenced by the owner
//! token, until the flow completes, is compensated, waits for a retry, or parks.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;

use super::flows::{Drive, Flows, Held};
use super::outcome::{Failure, FlowOutcome, ParkReason, is_live, step_name};
use super::steps::{Action, Definition, StepError};
use super::{FlowStore, StepClass, StepRow, StepSpec, Touch, Undo};
use crate::error::Error;
use crate::error::Result;
use crate::support::hook::{Phase, Point, Record, Stop, When};

mod fence;
mod record;
mod wait;

use fence::missing;
pub(crate) use fence::{fence, lease_lost, to_i32, write};

const FORWARD: &str = "F";
const UNDO: &str = "C";

/// A step row as this runner knows it.
#[derive(Debug, Clone)]
struct Seen {
    status: &'static str,
    /// How many attempts were begun.
    attempt: i32,
    output: Option<String>,
    error: Option<String>,
}

fn status_of(text: &str) -> &'static str {
    match text {
        "STARTED" => "STARTED",
        "RETRY" => "RETRY",
        "SUCCEEDED" => "SUCCEEDED",
        "WAITING" => "WAITING",
        _ => "FAILED",
    }
}

/// What a successful step's commit does to the flow record besides the fence.
#[derive(Clone, Copy)]
enum Then {
    /// A forward step: the flow moves on to `next`, completing if it was the last.
    Next(usize),
    /// A compensation: progress only.
    Undone,
}

struct Run<'a, S: FlowStore, I> {
    flows: &'a Flows<S>,
    def: &'a Definition<S, I>,
    held: Held,
    input: Arc<I>,
    rows: BTreeMap<(usize, &'static str), Seen>,
    outputs: Arc<BTreeMap<&'static str, String>>,
}

/// Runs a held flow as far as it goes. `fresh`: the start just inserted it, so nothing
/// is recorded yet; otherwise its record and steps are read first.
pub(super) async fn drive<S: FlowStore, I: DeserializeOwned + Send + Sync + 'static>(
    flows: &Flows<S>,
    def: &Definition<S, I>,
    held: Held,
    fresh: bool,
) -> Result<FlowOutcome> {
    let (status, at, input, steps) = if fresh {
        let input = held.input.clone().unwrap_or_default();
        ("RUNNING".to_string(), 0, input, Vec::new())
    } else {
        let row = flows.read_flow(&held.kind, &held.key).await?;
        let row = row.filter(|r| {
            r.owner_token == held.token && r.park_reason.is_none() && is_live(&r.status)
        });
        let Some(row) = row else {
            return Err(lease_lost(&held));
        };
        let steps = flows.read_steps(&held.kind, &held.key).await?;
        (row.status, row.step_at, row.input, steps)
    };
    let input: I = match serde_json::from_str(&input) {
        Ok(input) => input,
        Err(e) => {
            let error = format!(
                "the recorded input of flow {} {} does not parse: {e}",
                held.kind, held.key
            );
            // The same on every claim: once the attempts are spent, park rather than be
            // claimed forever.
            if held.attempt > i32::try_from(flows.config.attempts).unwrap_or(i32::MAX) {
                let touch = Touch {
                    park: Some(ParkReason::AttemptsExhausted.into()),
                    error: Some(&error),
                    ..fence(&held, flows.config.lease)
                };
                write(flows, &held, &touch, None, None).await?;
            }
            return Err(Error::InvalidInput(error));
        }
    };
    let mut run = Run {
        flows,
        def,
        held,
        input: Arc::new(input),
        rows: BTreeMap::new(),
        outputs: Arc::default(),
    };
    run.learn(&steps);
    run.point(When::After, Record::Claim, None, FORWARD).await?;
    let at = usize::try_from(at)
        .ok()
        .filter(|&at| at <= def.specs.len())
        .ok_or_else(|| Error::CorruptRecord {
            scope: format!("flow {}", run.held.kind),
            key: run.held.key.clone(),
            value: format!("step_at {at}"),
        })?;
    if status == "COMPENSATING" {
        run.compensate(at).await
    } else {
        run.forward(at).await
    }
}

impl<S: FlowStore, I: Send + Sync + 'static> Run<'_, S, I> {
    /// A recorded point: the testing kit's hook, if there is one, may stop the run here
    /// (an error) or hold it up.
    async fn point(
        &self,
        when: When,
        record: Record,
        step: Option<usize>,
        phase: &str,
    ) -> Result<()> {
        if self.flows.hook.0.is_none() {
            return Ok(());
        }
        let point = Point {
            when,
            record,
            step: step.map(|i| step_name(self.def.specs, i)),
            phase: if phase == UNDO {
                Phase::Undo
            } else {
                Phase::Forward
            },
        };
        // Whether as a crash or an error, the runner stops: every recorded point's
        // write error ends its run.
        self.flows
            .hook
            .at(&self.held.key, point)
            .await
            .map_err(Stop::into_error)
    }

    fn learn(&mut self, steps: &[StepRow]) {
        let specs = self.def.specs;
        for row in steps {
            let Some(index) = usize::try_from(row.step_index)
                .ok()
                .filter(|&i| i < specs.len())
            else {
                continue;
            };
            let phase = if row.phase == FORWARD { FORWARD } else { UNDO };
            let seen = Seen {
                status: status_of(&row.status),
                attempt: row.attempt,
                output: row.output.clone(),
                error: row.error.clone(),
            };
            if let (FORWARD, "SUCCEEDED", Some(out)) = (phase, seen.status, &seen.output) {
                Arc::make_mut(&mut self.outputs).insert(specs[index].name, out.clone());
            }
            self.rows.insert((index, phase), seen);
        }
    }

    fn status(&self, index: usize, phase: &'static str) -> Option<&'static str> {
        self.rows.get(&(index, phase)).map(|r| r.status)
    }

    fn cap(&self) -> i32 {
        i32::try_from(self.flows.config.attempts).unwrap_or(i32::MAX)
    }

    /// The steps from `from` on, in order.
    async fn forward(&mut self, from: usize) -> Result<FlowOutcome> {
        let specs = self.def.specs;
        let mut i = from;
        loop {
            if i >= specs.len() {
                return self.complete().await;
            }
            let spec = specs[i];
            match self.status(i, FORWARD) {
                Some("SUCCEEDED") => {
                    i += 1;
                    continue;
                }
                // Whoever holds a flow asleep at a wait step holds it because the wait is
                // over: the timer job woke it when the timer fell due, or its lease (the
                // wait and a lease more) ran out and a claim took it over.
                Some("WAITING") if spec.class == StepClass::Wait => {
                    self.woke(i).await?;
                    i += 1;
                    if i == specs.len() {
                        return Ok(FlowOutcome::Completed(self.all_outputs()));
                    }
                    continue;
                }
                // Its runner died during an unsafe call: nobody knows whether it happened.
                // (A failed one is never left in a running flow: its failure commits with
                // the compensation or the park it leads to; an operator's retry resets it.)
                Some("STARTED" | "FAILED") if spec.class == StepClass::Unsafe => {
                    return self
                        .park(ParkReason::NeedsReconciliation, Some(i), i, None)
                        .await;
                }
                _ => {}
            }
            if self.held.attempt > self.cap() {
                let error = format!("claimed {} times without progress", self.held.attempt);
                return self
                    .park(ParkReason::AttemptsExhausted, Some(i), i, Some(&error))
                    .await;
            }
            let def = self.def;
            if let Some(Action::Wait(wait)) = &def.forward[i] {
                return self.sleep(i, *wait).await;
            }
            let ctx = self.ctx(i, false);
            let result = match &def.forward[i] {
                Some(Action::Local(f)) => {
                    self.local(i, FORWARD, f.as_ref(), &ctx, Then::Next(i + 1))
                        .await?
                }
                Some(Action::Call(f)) => {
                    self.call(i, FORWARD, f.as_ref(), &ctx, Then::Next(i + 1))
                        .await?
                }
                Some(Action::Wait(_)) | None => return Err(missing(spec.name)),
            };
            drop(ctx);
            match result {
                Ok(()) => {
                    i += 1;
                    if i == specs.len() {
                        return Ok(FlowOutcome::Completed(self.all_outputs()));
                    }
                }
                Err(StepError::Fail(e)) => {
                    if self.def.pivot.is_some_and(|p| i >= p) {
                        // The step's failure and the park in one commit: a runner dying
                        // between them would leave a failed step that a resumed flow runs
                        // again (an unsafe one too).
                        let write = self.failed(i, FORWARD, Some(&e));
                        let touch = Touch {
                            park: Some(ParkReason::FailedPastPivot.into()),
                            step_at: Some(to_i32(i)),
                            error: Some(&e),
                            ..self.fence(self.flows.config.lease)
                        };
                        self.write(&touch, Some(&write), None).await?;
                        return Ok(FlowOutcome::Parked {
                            reason: ParkReason::FailedPastPivot,
                            step: spec.name.to_string(),
                        });
                    }
                    let touch = Touch {
                        step_at: Some(to_i32(i)),
                        status: Some("COMPENSATING"),
                        progress: true,
                        error: Some(&e),
                        ..self.fence(self.flows.config.lease)
                    };
                    let write = self.failed(i, FORWARD, Some(&e));
                    self.write(&touch, Some(&write), None).await?;
                    self.note(i, FORWARD, "FAILED", None, Some(&e));
                    self.held.attempt = 1;
                    return self.compensate(i).await;
                }
                Err(StepError::Retry(e)) => return self.retry_later(i, FORWARD, &e).await,
            }
        }
    }

    /// The compensations of the steps before `failed` that completed, in reverse. One
    /// that fails for good is given up and the others still run; the flow then parks.
    async fn compensate(&mut self, failed: usize) -> Result<FlowOutcome> {
        let specs = self.def.specs;
        let mut gave_up = false;
        for j in (0..failed.min(specs.len())).rev() {
            let spec = specs[j];
            if spec.undo != Undo::Compensated || self.def.pivot.is_some_and(|p| j >= p) {
                continue;
            }
            // Only steps known to have applied are compensated.
            if self.status(j, FORWARD) != Some("SUCCEEDED") {
                continue;
            }
            match self.status(j, UNDO) {
                Some("SUCCEEDED") => continue,
                Some("FAILED") => {
                    gave_up = true;
                    continue;
                }
                Some("STARTED") if spec.class == StepClass::Unsafe => {
                    return self
                        .park(ParkReason::NeedsReconciliation, None, j, None)
                        .await;
                }
                _ => {}
            }
            if self.held.attempt > self.cap() {
                let error = format!("given up after {} attempts", self.held.attempt - 1);
                self.give_up(j, &error, false).await?;
                gave_up = true;
                continue;
            }
            let ctx = self.ctx(j, true);
            let def = self.def;
            let result = match &def.undo[j] {
                Some(Action::Local(f)) => {
                    self.local(j, UNDO, f.as_ref(), &ctx, Then::Undone).await?
                }
                Some(Action::Call(f)) => self.call(j, UNDO, f.as_ref(), &ctx, Then::Undone).await?,
                Some(Action::Wait(_)) | None => return Err(missing(spec.name)),
            };
            drop(ctx);
            match result {
                Ok(()) => {}
                Err(StepError::Fail(e)) => {
                    self.give_up(j, &e, true).await?;
                    gave_up = true;
                }
                Err(StepError::Retry(e)) => return self.retry_later(j, UNDO, &e).await,
            }
        }
        let step = specs
            .get(failed)
            .map_or_else(|| format!("#{failed}"), |s| s.name.to_string());
        if gave_up {
            return self
                .park(ParkReason::CompensationFailed, None, failed, None)
                .await;
        }
        let error = self
            .rows
            .get(&(failed, FORWARD))
            .and_then(|r| r.error.clone())
            .unwrap_or_default();
        let output = serde_json::to_string(&Failure {
            step: step.clone(),
            error: error.clone(),
        })
        .map_err(|e| Error::InvalidInput(e.to_string()))?;
        let touch = Touch {
            status: Some("COMPENSATED"),
            progress: true,
            output: Some(&output),
            ..self.fence(self.flows.config.lease)
        };
        self.write(&touch, None, None).await?;
        Ok(FlowOutcome::Compensated { step, error })
    }

    /// Every step succeeded (the last one's commit completed the flow, or an operator
    /// recorded the last step as applied): completes the record.
    async fn complete(&mut self) -> Result<FlowOutcome> {
        let outputs = self.all_outputs();
        let text =
            serde_json::to_string(&outputs.0).map_err(|e| Error::InvalidInput(e.to_string()))?;
        let touch = Touch {
            status: Some("COMPLETED"),
            progress: true,
            output: Some(&text),
            ..self.fence(self.flows.config.lease)
        };
        self.write(&touch, None, None).await?;
        Ok(FlowOutcome::Completed(outputs))
    }
}

/// The engine behind a registered definition.
impl<S: FlowStore, I: DeserializeOwned + Send + Sync + 'static> Drive<S> for Definition<S, I> {
    fn specs(&self) -> &'static [StepSpec] {
        self.specs
    }

    fn pivot(&self) -> Option<usize> {
        self.pivot
    }

    fn check_input(&self, input: &str) -> Result<()> {
        serde_json::from_str::<I>(input).map(drop).map_err(|e| {
            Error::InvalidInput(format!(
                "the input of flow {} does not parse: {e}",
                self.kind
            ))
        })
    }

    fn drive<'a>(
        &'a self,
        flows: &'a Flows<S>,
        held: Held,
        fresh: bool,
    ) -> BoxFuture<'a, Result<FlowOutcome>> {
        Box::pin(drive(flows, self, held, fresh))
    }
}
