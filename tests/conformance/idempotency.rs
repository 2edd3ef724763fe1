//! Idempotency records: the outcome table of a claim, fencing, takeover, a storm of
//! identical requests, completion inside the caller's transaction, retention. One body
//! per behaviour, run on every backend.

use std::sync::Arc;
use std::time::Duration;

use orderly::idempotency::RecordStore;
use orderly::{Claim, Claimed, Error, Failure, Records, ScopeConfig, Stored};

use super::Backend;

/// The retention of scope `short`: long enough for a test's few round trips after a
/// completion (under load, on a Galera node) to see the record kept; the tests that need
/// it gone sleep past it.
pub(crate) const SHORT_RETENTION: Duration = Duration::from_millis(1000);

/// Records with scope `payments` (lease `lease`, retention one hour) and `short`
/// (lease 100 ms, retention [`SHORT_RETENTION`]).
pub(crate) async fn records<B: Backend>(b: &B, lease: Duration) -> Records<B::S> {
    Records::new(b.store(Duration::from_secs(10)).await)
        .read_first(B::POLICY)
        .scope(
            "payments",
            ScopeConfig::new(lease, Duration::from_secs(3600)),
        )
        .unwrap()
        .scope(
            "short",
            ScopeConfig::new(Duration::from_millis(100), SHORT_RETENTION),
        )
        .unwrap()
}

