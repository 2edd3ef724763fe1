//! Reading first and coalescing: the adaptive switch in a replay storm, batched reads,
//! and the write unit that carries several requests.

use super::*;

/// A storm of replays switches `ReadFirst::Adaptive` to reading first, and new requests
/// (inside callers' transactions) switch it back. Seen from outside through a lock that `blocker` takes in a held
/// transaction: one that the store's apply-first attempt waits for and a plain read does
/// not (the point of reading first in a storm: replays do not queue behind writers).
pub async fn adaptive_reads_first_in_a_replay_storm<B: Backend>(b: &B, blocker: &str) {
    let config = |read_first| {
        EngineConfig::default()
            .max_attempts(2)
            .read_first(read_first)
    };
    let wait = Duration::from_millis(200);
    let adaptive: Eng<B> =
        Engine::with_config(b.store(wait).await, config(ReadFirst::Adaptive)).unwrap();
    let never: Eng<B> = Engine::with_config(b.store(wait).await, config(ReadFirst::Never)).unwrap();
    for id in 1..=40 {
        adaptive.create(id).await.unwrap();
    }
    let first = adaptive.transition(1, Pay, "p-1").await.unwrap();
    assert!(first.is_applied());
    let same =
        |o: &Outcome<OrderState>| (o.state(), o.version()) == (first.state(), first.version());
    for _ in 0..30 {
        let again = adaptive.transition(1, Pay, "p-1").await.unwrap();
        assert!(!again.is_applied() && same(&again));
    }

    let mut held = b.begin().await;
    B::exec_in(&mut held, blocker).await;
    let read = adaptive.transition(1, Pay, "p-1").await.unwrap();
    assert!(!read.is_applied() && same(&read), "{read:?}");
    let tried = never.transition(1, Pay, "p-1").await;
    assert!(
        matches!(tried, Err(Error::Contention { .. })),
        "applying first did not wait for the lock, so the test shows nothing: {tried:?}"
    );
    B::rollback(held).await;

    // New requests, each inside a caller's transaction (whose answers count as the
    // engine's own do): each applied once; the share of replays falls, and the store
    // tries to apply first again, so a replay waits for the lock once more.
    for id in 2..=40 {
        let mut tx = b.begin().await;
        let outcome = adaptive
            .transition(id, Pay, &format!("p-{id}"))
            .within(&mut tx)
            .await
            .unwrap();
        B::commit(tx).await;
        assert!(
            outcome.is_applied() && outcome.version() == 1,
            "{outcome:?}"
        );
    }
    let mut held = b.begin().await;
    B::exec_in(&mut held, blocker).await;
    let tried = adaptive.transition(1, Pay, "p-1").await;
    assert!(
        matches!(tried, Err(Error::Contention { .. })),
        "still reading first after 39 new requests: {tried:?}"
    );
    B::rollback(held).await;
    assert_eq!(
        b.scalar("SELECT count(*) FROM orderly_transitions").await,
        40
    );
}

