//! Transitions inside the caller's transaction (committed, rolled back, racing), a genuine
//! deadlock, and an existing table under names of the caller's.

use super::*;

/// A genuine deadlock, for the backends that detect them: the rival holds the history key
/// of `(1, Pay, p-1)` and then wants the order row; the engine holds the order row and
/// wants the history key. The database aborts the engine's attempt; the engine re-reads
/// and answers `Replayed`, with one application in all. `ballast` runs in the rival's
/// transaction first (InnoDB rolls back the lighter transaction). The caller checks the
/// database's own evidence that a deadlock happened.
pub async fn deadlock_scenario<B: Backend>(b: &B, ballast: &[&str]) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let mut rival = b.begin().await;
    for sql in ballast {
        B::exec_in(&mut rival, sql).await;
    }
    B::exec_in(
        &mut rival,
        "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (1, 1, 'Created', 'Paid', 'Pay', 'p-1')",
    )
    .await;
    let ours = {
        let e = e.clone();
        tokio::spawn(async move { e.transition(1, Pay, "p-1").await })
    };
    // The engine waits on the rival's history row (its unique key) while it holds the
    // order's row: seen, not assumed after a sleep.
    let waited = std::time::Instant::now();
    while b.lock_waits().await == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the engine never waited on the rival's lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Closes the cycle: blocks on the engine's row lock until the detector aborts the engine.
    B::exec_in(
        &mut rival,
        "UPDATE orders SET status = 'Paid', version = version + 1 WHERE id = 1",
    )
    .await;
    B::commit(rival).await;
    assert_eq!(ours.await.unwrap().unwrap(), replayed(Created, Paid, 1));
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn caller_transaction_commits_or_rolls_back_both<B: Backend>(b: &B) {
    b.exec("CREATE TABLE reservations (order_id BIGINT NOT NULL, sku VARCHAR(32) NOT NULL)")
        .await;
    let e = engine(b).await;
    e.create(1).await.unwrap();

    let mut tx = b.begin().await;
    B::exec_in(
        &mut tx,
        "INSERT INTO reservations (order_id, sku) VALUES (1, 'sku-1')",
    )
    .await;
    let out = e.transition(1, Pay, "p-1").within(&mut tx).await.unwrap();
    assert_eq!(out, applied(Created, Paid, 1));
    B::rollback(tx).await;
    assert_eq!(b.scalar("SELECT COUNT(*) FROM reservations").await, 0);
    assert_order(&e, 1, Created, 0, 0).await;

    let mut tx = b.begin().await;
    B::exec_in(
        &mut tx,
        "INSERT INTO reservations (order_id, sku) VALUES (1, 'sku-1')",
    )
    .await;
    e.transition(1, Pay, "p-1").within(&mut tx).await.unwrap();
    // Inside the same transaction a repeat is already a replay, and a rival a conflict.
    assert_eq!(
        e.transition(1, Pay, "p-1").within(&mut tx).await.unwrap(),
        replayed(Created, Paid, 1)
    );
    assert!(matches!(
        e.transition(1, Pay, "p-2").within(&mut tx).await,
        Err(Error::RefConflict { .. })
    ));
    B::commit(tx).await;
    assert_eq!(b.scalar("SELECT COUNT(*) FROM reservations").await, 1);
    assert_order(&e, 1, Paid, 1, 1).await;

    // An order created and moved inside a transaction that rolls back never existed;
    // committed, it did.
    for commit in [false, true] {
        let mut tx = b.begin().await;
        let created = e.create(2).within(&mut tx).await.unwrap();
        assert_eq!((created.state, created.version), (Created, 0));
        e.transition(2, Pay, "p-9").within(&mut tx).await.unwrap();
        if commit {
            B::commit(tx).await;
            assert_order(&e, 2, Paid, 1, 1).await;
        } else {
            B::rollback(tx).await;
            assert!(matches!(
                e.get(2).await,
                Err(Error::NotFound { order_id: 2 })
            ));
        }
    }
}

