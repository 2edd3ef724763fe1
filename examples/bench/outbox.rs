//! The outbox's modes: `outbox`, `out-hand`, `replay-o`, and the relay against hand-written
//! `SKIP LOCKED` loops.

use super::*;

/// Transitions that emit an event at `c` callers: `Engine::transition` along an edge that
/// emits (the outbox row in the transition's unit, `outbox`), the same writes by hand
/// (`out-hand`), and replays of the requests the first applied (`replay-o`, no row).
pub(crate) async fn outbox_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<EmitMachine, B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    let run = |replayed: bool| {
        let e = engine.clone();
        move |id| {
            let e = e.clone();
            async move {
                let out = e.transition(id, EmitEvent::Pay, &bench_ref(id)).await?;
                ensure(out.is_applied() != replayed, "outbox", id)
            }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.outbox_hand(id).await }
    };
    let names = ["outbox", "out-hand", "replay-o"];
    let ratios = ["outbox_vs_hand", "replay_vs_outbox"];
    layer_pass(
        db,
        c,
        args,
        "outbox",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await
}

/// The relay to JetStream at `url` (feature `nats`).
pub(crate) async fn relay_nats<B: BenchDb>(
    db: &Arc<B>,
    url: &str,
    args: &Args,
) -> Result<String, BoxError> {
    #[cfg(feature = "nats")]
    {
        use async_nats::jetstream::{self, stream};
        let prefix = "orderly_bench";
        let js = jetstream::new(async_nats::connect(url).await?);
        let _ = js.delete_stream(prefix).await;
        js.create_stream(stream::Config {
            name: prefix.into(),
            subjects: vec![format!("{prefix}.>")],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
        let sink = orderly::outbox::NatsSink::connect(url, prefix).await?;
        let line = relay_pass(db, sink, "jetstream", args).await;
        js.delete_stream(prefix).await?;
        line
    }
    #[cfg(not(feature = "nats"))]
    {
        let _ = (db, url, args);
        Err("--nats needs the bench built with --features nats".into())
    }
}

/// The relay's throughput: `--relay-events` events of a quarter as many entities (four
/// each, so one entity's events go out one after another), drained by four relays
/// (`relay`: `Relay::relay_once` in a loop, batches of 128, claims by row lock where the
/// store holds them; `relay-lease`: the same claiming by lease) and by four hand-written
/// loops (`relay-hand`: `SKIP LOCKED` + publish + mark in one transaction, no per-entity
/// order), each twice, alternating, to the same sink. Returns the `relay …` line.
pub(crate) async fn relay_pass<B: BenchDb, K: Sink + Clone>(
    db: &Arc<B>,
    sink: K,
    sink_name: &str,
    args: &Args,
) -> Result<String, BoxError> {
    let events = args.relay_events.max(4);
    let entities = (events / 4).max(1);
    let seed = || async {
        db.exec("DELETE FROM orderly_outbox".into()).await?;
        let mut rows = Vec::new();
        for i in 0..events {
            let (entity, version) = (i % entities + 1, i / entities + 1);
            rows.push(format!(
                "('EmitMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', 'Paid', 'pay-{entity}-{version}')"
            ));
        }
        for chunk in rows.chunks(1000) {
            db.exec(format!(
                "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) VALUES {}",
                chunk.join(", ")
            ))
            .await?;
        }
        Ok::<(), BoxError>(())
    };
    let (mut relay_time, mut lease_time, mut hand_time) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..2 {
        for (claim, time) in [
            (Claim::Lock, &mut relay_time),
            (Claim::Lease, &mut lease_time),
        ] {
            seed().await?;
            let config = RelayConfig::default().batch(128).claim(claim);
            let start = Instant::now();
            let done = Arc::new(AtomicI64::new(0));
            let loops: Vec<_> = (0..4)
                .map(|_| {
                    let relay = Relay::new(db.engine().store().clone(), sink.clone())
                        .with_config(config.clone());
                    let done = done.clone();
                    tokio::spawn(async move {
                        let relay = relay?;
                        while done.load(Ordering::SeqCst) < events {
                            let round = match relay.relay_once().await {
                                Ok(round) => round,
                                // A deadlock between claims (MariaDB): the round is run again.
                                Err(e) if e.is_retryable() => continue,
                                Err(e) => return Err(e.into()),
                            };
                            if round.dead + round.retried > 0 {
                                return Err::<(), BoxError>(
                                    format!("relay round {round:?}").into(),
                                );
                            }
                            done.fetch_add(round.published as i64, Ordering::SeqCst);
                        }
                        Ok(())
                    })
                })
                .collect();
            for l in loops {
                l.await??;
            }
            *time += start.elapsed();
        }

        seed().await?;
        let start = Instant::now();
        let done = Arc::new(AtomicI64::new(0));
        let loops: Vec<_> = (0..4)
            .map(|_| {
                let (db, sink, done) = (db.clone(), sink.clone(), done.clone());
                tokio::spawn(async move {
                    while done.load(Ordering::SeqCst) < events {
                        match db.relay_hand(128, &sink).await {
                            Ok(n) => done.fetch_add(n as i64, Ordering::SeqCst),
                            // A deadlock between the loops (MariaDB): run the round again.
                            Err(e) if is_deadlock(&e) => 0,
                            Err(e) => return Err(e),
                        };
                    }
                    Ok::<(), BoxError>(())
                })
            })
            .collect();
        for l in loops {
            l.await??;
        }
        hand_time += start.elapsed();
    }
    db.exec("DELETE FROM orderly_outbox".into()).await?;
    let rate = |t: Duration| 2.0 * events as f64 / t.as_secs_f64();
    println!(
        "{:<10} {:>8} events {:>10.0}/s   (4 relays, batches of 128 held by row locks where the store can, {entities} entities, sink: {sink_name})",
        "relay",
        2 * events,
        rate(relay_time)
    );
    println!(
        "{:<10} {:>8} events {:>10.0}/s   (the same, claims by lease)",
        "relay-lease",
        2 * events,
        rate(lease_time)
    );
    println!(
        "{:<10} {:>8} events {:>10.0}/s   (4 hand-written SKIP LOCKED + publish + mark loops)",
        "relay-hand",
        2 * events,
        rate(hand_time)
    );
    Ok(format!(
        "relay backend={} relay_vs_hand={:.2} lease_vs_hand={:.2}",
        args.backend,
        rate(relay_time) / rate(hand_time),
        rate(lease_time) / rate(hand_time)
    ))
}

/// Whether `e` is a deadlock or serialization failure (SQLSTATE 40001, 40P01).
pub(crate) fn is_deadlock(e: &BoxError) -> bool {
    matches!(
        e.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("40001" | "40P01"))
    )
}

/// Publishes `rows` through `sink` together.
pub(crate) async fn publish_all<K: Sink>(sink: &K, rows: &[EventRow]) -> Result<(), BoxError> {
    let sent = futures_util::future::join_all(
        rows.iter()
            .map(|row| async move { sink.publish(&Message::from_row(row)).await }),
    )
    .await;
    for outcome in sent {
        outcome?;
    }
    Ok(())
}
