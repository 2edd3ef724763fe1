//! Guarded calls dropped and cut: at every await point, inside the caller's transaction
//! (at each poll, under random deadlines), and with the connection cut at each statement.

#[allow(unused_imports)]
use super::*;

/// A guarded call dropped at each of its await points, on the engine's connection and
/// inside a caller's transaction: nothing half-written (the stock went down exactly with
/// the moves), the pool clean, and each re-send answered as the history says.
pub async fn guarded_calls_dropped_at_every_await_point<B: Backend>(b: &B) {
    let stock = 5_000;
    shop_tables(b, stock).await;
    let store = b.small_store(1).await;
    let (e, _, _) = shop_engine::<B>(store.clone());
    // Clear of the orders whose rules fail on purpose (98, 99). Room for a hundred
    // sweeps begun again (below).
    let ids: Vec<i64> = (1000..1400).collect();
    paid_orders(b, &e, &ids).await;
    let mut next = ids.iter().copied();
    let mut dropped = [0usize; 2];
    for (kind, within) in [("own", false), ("in_tx", true)] {
        let (mut k, mut restarts) = (0, 0);
        while k < 60 {
            let Some(id) = next.next() else { break };
            let reference = format!("ship-{id}");
            let done = if within {
                let mut conn = store.acquire().await.unwrap();
                let mut tx = B::begin_on(&mut conn).await;
                let request = e.transition(id, Ship, &reference).within(&mut tx);
                let done = crate::conformance::faults::poll_at_most(request.into_future(), k).await;
                match done {
                    Some(answer) => {
                        answer.unwrap();
                        B::commit_on(tx).await;
                        Some(())
                    }
                    None => {
                        drop(tx);
                        <B::S as Store>::discard(conn);
                        None
                    }
                }
            } else {
                let request = e.transition(id, Ship, &reference);
                crate::conformance::faults::poll_at_most(request.into_future(), k)
                    .await
                    .map(|answer| {
                        answer.unwrap();
                    })
            };
            if done.is_some() {
                // Loopback can answer a whole call within one poll now and then (on a
                // loaded machine, SQLite's worker thread, woken by the call, can run each
                // statement before the call looks for its answer); sweep again until this
                // kind was dropped at least once.
                if dropped[usize::from(within)] == 0 && restarts < 100 {
                    (k, restarts) = (0, restarts + 1);
                    continue;
                }
                break;
            }
            dropped[usize::from(within)] += 1;
            k += 1;
        }
        assert!(
            dropped[usize::from(within)] > 0,
            "{kind}: never dropped, so the test shows nothing"
        );
    }
    crate::conformance::faults::assert_pool_clean(b, &store).await;
    shipments_agree(b, &e, &ids, stock).await;
}

/// A guarded call inside a caller's transaction, dropped after each of its polls in
/// turn (before its savepoint, while it is opened, at the lock, the guard's read, the
/// effect's write, the history insert, the release): the caller wrote a row before the
/// call and writes one after it. The caller's connection answers within [`HUNG`]; a
/// commit that succeeds holds both of the caller's rows and the unit whole (shipped with
/// the stock taken) or not at all; a commit that fails holds nothing. Never a commit
/// that lost the first row.
pub async fn a_dropped_guarded_call_keeps_the_callers_writes<B: Backend>(b: &B) {
    let stock = 1_000;
    let (e, ids) = caller_rows_and_orders(b, stock, 2000..2360).await;
    let mut tally = Tally::default();
    // A reply already in the socket (a loaded machine) lets a call pass its await points
    // in fewer polls: sweep again, on fresh orders, until calls were dropped (up to six
    // sweeps: a machine under four suites' load once dropped only three in three).
    for sweep in ids.chunks(60) {
        for (k, &id) in sweep.iter().enumerate() {
            tally.add(cut_call(b, &e, id, Ship, DropAt::Polls(k)).await.0);
        }
        if tally.dropped > 3 {
            break;
        }
    }
    assert!(
        tally.dropped > 3,
        "dropped {} times: the test shows nothing",
        tally.dropped
    );
    println!("{tally:?}");
    shipments_agree(b, &e, &ids, stock).await;
}

/// A call over an edge with no rules (`Cancel`) inside a caller's transaction, dropped
/// after each of its polls in turn (its savepoint, the update, the history insert, the
/// release), checked as in [`a_dropped_guarded_call_keeps_the_callers_writes`].
pub async fn a_dropped_plain_call_keeps_the_callers_writes<B: Backend>(b: &B) {
    let (e, _) = caller_rows_and_orders(b, 10, 1..2).await;
    let ids: Vec<i64> = (4000..4180).collect();
    for &id in &ids {
        e.create(id).await.unwrap();
    }
    // Such a call has a few await points: cycle through the first eight polls, so that
    // a loaded machine (a reply already in the socket) still lands many drops.
    let mut tally = Tally::default();
    for (i, &id) in ids.iter().enumerate() {
        tally.add(cut_call(b, &e, id, Cancel, DropAt::Polls(i % 8)).await.0);
    }
    assert!(
        tally.dropped > 3,
        "dropped {} times: the test shows nothing",
        tally.dropped
    );
    println!("{tally:?}");
}

