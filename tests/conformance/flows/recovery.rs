//! Flows whose runner went away: crashes at every point, a caller that dropped its start,
//! recovery jobs racing, a runner killed by SIGKILL, and the purge of finished flows.

use super::*;

/// Crashes at every point (a step panicking before or after its effect, forward or in
/// a compensation): the recovery job finishes or compensates the flow; every local
/// effect happened exactly once, and every keyed call used only its one key (a keyed
/// call is repeated, with the same key, only when the crash came after it).
pub async fn flow_crash_at_every_point_is_recovered<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(400);
    let f = flows(b, &world, lease).await;
    let forward = ["Insert", "Reserve", "Coupon", "Charge", "Ship"];
    let undos = ["Insert:undo", "Reserve:undo", "Coupon:undo"];
    let mut points = Vec::new();
    for step in forward.iter().chain(&undos) {
        points.push(format!("{step}:before"));
        points.push(format!("{step}:after"));
    }
    for (n, point) in points.iter().enumerate() {
        let key = format!("crash-{n}");
        let compensating = point.contains(":undo");
        if compensating {
            world.plan("Charge", Plan::Fail);
        } else {
            world.clear_plans();
        }
        world.panic_at(point);
        let start = {
            let f = f.clone();
            let key = key.clone();
            tokio::spawn(async move { f.start(Shop, &key, &order(7)).await })
        };
        assert!(start.await.is_err(), "{point}: the start crashed");
        assert_eq!(world.panicked.lock().unwrap().last(), Some(point));
        settle(&f, lease).await;
        let view = f.get("shop", &key).await.unwrap().unwrap();
        let expected = if compensating {
            "COMPENSATED"
        } else {
            "COMPLETED"
        };
        assert_eq!(view.flow.status, expected, "{point}");
        // Local effects: exactly once each.
        for what in ["Insert", "Coupon"] {
            assert_eq!(effects(b, &key, what).await, 1, "{point}: {what}");
        }
        for what in ["Insert:undo", "Coupon:undo"] {
            let n = i64::from(compensating);
            assert_eq!(effects(b, &key, what).await, n, "{point}: {what}");
        }
        // Keyed calls: only with their own keys; twice only if the crash came after the
        // call (the step was recorded started, not finished, and ran again).
        let calls = world.calls();
        let mine: Vec<_> = calls
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("shop:{key}:")))
            .collect();
        let mut expected_keys: Vec<&str> = if compensating {
            vec!["Reserve", "Reserve:undo"]
        } else {
            vec!["Reserve", "Charge", "Ship"]
        };
        expected_keys.sort_unstable();
        let mut got: Vec<_> = mine
            .iter()
            .map(|(k, _)| &k["shop:".len() + key.len() + 1..])
            .collect();
        got.sort_unstable();
        assert_eq!(got, expected_keys, "{point}");
        for &(k, &count) in &mine {
            let step = &k["shop:".len() + key.len() + 1..];
            let twice = point == &format!("{step}:after");
            assert_eq!(count, 1 + usize::from(twice), "{point}: {k}");
        }
    }
}

/// A start dropped at every await point it reaches (k = 0, 1, 2, … polls): the flow runs
/// to its end off the caller's task (no recovery job, long before its lease runs out),
/// every local effect exactly once. Evidence: a flow found unfinished (not yet recorded,
/// or running) right after its caller left.
pub async fn flow_dropped_by_its_caller_runs_to_its_end<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(200);
    let f = flows(b, &world, lease).await;
    // The distinct points (steps recorded so far) at which a flow was found still running
    // after its caller dropped the start.
    let mut left_at = HashSet::new();
    // Sweeps again (new keys) while the drops have not yet cut it at enough points: on
    // a loaded machine one sweep can miss a point.
    for sweep in 0..3 {
        if !left_at.is_empty() {
            break;
        }
        sweep_drops(b, &f, &world, lease, sweep, &mut left_at).await;
    }
    // Some caller left before its flow had ended (the flow ran on without it).
    assert!(
        !left_at.is_empty(),
        "no drop left a flow unfinished: the test shows nothing"
    );
    super::super::faults::assert_pool_clean(b, f.store()).await;
}

