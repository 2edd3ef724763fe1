//! Coalesced writes: new requests that arrive while a write is in flight go together in
//! the next write unit, and each is answered exactly as if it had gone alone. Every body
//! here checks that batches did form (`Engine::coalesced_writes`) on a store that
//! batches writes, so that a run where they never did cannot pass for one where they
//! did.

use std::collections::HashMap;
use std::time::Duration;

use orderly::store::{FirstWrite, Key, Request, Store};
use orderly::{Engine, EngineConfig, Error, Outcome, ReadFirst};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::faults::Networked;
use super::{Backend, Eng, OrderEvent::*, OrderState::*, applied, assert_order, replayed};

/// An engine that always tries to apply first, so that every new request meets the
/// coalescer.
async fn writer<B: Backend>(b: &B) -> Eng<B> {
    super::with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never)
}

/// Asserts that the engine coalesced at least one unit, on a store that batches writes.
fn assert_coalesced<B: Backend>(e: &Eng<B>, what: &str) {
    let coalesced = e.coalesced_writes();
    if e.store().batches_writes() {
        assert!(
            coalesced.units > 0,
            "{what}: no write unit carried several requests ({coalesced:?}): the test shows nothing"
        );
        assert_eq!(
            coalesced.failed, 0,
            "{what}: units failed and their requests went alone ({coalesced:?})"
        );
    } else {
        assert_eq!(coalesced.units, 0, "{what}: a store that does not batch");
    }
}

/// Twins of one request and requests of other entities, all at once: per entity one
/// `Applied`, its twins `Replayed` with the same version, one history row.
pub async fn coalesced_writes_answer_each_request<B: Backend>(b: &B) {
    const ENTITIES: i64 = 24;
    const TWINS: usize = 3;
    let e = writer(b).await;
    for round in 0..5_i64 {
        let ids: Vec<i64> = (0..ENTITIES).map(|i| 1000 * round + i).collect();
        for id in &ids {
            e.create(*id).await.unwrap();
        }
        let calls: Vec<_> = ids
            .iter()
            .flat_map(|id| std::iter::repeat_n(*id, TWINS))
            .map(|id| {
                let e = e.clone();
                tokio::spawn(async move { (id, e.transition(id, Pay, "pay").await) })
            })
            .collect();
        let mut answers: HashMap<i64, Vec<Outcome<_>>> = HashMap::new();
        for call in calls {
            let (id, answer) = call.await.unwrap();
            answers.entry(id).or_default().push(answer.unwrap());
        }
        for id in ids {
            let mine = &answers[&id];
            let applied_ones = mine.iter().filter(|o| o.is_applied()).count();
            assert_eq!(applied_ones, 1, "order {id}: {mine:?}");
            for outcome in mine {
                assert!(
                    *outcome == applied(Created, Paid, 1) || *outcome == replayed(Created, Paid, 1),
                    "order {id}: {outcome:?}"
                );
            }
            assert_order(&e, id, Paid, 1, 1).await;
        }
        // Pay emits OrderPaid: one outbox row per entity, at version 1, with its request.
        let emitted = b
            .scalar(&format!(
                "SELECT COUNT(*) FROM orderly_outbox WHERE machine = 'OrderMachine' AND event = 'OrderPaid' \
                 AND version = 1 AND transition = 'Pay' AND ref_id = 'pay' \
                 AND entity_id BETWEEN {} AND {}",
                1000 * round,
                1000 * round + ENTITIES - 1
            ))
            .await;
        assert_eq!(emitted, ENTITIES, "outbox rows of round {round}");
        if e.coalesced_writes().units > 0 {
            break;
        }
    }
    assert_coalesced::<B>(&e, "twins");
}

