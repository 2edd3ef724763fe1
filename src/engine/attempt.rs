//! A request's way through the engine: the read-first step, the retry loop, and one
//! attempt (write or read → judge → write). A write left in doubt is read back in
//! `settle.rs`; a request's turn among coalesced writes is taken in `writes.rs`.

use backon::{BackoffBuilder, ExponentialBuilder};

use super::input::applied;
use super::judge::{self, Refusal, Verdict};
use super::req::{Conn, Req, abandoned, outbox_taken};
use super::settle::{own_write, settle};
use super::step::{Step, retry_or_fail};
use super::writes::{First, first_turn, request_of};
use super::{Engine, Outcome};
use crate::error::Error;
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{ErrorClass, FirstWrite, Store, Txn, Unpooled, Written, db_error};

/// A request on the engine's own connections: read first if the policy says so, then
/// the retry loop; counted once for [`ReadFirst::Adaptive`](super::ReadFirst::Adaptive).
pub(super) async fn pooled<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    req: &Req<'_, M>,
) -> Result<Outcome<M::State>> {
    let mut conn = Conn::Pooled(None);
    let answer = match read_first(engine, &mut conn, req).await {
        Some(answer) => answer,
        None => match first_turn(engine, &mut conn, req).await {
            Ok(first) => run(engine, &mut conn, req, first).await,
            Err(answer) => answer,
        },
    };
    conn.finish();
    note_answer(engine, &answer);
    answer
}

/// Counts a request's answer for [`ReadFirst::Adaptive`](super::ReadFirst::Adaptive):
/// whether it had been recorded before.
pub(super) fn note_answer<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    answer: &Result<Outcome<M::State>>,
) {
    engine.first.note(matches!(
        answer,
        Ok(Outcome::Replayed { .. }) | Err(Error::PayloadMismatch { .. })
    ));
}

/// The read-first step: the request's history row, batched with concurrent callers'
/// reads before a connection is taken on a store that batches reads. The answer if the
/// request was recorded; `None` if it was not, or could not be read (the attempt loop
/// then goes on as if it had not read first, and reports its own errors).
async fn read_first<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut Conn<'_, S>,
    req: &Req<'_, M>,
) -> Option<Result<Outcome<M::State>>> {
    if !engine.first.reads_first() {
        return None;
    }
    let prior = match &engine.reads {
        Some(reads) => reads.prior(req.key).await?,
        None => {
            let read = match conn.get(&engine.store).await {
                Ok(c) => {
                    req.stage.connected();
                    engine.store.prior(c, req.key, Txn::Own).await
                }
                Err(e) => Err(e),
            };
            match read {
                Ok(prior) => prior,
                Err(e) => {
                    if S::classify(&e) == ErrorClass::ConnectionLost {
                        conn.lost();
                    }
                    return None;
                }
            }
        }
    };
    Some(judge::replay::<M>(&prior?, req.key, req.event, req.hash()))
}

/// The retry loop: attempts until one answers, within [`EngineConfig::max_attempts`]
/// (`super::EngineConfig`), with jittered exponential backoff between them.
pub(super) async fn run<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut Conn<'_, S>,
    req: &Req<'_, M>,
    first: First<S>,
) -> Result<Outcome<M::State>> {
    let mut first = Some(first);
    let config = &engine.config;
    let txn = conn.txn();
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(config.min_backoff)
        .with_max_delay(config.max_backoff)
        .with_jitter()
        .without_max_times()
        .build();
    let mut attempts = 0;
    let started = tokio::time::Instant::now();
    loop {
        attempts += 1;
        let mut unreachable = false;
        let unpooled = match attempts {
            1 => unpooled_first(engine, txn, req, &mut first).await,
            _ => None,
        };
        let step = match unpooled {
            Some(step) => step,
            None => match conn.get_for(&engine.store, req.own_unit(engine)).await {
                Ok(c) => {
                    req.stage.connected();
                    attempt(engine, c, txn, req, first.take().unwrap_or(First::Write)).await
                }
                Err(e) => {
                    unreachable = true;
                    // No write goes out while no connection is to be had: the write turn,
                    // if this request holds it, goes on to the requests queued behind it.
                    if let Some(First::Alone(_)) = first {
                        first = Some(First::Write);
                    }
                    retry_or_fail::<M, S>(e, txn, false)
                }
            },
        };
        let (reason, lost) = match step {
            Step::Done(result) => return result,
            Step::Retry(reason) => {
                crate::observe::rejudge(M::NAME, reason);
                (reason, None)
            }
            Step::Lost { error, wrote } => {
                conn.lost();
                let lost = if wrote {
                    if let Some(answer) = settle(engine, req, error).await {
                        return answer;
                    }
                    ("the write did not land", None)
                } else {
                    ("connection lost", Some(error))
                };
                crate::observe::rejudge(M::NAME, lost.0);
                lost
            }
        };
        let key = req.key;
        if attempts >= config.max_attempts {
            tracing::warn!(
                order_id = key.order_id,
                event = key.event,
                attempts,
                reason,
                "giving up"
            );
            return Err(match lost {
                // The last attempt could not even get a connection, and no write of this
                // call was ever sent.
                _ if unreachable && !req.stage.sent_a_write() => Error::Unavailable {
                    waited: started.elapsed(),
                },
                // A write was sent on a connection that failed, and read back as not
                // recorded; no connection is to be had now to settle it for good.
                error if unreachable => Error::InDoubt {
                    order_id: key.order_id,
                    event: key.event,
                    ref_id: key.ref_id.to_string(),
                    source: error.unwrap_or(sqlx::Error::PoolTimedOut),
                },
                Some(error) => db_error::<S>(error),
                None => Error::Contention { attempts },
            });
        }
        let delay = delays.next().unwrap_or(config.max_backoff);
        tracing::debug!(
            order_id = key.order_id,
            event = key.event,
            attempts,
            reason,
            ?delay,
            "reading again"
        );
        // A unit of its own holds the store's writer's turn with its connection (SQLite):
        // given back while it waits, so that other writers go meanwhile.
        if req.own_unit(engine) {
            conn.put_back();
        }
        tokio::time::sleep(delay).await;
    }
}

