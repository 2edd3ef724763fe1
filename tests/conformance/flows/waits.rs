//! Flows that wait: a wait step sleeps on a timer in the timers' table (armed in the
//! step's fenced commit), the timer job wakes the flow once, and the flow runs on; a
//! recovery job that finds the wait over (its lease ran out) wakes it instead, once; the
//! flow's record says what it waits for and until when.

use std::time::Instant;

use orderly::Timers;
use orderly::flow::{FlowWait, WAIT_MACHINE};
use orderly::timer::TimerRound;

use super::super::Networked;
use super::*;

orderly::flow! {
    /// Authorize a card, wait for the capture window to pass, then settle (capture or
    /// void, by the order's state).
    pub Hold {
        kind: "hold";
        version: 1;
        steps: HoldStep {
            Authorize: keyed + undo,
            Window:    wait,
            Settle:    local,
        }
    }
}

fn hold<S: FlowStore>(world: &Arc<World>, exec: Exec<S>, wait: Duration) -> Definition<S, Order> {
    use HoldStep::*;
    Definition::new(Hold)
        .call(Authorize, call_action(world, "Authorize"))
        .undo_call(Authorize, call_action(world, "Authorize:undo"))
        .wait(Window, wait)
        .local(Settle, local_on::<S>(world, "Settle", exec))
}

/// Flows on a fresh store with `Hold` registered (its wait `wait`), and the effects table.
async fn hold_flows<B: Backend>(
    b: &B,
    world: &Arc<World>,
    lease: Duration,
    wait: Duration,
) -> Flows<B::S> {
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    Flows::new(b.store(Duration::from_secs(10)).await, config(lease))
        .unwrap()
        .read_first(B::POLICY)
        .register(hold(world, B::exec_conn, wait))
        .unwrap()
}

/// Fires rounds of `job` until `n` wait timers were recorded, for at most 10 s.
async fn fire_until<S: orderly::TimerStore>(job: &Timers<S>, n: usize) -> TimerRound {
    let mut total = TimerRound::default();
    let began = Instant::now();
    while total.applied + total.moot < n {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "timers not fired: {total:?}"
        );
        let round = job.fire_once().await.unwrap();
        total.applied += round.applied;
        total.moot += round.moot;
        total.claimed += round.claimed;
        if round.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    total
}