/// A request whose write fails in its unit (its entity's version reused behind orderly's
/// back, so its history row meets the primary key) leaves the unit's other requests
/// applied: on the store's unit directly, and through the engine with many callers.
pub async fn a_failing_request_leaves_its_unit_true<B: Backend>(b: &B) {
    let e = writer(b).await;
    let poison = |id: i64| {
        format!(
            "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) \
             VALUES ({id}, 1, 'Created', 'Refunded', 'Refund', 'ghost')"
        )
    };
    for id in 1..=3 {
        e.create(id).await.unwrap();
    }
    b.exec(&poison(2)).await;
    let request = |order_id| Request {
        key: Key {
            order_id,
            event: "Pay",
            ref_id: "pay",
        },
        from_states: &["Created"],
        to_states: &["Paid"],
        payload_hash: None,
        payload: None,
        write_id: order_id,
        audit: Default::default(),
        emits: &[Some("OrderPaid")],
        machine: "OrderMachine",
        event_body: Some("{\"paid\":true}"),
        trace: None,
    };
    let store = e.store();
    let mut conn = store.acquire().await.unwrap();
    let written = store
        .apply_first(&mut conn, &[request(1), request(2), request(3)])
        .await
        .unwrap();
    drop(conn);
    let moved = FirstWrite::Applied {
        from: "Created".into(),
        to: "Paid".into(),
        version: 1,
    };
    assert_eq!(written, vec![moved.clone(), FirstWrite::NotApplied, moved]);
    assert_order(&e, 1, Paid, 1, 1).await;
    assert_order(&e, 3, Paid, 1, 1).await;
    let two = e.get(2).await.unwrap();
    assert_eq!(
        (two.state, two.version),
        (Created, 0),
        "the failed request moved it"
    );
    // A unit with no failing request, whose edges emit: every request's outbox row.
    for id in 4..=6 {
        e.create(id).await.unwrap();
    }
    let mut conn = store.acquire().await.unwrap();
    let written = store
        .apply_first(&mut conn, &[request(4), request(5), request(6)])
        .await
        .unwrap();
    drop(conn);
    let moved = FirstWrite::Applied {
        from: "Created".into(),
        to: "Paid".into(),
        version: 1,
    };
    assert_eq!(written, vec![moved.clone(), moved.clone(), moved]);
    let outbox = |ids: &str| {
        format!(
            "SELECT COUNT(*) FROM orderly_outbox WHERE machine = 'OrderMachine' AND event = 'OrderPaid' \
             AND transition = 'Pay' AND version = 1 AND ref_id = 'pay' AND from_status = 'Created' \
             AND to_status = 'Paid' AND body = '{{\"paid\":true}}' AND entity_id IN ({ids})"
        )
    };
    assert_eq!(b.scalar(&outbox("1, 3, 4, 5, 6")).await, 5);
    assert_eq!(
        b.scalar(&outbox("2")).await,
        0,
        "the failed request's event"
    );

    // Through the engine: every round has one poisoned entity among 31 sound ones.
    let config = EngineConfig::default()
        .max_attempts(2)
        .read_first(ReadFirst::Never);
    let e: Eng<B> = Engine::with_config(b.store(Duration::from_secs(10)).await, config).unwrap();
    for round in 1..=5_i64 {
        let ids: Vec<i64> = (0..32).map(|i| 100 * round + i).collect();
        for id in &ids {
            e.create(*id).await.unwrap();
        }
        let poisoned = 100 * round + 16;
        b.exec(&poison(poisoned)).await;
        let calls: Vec<_> = ids
            .iter()
            .map(|&id| {
                let e = e.clone();
                tokio::spawn(async move { (id, e.transition(id, Pay, "pay").await) })
            })
            .collect();
        for call in calls {
            let (id, answer) = call.await.unwrap();
            if id == poisoned {
                assert!(
                    !matches!(answer, Ok(Outcome::Applied { .. })),
                    "the poisoned order {id} answered {answer:?}"
                );
                let order = e.get(id).await.unwrap();
                assert_eq!((order.state, order.version), (Created, 0), "order {id}");
            } else {
                assert_eq!(answer.unwrap(), applied(Created, Paid, 1), "order {id}");
                assert_order(&e, id, Paid, 1, 1).await;
            }
        }
        if e.coalesced_writes().units > 0 {
            break;
        }
    }
    assert_coalesced::<B>(&e, "a poisoned request among others");
}