/// The first attempt's apply-first write on a writer of the store's own that needs no
/// connection of the pool's ([`Store::apply_first_unpooled`]), for a request written
/// outside a caller's transaction and not in a unit of its own: the step if the write
/// settled it (applied, a version reused, the caller gone, a failure); `None` if the store
/// has no such writer now, or the write found the request not applied (`first` then
/// says so: the attempt starts with the read, on a connection).
async fn unpooled_first<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    txn: Txn,
    req: &Req<'_, M>,
    first: &mut Option<First<S>>,
) -> Option<Step<M::State>> {
    if txn != Txn::Own
        || req.own_unit(engine)
        || matches!(first, Some(First::NotApplied))
        || !engine.store.writes_unpooled()
    {
        return None;
    }
    let request = request_of(engine, req);
    // A request the store does not try first sends nothing here: its attempt goes as
    // ever, on a connection.
    if !request.has_one_edge() {
        return None;
    }
    // A write sent before (a batch that failed) stays sent whatever this one does.
    let sent_before = req.stage.sent_a_write();
    if !req.stage.wrote() {
        return Some(Step::Done(Err(abandoned(req))));
    }
    let written = engine
        .store
        .apply_first_unpooled(std::slice::from_ref(&request))
        .await;
    // The write is done: requests queued behind it go in the next batch.
    *first = Some(First::NotApplied);
    let key = req.key;
    Some(match written {
        Ok(Unpooled::Written(mut written)) => match written.pop() {
            Some(FirstWrite::Applied { from, to, version }) => {
                Step::Done(applied::<M>(key.order_id, &from, &to, version))
            }
            Some(FirstWrite::OutboxTaken) => Step::Done(Err(outbox_taken(key))),
            Some(FirstWrite::NotApplied) => return None,
            Some(FirstWrite::NotTried) | None => {
                *first = Some(First::Write);
                return None;
            }
        },
        // A row met a unique key. Only the history's, if the request writes no outbox
        // row: recorded before, which the read tells. Otherwise (the outbox's, a version
        // reused) nothing was written: the attempt writes on a connection, which tells
        // which key it was.
        Ok(Unpooled::KeyMet) if !request.emits_any() => return None,
        // No writer free: nothing was sent.
        Ok(Unpooled::NoWriter) => {
            if !sent_before {
                req.stage.wrote_nothing();
            }
            *first = Some(First::Write);
            return None;
        }
        Ok(_) => {
            *first = Some(First::Write);
            return None;
        }
        Err(e) => {
            // The next attempt writes again (or reads back what this one sent).
            *first = None;
            retry_or_fail::<M, S>(e, txn, true)
        }
    })
}

