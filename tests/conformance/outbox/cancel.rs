//! A relay dropped at every await point and cut at each statement: nothing left claimed.

#[allow(unused_imports)]
use super::*;

/// A relay round dropped at every await point leaves no connection in a transaction and
/// no event claimed past its lease: once the lease runs out, another relay publishes
/// everything, in order per entity. Events the dropped round published without recording
/// are published again (the duplicate window a consumer dedupes by message id).
pub async fn relay_dropped_at_every_await_point_leaves_nothing_claimed<B: Backend>(b: &B) {
    let (entities, per_entity) = (4, 6);
    seed(b, entities, per_entity).await;
    let store = b.store(Duration::from_secs(10)).await;
    let rec = Arc::new(Recorder::default());
    let lease = Duration::from_millis(400);
    let config = fast_by(4, Claim::Lease)
        .lease(lease)
        .publish_timeout(Duration::from_millis(200));
    let relay = Relay::new(
        store.clone(),
        RecordingSink {
            rec: rec.clone(),
            relay: 0,
        },
    )
    .with_config(config.clone())
    .unwrap();
    // First a round dropped for certain while it holds its claim: in the middle of its
    // publishes (which take 300 ms each here).
    let slow = Relay::new(
        store.clone(),
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 1,
            },
        },
    )
    .with_config(config.clone())
    .unwrap();
    {
        let round = slow.relay_once();
        tokio::pin!(round);
        while rec.current.load(Ordering::SeqCst) == 0 {
            tokio::select! {
                out = &mut round => panic!("the round ended before it published: {out:?}"),
                () = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
    }
    rec.current.store(0, Ordering::SeqCst);
    assert!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE owner_token IS NOT NULL")
            .await
            > 0,
        "the dropped round held no claim"
    );
    let mut drops = 1;
    // Then every await point: k = 0, 1, 2, … polls until a round completes.
    for k in 0.. {
        assert_pool_clean(b, &store).await;
        // A dropped round's connection was closed; the server rolls back what it held
        // once it sees the socket closed, which on a loaded machine can take a moment.
        let mut open = b.open_transactions().await;
        for _ in 0..34 {
            if open == 0 {
                break;
            }
            tokio::time::sleep(POLL).await;
            open = b.open_transactions().await;
        }
        assert_eq!(
            open, 0,
            "a session is still in a transaction 2 s after the drop"
        );
        // Whatever the dropped round claimed comes free when its lease runs out.
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let held_until = b
            .scalar(
                "SELECT COALESCE(MAX(lease_until), 0) FROM orderly_outbox \
                 WHERE status = 'PENDING' AND owner_token IS NOT NULL",
            )
            .await;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        assert!(
            held_until <= now_ms,
            "an event is still claimed {} ms past the dropped round's lease",
            held_until - now_ms
        );
        match poll_at_most(relay.relay_once(), k).await {
            Some(round) => {
                round.unwrap();
                break;
            }
            None => drops += 1,
        }
        assert!(k < 200, "a round never completed");
    }
    assert!(drops >= 3, "the round was dropped at {drops} points only");
    drain(&relay).await;
    assert_pool_clean(b, &store).await;
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    for (entity, version, _) in rec.received() {
        let seen = firsts.entry(entity).or_default();
        if !seen.contains(&version) {
            seen.push(version);
        }
    }
    for entity in 1..=entities {
        assert_eq!(
            firsts.get(&entity),
            Some(&(1..=per_entity).collect::<Vec<_>>()),
            "entity {entity}"
        );
    }
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_outbox WHERE status <> 'PUBLISHED' OR owner_token IS NOT NULL"
        )
        .await,
        0
    );
}