/// One sweep of [`flow_dropped_by_its_caller_runs_to_its_end`]: a start dropped after
/// k = 0, 1, 2, … polls until one completes; the distinct points at which a drop left a
/// flow running go into `left_at`.
async fn sweep_drops<B: Backend>(
    b: &B,
    f: &Flows<B::S>,
    world: &World,
    lease: Duration,
    sweep: usize,
    left_at: &mut HashSet<usize>,
) {
    for k in 0.. {
        assert!(k < 500, "the start never completed");
        let key = format!("drop-{sweep}-{k}");
        let done = super::super::faults::poll_at_most(f.start(Shop, &key, &order(8)), k).await;
        if let Some(started) = done {
            assert!(matches!(
                started.unwrap().outcome,
                FlowOutcome::Completed(_)
            ));
            break;
        }
        // The flow goes on without its caller: found running, then completed, well
        // inside its lease, with no recovery job.
        match f.get("shop", &key).await.unwrap() {
            Some(view) if view.flow.status == "RUNNING" => {
                left_at.insert(view.steps.len());
            }
            // Not written yet: its caller left before its start was recorded.
            None => {
                left_at.insert(usize::MAX);
            }
            Some(_) => {}
        }
        // (A start dropped before its record was written may still write it: absent,
        // it is looked for again a while.)
        let asked = std::time::Instant::now();
        loop {
            match f.get("shop", &key).await.unwrap() {
                Some(view) if view.flow.status == "RUNNING" => assert!(
                    asked.elapsed() < lease * 10,
                    "k = {k}: the dropped flow stopped at {} steps",
                    view.steps.len()
                ),
                None if asked.elapsed() < Duration::from_millis(200) => {}
                _ => break,
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if let Some(view) = f.get("shop", &key).await.unwrap() {
            assert_eq!(view.flow.status, "COMPLETED", "k = {k}");
            assert_eq!(effects(b, &key, "Insert").await, 1, "k = {k}");
            assert_eq!(effects(b, &key, "Coupon").await, 1, "k = {k}");
        } else {
            // Dropped before its start was recorded: nothing happened.
            assert_eq!(effects(b, &key, "Insert").await, 0, "k = {k}");
        }
        // Keyed calls only with their own keys: a call whose success the drop kept from
        // being recorded is made again, with the same key.
        let calls = world.calls();
        let mine = calls
            .keys()
            .filter(|c| c.starts_with(&format!("shop:{key}:")));
        assert!(mine.count() <= 3, "k = {k}: {calls:?}");
        for step in ["Reserve", "Charge", "Ship"] {
            let n = calls
                .get(&format!("shop:{key}:{step}"))
                .copied()
                .unwrap_or(0);
            assert!(n <= 2, "k = {k}: {step} called {n} times");
        }
    }
}

/// Two recovery jobs racing over 100 stuck flows (their runners died after the first
/// step): each flow is completed once, each job took some, and no local effect doubled.
pub async fn flow_recovery_jobs_race<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    // Long enough that a job's round finishes inside its lease on a slow server.
    let lease = Duration::from_secs(2);
    let f = flows(b, &world, lease).await;
    for i in 0..100 {
        world.panic_at("Reserve:before");
        let f = f.clone();
        let started =
            tokio::spawn(async move { f.start(Shop, &format!("race-{i}"), &order(i)).await });
        assert!(started.await.is_err());
    }
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    assert_eq!(f.list(Listing::Stuck, None, 1000).await.unwrap().len(), 100);
    let job = |f: Flows<B::S>| {
        tokio::spawn(async move {
            let mut taken = 0;
            loop {
                let round = f.recover(5).await.unwrap();
                assert_eq!(round.errors + round.lost, 0, "{round:?}");
                assert_eq!(round.completed, round.taken);
                taken += round.taken;
                if round.taken == 0 {
                    return taken;
                }
            }
        })
    };
    let (one, two) = (job(f.clone()), job(f.clone()));
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    assert_eq!(one + two, 100);
    assert!(
        one > 0 && two > 0,
        "one job took everything ({one}, {two}): no race"
    );
    let completed = b
        .scalar("SELECT COUNT(*) FROM orderly_flows WHERE kind = 'shop' AND status = 'COMPLETED'")
        .await;
    assert_eq!(completed, 100);
    let doubled = b
        .scalar(
            "SELECT COUNT(*) FROM (SELECT flow_key, what FROM flow_effects \
             GROUP BY flow_key, what HAVING COUNT(*) > 1) AS d",
        )
        .await;
    assert_eq!(doubled, 0);
    assert!(world.calls().values().all(|&n| n == 1));
}

/// The environment variable that makes a test process the child of
/// [`flow_runner_killed_by_sigkill_is_recovered`]: `{database handle}|{directory}`.
pub const CHILD: &str = "ORDERLY_FLOW_CHILD";

/// A runner in a process of its own, killed with SIGKILL while one flow is inside a
/// keyed call (recorded started, not made) and another inside a local step's open
/// transaction (its effect written, not committed). The recovery job in this process
/// finishes both: the keyed call is made once, with its key; the local step's effect,
/// rolled back by the kill, is written once.
pub async fn flow_runner_killed_by_sigkill_is_recovered<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_secs(1);
    let f = flows(b, &world, lease).await;
    let dir = tempfile::tempdir().unwrap();
    let name = "flow_runner_killed_by_sigkill_is_recovered";
    let thread = std::thread::current();
    let test = thread.name().filter(|n| n.ends_with(name)).unwrap_or(name);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(
            CHILD,
            format!("{}|{}", b.child_handle(), dir.path().display()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for marker in ["Charge:before", "Coupon:after"] {
        while !dir.path().join(marker).exists() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the child exited before reaching {marker}"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "the child never reached {marker}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the child was killed, not finished: {status}"
    );
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9));
    }
    // What the child left: one keyed step started, the local step not committed.
    let keyed = f.get("shop", "killed-keyed").await.unwrap().unwrap();
    assert!(
        keyed
            .steps
            .iter()
            .any(|s| s.name == "Charge" && s.status == "STARTED")
    );
    assert_eq!(effects(b, "killed-local", "Coupon").await, 0);
    assert_eq!(effects(b, "killed-local", "Insert").await, 1);

    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    settle(&f, lease).await;
    let mut calls: HashMap<String, usize> = world.calls();
    let logged = std::fs::read_to_string(dir.path().join("calls")).unwrap();
    for key in logged.lines() {
        *calls.entry(key.to_string()).or_default() += 1;
    }
    for key in ["killed-keyed", "killed-local"] {
        let view = f.get("shop", key).await.unwrap().unwrap();
        assert_eq!(view.flow.status, "COMPLETED", "{key}");
        for what in ["Insert", "Coupon"] {
            assert_eq!(effects(b, key, what).await, 1, "{key}: {what}");
        }
        for step in ["Reserve", "Charge", "Ship"] {
            assert_eq!(
                calls.get(&format!("shop:{key}:{step}")),
                Some(&1),
                "{key}: {step}: {calls:?}"
            );
        }
    }
    assert_eq!(calls.len(), 6, "{calls:?}");
}

