//! The timer job's batch, set-based: the firings whose edges are only writes, armed at
//! a state and a version, written in one statement where the store has one
//! ([`Store::apply_many_in_batch`]); what that did not apply is judged one by one.

use std::time::Instant;

use super::Engine;
use super::input::{parse_event, validate_ref};
use super::req::write_id;
use crate::machine::StateMachine;
use crate::store::{Apply, Audit, Key, Store, Written};

/// The versions a timer can be armed at: from 0, below the last (which has no next).
pub(crate) const ARMABLE_VERSIONS: std::ops::Range<i64> = 0..i64::MAX;

/// A timer's firing as the batch's row gives it: the entity, the event's name, the
/// reference, and the state and version it was armed at (if the row names them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Armed<'t> {
    pub(crate) entity_id: i64,
    pub(crate) event: &'t str,
    pub(crate) ref_id: &'t str,
    pub(crate) state: Option<&'t str>,
    pub(crate) version: Option<i64>,
}

/// What the set-based write did with one timer's firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchFiring {
    /// Moved, its history row written: the firing is applied.
    Applied,
    /// Not written (the entity left the armed state and version, the edge has rules or
    /// emits an event, the row does not read): to be fired one by one, and judged.
    Judge,
}

impl<M: StateMachine, S: Store> Engine<M, S> {
    /// Writes the firings of `rows` that can go in one statement inside the job's batch
    /// transaction on `conn`, which the job rolls back whole on any error. Each row's
    /// answer in its place.
    pub(crate) async fn fire_armed_in_batch(
        &self,
        conn: &mut S::Conn,
        rows: &[Armed<'_>],
    ) -> Result<Vec<BatchFiring>, sqlx::Error> {
        let mut answers = vec![BatchFiring::Judge; rows.len()];
        let mut places = Vec::with_capacity(rows.len());
        let mut applies = Vec::with_capacity(rows.len());
        for (i, t) in rows.iter().enumerate() {
            if let Some(apply) = self.armed_apply(t) {
                places.push(i);
                applies.push(apply);
            }
        }
        if applies.is_empty() {
            return Ok(answers);
        }
        let started = Instant::now();
        let written = self.store.apply_many_in_batch(conn, &applies).await?;
        // An answer for each write, or none is taken (the job undoes the batch).
        if written.len() != applies.len() {
            return Err(sqlx::Error::Protocol(format!(
                "the store answered {} of a batch of {} timer firings",
                written.len(),
                applies.len()
            )));
        }
        for ((place, apply), written) in places.into_iter().zip(&applies).zip(written) {
            if written == Written::Applied {
                answers[place] = BatchFiring::Applied;
                crate::observe::transition(M::NAME, apply.key.event, "applied", started.elapsed());
                self.first.note(false);
            }
        }
        Ok(answers)
    }

    /// The write of a timer's firing armed at a state and a version, over an edge with
    /// no guard, effect, timers or event to emit, as the unit would make it after reading
    /// the entity there; `None` for any other row.
    fn armed_apply<'t>(&self, t: &Armed<'t>) -> Option<Apply<'t>> {
        let event = parse_event::<M>(t.event).ok()?;
        let (state, version) = (t.state?, t.version?);
        let from = state.parse::<M::State>().ok()?;
        let to = M::next(from, event)?;
        // The write sets version + 1: a version of i64::MAX has no next.
        if self.has_rules(event)
            || M::emits(from, event).is_some()
            || !ARMABLE_VERSIONS.contains(&version)
        {
            return None;
        }
        validate_ref(t.ref_id).ok()?;
        Some(Apply {
            key: Key {
                order_id: t.entity_id,
                event: event.into(),
                ref_id: t.ref_id,
            },
            from: from.into(),
            to: to.into(),
            version,
            payload_hash: None,
            payload: None,
            write_id: write_id(),
            audit: Audit {
                actor: Some("timer"),
                reason: None,
            },
            emits: None,
            machine: M::NAME,
            event_body: None,
            trace: None,
        })
    }
}
