//! Engines on the three nodes of a MariaDB Galera cluster (`.ci/galera.sh start`), as on
//! three servers: causal reads across nodes, storms spread over the nodes, hot rows on a
//! cycle. Each test on its own database. The cluster's client URLs: `ORDERLY_GALERA_URLS`
//! (comma-separated; default the script's ports 4306, 4307, 4308).

mod cluster;
mod conformance;
mod server;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use cluster::Cluster;

use conformance::{OrderEvent, OrderMachine, OrderState, TicketEvent, TicketMachine};
use orderly::{Engine, Error, MySqlStore, Outcome};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};
use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};

/// A request acknowledged on one node, re-sent at once on the others, is a replay there:
/// the judging reads wait for the write sets certified before them. On a cycle, the
/// refusal names the latest reference, never an older one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn acknowledged_on_one_node_is_a_replay_on_every_other() {
    use TicketEvent::*;
    use conformance::TicketState::{Blocked, Working};
    // Concurrent tasks, each on tickets of its own, keep every node's appliers busy, so
    // a node that answered reads before applying what it certified would be caught.
    const TASKS: i64 = 16;
    const PER_TASK: i64 = 12;
    let c = Cluster::fresh().await;
    let e: Vec<Engine<TicketMachine, MySqlStore>> = c.patient_engines();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e.clone();
            tokio::spawn(async move {
                for n in 0..PER_TASK {
                    let id = t * 1000 + n;
                    let first = (id % 3) as usize;
                    e[first].create(id).await.unwrap();
                    e[first].transition(id, Start, "s").await.unwrap();
                    for round in 0..3 {
                        let on = (first + round) % 3;
                        let (block, unblock) = (format!("b{round}"), format!("u{round}"));
                        let applied = e[on].transition(id, Block, &block).await.unwrap();
                        assert!(applied.is_applied());
                        let replay = Outcome::Replayed {
                            from: Working,
                            to: Blocked,
                            version: applied.version(),
                        };
                        for other in 1..3 {
                            let node = (on + other) % 3;
                            let again = e[node].transition(id, Block, &block).await;
                            assert_eq!(again.unwrap(), replay, "ticket {id}: node {node} after node {on}");
                            // Blocked now: another Block is refused naming the latest
                            // reference, never an older one.
                            let err = e[node].transition(id, Block, "b-x").await.unwrap_err();
                            assert!(
                                matches!(err, Error::RefConflict { ref existing_ref, .. } if *existing_ref == block),
                                "ticket {id}: node {node} after node {on}: {err:?}"
                            );
                        }
                        let unblocked = e[(on + 1) % 3].transition(id, Unblock, &unblock).await;
                        assert!(unblocked.unwrap().is_applied(), "ticket {id}");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    c.cleanup().await;
}

orderly::state_machine! {
    /// A cycle through an event with two source states. The MySQL store does not try such
    /// an event before reading, so a request refused on what it read is judged without
    /// any write of its own.
    pub Relay {
        states: RelayState { Idle, Up, Down }
        events: RelayEvent { Raise, Lower }
        initial: Idle;
        terminal: [];
        transitions: {
            Idle + Raise => Up,
            Down + Raise => Up,
            Up + Lower => Down,
        }
    }
}

/// A node that lags behind the cluster still answers from the history. `FLUSH TABLES WITH
/// READ LOCK` desyncs a node and pauses its appliers, so it holds what was certified
/// elsewhere without applying it (a plain read there is shown to be stale). A request
/// acknowledged on another node, re-sent to the lagging one, must wait for what came
/// before it and answer `Replayed`; a read that did not wait would find the relay still
/// up from the first `Raise` and answer `RefConflict` naming that older reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn a_lagging_node_waits_for_what_was_acknowledged_elsewhere() {
    use RelayEvent::*;
    use RelayState::*;
    let c = Cluster::fresh().await;
    let e: Vec<Engine<Relay, MySqlStore>> = c.patient_engines();
    let (first, lagging) = (&e[0], &e[1]);
    first.create(1).await.unwrap();
    first.transition(1, Raise, "r0").await.unwrap();
    // Causal: node 2 has applied everything above before the lock is taken.
    assert_eq!(lagging.get(1).await.unwrap().version, 1);

    let options = MySqlConnectOptions::from_str(&cluster::node_urls()[1])
        .unwrap()
        .database(&c.name);
    let mut lock = MySqlConnection::connect_with(&options).await.unwrap();
    sqlx::raw_sql("FLUSH TABLES WITH READ LOCK")
        .execute(&mut lock)
        .await
        .unwrap();
    first.transition(1, Lower, "l0").await.unwrap();
    let acknowledged = first.transition(1, Raise, "r1").await.unwrap();
    assert_eq!(acknowledged.version(), 3);
    let mut plain = MySqlConnection::connect_with(&options).await.unwrap();
    let stale: i64 = sqlx::query_scalar(
        "SET STATEMENT wsrep_sync_wait = 0 FOR SELECT version FROM orders WHERE id = 1",
    )
    .fetch_one(&mut plain)
    .await
    .unwrap();
    assert_eq!(
        stale, 1,
        "node 2 applied while paused: the race did not happen"
    );

    let resent = tokio::spawn({
        let lagging = lagging.clone();
        async move { lagging.transition(1, Raise, "r1").await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answered_while_paused = resent.is_finished();
    sqlx::raw_sql("UNLOCK TABLES")
        .execute(&mut lock)
        .await
        .unwrap();
    let answer = resent.await.unwrap();
    assert_eq!(
        answer.unwrap(),
        Outcome::Replayed {
            from: Down,
            to: Up,
            version: 3
        }
    );
    assert!(
        !answered_while_paused,
        "answered before node 2 applied what it certified"
    );
    let err = lagging.transition(1, Raise, "r-x").await.unwrap_err();
    assert!(
        matches!(err, Error::RefConflict { ref existing_ref, .. } if existing_ref == "r1"),
        "{err:?}"
    );
    drop((lock, plain));
    c.cleanup().await;
}

/// 48 identical requests over engines on three nodes: one `Applied`, the rest `Replayed`;
/// 48 distinct payments: one wins, every other is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn storms_across_nodes_one_applied() {
    use OrderEvent::*;
    let c = Cluster::fresh().await;
    let e: Vec<Engine<OrderMachine, MySqlStore>> = c.patient_engines();
    for (id, distinct) in [(1, false), (2, true)] {
        e[0].create(id).await.unwrap();
        let barrier = Arc::new(tokio::sync::Barrier::new(48));
        let tasks: Vec<_> = (0..48)
            .map(|i| {
                let (e, barrier) = (e[i % 3].clone(), barrier.clone());
                let r = if distinct {
                    format!("p-{i}")
                } else {
                    "p".into()
                };
                tokio::spawn(async move {
                    barrier.wait().await;
                    (r.clone(), e.transition(id, Pay, &r).await)
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let winners: Vec<_> = answers
            .iter()
            .filter(|(_, a)| matches!(a, Ok(o) if o.is_applied()))
            .map(|(r, _)| r.clone())
            .collect();
        assert_eq!(winners.len(), 1, "{answers:?}");
        for (r, answer) in &answers {
            match answer {
                Ok(o) => assert_eq!((o.state(), o.version()), (OrderState::Paid, 1)),
                Err(Error::RefConflict { existing_ref, .. }) => {
                    assert!(distinct && *existing_ref == winners[0] && *r != winners[0])
                }
                Err(other) => panic!("{r}: {other:?}"),
            }
        }
        for engine in &e {
            let h = engine.history(id).await.unwrap();
            assert_eq!(h.len(), 1);
            assert_eq!(h[0].ref_id, winners[0]);
        }
    }
    c.cleanup().await;
}

/// Tasks on three nodes drive few tickets round the cycle with shared references. Every
/// answer agrees with the history, no request is recorded twice, no answer conflicts with
/// itself, and every node holds the same rows afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn hot_rows_on_a_cycle_across_nodes() {
    use TicketEvent::*;
    const TICKETS: i64 = 8;
    const TASKS: usize = 12;
    const PER_TASK: usize = 80;
    let c = Cluster::fresh().await;
    let e: Vec<Engine<TicketMachine, MySqlStore>> = c.patient_engines();
    for id in 0..TICKETS {
        e[0].create(id).await.unwrap();
        e[0].transition(id, Start, "s").await.unwrap();
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e[t % 3].clone();
            tokio::spawn(async move {
                let mut seed = [0u8; 32];
                seed[0] = t as u8;
                seed[1] = 0x9a;
                let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                let mut answers = Vec::new();
                for _ in 0..PER_TASK {
                    let id = (rng.next_u64() % TICKETS as u64) as i64;
                    let event = if rng.next_u64().is_multiple_of(2) {
                        Block
                    } else {
                        Unblock
                    };
                    let r = format!("r{}", rng.next_u64() % 6);
                    let answer = e.transition(id, event, &r).await;
                    answers.push((id, event, r, answer));
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    let mut recorded = HashMap::new();
    let mut refs: HashMap<(i64, TicketEvent), Vec<String>> = HashMap::new();
    for id in 0..TICKETS {
        let history = e[1].history(id).await.unwrap();
        assert_eq!(e[2].get(id).await.unwrap().version as usize, history.len());
        for row in history {
            let key = (id, row.event, row.ref_id.clone());
            assert!(recorded.insert(key, (row.from, row.to, row.seq)).is_none());
            refs.entry((id, row.event)).or_default().push(row.ref_id);
        }
    }
    let mut applied = 0;
    for (id, event, r, answer) in answers {
        match answer {
            Ok(Outcome::Applied { from, to, version }) => {
                applied += 1;
                assert_eq!(recorded.get(&(id, event, r)), Some(&(from, to, version)));
            }
            Ok(Outcome::Replayed { from, to, version }) => {
                assert_eq!(recorded.get(&(id, event, r)), Some(&(from, to, version)));
            }
            Err(Error::RefConflict { existing_ref, .. }) => {
                assert_ne!(existing_ref, r, "ticket {id}: conflicted with itself");
                assert!(refs[&(id, event)].contains(&existing_ref));
            }
            Err(Error::InvalidTransition { .. }) => {}
            Err(other) => panic!("ticket {id}: {other:?}"),
        }
    }
    assert_eq!(applied, recorded.len() - TICKETS as usize);
    assert!(
        applied > 2 * TICKETS as usize,
        "too little applied: {applied}"
    );
    let digests = c.node_digests().await;
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    c.cleanup().await;
}

/// The sum over the nodes of the write sets that lost certification and of the local
/// transactions an applier aborted.
async fn collisions(c: &Cluster) -> i64 {
    let mut sum = 0;
    for store in &c.stores {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_cert_failures', 'wsrep_local_bf_aborts')",
        )
        .fetch_all(store.pool())
        .await
        .unwrap();
        sum += rows
            .iter()
            .map(|(_, v)| v.parse::<i64>().unwrap())
            .sum::<i64>();
    }
    sum
}

// After the items above, which they use.
#[path = "galera/layers.rs"]
mod layers;
#[path = "galera/rules.rs"]
mod rules;
#[path = "galera/timers.rs"]
mod timers;
#[path = "galera/writes.rs"]
mod writes;