/// The store's apply-first unit of one request and of three, its future dropped at every
/// await point, and then, 120 times each, dropped at a random moment after its first poll
/// (up to 400 µs to start with, longer while no drop lands after the commit), while the
/// database works through the unit (the connection then
/// discarded, as the engine's lease does): the unit wrote all of its requests or none,
/// nothing is left holding a lock, and the requests sent again are answered as the
/// database then holds them (`Applied` where the dropped unit wrote nothing,
/// `NotApplied` where it committed); each entity moved once, with one history row and
/// one outbox row. Both endings happened.
pub async fn apply_first_unit_dropped_at_every_await_point<B: Backend>(b: &B) {
    let e = writer(b).await;
    let store = e.store().clone();
    let request = |order_id: i64| Request {
        key: Key {
            order_id,
            event: "Pay",
            ref_id: "pay",
        },
        from_states: &["Created"],
        to_states: &["Paid"],
        payload_hash: None,
        payload: None,
        write_id: order_id,
        audit: Default::default(),
        emits: &[Some("OrderPaid")],
        machine: "OrderMachine",
        event_body: Some("{\"paid\":true}"),
        trace: None,
    };
    let moved = FirstWrite::Applied {
        from: "Created".into(),
        to: "Paid".into(),
        version: 1,
    };
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[9; 32]);
    let (mut undone, mut committed) = (0, 0);
    let mut next_id = 0_i64;
    // The random pauses reach up to `most` µs: doubled after ten drops that all landed
    // before the commit (a unit that takes longer, as on a Galera node), halved after
    // ten that all landed after it.
    let mut most: u64 = 400;
    for size in [1_i64, 3] {
        let (mut drops, mut committed_here, mut sweeps, mut turns) = (0, 0, 0, 0);
        // k < 0: the drop lands at a random moment after the first poll; k >= 0: at the
        // k-th await point that was not ready at once, until the unit completes. How many
        // await points are pending varies from run to run (a loaded machine answers later),
        // so a sweep can complete without a drop having landed on the commit's answer:
        // then the last few points are swept again (up to 40 times).
        let mut k: i64 = -121;
        loop {
            k += 1;
            turns += 1;
            if k < 0 && k % 10 == 0 {
                if committed == 0 {
                    most = (most * 2).min(200_000);
                } else if undone == 0 {
                    most = (most / 2).max(50);
                }
            }
            let ids: Vec<i64> = (0..size).map(|i| next_id + i).collect();
            next_id += size;
            for id in &ids {
                e.create(*id).await.unwrap();
            }
            let requests: Vec<Request<'_>> = ids.iter().map(|&id| request(id)).collect();
            let mut conn = store.acquire().await.unwrap();
            let answer = if k < 0 {
                let pause = Duration::from_micros(rng.next_u64() % most);
                drop_after_first_poll(store.apply_first(&mut conn, &requests), pause).await
            } else {
                super::faults::poll_at_most(store.apply_first(&mut conn, &requests), k as usize)
                    .await
            };
            let Some(answer) = answer else {
                drops += 1;
                <B::S as Store>::discard(conn);
                // Sent again on another connection (waiting, if it must, for the dropped
                // one to be closed and its transaction undone).
                let mut again = store.acquire().await.unwrap();
                let written = store.apply_first(&mut again, &requests).await.unwrap();
                drop(again);
                let first = written[0].clone();
                assert!(
                    written.iter().all(|w| *w == first),
                    "size {size}, drop {k}: the unit wrote part of its requests: {written:?}"
                );
                match first {
                    FirstWrite::Applied { .. } => {
                        assert_eq!(first, moved);
                        undone += 1;
                    }
                    FirstWrite::NotApplied => {
                        committed += 1;
                        committed_here += 1;
                    }
                    other => panic!("size {size}, drop {k}: {other:?}"),
                }
                for id in &ids {
                    assert_order(&e, *id, Paid, 1, 1).await;
                    assert_eq!(
                        b.scalar(&format!(
                            "SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = {id} AND version = 1"
                        ))
                        .await,
                        1,
                        "size {size}, drop {k}: order {id}'s outbox row"
                    );
                }
                assert!(turns < 2000, "size {size}: the unit never completed");
                continue;
            };
            drop(conn);
            if k < 0 {
                // Done before the pause ran out: nothing was dropped.
                assert_eq!(answer.unwrap(), vec![moved.clone(); size as usize]);
                continue;
            }
            assert_eq!(answer.unwrap(), vec![moved.clone(); size as usize]);
            for id in &ids {
                assert_order(&e, *id, Paid, 1, 1).await;
            }
            if committed_here == 0 && sweeps < 40 {
                sweeps += 1;
                k = (k - 4).max(0) - 1;
                continue;
            }
            break;
        }
        assert!(drops >= 1, "size {size}: the unit was never dropped");
    }
    assert!(
        undone > 0 && committed > 0,
        "the drops landed only {}: {undone} undone, {committed} committed",
        if committed == 0 {
            "before the commit"
        } else {
            "after it"
        }
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE event = 'OrderPaid'")
            .await,
        b.scalar("SELECT COUNT(*) FROM orderly_transitions WHERE event = 'Pay'")
            .await,
        "an outbox row for each history row"
    );
}

