//! Connections lost and writes in doubt: a commit read back, a re-sent request replayed,
//! a late write applied, killed sessions retryable, the caller's transaction cut at each
//! statement.

#[allow(unused_imports)]
use super::*;

/// A connection cut right after the server committed a transition (the proxy drops the
/// reply): the caller is answered `Applied`, read back by the request's identity, and a
/// re-send is `Replayed`. When nothing can be read back either (the proxy refuses new
/// connections), the answer is `InDoubt`, retryable, and the re-send is `Replayed`.
pub async fn in_doubt_commit_is_read_back<B: Networked>(b: &B) {
    let direct = engine(b).await;
    for (n, policy) in [ReadFirst::Never, ReadFirst::Always]
        .into_iter()
        .enumerate()
    {
        let id = 10 * n as i64;
        direct.create(id).await.unwrap();
        let proxy = crate::server::Proxy::start(b.server(), B::CUT).await;
        let e: Eng<B> = with_policy(b.store_at(proxy.port, 4).await, policy);
        let answer = e.transition(id, Pay, "p-1").await;
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        assert_eq!(answer.unwrap(), applied(Created, Paid, 1), "{policy:?}");
        assert_eq!(
            e.transition(id, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
        assert_order(&direct, id, Paid, 1, 1).await;

        // Nothing can be read back: in doubt, safe to re-send.
        let id = id + 1;
        direct.create(id).await.unwrap();
        let proxy = crate::server::Proxy::start(b.server(), B::CUT).await;
        proxy.refuse_after_cut();
        let config = config(policy).in_doubt_timeout(Duration::from_millis(500));
        // One connection, so none opened before the cut is left to read with.
        let store = b.store_at(proxy.port, 1).await;
        let e: Eng<B> = Engine::with_config(store, config).unwrap();
        let answer = e.transition(id, Pay, "p-1").await;
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        let err = answer.unwrap_err();
        assert!(
            matches!(err, Error::InDoubt { order_id, ref ref_id, .. } if order_id == id && ref_id == "p-1"),
            "{err:?}"
        );
        assert!(err.is_retryable());
        assert_eq!(
            direct.transition(id, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// A request applied long ago is re-sent and tried write-first (the engine does not read
/// first); the connection dies under that write. The read-back finds the request's
/// history row, written by the first call and not by this one: the answer is `Replayed`,
/// never `Applied` (a caller that ships on `Applied` would ship twice). The first call's
/// own lost acknowledgement is still `Applied` (`in_doubt_commit_is_read_back`).
pub async fn resent_request_cut_under_its_write_is_replayed<B: Networked>(b: &B) {
    let direct = engine(b).await;
    for (id, policy) in [(1, ReadFirst::Never), (2, ReadFirst::Adaptive)] {
        direct.create(id).await.unwrap();
        assert_eq!(
            direct.transition(id, Pay, "p-1").await.unwrap(),
            applied(Created, Paid, 1)
        );
        let proxy = crate::server::Proxy::start(b.server(), B::WRITE_CUT).await;
        // A fresh engine: an adaptive one starts by writing first.
        let e: Eng<B> = with_policy(b.store_at(proxy.port, 2).await, policy);
        let answer = e.transition(id, Pay, "p-1").await;
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        assert_eq!(answer.unwrap(), replayed(Created, Paid, 1), "{policy:?}");
        assert_order(&direct, id, Paid, 1, 1).await;
    }
}

/// The connection dies right after a write-first statement was sent, while that
/// statement waits on a row lock: the read-back finds nothing yet, the next attempt waits
/// behind the orphaned statement, which then commits. The next attempt finds the row the
/// orphan wrote, which carries this call's write id: the answer is `Applied` (this call's
/// own write), never `Replayed` (which would tell the caller nothing was written).
pub async fn own_write_landing_late_is_applied<B: Networked>(b: &B) {
    let direct = engine(b).await;
    direct.create(1).await.unwrap();
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let proxy = crate::server::Proxy::start(b.server(), Cut::Forward(B::WRITE_PATTERN)).await;
    let e: Eng<B> = with_policy(b.store_at(proxy.port, 2).await, ReadFirst::Never);
    let call = tokio::spawn(async move { e.transition(1, Pay, "p-1").await });
    // The cut, the read-back (nothing recorded yet) and the next attempt, waiting on the
    // lock behind the orphaned statement.
    assert!(
        crate::server::eventually(Duration::from_secs(10), || async { proxy.cuts() == 1 }).await,
        "the proxy never cut: the test shows nothing"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    B::rollback(holder).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("no answer")
        .unwrap();
    assert_eq!(answer.unwrap(), applied(Created, Paid, 1));
    assert_order(&direct, 1, Paid, 1, 1).await;
}

/// Transitions under load while another connection kills the engine's sessions. The
/// engine gets one attempt per request, so a killed connection reaches the caller: every
/// such error is retryable, and re-sending every request afterwards is answered as its
/// history says (`Replayed` where a killed call had in fact committed).
pub async fn killed_connections_are_retryable<B: Networked>(b: &B) {
    const ORDERS: i64 = 400;
    const TASKS: usize = 8;
    // Most kills land on a connection between statements, which the pool replaces
    // unseen: rounds of load over fresh orders go on until a kill has reached a caller.
    const ROUNDS: i64 = 10;
    let direct = engine(b).await;
    let config = config(ReadFirst::Adaptive).max_attempts(1);
    let store = b.store_at(b.server().port(), 8).await;
    let e: Eng<B> = Engine::with_config(store, config).unwrap();
    let (mut kills, mut errors, mut rounds) = (0, 0, 0);
    let mut answers = Vec::new();
    while errors == 0 && rounds < ROUNDS {
        let first = rounds * ORDERS;
        rounds += 1;
        for id in first..first + ORDERS {
            direct.create(id).await.unwrap();
        }
        let next = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (e, next) = (e.clone(), next.clone());
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= 3 * ORDERS as usize {
                            return answers;
                        }
                        // Each order: Pay p-1, then Pay p-1 again, then Ship s-1.
                        let id = first + (i % ORDERS as usize) as i64;
                        let (event, r) = match i / ORDERS as usize {
                            2 => (Ship, "s-1"),
                            _ => (Pay, "p-1"),
                        };
                        answers.push((id, event, r, e.transition(id, event, r).await));
                    }
                })
            })
            .collect();
        while !tasks.iter().all(|t| t.is_finished()) {
            kills += b.kill_sessions().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for t in tasks {
            for (id, event, r, answer) in t.await.unwrap() {
                match &answer {
                    Ok(_) | Err(Error::InvalidTransition { .. }) => {}
                    Err(err) => {
                        errors += 1;
                        assert!(
                            err.is_retryable(),
                            "order {id} {event:?} {r}: a killed connection answered \
                             do-not-retry: {err:?}"
                        );
                    }
                }
                answers.push((id, event, r, answer));
            }
        }
    }
    assert!(kills > 0, "no session was killed");
    assert!(
        errors > 0,
        "{kills} kills in {rounds} rounds never reached a caller: the test shows nothing"
    );
    // Re-send everything in order: the history decides every answer, and of all the
    // answers one request got (the load's and the re-send's), at most one is `Applied`:
    // a killed call whose write had committed is `Replayed` when re-sent, and a re-send
    // cut under its write is `Replayed` too.
    for id in 0..rounds * ORDERS {
        let pay = direct.transition(id, Pay, "p-1").await;
        assert_eq!(pay.as_ref().unwrap().version(), 1, "order {id}");
        answers.push((id, Pay, "p-1", pay));
        let ship = direct.transition(id, Ship, "s-1").await;
        assert_eq!(ship.as_ref().unwrap().version(), 2, "order {id}");
        answers.push((id, Ship, "s-1", ship));
        assert_order(&direct, id, Shipped, 2, 2).await;
    }
    let mut applied_per_request: HashMap<(i64, &str), usize> = HashMap::new();
    for (id, _, r, answer) in &answers {
        if matches!(answer, Ok(o) if o.is_applied()) {
            *applied_per_request.entry((*id, *r)).or_default() += 1;
        }
    }
    for ((id, r), n) in applied_per_request {
        assert_eq!(n, 1, "order {id} {r}: {n} calls were told Applied");
    }
    // Every `Applied` the load was told is one recorded row.
    for (id, event, _, answer) in answers {
        if let Ok(Outcome::Applied { version, .. }) = answer {
            let h = direct.history(id).await.unwrap();
            assert_eq!(h[version as usize - 1].event, event, "order {id}");
        }
    }
}

/// A request inside a caller's transaction, on a connection cut at each of the
/// statements its unit sends there (`cuts`: a name, where the proxy cuts, before the
/// statement reaches the server or right after, and the request): a new request
/// (`Block`, "b-2"), or one recorded before on a cycle that brought the ticket back to
/// its source state (`Block`, "b-1", whose unit writes, is refused by the history's
/// unique key and restores what it wrote). The server rolls the caller's transaction
/// back with its connection: the call is answered with a retryable error, the ticket is
/// as it was, and the request re-sent is answered as the history says.
pub async fn caller_transaction_cut_at_each_statement<B: Networked>(
    b: &B,
    cuts: &[(&'static str, Cut, &'static str)],
) {
    use TicketEvent::*;
    use TicketState::*;
    let direct: Engine<TicketMachine, B::S> =
        with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never);
    for (id, &(what, cut, reference)) in (1..).zip(cuts) {
        direct.create(id).await.unwrap();
        direct.transition(id, Start, "s").await.unwrap();
        direct.transition(id, Block, "b-1").await.unwrap();
        direct.transition(id, Unblock, "u-1").await.unwrap();
        // A connection of its own, so that every statement's text goes out (prepared on
        // the connection's first use of it).
        let proxy = crate::server::Proxy::start(b.server(), cut).await;
        let store = b.store_at(proxy.port, 1).await;
        let e: Engine<TicketMachine, B::S> = with_policy(store.clone(), ReadFirst::Never);
        let mut conn = store.acquire().await.unwrap();
        let answer = {
            let mut tx = B::begin_on(&mut conn).await;
            tokio::time::timeout(
                Duration::from_secs(20),
                e.transition(id, Block, reference).within(&mut tx),
            )
            .await
            .expect("no answer")
        };
        let case = format!("cut {what}, request {reference}");
        assert_eq!(
            proxy.cuts(),
            1,
            "{case}: the proxy never cut, the test shows nothing"
        );
        let error = answer.expect_err(&case);
        assert!(error.is_retryable(), "{case}: {error:?}");
        <B::S as Store>::discard(conn);
        // The server rolls back the dead connection's transaction.
        let as_it_was = eventually(Duration::from_secs(5), || async {
            let t = direct.get(id).await.unwrap();
            (t.state, t.version) == (Working, 3)
        })
        .await;
        assert!(as_it_was, "{case}: {:?}", direct.get(id).await);
        assert_eq!(direct.history(id).await.unwrap().len(), 3, "{case}");
        let again = direct.transition(id, Block, reference).await.unwrap();
        let expected = if reference == "b-1" {
            Outcome::Replayed {
                from: Working,
                to: Blocked,
                version: 2,
            }
        } else {
            Outcome::Applied {
                from: Working,
                to: Blocked,
                version: 4,
            }
        };
        assert_eq!(again, expected, "{case}");
    }
}

/// PostgreSQL writes a lone caller's units on a connection kept out of the pool between
/// them. Right after a unit it stays out of the pool (longer than sqlx's test of
/// a connection given back would take), and it goes back after a moment with no unit.
/// Killed while kept, the next call is still answered right (the connection, kept
/// longer than 1 ms, is tested before the unit and closed). The
/// idempotency records' statements go on the same connection, which is tested before
/// each of their conversations as the pool tests its own: killed while kept, the next
/// completion still lands. A pool of one is never starved by it: the application's own
/// query gets the connection.
pub async fn a_kept_connection_goes_back_and_dies_harmlessly<B: Networked>(b: &B) {
    let direct = engine(b).await;
    for id in 1..=6 {
        direct.create(id).await.unwrap();
    }
    let store = b.store_at(b.server().port(), 4).await;
    let e: Eng<B> = with_policy(store.clone(), ReadFirst::Never);
    let back = || async {
        let (size, idle) = B::pool_counts(&store);
        size as usize == idle
    };
    // The first unit may find no connection idle yet (the pool's one is being tested on
    // its way back): it goes through the pool.
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert!(eventually(Duration::from_secs(5), back).await);
    let mut longest = Duration::ZERO;
    for id in [2, 3] {
        assert_eq!(
            e.transition(id, Pay, "p-1").await.unwrap(),
            applied(Created, Paid, 1)
        );
        let start = std::time::Instant::now();
        while !back().await && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            back().await,
            "the kept connection never went back to the pool"
        );
        longest = longest.max(start.elapsed());
    }
    assert!(
        longest >= Duration::from_millis(15),
        "the unit's connection was back in the pool after {longest:?}: it was never kept"
    );

    // Killed while kept: the call after it fails on it, and is answered right.
    assert_eq!(
        e.transition(4, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert!(b.kill_sessions().await >= 1, "no session to kill");
    assert_eq!(
        e.transition(5, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert_order(&direct, 5, Paid, 1, 1).await;
    assert_pool_clean(b, &store).await;

    // The idempotency records' statements go on it too: a claim's connection stays out
    // of the pool after the claim, and goes back.
    let records = orderly::Records::new(store.clone())
        .scope(
            "kept",
            orderly::ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    let mut longest = Duration::ZERO;
    for key in ["k-1", "k-2"] {
        assert!(eventually(Duration::from_secs(5), back).await);
        let claim = records.claim("kept", key, &1).await.unwrap();
        assert!(matches!(claim, orderly::Claim::Claimed(_)), "{claim:?}");
        let start = std::time::Instant::now();
        while !back().await && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        longest = longest.max(start.elapsed());
    }
    assert!(
        longest >= Duration::from_millis(15),
        "the claim's connection was back in the pool after {longest:?}: it was never kept"
    );
    // Killed while kept: the pool's test of the connections it hands out
    // (`test_before_acquire`, on by default) applies to the kept one, so the next
    // conversation goes on a live connection. The server ends the kept session itself
    // (PostgreSQL's `idle_session_timeout`, set on it for its last conversation), well
    // within the 10 to 20 ms before the reaper would give it back to the pool, whose own
    // test would then close it; a round counts only if it was still kept then.
    let mut killed_while_kept = 0;
    for _ in 0..5 {
        let mut conn = Store::acquire(&store).await.unwrap();
        Store::run_sql(&store, &mut conn, "SET idle_session_timeout = 2".into())
            .await
            .unwrap();
        Store::give_back(&store, conn);
        tokio::time::sleep(Duration::from_millis(6)).await;
        let (size, idle) = B::pool_counts(&store);
        killed_while_kept += usize::from(size as usize > idle);
        let mut conn = Store::acquire(&store).await.unwrap();
        Store::run_sql(&store, &mut conn, "SELECT 1".into())
            .await
            .expect("the store handed out the killed connection");
        Store::give_back(&store, conn);
        assert!(eventually(Duration::from_secs(5), back).await);
    }
    assert!(
        killed_while_kept > 0,
        "in no round was the connection still kept when it died: the test shows nothing"
    );
    let orderly::Claim::Claimed(held) = records.claim("kept", "k-3", &1).await.unwrap() else {
        panic!("k-3 was not granted");
    };
    // (The records' claims and completions would also survive a statement failed on a
    // lost connection: each reads the record back, on another connection.)
    let claim = records.claim("kept", "k-4", &1).await.unwrap();
    assert!(matches!(claim, orderly::Claim::Claimed(_)), "{claim:?}");
    records.complete(&held, &"done").await.unwrap();
    assert_eq!(
        records.claim("kept", "k-3", &1).await.unwrap(),
        orderly::Claim::Replayed(orderly::Stored::Succeeded(r#""done""#.into()))
    );
    assert_pool_clean(b, &store).await;

    // A pool of one: the application's own queries are not starved.
    let store = b.store_at(b.server().port(), 1).await;
    let e: Eng<B> = with_policy(store.clone(), ReadFirst::Never);
    assert_eq!(
        e.transition(6, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    for _ in 0..3 {
        let own = tokio::time::timeout(Duration::from_secs(1), Store::acquire(&store)).await;
        assert!(
            own.is_ok_and(|c| c.is_ok()),
            "the application's query was starved"
        );
        assert_eq!(
            e.transition(6, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
    }
}
