//! Flows that run: each step once, compensations in reverse and retried, concurrent and
//! coalesced starts, a payment callback delivered three times.

use super::*;

/// The happy path: every step runs once, local effects commit with their step rows,
/// keyed calls carry `"{flow_key}:{step}"`; a second start with the same input replays
/// the recorded outputs without running anything; another input under the key is a
/// mismatch; the record and its steps read back.
pub async fn flow_runs_each_step_once<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    let started = f.start(Shop, "o-1", &order(1)).await.unwrap();
    assert!(!started.replayed);
    let FlowOutcome::Completed(outputs) = started.outcome else {
        panic!("expected completion, got {started:?}");
    };
    assert_eq!(
        outputs.get::<String>(ShopStep::Insert).unwrap(),
        "Insert of 1"
    );
    assert_eq!(
        outputs.get::<String>(ShopStep::Charge).unwrap(),
        "shop:o-1:Charge for 100"
    );
    for what in ["Insert", "Coupon"] {
        assert_eq!(effects(b, "o-1", what).await, 1, "{what}");
    }
    assert_eq!(
        world.calls_in_order(),
        ["shop:o-1:Reserve", "shop:o-1:Charge", "shop:o-1:Ship"]
    );
    assert_eq!(
        step_rows(&f, "shop", "o-1").await,
        rows(&[
            ("Insert", "F", "SUCCEEDED", 1),
            ("Reserve", "F", "SUCCEEDED", 1),
            ("Coupon", "F", "SUCCEEDED", 1),
            ("Charge", "F", "SUCCEEDED", 1),
            ("Ship", "F", "SUCCEEDED", 1),
        ])
    );
    let view = f.get("shop", "o-1").await.unwrap().unwrap();
    assert_eq!(view.flow.status, "COMPLETED");
    assert!(view.known);
    assert_eq!(
        view.steps[1].downstream_key.as_deref(),
        Some("shop:o-1:Reserve")
    );
    assert!(
        view.steps
            .iter()
            .all(|s| s.finished_at >= Some(s.started_at))
    );

    let again = f.start(Shop, "o-1", &order(1)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.outcome, FlowOutcome::Completed(outputs));
    assert_eq!(world.calls_in_order().len(), 3);
    assert_eq!(effects(b, "o-1", "Insert").await, 1);
    assert!(matches!(
        f.start(Shop, "o-1", &order(2)).await,
        Err(Error::PayloadMismatch { .. })
    ));
    assert!(f.get("shop", "o-404").await.unwrap().is_none());
}

/// A step failing for good at position k compensates the completed steps k-1 … 1 in
/// reverse order, each recorded with its own key; the flow answers `Compensated` with
/// the failed step and its error, replayed to a later start.
pub async fn flow_failure_compensates_in_reverse<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Charge", Plan::Fail);
    let started = f.start(Shop, "o-2", &order(2)).await.unwrap();
    let compensated = FlowOutcome::Compensated {
        step: "Charge".into(),
        error: "Charge refused".into(),
    };
    assert_eq!(started.outcome, compensated);
    assert_eq!(
        world.calls_in_order(),
        ["shop:o-2:Reserve", "shop:o-2:Reserve:undo"],
        "the failed charge was never called; its undo neither"
    );
    for (what, n) in [
        ("Insert", 1),
        ("Coupon", 1),
        ("Coupon:undo", 1),
        ("Insert:undo", 1),
    ] {
        assert_eq!(effects(b, "o-2", what).await, n, "{what}");
    }
    assert_eq!(
        step_rows(&f, "shop", "o-2").await,
        rows(&[
            ("Insert", "F", "SUCCEEDED", 1),
            ("Insert", "C", "SUCCEEDED", 1),
            ("Reserve", "F", "SUCCEEDED", 1),
            ("Reserve", "C", "SUCCEEDED", 1),
            ("Coupon", "F", "SUCCEEDED", 1),
            ("Coupon", "C", "SUCCEEDED", 1),
            ("Charge", "F", "FAILED", 1),
        ])
    );
    // The compensations ran in reverse: Coupon's before Reserve's before Insert's.
    let view = f.get("shop", "o-2").await.unwrap().unwrap();
    let undone: HashMap<_, _> = view
        .steps
        .iter()
        .filter(|s| s.phase == "C")
        .map(|s| (s.name.as_str(), s.finished_at.unwrap()))
        .collect();
    assert!(undone["Coupon"] <= undone["Reserve"] && undone["Reserve"] <= undone["Insert"]);
    assert_eq!(view.flow.status, "COMPENSATED");

    world.clear_plans();
    let again = f.start(Shop, "o-2", &order(2)).await.unwrap();
    assert_eq!((again.outcome, again.replayed), (compensated, true));
    assert_eq!(world.calls_in_order().len(), 2);

    // A local step failing for good rolls its own writes back and compensates the
    // steps before it.
    world.plan("Coupon", Plan::Fail);
    let started = f.start(Shop, "o-3", &order(3)).await.unwrap();
    assert!(
        matches!(started.outcome, FlowOutcome::Compensated { ref step, .. } if step == "Coupon")
    );
    assert_eq!(effects(b, "o-3", "Coupon").await, 0);
    assert_eq!(effects(b, "o-3", "Insert:undo").await, 1);
    assert_eq!(world.calls()["shop:o-3:Reserve:undo"], 1);
}

