//! Events on the graph's edges, written in the transition's own unit.

use super::*;

/// The outbox rows of `machine` for `id`, as `(version, event, transition, from, to,
/// ref)`, oldest first.
async fn outbox_rows<B: Backend>(b: &B, machine: &str, id: i64) -> Vec<String> {
    let n = b
        .scalar(&format!(
            "SELECT COUNT(*) FROM orderly_outbox WHERE machine = '{machine}' AND entity_id = {id}"
        ))
        .await;
    let mut rows = Vec::new();
    for version in 1..=16 {
        let found = b
            .scalar(&format!(
                "SELECT COUNT(*) FROM orderly_outbox WHERE machine = '{machine}' AND entity_id = {id} \
                 AND version = {version}"
            ))
            .await;
        if found == 1 {
            rows.push(version.to_string());
        }
    }
    assert_eq!(
        rows.len() as i64,
        n,
        "outbox rows of {machine} {id} beyond version 16"
    );
    rows
}

/// An edge that emits an event writes its outbox row in the same unit as the
/// transition: one row per application, keyed by (machine, entity, version after the
/// transition), with the event, the transition, its states and reference. A replay, a
/// refusal and an edge that emits nothing write none; a caller's transaction that rolls
/// back takes the row with it; an event with several source states records the edge
/// that moved (and only the edges that emit write). An outbox row already at the new
/// version is `CorruptState`, never mistaken for a twin request.
pub async fn emitting_edges_write_their_event_with_the_transition<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=4 {
        e.create(id).await.unwrap();
    }
    assert!(e.transition(1, Pay, "p-1").await.unwrap().is_applied());
    assert_eq!(outbox_rows(b, "OrderMachine", 1).await, ["1"]);
    let row = |cond: &str| {
        format!(
            "SELECT COUNT(*) FROM orderly_outbox WHERE machine = 'OrderMachine' AND entity_id = 1 \
             AND version = 1 AND event = 'OrderPaid' AND transition = 'Pay' \
             AND from_status = 'Created' AND to_status = 'Paid' AND ref_id = 'p-1' {cond}"
        )
    };
    assert_eq!(b.scalar(&row("AND status = 'PENDING'")).await, 1);
    // A replay and a refusal write nothing.
    assert!(!e.transition(1, Pay, "p-1").await.unwrap().is_applied());
    assert!(matches!(
        e.transition(1, Pay, "p-2").await,
        Err(Error::RefConflict { .. })
    ));
    assert!(matches!(
        e.transition(1, Deliver, "d-1").await,
        Err(Error::InvalidTransition { .. })
    ));
    assert_eq!(outbox_rows(b, "OrderMachine", 1).await, ["1"]);
    // The next emitting edge, at the next version; an edge that emits nothing writes none.
    e.transition(1, Ship, "s-1").await.unwrap();
    e.transition(1, Deliver, "d-1").await.unwrap();
    assert_eq!(outbox_rows(b, "OrderMachine", 1).await, ["1", "2"]);
    e.transition(2, Cancel, "c-2").await.unwrap();
    assert!(outbox_rows(b, "OrderMachine", 2).await.is_empty());

    // Inside a caller's transaction: rolled back, no row; committed, the row.
    let mut tx = b.begin().await;
    e.transition(3, Pay, "p-3").within(&mut tx).await.unwrap();
    B::rollback(tx).await;
    assert!(outbox_rows(b, "OrderMachine", 3).await.is_empty());
    assert_order(&e, 3, Created, 0, 0).await;
    let mut tx = b.begin().await;
    e.transition(3, Pay, "p-3").within(&mut tx).await.unwrap();
    B::commit(tx).await;
    assert_eq!(outbox_rows(b, "OrderMachine", 3).await, ["1"]);

    // An outbox row already at the version the write would make (the entity's version
    // reused behind orderly's back): `CorruptState`, and nothing is written.
    b.exec(
        "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
         VALUES ('OrderMachine', 4, 1, 'OrderPaid', 'Pay', 'Created', 'Paid', 'old')",
    )
    .await;
    let err = e.transition(4, Pay, "p-4").await.unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 4, .. }),
        "{err:?}"
    );
    assert_order(&e, 4, Created, 0, 0).await;
    // Told so by the first attempt: an engine allowed one attempt says the same.
    let once: Eng<B> = Engine::with_config(
        b.store(Duration::from_secs(10)).await,
        super::config(B::POLICY).max_attempts(1),
    )
    .unwrap();
    // A write applied first, so that a store with a writer of its own has it running.
    e.create(5).await.unwrap();
    assert!(once.transition(5, Pay, "p-5").await.unwrap().is_applied());
    let err = once.transition(4, Pay, "p-4").await.unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 4, .. }),
        "{err:?}"
    );
    assert_order(&e, 4, Created, 0, 0).await;
    let mut tx = b.begin().await;
    let err = e
        .transition(4, Pay, "p-4")
        .within(&mut tx)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 4, .. }),
        "{err:?}"
    );
    B::commit(tx).await;
    assert_order(&e, 4, Created, 0, 0).await;

    // Several source states: the edge that moved emits (or not).
    let t: Engine<TicketMachine, B::S> =
        with_policy(b.store(Duration::from_secs(10)).await, B::POLICY);
    for id in 11..=12 {
        t.create(id).await.unwrap();
    }
    t.transition(11, TicketEvent::Start, "st-1").await.unwrap();
    t.transition(11, TicketEvent::Close, "cl-1").await.unwrap();
    assert_eq!(outbox_rows(b, "TicketMachine", 11).await, ["2"]);
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_outbox WHERE machine = 'TicketMachine' AND entity_id = 11 \
             AND event = 'TicketAbandoned' AND from_status = 'Working' AND to_status = 'Closed'"
        )
        .await,
        1
    );
    t.transition(12, TicketEvent::Close, "cl-2").await.unwrap();
    assert!(outbox_rows(b, "TicketMachine", 12).await.is_empty());
}