/// 16 callers, each in its own transaction: begin, a transition `within` it, commit (or roll back
/// on error). Half send the same reference, half their own: one application in all. The
/// race happened: a loser began before the winner had committed (up to
/// [`RACE_ROUNDS`] rounds, each on an order of its own, until one shows it).
pub async fn caller_transactions_race_one_applies<B: Backend>(b: &B) {
    let e = engine(b).await;
    let mut raced_winner = 0;
    for id in 1..=RACE_ROUNDS as i64 {
        e.create(id).await.unwrap();
        let caller = |r: String| {
            let e = e.clone();
            timed(async move {
                let mut tx = b.begin().await;
                let out = e.transition(id, Pay, &r).within(&mut tx).await;
                match out {
                    Ok(_) => B::commit(tx).await,
                    Err(_) => B::rollback(tx).await,
                }
                (r, out)
            })
        };
        let refs = (0..16).map(|i| {
            if i % 2 == 0 {
                "p-0".to_string()
            } else {
                format!("p-{i}")
            }
        });
        let (results, spans): (Vec<_>, Vec<_>) = futures_util::future::join_all(refs.map(caller))
            .await
            .into_iter()
            .unzip();
        let winner = results
            .iter()
            .position(|(_, out)| matches!(out, Ok(o) if o.is_applied()))
            .expect("one caller applies");
        let winner_ref = results[winner].0.clone();
        for (r, out) in &results {
            match out {
                Ok(o) if o.is_applied() => assert_eq!(r, &winner_ref),
                Ok(o) => assert_eq!(
                    (r, *o),
                    (&winner_ref, replayed(Created, Paid, 1)),
                    "{results:?}"
                ),
                Err(Error::RefConflict { existing_ref, .. }) => {
                    assert_ne!(r, &winner_ref);
                    assert_eq!(existing_ref, &winner_ref);
                }
                Err(other) => panic!("{r}: unexpected {other:?}"),
            }
        }
        let applied = results
            .iter()
            .filter(|(_, o)| matches!(o, Ok(o) if o.is_applied()))
            .count();
        assert_eq!(applied, 1, "{results:?}");
        assert_order(&e, id, Paid, 1, 1).await;
        raced_winner = raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {RACE_ROUNDS} rounds no caller began before the winner committed: no race"
    );
}

pub async fn custom_table_names_drive_an_existing_table<B: Backend>(b: &B) {
    let e: Eng<B> = with_policy(b.custom_store().await, B::POLICY);
    // The user's table has columns of its own; orderly reads and writes only id/status/version.
    b.exec(
        "INSERT INTO shop_orders (id, customer, status, version) VALUES (7, 'ada', 'Created', 0)",
    )
    .await;
    assert_eq!(
        e.transition(7, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert_eq!(
        e.transition(7, Pay, "p-1").await.unwrap(),
        replayed(Created, Paid, 1)
    );
    e.create(8).await.unwrap();
    assert_order(&e, 7, Paid, 1, 1).await;
    assert_eq!(b.scalar("SELECT COUNT(*) FROM shop_order_log").await, 1);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM shop_orders WHERE customer = 'ada'")
            .await,
        1
    );
    // The default tables were not touched.
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_transitions").await,
        0
    );
}

orderly::state_machine! {
    /// A graph whose states are stored under the names an application's rows already
    /// use.
    pub Lowercase {
        states: LowerState { New = "new", Paid = "paid", Refunded = "refunded" }
        events: LowerEvent { Pay, Refund }
        initial: New;
        terminal: [Refunded];
        transitions: {
            New + Pay => Paid,
            Paid + Refund => Refunded,
        }
    }
}

/// An application's table whose rows say `'new'` and `'paid'`, driven by a graph that
/// maps its states to those names: reads, moves, replays, history rows and creates use
/// them; the variant's own name in a row is no state of the graph (`CorruptState`).
pub async fn stored_state_names_are_the_applications<B: Backend>(b: &B) {
    let e: Engine<Lowercase, B::S> = with_policy(b.custom_store().await, B::POLICY);
    b.exec("INSERT INTO shop_orders (id, customer, status, version) VALUES (21, 'ada', 'new', 0)")
        .await;
    let moved = Outcome::Applied {
        from: LowerState::New,
        to: LowerState::Paid,
        version: 1,
    };
    assert_eq!(
        e.transition(21, LowerEvent::Pay, "p-21").await.unwrap(),
        moved
    );
    assert!(matches!(
        e.transition(21, LowerEvent::Pay, "p-21").await.unwrap(),
        Outcome::Replayed {
            to: LowerState::Paid,
            version: 1,
            ..
        }
    ));
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM shop_orders WHERE id = 21 AND status = 'paid'")
            .await,
        1,
        "the row says 'paid'"
    );
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM shop_order_log WHERE order_id = 21 \
             AND from_status = 'new' AND to_status = 'paid'"
        )
        .await,
        1,
        "the history row says 'new' -> 'paid'"
    );
    let order = e.get(21).await.unwrap();
    assert_eq!((order.state, order.version), (LowerState::Paid, 1));
    assert_eq!(e.history(21).await.unwrap().len(), 1);
    // A create stores the initial state's name.
    e.create(22).await.unwrap();
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM shop_orders WHERE id = 22 AND status = 'new'")
            .await,
        1
    );
    // The variant's own name is no stored name of this graph.
    b.exec("INSERT INTO shop_orders (id, customer, status, version) VALUES (23, 'bo', 'New', 0)")
        .await;
    let err = e.transition(23, LowerEvent::Pay, "p-23").await.unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 23, .. }),
        "{err:?}"
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM shop_orders WHERE id = 23 AND status = 'New'")
            .await,
        1,
        "the corrupt row is left as it was"
    );
}
