//! One attempt of a request whose edge has a guard or an effect: a unit of its own (a
//! transaction on the engine's connection, a savepoint inside a caller's), in which the
//! entity is locked, the request judged (replay, then graph), the guard and the effect
//! run on the unit's connection, and the update, history and outbox rows written; one
//! commit. A refusal, a failure, a panic or an error undoes the whole unit.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering::Relaxed;

use futures_util::FutureExt;

use super::judge::{self, Refusal, Verdict};
use super::req::{Req, abandoned, outbox_taken};
use super::rules::{Halt, Judged};
use super::settle::own_write;
use super::step::{Step, retry_or_fail};
use super::{Engine, Outcome};
use crate::error::Error;
use crate::machine::StateMachine;
use crate::store::{Store, Txn, Unit, Written};

/// How the unit ends.
enum End<S> {
    /// Commit it: the request applied.
    Commit(Outcome<S>),
    /// Undo it, then take this step.
    Undo(Step<S>),
}

/// One attempt in a unit of its own.
pub(super) async fn attempt<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut S::Conn,
    txn: Txn,
    req: &Req<'_, M>,
) -> Step<M::State> {
    let store = &engine.store;
    // The unit's locks and the rules' writes are this call's writes.
    if !req.stage.wrote() {
        return Step::Done(Err(abandoned(req)));
    }
    let mut unit = match store.begin_unit(conn, txn).await {
        Ok(unit) => unit,
        Err(e) => return retry_or_fail::<M, S>(e, txn, false),
    };
    match judged(engine, &mut unit, req).await {
        Ok(End::Commit(outcome)) => match unit.commit().await {
            Ok(()) => Step::Done(Ok(outcome)),
            // The commit was sent: in doubt, read back by the write id.
            Err(e) => retry_or_fail::<M, S>(e, txn, true),
        },
        Ok(End::Undo(step)) => match unit.rollback().await {
            Ok(()) => step,
            Err(e) => retry_or_fail::<M, S>(e, txn, false),
        },
        // On a connection that failed, the unit went with it: given up without a round
        // trip. Otherwise undone before the error is judged.
        Err(e) => retry_or_fail::<M, S>(unit.fail(e).await, txn, false),
    }
}

/// Inside the unit: lock, judge, guard, effect, write.
async fn judged<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    unit: &mut Unit<'_, S>,
    req: &Req<'_, M>,
) -> std::result::Result<End<M::State>, sqlx::Error> {
    let key = req.key;
    // The entity locked, and this request's history row as committed when the lock was
    // granted: every request recorded for the entity was written under that lock. Where
    // the locked entity's state proves the request unrecorded, no history is read.
    let mut unread = false;
    let (entity, prior) = if engine.repeatable(req.event) || req.read_history.load(Relaxed) {
        unit.lock_observe(key).await?
    } else {
        let entity = unit.lock(key.order_id).await?;
        match &entity {
            Some(e) if engine.unrecorded_at(req.event, &e.status) => {
                unread = true;
                (entity, None)
            }
            _ => (entity, unit.prior(key).await?),
        }
    };
    let verdict = judge::judge::<M>(entity.as_ref(), prior.as_ref(), key, req.event, req.hash());
    let (from, to, version) = match verdict {
        // Recorded before: a replay runs neither guard nor effect.
        Verdict::Done(answer) => {
            return Ok(End::Undo(Step::Done(own_write(
                answer,
                prior.as_ref(),
                req,
            ))));
        }
        // A timer's firing at an entity that has left the armed version: moot, not refused.
        Verdict::Refused { .. }
            if req
                .at_version
                .is_some_and(|armed| entity.as_ref().is_some_and(|e| e.version != armed)) =>
        {
            return Ok(End::Undo(Step::Done(Err(Error::Moot {
                order_id: key.order_id,
                event: key.event,
                armed_version: req.at_version.unwrap_or_default(),
                version: entity.as_ref().map_or(0, |e| e.version),
            }))));
        }
        Verdict::Refused { state } => {
            let latest = unit.latest_ref(key).await?;
            return Ok(End::Undo(
                match judge::refuse::<M>(state, key, req.event, latest) {
                    Refusal::Answer(e) => Step::Done(Err(e)),
                    Refusal::Rejudge => Step::Retry("own reference recorded meanwhile"),
                },
            ));
        }
        Verdict::Apply { from, to, version } => (from, to, version),
    };
    // A timer's firing applies only at the version its state's timer was armed at: the
    // entity has left that state since (and may be back in it, armed again).
    if let Some(armed) = req.at_version
        && armed != version
    {
        return Ok(End::Undo(Step::Done(Err(Error::Moot {
            order_id: key.order_id,
            event: key.event,
            armed_version: armed,
            version,
        }))));
    }
    let edge = M::edge(from, req.event);
    let timers = engine.armed_in(to);
    if !timers.is_empty() || edge.is_some_and(|e| e.guard.is_some() || e.effect.is_some()) {
        unit.check_open(key.order_id, version).await?;
    }
    let judged = Judged::<M> {
        order_id: key.order_id,
        from,
        to,
        version,
        event: req.event,
        ref_id: key.ref_id,
        payload: req.payload.map(|p| p.json.as_str()),
    };
    for rule in [edge.and_then(|e| e.guard), edge.and_then(|e| e.effect)] {
        let Some(rule) = rule else { continue };
        match run(engine, rule, unit.conn(), &judged).await {
            Ok(()) => {}
            Err(Halt::Database(e)) => return Err(e),
            Err(Halt::Refuse { code, message }) => {
                return Ok(End::Undo(Step::Done(Err(Error::Refused {
                    guard: rule,
                    code,
                    message,
                }))));
            }
            Err(Halt::Failed(reason)) => {
                return Ok(End::Undo(Step::Done(Err(Error::RuleFailed {
                    rule,
                    reason,
                }))));
            }
        }
    }
    let apply = req.apply(from, to, version);
    let written = unit.apply(&apply).await?;
    if written == Written::Applied && !timers.is_empty() {
        let arm = crate::store::timers::Arm {
            machine: M::NAME,
            entity_id: key.order_id,
            state: to.into(),
            version: version + 1,
            timers: &timers,
        };
        unit.arm(&arm).await?;
    }
    Ok(match written {
        Written::Applied => End::Commit(Outcome::Applied {
            from,
            to,
            version: version + 1,
        }),
        // The entity is locked: it cannot have moved, so the history's unique key held
        // this request. Judged again, reading the history this time.
        Written::Lost => {
            if unread {
                req.read_history.store(true, Relaxed);
            }
            End::Undo(Step::Retry("lost the conditional update"))
        }
        Written::OutboxTaken => End::Undo(Step::Done(Err(outbox_taken(key)))),
    })
}

/// Runs the guard or effect `rule`, a panic caught as its failure.
async fn run<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    rule: &'static str,
    conn: &mut S::Conn,
    judged: &Judged<'_, M>,
) -> std::result::Result<(), Halt> {
    let Some(rules) = engine.rules.as_deref() else {
        return Err(Halt::Failed(
            "the engine was given no rules (Engine::with_rules)".into(),
        ));
    };
    match AssertUnwindSafe(rules.run(rule, conn, judged))
        .catch_unwind()
        .await
    {
        Ok(done) => done,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(Halt::Failed(format!("panicked: {what}")))
        }
    }
}
