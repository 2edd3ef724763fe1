//! Idempotency records beyond the claim: the recovery job, the purge, one-time tokens,
//! and `Records::run`. One body per behaviour, run on every backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orderly::idempotency::Work;
use orderly::{Claim, Done, Error, Failure, Reconciled, Records, Stored, Stuck, TokenRejection};

use super::idempotency::{SHORT_RETENTION, claimed, records};
use super::{Backend, OrderEvent, OrderState, engine};

/// Claims `n` records in `payments` and leaves them held, then makes them stuck: their
/// leases are run out by SQL. The scope's lease (30 s) is what the recovery job's own
/// takeovers get, so no takeover runs out while a test looks on, however slow the
/// machine.
async fn stuck_records<B: Backend>(b: &B, r: &Records<B::S>, n: usize) {
    for i in 0..n {
        claimed(
            r.claim("payments", &format!("stuck-{i}"), &i)
                .await
                .unwrap(),
        );
    }
    b.exec("UPDATE orderly_idempotency_records SET lease_until = 0 WHERE idem_key LIKE 'stuck-%'")
        .await;
}

/// The lease of the `payments` scope in the recovery tests.
const LEASE: Duration = Duration::from_secs(30);

/// The recovery job takes over only records whose lease ran out, asks the reconciler,
/// and applies its verdict: completed records replay the reconciled result, failed ones
/// their failure, released ones are claimed again; `Later` leaves the record held, and so
/// does a reconciler that panics, counted as an error without stopping the round.
pub async fn recovery_applies_the_reconcilers_verdict<B: Backend>(b: &B) {
    let r = records(b, LEASE).await;
    stuck_records(b, &r, 5).await;
    // A live one, claimed after the others' leases ran out: not stuck.
    let live = claimed(r.claim("payments", "live", &"p").await.unwrap());
    let reconciler = |stuck: Stuck| async move {
        assert_eq!(stuck.held.attempt(), 2);
        assert!(stuck.payload_hash.is_some());
        match stuck.held.key() {
            "stuck-0" => Reconciled::Succeeded(serde_json::json!({ "charge": "ch_0" })),
            "stuck-1" => Reconciled::Failed(serde_json::json!("declined"), Failure::Terminal),
            "stuck-2" => Reconciled::Unknown,
            "stuck-4" => panic!("a reconciler with a bug"),
            _ => Reconciled::Later,
        }
    };
    let round = r.recover("payments", 10, &reconciler).await.unwrap();
    assert_eq!(
        (
            round.found,
            round.taken,
            round.succeeded,
            round.failed,
            round.released,
            round.later,
            round.errors
        ),
        (5, 5, 1, 1, 1, 1, 1),
        "{round:?}"
    );
    assert_eq!(
        r.claim("payments", "stuck-0", &0).await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#"{"charge":"ch_0"}"#.into()))
    );
    assert_eq!(
        r.claim("payments", "stuck-1", &1).await.unwrap(),
        Claim::Replayed(Stored::Failed(Some(r#""declined""#.into())))
    );
    assert_eq!(
        claimed(r.claim("payments", "stuck-2", &2).await.unwrap()).attempt(),
        3
    );
    // Held by the job now, under a fresh lease: in flight, and not found again yet.
    assert!(matches!(
        r.claim("payments", "stuck-3", &3).await,
        Err(Error::InFlight { .. })
    ));
    assert_eq!(
        r.recover("payments", 10, &reconciler).await.unwrap().found,
        0
    );
    // The live holder was never touched.
    r.complete(&live, &"mine").await.unwrap();
    assert!(matches!(
        r.recover("refunds", 10, &reconciler).await,
        Err(Error::InvalidInput(_))
    ));
}

/// Two recovery jobs at once over 200 stuck records: every record is reconciled exactly
/// once, and every one replays its result afterwards. Both jobs read the stuck records
/// before either finished taking them (the reconciler is slow), so they raced.
pub async fn recovery_jobs_race_each_record_once<B: Backend>(b: &B) {
    let r = records(b, LEASE).await;
    stuck_records(b, &r, 200).await;
    let calls = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let jobs: Vec<_> = (0..2)
        .map(|_| {
            let (r, calls, barrier) = (r.clone(), calls.clone(), barrier.clone());
            tokio::spawn(async move {
                let reconciler = move |stuck: Stuck| {
                    let calls = calls.clone();
                    async move {
                        *calls
                            .lock()
                            .unwrap()
                            .entry(stuck.held.key().to_string())
                            .or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Reconciled::Succeeded(serde_json::json!(stuck.held.key()))
                    }
                };
                barrier.wait().await;
                let mut total = orderly::Recovered::default();
                loop {
                    let round = r.recover("payments", 50, &reconciler).await.unwrap();
                    total.found += round.found;
                    total.taken += round.taken;
                    total.succeeded += round.succeeded;
                    if round.found == 0 {
                        return total;
                    }
                }
            })
        })
        .collect();
    let mut totals = Vec::new();
    for job in jobs {
        totals.push(job.await.unwrap());
    }
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), 200);
        assert!(calls.values().all(|&n| n == 1), "a record reconciled twice");
    }
    assert_eq!(totals[0].taken + totals[1].taken, 200);
    assert_eq!(totals[0].succeeded + totals[1].succeeded, 200);
    assert!(
        totals[0].found + totals[1].found > 200,
        "the jobs did not race: {totals:?}"
    );
    for i in [0, 99, 199] {
        assert_eq!(
            r.claim("payments", &format!("stuck-{i}"), &i)
                .await
                .unwrap(),
            Claim::Replayed(Stored::Succeeded(format!("\"stuck-{i}\"")))
        );
    }
}

