//! Coalesced units of writes across the nodes: no gap in a history.

use super::*;

/// Coalesced units on every node over few tickets: a unit's locking read holds rows that
/// other nodes' write sets need, and a brute-force abort there rolls the unit's
/// transaction back without an error while it has only read. Every ticket's version is
/// the number of its history rows, numbered 1 to version with no gap, on every node;
/// every `Applied` is the row recorded for it. Evidence: units of several requests formed
/// on the nodes, and the nodes counted collisions. (Before the unit's writes were kept
/// inside their transaction, a unit's update could commit alone: a version with no
/// history row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the 3-node Galera cluster of .ci/galera.sh; run with --ignored"]
async fn coalesced_units_across_nodes_leave_no_gap_in_a_history() {
    use TicketEvent::*;
    const TICKETS: i64 = 6;
    const TASKS: usize = 36;
    const PER_TASK: usize = 60;
    let c = Cluster::fresh().await;
    let e: Vec<Engine<TicketMachine, MySqlStore>> = c
        .stores
        .iter()
        .map(|s| Engine::new(s.clone().coalesce_on_galera()).unwrap())
        .collect();
    for id in 0..TICKETS {
        e[0].create(id).await.unwrap();
        e[0].transition(id, Start, "s").await.unwrap();
    }
    let before = collisions(&c).await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e[t % 3].clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for i in 0..PER_TASK {
                    let id = ((t + i) % TICKETS as usize) as i64;
                    let event = if (t / 3 + i).is_multiple_of(2) {
                        Block
                    } else {
                        Unblock
                    };
                    let r = format!("t{t}-{i}");
                    answers.push((id, event, r.clone(), e.transition(id, event, &r).await));
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
    for engine in &e {
        for id in 0..TICKETS {
            let entity = engine.get(id).await.unwrap();
            let history = engine.history(id).await.unwrap();
            let seqs: Vec<i64> = history.iter().map(|h| h.seq).collect();
            let expected: Vec<i64> = (1..=entity.version).collect();
            assert_eq!(
                seqs, expected,
                "ticket {id}: its history has a gap or an extra row"
            );
            assert_eq!(Some(entity.state), history.last().map(|h| h.to));
            for row in history {
                recorded.insert((id, row.event, row.ref_id), (row.from, row.to, row.seq));
            }
        }
    }
    let mut applied = 0;
    for (id, event, r, answer) in answers {
        match answer {
            Ok(Outcome::Applied { from, to, version }) => {
                applied += 1;
                assert_eq!(recorded.get(&(id, event, r)), Some(&(from, to, version)));
            }
            Ok(Outcome::Replayed { .. }) => panic!("ticket {id}: {r} was sent once"),
            Err(Error::InvalidTransition { .. } | Error::RefConflict { .. }) => {
                assert!(!recorded.contains_key(&(id, event, r)));
            }
            Err(other) => panic!("ticket {id}: {other:?}"),
        }
    }
    assert_eq!(applied, recorded.len() - TICKETS as usize);
    let units: u64 = e.iter().map(|e| e.coalesced_writes().units).sum();
    let collided = collisions(&c).await - before;
    assert!(units > 0, "no unit of several requests formed");
    assert!(collided > 0, "the nodes counted no collision");
    eprintln!("{applied} applied; {units} units; {collided} collisions");
    // By default a node writes each request on its own, however many come at once; asked
    // to coalesce, the same 32 requests at once form units.
    for (n, on) in [(0_i64, true), (1, false)] {
        let store = c.stores[0].clone();
        let store = if on {
            store.coalesce_on_galera()
        } else {
            store
        };
        let engine: Engine<TicketMachine, MySqlStore> = Engine::new(store).unwrap();
        let ids: Vec<i64> = (0..32).map(|i| 1000 * (n + 1) + i).collect();
        for id in &ids {
            engine.create(*id).await.unwrap();
        }
        let gate = Arc::new(tokio::sync::Barrier::new(ids.len()));
        let starts: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (engine, gate) = (engine.clone(), gate.clone());
                tokio::spawn(async move {
                    gate.wait().await;
                    engine.transition(id, Start, "s").await
                })
            })
            .collect();
        for s in starts {
            assert!(matches!(s.await.unwrap(), Ok(Outcome::Applied { .. })));
        }
        let units = engine.coalesced_writes().units;
        if on {
            assert!(
                units > 0,
                "32 requests at once formed no unit when asked to"
            );
        } else {
            assert_eq!(units, 0, "a unit formed on a Galera node by default");
        }
    }
    let digests = c.node_digests().await;
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    c.cleanup().await;
}