/// A relay claiming by row locks, its round dropped in the middle of its publishes and
/// then at every await point. While the first dropped round held its batch (the earliest
/// event of every entity), another relay found nothing to claim; once it was dropped,
/// that relay claimed the batch at once (the connection closed, nothing to expire). No
/// session stays in a transaction, the pool is clean, no row ever carried a lease, and
/// everything is published, each entity's events first received in version order.
pub async fn locked_relay_dropped_at_every_await_point_frees_its_batch_at_once<B: Networked>(
    b: &B,
) {
    if !holds_claims_by_lock(b).await {
        return assert_claims_fall_back_to_a_lease(b).await;
    }
    let (entities, per_entity) = (4, 6);
    seed(b, entities, per_entity).await;
    let store = b.store(Duration::from_secs(10)).await;
    let rec = Arc::new(Recorder::default());
    let relay = |n: usize| {
        Relay::new(
            store.clone(),
            RecordingSink {
                rec: rec.clone(),
                relay: n,
            },
        )
        .with_config(fast_by(4, Claim::Lock))
        .unwrap()
    };
    let (relay, other) = (relay(0), relay(2));
    let slow = Relay::new(
        store.clone(),
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 1,
            },
        },
    )
    .with_config(fast_by(4, Claim::Lock))
    .unwrap();
    {
        let round = slow.relay_once();
        tokio::pin!(round);
        while rec.current.load(Ordering::SeqCst) == 0 {
            tokio::select! {
                out = &mut round => panic!("the round ended before it published: {out:?}"),
                () = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
        }
        let meanwhile = other.relay_once().await.unwrap();
        assert_eq!(
            meanwhile.claimed, 0,
            "another relay claimed events of a batch held by lock"
        );
    }
    rec.current.store(0, Ordering::SeqCst);
    until_no_transaction_is_open(b).await;
    let freed = other.relay_once().await.unwrap();
    assert_eq!(
        (freed.claimed, freed.published),
        (4, 4),
        "the dropped round's batch was not claimable at once"
    );
    let mut drops = 1;
    for k in 0.. {
        assert_pool_clean(b, &store).await;
        until_no_transaction_is_open(b).await;
        assert_no_lease(b).await;
        match poll_at_most(relay.relay_once(), k).await {
            Some(round) => {
                round.unwrap();
                break;
            }
            None => drops += 1,
        }
        assert!(k < 200, "a round never completed");
    }
    assert!(drops >= 3, "the round was dropped at {drops} points only");
    drain(&relay).await;
    assert_pool_clean(b, &store).await;
    assert_no_lease(b).await;
    assert_first_receipts_in_order(&rec, entities, per_entity);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE status <> 'PUBLISHED'")
            .await,
        0
    );
}

/// A relay claiming by row locks, its connection cut at each statement of its round (the
/// lock, the record of what it published, the commit): as the statement goes out (the
/// server never sees it), and right after the server answered it (the relay never
/// hears). The round answers a retryable error, or what the database then holds; no
/// session is left in a transaction and no lease was written, so the batch is claimable
/// at once; a relay on a direct connection publishes everything, each entity's events
/// first received in version order, at most the cut batch twice, and each event counts
/// one attempt (a cut round's attempt only if it committed).
pub async fn locked_relay_cut_at_each_statement<B: Networked>(b: &B) {
    if !holds_claims_by_lock(b).await {
        return assert_claims_fall_back_to_a_lease(b).await;
    }
    use crate::server::{Cut, Proxy};
    let commit: &'static [u8] = if <B::S as orderly::Store>::BACKEND == "postgres" {
        b"COMMIT"
    } else {
        b"\x03COMMIT"
    };
    let points: [&'static [u8]; 3] = [b"SKIP LOCKED", b"SET status = 'PUBLISHED'", commit];
    let (entities, per_entity) = (4, 2);
    for point in points {
        for cut in [Cut::Request(point), Cut::ReplyTo(point)] {
            b.exec("DELETE FROM orderly_outbox").await;
            seed(b, entities, per_entity).await;
            let rec = Arc::new(Recorder::default());
            let proxy = Proxy::start(b.server(), cut).await;
            let cut_relay = Relay::new(
                b.store_at(proxy.port, 2).await,
                RecordingSink {
                    rec: rec.clone(),
                    relay: 1,
                },
            )
            .with_config(fast_by(8, Claim::Lock))
            .unwrap();
            let answer = cut_relay.relay_once().await;
            assert_eq!(
                proxy.cuts(),
                1,
                "{cut:?}: the proxy never cut, so the test shows nothing"
            );
            until_no_transaction_is_open(b).await;
            let published = b
                .scalar("SELECT COUNT(*) FROM orderly_outbox WHERE status = 'PUBLISHED'")
                .await;
            match answer {
                Ok(round) => assert_eq!(round.published as i64, published, "{cut:?}: {round:?}"),
                Err(e) => assert!(e.is_retryable(), "{cut:?}: {e}"),
            }
            assert_no_lease(b).await;
            let direct = Relay::new(
                b.store(Duration::from_secs(10)).await,
                RecordingSink {
                    rec: rec.clone(),
                    relay: 0,
                },
            )
            .with_config(fast_by(8, Claim::Lock))
            .unwrap();
            drain(&direct).await;
            assert_first_receipts_in_order(&rec, entities, per_entity);
            let twice = rec.received().len() as i64 - entities * per_entity;
            assert!(twice <= entities, "{cut:?}: {twice} published twice");
            assert_eq!(
                b.scalar(
                    "SELECT COUNT(*) FROM orderly_outbox WHERE attempts <> 1 OR status <> 'PUBLISHED'"
                )
                .await,
                0,
                "{cut:?}: an attempt counted that no commit recorded"
            );
        }
    }
}

