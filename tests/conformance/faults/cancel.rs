//! Calls dropped at every await point and a database gone silent: the pool clean, its
//! connections warm, every answer within the deadline.

#[allow(unused_imports)]
use super::*;

/// Every kind of call dropped at every await point it reaches (k = 0, 1, 2, … polls,
/// until it completes), on a pool of one connection so that a connection handed back
/// dirty is certainly the next caller's. After each drop, an order is created through
/// the same engine and must be visible to another connection; afterwards the pool is
/// full and idle, no session on the server sits in a transaction, and every request
/// re-sent is answered as its history says.
pub async fn cancelled_calls_leave_the_pool_clean<B: Backend>(b: &B) {
    for policy in [ReadFirst::Never, ReadFirst::Always] {
        let store = b.small_store(1).await;
        let e: Eng<B> = with_policy(store.clone(), policy);
        let base = if policy == ReadFirst::Never {
            0
        } else {
            100_000
        };
        let next_id = AtomicUsize::new(base);
        let fresh = || next_id.fetch_add(1, Ordering::Relaxed) as i64;
        let mut dropped = HashMap::new();
        let mut touched = Vec::new();
        // (kind, the call): each returns its result, or None when dropped.
        for kind in [
            "new", "replay", "conflict", "create", "get", "history", "in_tx",
        ] {
            let (mut k, mut restarts) = (0, 0);
            while k < 200 {
                let id = fresh();
                e.create(id).await.unwrap();
                if kind != "new" && kind != "create" && kind != "in_tx" {
                    e.transition(id, Pay, "p-1").await.unwrap();
                }
                let done = match kind {
                    "new" => poll_at_most(e.transition(id, Pay, "p-1").into_future(), k)
                        .await
                        .map(|r| {
                            assert_eq!(r.unwrap(), applied(Created, Paid, 1));
                        }),
                    "replay" => poll_at_most(e.transition(id, Pay, "p-1").into_future(), k)
                        .await
                        .map(|r| {
                            assert_eq!(r.unwrap(), replayed(Created, Paid, 1));
                        }),
                    "conflict" => poll_at_most(e.transition(id, Pay, "p-2").into_future(), k)
                        .await
                        .map(|r| {
                            assert!(matches!(r, Err(Error::RefConflict { .. })), "{r:?}");
                        }),
                    "create" => poll_at_most(e.create(id + 50_000).into_future(), k)
                        .await
                        .map(|r| assert_eq!(r.unwrap().version, 0)),
                    "get" => poll_at_most(e.get(id), k).await.map(|r| {
                        r.unwrap();
                    }),
                    "history" => poll_at_most(e.history(id), k).await.map(|r| {
                        r.unwrap();
                    }),
                    _ => {
                        // The caller's transaction on a connection of its own. After a
                        // dropped call that connection is in whatever state the driver
                        // left it (sqlx's MySQL driver can hang on it, holding its locks),
                        // so the caller closes it, as `TransitionRequest::within`'s docs say; only a
                        // completed call is committed.
                        let mut conn = store.acquire().await.unwrap();
                        let mut tx = B::begin_on(&mut conn).await;
                        let request = e.transition(id, Pay, "p-1").within(&mut tx);
                        let done = poll_at_most(request.into_future(), k)
                            .await
                            .map(|r| assert_eq!(r.unwrap(), applied(Created, Paid, 1)));
                        if done.is_some() {
                            B::commit_on(tx).await;
                        } else {
                            drop(tx);
                            <B::S as Store>::discard(conn);
                        }
                        done
                    }
                };
                touched.push(id);
                // Whatever was dropped, the engine's next write is committed and visible.
                let probe = fresh();
                e.create(probe).await.unwrap();
                assert_eq!(
                    b.scalar(&format!("SELECT COUNT(*) FROM orders WHERE id = {probe}"))
                        .await,
                    1,
                    "{kind} dropped after {k} polls: a create through the same pool was acknowledged but not committed"
                );
                if done.is_some() {
                    // Loopback can answer a whole call within one poll now and then, and
                    // SQLite's worker thread can answer a read within the poll that sent
                    // it, many times in a row on a loaded machine: sweep again until this
                    // kind was dropped at least once.
                    if !dropped.contains_key(kind) && restarts < 2_000 {
                        (k, restarts) = (0, restarts + 1);
                        continue;
                    }
                    break;
                }
                *dropped.entry(kind).or_insert(0) += 1;
                k += 1;
            }
        }
        assert_eq!(
            dropped.len(),
            7,
            "some kind of call was never dropped, so the test shows nothing for it: {dropped:?}"
        );
        assert_pool_clean(b, &store).await;
        // Every request re-sent is answered as the history says; nothing is half-done.
        for id in touched {
            let history = e.history(id).await.unwrap();
            let order = e.get(id).await.unwrap();
            assert_eq!(order.version as usize, history.len(), "order {id}");
            assert!(history.len() <= 1, "order {id}: {history:?}");
            let again = e.transition(id, Pay, "p-1").await.unwrap();
            match history.first() {
                Some(row) if row.ref_id == "p-1" => {
                    assert_eq!(again, replayed(Created, Paid, 1), "order {id}")
                }
                _ => assert_eq!(again, applied(Created, Paid, 1), "order {id}"),
            }
        }
    }
}