/// 200 guarded calls inside the caller's transaction, each under a deadline drawn at
/// random up to a call's own time (every other one late in it), so that drops land
/// wherever the call happens to be (opening the savepoint, in the guard, in a write,
/// releasing); each checked as in [`a_dropped_guarded_call_keeps_the_callers_writes`].
pub async fn random_deadlines_keep_the_callers_writes<B: Backend>(b: &B) {
    let stock = 1_000;
    let (e, ids) = caller_rows_and_orders(b, stock, 3000..3260).await;
    // A call's own time: the median of the last ten answered, so that the deadlines
    // follow the calls as connections warm up and as the machine's load changes. The
    // first ten are not cut, nor is every fifth after them: were only answered calls
    // timed, calls slowed by load would all be dropped and never timed again.
    let mut times = std::collections::VecDeque::new();
    for &id in &ids[..10] {
        let (answer, took) = cut_call(b, &e, id, Ship, DropAt::Never).await;
        times.push_back(took);
        assert_eq!(answer, Became::Answered, "order {id}");
    }
    let mut tally = Tally::default();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut longest = Duration::ZERO;
    for (i, &id) in ids[10..].iter().enumerate() {
        if i % 5 == 4 {
            let (answer, took) = cut_call(b, &e, id, Ship, DropAt::Never).await;
            assert_eq!(answer, Became::Answered, "order {id}");
            times.pop_front();
            times.push_back(took);
            continue;
        }
        let mut sorted: Vec<Duration> = times.iter().copied().collect();
        sorted.sort();
        let span = sorted[sorted.len() / 2].as_micros().max(50) as u64;
        // xorshift64: a fixed sequence of fractions of the span.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // Every other call's deadline falls late in its span, where the unit's end (the
        // savepoint's release, run by the driver while its answer is awaited) is in
        // flight: a drop there once left a mark on the connection that swallowed a later
        // unit's undo (SQLite).
        let deadline = match id % 2 {
            0 => Duration::from_micros(seed % span),
            _ => Duration::from_micros(span * 6 / 10 + seed % (span * 6 / 10).max(1)),
        };
        longest = longest.max(deadline);
        let (became, took) = cut_call(b, &e, id, Ship, DropAt::After(deadline)).await;
        if became == Became::Answered {
            times.pop_front();
            times.push_back(took);
        }
        tally.add(became);
    }
    println!("{tally:?} (deadlines up to {longest:?})");
    assert!(
        tally.dropped >= 20 && tally.answered >= 20,
        "{tally:?}: the deadlines cut too few calls, or too many, to show anything"
    );
    shipments_agree(b, &e, &ids, stock).await;
}

/// A shop of `stock` and paid orders `ids`, and the table of the caller's own rows.
pub(crate) async fn caller_rows_and_orders<B: Backend>(
    b: &B,
    stock: i64,
    ids: std::ops::Range<i64>,
) -> (Shop_<B>, Vec<i64>) {
    shop_tables(b, stock).await;
    b.exec("DROP TABLE IF EXISTS caller_rows").await;
    b.exec("CREATE TABLE caller_rows (k BIGINT NOT NULL, what VARCHAR(10) NOT NULL)")
        .await;
    let (e, _, _) = shop_engine::<B>(b.store(Duration::from_secs(10)).await);
    let ids: Vec<i64> = ids.collect();
    paid_orders(b, &e, &ids).await;
    (e, ids)
}

/// Where a call inside the caller's transaction is cut.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DropAt {
    /// Dropped after its k-th poll that did not finish it.
    Polls(usize),
    /// Dropped when the deadline passes.
    After(Duration),
    /// Not cut.
    Never,
}

/// What became of a cut call.
#[derive(Debug, PartialEq)]
pub(crate) enum Became {
    Answered,
    Dropped,
    /// Dropped, and the caller's commit then failed (nothing of the transaction stayed).
    DroppedCommitFailed,
}

#[derive(Debug, Default)]
pub(crate) struct Tally {
    answered: usize,
    dropped: usize,
    commits_failed: usize,
}

impl Tally {
    fn add(&mut self, cut: Became) {
        match cut {
            Became::Answered => self.answered += 1,
            Became::Dropped => self.dropped += 1,
            Became::DroppedCommitFailed => {
                self.dropped += 1;
                self.commits_failed += 1;
            }
        }
    }
}

/// How long the caller's next statement or commit may take before the connection counts
/// as hung: far above a slow commit's time (a Galera node's commit waits for its turn in
/// the cluster's order, which a loaded machine stretches), far below forever.
pub(crate) const HUNG: Duration = Duration::from_secs(10);