/// A batched read (`Store::priors`) answers each request with its own history row, in
/// the order asked: recorded or not, with and without a payload, keys repeated, in
/// batches of every size up to the store's `BATCH_READ_MAX`.
pub async fn batched_read_answers_each_request<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=100 {
        e.create(id).await.unwrap();
    }
    for id in (2..=100).step_by(2) {
        let r = format!("p-{id}");
        let out = if id % 3 == 0 {
            let body = serde_json::json!({ "order": id });
            e.transition(id, Pay, &r).payload(&body).await
        } else {
            e.transition(id, Pay, &r).await
        };
        assert!(out.unwrap().is_applied());
    }
    e.transition(2, Ship, "s-2").await.unwrap();
    // Enough keys for one batch of every size from 1 to 64.
    let keys: Vec<OwnedKey> = (0..2100i64)
        .map(|i| {
            let order_id = (i * 7) % 100 + 1;
            let (event, ref_id) = match i % 10 {
                0 => ("Ship", format!("s-{order_id}")),
                1 => ("Pay", format!("other-{order_id}")),
                _ => ("Pay", format!("p-{order_id}")),
            };
            OwnedKey {
                order_id,
                event,
                ref_id,
            }
        })
        .collect();
    let mut keys = keys;
    for (order_id, event, ref_id) in [(2, "Ship", "s-2"), (6, "Pay", "p-6"), (2, "Ship", "s-2")] {
        keys.push(OwnedKey {
            order_id,
            event,
            ref_id: ref_id.into(),
        });
    }
    let store = e.store();
    let mut conn = store.acquire().await.unwrap();
    let max = <B::S as Store>::BATCH_READ_MAX;
    let (mut batched, mut at, mut size) = (Vec::new(), 0, 1);
    while at < keys.len() {
        let chunk = &keys[at..(at + size).min(keys.len())];
        let read = store.priors(&mut conn, chunk).await.unwrap();
        assert_eq!(read.len(), chunk.len());
        batched.extend(read);
        at += chunk.len();
        size = size % max + 1;
    }
    assert_eq!(batched.len(), keys.len());
    let mut found = 0;
    for (key, got) in keys.iter().zip(&batched) {
        let alone = store
            .prior(&mut conn, key.as_key(), Txn::Own)
            .await
            .unwrap();
        assert_eq!(got, &alone, "{key:?}");
        found += usize::from(got.is_some());
    }
    // The ones added last: order 2's Ship (twice) and order 6's Pay, with its payload.
    let ship = keys
        .iter()
        .position(|k| k.order_id == 2 && k.event == "Ship");
    let ship = batched[ship.expect("order 2's Ship is asked for")].as_ref();
    assert_eq!(
        ship.map(|p| (p.seq, p.from.as_str(), p.to.as_str())),
        Some((2, "Paid", "Shipped"))
    );
    let with_payload = keys
        .iter()
        .position(|k| k.order_id == 6 && k.event == "Pay");
    let with_payload = batched[with_payload.expect("order 6 is asked for")].as_ref();
    assert!(with_payload.is_some_and(|p| p.payload_hash.as_ref().is_some_and(|h| h.len() == 64)));
    assert!(
        (keys.len() / 5..keys.len() * 4 / 5).contains(&found),
        "a mix of recorded and unrecorded requests: {found} of {} found",
        keys.len()
    );
    // Nothing to read is nothing read.
    assert!(store.priors(&mut conn, &[]).await.unwrap().is_empty());
}

/// Many callers at once, each with its own mix of replays, conflicts, mismatched payloads
/// and new requests (twins among them): every caller gets the answer to its own request,
/// as the history records it. Reading first (the `Always` suite, and `Adaptive` once the
/// replays dominate), concurrent reads share statements where the store batches them.
pub async fn replay_storm_answers_each_caller<B: Backend>(b: &B) {
    const ORDERS: i64 = 60;
    const TASKS: i64 = 32;
    const ROUNDS: i64 = 25;
    let e = engine(b).await;
    for id in 1..=ORDERS {
        e.create(id).await.unwrap();
    }
    // The lower half is paid before the storm; the upper half is paid during it.
    for id in 1..=ORDERS / 2 {
        e.transition(id, Pay, &format!("p-{id}")).await.unwrap();
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut applied = Vec::new();
                for round in 0..ROUNDS {
                    let id = (t * 7 + round * 13) % ORDERS + 1;
                    let r = format!("p-{id}");
                    match (t + round) % 8 {
                        0 => {
                            // Another payment for the order.
                            let q = format!("q-{t}");
                            let out = e.transition(id, Pay, &q).await;
                            let recorded = e.history(id).await.unwrap();
                            let winner = recorded.first().map(|r| r.ref_id.as_str());
                            match out {
                                Ok(o) if o.is_applied() => {
                                    assert!(id > ORDERS / 2, "order {id} paid twice");
                                    assert_eq!(winner, Some(q.as_str()), "order {id}");
                                    applied.push((id, q));
                                }
                                Err(Error::RefConflict { existing_ref, .. }) => {
                                    assert_eq!(Some(existing_ref.as_str()), winner, "order {id}")
                                }
                                other => panic!("order {id}: {other:?}"),
                            }
                        }
                        1 if id <= ORDERS / 2 => {
                            let out = e.transition(id, Pay, &r).payload(&1).await;
                            assert!(
                                matches!(out, Err(Error::PayloadMismatch { .. })),
                                "order {id}: {out:?}"
                            );
                        }
                        _ => {
                            let out = e.transition(id, Pay, &r).await;
                            match out {
                                Ok(o) if o.is_applied() => {
                                    assert!(id > ORDERS / 2, "order {id} paid twice");
                                    applied.push((id, r));
                                }
                                Ok(o) => assert_eq!(o, replayed(Created, Paid, 1), "order {id}"),
                                // Another caller's `q-` ref won this order first.
                                Err(Error::RefConflict { .. }) if id > ORDERS / 2 => {}
                                Err(err) => panic!("order {id}: {err:?}"),
                            }
                        }
                    }
                }
                applied
            })
        })
        .collect();
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(t.await.unwrap());
    }
    // Each order of the upper half that was applied during the storm was applied once,
    // under the reference its history records.
    let mut ids: Vec<i64> = applied.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), before, "an order applied twice: {applied:?}");
    assert!(before > 10, "too little applied to mean anything: {before}");
    for (id, r) in &applied {
        let h = e.history(*id).await.unwrap();
        assert_eq!((h.len(), &h[0].ref_id), (1, r), "order {id}");
    }
    for id in 1..=ORDERS / 2 {
        assert_order(&e, id, Paid, 1, 1).await;
    }
}