/// A compensation asking to be retried twice waits (with backoff) for the recovery job
/// each time, then succeeds; the flow is compensated, each compensation once.
pub async fn flow_compensation_is_retried<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_secs(30);
    let f = flows(b, &world, lease).await;
    world.plan("Charge", Plan::Fail);
    world.plan("Reserve:undo", Plan::Retry(2));
    let started = f.start(Shop, "o-4", &order(4)).await.unwrap();
    assert!(
        matches!(started.outcome, FlowOutcome::Waiting { ref step, .. } if step == "Reserve"),
        "{started:?}"
    );
    // Waiting is not in flight forever: it is due after its backoff.
    let mut rounds = 0;
    let outcome = loop {
        rounds += 1;
        assert!(rounds < 20, "never compensated");
        tokio::time::sleep(Duration::from_millis(30)).await;
        let round = f.recover(10).await.unwrap();
        if round.compensated == 1 {
            break round;
        }
        assert_eq!((round.taken, round.waiting), (1, 1), "{round:?}");
    };
    assert_eq!(outcome.taken, 1);
    assert_eq!(
        rounds, 2,
        "retried twice: once by the start, once by a round"
    );
    assert_eq!(world.calls()["shop:o-4:Reserve:undo"], 1);
    assert_eq!(effects(b, "o-4", "Insert:undo").await, 1);
    let rows = step_rows(&f, "shop", "o-4").await;
    // Three attempts begun (two asked to be retried), one call made.
    assert!(
        rows.contains(&("Reserve".into(), "C".into(), "SUCCEEDED".into(), 3)),
        "{rows:?}"
    );
    assert_eq!(
        f.get("shop", "o-4").await.unwrap().unwrap().flow.status,
        "COMPENSATED"
    );
}

