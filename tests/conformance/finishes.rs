//! Coalesced finishes of idempotency records: holders' completions, failures and
//! releases that go together in one batch while another is in flight, each answered
//! exactly as if it had gone alone, with the connection cut under a batch, a caller
//! that leaves while its finish is queued, and one whose deadline passes while its
//! batch is on its way.

use std::sync::Arc;
use std::time::Duration;

use orderly::{Claim, Claimed, Error, Failure, Records, ScopeConfig, Stored};

use super::Backend;
use super::faults::Networked;
use super::idempotency::{claimed, records};
use crate::server::{Cut, Proxy};

/// What a test asks of a held record, and what the record then holds.
#[derive(Debug, Clone)]
enum Ask {
    Complete(String),
    FailTerminal,
    FailRetryable,
    Release,
}

impl Ask {
    fn of(i: usize) -> Ask {
        match i % 4 {
            0 => Ask::Complete(format!("r{i}")),
            1 => Ask::FailTerminal,
            2 => Ask::FailRetryable,
            _ => Ask::Release,
        }
    }

    async fn send<S: orderly::idempotency::RecordStore>(
        &self,
        r: &Records<S>,
        held: &Claimed,
    ) -> orderly::Result<()> {
        match self {
            Ask::Complete(result) => r.complete(held, result).await,
            Ask::FailTerminal => r.fail(held, &"declined", Failure::Terminal).await,
            Ask::FailRetryable => r.fail(held, &"timeout", Failure::Retryable).await,
            Ask::Release => r.release(held).await,
        }
    }

    /// The condition on a record that holds what this finish wrote.
    fn holds(&self) -> String {
        match self {
            Ask::Complete(result) => {
                format!("status = 'SUCCEEDED' AND result = '\"{result}\"' AND terminal = FALSE")
            }
            Ask::FailTerminal => {
                "status = 'FAILED' AND result = '\"declined\"' AND terminal = TRUE".into()
            }
            Ask::FailRetryable => {
                "status = 'FAILED' AND result = '\"timeout\"' AND terminal = FALSE".into()
            }
            Ask::Release => "status = 'FAILED' AND result IS NULL AND terminal = FALSE".into(),
        }
    }
}

/// Whether the record of `key` is under `token` and holds `condition`.
async fn record_is<B: Backend>(b: &B, key: &str, token: &str, condition: &str) -> bool {
    b.scalar(&format!(
        "SELECT count(*) FROM orderly_idempotency_records WHERE scope = 'payments' \
         AND idem_key = '{key}' AND owner_token = '{token}' AND {condition}"
    ))
    .await
        == 1
}

