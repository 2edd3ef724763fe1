//! Relays racing, keeping each entity's order while events commit, setting aside a poison
//! event or a corrupt row, and shutting down with the batch in hand.

#[allow(unused_imports)]
use super::*;

/// Eight relays race over 2,000 events of 100 entities: every event is published, once
/// but what a relay published and could not record (no relay died, so no lease ran out;
/// relays racing on a Galera node meet deadlocks at the record's commit), each entity's
/// first copies in version order, and no two publishes of one entity overlap. The race
/// happened: several relays published, and publishes overlapped across entities.
pub async fn relays_race_each_event_once_in_order<B: Backend>(b: &B) {
    let (entities, per_entity) = (100, 20);
    seed(b, entities, per_entity).await;
    let rec = Arc::new(Recorder::default());
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = b.store(Duration::from_secs(10)).await;
        let relay = Relay::new(store, RecordingSink::new(rec.clone(), n))
            .with_config(fast(16))
            .unwrap();
        let rec = rec.clone();
        tasks.push(tokio::spawn(
            async move { drain_noting(&rec, &relay, n).await },
        ));
    }
    let mut unrecorded = HashSet::new();
    for task in tasks {
        unrecorded.extend(task.await.unwrap());
    }
    assert_once_but_unrecorded(&rec, &unrecorded, entities * per_entity, per_entity);
    assert_eq!(
        rec.overlaps.load(Ordering::SeqCst),
        0,
        "one entity's publishes overlapped"
    );
    let relays: HashSet<usize> = rec.received().iter().map(|r| r.2).collect();
    assert!(
        relays.len() >= 2,
        "only relays {relays:?} published: no race"
    );
    assert!(
        rec.peak.load(Ordering::SeqCst) > 1,
        "publishes never overlapped"
    );
    let outbox = Outbox::new(b.store(Duration::from_secs(10)).await);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'PUBLISHED' AND owner_token IS NULL"
        )
        .await,
        entities * per_entity
    );
}

/// Four relays run while writers commit events, each entity's versions one right after
/// another, each in its own transaction: a claim's read can meet an entity's earlier and
/// later events committed after it began, and must still take only the earliest. Every
/// event is received, once unless a relay published it and could not record it (relays
/// racing on a Galera node meet deadlocks at the record's commit), each entity's first
/// copies in version order, no two publishes of one entity overlap; the race happened:
/// events were published while the writers wrote.
pub async fn relays_keep_order_while_events_commit<B: Backend>(b: &B) {
    let (writers, per_writer, per_entity) = (8_i64, 60_i64, 4_i64);
    let rec = Arc::new(Recorder::default());
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut relays = Vec::new();
    for n in 0..4 {
        let store = b.store(Duration::from_secs(10)).await;
        let relay = Relay::new(store, RecordingSink::new(rec.clone(), n))
            .with_config(fast(64))
            .unwrap();
        let writing = writing.clone();
        let rec = rec.clone();
        relays.push(tokio::spawn(async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            // What this relay published and could not record: the only events another
            // may publish again (docs/outbox.md, "Duplicates").
            let mut unrecorded = std::collections::HashSet::new();
            loop {
                // Relays racing on MySQL/MariaDB (most on a Galera node) meet deadlocks,
                // some at the record's commit after the publish: a retryable error,
                // which `Relay::run` retries too.
                match rec
                    .round_noting_unrecorded(&relay, n, &mut unrecorded)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("relay_once: {e}"),
                }
                if !writing.load(Ordering::SeqCst)
                    && relay.outbox().stats().await.unwrap().pending == 0
                {
                    return unrecorded;
                }
                assert!(std::time::Instant::now() < deadline, "never drained");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }));
    }
    // The most events received as a writer was about to write its last one: counted
    // there, not after the writers are joined, so that a relay finishing the rest while
    // this task waits to run again cannot hide the race.
    let before_last = Arc::new(AtomicUsize::new(0));
    let write = |w: i64| {
        let (rec, before_last) = (rec.clone(), before_last.clone());
        async move {
            for e in 1..=per_writer {
                let entity = w * per_writer + e;
                for version in 1..=per_entity {
                    if e == per_writer && version == per_entity {
                        before_last.fetch_max(rec.received().len(), Ordering::SeqCst);
                    }
                    b.exec(&format!(
                        "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, \
                         from_status, to_status, ref_id) \
                     VALUES ('OrderMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', \
                         'Paid', 'r-{entity}-{version}')"
                    ))
                    .await;
                }
            }
        }
    };
    futures_util::future::join_all((0..writers).map(write)).await;
    let while_writing = before_last.load(Ordering::SeqCst);
    writing.store(false, Ordering::SeqCst);
    let mut unrecorded = std::collections::HashSet::new();
    for relay in relays {
        unrecorded.extend(relay.await.unwrap());
    }
    assert_once_but_unrecorded(
        &rec,
        &unrecorded,
        writers * per_writer * per_entity,
        per_entity,
    );
    assert_eq!(rec.overlaps(), 0, "one entity's publishes overlapped");
    assert!(
        while_writing > 0,
        "no race: nothing was published before the writers' last events"
    );
}

