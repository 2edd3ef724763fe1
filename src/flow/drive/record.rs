//! The recorded points of a held flow: a step's (or compensation's) checkpoint
//! transaction, the started and finished records of a call, a retry's wait, a park, and
//! the fenced write every one of them goes through (in `fence.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::super::outcome::{FlowOutcome, Outputs, ParkReason, step_name};
use super::super::steps::{CallAction, Ctx, LocalAction, StepError};
use super::super::{FlowStore, StepClass, StepWrite, Touch};
use super::fence::{fence, lease_lost, to_i32, write};
use super::{FORWARD, Run, Seen, Then, UNDO};
use crate::support::hook::{Phase, Record, Running, When};
use tracing::Instrument;

use crate::error::Error;
use crate::error::Result;
use crate::store::{Lease, db_error};

/// Runs a step in `span`, and records its outcome there.
async fn traced(
    span: tracing::Span,
    step: impl std::future::Future<Output = Result<Result<(), StepError>>>,
) -> Result<Result<(), StepError>> {
    let out = step.instrument(span.clone()).await;
    let outcome = match &out {
        Ok(Ok(())) => "succeeded",
        Ok(Err(StepError::Retry(_))) => "retry",
        Ok(Err(StepError::Fail(_))) => "failed",
        Err(e) => crate::observe::error_label(e),
    };
    span.record("outcome", outcome);
    out
}

impl<S: FlowStore, I: Send + Sync + 'static> Run<'_, S, I> {
    /// A local step or compensation: the action and the records of its success share
    /// one transaction (the step row, and the fenced flow record, last: if the lease was
    /// lost, all of it rolls back). A failure rolls the action back.
    pub(super) async fn local(
        &mut self,
        i: usize,
        phase: &'static str,
        f: &dyn LocalAction<S, I>,
        ctx: &Ctx<I>,
        then: Then,
    ) -> Result<Result<(), StepError>> {
        let span = self.step_span(i, phase);
        traced(span, self.local_step(i, phase, f, ctx, then)).await
    }

    async fn local_step(
        &mut self,
        i: usize,
        phase: &'static str,
        f: &dyn LocalAction<S, I>,
        ctx: &Ctx<I>,
        then: Then,
    ) -> Result<Result<(), StepError>> {
        let flows = self.flows;
        let store = &flows.store;
        let mut lease = Lease::acquire_for_write(store)
            .await
            .map_err(db_error::<S>)?;
        let mut tx = S::begin(lease.conn()).await.map_err(db_error::<S>)?;
        let out = match self.running(i, phase, f.run(&mut tx, ctx)).await {
            Ok(out) => out,
            Err(e) => {
                tx.rollback().await.map_err(db_error::<S>)?;
                lease.release();
                return Ok(Err(e));
            }
        };
        // The action's writes are made, its record not: a stop here rolls them back.
        self.point(When::Before, Record::Commit, Some(i), phase)
            .await?;
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
        self.point(When::After, Record::Commit, Some(i), phase)
            .await?;
        self.succeeded(i, phase, out);
        Ok(Ok(()))
    }

    /// A keyed or unsafe step or compensation: its start recorded (fenced) before the
    /// call, its output after.
    pub(super) async fn call(
        &mut self,
        i: usize,
        phase: &'static str,
        f: &dyn CallAction<I>,
        ctx: &Ctx<I>,
        then: Then,
    ) -> Result<Result<(), StepError>> {
        let span = self.step_span(i, phase);
        traced(span, self.call_step(i, phase, f, ctx, then)).await
    }

    /// `work`, step `i`'s code in `phase`, run so that a testing kit's doubles know
    /// which step and attempt call them.
    async fn running<F: std::future::Future>(&self, i: usize, phase: &str, work: F) -> F::Output {
        let step = self.def.specs.get(i).map_or("", |s| s.name);
        let phase = if phase == UNDO {
            Phase::Undo
        } else {
            Phase::Forward
        };
        Running::scope(&self.flows.hook, &self.held.key, step, phase, work).await
    }

    /// The span of step `i`'s `phase` (forward or compensation): its outcome is recorded on
    /// it.
    fn step_span(&self, i: usize, phase: &'static str) -> tracing::Span {
        tracing::info_span!(
            "orderly.flow.step",
            flow.kind = %self.held.kind,
            flow.step = %step_name(self.def.specs, i),
            flow.phase = phase,
            outcome = tracing::field::Empty,
        )
    }

    async fn call_step(
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
        let out = match self.running(i, phase, f.run(ctx)).await {
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
    pub(super) fn completion(
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

    pub(super) fn after_success<'t>(&'t self, then: Then, completed: Option<&'t str>) -> Touch<'t> {
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

    pub(super) fn succeeded(&mut self, i: usize, phase: &'static str, out: String) {
        if phase == FORWARD {
            Arc::make_mut(&mut self.outputs).insert(self.def.specs[i].name, out.clone());
        }
        self.note(i, phase, "SUCCEEDED", Some(out), None);
        self.held.attempt = 1;
    }

    /// The step row of an attempt that failed for good. A local attempt was not
    /// recorded when it began (its transaction rolled back), so it is counted here.
    pub(super) fn failed<'w>(
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
    pub(super) async fn retry_later(
        &mut self,
        i: usize,
        phase: &'static str,
        e: &str,
    ) -> Result<FlowOutcome> {
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
    pub(super) fn backoff(&self) -> Duration {
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
    pub(super) async fn give_up(&mut self, j: usize, error: &str, attempted: bool) -> Result<()> {
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
    pub(super) async fn park(
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
    pub(super) fn note(
        &mut self,
        i: usize,
        phase: &'static str,
        status: &'static str,
        output: Option<String>,
        error: Option<&str>,
    ) {
        let begun = self.rows.get(&(i, phase)).map_or(0, |r| r.attempt);
        let begins = matches!(status, "STARTED" | "WAITING");
        let attempt = if begins || self.def.specs[i].class == StepClass::Local {
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

    pub(super) fn ctx(&self, i: usize, undo: bool) -> Ctx<I> {
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

    pub(super) fn all_outputs(&self) -> Outputs {
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
    pub(super) fn fence(&self, lease: Duration) -> Touch<'_> {
        fence(&self.held, lease)
    }

    pub(super) fn step_write<'w>(
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
    pub(super) async fn write(
        &self,
        touch: &Touch<'_>,
        step: Option<&StepWrite<'_>>,
        retry: Option<&str>,
    ) -> Result<()> {
        let record = match (touch.park, step.map(|w| w.status), touch.status) {
            (Some(_), _, _) => Record::Park,
            (None, Some(_), _) if step.is_some_and(|w| self.is_wait(w.index)) => Record::Wait,
            (None, Some("STARTED"), _) => Record::Start,
            (None, Some("SUCCEEDED"), _) => Record::Result,
            (None, Some("RETRY"), _) => Record::Retry,
            (None, Some(_), _) => Record::Failed,
            (None, None, Some("COMPENSATED")) => Record::Compensated,
            (None, None, _) => Record::Complete,
        };
        let at = step.and_then(|w| usize::try_from(w.index).ok());
        let phase = step.map_or(FORWARD, |w| w.phase);
        self.point(When::Before, record, at, phase).await?;
        write(self.flows, &self.held, touch, step, retry).await?;
        self.point(When::After, record, at, phase).await
    }

    fn is_wait(&self, index: i32) -> bool {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.def.specs.get(i))
            .is_some_and(|s| s.class == StepClass::Wait)
    }
}
