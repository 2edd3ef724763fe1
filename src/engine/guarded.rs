//! One attempt of a request whose edge has a guard or an effect: a unit of its own (a
//! transaction on the engine's connection, a savepoint inside a caller's), in which the
//! entity is locked, the request judged (replay, then graph), the guard and the effect
//! run on the unit's connection, and the update, history and outbox rows written; one
//! commit. A refusal, a failure, a panic or an error undoes the whole unit.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;

use super::attempt::{Step, retry_or_fail};
use super::judge::{self, Refusal, Verdict};
use super::req::{Req, abandoned, outbox_taken};
use super::rules::{Halt, Judged};
use super::settle::own_write;
use super::{Engine, Outcome};
use crate::Error;
use crate::machine::StateMachine;
use crate::store::{Store, Txn, Written};

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
    if let Err(e) = store.begin_rules_unit(conn, txn).await {
        return retry_or_fail::<M, S>(e, txn, false);
    }
    match judged(engine, conn, req).await {
        Ok(End::Commit(outcome)) => match store.end_rules_unit(conn, txn, true).await {
            Ok(()) => Step::Done(Ok(outcome)),
            // The commit was sent: in doubt, read back by the write id.
            Err(e) => retry_or_fail::<M, S>(e, txn, true),
        },
        Ok(End::Undo(step)) => match store.end_rules_unit(conn, txn, false).await {
            Ok(()) => step,
            Err(e) => retry_or_fail::<M, S>(e, txn, false),
        },
        Err(e) => {
            // A connection that failed takes its transaction with it; on one that did
            // not, the unit is undone before the error is judged.
            let _ = store.end_rules_unit(conn, txn, false).await;
            retry_or_fail::<M, S>(e, txn, false)
        }
    }
}

/// Inside the unit: lock, judge, guard, effect, write.
async fn judged<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut S::Conn,
    req: &Req<'_, M>,
) -> std::result::Result<End<M::State>, sqlx::Error> {
    let store = &engine.store;
    let key = req.key;
    let entity = store.lock(conn, key.order_id).await?;
    let prior = store.prior(conn, key, Txn::Caller).await?;
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
        Verdict::Refused { state } => {
            let latest = store.latest_ref(conn, key, Txn::Caller).await?;
            return Ok(End::Undo(
                match judge::refuse::<M>(state, key, req.event, latest) {
                    Refusal::Answer(e) => Step::Done(Err(e)),
                    Refusal::Rejudge => Step::Retry("own reference recorded meanwhile"),
                },
            ));
        }
        Verdict::Apply { from, to, version } => (from, to, version),
    };
    let edge = M::edge(from, req.event);
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
        match run(engine, rule, conn, &judged).await {
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
    Ok(match store.apply(conn, &apply, Txn::Caller).await? {
        Written::Applied => End::Commit(Outcome::Applied {
            from,
            to,
            version: version + 1,
        }),
        // The entity is locked: it cannot have moved. Judged again from a fresh read.
        Written::Lost => End::Undo(Step::Retry("lost the conditional update")),
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