/// A poison event (the sink refuses it every time) is retried with backoff and moves to
/// the dead state after `max_attempts` claims, with its last error (cut to the bound);
/// it holds back only its own entity's later events, never another entity's. A
/// permanent refusal dies at once. Requeued once the sink takes it, it and the events
/// behind it go out in order.
pub async fn poison_event_dies_without_holding_back_others<B: Backend>(b: &B) {
    seed(b, 3, 3).await;
    let rec = Arc::new(Recorder::default());
    let long = "x".repeat(100_000);
    rec.refuse
        .lock()
        .unwrap()
        .insert((1, 2), SinkError::retry(&long));
    rec.refuse
        .lock()
        .unwrap()
        .insert((3, 1), SinkError::permanent("schema rejected"));
    let store = b.store(Duration::from_secs(10)).await;
    let relay = Relay::new(
        store,
        RecordingSink {
            rec: rec.clone(),
            relay: 0,
        },
    )
    .with_config(fast(8))
    .unwrap();
    drain_quiet(&relay).await;
    let seen = rec.by_entity();
    assert_eq!(
        seen.get(&1),
        Some(&vec![1]),
        "entity 1 stops at its dead event"
    );
    assert_eq!(
        seen.get(&2),
        Some(&vec![1, 2, 3]),
        "entity 2 is not held back"
    );
    assert_eq!(seen.get(&3), None, "entity 3's first event died at once");
    assert_eq!(
        rec.refused.load(Ordering::SeqCst),
        3 + 1,
        "three tries of the poison, one of the permanent refusal"
    );
    let outbox = relay.outbox();
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (3, 2), "{stats:?}");
    let dead = outbox.dead(10).await.unwrap();
    assert_eq!(
        dead.iter()
            .map(|d| (d.entity_id, d.version))
            .collect::<Vec<_>>(),
        [(1, 2), (3, 1)]
    );
    let error = dead[0].last_error.as_deref().unwrap();
    assert!(
        error.len() <= orderly::flow::MAX_ERROR_BYTES,
        "{}",
        error.len()
    );
    assert!(
        error.ends_with("[truncated, 100000 bytes]"),
        "{}",
        &error[error.len() - 40..]
    );
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(dead[1].last_error.as_deref(), Some("schema rejected"));

    // Requeued (and taken now): the dead event and those behind it, in order.
    rec.refuse.lock().unwrap().clear();
    let key = |entity_id, version| EventKey {
        machine: "OrderMachine".into(),
        entity_id,
        version,
    };
    assert!(outbox.requeue(&key(1, 2)).await.unwrap());
    assert!(!outbox.requeue(&key(1, 2)).await.unwrap(), "no longer dead");
    assert!(
        !outbox.requeue(&key(2, 1)).await.unwrap(),
        "published, not dead"
    );
    assert!(outbox.requeue(&key(3, 1)).await.unwrap());
    drain(&relay).await;
    let seen = rec.by_entity();
    assert_eq!(seen.get(&1), Some(&vec![1, 2, 3]));
    assert_eq!(seen.get(&3), Some(&vec![1, 2, 3]));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
}