/// Waits (at most 10 s) until the flow `key` is completed or compensated; its status.
async fn finished<S: FlowStore>(f: &Flows<S>, key: &str) -> String {
    let began = Instant::now();
    loop {
        let view = f
            .get("hold", key)
            .await
            .unwrap()
            .expect("the flow is recorded");
        if matches!(view.flow.status.as_str(), "COMPLETED" | "COMPENSATED") {
            return view.flow.status;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "flow {key} still {view:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The wait: the start answers `Sleeping` after the step before it, with the step row
/// `WAITING`, the timer in the timers' table and the record's wait agreeing on when; a
/// re-sent start is `InFlight`; the job fires nothing before it is due, then wakes the
/// flow once and it runs on (each effect once); firing the same timer again (a job that
/// died after the wake committed, before it marked the timer) is moot. A step after the
/// wait that fails compensates the steps before it, the wait having nothing to undo.
pub async fn flow_waits_on_a_timer_and_wakes_once<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let wait = Duration::from_millis(400);
    let f = hold_flows(b, &world, Duration::from_secs(30), wait).await;
    let job = Timers::new(f.store().clone()).flows(f.clone());

    let started = f.start(Hold, "h-1", &order(1)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Sleeping {
            step: "Window".into(),
            wakes_after: wait
        }
    );
    assert_eq!(world.calls_in_order(), ["hold:h-1:Authorize"]);
    assert_eq!(
        step_rows(&f, "hold", "h-1").await,
        rows(&[
            ("Authorize", "F", "SUCCEEDED", 1),
            ("Window", "F", "WAITING", 1)
        ])
    );
    let view = f.get("hold", "h-1").await.unwrap().unwrap();
    let FlowWait { step, until_ms } = view.waits.clone().expect("the record says it waits");
    assert_eq!(step, "Window");
    let due_at = b
        .scalar(&format!(
            "SELECT due_at FROM orderly_timers WHERE machine = '{WAIT_MACHINE}' AND ref_id = 'h-1' \
             AND status = 'PENDING'"
        ))
        .await;
    assert!(
        (due_at - until_ms).abs() <= 50,
        "timer due {due_at}, record says {until_ms}"
    );
    let started_at = view.steps[1].started_at;
    assert_eq!(until_ms - started_at, 400);

    match f.start(Hold, "h-1", &order(1)).await {
        Err(Error::InFlight { .. }) => {}
        other => panic!("a re-sent start of a sleeping flow: {other:?}"),
    }
    // Not due yet: nothing fires.
    let early = job.fire_once().await.unwrap();
    assert_eq!(early.claimed, 0, "{early:?}");
    assert_eq!(effects(b, "h-1", "Settle").await, 0);

    let fired = fire_until(&job, 1).await;
    assert_eq!((fired.applied, fired.moot), (1, 0), "{fired:?}");
    assert_eq!(finished(&f, "h-1").await, "COMPLETED");
    assert_eq!(effects(b, "h-1", "Settle").await, 1);
    assert_eq!(world.calls_in_order(), ["hold:h-1:Authorize"]);
    assert_eq!(
        step_rows(&f, "hold", "h-1").await,
        rows(&[
            ("Authorize", "F", "SUCCEEDED", 1),
            ("Window", "F", "SUCCEEDED", 1),
            ("Settle", "F", "SUCCEEDED", 1),
        ])
    );
    assert_eq!(f.get("hold", "h-1").await.unwrap().unwrap().waits, None);
    let again = f.start(Hold, "h-1", &order(1)).await.unwrap();
    assert!(again.replayed);
    assert!(matches!(again.outcome, FlowOutcome::Completed(_)));

    // The job died after the wake committed and before it marked the timer: it fires
    // again, and finds the flow woken.
    b.exec(&format!(
        "UPDATE orderly_timers SET status = 'PENDING', outcome = NULL, lease_until = 0 \
         WHERE machine = '{WAIT_MACHINE}' AND ref_id = 'h-1'"
    ))
    .await;
    let refired = fire_until(&job, 1).await;
    assert_eq!((refired.applied, refired.moot), (0, 1), "{refired:?}");
    assert_eq!(effects(b, "h-1", "Settle").await, 1);

    // A wait timer that names no step is set aside; one of a flow that does not exist is
    // moot.
    b.exec(&format!(
        "INSERT INTO orderly_timers (machine, entity_id, event, ref_id, state, version, due_at, \
             next_at, created_at) \
         VALUES ('{WAIT_MACHINE}', 1, 'hold', 'nameless', NULL, NULL, 0, 0, 0), \
                ('{WAIT_MACHINE}', 2, 'hold', 'ghost', 'Window', 1, 0, 0, 0)"
    ))
    .await;
    let odd = job.fire_once().await.unwrap();
    assert_eq!((odd.claimed, odd.dead, odd.moot), (2, 1, 1), "{odd:?}");

    // Settling fails for good: the authorization is voided, once.
    world.plan("Settle", Plan::Fail);
    let started = f.start(Hold, "h-2", &order(2)).await.unwrap();
    assert!(matches!(started.outcome, FlowOutcome::Sleeping { .. }));
    // A timer of another sleep (an earlier flow under the key, since purged) wakes
    // nothing.
    b.exec(&format!(
        "INSERT INTO orderly_timers (machine, entity_id, event, ref_id, state, version, due_at, \
             next_at, created_at) \
         VALUES ('{WAIT_MACHINE}', 7, 'hold', 'h-2', 'Window', 1, 0, 0, 0)"
    ))
    .await;
    let stale = job.fire_once().await.unwrap();
    assert_eq!((stale.claimed, stale.moot), (1, 1), "{stale:?}");
    assert!(f.get("hold", "h-2").await.unwrap().unwrap().waits.is_some());
    fire_until(&job, 1).await;
    assert_eq!(finished(&f, "h-2").await, "COMPENSATED");
    assert_eq!(
        world.calls_in_order(),
        [
            "hold:h-1:Authorize",
            "hold:h-2:Authorize",
            "hold:h-2:Authorize:undo"
        ]
    );
    assert_eq!(effects(b, "h-2", "Settle").await, 0);
}

/// No timer job ran while the wait passed: once the wait and a lease more are over, the
/// recovery job finds the flow due and wakes it, once; the timer, fired afterwards, is
/// moot. And the two racing: flows whose wait and lease are both over, the timer job and
/// the recovery job run at once (their rounds overlap in time); each flow is woken once
/// and settles once, whichever took it, and every timer is recorded.
pub async fn flow_wait_woken_once_by_the_timer_or_the_recovery<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let (lease, wait) = (Duration::from_millis(200), Duration::from_millis(100));
    let f = hold_flows(b, &world, lease, wait).await;
    let job = Timers::new(f.store().clone()).flows(f.clone());

    let started = f.start(Hold, "r-1", &order(1)).await.unwrap();
    assert!(matches!(started.outcome, FlowOutcome::Sleeping { .. }));
    // Before the lease ran out the recovery job has nothing to take, though the timer is
    // due.
    tokio::time::sleep(wait + Duration::from_millis(20)).await;
    assert_eq!(f.recover(100).await.unwrap().taken, 0);
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let recovered = f.recover(100).await.unwrap();
    assert_eq!(
        (recovered.taken, recovered.completed),
        (1, 1),
        "{recovered:?}"
    );
    assert_eq!(effects(b, "r-1", "Settle").await, 1);
    let fired = fire_until(&job, 1).await;
    assert_eq!((fired.applied, fired.moot), (0, 1), "{fired:?}");
    assert_eq!(effects(b, "r-1", "Settle").await, 1);

    // Rounds of flows whose wait and lease are both over, raced by the timer job and the
    // recovery job, the recovery starting a little later each round: each side must win
    // some flows over the rounds, and each flow is woken and settles once.
    let (n, mut woke, mut took) = (6usize, 0, 0);
    for round in 0..8u64 {
        for i in 0..n {
            let key = format!("race-{round}-{i}");
            let started = f.start(Hold, &key, &order(i as i64)).await.unwrap();
            assert!(matches!(started.outcome, FlowOutcome::Sleeping { .. }));
        }
        tokio::time::sleep(wait + lease + Duration::from_millis(50)).await;
        let (timer, recovery) = tokio::join!(fire_until(&job, n), async {
            tokio::time::sleep(Duration::from_millis(round * 3)).await;
            f.recover(100).await.unwrap()
        });
        for i in 0..n {
            let key = format!("race-{round}-{i}");
            assert_eq!(finished(&f, &key).await, "COMPLETED");
            assert_eq!(effects(b, &key, "Settle").await, 1, "{key}");
        }
        // A flow the timer woke was left to it; one the recovery took, the timer found
        // taken.
        assert_eq!(timer.applied + recovery.taken, n, "{timer:?} {recovery:?}");
        assert_eq!(timer.moot, recovery.taken, "{timer:?} {recovery:?}");
        woke += timer.applied;
        took += recovery.taken;
    }
    println!("wait race: the timer woke {woke} flows, the recovery took {took}");
    assert!(
        woke > 0 && took > 0,
        "one side won every race: timer {woke}, recovery {took}"
    );
}

/// A flow's wait cut at each of its statements, before the server sees it, after the
/// server answered it, and with the statement forwarded and the connection then cut: the
/// sleep's timer insert (in the start's commit), and the wake's claim, hand-over and
/// record of the firing. Whatever the cut call answered, a sound timer job and recovery
/// job then finish the flow: it completes, its settling step applied once, its wait
/// timers all fired, none left pending.
pub async fn a_flow_wait_cut_at_each_statement_wakes_once<B: Networked>(b: &B) {
    use crate::server::{Cut, Proxy};
    let world = Arc::new(World::default());
    let (lease, wait) = (Duration::from_millis(300), Duration::from_millis(50));
    let f = hold_flows(b, &world, lease, wait).await;
    let sound = Timers::new(f.store().clone()).flows(f.clone());
    let points: [(&'static [u8], bool); 4] = [
        (b"timers (machine", false),
        (b"SKIP LOCKED", true),
        (b"status = 'RUNNING'", true),
        (b"'FIRED'", true),
    ];
    let mut n = 0;
    for (point, waking) in points {
        for cut in [
            Cut::Request(point),
            Cut::ReplyTo(point),
            Cut::Forward(point),
        ] {
            n += 1;
            let key = format!("cut-{n}");
            let proxy = Proxy::start(b.server(), cut).await;
            let proxied = Flows::new(b.store_at(proxy.port, 2).await, config(lease))
                .unwrap()
                .register(hold(&world, B::exec_conn, wait))
                .unwrap();
            let answer = if waking {
                let started = f.start(Hold, &key, &order(n)).await.unwrap();
                assert!(matches!(started.outcome, FlowOutcome::Sleeping { .. }));
                tokio::time::sleep(wait + Duration::from_millis(20)).await;
                let job = Timers::new(proxied.store().clone())
                    .with_config(orderly::TimersConfig::default().lease(Duration::from_secs(1)))
                    .unwrap()
                    .flows(proxied.clone());
                format!("{:?}", job.fire_once().await)
            } else {
                format!("{:?}", proxied.start(Hold, &key, &order(n)).await)
            };
            assert_eq!(
                proxy.cuts(),
                1,
                "{cut:?}: the proxy never cut, so the test shows nothing ({answer})"
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let view = f.get("hold", &key).await.unwrap();
                let done = view.as_ref().is_some_and(|v| v.flow.status == "COMPLETED");
                let pending = b
                    .scalar(&format!(
                        "SELECT COUNT(*) FROM orderly_timers WHERE machine = '{WAIT_MACHINE}' \
                         AND ref_id = '{key}' AND status = 'PENDING'"
                    ))
                    .await;
                if done && pending == 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{cut:?}: never finished: {view:?}"
                );
                if view.is_none() {
                    // The cut start never committed the flow: the caller starts it again.
                    let _ = f.start(Hold, &key, &order(n)).await;
                }
                let round = sound.fire_once().await.unwrap();
                assert_eq!(round.dead, 0, "{cut:?}: {round:?}");
                f.recover(100).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(effects(b, &key, "Settle").await, 1, "{cut:?}");
            let fired = b
                .scalar(&format!(
                    "SELECT COUNT(*) FROM orderly_timers WHERE machine = '{WAIT_MACHINE}' \
                     AND ref_id = '{key}' AND status = 'FIRED' AND outcome = 'applied'"
                ))
                .await;
            assert!(fired <= 1, "{cut:?}: {fired} timers woke the flow");
        }
    }
}
