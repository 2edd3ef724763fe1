//! Flows: the declared steps run once, compensations in reverse, the recovery job, the
//! operator's resume, crashes at every point. One body per behaviour, on every backend.
//!
//! Local effects are rows in `flow_effects`, written by the steps inside their checkpoint
//! transactions, with no unique key: a step applied twice leaves two rows. Keyed and
//! unsafe effects are calls to a fake downstream service that records the key of every
//! call.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orderly::flow::{
    Ctx, Definition, FlowConfig, FlowOutcome, FlowStore, Flows, Listing, MAX_ERROR_BYTES,
    ParkReason, Resume, StepError,
};
use orderly::{Error, Store};

use super::Backend;

orderly::flow! {
    /// Creating an order: insert it, reserve stock (a warehouse call), use a coupon,
    /// charge the card (a gateway call), then ship (never undone).
    pub Shop {
        kind: "shop";
        version: 1;
        steps: ShopStep {
            Insert:  local + undo,
            Reserve: keyed + undo,
            Coupon:  local + undo,
            Charge:  keyed + undo,
            Ship:    keyed,
        }
        pivot: Ship;
    }
}

orderly::flow! {
    /// A flow with an unsafe call (a legacy API without idempotency keys).
    pub Legacy {
        kind: "legacy";
        version: 1;
        steps: LegacyStep {
            Prepare: local + undo,
            Post:    unsafe + undo,
            Finish:  local,
        }
    }
}

/// The flow's input.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Order {
    pub id: i64,
    pub amount: u64,
}

/// How a step or compensation misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Fails for good, every time.
    Fail,
    /// Asks to be retried this many times, then succeeds.
    Retry(u32),
    /// Asks to be retried every time.
    RetryForever,
}

/// The world outside the flow: the downstream service, and the faults to inject.
#[derive(Default)]
pub struct World {
    /// The key of every downstream call, in order.
    calls: Mutex<Vec<String>>,
    plans: Mutex<HashMap<String, Plan>>,
    /// Points that panic, once each: `"{step}:before"`, `"{step}:after"` (around the
    /// effect), with `:undo` for compensations.
    panics: Mutex<HashSet<String>>,
    /// Points that panicked.
    panicked: Mutex<Vec<String>>,
    /// Points that hang forever, once each, after creating a file of their name in this
    /// directory (a process killed there).
    hangs: Mutex<HashSet<String>>,
    /// A file every call's key is appended to, shared with a child process.
    log: Option<std::path::PathBuf>,
}

impl World {
    pub fn plan(&self, point: &str, plan: Plan) {
        self.plans.lock().unwrap().insert(point.to_string(), plan);
    }

    pub fn clear_plans(&self) {
        self.plans.lock().unwrap().clear();
    }

    pub fn panic_at(&self, point: &str) {
        self.panics.lock().unwrap().insert(point.to_string());
    }

    async fn point(&self, point: String) {
        // An await point of its own at every point, whatever the I/O does: a future
        // polled a bounded number of times stops here too (on a loaded machine replies
        // are often ready before they are awaited, and a statement then costs no poll).
        tokio::task::yield_now().await;
        if self.panics.lock().unwrap().remove(&point) {
            self.panicked.lock().unwrap().push(point.clone());
            panic!("injected crash at {point}");
        }
        let hang = self.hangs.lock().unwrap().remove(&point);
        if let (true, Some(log)) = (hang, &self.log) {
            std::fs::write(log.with_file_name(&point), b"").unwrap();
            std::future::pending::<()>().await;
        }
    }

    fn judge(&self, point: &str) -> Result<(), StepError> {
        let mut plans = self.plans.lock().unwrap();
        match plans.get(point).copied() {
            None => Ok(()),
            Some(Plan::Fail) => Err(StepError::fail(format!("{point} refused"))),
            Some(Plan::RetryForever) => Err(StepError::retry(format!("{point} timed out"))),
            Some(Plan::Retry(0)) => {
                plans.remove(point);
                Ok(())
            }
            Some(Plan::Retry(n)) => {
                plans.insert(point.to_string(), Plan::Retry(n - 1));
                Err(StepError::retry(format!("{point} timed out")))
            }
        }
    }

    fn call(&self, key: &str) {
        self.calls.lock().unwrap().push(key.to_string());
        if let Some(log) = &self.log {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap();
            // One write call per line, so a kill never leaves half a line.
            file.write_all(format!("{key}\n").as_bytes()).unwrap();
        }
    }

    /// Every downstream call's key, with how often it was called.
    pub fn calls(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for key in self.calls.lock().unwrap().iter() {
            *counts.entry(key.clone()).or_default() += 1;
        }
        counts
    }

    pub fn calls_in_order(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

fn effect_sql(flow_key: &str, what: &str) -> String {
    format!("INSERT INTO flow_effects (flow_key, what) VALUES ('{flow_key}', '{what}')")
}

/// How a local action runs literal SQL on its connection.
pub type Exec<S> = for<'c> fn(
    &'c mut <S as Store>::Conn,
    String,
) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>>;

/// A local action: the point before, the plan, the effect row, the point after.
fn local_action<B: Backend>(
    world: &Arc<World>,
    point: &'static str,
) -> impl for<'c> Fn(
    &'c mut <B::S as Store>::Conn,
    &'c Ctx<Order>,
) -> orderly::idempotency::Work<'c, Result<String, StepError>>
+ Send
+ Sync
+ 'static {
    local_on::<B::S>(world, point, B::exec_conn)
}

/// [`local_action`] on any store, its SQL run by `exec`.
fn local_on<S: FlowStore>(
    world: &Arc<World>,
    point: &'static str,
    exec: Exec<S>,
) -> impl for<'c> Fn(
    &'c mut <S as Store>::Conn,
    &'c Ctx<Order>,
) -> orderly::idempotency::Work<'c, Result<String, StepError>>
+ Send
+ Sync
+ 'static {
    let world = world.clone();
    move |conn, ctx| {
        let world = world.clone();
        Box::pin(async move {
            world.point(format!("{point}:before")).await;
            world.judge(point)?;
            exec(conn, effect_sql(ctx.flow_key(), point)).await?;
            world.point(format!("{point}:after")).await;
            Ok(format!("{point} of {}", ctx.input().id))
        })
    }
}

/// A downstream call: the point before, the plan, the call with the context's key, the
/// point after.
fn call_action(
    world: &Arc<World>,
    point: &'static str,
) -> impl for<'c> Fn(&'c Ctx<Order>) -> orderly::idempotency::Work<'c, Result<String, StepError>>
+ Send
+ Sync
+ 'static {
    let world = world.clone();
    move |ctx| {
        let world = world.clone();
        Box::pin(async move {
            world.point(format!("{point}:before")).await;
            world.judge(point)?;
            world.call(ctx.key());
            world.point(format!("{point}:after")).await;
            Ok(format!("{} for {}", ctx.key(), ctx.input().amount))
        })
    }
}