/// The caller begins, writes a row, makes the call (`Ship`, guarded, whose effect takes
/// stock, of a paid order; or `Cancel`, an edge with no rules, of an open one) cut as
/// `cut` says, writes a second row and commits. Checked: the connection answers within
/// [`HUNG`]; a commit that succeeds kept both of the caller's rows; one that fails kept
/// nothing, the unit's writes included; an answered call's move committed. Returns what
/// became of the call, and how long it ran.
pub(crate) async fn cut_call<B: Backend>(
    b: &B,
    e: &Shop_<B>,
    id: i64,
    event: ShopEvent,
    cut: DropAt,
) -> (Became, Duration) {
    let insert = |what: &str| format!("INSERT INTO caller_rows (k, what) VALUES ({id}, '{what}')");
    let mut tx = b.begin().await;
    B::exec_in(&mut tx, &insert("before")).await;
    // Cut poll by poll, every statement of the call is prepared afresh where a driver
    // prepares, so that drops land on the prepares too.
    if matches!(cut, DropAt::Polls(_)) {
        B::forget_statements(&mut tx).await;
    }
    let reference = format!("{}-{id}", format!("{event:?}").to_lowercase());
    let call = e
        .transition(id, event, &reference)
        .within(&mut tx)
        .into_future();
    let started = std::time::Instant::now();
    let answer = match cut {
        DropAt::Polls(k) => crate::conformance::faults::poll_at_most(call, k).await,
        DropAt::After(deadline) => tokio::time::timeout(deadline, call).await.ok(),
        DropAt::Never => Some(call.await),
    };
    let took = started.elapsed();
    match &answer {
        None | Some(Ok(Outcome::Applied { .. })) => {}
        Some(other) => panic!("order {id}: {other:?}"),
    }
    let after = tokio::time::timeout(HUNG, B::exec_conn(&mut tx, insert("after")))
        .await
        .unwrap_or_else(|_| panic!("order {id}, cut {cut:?}: the caller's connection hung"));
    let committed = match after {
        Ok(()) => tokio::time::timeout(HUNG, B::try_commit(tx))
            .await
            .unwrap_or_else(|_| panic!("order {id}, cut {cut:?}: the caller's commit hung")),
        Err(_) => {
            B::rollback(tx).await;
            false
        }
    };
    let rows = b
        .scalar(&format!("SELECT count(*) FROM caller_rows WHERE k = {id}"))
        .await;
    let shipped = e
        .history(id)
        .await
        .unwrap()
        .iter()
        .any(|r| r.event == event);
    if committed {
        assert_eq!(rows, 2, "order {id}, cut {cut:?}: the caller's rows");
    } else {
        assert_eq!((rows, shipped), (0, false), "order {id}: a failed commit");
    }
    let became = match answer {
        Some(_) => {
            assert!(committed && shipped, "order {id}: answered Applied");
            Became::Answered
        }
        None if committed => Became::Dropped,
        None => Became::DroppedCommitFailed,
    };
    (became, took)
}

/// A guarded unit's connection cut at each of its statements, before the server sees it
/// and after the server answered it (its lock, the guard's read, the effect's write, the
/// history insert, the commit): the answer is what the database then holds (Applied
/// only if the shipment is recorded, told by the write id after a cut commit), the
/// stock went down once per shipment, and a re-send is answered as the history says.
pub async fn guarded_unit_cut_at_each_statement<B: Networked>(b: &B) {
    let stock = 100;
    shop_tables(b, stock).await;
    let (direct, _, _) = shop_engine::<B>(b.store(Duration::from_secs(30)).await);
    let commit: &'static [u8] = if <B::S as Store>::BACKEND == "postgres" {
        b"COMMIT"
    } else {
        b"\x03COMMIT"
    };
    let points: [&'static [u8]; 5] = [
        b"FOR UPDATE",
        b"FROM shop_stock",
        b"SET qty",
        b"INSERT INTO",
        commit,
    ];
    let mut ids = Vec::new();
    let mut id = 0;
    for point in points {
        for cut in [Cut::Request(point), Cut::ReplyTo(point)] {
            id += 1;
            ids.push(id);
            paid_orders(b, &direct, &[id]).await;
            let proxy = crate::server::Proxy::start(b.server(), cut).await;
            let (e, _, _) = shop_engine::<B>(b.store_at(proxy.port, 2).await);
            let answer = e.transition(id, Ship, &format!("ship-{id}")).await;
            assert_eq!(
                proxy.cuts(),
                1,
                "{cut:?}: the proxy never cut, so the test shows nothing"
            );
            let recorded = direct.history(id).await.unwrap().len() == 2;
            match answer {
                Ok(Outcome::Applied { .. }) => assert!(recorded, "{cut:?}: Applied, not recorded"),
                Err(e) if e.is_retryable() => {}
                other => panic!("{cut:?}: {other:?} (recorded: {recorded})"),
            }
        }
    }
    shipments_agree(b, &direct, &ids, stock).await;
}
