//! The outcome table, one request at a time: applied, replayed, refused, bad input,
//! contention, a lost race re-judged, and errors classified.

use super::*;

pub async fn applied_moves_the_order_once<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let out = e.transition(1, Pay, "p-1").await.unwrap();
    assert_eq!(out, applied(Created, Paid, 1));
    assert_order(&e, 1, Paid, 1, 1).await;
    let h = e.history(1).await.unwrap();
    assert_eq!(
        (h[0].seq, h[0].from, h[0].to, h[0].event),
        (1, Created, Paid, Pay)
    );
    assert_eq!(h[0].ref_id, "p-1");
    assert_eq!(h[0].payload, None);
}

pub async fn duplicate_callback_is_replayed<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    for _ in 0..2 {
        assert_eq!(
            e.transition(1, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
    }
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn replay_after_the_order_moved_on<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    e.transition(1, Pay, "p-1").await.unwrap();
    e.transition(1, Ship, "s-1").await.unwrap();
    e.transition(1, Deliver, "d-1").await.unwrap();
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        replayed(Created, Paid, 1)
    );
    assert_eq!(
        e.transition(1, Ship, "s-1").await.unwrap(),
        replayed(Paid, Shipped, 2)
    );
    assert_order(&e, 1, Delivered, 3, 3).await;
}

pub async fn payload_is_fingerprinted<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let body = serde_json::json!({"amount": 100, "currency": "EUR"});
    let out = e.transition(1, Pay, "p-1").payload(&body).await.unwrap();
    assert_eq!(out, applied(Created, Paid, 1));
    let same = e.transition(1, Pay, "p-1").payload(&body).await.unwrap();
    assert_eq!(same, replayed(Created, Paid, 1));
    let other = serde_json::json!({"amount": 200, "currency": "EUR"});
    let err = e
        .transition(1, Pay, "p-1")
        .payload(&other)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::PayloadMismatch { ref reference, .. } if reference == "p-1"),
        "{err:?}"
    );
    assert!(err.is_conflict());
    // Without a payload it is a different request under the same reference, too.
    let bare = e.transition(1, Pay, "p-1").await.unwrap_err();
    assert!(matches!(bare, Error::PayloadMismatch { .. }), "{bare:?}");
    let h = e.history(1).await.unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].payload.as_ref(), Some(&body));
    assert_eq!(h[0].payload_hash.as_ref().map(String::len), Some(64));
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn second_payment_is_a_ref_conflict<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    e.transition(1, Pay, "p-1").await.unwrap();
    let err = e.transition(1, Pay, "p-2").await.unwrap_err();
    assert!(
        matches!(err, Error::RefConflict { ref existing_ref, .. } if existing_ref == "p-1"),
        "{err:?}"
    );
    assert!(err.is_conflict() && !err.is_retryable());
    // Still named after the order moved on.
    e.transition(1, Ship, "s-1").await.unwrap();
    let err = e.transition(1, Pay, "p-3").await.unwrap_err();
    assert!(
        matches!(err, Error::RefConflict { ref existing_ref, .. } if existing_ref == "p-1"),
        "{err:?}"
    );
    assert_order(&e, 1, Shipped, 2, 2).await;
}

pub async fn disallowed_event_is_invalid_transition<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let err = e.transition(1, Ship, "s-1").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidTransition {
                state: "Created",
                event: "Ship"
            }
        ),
        "{err:?}"
    );
    assert_order(&e, 1, Created, 0, 0).await;
    // A terminal state refuses everything, including an event never applied before.
    e.transition(1, Cancel, "c-1").await.unwrap();
    let err = e.transition(1, Refund, "r-1").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidTransition {
                state: "Cancelled",
                event: "Refund"
            }
        ),
        "{err:?}"
    );
    assert_order(&e, 1, Cancelled, 1, 1).await;
}

pub async fn missing_order_is_not_found<B: Backend>(b: &B) {
    let e = engine(b).await;
    let err = e.transition(404, Pay, "p-1").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { order_id: 404 }), "{err:?}");
    assert!(matches!(
        e.get(404).await,
        Err(Error::NotFound { order_id: 404 })
    ));
    assert!(e.history(404).await.unwrap().is_empty());
}

pub async fn create_is_idempotent_at_initial_state<B: Backend>(b: &B) {
    let e = engine(b).await;
    let first = e.create(1).await.unwrap();
    assert_eq!((first.state, first.version), (Created, 0));
    let again = e.create(1).await.unwrap();
    assert_eq!(again, first);
    e.transition(1, Pay, "p-1").await.unwrap();
    let err = e.create(1).await.unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists { order_id: 1, ref state } if state == "Paid"),
        "{err:?}"
    );
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn corrupt_status_is_reported_not_panicked<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    b.exec("UPDATE orders SET status = 'Teleported' WHERE id = 1")
        .await;
    let err = e.transition(1, Pay, "p-1").await.unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 1, ref value } if value == "Teleported"),
        "{err:?}"
    );
    assert!(matches!(e.get(1).await, Err(Error::CorruptState { .. })));
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_transitions").await,
        0
    );
    // A corrupt history row is reported the same way.
    e.create(2).await.unwrap();
    e.transition(2, Pay, "p-1").await.unwrap();
    b.exec("UPDATE orderly_transitions SET from_status = 'Limbo' WHERE order_id = 2")
        .await;
    assert!(matches!(
        e.transition(2, Pay, "p-1").await,
        Err(Error::CorruptState { .. })
    ));
    assert!(matches!(
        e.history(2).await,
        Err(Error::CorruptState { .. })
    ));
}

