//! Storms on one entity: identical requests, distinct references, hot rows, and random
//! sequences against the reference model.

use super::*;

/// 64 identical requests at once: one `Applied`, the others `Replayed`. The race
/// happened: a replay was sent while the applied request was still running.
pub async fn identical_requests_storm_one_applied<B: Backend>(b: &B) {
    let e = engine(b).await;
    let mut raced_winner = 0;
    for id in 1..=RACE_ROUNDS as i64 {
        e.create(id).await.unwrap();
        let (results, spans) = storm(&e, id, STORM, |_| "p-1".to_string()).await;
        let applied_n = results
            .iter()
            .filter(|r| matches!(r, Ok(o) if o.is_applied()))
            .count();
        let replayed_n = results
            .iter()
            .filter(|r| matches!(r, Ok(o) if *o == replayed(Created, Paid, 1)))
            .count();
        assert_eq!((applied_n, replayed_n), (1, STORM - 1), "{results:?}");
        assert_order(&e, id, Paid, 1, 1).await;
        let winner = results
            .iter()
            .position(|r| matches!(r, Ok(o) if o.is_applied()))
            .unwrap();
        raced_winner = raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {RACE_ROUNDS} rounds no replay was sent while the applied request ran: no race"
    );
}

/// 64 payments with references of their own at once: one wins, every other is refused
/// naming it. The race happened: a refused payment was sent while the winner ran.
pub async fn distinct_refs_storm_one_wins<B: Backend>(b: &B) {
    let e = engine(b).await;
    let mut raced_winner = 0;
    for id in 1..=RACE_ROUNDS as i64 {
        e.create(id).await.unwrap();
        let (results, spans) = storm(&e, id, STORM, |i| format!("p-{i}")).await;
        let winner = results
            .iter()
            .position(|r| matches!(r, Ok(o) if o.is_applied()))
            .expect("one payment wins");
        let winner_ref = format!("p-{winner}");
        let conflicts = results
            .iter()
            .filter(|r| matches!(r, Err(Error::RefConflict { existing_ref, .. }) if *existing_ref == winner_ref))
            .count();
        assert_eq!(conflicts, STORM - 1, "{results:?}");
        assert_order(&e, id, Paid, 1, 1).await;
        assert_eq!(e.history(id).await.unwrap()[0].ref_id, winner_ref);
        raced_winner = raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {RACE_ROUNDS} rounds no refused payment was sent while the winner ran: no race"
    );
}

/// 32 tasks send random events with few references to 200 orders: no update is lost
/// and none applied twice (each order's version, history rows and `Applied` answers
/// agree, and its history is a path). The race happened: a call was sent to an order
/// while another call on that order was still running.
pub async fn hot_rows_no_lost_update_no_double_apply<B: Backend>(b: &B) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const ORDERS: i64 = 200;
    const TASKS: usize = 32;
    const PER_TASK: usize = 100;
    let e = engine(b).await;
    for id in 0..ORDERS {
        e.create(id).await.unwrap();
    }
    // Calls running on each order, right now.
    let running: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ORDERS).map(|_| AtomicUsize::new(0)).collect());
    let events = [Pay, Ship, Deliver, Cancel, Refund];
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (e, running) = (e.clone(), running.clone());
            tokio::spawn(async move {
                let mut seed = [0u8; 32];
                seed[0] = t as u8;
                let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                let mut applied = Vec::new();
                let mut raced = 0;
                for _ in 0..PER_TASK {
                    let id = (rng.next_u64() % ORDERS as u64) as i64;
                    let event = events[(rng.next_u64() % 5) as usize];
                    // Few references per (order, event): duplicates across tasks are common.
                    let r = format!("r{}", rng.next_u64() % 3);
                    if running[id as usize].fetch_add(1, Ordering::SeqCst) > 0 {
                        raced += 1;
                    }
                    let answer = e.transition(id, event, &r).await;
                    running[id as usize].fetch_sub(1, Ordering::SeqCst);
                    match answer {
                        Ok(o) if o.is_applied() => applied.push((id, event, r)),
                        Ok(_)
                        | Err(Error::RefConflict { .. } | Error::InvalidTransition { .. }) => {}
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
                (applied, raced)
            })
        })
        .collect();
    let mut applied: HashMap<i64, Vec<(OrderEvent, String)>> = HashMap::new();
    let mut raced = 0;
    for t in tasks {
        let (mine, n) = t.await.unwrap();
        raced += n;
        for (id, event, r) in mine {
            applied.entry(id).or_default().push((event, r));
        }
    }
    let total: usize = applied.values().map(Vec::len).sum();
    assert!(
        total > ORDERS as usize / 2,
        "the run applied too little to mean anything: {total}"
    );
    assert!(
        raced > 0,
        "no call was sent to an order while another ran on it: no race"
    );
    for id in 0..ORDERS {
        let mine = applied.remove(&id).unwrap_or_default();
        let order = e.get(id).await.unwrap();
        let history = e.history(id).await.unwrap();
        assert_eq!(
            order.version as usize,
            mine.len(),
            "order {id}: version vs Applied outcomes"
        );
        assert_eq!(
            history.len(),
            mine.len(),
            "order {id}: history rows vs Applied outcomes"
        );
        let mut recorded: Vec<_> = history
            .iter()
            .map(|r| (r.event, r.ref_id.clone()))
            .collect();
        let mut reported = mine.clone();
        recorded.sort();
        reported.sort();
        assert_eq!(recorded, reported, "order {id}");
        // The history is a path through the graph ending at the current state.
        let mut state = Created;
        for (i, r) in history.iter().enumerate() {
            assert_eq!((r.seq, r.from), (i as i64 + 1, state), "order {id}");
            state = r.to;
        }
        assert_eq!(state, order.state, "order {id}");
    }
}

pub async fn engine_agrees_with_reference_model<B: Backend>(b: &B) {
    // Invariant: for any sequence full of duplicates, the engine answers as the model does.
    let e = engine(b).await;
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&steps::<OrderMachine>(4, 3, 1..40), |seq| {
        // Each case (and each shrink) uses ids of its own in the same database.
        let first_id = 1000 * (1 + case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        tokio::task::block_in_place(|| handle.block_on(check_engine(&e, first_id, 4, &seq)))
            .map_err(TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}
