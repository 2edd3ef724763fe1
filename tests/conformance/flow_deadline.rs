//! A flow whose caller stops waiting: it runs to its end on a task of its own.

use std::time::Duration;

use orderly::Error;
use orderly::flow::{Ctx, Definition, FlowConfig, FlowOutcome, Flows};

use super::Backend;

orderly::flow! {
    /// One downstream call that takes as long as its input says (a call, not a local
    /// step: no transaction is held while it waits, on SQLite the write lock).
    pub Slow {
        kind: "slow";
        version: 1;
        steps: SlowStep { Wait: keyed + nothing_to_undo, }
    }
}

async fn slow_flows<B: Backend>(b: &B, deadline: Duration) -> Flows<B::S> {
    let config = FlowConfig::default()
        .lease(Duration::from_secs(30))
        .deadline(deadline);
    let def = Definition::new(Slow).call(SlowStep::Wait, |ctx: &Ctx<u64>| {
        let ms = *ctx.input();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ms)
        })
    });
    Flows::new(b.store(Duration::from_secs(10)).await, config)
        .unwrap()
        .register(def)
        .unwrap()
}

/// Waits until a start of `key` replays its completion (a start of a flow still running
/// is `InFlight`), within 5 s: far inside the 30 s lease.
async fn replayed_completed<S: orderly::flow::FlowStore>(f: &Flows<S>, key: &str, input: u64) {
    let asked = std::time::Instant::now();
    loop {
        match f.start(Slow, key, &input).await {
            Ok(started) => {
                assert!(started.replayed, "{key}: ran again: {started:?}");
                assert!(
                    matches!(started.outcome, FlowOutcome::Completed(_)),
                    "{key}: {started:?}"
                );
                return;
            }
            Err(Error::InFlight { .. }) if asked.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{key}: {other:?}"),
        }
    }
}

/// A start whose caller gives up mid-call (its future dropped), and a start past
/// `FlowConfig::deadline` (answered `DeadlineExceeded`, in doubt, on time): each flow
/// runs to its end off the caller's task, and a re-send replays its completion instead
/// of waiting out the lease. The race happened: the re-send found the flow in flight.
pub async fn a_flow_whose_caller_stops_waiting_runs_to_its_end<B: Backend>(b: &B) {
    let f = slow_flows(b, Duration::from_millis(200)).await;
    // Dropped by its caller, 50 ms into a 400 ms call.
    let cut = tokio::time::timeout(Duration::from_millis(50), f.start(Slow, "dropped", &400)).await;
    assert!(cut.is_err(), "the start did not wait for its step: {cut:?}");
    let in_flight = f.start(Slow, "dropped", &400).await;
    assert!(
        matches!(in_flight, Err(Error::InFlight { .. })),
        "the dropped flow was not running: {in_flight:?}"
    );
    replayed_completed(&f, "dropped", 400).await;

    // Past the flow deadline (200 ms) in a 600 ms call.
    let asked = std::time::Instant::now();
    let late = f.start(Slow, "late", &600).await;
    let took = asked.elapsed();
    assert!(
        matches!(late, Err(Error::DeadlineExceeded { in_doubt: true, .. })),
        "{late:?}"
    );
    assert!(
        took < Duration::from_millis(500),
        "answered after {took:?}, past its 200 ms deadline"
    );
    replayed_completed(&f, "late", 600).await;

    // A zero deadline is refused.
    let zero = FlowConfig::default().deadline(Duration::ZERO);
    assert!(matches!(
        Flows::new(b.store(Duration::from_secs(10)).await, zero),
        Err(Error::InvalidInput(_))
    ));
}
