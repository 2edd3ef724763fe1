//! Timer jobs on every node.

use super::*;

/// Timers armed on one node, fired by a timer job on every node at once: each timer
/// fired once (one cancellation per order in the history, every timer `FIRED`), the
/// jobs of at least two nodes firing some; a claim that lost in certification is run
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn timer_jobs_on_every_node_fire_each_timer_once() {
    use conformance::timers::{Unpaid, UnpaidState};
    use orderly::Timers;
    const ORDERS: i64 = 300;
    let c = Cluster::fresh().await;
    let engines: Vec<Engine<Unpaid, MySqlStore>> = c
        .stores
        .iter()
        .map(|s| cluster::patient(s.clone()))
        .collect();
    for id in 1..=ORDERS {
        engines[0].create(id).await.unwrap();
    }
    sqlx::query("UPDATE orderly_timers SET due_at = due_at - 100000000000, next_at = 0")
        .execute(c.stores[0].pool())
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let jobs: Vec<_> = engines
        .iter()
        .enumerate()
        .map(|(n, e)| {
            let job = Timers::new(e.store().clone())
                .with_config(
                    orderly::TimersConfig::default()
                        .batch(16)
                        .lease(Duration::from_secs(2))
                        .min_backoff(Duration::from_millis(50))
                        .max_backoff(Duration::from_millis(500)),
                )
                .unwrap()
                .fire(e.clone());
            let store = e.store().clone();
            tokio::spawn(async move {
                let mut fired = 0;
                loop {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "timers never all fired"
                    );
                    match job.fire_once().await {
                        Ok(round) => {
                            assert_eq!(round.dead + round.moot, 0, "node {n}: {round:?}");
                            fired += round.applied + round.replayed;
                            if round.claimed > 0 {
                                continue;
                            }
                        }
                        Err(err) => {
                            assert!(cluster::certification_collision(&err), "node {n}: {err:?}")
                        }
                    }
                    let left: i64 = sqlx::query_scalar(
                        "SELECT COUNT(*) FROM orderly_timers WHERE status <> 'FIRED'",
                    )
                    .fetch_one(store.pool())
                    .await
                    .unwrap();
                    if left == 0 {
                        return fired;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    let mut fired = Vec::new();
    for job in jobs {
        fired.push(job.await.unwrap());
    }
    assert!(
        fired.iter().filter(|&&n| n > 0).count() >= 2,
        "one node's job fired every timer ({fired:?}): no race across nodes"
    );
    let count = |sql: &'static str| {
        let store = c.stores[2].clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(store.pool())
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT COUNT(*) FROM orderly_transitions WHERE event = 'Cancel'").await,
        ORDERS
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM (SELECT order_id FROM orderly_transitions \
             GROUP BY order_id HAVING COUNT(*) > 1) AS d"
        )
        .await,
        0
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED' AND outcome IN ('applied', 'replayed')")
            .await,
        ORDERS
    );
    for id in [1, ORDERS / 2, ORDERS] {
        assert_eq!(
            engines[1].get(id).await.unwrap().state,
            UnpaidState::Cancelled
        );
    }
    eprintln!("timers fired per node: {fired:?}");
    c.cleanup().await;
}