/// Polls `fut` once, then, if it is not done, lets `pause` pass without polling it (the
/// database goes on with what it was sent) and drops it. `None` if dropped.
async fn drop_after_first_poll<F: std::future::Future>(
    fut: F,
    pause: Duration,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(out) = first {
        return Some(out);
    }
    std::thread::sleep(pause);
    None
}

/// Callers that give up at every moment (while queued, while their unit is in flight,
/// after it committed): every request is applied at most once, a caller told `Applied`
/// is told `Replayed` on a re-send, and every request re-sent is answered as the
/// history says.
pub async fn callers_dropped_around_their_unit<B: Backend>(b: &B) {
    const CALLERS: i64 = 48;
    let e = writer(b).await;
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let (mut gave_up, mut answered) = (0, 0);
    // Patience up to `most` µs: 4 ms to start with, doubled after a round in which nobody
    // was answered in time (a loaded machine), halved after one in which nobody gave up;
    // six rounds, and more (up to twelve) until both have happened.
    let mut most: u64 = 4000;
    for round in 0..12_i64 {
        if round >= 6 && gave_up > 0 && answered > 0 {
            break;
        }
        let (gave_up_before, answered_before) = (gave_up, answered);
        let ids: Vec<i64> = (0..CALLERS).map(|i| 1000 * round + i).collect();
        for id in &ids {
            e.create(*id).await.unwrap();
        }
        let calls: Vec<_> = ids
            .iter()
            .map(|&id| {
                let e = e.clone();
                let patience = Duration::from_micros(rng.next_u64() % most);
                tokio::spawn(async move {
                    (
                        id,
                        tokio::time::timeout(patience, e.transition(id, Pay, "pay")).await,
                    )
                })
            })
            .collect();
        let mut first = HashMap::new();
        for call in calls {
            let (id, answer) = call.await.unwrap();
            match answer {
                Ok(answer) => {
                    answered += 1;
                    first.insert(id, answer);
                }
                Err(_) => gave_up += 1,
            }
        }
        if answered == answered_before {
            most = (most * 2).min(256_000);
        } else if gave_up == gave_up_before {
            most = (most / 2).max(500);
        }
        // What the abandoned calls were in the middle of finishes off their tasks.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for id in ids {
            let again = e.transition(id, Pay, "pay").await.unwrap();
            match first.get(&id) {
                Some(Ok(Outcome::Applied { .. })) => {
                    assert_eq!(again, replayed(Created, Paid, 1), "order {id}")
                }
                Some(Err(error)) => assert!(error.is_retryable(), "order {id}: {error:?}"),
                _ => assert!(
                    again == applied(Created, Paid, 1) || again == replayed(Created, Paid, 1),
                    "order {id}: {again:?}"
                ),
            }
            assert_order(&e, id, Paid, 1, 1).await;
        }
    }
    assert!(
        gave_up > 0 && answered > 0,
        "every caller {} : the drops did not land among the writes",
        if gave_up == 0 {
            "was answered"
        } else {
            "gave up"
        }
    );
    assert_coalesced::<B>(&e, "callers giving up");

    // Callers answered at their deadline while queued: the first request's write waits on
    // a lock a held transaction keeps (a row lock; SQLite's write lock), so the requests
    // sent after it queue behind its turn until their deadline passes. Each is told
    // nothing was sent (`Unavailable`, or `DeadlineExceeded` not in doubt), and its write
    // is never sent later, when the turn comes to its queue: its re-send applies.
    let config = EngineConfig::default()
        .deadline(Duration::from_millis(100))
        .read_first(ReadFirst::Never);
    let hurried: Eng<B> =
        Engine::with_config(b.store(Duration::from_secs(10)).await, config).unwrap();
    let ids: Vec<i64> = (0..CALLERS).map(|i| 100_000 + i).collect();
    // Created through the hurried engine's own store, so that it knows before the storm
    // whether it batches (a store learns it is on a Galera node at its first connection).
    // (Its deadline is short: on a loaded machine a create can run past it, and is sent
    // again, as a client would.)
    for id in &ids {
        let mut tries = 0;
        while let Err(e) = hurried.create(*id).await {
            tries += 1;
            assert!(e.is_retryable() && tries < 50, "create {id}: {e:?}");
        }
    }
    let mut blocker = b.begin().await;
    B::exec_in(
        &mut blocker,
        &format!("UPDATE orders SET version = version WHERE id = {}", ids[0]),
    )
    .await;
    super::until_the_pool_is_idle::<B>(hurried.store()).await;
    let first = tokio::spawn({
        let hurried = hurried.clone();
        let id = ids[0];
        async move { hurried.transition(id, Pay, "pay").await }
    });
    // The first request holds the write turn once it holds a connection (it takes the
    // turn first, and reads nothing before its write): the others are sent only then,
    // however long a loaded machine takes to get it there.
    super::until_a_connection_is_taken::<B>(hurried.store(), || first.is_finished()).await;
    let queued: Vec<_> = ids[1..]
        .iter()
        .map(|&id| {
            let hurried = hurried.clone();
            tokio::spawn(async move { (id, hurried.transition(id, Pay, "pay").await) })
        })
        .collect();
    let mut answers = Vec::new();
    for call in queued {
        answers.push(call.await.unwrap());
    }
    let first = first.await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    B::commit(blocker).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        matches!(first, Err(Error::DeadlineExceeded { .. })),
        "the blocked request answered {first:?}"
    );
    let mut not_sent = 0;
    for (id, answer) in answers {
        let again = e.transition(id, Pay, "pay").await.unwrap();
        match answer {
            Err(
                Error::Unavailable { .. }
                | Error::DeadlineExceeded {
                    in_doubt: false, ..
                },
            ) => {
                not_sent += 1;
                assert_eq!(
                    again,
                    applied(Created, Paid, 1),
                    "order {id}: told nothing was sent, but its write landed"
                );
            }
            // One that took the turn before the blocked request did (a slow start).
            Ok(Outcome::Applied { .. }) => assert_eq!(again, replayed(Created, Paid, 1)),
            Err(Error::DeadlineExceeded { in_doubt: true, .. }) => {
                assert!(again == applied(Created, Paid, 1) || again == replayed(Created, Paid, 1))
            }
            other => panic!("order {id} answered {other:?}"),
        }
        assert_order(&e, id, Paid, 1, 1).await;
    }
    if hurried.store().batches_writes() {
        assert!(
            not_sent > 0,
            "no request was left waiting behind the blocked one: the test shows nothing"
        );
    } else {
        // Nothing queues on a store that does not batch writes (a Galera node): every
        // request but the blocked one goes its own way. On a loaded machine some still
        // wait past their deadline for one of the pool's connections, and are told
        // nothing was sent; each answer is checked above against what the database holds.
        assert_eq!(
            hurried.coalesced_writes().units,
            0,
            "a store that does not batch wrote a unit of several requests"
        );
    }
    let again = e.transition(ids[0], Pay, "pay").await.unwrap();
    assert!(again == applied(Created, Paid, 1) || again == replayed(Created, Paid, 1));
}

