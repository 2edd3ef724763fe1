//! Flows parked for a person: an unsafe call, the attempt cap, a failure past the pivot,
//! outputs that cannot be recorded, long errors, corrupt park reasons and counters.

use super::*;

/// An unsafe step whose runner died after it started is never run again by itself: the
/// flow parks as `NeedsReconciliation`. The operator's resume says what happened:
/// `Applied` records the step and the flow goes on; `Compensate` undoes the steps
/// before it; `Retry` runs it again. An unsafe step asking to be retried parks too.
pub async fn flow_unsafe_step_parks_for_reconciliation<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(300);
    let f = flows(b, &world, lease).await;
    for (key, how) in [
        (
            "u-applied",
            Resume::Applied(serde_json::json!("posted by hand")),
        ),
        ("u-undo", Resume::Compensate),
        ("u-retry", Resume::Retry),
    ] {
        world.panic_at("Post:after");
        let f2 = f.clone();
        let started = tokio::spawn(async move { f2.start(Legacy, key, &order(9)).await });
        assert!(started.await.is_err());
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let round = f.recover(10).await.unwrap();
        assert_eq!((round.taken, round.parked), (1, 1), "{key}");
        assert_eq!(
            world.calls()[&format!("legacy:{key}:Post")],
            1,
            "not called again"
        );
        let parked = f.get("legacy", key).await.unwrap().unwrap();
        assert_eq!(
            parked.flow.park_reason.as_deref(),
            Some("NEEDS_RECONCILIATION")
        );
        let resumed = f.resume("legacy", key, how.clone()).await.unwrap();
        match how {
            Resume::Applied(_) => {
                let FlowOutcome::Completed(out) = resumed else {
                    panic!("{resumed:?}")
                };
                assert_eq!(
                    out.get::<String>(LegacyStep::Post).unwrap(),
                    "posted by hand"
                );
                assert_eq!(world.calls()[&format!("legacy:{key}:Post")], 1);
                assert_eq!(effects(b, key, "Finish").await, 1);
            }
            Resume::Compensate => {
                assert!(
                    matches!(resumed, FlowOutcome::Compensated { ref step, .. } if step == "Post")
                );
                assert_eq!(effects(b, key, "Prepare:undo").await, 1);
                assert!(
                    !world
                        .calls()
                        .contains_key(&format!("legacy:{key}:Post:undo"))
                );
            }
            Resume::Retry => {
                assert!(matches!(resumed, FlowOutcome::Completed(_)));
                assert_eq!(world.calls()[&format!("legacy:{key}:Post")], 2);
            }
        }
        assert_eq!(effects(b, key, "Prepare").await, 1);
    }
    world.plan("Post", Plan::Retry(1));
    let started = f.start(Legacy, "u-timeout", &order(10)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::NeedsReconciliation,
            step: "Post".into()
        }
    );
}

/// A step that crashes its runner every time does not loop forever: after the attempt
/// cap the flow parks as `AttemptsExhausted`, listed as parked; once fixed, the
/// operator's resume completes it.
pub async fn flow_attempt_cap_parks_a_crashing_step<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(300);
    let f = flows(b, &world, lease).await;
    let crash = || {
        world.panic_at("Coupon:after");
    };
    crash();
    let f2 = f.clone();
    assert!(
        tokio::spawn(async move { f2.start(Shop, "cap", &order(11)).await })
            .await
            .is_err()
    );
    let mut rounds = 0;
    while f.list(Listing::Parked, None, 10).await.unwrap().is_empty() {
        rounds += 1;
        assert!(rounds <= 6, "never parked");
        crash();
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let round = f.recover(10).await.unwrap();
        assert_eq!(round.taken, 1);
    }
    // Claimed by the start, then by `attempts` - 1 crashing rounds, then parked.
    assert_eq!(rounds, 4);
    let parked = f.list(Listing::Parked, None, 10).await.unwrap();
    assert_eq!(
        parked[0].flow.park_reason.as_deref(),
        Some("ATTEMPTS_EXHAUSTED")
    );
    assert_eq!(parked[0].flow.step_at, 2);
    assert_eq!(effects(b, "cap", "Coupon").await, 0);
    world.panics.lock().unwrap().clear();
    let resumed = f.resume("shop", "cap", Resume::Retry).await.unwrap();
    assert!(matches!(resumed, FlowOutcome::Completed(_)));
    assert_eq!(effects(b, "cap", "Coupon").await, 1);
    assert_eq!(effects(b, "cap", "Insert").await, 1);
    assert_eq!(world.calls()["shop:cap:Reserve"], 1);
}

