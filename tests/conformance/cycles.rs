//! The ticket graph: an event with several source states and a cycle, where the state
//! alone cannot tell a replay from a new request.

use super::*;

pub async fn many_source_event_records_its_source<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    let e = tickets(b).await;
    let paths: [(i64, &[TicketEvent], TicketState); 4] = [
        (1, &[], Open),
        (2, &[Start], Working),
        (3, &[Start, Block], Blocked),
        (4, &[Start, Finish], Done),
    ];
    for (id, path, state) in paths {
        e.create(id).await.unwrap();
        for (i, &event) in path.iter().enumerate() {
            e.transition(id, event, &format!("{i}")).await.unwrap();
        }
        let v = path.len() as i64 + 1;
        let closed = Outcome::Applied {
            from: state,
            to: Closed,
            version: v,
        };
        assert_eq!(e.transition(id, Close, "c").await.unwrap(), closed);
        let replayed = Outcome::Replayed {
            from: state,
            to: Closed,
            version: v,
        };
        assert_eq!(e.transition(id, Close, "c").await.unwrap(), replayed);
        let last = e.history(id).await.unwrap().pop().unwrap();
        assert_eq!(
            (last.seq, last.from, last.to),
            (v, state, Closed),
            "ticket {id}"
        );
        let t = e.get(id).await.unwrap();
        assert_eq!((t.state, t.version), (Closed, v), "ticket {id}");
    }
}

pub async fn cycle_replays_by_ref_not_by_state<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    let e = tickets(b).await;
    e.create(1).await.unwrap();
    e.transition(1, Start, "s").await.unwrap();
    let blocked = |version| Outcome::Applied {
        from: Working,
        to: Blocked,
        version,
    };
    assert_eq!(e.transition(1, Block, "b-1").await.unwrap(), blocked(2));
    assert_eq!(e.transition(1, Unblock, "u-1").await.unwrap().version(), 3);
    // Working again: Block is allowed, but b-1 was applied already.
    let replay = Outcome::Replayed {
        from: Working,
        to: Blocked,
        version: 2,
    };
    assert_eq!(e.transition(1, Block, "b-1").await.unwrap(), replay);
    assert_eq!(e.get(1).await.unwrap().version, 3);
    assert_eq!(e.transition(1, Block, "b-2").await.unwrap(), blocked(4));
    // Blocked again: Unblock is allowed, but u-1 was applied already.
    let replay = Outcome::Replayed {
        from: Blocked,
        to: Working,
        version: 3,
    };
    assert_eq!(e.transition(1, Unblock, "u-1").await.unwrap(), replay);
    let t = e.get(1).await.unwrap();
    assert_eq!((t.state, t.version), (Blocked, 4));
    assert_eq!(e.history(1).await.unwrap().len(), 4);
}

/// Inside a caller's transaction a request recorded before, on a cycle that brought the
/// ticket back to the event's source state, goes first (the engine writes first there
/// while replays are rare) and is stopped by the history's unique key: what it wrote is
/// undone (the entity's version shows it), it is answered `Replayed`, and the caller's
/// transaction goes on, writes, and commits.
pub async fn caller_transaction_replays_a_recorded_twin<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    let e: Engine<TicketMachine, B::S> =
        with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never);
    e.create(1).await.unwrap();
    e.transition(1, Start, "s").await.unwrap();
    e.transition(1, Block, "b-1").await.unwrap();
    e.transition(1, Unblock, "u-1").await.unwrap();
    let mut tx = b.begin().await;
    let again = e.transition(1, Block, "b-1").within(&mut tx).await.unwrap();
    let replay = Outcome::Replayed {
        from: Working,
        to: Blocked,
        version: 2,
    };
    assert_eq!(again, replay);
    let next = e.transition(1, Block, "b-2").within(&mut tx).await.unwrap();
    let applied = Outcome::Applied {
        from: Working,
        to: Blocked,
        version: 4,
    };
    assert_eq!(next, applied);
    B::commit(tx).await;
    let t = e.get(1).await.unwrap();
    assert_eq!((t.state, t.version), (Blocked, 4));
    let refs: Vec<_> = e
        .history(1)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.ref_id)
        .collect();
    assert_eq!(refs, ["s", "b-1", "u-1", "b-2"]);
}

/// Concurrent tasks drive tickets around the cycle and close them from any state, with
/// duplicate references across tasks. Every answer must agree with the history row of
/// its request: `Applied` and `Replayed` name exactly the recorded `from`, `to` and
/// version, each request is recorded at most once, and the history is a path.
pub async fn cycle_storm_answers_match_the_history<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    const TICKETS: i64 = 40;
    const TASKS: usize = 24;
    const PER_TASK: usize = 120;
    let e = tickets(b).await;
    for id in 0..TICKETS {
        e.create(id).await.unwrap();
        e.transition(id, Start, "s").await.unwrap();
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut seed = [0u8; 32];
                seed[0] = t as u8;
                seed[1] = 0xc7;
                let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                let mut answers = Vec::new();
                for _ in 0..PER_TASK {
                    let id = (rng.next_u64() % TICKETS as u64) as i64;
                    // Close is rare, so most tickets go round the cycle for a while.
                    let event = match rng.next_u64() % 20 {
                        0 => Close,
                        1 => Finish,
                        n if n % 2 == 0 => Block,
                        _ => Unblock,
                    };
                    let r = format!("r{}", rng.next_u64() % 8);
                    match e.transition(id, event, &r).await {
                        Ok(o) => answers.push((id, event, r, o)),
                        Err(Error::RefConflict { .. } | Error::InvalidTransition { .. }) => {}
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    let mut applied = 0;
    let mut recorded = HashMap::new();
    for id in 0..TICKETS {
        let history = e.history(id).await.unwrap();
        let ticket = e.get(id).await.unwrap();
        assert_eq!(ticket.version as usize, history.len(), "ticket {id}");
        let mut state = Open;
        for (i, row) in history.iter().enumerate() {
            assert_eq!((row.seq, row.from), (i as i64 + 1, state), "ticket {id}");
            state = row.to;
            let key = (id, row.event, row.ref_id.clone());
            let twice = recorded.insert(key, (row.from, row.to, row.seq));
            assert!(twice.is_none(), "ticket {id}: {row:?} recorded twice");
        }
        assert_eq!(state, ticket.state, "ticket {id}");
    }
    for (id, event, r, outcome) in answers {
        let (from, to, version) = match outcome {
            Outcome::Applied { from, to, version } => {
                applied += 1;
                (from, to, version)
            }
            Outcome::Replayed { from, to, version } => (from, to, version),
        };
        assert_eq!(
            recorded.get(&(id, event, r.clone())),
            Some(&(from, to, version)),
            "ticket {id}: {event} {r} answered {outcome:?}"
        );
    }
    // Every recorded request but the set-up `Start`s was answered `Applied` exactly once.
    assert_eq!(applied, recorded.len() - TICKETS as usize);
    assert!(
        applied > TICKETS as usize,
        "too little applied to mean anything: {applied}"
    );
}
