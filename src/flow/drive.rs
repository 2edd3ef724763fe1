//! The engine of a held flow: its steps forward in order, or the compensations of the
//! completed ones in reverse, every recorded point a transaction fenced by the owner
//! token, until the flow completes, is compensated, waits for a retry, or parks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::run::{Failure, FlowOutcome, Flows, Outputs, ParkReason, is_live, millis};
use super::steps::{Action, CallAction, Ctx, Definition, LocalAction, StepError};
use super::{FlowStore, StepClass, StepRow, StepWrite, Touch, Undo};
use crate::store::{Lease, db_error};
use crate::{Error, Result};

/// A flow this runner holds: its claim minted `token`.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) token: String,
    /// Claims since the flow last made progress, this one included.
    pub(crate) attempt: i32,
    /// The input (JSON), when the claim knows it; otherwise read with the record.
    pub(crate) input: Option<String>,
}

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
            let ctx = self.ctx(i, false);
            let def = self.def;
            let result = match &def.forward[i] {
                Some(Action::Local(f)) => {
                    self.local(i, FORWARD, f.as_ref(), &ctx, Then::Next(i + 1))
                        .await?
                }
                Some(Action::Call(f)) => {
                    self.call(i, FORWARD, f.as_ref(), &ctx, Then::Next(i + 1))
                        .await?
                }
                None => return Err(missing(spec.name)),
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
                None => return Err(missing(spec.name)),
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

    /// A local step or compensation: the action and the records of its success share
    /// one transaction (the step row, and the fenced flow record, last: if the lease was
    /// lost, all of it rolls back). A failure rolls the action back.
    async fn local(
        &mut self,
        i: usize,
        phase: &'static str,
        f: &dyn LocalAction<S, I>,
        ctx: &Ctx<I>,
        then: Then,
    ) -> Result<Result<(), StepError>> {
        let flows = self.flows;
        let store = &flows.store;
        let mut lease = Lease::acquire(store).await.map_err(db_error::<S>)?;
        let mut tx = S::begin(lease.conn()).await.map_err(db_error::<S>)?;
        let out = match f.run(&mut tx, ctx).await {
            Ok(out) => out,
            Err(e) => {
                tx.rollback().await.map_err(db_error::<S>)?;
                lease.release();
                return Ok(Err(e));
            }
        };
        let write = self.step_write(i, phase, "SUCCEEDED", true, Some(&out), None);
        let completed = self.completion(i, phase, &out, then)?;
        let touch = self.after_success(then, completed.as_deref());
        store
            .record_step(&mut tx, &write)
            .await
            .map_err(db_error::<S>)?;
        if !store.touch(&mut tx, &touch).await.map_err(db_error::<S>)? {
            tx.rollback().await.map_err(db_error::<S>)?;
            lease.release();
            return Err(lease_lost(&self.held));
        }
        // A commit whose acknowledgement is lost is reported as a retryable error: the
        // flow is then resumed from what the database holds.
        tx.commit().await.map_err(db_error::<S>)?;
        lease.release();
        self.succeeded(i, phase, out);
        Ok(Ok(()))
    }

    /// A keyed or unsafe step or compensation: its start recorded (fenced) before the
    /// call, its output after.
    async fn call(
        &mut self,
        i: usize,
        phase: &'static str,
        f: &dyn CallAction<I>,
        ctx: &Ctx<I>,
        then: Then,
    ) -> Result<Result<(), StepError>> {
        let started = self.step_write(i, phase, "STARTED", true, None, None);
        let started = StepWrite {
            downstream_key: Some(ctx.key()),
            ..started
        };
        self.write(&self.fence(self.flows.config.lease), Some(&started), None)
            .await?;
        self.note(i, phase, "STARTED", None, None);
        let out = match f.run(ctx).await {
            Ok(out) => out,
            Err(e) => return Ok(Err(e)),
        };
        let write = self.step_write(i, phase, "SUCCEEDED", false, Some(&out), None);
        let completed = self.completion(i, phase, &out, then)?;
        let touch = self.after_success(then, completed.as_deref());
        self.write(&touch, Some(&write), None).await?;
        self.succeeded(i, phase, out);
        Ok(Ok(()))
    }

    /// The flow's outputs (JSON) if this success completes it.
    fn completion(
        &self,
        i: usize,
        phase: &'static str,
        out: &str,
        then: Then,
    ) -> Result<Option<String>> {
        match then {
            Then::Next(next) if phase == FORWARD && next == self.def.specs.len() => {
                let mut outputs = self.all_outputs();
                let value = serde_json::from_str(out).unwrap_or(serde_json::Value::Null);
                outputs.0.insert(self.def.specs[i].name.to_string(), value);
                serde_json::to_string(&outputs.0)
                    .map(Some)
                    .map_err(|e| Error::InvalidInput(e.to_string()))
            }
            _ => Ok(None),
        }
    }

    fn after_success<'t>(&'t self, then: Then, completed: Option<&'t str>) -> Touch<'t> {
        let step_at = match then {
            Then::Next(next) => Some(to_i32(next)),
            Then::Undone => None,
        };
        Touch {
            progress: true,
            step_at,
            status: completed.map(|_| "COMPLETED"),
            output: completed,
            ..self.fence(self.flows.config.lease)
        }
    }

    fn succeeded(&mut self, i: usize, phase: &'static str, out: String) {
        if phase == FORWARD {
            Arc::make_mut(&mut self.outputs).insert(self.def.specs[i].name, out.clone());
        }
        self.note(i, phase, "SUCCEEDED", Some(out), None);
        self.held.attempt = 1;
    }

    /// The step row of an attempt that failed for good. A local attempt was not
    /// recorded when it began (its transaction rolled back), so it is counted here.
    fn failed<'w>(
        &'w self,
        i: usize,
        phase: &'static str,
        error: Option<&'w str>,
    ) -> StepWrite<'w> {
        let local = self.def.specs[i].class == StepClass::Local;
        self.step_write(i, phase, "FAILED", local, None, error)
    }

    /// A step that asked to be retried: the flow waits for its backoff, then is due for
    /// the recovery job. An unsafe one is never re-run by itself: the flow parks.
    async fn retry_later(&mut self, i: usize, phase: &'static str, e: &str) -> Result<FlowOutcome> {
        let spec = self.def.specs[i];
        if spec.class == StepClass::Unsafe {
            // It stays STARTED: whether it took effect is for a reconciliation to say.
            let write = self.step_write(i, phase, "STARTED", false, None, Some(e));
            let at = (phase == FORWARD).then_some(i);
            let touch = Touch {
                park: Some(ParkReason::NeedsReconciliation.into()),
                step_at: at.map(to_i32),
                error: Some(e),
                ..self.fence(self.flows.config.lease)
            };
            self.write(&touch, Some(&write), None).await?;
            return Ok(FlowOutcome::Parked {
                reason: ParkReason::NeedsReconciliation,
                step: spec.name.to_string(),
            });
        }
        let wait = self.backoff();
        let local = spec.class == StepClass::Local;
        let write = self.step_write(i, phase, "RETRY", local, None, Some(e));
        let touch = Touch {
            error: Some(e),
            ..self.fence(wait)
        };
        self.write(&touch, Some(&write), None).await?;
        Ok(FlowOutcome::Waiting {
            step: spec.name.to_string(),
            error: e.to_string(),
            retry_after: wait,
        })
    }

    /// The wait before the next claim: the backoff doubled per claim without progress.
    fn backoff(&self) -> Duration {
        let config = &self.flows.config;
        let doublings = u32::try_from(self.held.attempt.saturating_sub(1))
            .unwrap_or(0)
            .min(30);
        config
            .backoff
            .saturating_mul(1 << doublings)
            .min(config.max_backoff)
    }

    /// Gives a compensation up, for good: recorded FAILED, and the flow makes progress
    /// to the next one.
    async fn give_up(&mut self, j: usize, error: &str, attempted: bool) -> Result<()> {
        let write = if attempted {
            self.failed(j, UNDO, Some(error))
        } else {
            self.step_write(j, UNDO, "FAILED", false, None, Some(error))
        };
        let touch = Touch {
            progress: true,
            error: Some(error),
            ..self.fence(self.flows.config.lease)
        };
        self.write(&touch, Some(&write), None).await?;
        self.note(j, UNDO, "FAILED", None, Some(error));
        self.held.attempt = 1;
        Ok(())
    }

    /// Parks the flow (at `at`, if given, else where it stands), naming `step`.
    async fn park(
        &mut self,
        reason: ParkReason,
        at: Option<usize>,
        step: usize,
        error: Option<&str>,
    ) -> Result<FlowOutcome> {
        let touch = Touch {
            park: Some(reason.into()),
            step_at: at.map(to_i32),
            error,
            ..self.fence(self.flows.config.lease)
        };
        self.write(&touch, None, None).await?;
        Ok(FlowOutcome::Parked {
            reason,
            step: step_name(self.def.specs, step),
        })
    }

    /// Remembers what was just recorded for a step. The attempt count is the one the
    /// next attempt's context is numbered from.
    fn note(
        &mut self,
        i: usize,
        phase: &'static str,
        status: &'static str,
        output: Option<String>,
        error: Option<&str>,
    ) {
        let begun = self.rows.get(&(i, phase)).map_or(0, |r| r.attempt);
        let attempt = if status == "STARTED" || self.def.specs[i].class == StepClass::Local {
            begun + 1
        } else {
            begun
        };
        self.rows.insert(
            (i, phase),
            Seen {
                status,
                attempt,
                output,
                error: error.map(str::to_string),
            },
        );
    }

    fn ctx(&self, i: usize, undo: bool) -> Ctx<I> {
        let name = self.def.specs[i].name;
        let phase = if undo { UNDO } else { FORWARD };
        let attempt = self.rows.get(&(i, phase)).map_or(0, |r| r.attempt) + 1;
        Ctx {
            input: Arc::clone(&self.input),
            flow_key: self.held.key.clone(),
            step: name,
            key: if undo {
                format!("{}:{}:{name}:undo", self.held.kind, self.held.key)
            } else {
                format!("{}:{}:{name}", self.held.kind, self.held.key)
            },
            attempt,
            outputs: Arc::clone(&self.outputs),
        }
    }

    fn all_outputs(&self) -> Outputs {
        let map = self
            .outputs
            .iter()
            .map(|(name, text)| {
                let value = serde_json::from_str(text).unwrap_or(serde_json::Value::Null);
                ((*name).to_string(), value)
            })
            .collect();
        Outputs(map)
    }

    /// The fence alone: renews the lease (to `lease` from now) under this holder's token.
    fn fence(&self, lease: Duration) -> Touch<'_> {
        fence(&self.held, lease)
    }

    fn step_write<'w>(
        &'w self,
        i: usize,
        phase: &'static str,
        status: &'static str,
        begins: bool,
        output: Option<&'w str>,
        error: Option<&'w str>,
    ) -> StepWrite<'w> {
        StepWrite {
            kind: &self.held.kind,
            key: &self.held.key,
            index: to_i32(i),
            phase,
            name: self.def.specs[i].name,
            status,
            begins,
            downstream_key: None,
            token: &self.held.token,
            output,
            error,
        }
    }

    /// A fenced write in a transaction of its own: the flow record (which fails the
    /// write with [`Error::LeaseLost`] if the flow is no longer this holder's), then the
    /// step row, and on an operator's retry the reset of the started or given-up steps
    /// of one phase.
    async fn write(
        &self,
        touch: &Touch<'_>,
        step: Option<&StepWrite<'_>>,
        retry: Option<&str>,
    ) -> Result<()> {
        write(self.flows, &self.held, touch, step, retry).await
    }
}

