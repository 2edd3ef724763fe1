//! What an event carries and what it commits with: bounded bodies published as the
//! message body, the inbox, records and flows' local steps, purge and statistics.

#[allow(unused_imports)]
use super::*;

/// Event bodies are bounded by `EngineConfig::max_event_body` when they are written: a
/// larger one is `InvalidInput` and nothing is written (no state change, no history, no
/// outbox row), along an emitting edge or not; one within it is stored. A body along an
/// edge that emits nothing is ignored: the transition applies, and no outbox row is
/// written.
pub async fn event_bodies_are_bounded_when_written<B: Backend>(b: &B) {
    use crate::conformance::{OrderEvent, OrderState};
    let config = crate::conformance::config(B::POLICY).max_event_body(1000);
    let e = orderly::Engine::<crate::conformance::OrderMachine, _>::with_config(
        b.store(Duration::from_secs(10)).await,
        config,
    )
    .unwrap();
    let too_big = serde_json::json!({ "note": "x".repeat(2000) });
    let fits = serde_json::json!({ "note": "y".repeat(500) });
    for id in [1, 2] {
        e.create(id).await.unwrap();
    }
    // Pay emits OrderPaid; Cancel emits nothing.
    for (id, event) in [(1, OrderEvent::Pay), (2, OrderEvent::Cancel)] {
        let refused = e.transition(id, event, "r-1").event_body(&too_big).await;
        assert!(
            matches!(&refused, Err(Error::InvalidInput(why)) if why.contains("max_event_body")),
            "{refused:?}"
        );
        assert_eq!(e.get(id).await.unwrap().state, OrderState::Created);
    }
    assert_eq!(
        b.scalar("SELECT count(*) FROM orderly_transitions").await,
        0
    );
    assert_eq!(b.scalar("SELECT count(*) FROM orderly_outbox").await, 0);
    let paid = e
        .transition(1, OrderEvent::Pay, "r-1")
        .event_body(&fits)
        .await;
    assert!(paid.is_ok(), "{paid:?}");
    let cancelled = e
        .transition(2, OrderEvent::Cancel, "r-1")
        .event_body(&fits)
        .await;
    assert!(
        cancelled.is_ok(),
        "a body along an edge that emits nothing: {cancelled:?}"
    );
    assert_eq!(e.get(2).await.unwrap().state, OrderState::Cancelled);
    let pending = Outbox::new(b.store(Duration::from_secs(10)).await)
        .pending(10)
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "one row, of the emitting edge");
    assert_eq!(pending[0].entity_id, 1);
    assert_eq!(pending[0].body.as_deref(), Some(fits.to_string().as_str()));
    let bad = orderly::Engine::<crate::conformance::OrderMachine, _>::with_config(
        b.store(Duration::from_secs(10)).await,
        crate::conformance::config(B::POLICY).max_event_body(0),
    );
    assert!(matches!(bad, Err(Error::InvalidInput(_))));
}

/// Purge deletes only published events older than the retention, in batches; pending
/// and dead events stay whatever their age. Stats count pending and dead events and the
/// oldest pending one's age. Bad input is refused.
pub async fn outbox_purge_and_stats<B: Backend>(b: &B) {
    seed(b, 3, 2).await;
    let outbox = Outbox::new(b.store(Duration::from_secs(10)).await);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (6, 0));
    // Entity 1 published long ago, entity 2 just now, entity 3 pending and dead.
    b.exec(
        "UPDATE orderly_outbox SET status = 'PUBLISHED', published_at = 1000 WHERE entity_id = 1",
    )
    .await;
    b.exec(&format!(
        "UPDATE orderly_outbox SET status = 'PUBLISHED', published_at = {} WHERE entity_id = 2",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    ))
    .await;
    b.exec("UPDATE orderly_outbox SET status = 'DEAD' WHERE entity_id = 3 AND version = 1")
        .await;
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (1, 1));
    assert!(stats.oldest_pending < Duration::from_secs(600), "{stats:?}");
    assert!(matches!(
        outbox.purge(Duration::from_secs(3600), 0).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(outbox.purge(Duration::from_secs(3600), 1).await.unwrap(), 1);
    assert_eq!(
        outbox.purge(Duration::from_secs(3600), 10).await.unwrap(),
        1
    );
    assert_eq!(
        outbox.purge(Duration::from_secs(3600), 10).await.unwrap(),
        0
    );
    assert_eq!(b.scalar("SELECT COUNT(*) FROM orderly_outbox").await, 4);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = 1")
            .await,
        0
    );
    assert!(matches!(
        Relay::new(outbox.store().clone(), orderly::outbox::ChannelSink::new().0)
            .with_config(RelayConfig::default()
                .batch(0)
                .lease(Duration::from_secs(1))
                .publish_timeout(Duration::from_secs(1))),
        Err(Error::InvalidInput(m)) if m.contains("batch") && m.contains("lease")
    ));
    assert!(matches!(
        Relay::new(outbox.store().clone(), orderly::outbox::ChannelSink::new().0)
            .with_config(RelayConfig::default()
                .batch(1001)
                .idle(Duration::ZERO)
                .max_backoff(Duration::from_secs(2 * 24 * 3600))),
        Err(Error::InvalidInput(m)) if m.contains("batch") && m.contains("idle") && m.contains("max_backoff")
    ));
}

