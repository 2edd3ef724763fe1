//! The layers across the nodes: flow recovery jobs, relays and records on every node.

use super::*;

/// Flows whose runner died on one node, recovered by three jobs at once, one on each
/// node: a job's claim (`SKIP LOCKED` is local to a node) can collide with another
/// node's in certification, and then one of them fails and claims nothing (a round fails
/// with nothing else). Every flow completes; every local effect happened exactly once;
/// every keyed call used its own key only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn flow_recovery_jobs_on_every_node() {
    use conformance::flows::{Order, Shop, World, config, shop_on};
    use orderly::flow::{Flows, Listing};
    const FLOWS: i64 = 48;
    let c = Cluster::fresh().await;
    sqlx::raw_sql(
        "CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)",
    )
    .execute(c.stores[0].pool())
    .await
    .unwrap();
    let world = Arc::new(World::default());
    let lease = Duration::from_secs(1);
    let flows: Vec<Flows<MySqlStore>> = c
        .stores
        .iter()
        .map(|s| {
            Flows::new(s.clone(), config(lease))
                .unwrap()
                .register(shop_on::<MySqlStore>(&world, exec_on))
                .unwrap()
        })
        .collect();
    for i in 0..FLOWS {
        world.panic_at("Reserve:before");
        let f = flows[0].clone();
        let start = tokio::spawn(async move {
            f.start(Shop, &format!("g-{i}"), &Order { id: i, amount: 1 })
                .await
        });
        assert!(start.await.is_err(), "flow {i}: the runner died");
    }
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let jobs: Vec<_> = flows
        .iter()
        .cloned()
        .enumerate()
        .map(|(n, f)| {
            tokio::spawn(async move {
                let mut taken = 0;
                loop {
                    assert!(std::time::Instant::now() < deadline, "flows never settled");
                    match f.recover(4).await {
                        Ok(round) => {
                            taken += round.taken;
                            if round.taken > 0 {
                                continue;
                            }
                        }
                        // A round whose claim lost in certification is retried; any
                        // other error is a failure.
                        Err(err) => {
                            assert!(cluster::certification_collision(&err), "node {n}: {err:?}")
                        }
                    }
                    let running = f.list(Listing::Running, None, 1).await.unwrap();
                    let stuck = f.list(Listing::Stuck, None, 1).await.unwrap();
                    if running.is_empty() && stuck.is_empty() {
                        return taken;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    let mut taken = Vec::new();
    for job in jobs {
        taken.push(job.await.unwrap());
    }
    assert!(
        taken.iter().filter(|&&n| n > 0).count() >= 2,
        "one node's job took every flow ({taken:?}): no race across nodes"
    );
    let count = |sql: &'static str| {
        let store = c.stores[1].clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(store.pool())
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT COUNT(*) FROM orderly_flows WHERE status = 'COMPLETED'").await,
        FLOWS
    );
    assert_eq!(count("SELECT COUNT(*) FROM flow_effects").await, 2 * FLOWS);
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM (SELECT flow_key, what FROM flow_effects \
             GROUP BY flow_key, what HAVING COUNT(*) > 1) AS d"
        )
        .await,
        0
    );
    let calls = world.calls();
    for i in 0..FLOWS {
        for step in ["Reserve", "Charge", "Ship"] {
            let n = calls
                .get(&format!("shop:g-{i}:{step}"))
                .copied()
                .unwrap_or(0);
            assert!(n >= 1, "g-{i}: {step} never called");
        }
    }
    assert_eq!(calls.len(), 3 * FLOWS as usize, "{calls:?}");
    c.cleanup().await;
}

/// Literal SQL on a MariaDB connection, for the flows' local steps.
fn exec_on(
    conn: &mut MySqlConnection,
    sql: String,
) -> orderly::idempotency::Work<'_, Result<(), sqlx::Error>> {
    Box::pin(async move {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .map(drop)
    })
}

/// Transitions on every node write their events; a relay on every node publishes them
/// while they are written: each event, each order's events first received in version
/// order, no two publishes of one order at once, and a second copy only of an event whose
/// first relay could not record it. Two nodes' claims of one event collide at
/// certification (it happened at least once); the loser's round fails with Galera's
/// certification error and is run again; a round fails with nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn relays_on_every_node_publish_each_event_once_in_order() {
    use conformance::outbox::{Recorder, RecordingSink};
    use orderly::outbox::{Outbox, Relay, RelayConfig};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const ORDERS: i64 = 300;
    let c = Cluster::fresh().await;
    let e: Vec<Engine<OrderMachine, MySqlStore>> = c.patient_engines();
    let writing = Arc::new(AtomicBool::new(true));
    let writers: Vec<_> = (0..3)
        .map(|n| {
            let e = e.clone();
            tokio::spawn(async move {
                for id in (n..ORDERS).step_by(3) {
                    e[n as usize].create(id).await.unwrap();
                    // Paid on one node, shipped on the next: both emit.
                    e[n as usize]
                        .transition(id, OrderEvent::Pay, "p")
                        .await
                        .unwrap();
                    let ship = (n as usize + 1) % 3;
                    e[ship].transition(id, OrderEvent::Ship, "s").await.unwrap();
                }
            })
        })
        .collect();
    let rec = Arc::new(Recorder::default());
    let collisions = Arc::new(AtomicUsize::new(0));
    let relays: Vec<_> = c
        .stores
        .iter()
        .enumerate()
        .map(|(n, store)| {
            let relay = Relay::new(store.clone(), RecordingSink::new(rec.clone(), n))
                .with_config(
                    RelayConfig::default()
                        .batch(16)
                        .idle(Duration::from_millis(5)),
                )
                .unwrap();
            let (writing, collisions, rec) = (writing.clone(), collisions.clone(), rec.clone());
            tokio::spawn(async move {
                let deadline = std::time::Instant::now() + Duration::from_secs(180);
                // The events this relay published in a round that could not record them
                // (it failed after publishing, or lost its claim before its marks).
                let mut unrecorded = std::collections::HashSet::new();
                loop {
                    match rec
                        .round_noting_unrecorded(&relay, n, &mut unrecorded)
                        .await
                    {
                        Ok(round) if round.claimed == 0 && !writing.load(Ordering::SeqCst) => {
                            if relay.outbox().stats().await.unwrap().pending == 0 {
                                return unrecorded;
                            }
                        }
                        Ok(_) => {}
                        Err(err) => {
                            assert!(cluster::certification_collision(&err), "node {n}: {err:?}");
                            collisions.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    assert!(std::time::Instant::now() < deadline, "never drained");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    writing.store(false, Ordering::SeqCst);
    let mut unrecorded = Vec::new();
    for r in relays {
        unrecorded.push(r.await.unwrap());
    }
    // Each event's first receipt in version order per entity. A second receipt only of
    // an event whose first relay published it in a round that could not record it (its
    // marks lost certification to another node's claim): at least once, as
    // docs/outbox.md says. A second receipt of an event its first relay recorded fails.
    let mut first_by: HashMap<(i64, i64), usize> = HashMap::new();
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    let (mut recorded_twice, mut republished) = (Vec::new(), 0usize);
    let mut by_relay = [0usize; 3];
    for (entity, version, relay) in rec.received() {
        by_relay[relay] += 1;
        match first_by.get(&(entity, version)) {
            Some(&first) if unrecorded[first].contains(&(entity, version)) => republished += 1,
            Some(&first) => recorded_twice.push(format!(
                "{entity}:{version} by node {} then node {}",
                first + 1,
                relay + 1
            )),
            None => {
                first_by.insert((entity, version), relay);
                firsts.entry(entity).or_default().push(version);
            }
        }
    }
    assert!(
        recorded_twice.is_empty(),
        "published again after the first relay recorded it: {recorded_twice:?}"
    );
    for id in 0..ORDERS {
        assert_eq!(firsts.get(&id), Some(&vec![1, 2]), "order {id}");
    }
    assert_eq!(first_by.len() as i64, 2 * ORDERS, "each event published");
    let unrecorded_total: usize = unrecorded.iter().map(|u| u.len()).sum();
    assert!(
        republished <= unrecorded_total,
        "{republished} republishes of {unrecorded_total} unrecorded publishes"
    );
    eprintln!("{republished} republished after an unrecorded publish; by relay {by_relay:?}");
    assert_eq!(rec.overlaps(), 0);
    assert!(
        by_relay.iter().filter(|n| **n > 0).count() >= 2,
        "one node's relay did all the work: {by_relay:?}"
    );
    for store in &c.stores {
        let stats = Outbox::new(store.clone()).stats().await.unwrap();
        assert_eq!((stats.pending, stats.dead), (0, 0));
    }
    assert!(
        collisions.load(Ordering::Relaxed) > 0,
        "no two nodes' claims collided in certification: no race across nodes"
    );
    c.cleanup().await;
}

/// `Records::run` on the three nodes, each request's work starting with a locking read
/// of one hot row and a causal read, then writing the row and a row saying whether the
/// work ran inside its transaction. Other nodes' write sets collide with it all the
/// time; every request completed once (a retryable error sent again, as its caller
/// would), with exactly one effect, and the hot row counts exactly the completed
/// records. A transaction can be rolled back during the work's read without an error
/// (docs/backends.md, "Galera and your own reads"): the effects that then ran outside
/// their transaction are counted and printed, not failed on; orderly cannot check the
/// application's own reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn records_work_across_nodes_completes_each_request_once() {
    use orderly::{Done, Records, ScopeConfig};
    const TASKS: usize = 12;
    const PER_TASK: usize = 40;
    let c = Cluster::fresh().await;
    for sql in [
        "CREATE TABLE rec_hot (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
        "INSERT INTO rec_hot (id, n) VALUES (1, 0)",
        "CREATE TABLE rec_effects (n BIGINT AUTO_INCREMENT PRIMARY KEY, idem_key VARCHAR(255) NOT NULL, \
         in_unit BIGINT NOT NULL)",
    ] {
        sqlx::raw_sql(sql)
            .execute(c.stores[0].pool())
            .await
            .unwrap();
    }
    let records: Vec<Records<MySqlStore>> = c
        .stores
        .iter()
        .map(|s| {
            Records::new(s.clone())
                .scope(
                    "payments",
                    ScopeConfig::new(Duration::from_secs(10), Duration::from_secs(3600)),
                )
                .unwrap()
        })
        .collect();
    let before = collisions(&c).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let r = records[t % 3].clone();
            tokio::spawn(async move {
                let mut retried = 0;
                for i in 0..PER_TASK {
                    let key = format!("k{t}-{i}");
                    let mut sent = 0;
                    loop {
                        sent += 1;
                        assert!(sent <= 50, "{key}: 50 retryable failures in a row");
                        let k = key.clone();
                        let ran = r
                            .run("payments", &key, &1, move |conn| {
                                Box::pin(async move {
                                    sqlx::query("SELECT n FROM rec_hot WHERE id = 1 FOR UPDATE")
                                        .execute(&mut *conn)
                                        .await?;
                                    // A causal read, as work may make: it waits for the
                                    // write sets other nodes certified.
                                    sqlx::query(
                                        "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM rec_effects WHERE idem_key = ?",
                                    )
                                    .bind(&k)
                                    .execute(&mut *conn)
                                    .await?;
                                    sqlx::query("UPDATE rec_hot SET n = n + 1 WHERE id = 1")
                                        .execute(&mut *conn)
                                        .await?;
                                    sqlx::query(
                                        "INSERT INTO rec_effects (idem_key, in_unit) VALUES (?, @@in_transaction)",
                                    )
                                    .bind(&k)
                                    .execute(&mut *conn)
                                    .await?;
                                    Ok::<_, Error>(Done::<(), ()>::Succeeded(()))
                                })
                            })
                            .await;
                        match ran {
                            Ok(ran) => {
                                assert!(!ran.replayed, "{key}: replayed on its first success");
                                break;
                            }
                            Err(e) if e.is_retryable() => retried += 1,
                            Err(e) => panic!("{key}: {e:?}"),
                        }
                    }
                }
                retried
            })
        })
        .collect();
    let mut retried = 0;
    for t in tasks {
        retried += t.await.unwrap();
    }
    let collided = collisions(&c).await - before;
    eprintln!("{retried} retried; {collided} collisions");
    assert!(collided > 0, "the nodes counted no collision");
    let total = (TASKS * PER_TASK) as i64;
    for store in &c.stores {
        let (effects, outside, keys, hot, succeeded): (i64, i64, i64, i64, i64) = sqlx::query_as(
            "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*), \
                 CAST(COALESCE(SUM(in_unit <> 1), 0) AS SIGNED), COUNT(DISTINCT idem_key), \
                 (SELECT n FROM rec_hot WHERE id = 1), \
                 (SELECT COUNT(*) FROM orderly_idempotency_records WHERE status = 'SUCCEEDED') \
             FROM rec_effects",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        eprintln!("{outside} effects of {effects} ran outside their transaction");
        assert_eq!(
            (effects, keys, hot, succeeded),
            (total, total, total, total)
        );
    }
    c.cleanup().await;
}
