//! A transition's place among its engine's coalesced writes (`coalesce/writes.rs`): the
//! engine's side, turning a write unit's answer about a request into the transition's
//! outcome or the way its first attempt starts.

use super::input::applied;
use super::req::{Conn, Req, abandoned, outbox_taken};
use super::{Engine, Outcome};
use crate::coalesce::queue::Entered;
use crate::coalesce::writes::{Answer, Slot};
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{FirstWrite, Request, Store};

/// How a request's first attempt starts.
pub(super) enum First<S: Store> {
    /// With its own apply-first write, as every attempt does.
    Write,
    /// With its own apply-first write, holding the write turn of a coalescing engine,
    /// which goes on once the write is done.
    Alone(Slot<S>),
    /// Its apply-first write went in a batch, which said it was not applied: the attempt
    /// starts with the read.
    NotApplied,
}

/// A request's place among the coalesced writes of its engine: alone at once if no write
/// is in flight, else queued for the next batch, whose answer settles it (`Err(answer)`)
/// or tells the first attempt how to start. Without coalescing, [`First::Write`].
pub(super) async fn first_turn<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    conn: &mut Conn<'_, S>,
    req: &Req<'_, M>,
) -> std::result::Result<First<S>, Result<Outcome<M::State>>> {
    // A request whose edge has a guard or an effect is written in a unit of its own.
    let Some(writes) = engine
        .writes
        .as_ref()
        .filter(|_| engine.store.batches_writes() && !req.own_unit(engine))
    else {
        return Ok(First::Write);
    };
    let request = request_of(engine, req);
    let answer = match writes.turn(&request, req.stage) {
        Entered::Alone(slot) => return Ok(First::Alone(slot)),
        Entered::Queued(answer) => {
            // A connection held from a read before must not wait with it: the batch
            // needs one of the pool's.
            conn.put_back();
            answer.await
        }
    };
    match answer {
        Ok(Answer::Written(FirstWrite::Applied { from, to, version })) => {
            Err(applied::<M>(req.key.order_id, &from, &to, version))
        }
        Ok(Answer::Written(FirstWrite::OutboxTaken)) => Err(Err(outbox_taken(req.key))),
        Ok(Answer::Written(FirstWrite::NotApplied)) => Ok(First::NotApplied),
        Ok(Answer::Abandoned) => Err(Err(abandoned(req))),
        // Not tried by the store, or the batch failed: the request goes its own way, and
        // its own write finds out whether the batch's landed.
        Ok(Answer::Written(FirstWrite::NotTried) | Answer::Failed) | Err(_) => Ok(First::Write),
    }
}

/// The apply-first unit's view of a request.
pub(super) fn request_of<'r, M: StateMachine, S: Store>(
    engine: &'r Engine<M, S>,
    req: &'r Req<'r, M>,
) -> Request<'r> {
    let edges = engine.edges.get(&req.event);
    Request {
        key: req.key,
        from_states: edges.map_or(&[], |e| &e.from),
        to_states: edges.map_or(&[], |e| &e.to),
        payload_hash: req.hash(),
        payload: req.payload.map(|p| p.json.as_str()),
        write_id: req.write_id,
        audit: req.audit,
        emits: edges.map_or(&[], |e| &e.emits),
        machine: M::NAME,
        event_body: req.event_body,
        trace: req.trace,
    }
}