pub async fn bad_input_is_rejected_before_any_query<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    // Blank, too long, padded, a control character (C0, C1), and characters that change
    // how a reference displays without being seen: a right-to-left override (so that
    // `pay_1\u{202E}2ab` shows as `pay_1ba2`), an isolate, a zero-width space and joiner,
    // a byte order mark, a soft hyphen, a tag character, a line separator.
    for bad in [
        "",
        "   ",
        &"x".repeat(256),
        "p\n1",
        "p-1 ",
        " p-1",
        "p\u{85}1",
        "pay_1\u{202E}2ab",
        "pay_\u{2067}1\u{2069}",
        "pay\u{200B}1",
        "pay\u{200D}1",
        "\u{FEFF}pay_1",
        "pay\u{AD}1",
        "pay\u{E0041}1",
        "pay\u{2028}1",
    ] {
        let err = e.transition(1, Pay, bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{bad:?}: {err:?}");
    }
    // Letters of any script, emoji and other visible symbols are references like any.
    for (i, good) in ["заказ-1", "注文-1", "pay_😀"].into_iter().enumerate() {
        let id = 100 + i as i64;
        e.create(id).await.unwrap();
        e.transition(id, Pay, good).await.unwrap();
    }
    assert!(
        e.history(1).await.unwrap().is_empty(),
        "a refused reference wrote nothing"
    );
    let err = e.transition_named(1, "Teleport", "t-1").await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(
        Tables::new("orders; DROP TABLE orders")
            .and_then(|t| t.with_history("h"))
            .is_err()
    );
    assert!(
        Tables::new("orders")
            .and_then(|t| t.with_history("a.b.c"))
            .is_err()
    );
    assert_order(&e, 1, Created, 0, 0).await;
    // 255 characters (multi-byte ones too) is the limit, not an error.
    let long = "é".repeat(255);
    assert_eq!(
        e.transition(1, Pay, &long).await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert_eq!(
        e.transition_named(1, "Ship", "s-1").await.unwrap(),
        applied(Paid, Shipped, 2)
    );
    assert_eq!(e.history(1).await.unwrap()[0].ref_id, long);
}

pub async fn contention_after_the_retry_budget<B: Backend>(b: &B) {
    let config = config(B::POLICY).max_attempts(3);
    let e: Eng<B> = Engine::with_config(b.store(Duration::from_millis(200)).await, config).unwrap();
    e.create(1).await.unwrap();
    // Another transaction holds the row (and on SQLite, the write lock) past every attempt.
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let err = e.transition(1, Pay, "p-1").await.unwrap_err();
    assert!(matches!(err, Error::Contention { attempts: 3 }), "{err:?}");
    assert!(err.is_retryable());
    B::rollback(holder).await;
    assert_order(&e, 1, Created, 0, 0).await;
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
}

pub async fn lost_race_is_rejudged_not_reapplied<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in [1, 2] {
        e.create(id).await.unwrap();
    }
    for (id, ours, expect_conflict) in [(1, "p-2", true), (2, "p-1", false)] {
        // A rival applies Pay p-1 in its own transaction and commits a little later; our
        // request reads the order as Created, waits on the row, loses the CAS, re-reads.
        let mut rival = b.begin().await;
        B::exec_in(
            &mut rival,
            &format!("UPDATE orders SET status = 'Paid', version = version + 1 WHERE id = {id}"),
        )
        .await;
        B::exec_in(
            &mut rival,
            &format!("INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ({id}, 1, 'Created', 'Paid', 'Pay', 'p-1')"),
        )
        .await;
        let ours_task = {
            let e = e.clone();
            tokio::spawn(async move { e.transition(id, Pay, ours).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The race happened: our request was still waiting behind the rival's write.
        assert!(
            !ours_task.is_finished(),
            "answered before the rival committed: the test shows nothing"
        );
        B::commit(rival).await;
        let result = ours_task.await.unwrap();
        if expect_conflict {
            assert!(
                matches!(result, Err(Error::RefConflict { ref existing_ref, .. }) if existing_ref == "p-1"),
                "{result:?}"
            );
        } else {
            assert_eq!(result.unwrap(), replayed(Created, Paid, 1));
        }
        assert_order(&e, id, Paid, 1, 1).await;
    }
}

/// A caller's own statements (inside `Records::run`'s work, a flow's local step) turn a
/// `sqlx::Error` into orderly's `Error` with `?`, classified as the stores classify
/// theirs: a lock the statement waited out is retryable, a statement the server
/// refuses is not.
pub async fn own_statement_errors_classify_as_the_stores_do<B: Backend>(b: &B) {
    let store = b.store(Duration::from_millis(200)).await;
    let e: Eng<B> = with_policy(store.clone(), B::POLICY);
    e.create(1).await.unwrap();
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let mut conn = store.acquire().await.unwrap();
    let locked = B::exec_conn(
        &mut conn,
        "UPDATE orders SET version = version WHERE id = 1".into(),
    )
    .await
    .unwrap_err();
    let err = Error::from(locked);
    assert!(
        matches!(
            err,
            Error::Database {
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    B::rollback(holder).await;
    let refused = B::exec_conn(&mut conn, "UPDATE no_such_table SET x = 1".into())
        .await
        .unwrap_err();
    let err = Error::from(refused);
    assert!(!err.is_retryable(), "{err:?}");
    assert!(Error::from(sqlx::Error::PoolTimedOut).is_retryable());
}