/// A compensation that keeps failing is given up after the attempt cap; the other
/// compensations still run; the flow parks as `CompensationFailed`, listed as parked;
/// the operator's resume runs the given-up compensation again and the flow is
/// compensated.
pub async fn flow_failing_compensation_parks_until_resumed<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Charge", Plan::Fail);
    world.plan("Coupon:undo", Plan::RetryForever);
    let started = f.start(Shop, "o-5", &order(5)).await.unwrap();
    assert!(matches!(started.outcome, FlowOutcome::Waiting { .. }));
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        f.recover(10).await.unwrap();
        if !f.list(Listing::Parked, None, 10).await.unwrap().is_empty() {
            break;
        }
    }
    let parked = f.list(Listing::Parked, None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        parked[0].flow.park_reason.as_deref(),
        Some("COMPENSATION_FAILED")
    );
    // The others ran, after the given-up one.
    assert_eq!(world.calls()["shop:o-5:Reserve:undo"], 1);
    assert_eq!(effects(b, "o-5", "Insert:undo").await, 1);
    assert_eq!(effects(b, "o-5", "Coupon:undo").await, 0);
    let rows = step_rows(&f, "shop", "o-5").await;
    assert!(
        rows.contains(&("Coupon".into(), "C".into(), "FAILED".into(), 4)),
        "{rows:?}"
    );
    // A start answers the parked outcome, and no round takes it.
    let again = f.start(Shop, "o-5", &order(5)).await.unwrap();
    assert_eq!(
        again.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::CompensationFailed,
            step: "Charge".into()
        }
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(f.recover(10).await.unwrap().taken, 0);

    world.clear_plans();
    let resumed = f.resume("shop", "o-5", Resume::Retry).await.unwrap();
    assert!(matches!(resumed, FlowOutcome::Compensated { ref step, .. } if step == "Charge"));
    assert_eq!(effects(b, "o-5", "Coupon:undo").await, 1);
    assert_eq!(effects(b, "o-5", "Insert:undo").await, 1);
    assert_eq!(world.calls()["shop:o-5:Reserve:undo"], 1);
    assert!(matches!(
        f.resume("shop", "o-5", Resume::Retry).await,
        Err(Error::InvalidInput(_))
    ));
}

/// 32 concurrent starts of one flow: one runs it; the others are told it is in flight
/// or, once it completed, replayed. Every step ran once.
pub async fn flow_concurrent_starts_run_once<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            f.start(Shop, "o-6", &order(6)).await
        }));
    }
    let (mut ran, mut replayed, mut in_flight) = (0, 0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(s) if s.replayed => replayed += 1,
            Ok(s) => {
                assert!(matches!(s.outcome, FlowOutcome::Completed(_)));
                ran += 1;
            }
            Err(Error::InFlight { .. }) => in_flight += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(ran + replayed + in_flight, 32);
    assert!(
        in_flight > 0,
        "no start overlapped the running one: the race did not happen"
    );
    assert_eq!(effects(b, "o-6", "Insert").await, 1);
    assert_eq!(effects(b, "o-6", "Coupon").await, 1);
    let calls = world.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.values().all(|&n| n == 1), "{calls:?}");
}