/// A step failing for good at or after the pivot parks the flow as `FailedPastPivot`
/// (nothing before the pivot is compensated, and the operator cannot ask for it); of two
/// operators resuming it at once, one resumes it and the other is refused.
pub async fn flow_failure_past_the_pivot_parks<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Ship", Plan::Fail);
    let started = f.start(Shop, "pivot", &order(30)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::FailedPastPivot,
            step: "Ship".into()
        }
    );
    let rows = step_rows(&f, "shop", "pivot").await;
    assert!(
        rows.contains(&("Ship".into(), "F".into(), "FAILED".into(), 1)),
        "{rows:?}"
    );
    assert!(
        rows.iter().all(|r| r.1 == "F"),
        "nothing compensated: {rows:?}"
    );
    assert!(matches!(
        f.resume("shop", "pivot", Resume::Compensate).await,
        Err(Error::InvalidInput(m)) if m.contains("pivot")
    ));
    world.clear_plans();
    let resumes: Vec<_> = (0..2)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move { f.resume("shop", "pivot", Resume::Retry).await })
        })
        .collect();
    let mut answers = Vec::new();
    for r in resumes {
        answers.push(r.await.unwrap());
    }
    let resumed = answers
        .iter()
        .filter(|a| matches!(a, Ok(FlowOutcome::Completed(_))))
        .count();
    let refused = answers
        .iter()
        .filter(|a| matches!(a, Err(Error::InvalidInput(_))))
        .count();
    assert_eq!((resumed, refused), (1, 1), "{answers:?}");
    assert_eq!(world.calls()["shop:pivot:Ship"], 1);
    assert_eq!(effects(b, "pivot", "Insert").await, 1);
    assert_eq!(effects(b, "pivot", "Insert:undo").await, 0);
}

/// A gateway's receipt that cannot be recorded while `broken` is set: its `Serialize`
/// fails (as a map with non-string keys, or a hand-written `Serialize`, does).
pub struct Receipt {
    key: String,
    broken: bool,
}

impl serde::Serialize for Receipt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.broken {
            return Err(serde::ser::Error::custom(
                "the receipt's amount is not a number",
            ));
        }
        s.serialize_str(&self.key)
    }
}

/// A downstream call that is made (with the context's key) and answers a [`Receipt`],
/// unrecordable while `broken` holds.
fn receipt_call(
    world: &Arc<World>,
    broken: &Arc<AtomicBool>,
) -> impl for<'c> Fn(&'c Ctx<Order>) -> orderly::idempotency::Work<'c, Result<Receipt, StepError>>
+ Send
+ Sync
+ 'static {
    let (world, broken) = (world.clone(), broken.clone());
    move |ctx| {
        let (world, broken) = (world.clone(), broken.clone());
        Box::pin(async move {
            world.call(ctx.key());
            Ok(Receipt {
                key: ctx.key().to_string(),
                broken: broken.load(Ordering::SeqCst),
            })
        })
    }
}

