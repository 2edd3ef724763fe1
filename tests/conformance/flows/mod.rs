//! Flows: the declared steps run once, compensations in reverse, the recovery job, the
//! operator's resume, crashes at every point. One body per behaviour, on every backend;
//! this file holds what they share (the flows, the world they act on, the helpers), and
//! the bodies are in the files beside it, by concern.
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

mod cuts;
mod definitions;
mod parking;
mod recovery;
mod runs;
mod waits;

// The bodies, for `conformance!` (through the suite's own re-export); a binary that runs
// only some of them leaves the rest unused.
#[allow(unused_imports)]
pub use self::{cuts::*, definitions::*, parking::*, recovery::*, runs::*, waits::*};

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
    FlowConfig::default()
        .lease(lease)
        .attempts(4)
        .backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(20))
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