pub fn shop<B: Backend>(world: &Arc<World>) -> Definition<B::S, Order> {
    shop_on::<B::S>(world, B::exec_conn)
}

/// [`shop`] on any store, its local steps' SQL run by `exec`.
pub fn shop_on<S: FlowStore>(world: &Arc<World>, exec: Exec<S>) -> Definition<S, Order> {
    use ShopStep::*;
    Definition::new(Shop)
        .local(Insert, local_on::<S>(world, "Insert", exec))
        .undo_local(Insert, local_on::<S>(world, "Insert:undo", exec))
        .call(Reserve, call_action(world, "Reserve"))
        .undo_call(Reserve, call_action(world, "Reserve:undo"))
        .local(Coupon, local_on::<S>(world, "Coupon", exec))
        .undo_local(Coupon, local_on::<S>(world, "Coupon:undo", exec))
        .call(Charge, call_action(world, "Charge"))
        .undo_call(Charge, call_action(world, "Charge:undo"))
        .call(Ship, call_action(world, "Ship"))
}

pub fn legacy<B: Backend>(world: &Arc<World>) -> Definition<B::S, Order> {
    use LegacyStep::*;
    Definition::new(Legacy)
        .local(Prepare, local_action::<B>(world, "Prepare"))
        .undo_local(Prepare, local_action::<B>(world, "Prepare:undo"))
        .call(Post, call_action(world, "Post"))
        .undo_call(Post, call_action(world, "Post:undo"))
        .local(Finish, local_action::<B>(world, "Finish"))
}

pub fn config(lease: Duration) -> FlowConfig {
    FlowConfig {
        lease,
        attempts: 4,
        backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(20),
        ..FlowConfig::default()
    }
}

/// Flows on a fresh store with `Shop` and `Legacy` registered, and the effects table.
pub(crate) async fn flows<B: Backend>(b: &B, world: &Arc<World>, lease: Duration) -> Flows<B::S> {
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    Flows::new(b.store(Duration::from_secs(10)).await, config(lease))
        .unwrap()
        .read_first(B::POLICY)
        .register(shop::<B>(world))
        .unwrap()
        .register(legacy::<B>(world))
        .unwrap()
}

/// How many effect rows `what` the flow `key` left.
pub(crate) async fn effects<B: Backend>(b: &B, key: &str, what: &str) -> i64 {
    b.scalar(&format!(
        "SELECT COUNT(*) FROM flow_effects WHERE flow_key = '{key}' AND what = '{what}'"
    ))
    .await
}

fn order(id: i64) -> Order {
    Order { id, amount: 100 }
}

/// The step rows of a flow as `(name, phase, status, attempt)`, in order.
async fn step_rows<S: orderly::flow::FlowStore>(
    f: &Flows<S>,
    kind: &str,
    key: &str,
) -> Vec<(String, String, String, i32)> {
    let view = f
        .get(kind, key)
        .await
        .unwrap()
        .expect("the flow is recorded");
    view.steps
        .into_iter()
        .map(|s| (s.name, s.phase, s.status, s.attempt))
        .collect()
}

fn rows(spec: &[(&str, &str, &str, i32)]) -> Vec<(String, String, String, i32)> {
    spec.iter()
        .map(|(n, p, s, a)| (n.to_string(), p.to_string(), s.to_string(), *a))
        .collect()
}

/// Runs recovery rounds (each after the lease ran out) until no flow is due or
/// running; how many rounds it took.
pub async fn settle<S: orderly::flow::FlowStore>(f: &Flows<S>, lease: Duration) -> usize {
    for round in 1..=40 {
        let live = f.list(Listing::Running, None, 1000).await.unwrap();
        let due = f.list(Listing::Stuck, None, 1000).await.unwrap();
        if live.is_empty() && due.is_empty() {
            return round;
        }
        if !live.is_empty() {
            tokio::time::sleep(lease + Duration::from_millis(50)).await;
        }
        f.recover(1000).await.unwrap();
    }
    panic!("flows still running after 40 recovery rounds");
}

/// The happy path: every step runs once, local effects commit with their step rows,
/// keyed calls carry `"{flow_key}:{step}"`; a second start with the same input replays
/// the recorded outputs without running anything; another input under the key is a
/// mismatch; the record and its steps read back.
pub async fn flow_runs_each_step_once<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    let started = f.start(Shop, "o-1", &order(1)).await.unwrap();
    assert!(!started.replayed);
    let FlowOutcome::Completed(outputs) = started.outcome else {
        panic!("expected completion, got {started:?}");
    };
    assert_eq!(
        outputs.get::<String>(ShopStep::Insert).unwrap(),
        "Insert of 1"
    );
    assert_eq!(
        outputs.get::<String>(ShopStep::Charge).unwrap(),
        "shop:o-1:Charge for 100"
    );
    for what in ["Insert", "Coupon"] {
        assert_eq!(effects(b, "o-1", what).await, 1, "{what}");
    }
    assert_eq!(
        world.calls_in_order(),
        ["shop:o-1:Reserve", "shop:o-1:Charge", "shop:o-1:Ship"]
    );
    assert_eq!(
        step_rows(&f, "shop", "o-1").await,
        rows(&[
            ("Insert", "F", "SUCCEEDED", 1),
            ("Reserve", "F", "SUCCEEDED", 1),
            ("Coupon", "F", "SUCCEEDED", 1),
            ("Charge", "F", "SUCCEEDED", 1),
            ("Ship", "F", "SUCCEEDED", 1),
        ])
    );
    let view = f.get("shop", "o-1").await.unwrap().unwrap();
    assert_eq!(view.flow.status, "COMPLETED");
    assert!(view.known);
    assert_eq!(
        view.steps[1].downstream_key.as_deref(),
        Some("shop:o-1:Reserve")
    );
    assert!(
        view.steps
            .iter()
            .all(|s| s.finished_at >= Some(s.started_at))
    );

    let again = f.start(Shop, "o-1", &order(1)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.outcome, FlowOutcome::Completed(outputs));
    assert_eq!(world.calls_in_order().len(), 3);
    assert_eq!(effects(b, "o-1", "Insert").await, 1);
    assert!(matches!(
        f.start(Shop, "o-1", &order(2)).await,
        Err(Error::PayloadMismatch { .. })
    ));
    assert!(f.get("shop", "o-404").await.unwrap().is_none());
}