/// The database stops answering (a proxy freezes: a dead node, a cut network) under 16
/// concurrent calls on a pool of 4. Every call is answered within its deadline (plus
/// scheduling slack), with an error that says what happened and is retryable:
/// `Unavailable` for a call that never got a connection, `DeadlineExceeded` for one
/// whose statement went unanswered, never `Contention`. Once the database answers
/// again, every request re-sent is answered as the history says.
pub async fn dead_database_answers_within_the_deadline<B: Networked>(b: &B) {
    const CALLS: i64 = 16;
    let deadline = Duration::from_millis(500);
    let direct = engine(b).await;
    for id in 0..=CALLS {
        direct.create(id).await.unwrap();
    }
    let proxy =
        crate::server::Proxy::start(b.server(), Cut::Request(b"no request holds this")).await;
    let config = config(ReadFirst::Never).deadline(deadline);
    let e: Eng<B> = Engine::with_config(b.store_at(proxy.port, 4).await, config).unwrap();
    assert!(e.transition(0, Pay, "p-0").await.unwrap().is_applied());
    proxy.freeze();
    let calls: Vec<_> = (1..=CALLS)
        .map(|id| {
            let e = e.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let answer = e.transition(id, Pay, "p-1").await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let mut unavailable = 0;
    for call in calls {
        let (answer, took) = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("a call on a dead database was not answered within 20 s")
            .unwrap();
        assert!(
            took < deadline * 4,
            "answered after {took:?}, past the deadline of {deadline:?}"
        );
        let err = answer.unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        match err {
            Error::Unavailable { .. } => unavailable += 1,
            Error::DeadlineExceeded { .. } => {}
            other => panic!("a dead database answered {other:?}"),
        }
    }
    assert!(
        unavailable >= CALLS - 4,
        "only {unavailable} of {CALLS} calls, most of them without a connection, said the database was unavailable"
    );
    proxy.thaw();
    for id in 1..=CALLS {
        let again = direct.transition(id, Pay, "p-1").await.unwrap();
        assert_eq!(again.version(), 1, "order {id}");
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// Transitions dropped by their callers in the middle of their conversation with the
/// database (after 1 or 2 pending polls: a client timeout) are finished off the
/// caller's task: on a pool of one connection through a proxy that counts connections,
/// dropped calls do not make the pool reconnect, every dropped request is applied at
/// most once, and the connection is never handed on inside a transaction nobody began (the
/// next call's write is committed and visible elsewhere).
pub async fn cancelled_calls_return_their_connection_warm<B: Networked>(b: &B) {
    let direct = engine(b).await;
    let proxy =
        crate::server::Proxy::start(b.server(), Cut::Request(b"no request holds this")).await;
    let store = b.store_at(proxy.port, 1).await;
    let e: Eng<B> = with_policy(store.clone(), ReadFirst::Never);
    direct.create(0).await.unwrap();
    assert!(e.transition(0, Pay, "p-0").await.unwrap().is_applied());
    let opened = proxy.accepted();
    let (mut dropped, mut sent) = (0, 0);
    // Until 30 calls were dropped mid-conversation (loopback answers some within a poll).
    while dropped < 30 && sent < 300 {
        sent += 1;
        let id = sent;
        direct.create(id).await.unwrap();
        let k = 1 + (id as usize) % 2;
        if poll_at_most(e.transition(id, Pay, "p-1").into_future(), k)
            .await
            .is_none()
        {
            dropped += 1;
        }
        // The next caller's write commits: the connection it got was in no transaction.
        let probe = 10_000 + id;
        e.create(probe).await.unwrap();
        assert_eq!(
            b.scalar(&format!("SELECT COUNT(*) FROM orders WHERE id = {probe}"))
                .await,
            1,
            "after order {id}: an acknowledged create was not committed"
        );
    }
    assert!(
        dropped >= 30,
        "only {dropped} of {sent} calls were dropped mid-conversation: the test shows little"
    );
    // A drop can still land in the pool's own check of an idle connection (sqlx pings it
    // before handing it out, and closes it if that is cut short): that is the driver's,
    // and rare. Closing every dropped call's connection would reconnect once per drop.
    let reconnects = proxy.accepted() - opened;
    assert!(
        reconnects * 4 <= dropped,
        "{reconnects} reconnects for {dropped} dropped calls: dropped calls close their connections"
    );
    assert_pool_clean(b, &store).await;
    // Re-sent, every request is answered as the history says: `Replayed` where the
    // dropped call's unit was finished, `Applied` where it was dropped before it got a
    // connection; never twice.
    for id in 1..=sent {
        let again = direct.transition(id, Pay, "p-1").await.unwrap();
        assert_eq!(again.version(), 1, "order {id}");
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}
