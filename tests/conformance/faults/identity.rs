//! What a request's identity holds under races and bad data: twins on a cycle, engines
//! racing, a payload in any member order, corrupt rows, a version at its limit.

#[allow(unused_imports)]
use super::*;

/// On a cycle, a twin of this request (on another engine) is applied between this
/// engine's judging read (which found the event refused) and its read of the event's
/// latest reference, which is now this request's own: the answer is `Replayed`, never
/// `RefConflict` naming itself.
pub async fn twin_on_a_cycle_is_replayed_not_a_conflict<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    for (n, policy) in [ReadFirst::Never, ReadFirst::Always]
        .into_iter()
        .enumerate()
    {
        let id = n as i64;
        let rival: Engine<TicketMachine, B::S> =
            with_policy(b.store(Duration::from_secs(10)).await, policy);
        rival.create(id).await.unwrap();
        rival.transition(id, Start, "s").await.unwrap();
        // Working: Unblock is refused here. The twin blocks and unblocks with u-2.
        let hook: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin({
            let rival = rival.clone();
            async move {
                rival.transition(id, Block, "b-2").await.unwrap();
                let twin = rival.transition(id, Unblock, "u-2").await.unwrap();
                assert!(twin.is_applied());
            }
        });
        let hooked = Hooked::new(b.store(Duration::from_secs(10)).await, Some(hook), false);
        let e: Engine<TicketMachine, Hooked<B::S>> = with_policy(hooked.clone(), policy);
        let answer = e.transition(id, Unblock, "u-2").await;
        assert!(
            hooked.hook.lock().unwrap().is_none(),
            "the twin never stepped in: the test shows nothing"
        );
        assert_eq!(
            answer.unwrap(),
            Outcome::Replayed {
                from: Blocked,
                to: Working,
                version: 3
            },
            "{policy:?}"
        );
        let t = rival.get(id).await.unwrap();
        assert_eq!((t.state, t.version), (Working, 3));
    }
}

/// Two engines (two pools, as on two servers) race around a cycle with shared references,
/// the window between the judging read and the latest-reference read widened by a short
/// wait. Invariant: no answer names the request's own reference as a conflict, and every
/// `RefConflict` names a reference recorded for that event on that ticket. The race is
/// shown to have happened: some latest-reference reads found the request's own reference.
pub async fn racing_engines_never_conflict_with_themselves<B: Backend>(b: &B) {
    use TicketEvent::*;
    const TICKETS: i64 = 6;
    const TASKS: usize = 16;
    const PER_TASK: usize = 150;
    // Rounds on fresh tickets until the window was hit a few times (bounded: on SQLite,
    // whose writes are serialized and coalesced, ten rounds sometimes saw no hit).
    const ROUNDS: i64 = 40;
    const HITS: usize = 3;
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(Hooked::new(
            b.store(Duration::from_secs(10)).await,
            None,
            true,
        ));
    }
    let engines: Vec<Engine<TicketMachine, Hooked<B::S>>> = stores
        .iter()
        .map(|s| with_policy(s.clone(), B::POLICY))
        .collect();
    let own_refs = || -> usize {
        stores
            .iter()
            .map(|s| s.own_refs.load(Ordering::Relaxed))
            .sum()
    };
    let mut conflicts = Vec::new();
    let mut tickets = 0..0;
    for round in 0..ROUNDS {
        if own_refs() >= HITS {
            break;
        }
        let first = round * TICKETS;
        tickets = 0..first + TICKETS;
        for id in first..first + TICKETS {
            engines[0].create(id).await.unwrap();
            engines[0].transition(id, Start, "s").await.unwrap();
        }
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let e = engines[t % 2].clone();
                tokio::spawn(async move {
                    // Tasks 2k and 2k + 1, on the two engines, send the same requests:
                    // every request has a twin racing it.
                    let mut seed = [0u8; 32];
                    seed[0] = (t / 2) as u8;
                    seed[1] = 0x3e;
                    seed[2] = round as u8;
                    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                    let mut conflicts = Vec::new();
                    for _ in 0..PER_TASK {
                        let id = first + (rng.next_u64() % TICKETS as u64) as i64;
                        let event = if rng.next_u64().is_multiple_of(2) {
                            Block
                        } else {
                            Unblock
                        };
                        let r = format!("r{}", rng.next_u64() % 64);
                        match e.transition(id, event, &r).await {
                            Ok(_) | Err(Error::InvalidTransition { .. }) => {}
                            Err(Error::RefConflict { existing_ref, .. }) => {
                                conflicts.push((id, event, r, existing_ref))
                            }
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                    conflicts
                })
            })
            .collect();
        for t in tasks {
            conflicts.extend(t.await.unwrap());
        }
    }
    assert!(
        conflicts.len() > 10,
        "too few conflicts: {}",
        conflicts.len()
    );
    assert!(
        own_refs() > 0,
        "no twin ever stepped into the window: the test shows nothing"
    );
    let mut recorded = HashMap::new();
    for id in tickets {
        for row in engines[1].history(id).await.unwrap() {
            recorded
                .entry((id, row.event))
                .or_insert_with(Vec::new)
                .push(row.ref_id);
        }
    }
    for (id, event, r, existing) in conflicts {
        assert_ne!(
            r, existing,
            "ticket {id}: {event:?} {r} conflicted with itself"
        );
        assert!(
            recorded[&(id, event)].contains(&existing),
            "ticket {id}: {event:?} {r} named {existing}, never recorded for {event:?}"
        );
    }
}