pub(crate) fn claimed(claim: Claim) -> Claimed {
    match claim {
        Claim::Claimed(held) => held,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Charge {
    charge_id: String,
    amount: u64,
}

/// Every row of the claim table: a new key is claimed; a second request with another
/// payload is a mismatch (even while the first runs); one with the same payload is in
/// flight; completed, it is replayed byte for byte; failed terminally, the failure is
/// replayed; failed retryably or released, it is claimed again; bad input changes nothing.
pub async fn claim_follows_the_outcome_table<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let body = serde_json::json!({ "order": 42, "amount": 4200 });

    // Row 1, then rows 2 and 3 while it runs.
    let held = claimed(r.claim("payments", "k-1", &body).await.unwrap());
    assert_eq!(held.attempt(), 1);
    let other = serde_json::json!({ "order": 42, "amount": 9900 });
    assert!(matches!(
        r.claim("payments", "k-1", &other).await,
        Err(Error::PayloadMismatch { ref reference, .. }) if reference == "k-1"
    ));
    match r.claim("payments", "k-1", &body).await {
        Err(e @ Error::InFlight { .. }) => {
            assert!(e.is_retryable());
            let Error::InFlight { retry_after, .. } = e else {
                unreachable!()
            };
            assert!(
                retry_after > Duration::from_secs(20) && retry_after <= Duration::from_secs(30)
            );
        }
        other => panic!("expected InFlight, got {other:?}"),
    }

    // Row 5: the stored result, byte for byte (member order as serialized).
    let charge = Charge {
        charge_id: "ch_1".into(),
        amount: 4200,
    };
    r.complete(&held, &charge).await.unwrap();
    let replay = r.claim("payments", "k-1", &body).await.unwrap();
    assert_eq!(
        replay,
        Claim::Replayed(Stored::Succeeded(
            r#"{"charge_id":"ch_1","amount":4200}"#.into()
        ))
    );
    let Claim::Replayed(stored) = replay else {
        unreachable!()
    };
    assert_eq!(stored.parse::<Charge>().unwrap(), charge);
    // Another payload is still a mismatch after completion.
    assert!(matches!(
        r.claim("payments", "k-1", &other).await,
        Err(Error::PayloadMismatch { .. })
    ));
    // A finished record is no holder's any more: another result is refused, and the
    // same completion again (a retry after a lost acknowledgement) is answered as landed.
    let other_charge = Charge {
        charge_id: "ch_2".into(),
        amount: 4200,
    };
    assert!(matches!(
        r.complete(&held, &other_charge).await,
        Err(Error::LeaseLost { .. })
    ));
    r.complete(&held, &charge).await.unwrap();
    assert!(matches!(
        r.fail(&held, &"declined", Failure::Terminal).await,
        Err(Error::LeaseLost { .. })
    ));

    // Row 6: a terminal failure is replayed.
    let held = claimed(r.claim("payments", "k-2", &body).await.unwrap());
    r.fail(&held, &"card declined", Failure::Terminal)
        .await
        .unwrap();
    assert_eq!(
        r.claim("payments", "k-2", &body).await.unwrap(),
        Claim::Replayed(Stored::Failed(Some(r#""card declined""#.into())))
    );

    // Row 7: a retryable failure, and a release, open the record to the next claim.
    let held = claimed(r.claim("payments", "k-3", &body).await.unwrap());
    r.fail(&held, &"gateway timeout", Failure::Retryable)
        .await
        .unwrap();
    let again = claimed(r.claim("payments", "k-3", &body).await.unwrap());
    assert_eq!(again.attempt(), 2);
    assert_ne!(again.token(), held.token());
    r.extend(&again).await.unwrap();
    r.release(&again).await.unwrap();
    assert_eq!(
        claimed(r.claim("payments", "k-3", &body).await.unwrap()).attempt(),
        3
    );
    // The released holder is fenced out.
    assert!(matches!(
        r.extend(&again).await,
        Err(Error::LeaseLost { .. })
    ));

    // Row 8: bad input is refused before any write.
    for key in [
        "",
        " k",
        "k\u{0}",
        "k\u{202E}1",
        "k\u{200B}",
        &"k".repeat(256),
    ] {
        assert!(
            matches!(
                r.claim("payments", key, &body).await,
                Err(Error::InvalidInput(_))
            ),
            "{key:?}"
        );
    }
    assert!(matches!(
        r.claim("refunds", "k-1", &body).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        r.claim("payments", "k-4", &serde_json::json!({ "x": "a\u{0}" }))
            .await,
        Err(Error::InvalidInput(_))
    ));
    let held = claimed(r.claim("payments", "k-4", &body).await.unwrap());
    struct Unserializable;
    impl serde::Serialize for Unserializable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("no"))
        }
    }
    assert!(matches!(
        r.complete(&held, &Unserializable).await,
        Err(Error::InvalidInput(_))
    ));
    // Nothing was written: the record is still held, and completes.
    r.complete(&held, &1).await.unwrap();
    assert!(
        Records::new(r.store().clone())
            .scope(
                "bad name!",
                ScopeConfig::new(Duration::from_secs(1), Duration::from_secs(1))
            )
            .is_err()
    );
}

/// Row 4 and fencing: a holder whose lease expires mid-work is taken over; its late
/// `complete` gets `LeaseLost` and changes nothing; the new holder's result is the one
/// replayed.
pub async fn expired_lease_is_taken_over_and_the_late_holder_fenced<B: Backend>(b: &B) {
    // A lease that outlasts the in-flight check on a loaded machine, and runs out by time.
    let lease = Duration::from_secs(1);
    let r = records(b, lease).await;
    let first = claimed(r.claim("payments", "k", &"p").await.unwrap());
    assert!(matches!(
        r.claim("payments", "k", &"p").await,
        Err(Error::InFlight { .. })
    ));
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let second = claimed(r.claim("payments", "k", &"p").await.unwrap());
    assert_eq!(second.attempt(), 2);
    assert!(matches!(
        r.complete(&first, &"late").await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(matches!(
        r.extend(&first).await,
        Err(Error::LeaseLost { .. })
    ));
    r.complete(&second, &"second").await.unwrap();
    assert_eq!(
        r.claim("payments", "k", &"p").await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""second""#.into()))
    );
}

/// 64 identical requests at once: exactly one claims, every other is told it is in
/// flight; once completed, every one is replayed. The race happened: a claim told "in
/// flight" was sent while the winning claim was still running (up to
/// [`RACE_ROUNDS`](super::RACE_ROUNDS) rounds, each on a key of its own, until one shows it).
pub async fn identical_claims_storm_one_runs<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let mut raced_winner = 0;
    for round in 0..super::RACE_ROUNDS {
        let key = format!("storm-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (r, barrier, key) = (r.clone(), barrier.clone(), key.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    super::timed(r.claim("payments", &key, &"same")).await
                })
            })
            .collect();
        let mut held = Vec::new();
        let mut spans = Vec::new();
        let mut winner = 0;
        for t in tasks {
            let (answer, span) = t.await.unwrap();
            match answer {
                Ok(Claim::Claimed(h)) => {
                    winner = spans.len();
                    held.push(h);
                }
                Err(Error::InFlight { .. }) => {}
                other => panic!("{other:?}"),
            }
            spans.push(span);
        }
        assert_eq!(held.len(), 1);
        r.complete(&held[0], &"done").await.unwrap();
        for _ in 0..8 {
            assert_eq!(
                r.claim("payments", &key, &"same").await.unwrap(),
                Claim::Replayed(Stored::Succeeded(r#""done""#.into()))
            );
        }
        raced_winner = super::raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {} rounds no claim was sent while the winning claim ran: no race",
        super::RACE_ROUNDS
    );
}

/// Completed inside the caller's transaction, the record commits or rolls back with the
/// caller's own writes: rolled back, neither the effect nor the completion remains (the
/// record is still held); committed, both do.
pub async fn complete_in_commits_with_the_callers_writes<B: Backend>(b: &B) {
    b.exec("CREATE TABLE reservations (order_id BIGINT NOT NULL, sku VARCHAR(32) NOT NULL)")
        .await;
    let r = records(b, Duration::from_secs(30)).await;
    let held = claimed(r.claim("payments", "k", &"p").await.unwrap());
    for commit in [false, true] {
        let mut tx = b.begin().await;
        B::exec_in(
            &mut tx,
            "INSERT INTO reservations (order_id, sku) VALUES (1, 'sku-1')",
        )
        .await;
        r.complete_in(&mut tx, &held, &"reserved").await.unwrap();
        if commit {
            B::commit(tx).await;
        } else {
            B::rollback(tx).await;
            assert_eq!(b.scalar("SELECT COUNT(*) FROM reservations").await, 0);
            assert!(matches!(
                r.claim("payments", "k", &"p").await,
                Err(Error::InFlight { .. })
            ));
        }
    }
    assert_eq!(b.scalar("SELECT COUNT(*) FROM reservations").await, 1);
    assert_eq!(
        r.claim("payments", "k", &"p").await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""reserved""#.into()))
    );
}

/// Past its retention a record counts as absent: the next claim starts afresh, with any
/// payload.
pub async fn expired_records_count_as_absent<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let held = claimed(r.claim("short", "k", &"p").await.unwrap());
    r.complete(&held, &"old").await.unwrap();
    assert!(matches!(
        r.claim("short", "k", &"p").await.unwrap(),
        Claim::Replayed(_)
    ));
    tokio::time::sleep(SHORT_RETENTION + Duration::from_millis(100)).await;
    let fresh = claimed(r.claim("short", "k", &"another payload").await.unwrap());
    assert_eq!(fresh.attempt(), 1);
}