/// A step failing for good at position k compensates the completed steps k-1 … 1 in
/// reverse order, each recorded with its own key; the flow answers `Compensated` with
/// the failed step and its error, replayed to a later start.
pub async fn flow_failure_compensates_in_reverse<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Charge", Plan::Fail);
    let started = f.start(Shop, "o-2", &order(2)).await.unwrap();
    let compensated = FlowOutcome::Compensated {
        step: "Charge".into(),
        error: "Charge refused".into(),
    };
    assert_eq!(started.outcome, compensated);
    assert_eq!(
        world.calls_in_order(),
        ["shop:o-2:Reserve", "shop:o-2:Reserve:undo"],
        "the failed charge was never called; its undo neither"
    );
    for (what, n) in [
        ("Insert", 1),
        ("Coupon", 1),
        ("Coupon:undo", 1),
        ("Insert:undo", 1),
    ] {
        assert_eq!(effects(b, "o-2", what).await, n, "{what}");
    }
    assert_eq!(
        step_rows(&f, "shop", "o-2").await,
        rows(&[
            ("Insert", "F", "SUCCEEDED", 1),
            ("Insert", "C", "SUCCEEDED", 1),
            ("Reserve", "F", "SUCCEEDED", 1),
            ("Reserve", "C", "SUCCEEDED", 1),
            ("Coupon", "F", "SUCCEEDED", 1),
            ("Coupon", "C", "SUCCEEDED", 1),
            ("Charge", "F", "FAILED", 1),
        ])
    );
    // The compensations ran in reverse: Coupon's before Reserve's before Insert's.
    let view = f.get("shop", "o-2").await.unwrap().unwrap();
    let undone: HashMap<_, _> = view
        .steps
        .iter()
        .filter(|s| s.phase == "C")
        .map(|s| (s.name.as_str(), s.finished_at.unwrap()))
        .collect();
    assert!(undone["Coupon"] <= undone["Reserve"] && undone["Reserve"] <= undone["Insert"]);
    assert_eq!(view.flow.status, "COMPENSATED");

    world.clear_plans();
    let again = f.start(Shop, "o-2", &order(2)).await.unwrap();
    assert_eq!((again.outcome, again.replayed), (compensated, true));
    assert_eq!(world.calls_in_order().len(), 2);

    // A local step failing for good rolls its own writes back and compensates the
    // steps before it.
    world.plan("Coupon", Plan::Fail);
    let started = f.start(Shop, "o-3", &order(3)).await.unwrap();
    assert!(
        matches!(started.outcome, FlowOutcome::Compensated { ref step, .. } if step == "Coupon")
    );
    assert_eq!(effects(b, "o-3", "Coupon").await, 0);
    assert_eq!(effects(b, "o-3", "Insert:undo").await, 1);
    assert_eq!(world.calls()["shop:o-3:Reserve:undo"], 1);
}

/// A compensation asking to be retried twice waits (with backoff) for the recovery job
/// each time, then succeeds; the flow is compensated, each compensation once.
pub async fn flow_compensation_is_retried<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_secs(30);
    let f = flows(b, &world, lease).await;
    world.plan("Charge", Plan::Fail);
    world.plan("Reserve:undo", Plan::Retry(2));
    let started = f.start(Shop, "o-4", &order(4)).await.unwrap();
    assert!(
        matches!(started.outcome, FlowOutcome::Waiting { ref step, .. } if step == "Reserve"),
        "{started:?}"
    );
    // Waiting is not in flight forever: it is due after its backoff.
    let mut rounds = 0;
    let outcome = loop {
        rounds += 1;
        assert!(rounds < 20, "never compensated");
        tokio::time::sleep(Duration::from_millis(30)).await;
        let round = f.recover(10).await.unwrap();
        if round.compensated == 1 {
            break round;
        }
        assert_eq!((round.taken, round.waiting), (1, 1), "{round:?}");
    };
    assert_eq!(outcome.taken, 1);
    assert_eq!(
        rounds, 2,
        "retried twice: once by the start, once by a round"
    );
    assert_eq!(world.calls()["shop:o-4:Reserve:undo"], 1);
    assert_eq!(effects(b, "o-4", "Insert:undo").await, 1);
    let rows = step_rows(&f, "shop", "o-4").await;
    // Three attempts begun (two asked to be retried), one call made.
    assert!(
        rows.contains(&("Reserve".into(), "C".into(), "SUCCEEDED".into(), 3)),
        "{rows:?}"
    );
    assert_eq!(
        f.get("shop", "o-4").await.unwrap().unwrap().flow.status,
        "COMPENSATED"
    );
}

/// A compensation that keeps failing is given up after the attempt cap; the other
/// compensations still run; the flow parks as `CompensationFailed`, listed as parked;
/// the operator's resume runs the given-up compensation again and the flow is
/// compensated.
pub async fn flow_failing_compensation_parks_until_resumed<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Charge", Plan::Fail);
    world.plan("Coupon:undo", Plan::RetryForever);
    let started = f.start(Shop, "o-5", &order(5)).await.unwrap();
    assert!(matches!(started.outcome, FlowOutcome::Waiting { .. }));
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        f.recover(10).await.unwrap();
        if !f.list(Listing::Parked, None, 10).await.unwrap().is_empty() {
            break;
        }
    }
    let parked = f.list(Listing::Parked, None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        parked[0].flow.park_reason.as_deref(),
        Some("COMPENSATION_FAILED")
    );
    // The others ran, after the given-up one.
    assert_eq!(world.calls()["shop:o-5:Reserve:undo"], 1);
    assert_eq!(effects(b, "o-5", "Insert:undo").await, 1);
    assert_eq!(effects(b, "o-5", "Coupon:undo").await, 0);
    let rows = step_rows(&f, "shop", "o-5").await;
    assert!(
        rows.contains(&("Coupon".into(), "C".into(), "FAILED".into(), 4)),
        "{rows:?}"
    );
    // A start answers the parked outcome, and no round takes it.
    let again = f.start(Shop, "o-5", &order(5)).await.unwrap();
    assert_eq!(
        again.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::CompensationFailed,
            step: "Charge".into()
        }
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(f.recover(10).await.unwrap().taken, 0);

    world.clear_plans();
    let resumed = f.resume("shop", "o-5", Resume::Retry).await.unwrap();
    assert!(matches!(resumed, FlowOutcome::Compensated { ref step, .. } if step == "Charge"));
    assert_eq!(effects(b, "o-5", "Coupon:undo").await, 1);
    assert_eq!(effects(b, "o-5", "Insert:undo").await, 1);
    assert_eq!(world.calls()["shop:o-5:Reserve:undo"], 1);
    assert!(matches!(
        f.resume("shop", "o-5", Resume::Retry).await,
        Err(Error::InvalidInput(_))
    ));
}