/// One attempt: the apply-first write (inside a caller's transaction in a savepoint, and
/// only while the engine does not read first); if that did not settle it, the judge's
/// read, the verdict, and the write it calls for.
async fn attempt<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut S::Conn,
    txn: Txn,
    req: &Req<'_, M>,
    given: First<S>,
) -> Step<M::State> {
    if req.own_unit(engine) {
        if txn == Txn::Caller
            && let Some(answer) = armed_first(engine, conn, req).await
        {
            return answer;
        }
        return super::guarded::attempt(engine, conn, txn, req).await;
    }
    let store = &engine.store;
    let key = req.key;
    let mut first = FirstWrite::NotTried;
    // Inside a caller's transaction the write goes first too (in a savepoint), unless
    // replays are common enough for the engine to read first. A write that went in a
    // batch is not written again.
    let slot = match given {
        First::NotApplied => {
            first = FirstWrite::NotApplied;
            None
        }
        First::Alone(slot) => Some(slot),
        First::Write => None,
    };
    if first == FirstWrite::NotTried && (txn == Txn::Own || !engine.first.reads_first()) {
        let request = request_of(engine, req);
        if !req.stage.wrote() {
            return Step::Done(Err(abandoned(req)));
        }
        let written = match txn {
            Txn::Own => {
                store
                    .apply_first(conn, std::slice::from_ref(&request))
                    .await
            }
            Txn::Caller => store.apply_first_in(conn, &request).await.map(|w| vec![w]),
        };
        // The write is done: requests queued behind it go in the next batch.
        drop(slot);
        first = match written.map(|mut w| w.pop()) {
            Ok(Some(FirstWrite::Applied { from, to, version })) => {
                return Step::Done(applied::<M>(key.order_id, &from, &to, version));
            }
            Ok(Some(FirstWrite::OutboxTaken)) => return Step::Done(Err(outbox_taken(key))),
            Ok(Some(not)) => not,
            // A store that answered nothing for the request wrote nothing for it.
            Ok(None) => FirstWrite::NotTried,
            Err(e) => return retry_or_fail::<M, S>(e, txn, true),
        };
    }
    let (entity, prior) = match store.observe(conn, key, txn).await {
        Ok(Some(observed)) => (Some(observed.entity), observed.prior),
        // No entity row, so the read had nothing to join the history row to: a request
        // recorded for it is still a replay (row 1 before row 5).
        Ok(None) => match store.prior(conn, key, txn).await {
            Ok(prior) => (None, prior),
            Err(e) => return retry_or_fail::<M, S>(e, txn, false),
        },
        Err(e) => return retry_or_fail::<M, S>(e, txn, false),
    };
    let verdict = judge::judge::<M>(entity.as_ref(), prior.as_ref(), key, req.event, req.hash());
    let (from, to, version) = match verdict {
        // A row carrying this call's write id is its own write (an earlier attempt's,
        // whose acknowledgement was lost but which committed after all).
        Verdict::Done(answer) => return Step::Done(own_write(answer, prior.as_ref(), req)),
        Verdict::Refused { state } => {
            return match store.latest_ref(conn, key, txn).await {
                Ok(latest) => match judge::refuse::<M>(state, key, req.event, latest) {
                    Refusal::Answer(e) => Step::Done(Err(e)),
                    Refusal::Rejudge => Step::Retry("own reference recorded meanwhile"),
                },
                Err(e) => retry_or_fail::<M, S>(e, txn, false),
            };
        }
        // The apply-first write already found the entity elsewhere: it moved in between.
        Verdict::Apply { .. } if first == FirstWrite::NotApplied => {
            return Step::Retry("stale snapshot");
        }
        Verdict::Apply { from, to, version } => (from, to, version),
    };
    let apply = req.apply(from, to, version);
    if !req.stage.wrote() {
        return Step::Done(Err(abandoned(req)));
    }
    match store.apply(conn, &apply, txn).await {
        Ok(Written::Applied) => Step::Done(Ok(Outcome::Applied {
            from,
            to,
            version: version + 1,
        })),
        // Someone else moved first: nothing was written; judge again from a fresh read.
        Ok(Written::Lost) => Step::Retry("lost the conditional update"),
        Ok(Written::OutboxTaken) => Step::Done(Err(outbox_taken(key))),
        Err(e) => retry_or_fail::<M, S>(e, txn, true),
    }
}

/// A timer's firing inside a caller's transaction, over an edge with no guard, effect or
/// timers: the move written first with the armed state and version as its predicate (the
/// write a unit would make after reading the entity there). `None` if it wrote nothing
/// (the entity moved on, or the history holds the reference): the unit then reads and
/// judges (moot, replayed, refused).
async fn armed_first<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut S::Conn,
    req: &Req<'_, M>,
) -> Option<Step<M::State>> {
    let (from, version) = (req.armed_in?, req.at_version?);
    if engine.has_rules(req.event) {
        return None;
    }
    let to = M::next(from, req.event)?;
    if !req.stage.wrote() {
        return Some(Step::Done(Err(abandoned(req))));
    }
    match engine
        .store
        .apply_in_batch(conn, &req.apply(from, to, version))
        .await
    {
        Ok(Written::Applied) => Some(Step::Done(Ok(Outcome::Applied {
            from,
            to,
            version: version + 1,
        }))),
        Ok(Written::Lost) => None,
        Ok(Written::OutboxTaken) => Some(Step::Done(Err(outbox_taken(req.key)))),
        Err(e) => Some(retry_or_fail::<M, S>(e, Txn::Caller, true)),
    }
}