/// The connection of a unit of several requests is cut as the unit's statement goes
/// out, or right after it reached the server (which may commit it): every request of
/// the unit is read back by its own identity and answered truly, once `Applied`.
pub async fn connection_cut_under_a_unit_answers_each_request<B: Networked>(
    b: &B,
    unit_pattern: &'static [u8],
) {
    use crate::server::{Cut, Proxy};
    let direct = writer(b).await;
    for (n, cut) in [Cut::Forward(unit_pattern), Cut::Request(unit_pattern)]
        .into_iter()
        .enumerate()
    {
        let mut cut_seen = false;
        for round in 0..5_i64 {
            let ids: Vec<i64> = (0..32)
                .map(|i| 10_000 * n as i64 + 1000 * round + i)
                .collect();
            for id in &ids {
                direct.create(*id).await.unwrap();
            }
            let proxy = Proxy::start(b.server(), cut).await;
            let e: Eng<B> = super::with_policy(b.store_at(proxy.port, 8).await, ReadFirst::Never);
            let calls: Vec<_> = ids
                .iter()
                .map(|&id| {
                    let e = e.clone();
                    tokio::spawn(async move { (id, e.transition(id, Pay, "pay").await) })
                })
                .collect();
            for call in calls {
                let (id, answer) = call.await.unwrap();
                assert_eq!(
                    answer.unwrap(),
                    applied(Created, Paid, 1),
                    "{cut:?}: order {id}"
                );
                assert_order(&direct, id, Paid, 1, 1).await;
            }
            for id in &ids {
                assert_eq!(
                    e.transition(*id, Pay, "pay").await.unwrap(),
                    replayed(Created, Paid, 1)
                );
            }
            if proxy.cuts() > 0 {
                cut_seen = true;
                break;
            }
        }
        if direct.store().batches_writes() {
            assert!(
                cut_seen,
                "{cut:?}: no unit of several requests was cut: the test shows nothing"
            );
        } else {
            // A store that does not batch writes (a Galera node) never sends a unit's
            // statement: every request was answered above on its own.
            assert!(
                !cut_seen,
                "{cut:?}: a store that does not batch sent a unit"
            );
        }
    }
}

