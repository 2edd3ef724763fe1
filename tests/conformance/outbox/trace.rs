//! The trace context of a request rides with its event: stored in the outbox row by the
//! statement that moves the entity, on every write path, and sent with the message.

use orderly::TraceContext;
use orderly::outbox::ChannelSink;
use orderly::store::{FirstWrite, Key, Request, Txn, Written};

use super::*;
use crate::conformance::OrderEvent::Pay;

/// A context whose trace id and parent id both end in `n`.
fn context(n: u8) -> TraceContext {
    TraceContext::new(
        &format!("4bf92f3577b34da6a3ce929d0e0e47{n:02x}"),
        &format!("00f067aa0ba902{n:02x}"),
        true,
    )
    .unwrap()
    .with_tracestate(&format!("vendor=v{n}"))
    .unwrap()
}

/// A request to pay `order_id` carrying `trace`, as the engine hands it to the store.
fn unit_request(order_id: i64, trace: &TraceContext) -> Request<'_> {
    Request {
        key: Key {
            order_id,
            event: "Pay",
            ref_id: "unit",
        },
        from_states: &["Created"],
        to_states: &["Paid"],
        payload_hash: None,
        payload: None,
        write_id: order_id,
        audit: Default::default(),
        emits: &[Some("OrderPaid")],
        machine: "OrderMachine",
        event_body: None,
        trace: Some(trace),
    }
}

/// A request's trace context is stored with its event and published with it, on every
/// way a transition writes: the engine's own connection, a caller's transaction, the
/// store's apply-first unit of several requests (each row its own request's context) and
/// the write after a read. A transition without one publishes none. A stored
/// `traceparent` that does not read is left off the message, which is published all the
/// same, never set aside.
pub async fn trace_context_is_stored_with_the_event_and_published<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=8 {
        e.create(id).await.unwrap();
    }
    // The engine's own connection; a caller's transaction; no context at all.
    e.transition(1, Pay, "p-1")
        .trace_context(context(1))
        .await
        .unwrap();
    let mut tx = b.begin().await;
    e.transition(2, Pay, "p-2")
        .trace_context(context(2))
        .within(&mut tx)
        .await
        .unwrap();
    B::commit(tx).await;
    e.transition(3, Pay, "p-3").await.unwrap();
    // A replay carries another context: the event keeps the first.
    let replay = e
        .transition(1, Pay, "p-1")
        .trace_context(context(9))
        .await
        .unwrap();
    assert!(!replay.is_applied());
    // The store's apply-first unit of three requests, each with its own context.
    let contexts = [context(4), context(5), context(6)];
    let store = e.store();
    let mut conn = store.acquire().await.unwrap();
    let unit: Vec<Request<'_>> = (4..=6)
        .zip(&contexts)
        .map(|(id, trace)| unit_request(id, trace))
        .collect();
    let written = store.apply_first(&mut conn, &unit).await.unwrap();
    assert!(
        written
            .iter()
            .all(|w| matches!(w, FirstWrite::Applied { .. })),
        "{written:?}"
    );
    // The write after a read, along an emitting edge.
    let seven = context(7);
    let after_read = unit_request(7, &seven);
    let apply = after_read.apply("Created", "Paid", 0, Some("OrderPaid"));
    assert_eq!(
        store.apply(&mut conn, &apply, Txn::Own).await.unwrap(),
        Written::Applied
    );
    drop(conn);
    // A stored traceparent that does not read.
    e.transition(8, Pay, "p-8")
        .trace_context(context(8))
        .await
        .unwrap();
    b.exec(
        "UPDATE orderly_outbox SET traceparent = 'not-a-traceparent', tracestate = 'a=b' \
         WHERE entity_id = 8",
    )
    .await;

    let (sink, mut received) = ChannelSink::new();
    let relay = Relay::new(b.store(Duration::from_secs(10)).await, sink);
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.published, round.dead), (8, 0), "{round:?}");
    let mut traces = HashMap::new();
    while let Ok(m) = received.try_recv() {
        let header = |name: &str| {
            m.headers()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v)
        };
        assert_eq!(
            (header("traceparent"), header("tracestate")),
            (
                m.trace.as_ref().map(|t| t.traceparent().to_string()),
                m.trace
                    .as_ref()
                    .and_then(|t| t.tracestate())
                    .map(str::to_string)
            ),
            "the headers carry the message's context"
        );
        traces.insert(m.entity_id, m.trace);
    }
    let want: HashMap<i64, Option<TraceContext>> = [
        (1, Some(context(1))),
        (2, Some(context(2))),
        (3, None),
        (4, Some(context(4))),
        (5, Some(context(5))),
        (6, Some(context(6))),
        (7, Some(context(7))),
        (8, None),
    ]
    .into_iter()
    .collect();
    assert_eq!(traces, want);
    assert_eq!(
        Outbox::new(b.store(Duration::from_secs(10)).await)
            .stats()
            .await
            .unwrap()
            .dead,
        0
    );
}