/// 32 concurrent starts of one flow: one runs it; the others are told it is in flight
/// or, once it completed, replayed. Every step ran once.
pub async fn flow_concurrent_starts_run_once<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            f.start(Shop, "o-6", &order(6)).await
        }));
    }
    let (mut ran, mut replayed, mut in_flight) = (0, 0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(s) if s.replayed => replayed += 1,
            Ok(s) => {
                assert!(matches!(s.outcome, FlowOutcome::Completed(_)));
                ran += 1;
            }
            Err(Error::InFlight { .. }) => in_flight += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(ran, 1);
    assert_eq!(ran + replayed + in_flight, 32);
    assert!(
        in_flight > 0,
        "no start overlapped the running one: the race did not happen"
    );
    assert_eq!(effects(b, "o-6", "Insert").await, 1);
    assert_eq!(effects(b, "o-6", "Coupon").await, 1);
    let calls = world.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.values().all(|&n| n == 1), "{calls:?}");
}

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
    super::faults::assert_pool_clean(b, f.store()).await;
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
        let done = super::faults::poll_at_most(f.start(Shop, &key, &order(8)), k).await;
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
        .scalar("SELECT COUNT(*) FROM flows WHERE kind = 'shop' AND status = 'COMPLETED'")
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

/// An unsafe step whose runner died after it started is never run again by itself: the
/// flow parks as `NeedsReconciliation`. The operator's resume says what happened:
/// `Applied` records the step and the flow goes on; `Compensate` undoes the steps
/// before it; `Retry` runs it again. An unsafe step asking to be retried parks too.
pub async fn flow_unsafe_step_parks_for_reconciliation<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(300);
    let f = flows(b, &world, lease).await;
    for (key, how) in [
        (
            "u-applied",
            Resume::Applied(serde_json::json!("posted by hand")),
        ),
        ("u-undo", Resume::Compensate),
        ("u-retry", Resume::Retry),
    ] {
        world.panic_at("Post:after");
        let f2 = f.clone();
        let started = tokio::spawn(async move { f2.start(Legacy, key, &order(9)).await });
        assert!(started.await.is_err());
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let round = f.recover(10).await.unwrap();
        assert_eq!((round.taken, round.parked), (1, 1), "{key}");
        assert_eq!(
            world.calls()[&format!("legacy:{key}:Post")],
            1,
            "not called again"
        );
        let parked = f.get("legacy", key).await.unwrap().unwrap();
        assert_eq!(
            parked.flow.park_reason.as_deref(),
            Some("NEEDS_RECONCILIATION")
        );
        let resumed = f.resume("legacy", key, how.clone()).await.unwrap();
        match how {
            Resume::Applied(_) => {
                let FlowOutcome::Completed(out) = resumed else {
                    panic!("{resumed:?}")
                };
                assert_eq!(
                    out.get::<String>(LegacyStep::Post).unwrap(),
                    "posted by hand"
                );
                assert_eq!(world.calls()[&format!("legacy:{key}:Post")], 1);
                assert_eq!(effects(b, key, "Finish").await, 1);
            }
            Resume::Compensate => {
                assert!(
                    matches!(resumed, FlowOutcome::Compensated { ref step, .. } if step == "Post")
                );
                assert_eq!(effects(b, key, "Prepare:undo").await, 1);
                assert!(
                    !world
                        .calls()
                        .contains_key(&format!("legacy:{key}:Post:undo"))
                );
            }
            Resume::Retry => {
                assert!(matches!(resumed, FlowOutcome::Completed(_)));
                assert_eq!(world.calls()[&format!("legacy:{key}:Post")], 2);
            }
        }
        assert_eq!(effects(b, key, "Prepare").await, 1);
    }
    world.plan("Post", Plan::Retry(1));
    let started = f.start(Legacy, "u-timeout", &order(10)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::NeedsReconciliation,
            step: "Post".into()
        }
    );
}

/// A step that crashes its runner every time does not loop forever: after the attempt
/// cap the flow parks as `AttemptsExhausted`, listed as parked; once fixed, the
/// operator's resume completes it.
pub async fn flow_attempt_cap_parks_a_crashing_step<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(300);
    let f = flows(b, &world, lease).await;
    let crash = || {
        world.panic_at("Coupon:after");
    };
    crash();
    let f2 = f.clone();
    assert!(
        tokio::spawn(async move { f2.start(Shop, "cap", &order(11)).await })
            .await
            .is_err()
    );
    let mut rounds = 0;
    while f.list(Listing::Parked, None, 10).await.unwrap().is_empty() {
        rounds += 1;
        assert!(rounds <= 6, "never parked");
        crash();
        tokio::time::sleep(lease + Duration::from_millis(50)).await;
        let round = f.recover(10).await.unwrap();
        assert_eq!(round.taken, 1);
    }
    // Claimed by the start, then by `attempts` - 1 crashing rounds, then parked.
    assert_eq!(rounds, 4);
    let parked = f.list(Listing::Parked, None, 10).await.unwrap();
    assert_eq!(
        parked[0].flow.park_reason.as_deref(),
        Some("ATTEMPTS_EXHAUSTED")
    );
    assert_eq!(parked[0].flow.step_at, 2);
    assert_eq!(effects(b, "cap", "Coupon").await, 0);
    world.panics.lock().unwrap().clear();
    let resumed = f.resume("shop", "cap", Resume::Retry).await.unwrap();
    assert!(matches!(resumed, FlowOutcome::Completed(_)));
    assert_eq!(effects(b, "cap", "Coupon").await, 1);
    assert_eq!(effects(b, "cap", "Insert").await, 1);
    assert_eq!(world.calls()["shop:cap:Reserve"], 1);
}

orderly::flow! {
    /// `Shop`'s next version: a runner that knows only it leaves version 1 alone.
    pub ShopV2 {
        kind: "shop";
        version: 2;
        steps: ShopV2Step {
            Insert: local,
        }
    }
}