/// The consumer's inbox: the first receipt of a message id inside the consumer's
/// transaction says "do the work", a redelivery says "skip"; a receipt rolled back with
/// its work is not remembered; bad ids are refused; purge removes old entries only.
pub async fn inbox_dedupes_inside_the_consumers_transaction<B: Backend>(b: &B) {
    let store = b.store(Duration::from_secs(10)).await;
    let inbox = Inbox::new(store.clone(), "warehouse").unwrap();
    assert!(matches!(
        Inbox::new(store.clone(), ""),
        Err(Error::InvalidInput(_))
    ));
    let mut tx = b.begin().await;
    assert!(inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap());
    B::rollback(tx).await;
    let mut tx = b.begin().await;
    assert!(
        inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap(),
        "rolled back, so new"
    );
    assert!(!inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap());
    B::commit(tx).await;
    let mut tx = b.begin().await;
    assert!(
        !inbox.receive(&mut tx, "OrderMachine:1:1").await.unwrap(),
        "a redelivery"
    );
    assert!(matches!(
        inbox.receive(&mut tx, &"m".repeat(256)).await,
        Err(Error::InvalidInput(_))
    ));
    B::commit(tx).await;
    let other = Inbox::new(store, "billing").unwrap();
    let mut tx = b.begin().await;
    assert!(
        other.receive(&mut tx, "OrderMachine:1:1").await.unwrap(),
        "another consumer"
    );
    B::commit(tx).await;
    b.exec("UPDATE orderly_inbox SET received_at = 1000 WHERE consumer = 'billing'")
        .await;
    assert_eq!(inbox.purge(Duration::from_secs(3600), 10).await.unwrap(), 1);
    assert_eq!(b.scalar("SELECT COUNT(*) FROM orderly_inbox").await, 1);
}