/// A keyed call that charged the card, and an unsafe call that posted, each answering an
/// output that cannot be recorded: neither is a failure of the step, and neither flow is
/// compensated around it. The keyed one is retried with its one key, with backoff, one
/// call per claim, until the attempt cap parks it `AttemptsExhausted` (nothing undone);
/// once fixed, the operator's retry calls it again with the same key and it completes.
/// The unsafe one, called once, parks `NeedsReconciliation` at once, its step left
/// started, and the operator records what it did.
pub async fn flow_unrecordable_call_output_is_never_compensated<B: Backend>(b: &B) {
    use LegacyStep::*;
    use ShopStep::*;
    let world = Arc::new(World::default());
    let broken = Arc::new(AtomicBool::new(true));
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    let shop = Definition::<B::S, Order>::new(Shop)
        .local(Insert, local_action::<B>(&world, "Insert"))
        .undo_local(Insert, local_action::<B>(&world, "Insert:undo"))
        .call(Reserve, call_action(&world, "Reserve"))
        .undo_call(Reserve, call_action(&world, "Reserve:undo"))
        .local(Coupon, local_action::<B>(&world, "Coupon"))
        .undo_local(Coupon, local_action::<B>(&world, "Coupon:undo"))
        .call(Charge, receipt_call(&world, &broken))
        .undo_call(Charge, call_action(&world, "Charge:undo"))
        .call(Ship, call_action(&world, "Ship"));
    let legacy = Definition::<B::S, Order>::new(Legacy)
        .local(Prepare, local_action::<B>(&world, "Prepare"))
        .undo_local(Prepare, local_action::<B>(&world, "Prepare:undo"))
        .call(Post, receipt_call(&world, &broken))
        .undo_call(Post, call_action(&world, "Post:undo"))
        .local(Finish, local_action::<B>(&world, "Finish"));
    let cfg = config(Duration::from_secs(30));
    let f = Flows::new(b.store(Duration::from_secs(10)).await, cfg)
        .unwrap()
        .read_first(B::POLICY)
        .register(shop)
        .unwrap()
        .register(legacy)
        .unwrap();

    // Keyed: retried with its key until the cap, never compensated.
    let started = f.start(Shop, "charged", &order(50)).await.unwrap();
    assert!(
        matches!(&started.outcome, FlowOutcome::Waiting { step, error, .. }
            if step == "Charge" && error.contains("serialize")),
        "{started:?}"
    );
    for _ in 0..20 {
        if !f.list(Listing::Parked, None, 10).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let round = f.recover(10).await.unwrap();
        assert_eq!((round.compensated, round.errors), (0, 0), "{round:?}");
    }
    let view = f.get("shop", "charged").await.unwrap().unwrap();
    assert_eq!(
        (view.flow.status.as_str(), view.flow.park_reason.as_deref()),
        ("RUNNING", Some("ATTEMPTS_EXHAUSTED"))
    );
    assert!(
        view.steps.iter().all(|s| s.phase == "F"),
        "nothing undone: {:?}",
        view.steps
    );
    let charge = view.steps.iter().find(|s| s.name == "Charge").unwrap();
    assert_eq!(charge.status, "RETRY");
    assert_eq!(
        charge.downstream_key.as_deref(),
        Some("shop:charged:Charge")
    );
    let calls = world.calls();
    assert_eq!(
        calls["shop:charged:Charge"], cfg.attempts as usize,
        "one call per claim, all with the one key: {calls:?}"
    );
    assert_eq!(calls.len(), 2, "no undo called: {calls:?}");
    assert_eq!(effects(b, "charged", "Insert:undo").await, 0);
    assert_eq!(effects(b, "charged", "Coupon:undo").await, 0);
    broken.store(false, Ordering::SeqCst);
    let resumed = f.resume("shop", "charged", Resume::Retry).await.unwrap();
    let FlowOutcome::Completed(outputs) = resumed else {
        panic!("{resumed:?}");
    };
    assert_eq!(
        outputs.get::<String>(Charge).unwrap(),
        "shop:charged:Charge"
    );
    assert_eq!(
        world.calls()["shop:charged:Charge"],
        cfg.attempts as usize + 1
    );

    // Unsafe: called once, parked for a person, never compensated.
    broken.store(true, Ordering::SeqCst);
    let started = f.start(Legacy, "posted", &order(51)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::NeedsReconciliation,
            step: "Post".into()
        }
    );
    assert_eq!(world.calls()["legacy:posted:Post"], 1);
    assert_eq!(effects(b, "posted", "Prepare:undo").await, 0);
    let rows = step_rows(&f, "legacy", "posted").await;
    assert!(
        rows.contains(&("Post".into(), "F".into(), "STARTED".into(), 1)),
        "{rows:?}"
    );
    let resumed = f
        .resume(
            "legacy",
            "posted",
            Resume::Applied(serde_json::json!("posted")),
        )
        .await
        .unwrap();
    assert!(matches!(resumed, FlowOutcome::Completed(_)), "{resumed:?}");
    assert_eq!(world.calls()["legacy:posted:Post"], 1);
    assert_eq!(effects(b, "posted", "Finish").await, 1);
    assert_eq!(effects(b, "posted", "Prepare:undo").await, 0);
}