/// Whether this database's store holds a relay's claims by lock: it does on one
/// PostgreSQL or MariaDB server; a Galera node answers `None` (its row locks bind no
/// other node), and there [`assert_claims_fall_back_to_a_lease`] is what holds.
pub(crate) async fn holds_claims_by_lock<B: Backend>(b: &B) -> bool {
    let store = b.store(Duration::from_secs(10)).await;
    let mut conn = store.acquire().await.unwrap();
    match store.lock_events(&mut conn, 0).await.unwrap() {
        Some(locked) => {
            assert!(locked.is_empty());
            store.settle_locked(&mut conn, &[], &[]).await.unwrap();
            true
        }
        None => false,
    }
}

/// On a store that holds no claims by lock, a relay configured to claim by lock claims
/// by lease: while it publishes, its events carry its token.
pub(crate) async fn assert_claims_fall_back_to_a_lease<B: Backend>(b: &B) {
    seed(b, 2, 1).await;
    let rec = Arc::new(Recorder::default());
    let relay = Relay::new(
        b.store(Duration::from_secs(10)).await,
        SlowSink {
            inner: RecordingSink {
                rec: rec.clone(),
                relay: 0,
            },
        },
    )
    .with_config(fast_by(4, Claim::Lock))
    .unwrap();
    let round = relay.relay_once();
    tokio::pin!(round);
    while rec.current.load(Ordering::SeqCst) == 0 {
        tokio::select! {
            out = &mut round => panic!("the round ended before it published: {out:?}"),
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE owner_token IS NOT NULL")
            .await,
        2,
        "a relay on a store that holds no claims by lock claimed without a lease"
    );
    round.await.unwrap();
}

/// Waits (5 s at most) until no session of this database is in a transaction: a
/// connection closed by its client is rolled back once the server sees the socket go.
pub(crate) async fn until_no_transaction_is_open<B: Backend>(b: &B) {
    let mut open = b.open_transactions().await;
    for _ in 0..34 {
        if open == 0 {
            return;
        }
        tokio::time::sleep(POLL).await;
        open = b.open_transactions().await;
    }
    assert_eq!(open, 0, "a session is still in a transaction after 5 s");
}

/// How often the tests ask for open transactions: MariaDB's `innodb_trx` is a cache
/// refreshed only once nobody read it for 100 ms, so asking more often, in any test of
/// the server, keeps every reader on an old snapshot.
pub(crate) const POLL: Duration = Duration::from_millis(150);

/// No event carries a claim's token or lease: claims by lock write none.
pub(crate) async fn assert_no_lease<B: Backend>(b: &B) {
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_outbox WHERE owner_token IS NOT NULL OR lease_until <> 0"
        )
        .await,
        0,
        "a claim by lock wrote a lease"
    );
}