/// Rows orderly never writes, each on its own entity, among healthy ones: a `created_at`
/// that is no time (PostgreSQL's `infinity`, MariaDB's zero date, on SQLite text that is
/// no date), a body that is not JSON, a version below 1, on SQLite a BLOB body and a
/// text version, a status orderly never writes, a claim by an unknown owner with a lease
/// of centuries; on SQLite also a text entity id. The relay publishes every healthy
/// entity in order; no corrupt row is published; the ones it claims go dead at their
/// first claim with the reason (their attempts never climb), a text version or entity id
/// too; each holds back only its own entity (a text entity id, whose entity cannot be
/// known, none); `stats` counts and `corrupt` lists them; `pending` and `dead` still
/// answer, `dead` with a BLOB body read lossily.
pub async fn corrupt_rows_are_set_aside_and_hold_back_only_their_entity<B: Backend>(b: &B) {
    let backend = std::any::type_name::<B::S>();
    let sqlite = backend.contains("Sqlite");
    seed(b, if sqlite { 9 } else { 8 }, 3).await;
    let at =
        |entity: i64, version: i64| format!("WHERE entity_id = {entity} AND version = {version}");
    // 1: a created_at the database cannot count from.
    let no_time = if backend.contains("Pg") {
        "'infinity'"
    } else if backend.contains("MySql") {
        "'0000-00-00 00:00:00'"
    } else {
        "'not a date'"
    };
    b.exec(&format!(
        "UPDATE orderly_outbox SET created_at = {no_time} {}",
        at(1, 1)
    ))
    .await;
    // 2: a status orderly never writes.
    b.exec(&format!(
        "UPDATE orderly_outbox SET status = 'WEIRD' {}",
        at(2, 1)
    ))
    .await;
    // 3: a body that is not JSON.
    b.exec(&format!(
        "UPDATE orderly_outbox SET body = 'not json {{' {}",
        at(3, 1)
    ))
    .await;
    // 5: a version below 1, before the entity's first.
    b.exec(&format!(
        "UPDATE orderly_outbox SET version = -5 {}",
        at(5, 1)
    ))
    .await;
    // 6: claimed by no relay of ours, for centuries.
    b.exec(&format!(
        "UPDATE orderly_outbox SET owner_token = 'ghost', lease_until = 9000000000000000 {}",
        at(6, 1)
    ))
    .await;
    if sqlite {
        // 7: a BLOB body; 8: a text version.
        b.exec(&format!(
            "UPDATE orderly_outbox SET body = X'00FF' {}",
            at(7, 1)
        ))
        .await;
        b.exec(&format!(
            "UPDATE orderly_outbox SET version = 'v1' {}",
            at(8, 1)
        ))
        .await;
        // 9: a text entity id.
        b.exec(&format!(
            "UPDATE orderly_outbox SET entity_id = 'zz' {}",
            at(9, 1)
        ))
        .await;
    }
    let rec = Arc::new(Recorder::default());
    let store = b.store(Duration::from_secs(10)).await;
    let relay = Relay::new(
        store,
        RecordingSink {
            rec: rec.clone(),
            relay: 0,
        },
    )
    .with_config(fast(4))
    .unwrap();
    let mut corrupt_seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut empty = 0;
    while empty < 50 {
        let round = relay.relay_once().await.expect("a round fails on no row");
        corrupt_seen += round.corrupt;
        empty = if round.claimed == 0 { empty + 1 } else { 0 };
        assert!(
            std::time::Instant::now() < deadline,
            "the relay never went quiet"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seen = rec.by_entity();
    assert_eq!(
        seen.get(&4),
        Some(&vec![1, 2, 3]),
        "a healthy entity is published"
    );
    if !sqlite {
        assert_eq!(seen.get(&7), Some(&vec![1, 2, 3]));
        assert_eq!(seen.get(&8), Some(&vec![1, 2, 3]));
    }
    for entity in [1, 2, 3, 5, 6] {
        assert_eq!(
            seen.get(&entity),
            None,
            "entity {entity}: held back by its corrupt row"
        );
    }
    if sqlite {
        assert_eq!(seen.get(&7), None, "a BLOB body is not published");
        // The text version sorts after every integer: its entity's events go out, the
        // row itself never. The text entity id belongs to no entity that can be known: it
        // holds back none.
        assert_eq!(seen.get(&8), Some(&vec![2, 3]));
        assert_eq!(seen.get(&9), Some(&vec![2, 3]));
    }
    let set_aside = if sqlite { 6 } else { 3 };
    assert_eq!(corrupt_seen, set_aside, "rows set aside by the relay");
    let dead_corrupt = b
        .scalar(
            "SELECT count(*) FROM orderly_outbox WHERE status = 'DEAD' AND attempts = 1 \
             AND last_error LIKE 'corrupt row: %'",
        )
        .await;
    assert_eq!(
        dead_corrupt, set_aside as i64,
        "dead at the first claim, with the reason"
    );
    let outbox = relay.outbox();
    let stats = outbox.stats().await.unwrap();
    // Entities 1, 3, 5 (and 7) wait behind their dead row; 2 and 6 behind theirs. On
    // SQLite the text keys are dead too, and counted with the rows orderly never writes.
    let (pending, dead, unclaimed) = if sqlite { (13, 6, 5) } else { (11, 3, 2) };
    assert_eq!(
        (stats.pending, stats.dead, stats.corrupt),
        (pending, dead, unclaimed),
        "{stats:?}"
    );
    let corrupt = outbox.corrupt(10).await.unwrap();
    let listed: Vec<_> = corrupt
        .iter()
        .map(|c| (c.entity_id.as_str(), c.version.as_str(), c.reason.as_str()))
        .collect();
    assert!(
        listed.contains(&("2", "1", "a status orderly never writes")),
        "{listed:?}"
    );
    assert!(
        listed
            .iter()
            .any(|(e, v, why)| (*e, *v) == ("6", "1") && why.starts_with("claimed by ghost")),
        "{listed:?}"
    );
    if sqlite {
        assert!(
            listed.contains(&("8", "v1", "an entity id or version that is not an integer")),
            "{listed:?}"
        );
        assert!(
            listed.contains(&("zz", "1", "an entity id or version that is not an integer")),
            "{listed:?}"
        );
        let named = b
            .scalar(
                "SELECT count(*) FROM orderly_outbox WHERE status = 'DEAD' AND last_error LIKE \
                 'corrupt row: an entity id or version that is not an integer (entity id ''zz'', version 1)%'",
            )
            .await;
        assert_eq!(named, 1, "the dead row names its key");
        assert!(
            listed.contains(&("7", "1", "a column of the wrong type")),
            "{listed:?}"
        );
    }
    assert!(outbox.pending(100).await.is_ok());
    let dead = outbox.dead(100).await.unwrap();
    let mut dead_keys: Vec<_> = dead.iter().map(|d| (d.entity_id, d.version)).collect();
    dead_keys.sort();
    if sqlite {
        // The BLOB body is listed too, its bytes read lossily: an operator sees every
        // dead row whose key reads.
        assert_eq!(dead_keys, [(1, 1), (3, 1), (5, -5), (7, 1)]);
        let blob = dead.iter().find(|d| d.entity_id == 7).unwrap();
        assert_eq!(blob.body.as_deref(), Some("\0\u{FFFD}"));
    } else {
        assert_eq!(dead_keys, [(1, 1), (3, 1), (5, -5)]);
    }
}

/// `Relay::run` stops on its shutdown signal after finishing the batch in hand: the
/// events it had claimed are published and recorded, none is left claimed.
pub async fn relay_shutdown_finishes_the_batch_in_hand<B: Backend>(b: &B) {
    seed(b, 40, 1).await;
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
    .with_config(fast(10))
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        relay
            .run(async {
                stopped.await.ok();
            })
            .await
    });
    // Stop while the first batch is being published (each publish takes 300 ms).
    while rec.current.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.send(()).unwrap();
    let total = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("run stopped")
        .unwrap()
        .unwrap();
    assert!(total.claimed >= 10, "{total:?}");
    assert_eq!(total.published, total.claimed, "{total:?}");
    assert!(total.claimed < 40, "it went on after the signal: {total:?}");
    assert_eq!(rec.received().len(), total.published);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE owner_token IS NOT NULL")
            .await,
        0
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE status = 'PUBLISHED'")
            .await,
        total.published as i64
    );
}

#[derive(Clone)]
pub(crate) struct SlowSink {
    pub(crate) inner: RecordingSink,
}

impl Sink for SlowSink {
    async fn publish(&self, m: &Message) -> Result<(), SinkError> {
        self.inner.rec.current.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.inner.rec.current.fetch_sub(1, Ordering::SeqCst);
        self.inner.publish(m).await
    }
}