/// Rows orderly never writes, edited behind its back: a completed record without its
/// result is `CorruptRecord` (never replayed as `null`), to a claim and to `run`; a
/// released record whose attempt counter is at `i32::MAX` is claimed, and the claim that
/// committed is answered `Claimed` (the counter stays at its bound), never an error.
pub async fn records_impossible_rows_are_reported_not_replayed<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let held = claimed(r.claim("payments", "no-result", &1).await.unwrap());
    r.complete(&held, &Some(5)).await.unwrap();
    b.exec("UPDATE orderly_idempotency_records SET result = NULL WHERE idem_key = 'no-result'")
        .await;
    let err = r.claim("payments", "no-result", &1).await.unwrap_err();
    assert!(matches!(err, Error::CorruptRecord { .. }), "{err:?}");
    let ran = r
        .run("payments", "no-result", &1, |_conn| {
            Box::pin(async { Ok::<_, Error>(orderly::Done::<Option<i32>, ()>::Succeeded(Some(6))) })
        })
        .await;
    assert!(matches!(ran, Err(Error::CorruptRecord { .. })), "{ran:?}");

    let held = claimed(r.claim("payments", "worn-out", &1).await.unwrap());
    r.release(&held).await.unwrap();
    b.exec(&format!(
        "UPDATE orderly_idempotency_records SET attempt = {} WHERE idem_key = 'worn-out'",
        i32::MAX
    ))
    .await;
    let held = claimed(r.claim("payments", "worn-out", &1).await.unwrap());
    assert_eq!(held.attempt(), i32::MAX);
    r.complete(&held, &"done").await.unwrap();
    assert_eq!(
        r.claim("payments", "worn-out", &1).await.unwrap(),
        Claim::Replayed(Stored::Succeeded(r#""done""#.into()))
    );
}

/// Concurrent claims go together in one statement while another is in flight (on a
/// store that batches claims), and each is answered exactly as if it had gone alone: a
/// new key is claimed (attempt 1) under the claimant's own token; of four twins of a new
/// key one claims and three are in flight; a completed key is replayed; a held key is in
/// flight; another payload under a held key is a mismatch; a key whose lease ran out is
/// taken over (attempt 2). Rounds of such storms run until batches were seen (bounded);
/// a store that does not batch claims shows none.
pub async fn coalesced_claims_answer_each_claim_truly<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let batches = B::S::BATCHES_CLAIMS;
    let mut round = 0;
    loop {
        round += 1;
        let tag = format!("c{round}");
        let done = claimed(
            r.claim("payments", &format!("{tag}-done"), &"p")
                .await
                .unwrap(),
        );
        r.complete(&done, &"ok").await.unwrap();
        let stale = claimed(
            r.claim("payments", &format!("{tag}-stale"), &"p")
                .await
                .unwrap(),
        );
        // Its lease run out (the database's clock is past it), its retention not.
        b.exec(&format!(
            "UPDATE orderly_idempotency_records SET lease_until = 0 WHERE idem_key = '{tag}-stale'"
        ))
        .await;
        let live = claimed(
            r.claim("payments", &format!("{tag}-held"), &"p")
                .await
                .unwrap(),
        );
        // (key, payload) of every claim in the storm.
        let mut asks: Vec<(String, &str)> =
            (0..24).map(|i| (format!("{tag}-new-{i}"), "p")).collect();
        asks.extend((0..4).map(|_| (format!("{tag}-twin"), "p")));
        asks.push((format!("{tag}-done"), "p"));
        asks.push((format!("{tag}-held"), "p"));
        asks.push((format!("{tag}-held"), "other"));
        asks.push((format!("{tag}-stale"), "p"));
        let barrier = Arc::new(tokio::sync::Barrier::new(asks.len()));
        let tasks: Vec<_> = asks
            .iter()
            .cloned()
            .map(|(key, payload)| {
                let (r, barrier) = (r.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    r.claim("payments", &key, &payload).await
                })
            })
            .collect();
        let mut twins_held = 0;
        for ((key, payload), task) in asks.iter().zip(tasks) {
            let answer = task.await.unwrap();
            let kind = key.rsplit_once('-').map_or(key.as_str(), |(_, k)| k);
            match (kind, *payload, answer) {
                ("twin", _, Ok(Claim::Claimed(held))) => {
                    assert_eq!(held.attempt(), 1);
                    twins_held += 1;
                    let token = b
                        .scalar(&format!(
                            "SELECT count(*) FROM orderly_idempotency_records WHERE idem_key = '{key}' \
                             AND owner_token = '{}'",
                            held.token()
                        ))
                        .await;
                    assert_eq!(
                        token, 1,
                        "{key}: the record is not under its holder's token"
                    );
                }
                ("twin", _, Err(Error::InFlight { .. })) => {}
                ("done", _, Ok(Claim::Replayed(stored))) => {
                    assert_eq!(stored, Stored::Succeeded(r#""ok""#.into()))
                }
                ("held", "p", Err(Error::InFlight { .. })) => {}
                ("held", "other", Err(Error::PayloadMismatch { .. })) => {}
                ("stale", _, Ok(Claim::Claimed(held))) => assert_eq!(held.attempt(), 2),
                (_, _, Ok(Claim::Claimed(held))) if key.contains("-new-") => {
                    assert_eq!(held.attempt(), 1);
                    let token = b
                        .scalar(&format!(
                            "SELECT count(*) FROM orderly_idempotency_records WHERE idem_key = '{key}' \
                             AND owner_token = '{}' AND status = 'PROCESSING'",
                            held.token()
                        ))
                        .await;
                    assert_eq!(
                        token, 1,
                        "{key}: the record is not under its holder's token"
                    );
                }
                (_, _, other) => panic!("{key} ({payload}): {other:?}"),
            }
        }
        assert_eq!(twins_held, 1, "twins of one key: exactly one holds it");
        assert!(matches!(
            r.complete(&stale, &"late").await,
            Err(Error::LeaseLost { .. })
        ));
        drop(live);
        let seen = r.coalesced_claims();
        if !batches {
            assert_eq!(
                seen.batches, 0,
                "a store that does not batch claims batched"
            );
            break;
        }
        if seen.batches > 0 {
            assert!(seen.claims >= 2 * seen.batches);
            break;
        }
        assert!(
            round < 20,
            "no claims were ever coalesced: the test shows nothing"
        );
    }
}

/// A claim whose caller stops waiting while it is queued behind another claim's
/// statement is never sent, and the claims queued with it are still made. The first
/// claim's statement waits on a record that a held transaction inserted (the same key),
/// so the claims sent meanwhile queue behind it for 100 ms (on SQLite the held
/// transaction holds the write lock). On a store that does not batch claims, nothing
/// is coalesced.
pub async fn claims_dropped_while_queued_are_never_sent<B: Backend>(b: &B) {
    let r = records(b, Duration::from_secs(30)).await;
    let mut blocker = b.begin().await;
    B::exec_in(
        &mut blocker,
        "INSERT INTO orderly_idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
         attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
         VALUES ('payments', 'slow', NULL, 'PROCESSING', 'blocker', 1, 0, 0, NULL, FALSE, 0, 0)",
    )
    .await;
    super::until_the_pool_is_idle::<B>(r.store()).await;
    let slow = {
        let r = r.clone();
        tokio::spawn(async move { r.claim("payments", "slow", &"p").await })
    };
    // The slow claim holds a connection once its statement is on its way (it took the
    // claims' turn first): the others are sent only then, however long that took.
    super::until_a_connection_is_taken::<B>(r.store(), || slow.is_finished()).await;
    // And its statement reached the held record's lock.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let kept = {
        let r = r.clone();
        tokio::spawn(async move { r.claim("payments", "kept", &"p").await })
    };
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        r.claim("payments", "gone", &"p"),
    )
    .await;
    if !B::S::BATCHES_CLAIMS {
        // Each claim is its own statement (on MariaDB the held insert's locks can still
        // make the claim of a neighbouring key wait): nothing was coalesced.
        drop(gone);
        assert_eq!(r.coalesced_claims(), orderly::CoalescedClaims::default());
        B::rollback(blocker).await;
        claimed(slow.await.unwrap().unwrap());
        claimed(kept.await.unwrap().unwrap());
        return;
    }
    assert!(gone.is_err(), "the claim did not queue: {gone:?}");
    B::rollback(blocker).await;
    let slow = claimed(slow.await.unwrap().unwrap());
    let kept = claimed(kept.await.unwrap().unwrap());
    assert_eq!((slow.attempt(), kept.attempt()), (1, 1));
    let count = "SELECT count(*) FROM orderly_idempotency_records WHERE idem_key = ";
    assert_eq!(
        b.scalar(&format!("{count}'gone'")).await,
        0,
        "an abandoned queued claim was sent"
    );
    assert_eq!(b.scalar(&format!("{count}'kept'")).await, 1);
    assert!(matches!(
        r.claim("payments", "gone", &"p").await.unwrap(),
        Claim::Claimed(_)
    ));
}