/// A downstream call (made with the context's key) that answers with `body` as its
/// error: refused for flow `refused`, timed out at the first attempt for `timed-out`.
fn long_error_call(
    world: &Arc<World>,
    body: &Arc<String>,
) -> impl for<'c> Fn(&'c Ctx<Order>) -> orderly::idempotency::Work<'c, Result<String, StepError>>
+ Send
+ Sync
+ 'static {
    let (world, body) = (world.clone(), body.clone());
    move |ctx| {
        let (world, body) = (world.clone(), body.clone());
        Box::pin(async move {
            world.call(ctx.key());
            match (ctx.flow_key(), ctx.attempt()) {
                ("refused", _) => Err(StepError::fail(&*body)),
                ("timed-out", 1) => Err(StepError::retry(&*body)),
                _ => Ok(ctx.key().to_string()),
            }
        })
    }
}

/// A step refusing with a 100 KiB error (a gateway's long error body) is recorded on
/// every backend (MariaDB's `TEXT` holds 64 KiB): the error is stored cut to
/// [`MAX_ERROR_BYTES`] on a character boundary, with a marker saying how long it was, so
/// the refusal lands at once: the refused call is made once and the flow is compensated
/// as for any refusal. The answer, its replay, the step row and the flow record carry the
/// same cut text; a long error asking for a retry waits as any retry does.
pub async fn flow_long_step_error_is_stored_cut_with_a_marker<B: Backend>(b: &B) {
    use ShopStep::*;
    let world = Arc::new(World::default());
    // Three-byte characters: the cut falls inside one unless it keeps to their boundaries.
    let body = Arc::new("€".repeat(100 * 1024 / 3 + 1));
    let marker = format!("… [truncated, {} bytes]", body.len());
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    let shop = Definition::<B::S, Order>::new(Shop)
        .local(Insert, local_action::<B>(&world, "Insert"))
        .undo_local(Insert, local_action::<B>(&world, "Insert:undo"))
        .call(Reserve, call_action(&world, "Reserve"))
        .undo_call(Reserve, call_action(&world, "Reserve:undo"))
        .local(Coupon, local_action::<B>(&world, "Coupon"))
        .undo_local(Coupon, local_action::<B>(&world, "Coupon:undo"))
        .call(Charge, long_error_call(&world, &body))
        .undo_call(Charge, call_action(&world, "Charge:undo"))
        .call(Ship, call_action(&world, "Ship"));
    let f = Flows::new(
        b.store(Duration::from_secs(10)).await,
        config(Duration::from_secs(30)),
    )
    .unwrap()
    .read_first(B::POLICY)
    .register(shop)
    .unwrap();
    let cut = |error: &str| {
        error.len() <= MAX_ERROR_BYTES
            && error.len() + 3 > MAX_ERROR_BYTES
            && error
                .strip_suffix(&marker)
                .is_some_and(|kept| !kept.is_empty() && body.starts_with(kept))
    };

    let started = f.start(Shop, "refused", &order(60)).await.unwrap();
    let FlowOutcome::Compensated { step, error } = &started.outcome else {
        panic!("expected compensation, got a {:?}", started.outcome);
    };
    assert_eq!(step, "Charge");
    assert!(cut(error), "not cut with its marker: {} bytes", error.len());
    let calls = world.calls();
    assert_eq!(calls["shop:refused:Charge"], 1, "{calls:?}");
    assert_eq!(calls["shop:refused:Reserve:undo"], 1, "{calls:?}");
    assert_eq!(effects(b, "refused", "Insert:undo").await, 1);
    let view = f.get("shop", "refused").await.unwrap().unwrap();
    assert_eq!(view.flow.status, "COMPENSATED");
    assert_eq!(view.flow.last_error.as_ref(), Some(error));
    let row = view.steps.iter().find(|s| s.name == "Charge").unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_ref()),
        ("FAILED", Some(error))
    );
    let again = f.start(Shop, "refused", &order(60)).await.unwrap();
    assert_eq!((&again.outcome, again.replayed), (&started.outcome, true));
    assert_eq!(world.calls()["shop:refused:Charge"], 1);

    let started = f.start(Shop, "timed-out", &order(61)).await.unwrap();
    let FlowOutcome::Waiting { step, error, .. } = &started.outcome else {
        panic!("expected a wait, got a {:?}", started.outcome);
    };
    assert_eq!(step, "Charge");
    assert!(cut(error), "not cut with its marker: {} bytes", error.len());
    let view = f.get("shop", "timed-out").await.unwrap().unwrap();
    assert_eq!(view.flow.last_error.as_ref(), Some(error));
    let row = view.steps.iter().find(|s| s.name == "Charge").unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_ref()),
        ("RETRY", Some(error))
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    let round = f.recover(10).await.unwrap();
    assert_eq!((round.taken, round.completed), (1, 1), "{round:?}");
    assert_eq!(world.calls()["shop:timed-out:Charge"], 2);
}