/// The child's side of [`flow_runner_killed_by_sigkill_is_recovered`]: runs
/// `killed-keyed` until it hangs before its Charge call, then `killed-local` until it
/// hangs inside its Coupon step's transaction, and waits to be killed.
pub(crate) async fn flow_child<B: Backend>(spec: &str) {
    let (handle, dir) = spec.split_once('|').expect("handle|directory");
    let dir = std::path::Path::new(dir);
    let world = Arc::new(World {
        log: Some(dir.join("calls")),
        ..World::default()
    });
    let store = B::child_store(handle).await;
    let f = Flows::new(store, config(Duration::from_secs(1)))
        .unwrap()
        .register(shop::<B>(&world))
        .unwrap();
    world.hangs.lock().unwrap().insert("Charge:before".into());
    let f1 = f.clone();
    tokio::spawn(async move { f1.start(Shop, "killed-keyed", &order(20)).await });
    while !dir.join("Charge:before").exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    world.hangs.lock().unwrap().insert("Coupon:after".into());
    let f2 = f.clone();
    tokio::spawn(async move { f2.start(Shop, "killed-local", &order(21)).await });
    std::future::pending::<()>().await;
}

/// The purge deletes finished flows (completed or compensated) past the given age, with
/// their step rows, in batches; running, waiting and parked flows stay. A purged flow is
/// forgotten: a start under its key runs it again.
pub async fn flow_purge_removes_only_finished_flows<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    f.start(Shop, "done", &order(40)).await.unwrap();
    world.plan("Charge", Plan::Fail);
    f.start(Shop, "undone", &order(41)).await.unwrap();
    world.clear_plans();
    world.plan("Ship", Plan::Fail);
    f.start(Shop, "parked", &order(42)).await.unwrap();
    world.clear_plans();
    world.plan("Reserve", Plan::Retry(1));
    f.start(Shop, "waiting", &order(43)).await.unwrap();
    world.clear_plans();
    world.panic_at("Coupon:before");
    let f2 = f.clone();
    assert!(
        tokio::spawn(async move { f2.start(Shop, "running", &order(44)).await })
            .await
            .is_err()
    );
    assert!(matches!(
        f.purge(Duration::ZERO, 0).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(f.purge(Duration::from_secs(3600), 10).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(f.purge(Duration::from_millis(10), 1).await.unwrap(), 2);
    for key in ["done", "undone"] {
        assert!(f.get("shop", key).await.unwrap().is_none(), "{key}");
        let steps = b
            .scalar(&format!(
                "SELECT COUNT(*) FROM orderly_flow_steps WHERE flow_key = '{key}'"
            ))
            .await;
        assert_eq!(steps, 0, "{key}");
    }
    for key in ["parked", "waiting", "running"] {
        let view = f.get("shop", key).await.unwrap();
        assert!(view.is_some_and(|v| !v.steps.is_empty()), "{key}");
    }
    let again = f.start(Shop, "done", &order(40)).await.unwrap();
    assert!(!again.replayed);
    assert!(matches!(again.outcome, FlowOutcome::Completed(_)));
    assert_eq!(effects(b, "done", "Insert").await, 2);
}
