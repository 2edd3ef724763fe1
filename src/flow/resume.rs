//! The operator's [`Flows::resume`] of a parked flow: retry what was started or given up,
//! record what a started step did, or compensate.

use super::drive::{lease_lost, to_i32, write};
use super::flows::{Flows, Held, millis};
use super::outcome::{FlowOutcome, Resume, is_live, recorded};
use super::{FlowStore, StepWrite, Touch};
use crate::error::Error;
use crate::error::Result;
use crate::store::{Lease, db_error};
use tracing::Instrument;

impl<S: FlowStore> Flows<S> {
    /// An operator's resume of a parked flow, after finding out what happened: claims it
    /// (a flow that is not parked, or whose version is not registered here, is
    /// [`Error::InvalidInput`] / [`Error::FlowVersion`]; one holding a park reason or
    /// status orderly never writes is [`Error::CorruptRecord`], as a start answers; and
    /// nothing changes), records the decision, and runs it as far as it goes.
    ///
    /// - [`Resume::Retry`]: what was started or given up runs again (the step a runner
    ///   died in; given-up compensations).
    /// - [`Resume::Applied`]: the started step (or compensation) took effect with this
    ///   output; the flow goes on after it.
    /// - [`Resume::Compensate`]: the started step did not take effect and the flow stops:
    ///   the steps before it are compensated. Only for a running flow, before the pivot.
    ///
    /// Like a start, it runs on a task of its own, answered within
    /// [`FlowConfig::deadline`](super::FlowConfig::deadline).
    pub async fn resume(&self, kind: &str, key: &str, how: Resume) -> Result<FlowOutcome> {
        // A label names only a kind registered here: a caller's unknown one could be
        // anything.
        let label = self
            .defs
            .keys()
            .find(|(k, _)| *k == kind)
            .map_or("unknown", |(k, _)| *k);
        let span = tracing::info_span!(
            "orderly.flow.resume",
            flow.kind = label,
            outcome = tracing::field::Empty,
        );
        let (flows, owned_kind, owned_key) = (self.clone(), kind.to_string(), key.to_string());
        let work = async move { flows.resume_now(&owned_kind, &owned_key, how).await }
            .instrument(span.clone());
        let out = super::run::off_task(self.config.deadline, work).await;
        let outcome = match &out {
            Ok(outcome) => outcome.label(),
            Err(e) => crate::observe::error_label(e),
        };
        span.record("outcome", outcome);
        crate::observe::flow(label, outcome, false);
        if let Ok(FlowOutcome::Parked { reason, .. }) = &out {
            crate::observe::flow_parked(label, (*reason).into());
        }
        out
    }

    async fn resume_now(&self, kind: &str, key: &str, how: Resume) -> Result<FlowOutcome> {
        let row = self
            .read_flow(kind, key)
            .await?
            .ok_or_else(|| Error::InvalidInput(format!("no flow {kind} {key}")))?;
        let def = self
            .def(kind, row.version)
            .cloned()
            .ok_or(Error::FlowVersion {
                kind: kind.to_string(),
                key: key.to_string(),
                version: row.version,
            })?;
        // What a start answers of this row, before anything is decided: a value orderly
        // never writes (an unknown park reason, an unknown status) is `CorruptRecord`, and
        // nothing changes.
        let parked = recorded(&row, def.specs())?;
        if !matches!(parked, Some(FlowOutcome::Parked { .. })) || !is_live(&row.status) {
            return Err(Error::InvalidInput(format!(
                "flow {kind} {key} is not parked"
            )));
        }
        let steps = self.read_steps(kind, key).await?;
        let specs = def.specs();
        let started = steps.iter().find(|s| s.status == "STARTED");
        let at = usize::try_from(row.step_at).unwrap_or(usize::MAX);
        match &how {
            Resume::Retry => {}
            Resume::Applied(_) if started.is_none() => {
                return Err(Error::InvalidInput(format!(
                    "flow {kind} {key} has no started step to record as applied"
                )));
            }
            Resume::Applied(_) => {}
            Resume::Compensate if row.status != "RUNNING" || at >= specs.len() => {
                return Err(Error::InvalidInput(format!(
                    "flow {kind} {key} is not running forward: nothing to compensate from"
                )));
            }
            // At or past the pivot nothing before it is compensated: the pivot's effect
            // would stand alone.
            Resume::Compensate if def.pivot().is_some_and(|p| at >= p) => {
                return Err(Error::InvalidInput(format!(
                    "flow {kind} {key} is at or past its pivot: its steps are not compensated"
                )));
            }
            Resume::Compensate => {}
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let unparked = {
            let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
            let out = self
                .store
                .unpark(
                    lease.conn(),
                    kind,
                    key,
                    &row.owner_token,
                    &token,
                    millis(self.config.lease),
                )
                .await;
            lease.release_after(&out);
            out.map_err(db_error::<S>)?
        };
        if !unparked {
            return Err(Error::InvalidInput(format!(
                "flow {kind} {key} changed while it was being resumed (another resume?): read it again"
            )));
        }
        let held = Held {
            kind: kind.to_string(),
            key: key.to_string(),
            token,
            attempt: 1,
            input: None,
        };
        let fence = Touch {
            kind,
            key,
            token: &held.token,
            lease_ms: millis(self.config.lease),
            progress: true,
            step_at: None,
            status: None,
            park: None,
            output: None,
            error: None,
        };
        match how {
            Resume::Retry => {
                let phase = if row.status == "COMPENSATING" {
                    "C"
                } else {
                    "F"
                };
                write(self, &held, &fence, None, Some(phase)).await?;
            }
            Resume::Applied(output) => {
                let Some(step) = started else {
                    return Err(lease_lost(&held));
                };
                let output = serde_json::to_string(&output).map_err(|e| {
                    Error::InvalidInput(format!("the output does not serialize: {e}"))
                })?;
                let Some((index, spec)) = usize::try_from(step.step_index)
                    .ok()
                    .and_then(|i| specs.get(i).map(|spec| (i, spec)))
                else {
                    return Err(Error::CorruptRecord {
                        scope: format!("flow {kind}"),
                        key: key.to_string(),
                        value: format!("step_index {}", step.step_index),
                    });
                };
                let name = spec.name;
                let forward = step.phase == "F";
                let touch = Touch {
                    step_at: forward.then(|| to_i32(index + 1)),
                    ..fence
                };
                let write_step = StepWrite {
                    kind,
                    key,
                    index: step.step_index,
                    phase: if forward { "F" } else { "C" },
                    name,
                    status: "SUCCEEDED",
                    begins: false,
                    downstream_key: None,
                    token: &held.token,
                    output: Some(&output),
                    error: None,
                };
                write(self, &held, &touch, Some(&write_step), None).await?;
            }
            Resume::Compensate => {
                let error = "not applied; compensated by an operator";
                let touch = Touch {
                    status: Some("COMPENSATING"),
                    error: Some(error),
                    ..fence
                };
                let write_step = StepWrite {
                    kind,
                    key,
                    index: row.step_at,
                    phase: "F",
                    name: specs[at].name,
                    status: "FAILED",
                    begins: false,
                    downstream_key: None,
                    token: &held.token,
                    output: None,
                    error: Some(error),
                };
                write(self, &held, &touch, Some(&write_step), None).await?;
            }
        }
        def.drive(self, held, false).await
    }
}