/// Many requests for one entity at once on a cyclic graph, among requests of others:
/// at most one per entity goes in a unit, each is judged in order, and the history is a
/// path through the graph.
pub async fn one_entity_many_requests_coalesced<B: Backend>(b: &B) {
    use super::{TicketEvent, TicketState};
    const TICKETS: i64 = 4;
    let e: Engine<super::TicketMachine, B::S> =
        super::with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never);
    for id in 0..TICKETS {
        e.create(id).await.unwrap();
        e.transition(id, TicketEvent::Start, "s").await.unwrap();
    }
    let calls: Vec<_> = (0..32_u64)
        .map(|task| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for n in 0..8_u64 {
                    let id = (task % TICKETS as u64) as i64;
                    let event = if n % 2 == 0 {
                        TicketEvent::Block
                    } else {
                        TicketEvent::Unblock
                    };
                    let reference = format!("r{task}-{n}");
                    let answer = e.transition(id, event, &reference).await;
                    answers.push((id, event, reference, answer));
                }
                answers
            })
        })
        .collect();
    let mut applied_here = HashMap::new();
    for call in calls {
        for (id, event, reference, answer) in call.await.unwrap() {
            match answer {
                Ok(Outcome::Applied { from, to, version }) => {
                    applied_here.insert((id, reference), (event, from, to, version));
                }
                Ok(replay) => panic!("{id} {reference}: a new request replayed: {replay:?}"),
                Err(Error::InvalidTransition { .. } | Error::RefConflict { .. }) => {}
                Err(other) => panic!("{id} {reference}: {other:?}"),
            }
        }
    }
    let mut rows = 0;
    for id in 0..TICKETS {
        let history = e.history(id).await.unwrap();
        let mut state = TicketState::Open;
        for (i, row) in history.iter().enumerate() {
            assert_eq!((row.seq, row.from), (i as i64 + 1, state), "ticket {id}");
            state = row.to;
            if row.ref_id != "s" {
                rows += 1;
                assert_eq!(
                    applied_here.get(&(id, row.ref_id.clone())),
                    Some(&(row.event, row.from, row.to, row.seq)),
                    "ticket {id}: {row:?} not answered Applied"
                );
            }
        }
        assert_eq!(e.get(id).await.unwrap().state, state);
    }
    assert_eq!(
        rows,
        applied_here.len(),
        "an Applied answer without its row"
    );
    assert!(
        rows > TICKETS as usize,
        "too little applied to mean anything"
    );
    assert_coalesced_any(&e);
}