/// The recovery loop runs rounds until its shutdown signal, then returns its totals.
pub async fn recovery_loop_stops_on_shutdown<B: Backend>(b: &B) {
    let r = records(b, LEASE).await;
    stuck_records(b, &r, 5).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let job = {
        let r = r.clone();
        tokio::spawn(async move {
            r.recovery_loop(
                "payments",
                2,
                Duration::from_millis(20),
                |_: Stuck| async { Reconciled::Unknown },
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    // Wait (from outside: a claim would take a stuck record over itself) until the job
    // released all five.
    let released = "SELECT COUNT(*) FROM orderly_idempotency_records WHERE status = 'FAILED'";
    for _ in 0..500 {
        if b.scalar(released).await == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.scalar(released).await, 5);
    stop.send(()).unwrap();
    let total = tokio::time::timeout(Duration::from_secs(5), job)
        .await
        .expect("the loop stops on its signal")
        .unwrap()
        .unwrap();
    assert_eq!(total.released, 5, "{total:?}");
    for i in 0..5 {
        let held = claimed(
            r.claim("payments", &format!("stuck-{i}"), &i)
                .await
                .unwrap(),
        );
        assert_eq!(held.attempt(), 3);
    }
}

/// The purge removes what is past its retention, in batches, and nothing else: records
/// of a scope with a long retention and unexpired tokens stay.
pub async fn purge_removes_only_expired_records<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    for i in 0..5 {
        let held = claimed(r.claim("short", &format!("old-{i}"), &i).await.unwrap());
        r.complete(&held, &i).await.unwrap();
    }
    // Held and abandoned: its lease and its retention both run out.
    claimed(r.claim("short", "abandoned", &0).await.unwrap());
    let kept = claimed(r.claim("payments", "kept", &0).await.unwrap());
    r.complete(&kept, &"kept").await.unwrap();
    let old_token = r.issue("short", Duration::from_millis(100)).await.unwrap();
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let live_token = r.issue("short", Duration::from_secs(60)).await.unwrap();
    let fresh = claimed(r.claim("short", "fresh", &0).await.unwrap());
    r.complete(&fresh, &"fresh").await.unwrap();

    assert_eq!(r.purge(2).await.unwrap(), 7);
    let count = |table: &str| format!("SELECT COUNT(*) FROM {table}");
    assert_eq!(b.scalar(&count("orderly_idempotency_records")).await, 2);
    assert_eq!(b.scalar(&count("orderly_one_time_tokens")).await, 1);
    assert_eq!(r.purge(2).await.unwrap(), 0);
    assert_eq!(
        r.claim("payments", "kept", &0).await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""kept""#.into()))
    );
    assert_eq!(
        r.claim("short", "fresh", &0).await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""fresh""#.into()))
    );
    r.consume("short", &live_token).await.unwrap();
    assert!(matches!(
        r.consume("short", &old_token).await,
        Err(Error::TokenRejected {
            reason: TokenRejection::Unknown,
            ..
        })
    ));
    assert!(matches!(r.purge(0).await, Err(Error::InvalidInput(_))));
}

/// A one-time token is consumed once: of 64 racing requests one succeeds and the rest
/// are told it was used; unknown and expired tokens are rejected with their reason; bad
/// input changes nothing.
pub async fn tokens_are_consumed_once<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let token = r.issue("payments", Duration::from_secs(60)).await.unwrap();
    assert_eq!(token.len(), 32);
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (r, barrier, token) = (r.clone(), barrier.clone(), token.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                r.consume("payments", &token).await
            })
        })
        .collect();
    let (mut ok, mut used) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(Error::TokenRejected {
                reason: TokenRejection::Used,
                ..
            }) => used += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ok, used), (1, 63));

    let rejected = |e: Result<(), Error>| match e {
        Err(Error::TokenRejected { reason, .. }) => Some(reason),
        _ => None,
    };
    assert_eq!(
        rejected(r.consume("payments", "no-such-token").await),
        Some(TokenRejection::Unknown)
    );
    // A token of another scope is unknown here.
    assert_eq!(
        rejected(r.consume("short", &token).await),
        Some(TokenRejection::Unknown)
    );
    let brief = r
        .issue("payments", Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        rejected(r.consume("payments", &brief).await),
        Some(TokenRejection::Expired)
    );
    for (scope, token) in [("payments", ""), ("payments", "a\u{7}"), ("refunds", "t")] {
        assert!(matches!(
            r.consume(scope, token).await,
            Err(Error::InvalidInput(_))
        ));
    }
    assert!(matches!(
        r.issue("payments", Duration::ZERO).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        r.issue("refunds", Duration::from_secs(1)).await,
        Err(Error::InvalidInput(_))
    ));
}

