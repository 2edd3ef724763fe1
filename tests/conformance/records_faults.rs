//! Idempotency records under faults: calls dropped at every await point, and
//! acknowledgements lost after the server committed. One body per behaviour, run on
//! every backend (the network faults on the server backends).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use orderly::{Claim, Error, Failure, Records, ScopeConfig, Stored};

use super::faults::{Networked, assert_pool_clean, poll_at_most};
use super::idempotency::claimed;
use super::records_jobs::place;
use super::{Backend, OrderState, engine};
use crate::server::{Cut, Proxy};

const LEASE: Duration = Duration::from_millis(300);

fn orders<S: orderly::idempotency::RecordStore>(
    store: S,
    policy: orderly::ReadFirst,
) -> Records<S> {
    Records::new(store)
        .read_first(policy)
        .scope("orders", ScopeConfig::new(LEASE, Duration::from_secs(3600)))
        .unwrap()
}

/// `claim`, `complete` and `run` dropped at every await point they reach, on a pool of
/// one connection (a connection handed back dirty is certainly the next caller's). After
/// each drop the pool still serves a claim and a completion that another connection
/// sees, and the dropped call's key is never left held: within the lease, a claim of it
/// is granted (a claim granted to nobody, or a `run` dropped during its work, was
/// released) or replays what completed (a `complete` finished off the caller's task),
/// never `InFlight`; for `run` an order exists exactly when its record completed.
/// Afterwards the pool is full and idle and no session sits in a transaction. Evidence
/// that drops landed after a write: claims granted again (attempt 2) and completions
/// replayed.
pub async fn records_calls_dropped_at_every_await_point<B: Backend>(b: &B) {
    let store = b.small_store(1).await;
    let r = orders(store.clone(), B::POLICY);
    let e = engine(b).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let mut dropped: HashMap<&str, usize> = HashMap::new();
    // Per kind: drops whose key was granted again after a release, and drops that
    // replayed what the dropped call completed.
    let mut released: HashMap<&str, usize> = HashMap::new();
    let mut completed: HashMap<&str, usize> = HashMap::new();
    let mut next = 0i64;
    for kind in ["claim", "complete", "run"] {
        let (mut k, mut restarts) = (0, 0);
        while k < 200 {
            next += 1;
            let key = format!("{kind}-{next}");
            let mut holder = None;
            let done = match kind {
                "claim" => poll_at_most(r.claim("orders", &key, &next), k)
                    .await
                    .map(|c| drop(claimed(c.unwrap()))),
                "complete" => {
                    let held = claimed(r.claim("orders", &key, &next).await.unwrap());
                    let done = poll_at_most(r.complete(&held, &"done"), k)
                        .await
                        .map(|c| c.unwrap());
                    holder = Some(held);
                    done
                }
                _ => {
                    let work = place::<B>(e.clone(), runs.clone(), next, "ok");
                    poll_at_most(r.run("orders", &key, &next, work), k)
                        .await
                        .map(|ran| assert_eq!(ran.unwrap().outcome, Ok(next)))
                }
            };
            if done.is_none()
                && let Some(held) = &holder
            {
                // The caller still holds the record: the dropped completion finished off
                // its task, or was never sent and the record is still the caller's, who
                // completes it again.
                *dropped.entry(kind).or_insert(0) += 1;
                let landed = format!(
                    "SELECT COUNT(*) FROM orderly_idempotency_records \
                     WHERE idem_key = '{key}' AND status = 'SUCCEEDED'"
                );
                let asked = std::time::Instant::now();
                while b.scalar(&landed).await == 0 && asked.elapsed() < Duration::from_millis(50) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                if b.scalar(&landed).await == 1 {
                    *completed.entry(kind).or_insert(0) += 1;
                }
                r.complete(held, &"done").await.unwrap();
            } else if done.is_none() {
                *dropped.entry(kind).or_insert(0) += 1;
                // The dropped call's key, well inside its lease.
                let asked = std::time::Instant::now();
                let answer = loop {
                    match r.claim("orders", &key, &next).await {
                        Err(Error::InFlight { .. }) => {
                            assert!(
                                asked.elapsed() < LEASE / 2,
                                "{kind} dropped after {k} polls left {key} held"
                            );
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        other => break other.unwrap(),
                    }
                };
                let order = e.get(next).await;
                match (kind, &answer) {
                    (_, Claim::Claimed(held)) => {
                        if kind == "run" {
                            assert!(order.is_err(), "{key}: an order without its record");
                        }
                        if held.attempt() > 1 {
                            *released.entry(kind).or_insert(0) += 1;
                        }
                        r.release(held).await.unwrap();
                    }
                    ("complete", Claim::Replayed(Stored::Succeeded(_))) => {
                        *completed.entry(kind).or_insert(0) += 1;
                    }
                    ("run", Claim::Replayed(Stored::Succeeded(_))) => {
                        assert_eq!(order.unwrap().state, OrderState::Paid, "{key}");
                        *completed.entry(kind).or_insert(0) += 1;
                    }
                    _ => panic!("{key}: {answer:?}"),
                }
            }
            // Whatever was dropped, the pool's next claim and completion commit.
            let probe = format!("probe-{next}");
            let held = claimed(r.claim("orders", &probe, &0).await.unwrap());
            r.complete(&held, &"probe").await.unwrap();
            assert_eq!(
                b.scalar(&format!(
                    "SELECT COUNT(*) FROM orderly_idempotency_records \
                     WHERE idem_key = '{probe}' AND status = 'SUCCEEDED'"
                ))
                .await,
                1,
                "{kind} dropped after {k} polls: a completion was acknowledged but not committed"
            );
            if done.is_some() {
                // Under load a statement's answer can be in the socket before its read
                // is polled, so a call may pass its await points in fewer polls than
                // usual and skip the drops that show something: go round again until
                // this kind was dropped (and, for `run`, dropped during its work).
                let shown =
                    dropped.contains_key(kind) && (kind != "run" || released.contains_key("run"));
                if !shown && restarts < 50 {
                    (k, restarts) = (0, restarts + 1);
                    continue;
                }
                break;
            }
            k += 1;
        }
    }
    assert_eq!(
        dropped.len(),
        3,
        "some call was never dropped, so the test shows nothing for it: {dropped:?}"
    );
    // (A claim or completion dropped with its statement in flight is the next test's.)
    assert!(
        released.contains_key("run"),
        "no run dropped during its work was released: released {released:?}, \
         completed {completed:?}, dropped {dropped:?}"
    );
    assert_pool_clean(b, &store).await;
}

/// A claim and a completion dropped while their statements wait on a lock the test
/// holds (an uncommitted insert of the same record; a locked record, on SQLite the
/// write lock): each finishes off the caller's task once the lock goes. The claim,
/// granted to nobody, is released at once (the next claim is granted, attempt 2, long
/// before the 30 s lease), and the completion lands (the record replays). The pool gets
/// its connections back.
pub async fn records_calls_dropped_in_flight_finish_off_task<B: Backend>(b: &B) {
    let store = b.store(Duration::from_secs(10)).await;
    let r = Records::new(store.clone())
        .read_first(orderly::ReadFirst::Never)
        .scope(
            "orders",
            ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    // The claim, behind an uncommitted insert of its record.
    let mut tx = b.begin().await;
    B::exec_in(
        &mut tx,
        "INSERT INTO orderly_idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
         attempt, lease_until, expires_at, result, created_at, updated_at) \
         VALUES ('orders', 'k-1', 'x', 'PROCESSING', 'blocker', 1, 0, 0, NULL, 0, 0)",
    )
    .await;
    let cut = tokio::time::timeout(Duration::from_millis(300), r.claim("orders", "k-1", &1)).await;
    assert!(cut.is_err(), "the claim did not wait on the lock: {cut:?}");
    B::rollback(tx).await;
    let asked = std::time::Instant::now();
    let again = loop {
        match r.claim("orders", "k-1", &1).await {
            Err(Error::InFlight { .. }) => {
                assert!(
                    asked.elapsed() < Duration::from_secs(5),
                    "the dropped claim holds its record"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => break claimed(other.unwrap()),
        }
    };
    assert_eq!(
        again.attempt(),
        2,
        "the dropped claim was never granted: the race did not happen"
    );

    // The completion, behind a lock on its record.
    let mut tx = b.begin().await;
    B::exec_in(
        &mut tx,
        "UPDATE orderly_idempotency_records SET updated_at = updated_at WHERE idem_key = 'k-1'",
    )
    .await;
    let cut = tokio::time::timeout(Duration::from_millis(300), r.complete(&again, &"done")).await;
    assert!(
        cut.is_err(),
        "the completion did not wait on the lock: {cut:?}"
    );
    B::rollback(tx).await;
    let asked = std::time::Instant::now();
    loop {
        match r.claim("orders", "k-1", &1).await {
            Ok(Claim::Replayed(Stored::Succeeded(_))) => break,
            Err(Error::InFlight { .. }) if asked.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("the dropped completion did not land: {other:?}"),
        }
    }
    assert_pool_clean(b, &store).await;
}

/// Acknowledgements lost after the server committed (a proxy drops the reply): a claim
/// is recognised as this request's own by its token, never answered "in flight"; a
/// completion is read back as landed; `run`'s commit is read back and answered as the
/// success it was.
pub async fn records_lost_acknowledgements_are_read_back<B: Networked>(b: &B) {
    let direct = orders(b.store(Duration::from_secs(10)).await, B::POLICY);

    // The claim: the key travels in the claim's parameters, first on this connection.
    let proxy = Proxy::start(b.server(), Cut::ReplyTo(b"claim-ack-lost")).await;
    // Writing first, so that the cut reply is the claim's own (reading first, the read
    // would carry the key first).
    let r = orders(b.store_at(proxy.port, 4).await, orderly::ReadFirst::Never);
    let held = claimed(r.claim("orders", "claim-ack-lost", &1).await.unwrap());
    assert_eq!(
        proxy.cuts(),
        1,
        "the proxy never cut: the test shows nothing"
    );
    assert_eq!(held.attempt(), 1);
    // The completion: its result travels in its parameters.
    let proxy = Proxy::start(b.server(), Cut::ReplyTo(b"complete-ack-lost")).await;
    let r = orders(b.store_at(proxy.port, 4).await, B::POLICY);
    r.complete(&held, &"complete-ack-lost").await.unwrap();
    assert_eq!(
        proxy.cuts(),
        1,
        "the proxy never cut: the test shows nothing"
    );
    assert_eq!(
        direct.claim("orders", "claim-ack-lost", &1).await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""complete-ack-lost""#.into()))
    );

    // `run`'s commit.
    let e = engine(b).await;
    let proxy = Proxy::start(b.server(), B::COMMIT_CUT).await;
    let r = orders(b.store_at(proxy.port, 4).await, B::POLICY);
    let work = place::<B>(e.clone(), Arc::default(), 7, "ok");
    let ran = r.run("orders", "run-ack-lost", &7, work).await;
    assert_eq!(
        proxy.cuts(),
        1,
        "the proxy never cut: the test shows nothing"
    );
    let ran = ran.unwrap();
    assert_eq!((ran.outcome, ran.replayed), (Ok(7), false));
    assert_eq!(e.get(7).await.unwrap().state, OrderState::Paid);
    let again = direct
        .run(
            "orders",
            "run-ack-lost",
            &7,
            place::<B>(e, Arc::default(), 7, "ok"),
        )
        .await
        .unwrap();
    assert_eq!((again.outcome, again.replayed), (Ok(7), true));
    assert!(matches!(
        direct.claim("orders", "run-ack-lost", &8).await,
        Err(Error::PayloadMismatch { .. })
    ));
}

/// A holder's write lost before the server saw it (a proxy drops the request and closes
/// the connection): the record is still this holder's, so the answer is never
/// `LeaseLost` (which tells the caller someone else owns it now). `complete`, `fail` and
/// `release` each land on a fresh connection and answer `Ok`, and the record says so.
pub async fn records_write_lost_before_the_server_is_retried<B: Networked>(b: &B) {
    let direct = orders(b.store(Duration::from_secs(10)).await, B::POLICY);
    for (n, what) in ["complete", "fail", "release"].into_iter().enumerate() {
        let key = format!("never-sent-{what}");
        let held = claimed(direct.claim("orders", &key, &n).await.unwrap());
        // The key travels in the write's parameters; nothing else carries it first on
        // the proxy's connections.
        let pattern: &'static [u8] = Box::leak(key.clone().into_bytes().into_boxed_slice());
        let proxy = Proxy::start(b.server(), Cut::Request(pattern)).await;
        let r = orders(b.store_at(proxy.port, 4).await, B::POLICY);
        let answer = match what {
            "complete" => r.complete(&held, &"done").await,
            "fail" => r.fail(&held, &"declined", Failure::Terminal).await,
            _ => r.release(&held).await,
        };
        assert_eq!(
            proxy.cuts(),
            1,
            "the proxy never cut: the test shows nothing"
        );
        assert!(answer.is_ok(), "{what}: {answer:?}");
        let again = direct.claim("orders", &key, &n).await.unwrap();
        match what {
            "complete" => assert_eq!(
                again,
                Claim::Replayed(Stored::Succeeded(r#""done""#.into()))
            ),
            "fail" => assert_eq!(
                again,
                Claim::Replayed(Stored::Failed(Some(r#""declined""#.into())))
            ),
            _ => assert_eq!(claimed(again).attempt(), 2, "{what}"),
        }
    }
}

/// The database stops answering (a proxy freezes) under claims and holders' writes on
/// a pool of 2: each is answered within the records' deadline (plus slack), as
/// `Unavailable` or `DeadlineExceeded`, retryable, never after minutes of pool
/// timeouts.
pub async fn records_dead_database_answers_within_the_deadline<B: Networked>(b: &B) {
    let deadline = Duration::from_millis(500);
    let direct = orders(b.store(Duration::from_secs(10)).await, B::POLICY);
    let held = claimed(direct.claim("orders", "frozen-finish", &1).await.unwrap());
    let proxy = Proxy::start(b.server(), Cut::Request(b"no request holds this")).await;
    let r = orders(b.store_at(proxy.port, 2).await, B::POLICY)
        .deadline(deadline)
        .unwrap();
    claimed(r.claim("orders", "warm-up", &1).await.unwrap());
    proxy.freeze();
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let (r, held) = (r.clone(), held.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let answer = match i {
                    0 => r.complete(&held, &"late").await,
                    _ => r
                        .claim("orders", &format!("frozen-{i}"), &1)
                        .await
                        .map(drop),
                };
                (answer, started.elapsed())
            })
        })
        .collect();
    let mut late = None;
    for call in calls {
        let (answer, took) = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("a call on a dead database was not answered within 20 s")
            .unwrap();
        assert!(took < deadline * 4, "answered after {took:?}");
        let err = answer.unwrap_err();
        assert!(
            matches!(
                err,
                Error::Unavailable { .. } | Error::DeadlineExceeded { .. }
            ),
            "{err:?}"
        );
        assert!(err.is_retryable());
        late.get_or_insert(err);
    }
    proxy.thaw();
    // The late completion, answered in doubt, may have been sent before the freeze held
    // it (on a connection kept from the warm-up, which no test delayed): thawed, it
    // lands, and the record holds its result; this holder's other result is then
    // refused. Otherwise this holder's completion lands.
    let stored = match direct.complete(&held, &"done").await {
        Ok(()) => "done",
        Err(Error::LeaseLost { .. }) => {
            // Landed, so it must have been answered in doubt, never as unsent.
            assert!(
                matches!(late, Some(Error::DeadlineExceeded { in_doubt: true, .. })),
                "the late completion landed, and was answered {late:?}"
            );
            "late"
        }
        Err(e) => panic!("the holder's completion after the thaw: {e:?}"),
    };
    assert_eq!(
        direct.claim("orders", "frozen-finish", &1).await.unwrap(),
        Claim::Replayed(Stored::Succeeded(format!("\"{stored}\"")))
    );
}

/// Under 32 claims at once, a connection is cut as the request holding `pattern` goes
/// out, or right after it reached the server (which may commit it). On a store that
/// coalesces claims `pattern` is the batch's statement; on one that claims one at a time
/// it is what a single claim sends (every key here starts `cut-`). Every claim is read
/// back by its own token and answered truly, `Claimed` at attempt 1 with the record under
/// its own token (a claim that committed is never taken for another's, nor claimed
/// twice). A round in which nothing was cut shows nothing: after five, the test fails.
pub async fn connection_cut_under_coalesced_claims_answers_each_claim<B: Networked>(
    b: &B,
    pattern: &'static [u8],
) {
    for (n, cut) in [Cut::Forward(pattern), Cut::Request(pattern)]
        .into_iter()
        .enumerate()
    {
        let mut cut_seen = false;
        for round in 0..5 {
            let proxy = Proxy::start(b.server(), cut).await;
            let r = orders(b.store_at(proxy.port, 8).await, orderly::ReadFirst::Never);
            let keys: Vec<String> = (0..32).map(|i| format!("cut-{n}-{round}-{i}")).collect();
            let calls: Vec<_> = keys
                .iter()
                .cloned()
                .map(|key| {
                    let r = r.clone();
                    tokio::spawn(async move {
                        let answer = r.claim("orders", &key, &1).await;
                        (key, answer)
                    })
                })
                .collect();
            for call in calls {
                let (key, answer) = call.await.unwrap();
                let held = claimed(answer.unwrap());
                assert_eq!(held.attempt(), 1, "{cut:?}: {key}");
                let mine = b
                    .scalar(&format!(
                        "SELECT count(*) FROM orderly_idempotency_records WHERE idem_key = '{key}' \
                         AND owner_token = '{}' AND status = 'PROCESSING' AND attempt = 1",
                        held.token()
                    ))
                    .await;
                assert_eq!(mine, 1, "{cut:?}: {key} is not under its claim's token");
            }
            if proxy.cuts() > 0 {
                cut_seen = true;
                break;
            }
        }
        assert!(
            cut_seen,
            "{cut:?}: no claim's request was cut: the test shows nothing"
        );
    }
}