/// The event of a transition inside `Records::run`'s work commits with the work and its
/// record, and is absent when the work is rolled back (a failure, an error).
pub async fn events_commit_with_records_run<B: Backend>(b: &B) {
    let e = engine(b).await;
    let r = Records::new(b.store(Duration::from_secs(10)).await)
        .scope(
            "orders",
            orderly::ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let ran = r
        .run(
            "orders",
            "o-1",
            &1,
            place::<B>(e.clone(), runs.clone(), 1, "ok"),
        )
        .await
        .unwrap();
    assert_eq!(ran.outcome, Ok(1));
    let count = |id: i64| {
        format!(
            "SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = {id} AND event = 'OrderPaid'"
        )
    };
    assert_eq!(b.scalar(&count(1)).await, 1);
    let again = r
        .run(
            "orders",
            "o-1",
            &1,
            place::<B>(e.clone(), runs.clone(), 1, "ok"),
        )
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(b.scalar(&count(1)).await, 1, "a replay writes no event");
    for (id, verdict) in [(2, "declined"), (3, "error")] {
        let _ = r
            .run(
                "orders",
                &format!("o-{id}"),
                &id,
                place::<B>(e.clone(), runs.clone(), id, verdict),
            )
            .await;
        assert_eq!(
            b.scalar(&count(id)).await,
            0,
            "{verdict}: rolled back with the work"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A request's own event body is stored in the outbox row of an emitting edge and
/// published as the message's body (without one, the body is the event's fields as
/// JSON); a replay with another body writes nothing; a body too large is refused and
/// nothing is written.
pub async fn event_body_is_published_as_the_message_body<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=3 {
        e.create(id).await.unwrap();
    }
    let body = serde_json::json!({"amount": 4200, "currency": "EUR"});
    let paid = e
        .transition(1, crate::conformance::OrderEvent::Pay, "p-1")
        .event_body(&body)
        .await
        .unwrap();
    assert!(paid.is_applied());
    let replay = e
        .transition(1, crate::conformance::OrderEvent::Pay, "p-1")
        .event_body(&serde_json::json!({"amount": 1}))
        .await
        .unwrap();
    assert!(!replay.is_applied());
    let mut tx = b.begin().await;
    e.transition(2, crate::conformance::OrderEvent::Pay, "p-2")
        .event_body(&serde_json::json!({"amount": 7}))
        .within(&mut tx)
        .await
        .unwrap();
    B::commit(tx).await;
    let huge = "x".repeat(1024 * 1024 + 1);
    let refused = e
        .transition(3, crate::conformance::OrderEvent::Pay, "p-3")
        .event_body(&huge)
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(e.get(3).await.unwrap().version, 0, "nothing written");
    e.transition(3, crate::conformance::OrderEvent::Pay, "p-3")
        .await
        .unwrap();

    let (sink, mut received) = orderly::outbox::ChannelSink::new();
    let relay = Relay::new(b.store(Duration::from_secs(10)).await, sink);
    assert_eq!(relay.relay_once().await.unwrap().published, 3);
    let mut bodies = HashMap::new();
    while let Ok(m) = received.try_recv() {
        bodies.insert(
            m.entity_id,
            serde_json::from_str::<serde_json::Value>(&m.body).unwrap(),
        );
    }
    assert_eq!(bodies[&1], body, "the attached body, not the replay's");
    assert_eq!(bodies[&2], serde_json::json!({"amount": 7}));
    assert_eq!(bodies[&3]["id"], "OrderMachine:3:1");
    assert_eq!(bodies[&3]["event"], "OrderPaid");
    assert_eq!(bodies[&3]["ref_id"], "p-3");
}

orderly::flow! {
    /// A flow of one local step: the payment's transition inside the step's checkpoint
    /// transaction, then (if its input says so) a failure.
    pub PayStepFlow {
        kind: "outbox_pay";
        version: 1;
        steps: PayStepFlowStep {
            Pay: local,
        }
    }
}

/// The event of a transition inside a flow's local step commits with the step's
/// checkpoint, and is absent when the step fails after the transition (its transaction,
/// the transition and the event with it, rolled back); a replayed flow writes no second
/// event.
pub async fn events_commit_with_flow_local_steps<B: Backend>(b: &B) {
    use orderly::flow::FlowOutcome;
    let e = engine(b).await;
    e.create(1).await.unwrap();
    e.create(2).await.unwrap();
    let moved = e.clone();
    let def = orderly::Definition::<B::S, (i64, bool)>::new(PayStepFlow).local(
        PayStepFlowStep::Pay,
        move |conn, ctx| {
            let e = moved.clone();
            Box::pin(async move {
                let (id, fail) = *ctx.input();
                e.transition(id, crate::conformance::OrderEvent::Pay, "p")
                    .within(conn)
                    .await?;
                if fail {
                    return Err(orderly::StepError::fail("declined after the transition"));
                }
                Ok(())
            })
        },
    );
    let f = orderly::Flows::new(
        b.store(Duration::from_secs(10)).await,
        crate::conformance::flows::config(Duration::from_secs(30)),
    )
    .unwrap()
    .register(def)
    .unwrap();
    let done = f.start(PayStepFlow, "ok", &(1, false)).await.unwrap();
    assert!(
        matches!(done.outcome, FlowOutcome::Completed(_)),
        "{:?}",
        done.outcome
    );
    let again = f.start(PayStepFlow, "ok", &(1, false)).await.unwrap();
    assert!(again.replayed);
    let failed = f.start(PayStepFlow, "fail", &(2, true)).await.unwrap();
    assert!(
        matches!(failed.outcome, FlowOutcome::Compensated { .. }),
        "{:?}",
        failed.outcome
    );
    let count = |id: i64| {
        format!(
            "SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = {id} AND event = 'OrderPaid'"
        )
    };
    assert_eq!(
        b.scalar(&count(1)).await,
        1,
        "committed with the step, once"
    );
    assert_eq!(b.scalar(&count(2)).await, 0, "rolled back with the step");
    assert_eq!(e.get(2).await.unwrap().version, 0);
}
