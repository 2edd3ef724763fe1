use super::*;

crate::state_machine! {
    Ticket {
        states: TicketState { Open, Working, Blocked, Closed }
        events: TicketEvent { Start, Block, Unblock, Close }
        initial: Open;
        terminal: [Closed];
        transitions: {
            Open    + Start   => Working,
            Working + Block   => Blocked,
            Blocked + Unblock => Working,
            Open    + Close   => Closed,
            Working + Close   => Closed,
            Blocked + Close   => Closed,
        }
    }
}

use TicketEvent::*;
use TicketState::*;

fn key(ref_id: &str) -> Key<'_> {
    Key {
        order_id: 1,
        event: "Start",
        ref_id,
    }
}

fn entity(status: &str, version: i64) -> Entity {
    Entity {
        status: status.into(),
        version,
    }
}

#[test]
fn judge_follows_the_outcome_table() {
    let apply = judge::<Ticket>(Some(&entity("Open", 0)), None, key("r"), Start, None);
    assert!(matches!(
        apply,
        Verdict::Apply {
            from: Open,
            to: Working,
            version: 0
        }
    ));

    let prior = Prior {
        seq: 1,
        from: "Open".into(),
        to: "Working".into(),
        payload_hash: None,
        write_id: None,
    };
    let replay = judge::<Ticket>(
        Some(&entity("Blocked", 2)),
        Some(&prior),
        key("r"),
        Start,
        None,
    );
    assert!(matches!(
        replay,
        Verdict::Done(Ok(Outcome::Replayed { version: 1, .. }))
    ));
    // Recorded for an entity that is gone: still a replay.
    let orphan = judge::<Ticket>(None, Some(&prior), key("r"), Start, None);
    assert!(matches!(
        orphan,
        Verdict::Done(Ok(Outcome::Replayed { .. }))
    ));

    let mismatch = judge::<Ticket>(None, Some(&prior), key("r"), Start, Some("abc"));
    assert!(matches!(
        mismatch,
        Verdict::Done(Err(Error::PayloadMismatch { .. }))
    ));

    let refused = judge::<Ticket>(Some(&entity("Working", 1)), None, key("r"), Start, None);
    assert!(matches!(refused, Verdict::Refused { state: Working }));
    assert!(matches!(
        refuse::<Ticket>(Working, key("r"), Start, Some("other".into())),
        Refusal::Answer(Error::RefConflict { ref existing_ref, .. }) if existing_ref == "other"
    ));
    assert!(matches!(
        refuse::<Ticket>(Working, key("r"), Start, None),
        Refusal::Answer(Error::InvalidTransition {
            state: "Working",
            event: "Start"
        })
    ));
    assert!(matches!(
        refuse::<Ticket>(Working, key("r"), Start, Some("r".into())),
        Refusal::Rejudge
    ));

    for corrupt in [entity("Ajar", 1), entity("Open", -1)] {
        assert!(matches!(
            judge::<Ticket>(Some(&corrupt), None, key("r"), Start, None),
            Verdict::Done(Err(Error::CorruptState { .. }))
        ));
    }
    assert!(matches!(
        judge::<Ticket>(None, None, key("r"), Start, None),
        Verdict::Done(Err(Error::NotFound { order_id: 1 }))
    ));
}

#[cfg(feature = "testing")]
mod against_the_model {
    //! Invariant: the judge, over what a sequential store would read, answers every
    //! request as the reference model does, payloads included.

    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::testing::{Model, steps};

    /// The rows a database would hold, written as the judge's verdicts say.
    #[derive(Default)]
    struct Rows {
        entities: HashMap<i64, Entity>,
        history: HashMap<(i64, &'static str, String), Prior>,
        latest: HashMap<(i64, &'static str), String>,
    }

    impl Rows {
        fn transition(
            &mut self,
            key: Key<'_>,
            event: TicketEvent,
            hash: Option<&str>,
        ) -> Result<Outcome<TicketState>> {
            let history_key = (key.order_id, key.event, key.ref_id.to_string());
            let verdict = judge::<Ticket>(
                self.entities.get(&key.order_id),
                self.history.get(&history_key),
                key,
                event,
                hash,
            );
            match verdict {
                Verdict::Done(answer) => answer,
                Verdict::Refused { state } => {
                    let latest = self.latest.get(&(key.order_id, key.event)).cloned();
                    match refuse::<Ticket>(state, key, event, latest) {
                        Refusal::Answer(e) => Err(e),
                        Refusal::Rejudge => panic!("a sequential store never needs a second read"),
                    }
                }
                Verdict::Apply { from, to, version } => {
                    let seq = version + 1;
                    self.entities.insert(key.order_id, entity(to.into(), seq));
                    self.history.insert(
                        history_key,
                        Prior {
                            seq,
                            from: <&str>::from(from).into(),
                            to: <&str>::from(to).into(),
                            payload_hash: hash.map(str::to_string),
                            write_id: None,
                        },
                    );
                    self.latest
                        .insert((key.order_id, key.event), key.ref_id.to_string());
                    Ok(Outcome::Applied {
                        from,
                        to,
                        version: seq,
                    })
                }
            }
        }
    }

    proptest! {
        #[test]
        fn judge_agrees_with_the_model(seq in steps::<Ticket>(3, 3, 1..80)) {
            let mut model = Model::<Ticket>::new(0..3);
            let mut rows = Rows::default();
            for id in 0..3 {
                rows.entities.insert(id, entity("Open", 0));
            }
            for (n, step) in seq.iter().enumerate() {
                let key = Key {
                    order_id: step.order,
                    event: step.event.into(),
                    ref_id: &step.ref_id,
                };
                let payload = step.payload.as_ref().map(ToString::to_string);
                let hash = payload.as_deref();
                let expected = model.apply_with_payload(step.order, step.event, &step.ref_id, hash);
                let actual = rows.transition(key, step.event, hash);
                prop_assert!(
                    expected.matches(&actual),
                    "step {n} {step:?}: expected {expected:?}, got {actual:?}"
                );
            }
        }
    }
}
