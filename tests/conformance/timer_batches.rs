//! Timer batches on every backend: the firings that are only writes, at the state and
//! version their timers were armed at, written together inside the claim's transaction
//! (one statement where the store has one); the rest judged one by one; a firing the
//! history refuses undoes the batch whole.

use super::Backend;
use super::timers::{UnpaidEvent, UnpaidState, job, make_due, timed_engine, timers_of};

/// One round over four due timers of four entities: two at the state and version their
/// timers were armed at (applied together), one paid meanwhile and one paid, unpaid and
/// back at `Created` at a later version (both moot, though the second is at the armed
/// state); the later timer of the one back at `Created` fires in the next round.
pub async fn a_batch_fires_the_armed_and_judges_the_rest<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    for id in 1..=4 {
        engine.create(id).await.unwrap();
    }
    engine.transition(2, UnpaidEvent::Pay, "p-2").await.unwrap();
    engine.transition(3, UnpaidEvent::Pay, "p-3").await.unwrap();
    engine
        .transition(3, UnpaidEvent::Unpay, "u-3")
        .await
        .unwrap();
    // The paid state's timers are not part of this test.
    b.exec("UPDATE orderly_timers SET status = 'CANCELLED' WHERE ref_id = 'timer:Paid:1'")
        .await;
    for id in 1..=4 {
        make_due(b, id).await;
    }
    let first = timers.fire_once().await.unwrap();
    assert_eq!(
        (first.claimed, first.applied, first.moot),
        (4, 2, 2),
        "{first:?}"
    );
    let state = async |id| {
        let e = engine.get(id).await.unwrap();
        (e.state, e.version)
    };
    assert_eq!(state(1).await, (UnpaidState::Cancelled, 1));
    assert_eq!(state(2).await, (UnpaidState::Paid, 1));
    assert_eq!(state(3).await, (UnpaidState::Created, 2));
    assert_eq!(state(4).await, (UnpaidState::Cancelled, 1));
    for id in [1, 4] {
        let history = engine.history(id).await.unwrap();
        assert_eq!(history.len(), 1, "entity {id}");
        let h = &history[0];
        assert_eq!(
            (h.seq, h.from, h.to, h.event, h.ref_id.as_str()),
            (
                1,
                UnpaidState::Created,
                UnpaidState::Cancelled,
                UnpaidEvent::Cancel,
                "timer:Created:0"
            ),
            "entity {id}"
        );
        assert_eq!(
            (
                h.actor.as_deref(),
                h.reason.as_deref(),
                h.payload_hash.as_deref()
            ),
            (Some("timer"), None, None)
        );
    }
    let t = timers_of(&engine, 3).await.remove(0);
    assert_eq!(
        (t.status.as_str(), t.outcome.as_deref()),
        ("FIRED", Some("moot")),
        "{t:?}"
    );
    let second = timers.fire_once().await.unwrap();
    assert_eq!((second.claimed, second.applied), (1, 1), "{second:?}");
    assert_eq!(state(3).await, (UnpaidState::Cancelled, 3));
    let last = engine.history(3).await.unwrap().pop().unwrap();
    assert_eq!(last.ref_id, "timer:Created:2");
}

/// A batch whose firing meets the history's unique key (an entity back at the state and
/// version its timer was armed at, while the history holds the timer's reference: a
/// database whose rows disagree) is undone whole, its move with it: the entity is not
/// left moved without its history row, the batch's other timers fire, and the timer is
/// then answered from the history, one by one. First with the timer due alone (a batch
/// of one, written one firing at a time), then among others (written together).
pub async fn a_batch_firing_refused_by_the_history_is_undone_whole<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    // Entity `id` cancelled under its timer's reference, then put back at Created and
    // version 0 by hand, its timer pending again.
    let disagree = async |id: i64| {
        engine.create(id).await.unwrap();
        engine
            .transition(id, UnpaidEvent::Cancel, "timer:Created:0")
            .await
            .unwrap();
        b.exec(&format!(
            "UPDATE orders SET status = 'Created', version = 0 WHERE id = {id}"
        ))
        .await;
        b.exec(&format!(
            "UPDATE orderly_timers SET status = 'PENDING', outcome = NULL, fired_at = NULL WHERE entity_id = {id}"
        ))
        .await;
        make_due(b, id).await;
    };
    let fire_all = async |expect: usize| {
        let mut round = timers.fire_once().await.unwrap();
        while round.claimed > 0 && round.applied + round.replayed < expect {
            let next = timers.fire_once().await.unwrap();
            round.applied += next.applied;
            round.replayed += next.replayed;
            round.claimed = next.claimed;
        }
        (round.applied, round.replayed)
    };
    let as_left = async |id: i64| {
        let e = engine.get(id).await.unwrap();
        assert_eq!(
            (e.state, e.version, engine.history(id).await.unwrap().len()),
            (UnpaidState::Created, 0, 1),
            "entity {id} as the hand left it, its one history row"
        );
        let t = timers_of(&engine, id).await.remove(0);
        assert_eq!(
            (t.status.as_str(), t.outcome.as_deref()),
            ("FIRED", Some("replayed")),
            "{t:?}"
        );
    };
    disagree(2).await;
    assert_eq!(fire_all(1).await, (0, 1), "the timer due alone");
    as_left(2).await;
    for id in [1, 3] {
        engine.create(id).await.unwrap();
        make_due(b, id).await;
    }
    disagree(4).await;
    assert_eq!(fire_all(3).await, (2, 1), "the timer due among others");
    for id in [1, 3] {
        assert_eq!(engine.get(id).await.unwrap().state, UnpaidState::Cancelled);
    }
    as_left(4).await;
}