/// [`assert_coalesced`] for an engine of another machine.
fn assert_coalesced_any<M: orderly::StateMachine, S: Store>(e: &Engine<M, S>) {
    let coalesced = e.coalesced_writes();
    if e.store().batches_writes() {
        assert!(
            coalesced.units > 0,
            "no write unit carried several requests: the test shows nothing"
        );
        assert_eq!(coalesced.failed, 0, "units failed: {coalesced:?}");
    }
}

/// Random sets of concurrent requests (waves of up to 16 at once, over 4 tickets of a
/// graph with a cycle, with repeated references and payloads) through a coalescing
/// engine, against the reference model: each ticket's new history rows, in order, are
/// what the model applies; every `Applied` answer is one of those rows; and every other
/// answer is what the model says at some point of the wave (a request that changed
/// nothing may take effect anywhere among its ticket's rows).
pub async fn coalesced_engine_agrees_with_the_model<B: Backend>(b: &B) {
    use super::{TicketEvent, TicketMachine};
    use orderly::testing::{Model, steps};
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let e: Engine<TicketMachine, B::S> =
        super::with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never);
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&steps::<TicketMachine>(4, 3, 16..64), |seq| {
        let first_id = 1000 * (1 + case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                let ids: Vec<i64> = (0..4).map(|i| first_id + i).collect();
                for id in &ids {
                    e.create(*id).await.map_err(|e| e.to_string())?;
                }
                let mut model = Model::<TicketMachine>::new(ids.iter().copied());
                for wave in seq.chunks(16) {
                    let calls: Vec<_> = wave
                        .iter()
                        .map(|step| {
                            let (e, step) = (e.clone(), step.clone());
                            tokio::spawn(async move {
                                let id = first_id + step.order;
                                let request = e.transition(id, step.event, &step.ref_id);
                                let answer = match &step.payload {
                                    Some(p) => request.payload(p).await,
                                    None => request.await,
                                };
                                (step, answer)
                            })
                        })
                        .collect();
                    let mut answers = Vec::new();
                    for call in calls {
                        answers.push(call.await.map_err(|e| e.to_string())?);
                    }
                    check_wave(&e, first_id, &ids, &mut model, &answers).await?;
                }
                Ok::<(), String>(())
            })
        })
        .map_err(TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    assert_coalesced_any(&e);

    type Answer = (
        orderly::testing::Step<TicketEvent>,
        Result<Outcome<super::TicketState>, Error>,
    );
    async fn check_wave<S: Store>(
        e: &Engine<TicketMachine, S>,
        first_id: i64,
        ids: &[i64],
        model: &mut Model<TicketMachine>,
        answers: &[Answer],
    ) -> Result<(), String> {
        for &id in ids {
            let (_, before) = model.order(id).ok_or("the model lost a ticket")?;
            let history = e.history(id).await.map_err(|e| e.to_string())?;
            let mine: Vec<&Answer> = answers
                .iter()
                .filter(|(step, _)| first_id + step.order == id)
                .collect();
            // The model after each of the wave's rows: where a request that changed
            // nothing may have been judged.
            let mut points = vec![model.clone()];
            let mut rows = 0;
            for row in history.iter().filter(|r| r.seq > before) {
                rows += 1;
                let row_outcome = Outcome::Applied {
                    from: row.from,
                    to: row.to,
                    version: row.seq,
                };
                let ours = |(s, _): &&&Answer| s.event == row.event && s.ref_id == row.ref_id;
                // Twins of the request may be in the wave: one of them, told `Applied`
                // with the row's values, is the one that wrote it.
                let told: Vec<&&Answer> = mine
                    .iter()
                    .filter(ours)
                    .filter(|(_, a)| a.as_ref().is_ok_and(|o| o.is_applied()))
                    .collect();
                let [(step, answer)] = told[..] else {
                    return Err(format!(
                        "ticket {id}: row {row:?} answered Applied {} times",
                        told.len()
                    ));
                };
                if !matches!(answer, Ok(o) if *o == row_outcome) {
                    return Err(format!("ticket {id}: row {row:?} answered {answer:?}"));
                }
                let expected = model.apply_with_payload(
                    id,
                    step.event,
                    &step.ref_id,
                    step.payload.as_ref().map(ToString::to_string).as_deref(),
                );
                if !expected.matches(answer) {
                    return Err(format!(
                        "ticket {id}: row {row:?}, the model says {expected:?}"
                    ));
                }
                points.push(model.clone());
            }
            let applied = mine
                .iter()
                .filter(|(_, a)| a.as_ref().is_ok_and(|o| o.is_applied()))
                .count();
            if applied != rows {
                return Err(format!(
                    "ticket {id}: {applied} Applied answers, {rows} new rows"
                ));
            }
            for (step, answer) in mine
                .iter()
                .filter(|(_, a)| !a.as_ref().is_ok_and(|o| o.is_applied()))
            {
                let fits = points.iter().any(|point| {
                    let mut point = point.clone();
                    let expected = point.apply_with_payload(
                        id,
                        step.event,
                        &step.ref_id,
                        step.payload.as_ref().map(ToString::to_string).as_deref(),
                    );
                    !matches!(expected, orderly::testing::Expected::Applied { .. })
                        && expected.matches(answer)
                });
                if !fits {
                    return Err(format!(
                        "ticket {id}: {} {} answered {answer:?}, which no point of the wave gives",
                        step.event, step.ref_id
                    ));
                }
            }
        }
        // Requests for the ticket never created.
        for (step, answer) in answers
            .iter()
            .filter(|(s, _)| !ids.contains(&(first_id + s.order)))
        {
            if !matches!(answer, Err(Error::NotFound { .. })) {
                return Err(format!("missing ticket: {step:?} answered {answer:?}"));
            }
        }
        Ok(())
    }
}