/// A rolling deploy: a runner that knows only version 2 neither recovers nor starts a
/// version 1 flow, and lists it as unknown; a runner that knows version 1 completes it.
pub async fn flow_unknown_version_is_left_alone<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(300);
    let old = flows(b, &world, lease).await;
    world.panic_at("Reserve:before");
    let o = old.clone();
    assert!(
        tokio::spawn(async move { o.start(Shop, "v1", &order(12)).await })
            .await
            .is_err()
    );
    let w = world.clone();
    let new = Flows::new(b.store(Duration::from_secs(10)).await, config(lease))
        .unwrap()
        .register(
            Definition::new(ShopV2).local(ShopV2Step::Insert, local_action::<B>(&w, "Insert")),
        )
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    assert_eq!(new.recover(10).await.unwrap().taken, 0);
    let listed = new.list(Listing::Stuck, None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].known);
    assert_eq!(listed[0].flow.version, 1);
    assert!(matches!(
        new.start(ShopV2, "v1", &order(12)).await,
        Err(Error::FlowVersion { version: 1, .. })
    ));
    let round = old.recover(10).await.unwrap();
    assert_eq!((round.taken, round.completed), (1, 1));
    assert!(old.list(Listing::Finished, None, 10).await.unwrap()[0].known);
    assert_eq!(effects(b, "v1", "Insert").await, 1);
}

/// Bad definitions and bad input are typed errors before anything is written.
pub async fn flow_bad_definitions_are_rejected<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let store = b.store(Duration::from_secs(10)).await;
    let incomplete = Definition::<B::S, Order>::new(Legacy)
        .local(LegacyStep::Prepare, local_action::<B>(&world, "Prepare"));
    let err = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(incomplete)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("Post has no action") && m.contains("Prepare declares `+ undo`")),
        "{err}"
    );
    let wrong_class =
        legacy::<B>(&world).local(LegacyStep::Post, local_action::<B>(&world, "Post"));
    let err = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(wrong_class)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("attached with call")),
        "{err}"
    );
    let foreign = legacy::<B>(&world).local(ShopStep::Insert, local_action::<B>(&world, "Insert"));
    assert!(
        Flows::new(store.clone(), FlowConfig::default())
            .unwrap()
            .register(foreign)
            .is_err()
    );
    let twice = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(legacy::<B>(&world))
        .unwrap()
        .register(legacy::<B>(&world));
    assert!(matches!(twice, Err(Error::InvalidInput(m)) if m.contains("twice")));
    let zero = FlowConfig {
        attempts: 0,
        ..FlowConfig::default()
    };
    assert!(Flows::new(store.clone(), zero).is_err());

    let f = flows(b, &world, Duration::from_secs(30)).await;
    for key in ["", " padded", &"k".repeat(300)] {
        assert!(matches!(
            f.start(Shop, key, &order(1)).await,
            Err(Error::InvalidInput(_))
        ));
    }
    assert!(matches!(
        f.start(Shop, "bad-input", &"not an order").await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        f.start(ShopV2, "unregistered", &order(1)).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        f.resume("shop", "nothing", Resume::Retry).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(b.scalar("SELECT COUNT(*) FROM flows").await, 0);
}

orderly::flow! {
    /// The payment gateway's callback: mark the payment succeeded, move the order to
    /// Paid, create the shipping task.
    pub PaymentCallback {
        kind: "payment_callback";
        version: 1;
        steps: CallbackStep {
            MarkPayment:  local,
            MoveOrder:    local,
            ShippingTask: local,
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Callback {
    pub order_id: i64,
    pub payment_id: String,
}

/// The payment callback delivered three times at once (and once more later): one
/// payment marked, the order moved to Paid once, one shipping task.
pub async fn flow_payment_callback_delivered_three_times<B: Backend>(b: &B) {
    let e = super::engine(b).await;
    e.create(42).await.unwrap();
    b.exec("CREATE TABLE payments (payment_id VARCHAR(64) NOT NULL, order_id BIGINT NOT NULL, status VARCHAR(16) NOT NULL)")
        .await;
    b.exec("CREATE TABLE shipping_tasks (order_id BIGINT NOT NULL)")
        .await;
    let moved = e.clone();
    let def = Definition::<B::S, Callback>::new(PaymentCallback)
        .local(CallbackStep::MarkPayment, |conn, ctx| {
            Box::pin(async move {
                let c = ctx.input();
                let sql = format!(
                    "INSERT INTO payments (payment_id, order_id, status) VALUES ('{}', {}, 'SUCCEEDED')",
                    c.payment_id, c.order_id
                );
                B::exec_conn(conn, sql).await?;
                Ok(())
            })
        })
        .local(CallbackStep::MoveOrder, move |conn, ctx| {
            let e = moved.clone();
            Box::pin(async move {
                let c = ctx.input();
                let outcome = e
                    .transition(c.order_id, super::OrderEvent::Pay, &c.payment_id)
                    .within(conn)
                    .await?;
                Ok(format!("{outcome:?}"))
            })
        })
        .local(CallbackStep::ShippingTask, |conn, ctx| {
            Box::pin(async move {
                let sql = format!("INSERT INTO shipping_tasks (order_id) VALUES ({})", ctx.input().order_id);
                B::exec_conn(conn, sql).await?;
                Ok(())
            })
        });
    let f = Flows::new(
        b.store(Duration::from_secs(10)).await,
        config(Duration::from_secs(30)),
    )
    .unwrap()
    .register(def)
    .unwrap();
    let callback = Callback {
        order_id: 42,
        payment_id: "pay_1".into(),
    };
    let deliveries: Vec<_> = (0..3)
        .map(|_| {
            let (f, callback) = (f.clone(), callback.clone());
            tokio::spawn(async move { f.start(PaymentCallback, "pay_1", &callback).await })
        })
        .collect();
    let mut ran = 0;
    for delivery in deliveries {
        match delivery.await.unwrap() {
            Ok(s) if !s.replayed => {
                assert!(matches!(s.outcome, FlowOutcome::Completed(_)));
                ran += 1;
            }
            Ok(_) | Err(Error::InFlight { .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ran, 1);
    let later = f.start(PaymentCallback, "pay_1", &callback).await.unwrap();
    assert!(later.replayed);
    assert_eq!(b.scalar("SELECT COUNT(*) FROM payments").await, 1);
    assert_eq!(b.scalar("SELECT COUNT(*) FROM shipping_tasks").await, 1);
    let order = e.get(42).await.unwrap();
    assert_eq!((order.state, order.version), (super::OrderState::Paid, 1));
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

/// A step failing for good at or after the pivot parks the flow as `FailedPastPivot`
/// (nothing before the pivot is compensated, and the operator cannot ask for it); of two
/// operators resuming it at once, one resumes it and the other is refused.
pub async fn flow_failure_past_the_pivot_parks<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Ship", Plan::Fail);
    let started = f.start(Shop, "pivot", &order(30)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::FailedPastPivot,
            step: "Ship".into()
        }
    );
    let rows = step_rows(&f, "shop", "pivot").await;
    assert!(
        rows.contains(&("Ship".into(), "F".into(), "FAILED".into(), 1)),
        "{rows:?}"
    );
    assert!(
        rows.iter().all(|r| r.1 == "F"),
        "nothing compensated: {rows:?}"
    );
    assert!(matches!(
        f.resume("shop", "pivot", Resume::Compensate).await,
        Err(Error::InvalidInput(m)) if m.contains("pivot")
    ));
    world.clear_plans();
    let resumes: Vec<_> = (0..2)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move { f.resume("shop", "pivot", Resume::Retry).await })
        })
        .collect();
    let mut answers = Vec::new();
    for r in resumes {
        answers.push(r.await.unwrap());
    }
    let resumed = answers
        .iter()
        .filter(|a| matches!(a, Ok(FlowOutcome::Completed(_))))
        .count();
    let refused = answers
        .iter()
        .filter(|a| matches!(a, Err(Error::InvalidInput(_))))
        .count();
    assert_eq!((resumed, refused), (1, 1), "{answers:?}");
    assert_eq!(world.calls()["shop:pivot:Ship"], 1);
    assert_eq!(effects(b, "pivot", "Insert").await, 1);
    assert_eq!(effects(b, "pivot", "Insert:undo").await, 0);
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
                "SELECT COUNT(*) FROM flow_steps WHERE flow_key = '{key}'"
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

/// A gateway's receipt that cannot be recorded while `broken` is set: its `Serialize`
/// fails (as a map with non-string keys, or a hand-written `Serialize`, does).
pub struct Receipt {
    key: String,
    broken: bool,
}

impl serde::Serialize for Receipt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.broken {
            return Err(serde::ser::Error::custom(
                "the receipt's amount is not a number",
            ));
        }
        s.serialize_str(&self.key)
    }
}

/// A downstream call that is made (with the context's key) and answers a [`Receipt`],
/// unrecordable while `broken` holds.
fn receipt_call(
    world: &Arc<World>,
    broken: &Arc<AtomicBool>,
) -> impl for<'c> Fn(&'c Ctx<Order>) -> orderly::idempotency::Work<'c, Result<Receipt, StepError>>
+ Send
+ Sync
+ 'static {
    let (world, broken) = (world.clone(), broken.clone());
    move |ctx| {
        let (world, broken) = (world.clone(), broken.clone());
        Box::pin(async move {
            world.call(ctx.key());
            Ok(Receipt {
                key: ctx.key().to_string(),
                broken: broken.load(Ordering::SeqCst),
            })
        })
    }
}

