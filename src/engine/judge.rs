//! The outcome table as a pure function of what was read: no I/O, no async. The attempt
//! loop reads, asks the judge, and writes or reads again as the verdict says.

use super::Outcome;
use super::input::{parse_state, parse_version};
use crate::error::Error;
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{Entity, Key, Prior};

/// What to do next.
#[derive(Debug)]
pub(super) enum Verdict<S> {
    /// The answer.
    Done(Result<Outcome<S>>),
    /// Apply the event: `from` → `to`, guarded by `version`.
    Apply { from: S, to: S, version: i64 },
    /// The event is not allowed from `state`: read the event's latest reference and
    /// [`refuse`].
    Refused { state: S },
}

/// The answer to a refused event, from its latest reference.
#[derive(Debug)]
pub(super) enum Refusal {
    /// `RefConflict` or `InvalidTransition`.
    Answer(Error),
    /// The latest reference is the request's own: what was read is already stale (the
    /// request itself was recorded meanwhile); read again.
    Rejudge,
}

/// Rows 1, 2, 5, 6 and 8 of the outcome table, from the entity (if it exists) and this
/// request's history row (if it was recorded).
pub(super) fn judge<M: StateMachine>(
    entity: Option<&Entity>,
    prior: Option<&Prior>,
    key: Key<'_>,
    event: M::Event,
    payload_hash: Option<&str>,
) -> Verdict<M::State> {
    if let Some(prior) = prior {
        return Verdict::Done(replay::<M>(prior, key, event, payload_hash));
    }
    let Some(entity) = entity else {
        return Verdict::Done(Err(Error::NotFound {
            order_id: key.order_id,
        }));
    };
    let read = parse_state::<M>(key.order_id, &entity.status)
        .and_then(|state| Ok((state, parse_version(key.order_id, entity.version)?)));
    let (state, version) = match read {
        Ok(read) => read,
        Err(e) => return Verdict::Done(Err(e)),
    };
    match M::next(state, event) {
        Some(to) => Verdict::Apply {
            from: state,
            to,
            version,
        },
        None => Verdict::Refused { state },
    }
}

/// Rows 1 and 2: a request recorded before is answered from its history row alone (a
/// replay is final, so the entity's row is not needed).
pub(super) fn replay<M: StateMachine>(
    prior: &Prior,
    key: Key<'_>,
    event: M::Event,
    payload_hash: Option<&str>,
) -> Result<Outcome<M::State>> {
    if prior.payload_hash.as_deref() != payload_hash {
        let event: &'static str = event.into();
        return Err(Error::PayloadMismatch {
            subject: format!("{event} on order {}", key.order_id),
            reference: key.ref_id.to_string(),
        });
    }
    Ok(Outcome::Replayed {
        from: parse_state::<M>(key.order_id, &prior.from)?,
        to: parse_state::<M>(key.order_id, &prior.to)?,
        version: prior.seq,
    })
}

/// Rows 3 and 4: the event is not allowed from `state`; it is a conflict if it was
/// applied to this entity under another reference. If its latest reference is this
/// request's own, a twin of this very request was applied after the judge's read (on a
/// graph with a cycle, the entity can come back to where the event is refused): the
/// request is recorded now, and a fresh read answers it as a replay. Never a conflict
/// with itself.
pub(super) fn refuse<M: StateMachine>(
    state: M::State,
    key: Key<'_>,
    event: M::Event,
    latest_ref: Option<String>,
) -> Refusal {
    Refusal::Answer(match latest_ref {
        Some(existing) if existing == key.ref_id => return Refusal::Rejudge,
        Some(existing_ref) => Error::RefConflict {
            event: event.into(),
            existing_ref,
        },
        None => Error::InvalidTransition {
            state: state.into(),
            event: event.into(),
        },
    })
}

#[cfg(test)]
mod tests;