/// A fenced write in a transaction of its own (see `Run::write`).
pub(super) async fn write<S: FlowStore>(
    flows: &Flows<S>,
    held: &Held,
    touch: &Touch<'_>,
    step: Option<&StepWrite<'_>>,
    retry: Option<&str>,
) -> Result<()> {
    let store = &flows.store;
    let mut lease = Lease::acquire(store).await.map_err(db_error::<S>)?;
    let mut tx = S::begin(lease.conn()).await.map_err(db_error::<S>)?;
    if !store.touch(&mut tx, touch).await.map_err(db_error::<S>)? {
        tx.rollback().await.map_err(db_error::<S>)?;
        lease.release();
        return Err(lease_lost(held));
    }
    if let Some(step) = step {
        store
            .record_step(&mut tx, step)
            .await
            .map_err(db_error::<S>)?;
    }
    if let Some(phase) = retry {
        store
            .retry_steps(&mut tx, &held.kind, &held.key, phase)
            .await
            .map_err(db_error::<S>)?;
    }
    tx.commit().await.map_err(db_error::<S>)?;
    lease.release();
    Ok(())
}

/// The fence alone: renews the lease (to `lease` from now) under the holder's token.
pub(super) fn fence(held: &Held, lease: Duration) -> Touch<'_> {
    Touch {
        kind: &held.kind,
        key: &held.key,
        token: &held.token,
        lease_ms: millis(lease),
        progress: false,
        step_at: None,
        status: None,
        park: None,
        output: None,
        error: None,
    }
}

/// A step's name, or its position if the definition has no such step.
pub(super) fn step_name(specs: &[super::StepSpec], i: usize) -> String {
    specs
        .get(i)
        .map_or_else(|| format!("#{i}"), |s| s.name.to_string())
}

pub(super) fn lease_lost(held: &Held) -> Error {
    Error::LeaseLost {
        scope: format!("flow {}", held.kind),
        key: held.key.clone(),
    }
}

fn missing(step: &str) -> Error {
    Error::InvalidInput(format!("step {step} has no action"))
}

pub(super) fn to_i32(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}