/// The apply-first unit carries several requests at once, one commit for all, each
/// answered for itself: a new request applies, one recorded before (on a cycle, at a
/// state its entity came back to) is undone alone, one whose entity is elsewhere writes
/// nothing, one with several source states is tried only where the store can, and the
/// others in the unit are not affected.
pub async fn write_unit_carries_several_requests<B: Backend>(b: &B) {
    use TicketEvent::*;
    use orderly::store::{FirstWrite, Key, Request};
    let e = tickets(b).await;
    for id in 1..=5 {
        e.create(id).await.unwrap();
        e.transition(id, Start, "s").await.unwrap();
    }
    // Ticket 1 goes round the cycle: Block b-1 is recorded, and it is Working again.
    e.transition(1, Block, "b-1").await.unwrap();
    e.transition(1, Unblock, "u-1").await.unwrap();
    // Ticket 3 is Working, so an Unblock finds nothing to move.
    let request = |order_id, event: TicketEvent, ref_id| {
        let (from, to): (&[&'static str], &[&'static str]) = match event {
            Block => (&["Working"], &["Blocked"]),
            Unblock => (&["Blocked"], &["Working"]),
            _ => (
                &["Open", "Working", "Blocked", "Done"],
                &["Closed", "Closed", "Closed", "Closed"],
            ),
        };
        Request {
            key: Key {
                order_id,
                event: event.into(),
                ref_id,
            },
            from_states: from,
            to_states: to,
            payload_hash: None,
            payload: None,
            write_id: order_id,
            audit: Default::default(),
            emits: &[],
            machine: "TicketMachine",
            event_body: None,
            trace: None,
        }
    };
    let unit = [
        request(2, Block, "b-2"),
        request(1, Block, "b-1"),
        request(3, Unblock, "u-3"),
        request(4, Close, "c-4"),
        request(5, Block, "b-5"),
    ];
    let store = e.store();
    let mut conn = store.acquire().await.unwrap();
    let written = store.apply_first(&mut conn, &unit).await.unwrap();
    drop(conn);
    let applied = |from: &str, to: &str, version| FirstWrite::Applied {
        from: from.into(),
        to: to.into(),
        version,
    };
    assert_eq!(written.len(), 5);
    assert_eq!(written[0], applied("Working", "Blocked", 2));
    assert_eq!(written[1], FirstWrite::NotApplied);
    assert_eq!(written[2], FirstWrite::NotApplied);
    assert_eq!(written[4], applied("Working", "Blocked", 2));
    let t = |id| e.get(id);
    assert_eq!(t(2).await.unwrap().state, TicketState::Blocked);
    assert_eq!(t(5).await.unwrap().state, TicketState::Blocked);
    // The recorded request was undone alone: ticket 1 did not move, no second row.
    let one = t(1).await.unwrap();
    assert_eq!((one.state, one.version), (TicketState::Working, 3));
    assert_eq!(e.history(1).await.unwrap().len(), 3);
    assert_eq!(t(3).await.unwrap().version, 1);
    match &written[3] {
        FirstWrite::Applied { version, .. } => {
            assert_eq!(*version, 2);
            assert_eq!(t(4).await.unwrap().state, TicketState::Closed);
        }
        FirstWrite::NotTried => assert_eq!(t(4).await.unwrap().version, 1),
        other => panic!("ticket 4: {other:?}"),
    }
    // Every row the unit wrote is in the history, answered as a replay.
    assert!(
        e.transition(2, Block, "b-2")
            .await
            .is_ok_and(|o| !o.is_applied())
    );
}