#[derive(serde::Serialize)]
pub(crate) struct PaymentAb {
    amount: u32,
    currency: &'static str,
    card: &'static str,
}

#[derive(serde::Serialize)]
pub(crate) struct PaymentBa {
    currency: &'static str,
    card: &'static str,
    amount: u32,
}

/// Payloads equal as JSON values are one payload whatever their member order: a struct
/// with its fields declared in another order, a `HashMap` built anew (its iteration order
/// differs between instances). A NUL character is `InvalidInput` on every backend, and
/// nothing is written.
pub async fn same_payload_in_any_member_order_is_replayed<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let ab = PaymentAb {
        amount: 100,
        currency: "EUR",
        card: "4242",
    };
    let ba = PaymentBa {
        currency: "EUR",
        card: "4242",
        amount: 100,
    };
    assert_ne!(
        serde_json::to_string(&ab).unwrap(),
        serde_json::to_string(&ba).unwrap()
    );
    let first = e.transition(1, Pay, "p-1").payload(&ab).await.unwrap();
    assert_eq!(first, applied(Created, Paid, 1));
    let again = e.transition(1, Pay, "p-1").payload(&ba).await.unwrap();
    assert_eq!(again, replayed(Created, Paid, 1));
    let json = serde_json::json!({"card": "4242", "amount": 100, "currency": "EUR"});
    let again = e.transition(1, Pay, "p-1").payload(&json).await.unwrap();
    assert_eq!(again, replayed(Created, Paid, 1));
    // A value that differs is still another payload.
    let other = serde_json::json!({"card": "4242", "amount": 101, "currency": "EUR"});
    assert!(matches!(
        e.transition(1, Pay, "p-1").payload(&other).await,
        Err(Error::PayloadMismatch { .. })
    ));

    // HashMaps: build until two instances iterate in different orders.
    let map = || -> HashMap<String, u32> { (0..24).map(|i| (format!("k{i}"), i)).collect() };
    let one = map();
    let two = (0..100)
        .map(|_| map())
        .find(|m| serde_json::to_string(m).unwrap() != serde_json::to_string(&one).unwrap())
        .expect("two HashMaps that iterate in different orders");
    e.create(2).await.unwrap();
    assert!(
        e.transition(2, Pay, "p-1")
            .payload(&one)
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(
        e.transition(2, Pay, "p-1").payload(&two).await.unwrap(),
        replayed(Created, Paid, 1)
    );
    let stored = &e.history(2).await.unwrap()[0];
    assert_eq!(stored.payload, Some(serde_json::to_value(&one).unwrap()));

    // NUL: one answer on every backend, before any write.
    e.create(3).await.unwrap();
    for bad in [
        serde_json::json!({"note": "a\u{0}b"}),
        serde_json::json!({"a\u{0}": 1}),
        serde_json::json!([["\u{0}"]]),
    ] {
        let err = e.transition(3, Pay, "p-1").payload(&bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    }
    assert_order(&e, 3, Created, 0, 0).await;
}

/// Row 8 of the outcome table: a negative version, or a status with trailing spaces, is
/// `CorruptState` and nothing is written, on every backend. References, events and states
/// compare exactly: `x` and `x ` are two references everywhere.
pub async fn corrupt_rows_are_reported_not_written_over<B: Backend>(b: &B) {
    for policy in [ReadFirst::Never, ReadFirst::Always] {
        let e: Eng<B> = with_policy(b.store(Duration::from_secs(10)).await, policy);
        b.exec("DELETE FROM orders").await;
        e.create(1).await.unwrap();
        b.exec("UPDATE orders SET version = -4 WHERE id = 1").await;
        let err = e.transition(1, Pay, "p-1").await.unwrap_err();
        assert!(
            matches!(err, Error::CorruptState { order_id: 1, .. }),
            "{policy:?}: {err:?}"
        );
        assert!(matches!(e.get(1).await, Err(Error::CorruptState { .. })));
        assert_eq!(
            b.scalar("SELECT version FROM orders WHERE id = 1").await,
            -4
        );

        e.create(2).await.unwrap();
        b.exec("UPDATE orders SET status = 'Created  ' WHERE id = 2")
            .await;
        let err = e.transition(2, Pay, "p-1").await.unwrap_err();
        assert!(
            matches!(err, Error::CorruptState { order_id: 2, ref value } if value == "Created  "),
            "{policy:?}: {err:?}"
        );
        assert_eq!(b.scalar("SELECT version FROM orders WHERE id = 2").await, 0);
        assert_eq!(
            b.scalar("SELECT COUNT(*) FROM orderly_transitions").await,
            0
        );
    }
    b.exec(
        "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) \
         VALUES (9, 1, 'Created', 'Paid', 'Pay', 'x'), (9, 2, 'Created', 'Paid', 'Pay', 'x ')",
    )
    .await;
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_transitions WHERE order_id = 9 AND ref_id = 'x'")
            .await,
        1
    );
}

/// A stored version at `i64::MAX` cannot move: the next version does not exist. Every
/// policy answers `CorruptState` (never the database's overflow error) and writes
/// nothing; `get` says the same.
pub async fn version_at_its_limit_is_corrupt_state<B: Backend>(b: &B) {
    for (id, policy) in [(1, ReadFirst::Never), (2, ReadFirst::Always)] {
        let e: Eng<B> = with_policy(b.store(Duration::from_secs(10)).await, policy);
        e.create(id).await.unwrap();
        b.exec(&format!(
            "UPDATE orders SET version = {} WHERE id = {id}",
            i64::MAX
        ))
        .await;
        let err = e.transition(id, Pay, "p-1").await.unwrap_err();
        assert!(
            matches!(err, Error::CorruptState { order_id, .. } if order_id == id),
            "{policy:?}: {err:?}"
        );
        assert!(matches!(e.get(id).await, Err(Error::CorruptState { .. })));
        assert_eq!(
            b.scalar(&format!("SELECT version FROM orders WHERE id = {id}"))
                .await,
            i64::MAX
        );
        assert_eq!(
            b.scalar(&format!(
                "SELECT COUNT(*) FROM orderly_transitions WHERE order_id = {id}"
            ))
            .await,
            0
        );
    }
}