/// A keyed call that charged the card, and an unsafe call that posted, each answering an
/// output that cannot be recorded: neither is a failure of the step, and neither flow is
/// compensated around it. The keyed one is retried with its one key, with backoff, one
/// call per claim, until the attempt cap parks it `AttemptsExhausted` (nothing undone);
/// once fixed, the operator's retry calls it again with the same key and it completes.
/// The unsafe one, called once, parks `NeedsReconciliation` at once, its step left
/// started, and the operator records what it did.
pub async fn flow_unrecordable_call_output_is_never_compensated<B: Backend>(b: &B) {
    use LegacyStep::*;
    use ShopStep::*;
    let world = Arc::new(World::default());
    let broken = Arc::new(AtomicBool::new(true));
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    let shop = Definition::<B::S, Order>::new(Shop)
        .local(Insert, local_action::<B>(&world, "Insert"))
        .undo_local(Insert, local_action::<B>(&world, "Insert:undo"))
        .call(Reserve, call_action(&world, "Reserve"))
        .undo_call(Reserve, call_action(&world, "Reserve:undo"))
        .local(Coupon, local_action::<B>(&world, "Coupon"))
        .undo_local(Coupon, local_action::<B>(&world, "Coupon:undo"))
        .call(Charge, receipt_call(&world, &broken))
        .undo_call(Charge, call_action(&world, "Charge:undo"))
        .call(Ship, call_action(&world, "Ship"));
    let legacy = Definition::<B::S, Order>::new(Legacy)
        .local(Prepare, local_action::<B>(&world, "Prepare"))
        .undo_local(Prepare, local_action::<B>(&world, "Prepare:undo"))
        .call(Post, receipt_call(&world, &broken))
        .undo_call(Post, call_action(&world, "Post:undo"))
        .local(Finish, local_action::<B>(&world, "Finish"));
    let cfg = config(Duration::from_secs(30));
    let f = Flows::new(b.store(Duration::from_secs(10)).await, cfg)
        .unwrap()
        .read_first(B::POLICY)
        .register(shop)
        .unwrap()
        .register(legacy)
        .unwrap();

    // Keyed: retried with its key until the cap, never compensated.
    let started = f.start(Shop, "charged", &order(50)).await.unwrap();
    assert!(
        matches!(&started.outcome, FlowOutcome::Waiting { step, error, .. }
            if step == "Charge" && error.contains("serialize")),
        "{started:?}"
    );
    for _ in 0..20 {
        if !f.list(Listing::Parked, None, 10).await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let round = f.recover(10).await.unwrap();
        assert_eq!((round.compensated, round.errors), (0, 0), "{round:?}");
    }
    let view = f.get("shop", "charged").await.unwrap().unwrap();
    assert_eq!(
        (view.flow.status.as_str(), view.flow.park_reason.as_deref()),
        ("RUNNING", Some("ATTEMPTS_EXHAUSTED"))
    );
    assert!(
        view.steps.iter().all(|s| s.phase == "F"),
        "nothing undone: {:?}",
        view.steps
    );
    let charge = view.steps.iter().find(|s| s.name == "Charge").unwrap();
    assert_eq!(charge.status, "RETRY");
    assert_eq!(
        charge.downstream_key.as_deref(),
        Some("shop:charged:Charge")
    );
    let calls = world.calls();
    assert_eq!(
        calls["shop:charged:Charge"], cfg.attempts as usize,
        "one call per claim, all with the one key: {calls:?}"
    );
    assert_eq!(calls.len(), 2, "no undo called: {calls:?}");
    assert_eq!(effects(b, "charged", "Insert:undo").await, 0);
    assert_eq!(effects(b, "charged", "Coupon:undo").await, 0);
    broken.store(false, Ordering::SeqCst);
    let resumed = f.resume("shop", "charged", Resume::Retry).await.unwrap();
    let FlowOutcome::Completed(outputs) = resumed else {
        panic!("{resumed:?}");
    };
    assert_eq!(
        outputs.get::<String>(Charge).unwrap(),
        "shop:charged:Charge"
    );
    assert_eq!(
        world.calls()["shop:charged:Charge"],
        cfg.attempts as usize + 1
    );

    // Unsafe: called once, parked for a person, never compensated.
    broken.store(true, Ordering::SeqCst);
    let started = f.start(Legacy, "posted", &order(51)).await.unwrap();
    assert_eq!(
        started.outcome,
        FlowOutcome::Parked {
            reason: ParkReason::NeedsReconciliation,
            step: "Post".into()
        }
    );
    assert_eq!(world.calls()["legacy:posted:Post"], 1);
    assert_eq!(effects(b, "posted", "Prepare:undo").await, 0);
    let rows = step_rows(&f, "legacy", "posted").await;
    assert!(
        rows.contains(&("Post".into(), "F".into(), "STARTED".into(), 1)),
        "{rows:?}"
    );
    let resumed = f
        .resume(
            "legacy",
            "posted",
            Resume::Applied(serde_json::json!("posted")),
        )
        .await
        .unwrap();
    assert!(matches!(resumed, FlowOutcome::Completed(_)), "{resumed:?}");
    assert_eq!(world.calls()["legacy:posted:Post"], 1);
    assert_eq!(effects(b, "posted", "Finish").await, 1);
    assert_eq!(effects(b, "posted", "Prepare:undo").await, 0);
}

