//! Flows that wait: a wait step's timer (in the timers' table, fired by the timer job)
//! and its wake-up, which hands the sleeping flow to the job, fenced by the token it
//! sleeps under, and runs it on from the next step.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::FlowStore;
use super::flows::{Flows, Held, millis};
use crate::error::Error;
use crate::store::timers::{NewTimer, TimerKey, TimerRow};
use crate::store::{Lease, db_error};

/// The machine name of the flows' wait timers: the job's [`Timers::flows`] claims them.
///
/// [`Timers::flows`]: crate::timer::Timers::flows
pub const WAIT_MACHINE: &str = "flow:wait";

/// The timer of a flow's wait at step `index`, slept under `token`: its event the flow's
/// kind, its reference the flow key, its state and version the step's name and position.
/// Its entity is a hash of the flow, the step and the token ([`wait_entity`]), so each
/// sleep is a timer of its own, ordered after no other, and a timer wakes only the sleep
/// that armed it (not a later flow under the same key, after a purge).
pub(super) fn wait_timer<'a>(
    kind: &'a str,
    key: &'a str,
    step: &'a str,
    index: usize,
    token: &str,
    wait: Duration,
) -> NewTimer<'a> {
    NewTimer {
        key: TimerKey {
            machine: WAIT_MACHINE,
            entity_id: wait_entity(kind, key, index, token),
            event: kind,
            ref_id: key,
        },
        after_ms: millis(wait),
        at: Some((step, i64::try_from(index).unwrap_or(i64::MAX))),
    }
}

/// The entity of the timer of the sleep at step `index` of flow `(kind, key)` under
/// `token`: the first 63 bits of a SHA-256 of them.
fn wait_entity(kind: &str, key: &str, index: usize, token: &str) -> i64 {
    let mut hash = Sha256::new();
    for part in [kind, key, &index.to_string(), token] {
        hash.update(part.len().to_le_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first) & i64::MAX
}

/// How a wait timer's firing ended.
pub(crate) enum Woken {
    /// The flow was asleep at the step, and is this job's now: it runs on.
    Woke,
    /// The flow no longer sleeps there (woken already, taken over after its lease, gone).
    Moot(String),
    /// Failed for now.
    Retry(String),
    /// Failed for good.
    Dead(String),
}

fn failed(e: Error) -> Woken {
    if e.is_retryable() {
        Woken::Retry(e.to_string())
    } else {
        Woken::Dead(e.to_string())
    }
}

impl<S: FlowStore> Flows<S> {
    /// Fires a wait timer: if the flow still sleeps at the timer's step under the token
    /// it went to sleep with, hands it to a token of this job's (one fenced statement:
    /// of two firings, or a firing and a recovery, one takes it) and runs it on, on a
    /// task of its own.
    pub(crate) async fn wake(&self, t: &TimerRow) -> Woken {
        let (kind, key) = (t.event.as_str(), t.ref_id.as_str());
        let (Some(step), Some(index)) = (&t.state, t.version) else {
            return Woken::Dead("a flow's wait timer names no step".into());
        };
        let flow = match self.read_flow(kind, key).await {
            Ok(Some(flow)) => flow,
            Ok(None) => return Woken::Moot(format!("flow {kind} {key} does not exist")),
            Err(e) => return failed(e),
        };
        let asleep = flow.status == "RUNNING"
            && flow.park_reason.is_none()
            && i64::from(flow.step_at) == index;
        if !asleep {
            return Woken::Moot(format!("flow {kind} {key} no longer sleeps at step {step}"));
        }
        let Some(def) = self.def(kind, flow.version).cloned() else {
            return Woken::Retry(format!(
                "flow {kind} v{} is not registered with this job",
                flow.version
            ));
        };
        let steps = match self.read_steps(kind, key).await {
            Ok(steps) => steps,
            Err(e) => return failed(e),
        };
        let waiting = steps
            .iter()
            .find(|s| s.phase == "F" && i64::from(s.step_index) == index && s.status == "WAITING");
        // The sleep this timer armed: still the flow's holder, and the timer its own.
        let Some(waiting) = waiting.filter(|s| {
            s.owner_token == flow.owner_token
                && usize::try_from(index)
                    .is_ok_and(|i| wait_entity(kind, key, i, &s.owner_token) == t.entity_id)
        }) else {
            return Woken::Moot(format!(
                "flow {kind} {key} was woken at step {step}, or taken over"
            ));
        };
        let token = uuid::Uuid::new_v4().simple().to_string();
        let store = &self.store;
        let woke = async {
            let mut lease = Lease::acquire_for_write(store).await?;
            let out = store
                .wake_flow(
                    lease.conn(),
                    kind,
                    key,
                    &waiting.owner_token,
                    &token,
                    millis(self.config.lease),
                )
                .await;
            lease.release_after(&out);
            out
        };
        match woke.await {
            Ok(true) => {}
            Ok(false) => {
                return Woken::Moot(format!(
                    "flow {kind} {key} was woken at step {step}, or taken over"
                ));
            }
            Err(e) => return failed(db_error::<S>(e)),
        }
        let held = Held {
            kind: kind.to_string(),
            key: key.to_string(),
            token,
            attempt: flow.attempt,
            input: None,
        };
        let flows = self.clone();
        // Run on as a start's flow runs, on a task of its own: a failure leaves the flow
        // held until its lease runs out, then the recovery job resumes it.
        tokio::spawn(async move {
            if let Err(e) = def.drive(&flows, held.clone(), false).await {
                tracing::warn!(error = %e, kind = held.kind, key = held.key, "a woken flow stopped");
            }
        });
        Woken::Woke
    }
}