/// Concurrent finishes go together while another is in flight, and each is answered
/// exactly as if it had gone alone: completions, terminal and retryable failures and
/// releases of held records each land with what they carry, under their holder's token;
/// a holder whose record another took over is told `LeaseLost` and writes nothing; a
/// holder that finishes its record twice at once with two results is told `Ok` for
/// exactly one, and the record holds that one's result. Rounds run until batches were
/// seen (bounded).
pub async fn coalesced_finishes_answer_each_finish_truly<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let mut round = 0;
    loop {
        round += 1;
        let tag = format!("f{round}");
        let mut asks = Vec::new();
        for i in 0..24 {
            let key = format!("{tag}-{i}");
            let held = claimed(r.claim("payments", &key, &"p").await.unwrap());
            asks.push((key, held, Ask::of(i)));
        }
        let stale_key = format!("{tag}-stale");
        let stale = claimed(r.claim("payments", &stale_key, &"p").await.unwrap());
        // Its lease run out (the database's clock is past it): another takes it over.
        b.exec(&format!(
            "UPDATE orderly_idempotency_records SET lease_until = 0 WHERE idem_key = '{stale_key}'"
        ))
        .await;
        let taker = claimed(r.claim("payments", &stale_key, &"p").await.unwrap());
        assert_eq!(taker.attempt(), 2);
        let twice_key = format!("{tag}-twice");
        let twice = claimed(r.claim("payments", &twice_key, &"p").await.unwrap());

        // The holder's two finishes first: the last task at the barrier runs on at once
        // (it goes alone), and the two are to meet in one batch.
        let mut calls: Vec<(String, Claimed, Ask)> = vec![
            (twice_key.clone(), twice.clone(), Ask::Complete("a".into())),
            (twice_key.clone(), twice.clone(), Ask::Complete("b".into())),
        ];
        calls.extend(asks.iter().cloned());
        calls.push((
            stale_key.clone(),
            stale.clone(),
            Ask::Complete("late".into()),
        ));
        let barrier = Arc::new(tokio::sync::Barrier::new(calls.len()));
        let tasks: Vec<_> = calls
            .iter()
            .cloned()
            .map(|(_, held, ask)| {
                let (r, barrier) = (r.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    ask.send(&r, &held).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        for ((key, held, ask), answer) in asks.iter().zip(&answers[2..]) {
            assert!(answer.is_ok(), "{key} ({ask:?}): {answer:?}");
            assert!(
                record_is(b, key, held.token(), &ask.holds()).await,
                "{key} ({ask:?}): the record does not hold what its finish wrote"
            );
        }
        let late = &answers[asks.len() + 2];
        assert!(
            matches!(late, Err(Error::LeaseLost { .. })),
            "the late holder: {late:?}"
        );
        assert!(
            record_is(b, &stale_key, taker.token(), "status = 'PROCESSING'").await,
            "the late holder's finish wrote over its successor's record"
        );
        let twice_answers = (&answers[0], &answers[1]);
        let kept = match twice_answers {
            (Ok(()), Err(Error::LeaseLost { .. })) => "a",
            (Err(Error::LeaseLost { .. }), Ok(())) => "b",
            other => panic!("a holder finishing twice at once: {other:?}"),
        };
        assert!(
            record_is(
                b,
                &twice_key,
                twice.token(),
                &Ask::Complete(kept.into()).holds()
            )
            .await,
            "the record does not hold the result its holder was told landed"
        );
        assert_eq!(
            r.claim("payments", &twice_key, &"p").await.unwrap(),
            Claim::Replayed(Stored::Succeeded(format!("\"{kept}\"")))
        );
        r.complete(&taker, &"taken").await.unwrap();
        let seen = r.coalesced_finishes();
        if seen.batches > 0 {
            assert!(seen.claims >= 2 * seen.batches);
            break;
        }
        assert!(
            round < 20,
            "no finishes were ever coalesced: the test shows nothing"
        );
    }
}

/// A finish whose caller stops waiting while it is queued behind another finish's
/// statement is never sent, and the finishes queued with it land. The first finish's
/// statement waits on its record, locked by a held transaction (on SQLite the held
/// transaction holds the write lock), so the finishes sent meanwhile queue behind it for
/// 100 ms.
pub async fn finishes_dropped_while_queued_are_never_sent<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let held = |key: &'static str| {
        let r = r.clone();
        async move { claimed(r.claim("payments", key, &"p").await.unwrap()) }
    };
    let (slow, kept, gone) = (held("slow").await, held("kept").await, held("gone").await);
    let mut blocker = b.begin().await;
    B::exec_in(
        &mut blocker,
        "UPDATE orderly_idempotency_records SET updated_at = updated_at \
         WHERE scope = 'payments' AND idem_key = 'slow'",
    )
    .await;
    super::until_the_pool_is_idle::<B>(r.store()).await;
    let slow_call = {
        let (r, slow) = (r.clone(), slow.clone());
        tokio::spawn(async move { r.complete(&slow, &"s").await })
    };
    // The slow finish holds a connection once its statement is on its way (it took the
    // finishes' turn first): the others are sent only then.
    super::until_a_connection_is_taken::<B>(r.store(), || slow_call.is_finished()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let kept_call = {
        let (r, kept) = (r.clone(), kept.clone());
        tokio::spawn(async move { r.complete(&kept, &"k").await })
    };
    let left = tokio::time::timeout(Duration::from_millis(100), r.complete(&gone, &"g")).await;
    assert!(left.is_err(), "the finish did not queue: {left:?}");
    B::rollback(blocker).await;
    slow_call.await.unwrap().unwrap();
    kept_call.await.unwrap().unwrap();
    assert!(record_is(b, "slow", slow.token(), &Ask::Complete("s".into()).holds()).await);
    assert!(record_is(b, "kept", kept.token(), &Ask::Complete("k".into()).holds()).await);
    // The abandoned finish's work ends off its caller's task without sending it.
    super::until_the_pool_is_idle::<B>(r.store()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        record_is(b, "gone", gone.token(), "status = 'PROCESSING'").await,
        "an abandoned queued finish was sent"
    );
    // Still its holder's: the holder completes it.
    r.complete(&gone, &"g").await.unwrap();
    assert!(record_is(b, "gone", gone.token(), &Ask::Complete("g".into()).holds()).await);
}

/// A finish whose batch is on its way when its caller's deadline passes is answered
/// `DeadlineExceeded { in_doubt: true }` (its write was sent, and lands), never
/// `Unavailable` (which says nothing was sent). Two held transactions lock the records
/// of the first finish (which goes alone) and of the second (queued behind it); the
/// first is let go, so that the second's batch is sent and waits on its lock past the
/// caller's deadline. Needs two writers at once, so not on SQLite.
pub async fn finish_in_a_batch_past_its_deadline_is_in_doubt<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let slow = claimed(r.claim("payments", "slow", &"p").await.unwrap());
    let late = claimed(r.claim("payments", "late", &"p").await.unwrap());
    let lock = |key: &str| {
        format!(
            "UPDATE orderly_idempotency_records SET updated_at = updated_at \
             WHERE scope = 'payments' AND idem_key = '{key}'"
        )
    };
    let mut first = b.begin().await;
    B::exec_in(&mut first, &lock("slow")).await;
    let mut second = b.begin().await;
    B::exec_in(&mut second, &lock("late")).await;
    super::until_the_pool_is_idle::<B>(r.store()).await;
    let slow_call = {
        let (r, slow) = (r.clone(), slow.clone());
        tokio::spawn(async move { r.complete(&slow, &"s").await })
    };
    super::until_a_connection_is_taken::<B>(r.store(), || slow_call.is_finished()).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let short = r.clone().deadline(Duration::from_millis(600)).unwrap();
    let late_call = {
        let late = late.clone();
        tokio::spawn(async move { short.complete(&late, &"l").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    B::rollback(first).await;
    slow_call.await.unwrap().unwrap();
    let answer = late_call.await.unwrap();
    assert!(
        matches!(answer, Err(Error::DeadlineExceeded { in_doubt: true, .. })),
        "a finish whose batch was sent: {answer:?}"
    );
    B::rollback(second).await;
    // The batch lands once the lock is let go: the record holds what was in doubt.
    let waited = std::time::Instant::now();
    while !record_is(b, "late", late.token(), &Ask::Complete("l".into()).holds()).await {
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the batch sent for the finish in doubt never landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Under 32 finishes at once, the connection is cut at `cut` (a point of a batch of
/// finishes: its statement's request, before or after the server got it, or the reply
/// to its commit). The records are claimed directly and finished through the proxy.
/// Every finish is answered `Ok`, and its record holds what it wrote under its holder's
/// token (a batch that committed is read back, one that did not is sent again). A round
/// in which nothing was cut shows nothing: after five, the test fails.
pub async fn connection_cut_under_coalesced_finishes_answers_each_finish<B: Networked>(
    b: &B,
    cuts: &[Cut],
) {
    let direct = records(b, Duration::from_secs(30)).await;
    for (n, &cut) in cuts.iter().enumerate() {
        let mut cut_seen = false;
        for round in 0..5 {
            let proxy = Proxy::start(b.server(), cut).await;
            let proxied = Records::new(b.store_at(proxy.port, 8).await)
                .scope(
                    "payments",
                    ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
                )
                .unwrap();
            let mut calls = Vec::new();
            for i in 0..32 {
                let key = format!("cutf-{n}-{round}-{i}");
                let held = claimed(direct.claim("payments", &key, &"p").await.unwrap());
                calls.push((key, held, Ask::of(i)));
            }
            let tasks: Vec<_> = calls
                .iter()
                .cloned()
                .map(|(_, held, ask)| {
                    let r = proxied.clone();
                    tokio::spawn(async move { ask.send(&r, &held).await })
                })
                .collect();
            for ((key, held, ask), task) in calls.iter().zip(tasks) {
                let answer = task.await.unwrap();
                assert!(answer.is_ok(), "{cut:?}: {key} ({ask:?}): {answer:?}");
                assert!(
                    record_is(b, key, held.token(), &ask.holds()).await,
                    "{cut:?}: {key} ({ask:?}): the record does not hold what its finish wrote"
                );
            }
            if proxy.cuts() > 0 {
                cut_seen = true;
                break;
            }
        }
        assert!(
            cut_seen,
            "{cut:?}: no batch of finishes was cut: the test shows nothing"
        );
    }
}