/// A downstream call (made with the context's key) that answers with `body` as its
/// error: refused for flow `refused`, timed out at the first attempt for `timed-out`.
fn long_error_call(
    world: &Arc<World>,
    body: &Arc<String>,
) -> impl for<'c> Fn(&'c Ctx<Order>) -> orderly::idempotency::Work<'c, Result<String, StepError>>
+ Send
+ Sync
+ 'static {
    let (world, body) = (world.clone(), body.clone());
    move |ctx| {
        let (world, body) = (world.clone(), body.clone());
        Box::pin(async move {
            world.call(ctx.key());
            match (ctx.flow_key(), ctx.attempt()) {
                ("refused", _) => Err(StepError::fail(&*body)),
                ("timed-out", 1) => Err(StepError::retry(&*body)),
                _ => Ok(ctx.key().to_string()),
            }
        })
    }
}

/// A step refusing with a 100 KiB error (a gateway's long error body) is recorded on
/// every backend (MariaDB's `TEXT` holds 64 KiB): the error is stored cut to
/// [`MAX_ERROR_BYTES`] on a character boundary, with a marker saying how long it was, so
/// the refusal lands at once: the refused call is made once and the flow is compensated
/// as for any refusal. The answer, its replay, the step row and the flow record carry the
/// same cut text; a long error asking for a retry waits as any retry does.
pub async fn flow_long_step_error_is_stored_cut_with_a_marker<B: Backend>(b: &B) {
    use ShopStep::*;
    let world = Arc::new(World::default());
    // Three-byte characters: the cut falls inside one unless it keeps to their boundaries.
    let body = Arc::new("€".repeat(100 * 1024 / 3 + 1));
    let marker = format!("… [truncated, {} bytes]", body.len());
    b.exec("CREATE TABLE flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)")
        .await;
    let shop = Definition::<B::S, Order>::new(Shop)
        .local(Insert, local_action::<B>(&world, "Insert"))
        .undo_local(Insert, local_action::<B>(&world, "Insert:undo"))
        .call(Reserve, call_action(&world, "Reserve"))
        .undo_call(Reserve, call_action(&world, "Reserve:undo"))
        .local(Coupon, local_action::<B>(&world, "Coupon"))
        .undo_local(Coupon, local_action::<B>(&world, "Coupon:undo"))
        .call(Charge, long_error_call(&world, &body))
        .undo_call(Charge, call_action(&world, "Charge:undo"))
        .call(Ship, call_action(&world, "Ship"));
    let f = Flows::new(
        b.store(Duration::from_secs(10)).await,
        config(Duration::from_secs(30)),
    )
    .unwrap()
    .read_first(B::POLICY)
    .register(shop)
    .unwrap();
    let cut = |error: &str| {
        error.len() <= MAX_ERROR_BYTES
            && error.len() + 3 > MAX_ERROR_BYTES
            && error
                .strip_suffix(&marker)
                .is_some_and(|kept| !kept.is_empty() && body.starts_with(kept))
    };

    let started = f.start(Shop, "refused", &order(60)).await.unwrap();
    let FlowOutcome::Compensated { step, error } = &started.outcome else {
        panic!("expected compensation, got a {:?}", started.outcome);
    };
    assert_eq!(step, "Charge");
    assert!(cut(error), "not cut with its marker: {} bytes", error.len());
    let calls = world.calls();
    assert_eq!(calls["shop:refused:Charge"], 1, "{calls:?}");
    assert_eq!(calls["shop:refused:Reserve:undo"], 1, "{calls:?}");
    assert_eq!(effects(b, "refused", "Insert:undo").await, 1);
    let view = f.get("shop", "refused").await.unwrap().unwrap();
    assert_eq!(view.flow.status, "COMPENSATED");
    assert_eq!(view.flow.last_error.as_ref(), Some(error));
    let row = view.steps.iter().find(|s| s.name == "Charge").unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_ref()),
        ("FAILED", Some(error))
    );
    let again = f.start(Shop, "refused", &order(60)).await.unwrap();
    assert_eq!((&again.outcome, again.replayed), (&started.outcome, true));
    assert_eq!(world.calls()["shop:refused:Charge"], 1);

    let started = f.start(Shop, "timed-out", &order(61)).await.unwrap();
    let FlowOutcome::Waiting { step, error, .. } = &started.outcome else {
        panic!("expected a wait, got a {:?}", started.outcome);
    };
    assert_eq!(step, "Charge");
    assert!(cut(error), "not cut with its marker: {} bytes", error.len());
    let view = f.get("shop", "timed-out").await.unwrap().unwrap();
    assert_eq!(view.flow.last_error.as_ref(), Some(error));
    let row = view.steps.iter().find(|s| s.name == "Charge").unwrap();
    assert_eq!(
        (row.status.as_str(), row.error.as_ref()),
        ("RETRY", Some(error))
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    let round = f.recover(10).await.unwrap();
    assert_eq!((round.taken, round.completed), (1, 1), "{round:?}");
    assert_eq!(world.calls()["shop:timed-out:Charge"], 2);
}

orderly::flow! {
    /// A flow whose first step has the name, position and class of `Shop`'s first: a step
    /// of one is still not a step of the other.
    pub Returns {
        kind: "returns";
        version: 1;
        steps: ReturnsStep {
            Insert: local + undo,
            Refund: local,
        }
    }
}