orderly::flow! {
    /// The payment gateway's callback: mark the payment succeeded, move the order to
    /// Paid, create the shipping task.
    pub PaymentCallback {
        kind: "payment_callback";
        version: 1;
        steps: CallbackStep {
            MarkPayment:  local,
            MoveOrder:    local,
            ShippingTask: local,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Callback {
    pub order_id: i64,
    pub payment_id: String,
}

/// The payment callback delivered three times at once (and once more later): one
/// payment marked, the order moved to Paid once, one shipping task.
pub async fn flow_payment_callback_delivered_three_times<B: Backend>(b: &B) {
    let e = super::super::engine(b).await;
    e.create(42).await.unwrap();
    b.exec("CREATE TABLE payments (payment_id VARCHAR(64) NOT NULL, order_id BIGINT NOT NULL, status VARCHAR(16) NOT NULL)")
        .await;
    b.exec("CREATE TABLE shipping_tasks (order_id BIGINT NOT NULL)")
        .await;
    let moved = e.clone();
    let def = Definition::<B::S, Callback>::new(PaymentCallback)
        .local(CallbackStep::MarkPayment, |conn, ctx| {
            Box::pin(async move {
                let c = ctx.input();
                let sql = format!(
                    "INSERT INTO payments (payment_id, order_id, status) VALUES ('{}', {}, 'SUCCEEDED')",
                    c.payment_id, c.order_id
                );
                B::exec_conn(conn, sql).await?;
                Ok(())
            })
        })
        .local(CallbackStep::MoveOrder, move |conn, ctx| {
            let e = moved.clone();
            Box::pin(async move {
                let c = ctx.input();
                let outcome = e
                    .transition(c.order_id, super::super::OrderEvent::Pay, &c.payment_id)
                    .within(conn)
                    .await?;
                Ok(format!("{outcome:?}"))
            })
        })
        .local(CallbackStep::ShippingTask, |conn, ctx| {
            Box::pin(async move {
                let sql = format!("INSERT INTO shipping_tasks (order_id) VALUES ({})", ctx.input().order_id);
                B::exec_conn(conn, sql).await?;
                Ok(())
            })
        });
    let f = Flows::new(
        b.store(Duration::from_secs(10)).await,
        config(Duration::from_secs(30)),
    )
    .unwrap()
    .register(def)
    .unwrap();
    let callback = Callback {
        order_id: 42,
        payment_id: "pay_1".into(),
    };
    let deliveries: Vec<_> = (0..3)
        .map(|_| {
            let (f, callback) = (f.clone(), callback.clone());
            tokio::spawn(async move { f.start(PaymentCallback, "pay_1", &callback).await })
        })
        .collect();
    let mut ran = 0;
    for delivery in deliveries {
        match delivery.await.unwrap() {
            Ok(s) if !s.replayed => {
                assert!(matches!(s.outcome, FlowOutcome::Completed(_)));
                ran += 1;
            }
            Ok(_) | Err(Error::InFlight { .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ran, 1);
    let later = f.start(PaymentCallback, "pay_1", &callback).await.unwrap();
    assert!(later.replayed);
    assert_eq!(b.scalar("SELECT COUNT(*) FROM payments").await, 1);
    assert_eq!(b.scalar("SELECT COUNT(*) FROM shipping_tasks").await, 1);
    let order = e.get(42).await.unwrap();
    assert_eq!(
        (order.state, order.version),
        (super::super::OrderState::Paid, 1)
    );
}

/// Concurrent starts go together in one statement while another is in flight (on a
/// store that batches starts), and each is answered as if it had gone alone: every new
/// flow runs once to completion under its own start, and of four twins of one new flow
/// one runs it and the others are told it is in flight or replayed. Rounds run until
/// batches were seen (bounded); a store that does not batch starts shows none.
pub async fn flow_coalesced_starts_each_run_once<B: Backend>(b: &B) {
    use orderly::flow::FlowStore;
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    let mut round = 0;
    loop {
        round += 1;
        let mut keys: Vec<String> = (0..16).map(|i| format!("c{round}-{i}")).collect();
        keys.extend((0..4).map(|_| format!("c{round}-twin")));
        let barrier = Arc::new(tokio::sync::Barrier::new(keys.len()));
        let tasks: Vec<_> = keys
            .iter()
            .cloned()
            .map(|key| {
                let (f, barrier) = (f.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let answer = f.start(Shop, &key, &order(7)).await;
                    (key, answer)
                })
            })
            .collect();
        let mut twins_ran = 0;
        for task in tasks {
            let (key, answer) = task.await.unwrap();
            match answer {
                Ok(s) if !s.replayed => {
                    assert!(
                        matches!(s.outcome, FlowOutcome::Completed(_)),
                        "{key}: {:?}",
                        s.outcome
                    );
                    if key.ends_with("twin") {
                        twins_ran += 1;
                    }
                }
                Ok(s) if key.ends_with("twin") => {
                    assert!(matches!(s.outcome, FlowOutcome::Completed(_)))
                }
                Err(Error::InFlight { .. }) if key.ends_with("twin") => {}
                other => panic!("{key}: {other:?}"),
            }
        }
        assert_eq!(twins_ran, 1, "twins of one flow: exactly one runs it");
        for key in keys.iter().take(16).chain([&format!("c{round}-twin")]) {
            assert_eq!(effects(b, key, "Insert").await, 1, "{key}");
            assert_eq!(effects(b, key, "Coupon").await, 1, "{key}");
        }
        let seen = f.coalesced_starts();
        if !B::S::BATCHES_STARTS {
            assert_eq!(
                seen.batches, 0,
                "a store that does not batch starts batched"
            );
            break;
        }
        if seen.batches > 0 {
            assert!(seen.claims >= 2 * seen.batches);
            break;
        }
        assert!(
            round < 20,
            "no starts were ever coalesced: the test shows nothing"
        );
    }
}
