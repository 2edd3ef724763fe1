//! The fenced write every recorded point of a held flow goes through: the flow's record
//! updated only while this holder's token and lease hold, in a transaction of its own.

use std::time::Duration;

use super::super::flows::{Flows, Held, millis};
use super::super::steps::bounded_str;
use super::super::{FlowStore, StepWrite, Touch};
use crate::error::Error;
use crate::error::Result;
use crate::store::timers::NewTimer;
use crate::store::{Lease, db_error};

/// A fenced write in a transaction of its own (see `Run::write`).
pub(crate) async fn write<S: FlowStore>(
    flows: &Flows<S>,
    held: &Held,
    touch: &Touch<'_>,
    step: Option<&StepWrite<'_>>,
    retry: Option<&str>,
) -> Result<()> {
    write_arming(flows, held, touch, step, retry, None).await
}

/// [`write`], and with it, in the same commit, the timer of a wait step.
pub(crate) async fn write_arming<S: FlowStore>(
    flows: &Flows<S>,
    held: &Held,
    touch: &Touch<'_>,
    step: Option<&StepWrite<'_>>,
    retry: Option<&str>,
    arm: Option<&NewTimer<'_>>,
) -> Result<()> {
    // The text an action or a service gave is cut where it came in; any other is cut
    // here, so that the record always lands (MariaDB's `TEXT` holds 64 KiB).
    let touch_error = touch.error.map(bounded_str);
    let touch = &Touch {
        error: touch_error.as_deref(),
        ..*touch
    };
    let step_error = step.and_then(|w| w.error).map(bounded_str);
    let step = step.map(|w| StepWrite {
        error: step_error.as_deref(),
        ..*w
    });
    let step = step.as_ref();
    let store = &flows.store;
    let mut lease = Lease::acquire_for_write(store)
        .await
        .map_err(db_error::<S>)?;
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
    if let Some(timer) = arm {
        store
            .schedule_timer(&mut tx, timer)
            .await
            .map_err(db_error::<S>)?;
    }
    tx.commit().await.map_err(db_error::<S>)?;
    lease.release();
    Ok(())
}

/// The fence alone: renews the lease (to `lease` from now) under the holder's token.
pub(crate) fn fence(held: &Held, lease: Duration) -> Touch<'_> {
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

pub(crate) fn lease_lost(held: &Held) -> Error {
    Error::LeaseLost {
        scope: format!("flow {}", held.kind),
        key: held.key.clone(),
    }
}

pub(super) fn missing(step: &str) -> Error {
    Error::InvalidInput(format!("step {step} has no action"))
}

pub(crate) fn to_i32(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}