/// A flow record whose park reason orderly never writes (edited behind its back) gets
/// one answer from a start and from every resume: `CorruptRecord` naming the value.
/// Nothing runs, and the record and its steps stay as they were.
pub async fn flow_unknown_park_reason_is_corrupt_to_start_and_resume<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Ship", Plan::Fail);
    let started = f.start(Shop, "edited", &order(70)).await.unwrap();
    assert!(matches!(started.outcome, FlowOutcome::Parked { .. }));
    world.clear_plans();
    b.exec(
        "UPDATE orderly_flows SET park_reason = 'GONE_FISHING' WHERE kind = 'shop' AND flow_key = 'edited'",
    )
    .await;
    let seen = || async {
        let mut view = f.get("shop", "edited").await.unwrap().unwrap();
        view.flow.lease_left_ms = 0;
        view
    };
    let before = seen().await;
    let calls = world.calls();
    let corrupt =
        |e: &Error| matches!(e, Error::CorruptRecord { value, .. } if value == "GONE_FISHING");
    let start = f.start(Shop, "edited", &order(70)).await;
    assert!(start.as_ref().is_err_and(corrupt), "start: {start:?}");
    for how in [
        Resume::Retry,
        Resume::Compensate,
        Resume::Applied(serde_json::json!("shipped by hand")),
    ] {
        let resumed = f.resume("shop", "edited", how.clone()).await;
        assert!(resumed.as_ref().is_err_and(corrupt), "{how:?}: {resumed:?}");
    }
    assert_eq!(seen().await, before);
    assert_eq!(world.calls(), calls, "nothing called");
    assert_eq!(effects(b, "edited", "Insert:undo").await, 0);
    assert_eq!(f.recover(10).await.unwrap().taken, 0);
}

/// A flow whose claim counter was edited to `i32::MAX` behind the library's back: the
/// recovery job's claim stays within the column (the counter is bounded in the
/// statement), so a claim that committed is never answered with an error, and the flow
/// parks `ATTEMPTS_EXHAUSTED` for a person, its step not called again.
pub async fn flow_attempt_counter_at_its_limit_parks<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Reserve", Plan::RetryForever);
    f.start(Shop, "worn", &order(12)).await.unwrap();
    world.clear_plans();
    b.exec(&format!(
        "UPDATE orderly_flows SET attempt = {}, lease_until = 0 WHERE kind = 'shop' AND flow_key = 'worn'",
        i32::MAX
    ))
    .await;
    let calls = world.calls();
    let round = f.recover(10).await.unwrap();
    assert_eq!(round.taken, 1, "{round:?}");
    let parked = f.list(Listing::Parked, None, 10).await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(
        parked[0].flow.park_reason.as_deref(),
        Some("ATTEMPTS_EXHAUSTED")
    );
    assert_eq!(world.calls(), calls, "the step was called again");
}