/// A unit that the server commits and whose reply is cut (the client never hears), with
/// no connection to be had afterwards (the proxy refuses new ones; the pool's one
/// connection was the cut one). The cut is at the parameters of one request, so it lands
/// on the unit that carries it, a batch or a lone write. No request whose transition the
/// database holds is answered as if nothing had been sent (`Unavailable`, or a deadline
/// with nothing in doubt): each is `Applied` or in doubt.
pub async fn a_unit_cut_with_no_connection_left_is_never_unsent<B: Networked>(b: &B) {
    use crate::server::{Cut, Proxy};
    let direct = writer(b).await;
    let mut held_in_doubt = 0;
    for round in 0..10_i64 {
        // References of one length: none holds another.
        let ids: Vec<i64> = (0..16).map(|i| 1000 * (round + 1) + 100 + i).collect();
        for id in &ids {
            direct.create(*id).await.unwrap();
        }
        // The last caller's reference: likely queued behind the first, in a batch.
        let pattern: &'static [u8] = format!("pay-{}", ids[15]).into_bytes().leak();
        let proxy = Proxy::start(b.server(), Cut::ReplyTo(pattern)).await;
        proxy.refuse_after_cut();
        let config = super::config(ReadFirst::Never)
            .in_doubt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_secs(3));
        let e: Eng<B> = Engine::with_config(b.store_at(proxy.port, 1).await, config).unwrap();
        let calls: Vec<_> = ids
            .iter()
            .map(|&id| {
                let e = e.clone();
                tokio::spawn(async move { (id, e.transition(id, Pay, &format!("pay-{id}")).await) })
            })
            .collect();
        for call in calls {
            let (id, answer) = call.await.unwrap();
            let held = b
                .scalar(&format!("SELECT version FROM orders WHERE id = {id}"))
                .await
                == 1;
            if !held {
                continue;
            }
            match &answer {
                Ok(outcome) => assert_eq!(outcome, &applied(Created, Paid, 1), "order {id}"),
                Err(Error::InDoubt { .. } | Error::DeadlineExceeded { in_doubt: true, .. }) => {
                    held_in_doubt += 1;
                }
                Err(other) => panic!(
                    "order {id}: the database holds its transition, and it was answered {other:?}"
                ),
            }
        }
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        if held_in_doubt > 1 {
            break;
        }
    }
    // More than one: a batch's requests, not only a lone write's.
    assert!(
        held_in_doubt > 1,
        "no batch that the database holds was cut: the test shows nothing"
    );
}
