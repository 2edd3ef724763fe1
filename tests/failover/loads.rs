//! The four loads, each re-sending what failed until it is answered.

use super::*;

pub(super) async fn join_all<T>(handles: Vec<JoinHandle<Vec<T>>>) -> Vec<T> {
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    all
}

pub(super) type Transition = Call<(i64, FailoverEvent), Outcome<FailoverState>>;

/// Eight tasks walking orders of their own until the round stops, Pay then Ship, each
/// call re-sent until it is answered; half of them on the coalescing engine, half on the
/// one writing alone.
pub(super) fn transitions_load(
    lab: &Lab,
    base: i64,
    shared: &Shared,
) -> Vec<JoinHandle<Vec<Transition>>> {
    const TASKS: i64 = 8;
    // Orders of one task: ids far apart, and as many as the round walks.
    const SPAN: i64 = 1_000_000;
    (0..TASKS)
        .map(|t| {
            // Half the tasks on each engine.
            let engine = if t % 2 == 0 { &lab.engine } else { &lab.alone };
            let (engine, shared) = (engine.clone(), shared.clone());
            tokio::spawn(async move {
                let mut calls = Vec::new();
                for n in 0..SPAN {
                    let id = base + t * SPAN + n;
                    // Created as it is reached (a create is answered alike if re-sent).
                    let since = Instant::now();
                    while let Err(e) = engine.create(id).await {
                        assert!(
                            e.is_retryable() && since.elapsed() < Duration::from_secs(60),
                            "creating order {id}: {e:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    for (event, reference) in [
                        (FailoverEvent::Pay, "pay-1"),
                        (FailoverEvent::Ship, "ship-1"),
                    ] {
                        until_answered(&(id, event), &mut calls, || {
                            let engine = engine.clone();
                            async move { engine.transition(id, event, reference).await }
                        })
                        .await;
                        if matches!(
                            calls.last(),
                            Some(Call {
                                answer: Ok(Outcome::Applied { .. }),
                                ..
                            })
                        ) {
                            shared.applied.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    if shared.stopping() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                calls
            })
        })
        .collect()
}

/// Requests one after another, each writing its effect row in the record's transaction;
/// the answer is whether it was replayed.
pub(super) fn requests_load(
    records: Records<PgStore>,
    prefix: String,
    shared: Shared,
) -> JoinHandle<Vec<Call<String, bool>>> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        let mut i = 0;
        while !shared.stopping() {
            let key = format!("{prefix}-{i}");
            i += 1;
            let answered = until_answered(&key, &mut calls, || {
                let (records, k) = (records.clone(), key.clone());
                async move {
                    let effect = k.clone();
                    records
                        .run("payments", &k, &1, move |conn| {
                            Box::pin(async move {
                                sqlx::query("INSERT INTO failover_effects (idem_key) VALUES ($1)")
                                    .bind(&effect)
                                    .execute(&mut *conn)
                                    .await?;
                                Ok::<_, Error>(Done::<(), ()>::Succeeded(()))
                            })
                        })
                        .await
                        .map(|ran| ran.replayed)
                }
            })
            .await;
            if answered {
                shared.requests.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        calls
    })
}

/// Shop flows one after another (a local insert, a keyed reservation, a local coupon, a
/// keyed charge, a keyed shipment), each start re-sent until it is answered.
pub(super) fn flows_load(
    flows: Flows<PgStore>,
    prefix: String,
    first: i64,
    shared: Shared,
) -> JoinHandle<Vec<Call<String, Started>>> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        let mut i = 0;
        while !shared.stopping() {
            let key = format!("{prefix}-{i}");
            let order = Order {
                id: first + i,
                amount: 100,
            };
            i += 1;
            let answered = until_answered(&key, &mut calls, || {
                let (flows, key, order) = (flows.clone(), key.clone(), order.clone());
                async move { flows.start(Shop, &key, &order).await }
            })
            .await;
            if answered {
                shared.flows.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        calls
    })
}

/// A job's round: its number, and how many it took or published.
pub(super) type Round = Call<usize, usize>;

/// Events a relay published but could not record, as `(entity, version)`.
pub(super) type Unrecorded = HashSet<(i64, i64)>;

/// The flows' recovery job from the kill on, a round every 200 ms: how many it took, per round.
pub(super) fn recovery_load(flows: Flows<PgStore>, shared: Shared) -> JoinHandle<Vec<Round>> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        let mut n = 0;
        while !shared.killed.load(Ordering::SeqCst) && !shared.stopping() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while !shared.stopping() {
            let asked = Instant::now();
            let answer = flows.recover(16).await.map(|r| r.taken);
            calls.push(Call {
                key: n,
                asked,
                took: asked.elapsed(),
                answer,
            });
            n += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        calls
    })
}

/// Relay number `n`, round after round: how many each published. Its error rounds back
/// off. It goes on after the other loads have ended, until the outbox is empty; the
/// events it published but could not record are kept.
pub(super) fn relay_load(
    store: PgStore,
    n: usize,
    rec: Arc<Recorder>,
    shared: Shared,
) -> JoinHandle<(Vec<Round>, Unrecorded)> {
    let outbox = Outbox::new(store.clone());
    let relay = Relay::new(store, RecordingSink::new(rec.clone(), n))
        .with_config(
            RelayConfig::default()
                .batch(16)
                .lease(LEASE)
                .publish_timeout(Duration::from_secs(1))
                .idle(Duration::from_millis(5)),
        )
        .unwrap();
    tokio::spawn(async move {
        let (mut calls, mut unrecorded) = (Vec::new(), HashSet::new());
        let mut round = 0;
        let mut stopped: Option<Instant> = None;
        loop {
            let asked = Instant::now();
            let answer = rec
                .round_noting_unrecorded(&relay, n, &mut unrecorded)
                .await
                .map(|r| r.published);
            let failed = answer.is_err();
            calls.push(Call {
                key: round,
                asked,
                took: asked.elapsed(),
                answer,
            });
            round += 1;
            if shared.drain.load(Ordering::SeqCst) {
                let since = *stopped.get_or_insert_with(Instant::now);
                if outbox.stats().await.is_ok_and(|s| s.pending == 0) {
                    break;
                }
                assert!(
                    since.elapsed() < Duration::from_secs(120),
                    "the relay never drained the outbox"
                );
            }
            let pause = if failed { 100 } else { 3 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        (calls, unrecorded)
    })
}