type Conn<B> = <<B as Backend>::S as orderly::Store>::Conn;

/// The work of a request to `Records::run`: creates order `id` and pays it inside the
/// transaction, then decides as `verdict` says.
pub(crate) fn place<B: Backend>(
    e: super::Eng<B>,
    runs: Arc<AtomicUsize>,
    id: i64,
    verdict: &'static str,
) -> impl for<'c> FnOnce(&'c mut Conn<B>) -> Work<'c, Result<Done<i64, String>, Error>> {
    move |tx| {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            e.create(id).within(&mut *tx).await?;
            e.transition(id, OrderEvent::Pay, "pay-1")
                .within(&mut *tx)
                .await?;
            match verdict {
                "ok" => Ok(Done::Succeeded(id)),
                "declined" => Ok(Done::Failed("declined".to_string(), Failure::Terminal)),
                "timeout" => Ok(Done::Failed("timeout".to_string(), Failure::Retryable)),
                _ => Err(Error::InvalidInput("the work failed".into())),
            }
        })
    }
}

/// `Records::run`: the work's writes (an order created and paid inside the transaction)
/// commit with the completed record; a repeat replays without running the work; a
/// terminal failure rolls the work back and is replayed; a retryable failure and an
/// error roll it back and let the next request run again.
pub async fn run_commits_the_work_with_its_record<B: Backend>(b: &B) {
    let e = engine(b).await;
    let r = Records::new(b.store(Duration::from_secs(10)).await)
        .read_first(B::POLICY)
        .scope(
            "orders",
            orderly::ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let place = |id, verdict| place::<B>(e.clone(), runs.clone(), id, verdict);
    let ran = r.run("orders", "o-1", &1, place(1, "ok")).await.unwrap();
    assert_eq!((ran.outcome, ran.replayed), (Ok(1), false));
    assert_eq!(e.get(1).await.unwrap().state, OrderState::Paid);
    let again = r.run("orders", "o-1", &1, place(1, "ok")).await.unwrap();
    assert_eq!((again.outcome, again.replayed), (Ok(1), true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(matches!(
        r.run("orders", "o-1", &2, place(1, "ok")).await,
        Err(Error::PayloadMismatch { .. })
    ));

    let declined = r
        .run("orders", "o-2", &2, place(2, "declined"))
        .await
        .unwrap();
    assert_eq!(declined.outcome, Err("declined".to_string()));
    assert!(matches!(e.get(2).await, Err(Error::NotFound { .. })));
    let replayed = r.run("orders", "o-2", &2, place(2, "ok")).await.unwrap();
    assert_eq!(
        (replayed.outcome, replayed.replayed),
        (Err("declined".to_string()), true)
    );

    for verdict in ["timeout", "error"] {
        let key = format!("o-3-{verdict}");
        let out = r.run("orders", &key, &3, place(3, verdict)).await;
        assert!(
            e.get(3).await.is_err(),
            "{verdict}: the work was rolled back"
        );
        match verdict {
            "timeout" => assert_eq!(out.unwrap().outcome, Err("timeout".to_string())),
            _ => assert!(matches!(out, Err(Error::InvalidInput(_)))),
        }
        // Claimable again: the next request runs the work.
        let ran = r.run("orders", &key, &3, place(3, "ok")).await.unwrap();
        assert_eq!((ran.outcome, ran.replayed), (Ok(3), false));
        // Undo for the next round.
        b.exec("DELETE FROM orderly_transitions WHERE order_id = 3")
            .await;
        b.exec("DELETE FROM orderly_outbox WHERE entity_id = 3")
            .await;
        b.exec("DELETE FROM orders WHERE id = 3").await;
    }
    // Every transaction of the test's database ends. On MariaDB `innodb_trx` is a cache
    // refreshed only once nobody read it for 100 ms: a snapshot taken mid-way through
    // the last `run` (by this or a concurrent test's check) was seen right after it
    // returned, joined to its session idle by then, and gone 200 ms later.
    let mut open = b.open_transactions().await;
    for _ in 0..200 {
        if open == 0 {
            break;
        }
        tokio::time::sleep(super::outbox::cancel::POLL).await;
        open = b.open_transactions().await;
    }
    assert_eq!(
        open, 0,
        "a transaction stayed open 30 s after the last call"
    );
}