/// Registration refuses a step of another flow even when it has the name, the position
/// and the class of one of this flow's steps (for an action and for a compensation),
/// naming the problem; the same actions on the flow's own steps register.
pub async fn flow_step_of_another_flow_is_refused<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let store = b.store(Duration::from_secs(10)).await;
    let returns = || {
        Definition::<B::S, Order>::new(Returns)
            .local(ReturnsStep::Refund, local_action::<B>(&world, "Refund"))
    };
    let foreign_action = returns()
        .local(ShopStep::Insert, local_action::<B>(&world, "Insert"))
        .undo_local(
            ReturnsStep::Insert,
            local_action::<B>(&world, "Insert:undo"),
        );
    let foreign_undo = returns()
        .local(ReturnsStep::Insert, local_action::<B>(&world, "Insert"))
        .undo_local(ShopStep::Insert, local_action::<B>(&world, "Insert:undo"));
    for (what, def) in [("action", foreign_action), ("compensation", foreign_undo)] {
        let refused = Flows::new(store.clone(), FlowConfig::default())
            .unwrap()
            .register(def);
        assert!(
            matches!(&refused, Err(Error::InvalidInput(m))
                if m.contains("step Insert") && m.contains("another flow") && m.contains("ShopStep")),
            "{what}: {:?}",
            refused.map(drop)
        );
    }
    let own = returns()
        .local(ReturnsStep::Insert, local_action::<B>(&world, "Insert"))
        .undo_local(
            ReturnsStep::Insert,
            local_action::<B>(&world, "Insert:undo"),
        );
    Flows::new(store, FlowConfig::default())
        .unwrap()
        .register(own)
        .unwrap();
    assert_eq!(b.scalar("SELECT COUNT(*) FROM flows").await, 0);
}

/// A flow record whose park reason orderly never writes (edited behind its back) gets
/// one answer from a start and from every resume: `CorruptRecord` naming the value.
/// Nothing runs, and the record and its steps stay as they were.
pub async fn flow_unknown_park_reason_is_corrupt_to_start_and_resume<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Ship", Plan::Fail);
    let started = f.start(Shop, "edited", &order(70)).await.unwrap();
    assert!(matches!(started.outcome, FlowOutcome::Parked { .. }));
    world.clear_plans();
    b.exec(
        "UPDATE flows SET park_reason = 'GONE_FISHING' WHERE kind = 'shop' AND flow_key = 'edited'",
    )
    .await;
    let seen = || async {
        let mut view = f.get("shop", "edited").await.unwrap().unwrap();
        view.flow.lease_left_ms = 0;
        view
    };
    let before = seen().await;
    let calls = world.calls();
    let corrupt =
        |e: &Error| matches!(e, Error::CorruptRecord { value, .. } if value == "GONE_FISHING");
    let start = f.start(Shop, "edited", &order(70)).await;
    assert!(start.as_ref().is_err_and(corrupt), "start: {start:?}");
    for how in [
        Resume::Retry,
        Resume::Compensate,
        Resume::Applied(serde_json::json!("shipped by hand")),
    ] {
        let resumed = f.resume("shop", "edited", how.clone()).await;
        assert!(resumed.as_ref().is_err_and(corrupt), "{how:?}: {resumed:?}");
    }
    assert_eq!(seen().await, before);
    assert_eq!(world.calls(), calls, "nothing called");
    assert_eq!(effects(b, "edited", "Insert:undo").await, 0);
    assert_eq!(f.recover(10).await.unwrap().taken, 0);
}

/// A flow whose claim counter was edited to `i32::MAX` behind the library's back: the
/// recovery job's claim stays within the column (the counter is bounded in the
/// statement), so a claim that committed is never answered with an error, and the flow
/// parks `ATTEMPTS_EXHAUSTED` for a person, its step not called again.
pub async fn flow_attempt_counter_at_its_limit_parks<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    world.plan("Reserve", Plan::RetryForever);
    f.start(Shop, "worn", &order(12)).await.unwrap();
    world.clear_plans();
    b.exec(&format!(
        "UPDATE flows SET attempt = {}, lease_until = 0 WHERE kind = 'shop' AND flow_key = 'worn'",
        i32::MAX
    ))
    .await;
    let calls = world.calls();
    let round = f.recover(10).await.unwrap();
    assert_eq!(round.taken, 1, "{round:?}");
    let parked = f.list(Listing::Parked, None, 10).await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(
        parked[0].flow.park_reason.as_deref(),
        Some("ATTEMPTS_EXHAUSTED")
    );
    assert_eq!(world.calls(), calls, "the step was called again");
}

/// Concurrent starts go together in one statement while another is in flight (on a
/// store that batches starts), and each is answered as if it had gone alone: every new
/// flow runs once to completion under its own start, and of four twins of one new flow
/// one runs it and the others are told it is in flight or replayed. Rounds run until
/// batches were seen (bounded); a store that does not batch starts shows none.
pub async fn flow_coalesced_starts_each_run_once<B: Backend>(b: &B) {
    use orderly::flow::FlowStore;
    let world = Arc::new(World::default());
    let f = flows(b, &world, Duration::from_secs(30)).await;
    let mut round = 0;
    loop {
        round += 1;
        let mut keys: Vec<String> = (0..16).map(|i| format!("c{round}-{i}")).collect();
        keys.extend((0..4).map(|_| format!("c{round}-twin")));
        let barrier = Arc::new(tokio::sync::Barrier::new(keys.len()));
        let tasks: Vec<_> = keys
            .iter()
            .cloned()
            .map(|key| {
                let (f, barrier) = (f.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let answer = f.start(Shop, &key, &order(7)).await;
                    (key, answer)
                })
            })
            .collect();
        let mut twins_ran = 0;
        for task in tasks {
            let (key, answer) = task.await.unwrap();
            match answer {
                Ok(s) if !s.replayed => {
                    assert!(
                        matches!(s.outcome, FlowOutcome::Completed(_)),
                        "{key}: {:?}",
                        s.outcome
                    );
                    if key.ends_with("twin") {
                        twins_ran += 1;
                    }
                }
                Ok(s) if key.ends_with("twin") => {
                    assert!(matches!(s.outcome, FlowOutcome::Completed(_)))
                }
                Err(Error::InFlight { .. }) if key.ends_with("twin") => {}
                other => panic!("{key}: {other:?}"),
            }
        }
        assert_eq!(twins_ran, 1, "twins of one flow: exactly one runs it");
        for key in keys.iter().take(16).chain([&format!("c{round}-twin")]) {
            assert_eq!(effects(b, key, "Insert").await, 1, "{key}");
            assert_eq!(effects(b, key, "Coupon").await, 1, "{key}");
        }
        let seen = f.coalesced_starts();
        if !B::S::BATCHES_STARTS {
            assert_eq!(
                seen.batches, 0,
                "a store that does not batch starts batched"
            );
            break;
        }
        if seen.batches > 0 {
            assert!(seen.claims >= 2 * seen.batches);
            break;
        }
        assert!(
            round < 20,
            "no starts were ever coalesced: the test shows nothing"
        );
    }
}
