//! Starts of flows with the connection cut under a batch of them.

use super::*;
use crate::conformance::faults::Networked;
use crate::server::{Cut, Proxy};

/// Under 32 starts at once, a connection is cut as the request holding `text` goes out,
/// or right after the server got it (a batch of starts: its statement's text, sent
/// before anything runs); and once the request holding `rows` (a batch's execution:
/// bytes only a batch of two or more binds) was answered, the answer dropped: the batch
/// committed, and none of its starts heard. The flows run through the proxy. Every start is answered `Completed`, not replayed, and
/// its flow's local steps ran once (a batch that failed is never taken for another's
/// start, nor run twice). A round in which nothing was cut shows nothing: after five,
/// the test fails.
pub async fn connection_cut_under_coalesced_starts_runs_each_flow_once<B: Networked>(
    b: &B,
    text: &'static [u8],
    rows: &'static [u8],
) {
    let world = Arc::new(World::default());
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    for (n, cut) in [Cut::Forward(text), Cut::Request(text), Cut::ReplyTo(rows)]
        .into_iter()
        .enumerate()
    {
        let mut cut_seen = false;
        for round in 0..5 {
            let proxy = Proxy::start(b.server(), cut).await;
            let f = Flows::new(
                b.store_at(proxy.port, 8).await,
                config(Duration::from_secs(30)),
            )
            .unwrap()
            .register(shop::<B>(&world))
            .unwrap();
            let keys: Vec<String> = (0..32).map(|i| format!("cuts-{n}-{round}-{i}")).collect();
            let tasks: Vec<_> = keys
                .iter()
                .cloned()
                .map(|key| {
                    let f = f.clone();
                    tokio::spawn(async move {
                        let answer = f.start(Shop, &key, &order(7)).await;
                        (key, answer)
                    })
                })
                .collect();
            for task in tasks {
                let (key, answer) = task.await.unwrap();
                match answer {
                    Ok(s) if !s.replayed && matches!(s.outcome, FlowOutcome::Completed(_)) => {}
                    other => panic!("{cut:?}: {key}: {other:?}"),
                }
                assert_eq!(effects(b, &key, "Insert").await, 1, "{cut:?}: {key}");
                assert_eq!(effects(b, &key, "Coupon").await, 1, "{cut:?}: {key}");
            }
            if proxy.cuts() > 0 {
                cut_seen = true;
                break;
            }
        }
        assert!(
            cut_seen,
            "{cut:?}: no batch of starts was cut: the test shows nothing"
        );
    }
}
