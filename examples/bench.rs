//! Throughput and latency of `transition` against the raw SQL floor and the naive pattern.
//!
//! ```sh
//! cargo run --release --all-features --example bench -- --backend postgres
//! ```
//!
//! Options (defaults in brackets): `--backend sqlite|postgres|mysql` [sqlite],
//! `--orders N` [100000], `--concurrency 1,8,32`, `--seconds S` per mode and
//! concurrency [5], `--rounds R` slices each mode's time is cut into [5],
//! `--history-rows N` history rows of other orders loaded first, so the history table
//! and its statistics look like a live one [10000],
//! `--explain` prints the plans of the statements the engine prepared: the apply-first
//! statement, the replay read and the batched read for 8 requests (PostgreSQL),
//! `--redis URL` also runs storms of 64 identical idempotency claims on the database
//! alone and behind the Redis front (feature `redis`; a `front …` line compares them),
//! `--deadline-ms MS` the client deadline of the deadline storm [10] (below),
//! `--compare-history N` also sets up `orderly_bench_b` with N history rows and runs the
//! engine mode on it too (row `engine-b`, interleaved with the others; a `scale …` line
//! compares the two p50s).
//! Servers: `ORDERLY_PG_URL`, `ORDERLY_MYSQL_URL` (as for the test suites); the bench
//! drops and recreates its own database `orderly_bench` at the start and leaves it for
//! inspection (`bench/pgbench-floor.sh` runs on it).
//!
//! Every mode moves orders `Created → Paid` through the same pool:
//! - floor: the cheapest correct write with no judging (PostgreSQL: one CTE statement
//!   doing the CAS update and the history insert; elsewhere BEGIN, UPDATE, INSERT, COMMIT);
//! - naive: BEGIN; SELECT … FOR UPDATE; UPDATE; INSERT; COMMIT (SQLite has no FOR UPDATE:
//!   BEGIN IMMEDIATE takes the lock);
//! - engine: `Engine::transition` on the Applied path;
//! - alone: the same through an engine with coalescing off (`coalesce_writes: false`);
//! - floor-batch: the floor's statements for `c` requests in one transaction on one
//!   connection, the hand-written floor of coalescing;
//! - driver-limit (SQLite only): the floor's statements in a plain loop on a connection
//!   of its own, one transaction per request, no pool, no engine;
//! - replay: `Engine::transition` repeating requests the engine pass applied;
//! - read: the cheapest conceivable replay, a bare `SELECT` of the history row by its
//!   unique key, as a reference for what one read round trip costs here.
//!
//! Columns: operations, throughput, p50/p99 latency, throughput against the floor, and
//! CPU per operation: `client us` is this process (driver, pool, engine; with SQLite
//! also the database itself), `other us` the rest of the machine's busy time (the
//! database server, and any background load).
//!
//! The idempotency layer has modes of its own, run after the others at each concurrency
//! on a reset database: `records` is `Records::run` with the transition inside (claim,
//! then one transaction with the transition and the record's completion), `rec-hand` the
//! same writes by hand (an insert of the record; BEGIN, UPDATE, INSERT, the fenced
//! UPDATE of the record, COMMIT), `replay-r` `Records::run` repeating requests `records`
//! completed.
//!
//! Flows have three more, run after those: `flow` is `Flows::start` of a flow of two
//! local steps (`Pay`, then `Ship`, each a transition inside the step's checkpoint
//! transaction), `flow-hand` the same writes by hand (an insert of the flow record;
//! then per step BEGIN, UPDATE, INSERT of the history row, INSERT of the step row, the
//! fenced UPDATE of the flow record, COMMIT), `replay-f` `Flows::start` repeating flows
//! `flow` completed.
//!
//! Last, a deadline storm: twice as many callers as the pool has connections, each
//! giving up on every transition after `--deadline-ms` (a client timeout), over new
//! orders; then every request told `Applied` must be recorded and every re-send answered
//! as the history says. Its `deadline backend=… in_time=…` line is the share of calls
//! answered in time.
//!
//! Transitions that emit an event have three more: `outbox` is `Engine::transition` of
//! a machine whose `Pay` edge emits (the outbox row in the transition's unit), `out-hand`
//! the same writes by hand, `replay-o` replays of what `outbox` applied.
//!
//! Last, the relay: `--relay-events N` [20000] events of N/4 entities drained by four
//! relays (`relay`) and by four hand-written `SKIP LOCKED` + publish + mark loops
//! (`relay-hand`), twice each, to the same sink: an in-process channel, or NATS
//! JetStream with `--nats URL` (feature `nats`; a memory stream of the bench's own). Its
//! line is `relay backend=… relay_vs_hand=…`.
//!
//! The last lines are one `ratio backend=… c=… engine_vs_floor=… engine_vs_naive=…
//! replay_vs_engine=…`, one `coalesce backend=… c=… engine_vs_alone=…
//! engine_vs_floor_batch=… engine_p99_ms=… alone_p99_ms=…` (and `engine_vs_driver=…` on
//! SQLite) and one `records backend=… c=… records_vs_hand=…
//! replay_vs_records=…` and one `flows backend=… c=… flow_vs_hand=… replay_vs_flow=…` and
//! one `outbox backend=… c=… outbox_vs_hand=… replay_vs_outbox=…` per
//! concurrency, and the `relay …` line, for scripts.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use orderly::flow::{Definition, FlowConfig, FlowOutcome, FlowStore, Flows};
use orderly::idempotency::RecordStore;
use orderly::outbox::{ChannelSink, EventRow, Message, OutboxStore, Relay, RelayConfig, Sink};
use orderly::store::Store;
use orderly::{Done, Engine, EngineConfig, Outcome, ReadFirst, Records, ScopeConfig};

orderly::state_machine! {
    /// The order graph.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Delivered, Cancelled, Refunded }
        events: OrderEvent { Pay, Ship, Deliver, Cancel, Refund }
        initial: Created;
        terminal: [Delivered, Cancelled, Refunded];
        transitions: {
            Created + Pay     => Paid,
            Created + Cancel  => Cancelled,
            Paid    + Ship    => Shipped,
            Paid    + Refund  => Refunded,
            Shipped + Deliver => Delivered,
        }
    }
}

orderly::state_machine! {
    /// The same graph, whose payment emits an event: an outbox row with the transition.
    pub EmitMachine {
        states: EmitState { Created, Paid, Shipped, Delivered, Cancelled, Refunded }
        events: EmitEvent { Pay, Ship, Deliver, Cancel, Refund }
        initial: Created;
        terminal: [Delivered, Cancelled, Refunded];
        transitions: {
            Created + Pay     => Paid     emits OrderPaid,
            Created + Cancel  => Cancelled,
            Paid    + Ship    => Shipped,
            Paid    + Refund  => Refunded,
            Shipped + Deliver => Delivered,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone)]
struct Args {
    backend: String,
    orders: i64,
    concurrency: Vec<usize>,
    seconds: f64,
    history_rows: i64,
    rounds: u32,
    explain: bool,
    compare_history: Option<i64>,
    redis: Option<String>,
    deadline_ms: u64,
    relay_events: i64,
    nats: Option<String>,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        backend: "sqlite".into(),
        orders: 100_000,
        concurrency: vec![1, 8, 32],
        seconds: 5.0,
        history_rows: 10_000,
        rounds: 5,
        explain: false,
        compare_history: None,
        redis: None,
        deadline_ms: 10,
        relay_events: 20_000,
        nats: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => args.backend = value()?,
            "--orders" => args.orders = value()?.parse()?,
            "--seconds" => args.seconds = value()?.parse()?,
            "--history-rows" => args.history_rows = value()?.parse()?,
            "--rounds" => args.rounds = value()?.parse()?,
            "--concurrency" => {
                args.concurrency = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            "--explain" => args.explain = true,
            "--compare-history" => args.compare_history = Some(value()?.parse()?),
            "--redis" => args.redis = Some(value()?),
            "--deadline-ms" => args.deadline_ms = value()?.parse()?,
            "--relay-events" => args.relay_events = value()?.parse()?,
            "--nats" => args.nats = Some(value()?),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if args.orders < 3 || args.rounds == 0 || args.concurrency.contains(&0) || args.seconds <= 0.0 {
        return Err("--orders, --concurrency and --seconds must be positive".into());
    }
    Ok(args)
}

/// What a backend provides to the bench: the raw patterns, and a reset between passes.
trait BenchDb: Send + Sync + 'static {
    type S: FlowStore + OutboxStore;
    /// Runs literal SQL on the bench database.
    fn exec(&self, sql: String) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// One round of the hand-written relay: in one transaction, up to `batch` pending
    /// events chosen with `SKIP LOCKED` (SQLite: under `BEGIN IMMEDIATE`), published
    /// through `sink` together, marked published; how many.
    fn relay_hand<K: Sink>(
        &self,
        batch: i64,
        sink: &K,
    ) -> impl Future<Output = Result<usize, BoxError>> + Send;
    fn engine(&self) -> Engine<OrderMachine, Self::S>;
    fn floor(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// The floor's statements for every one of `ids` in one transaction on one
    /// connection: the floor of coalescing `ids.len()` requests into one write unit.
    fn floor_batch(&self, ids: &[i64]) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// SQLite only (`None` elsewhere): the floor's statements for each of `ids`, one
    /// transaction each, in a plain loop on a connection of its own (no pool, no
    /// engine); each request's latency in microseconds.
    fn driver_limit(
        &self,
        ids: &[i64],
    ) -> impl Future<Output = Result<Option<Vec<u32>>, BoxError>> + Send {
        let _ = ids;
        async { Ok(None) }
    }
    fn naive(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Reads the history row of `(id, Pay, pay-id)`; it must exist.
    fn read(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// By hand, what `Records::run` does with a transition inside: the claim, then one
    /// transaction with the transition's writes and the record's completion.
    fn records_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// By hand, what a flow of two local steps writes: the flow record, then per step one
    /// transaction with the transition's writes, the step row and the fenced update of
    /// the flow record.
    fn flow_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// By hand, what a transition along an edge that emits writes: the floor's writes
    /// and the outbox row, in one unit (PostgreSQL: one statement).
    fn outbox_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Every bench order back to `Created`, version 0, its history, outbox rows and the
    /// idempotency records gone.
    fn reset(&self) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn explain(&self) -> impl Future<Output = Result<String, BoxError>> + Send;
    fn describe(&self) -> String;
}

const REF_PREFIX: &str = "pay-";

fn bench_ref(id: i64) -> String {
    format!("{REF_PREFIX}{id}")
}

fn ensure(cond: bool, what: &str, id: i64) -> Result<(), BoxError> {
    if cond {
        Ok(())
    } else {
        Err(format!("{what} did not apply to order {id}").into())
    }
}

/// A dialect's statements for the hand-written idempotent request.
struct HandSql {
    /// Inserts the record for `(key, payload hash, token)`, as PROCESSING.
    claim: &'static str,
    /// The transition: `(to, id, from, version)`.
    update: &'static str,
    /// Its history row: `(id, seq, from, to, event, ref)`.
    insert: &'static str,
    /// Completes the record: `(result, key, token)`, fenced by the token.
    complete: &'static str,
}

/// The hand-written idempotent request on `$pool`, its transaction begun by `$begin`.
macro_rules! records_hand {
    ($pool:expr, $begin:expr, $id:expr, $sql:expr) => {{
        use sha2::Digest;
        let (id, sql): (i64, &HandSql) = ($id, $sql);
        let key = format!("key-{id}");
        let token = uuid::Uuid::new_v4().simple().to_string();
        let hash = hex::encode(sha2::Sha256::digest(id.to_string()));
        let n = sqlx::query(sql.claim)
            .bind(&key)
            .bind(&hash)
            .bind(&token)
            .execute($pool)
            .await?
            .rows_affected();
        ensure(n == 1, "records by hand: claim", id)?;
        let mut tx = $begin.await?;
        let n = sqlx::query(sql.update)
            .bind("Paid")
            .bind(id)
            .bind("Created")
            .bind(0_i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        ensure(n == 1, "records by hand: update", id)?;
        sqlx::query(sql.insert)
            .bind(id)
            .bind(1_i64)
            .bind("Created")
            .bind("Paid")
            .bind("Pay")
            .bind(bench_ref(id))
            .execute(&mut *tx)
            .await?;
        let n = sqlx::query(sql.complete)
            .bind(id.to_string())
            .bind(&key)
            .bind(&token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        ensure(n == 1, "records by hand: complete", id)?;
        tx.commit().await?;
        Ok(())
    }};
}

/// A dialect's statements for the hand-written flow of two local steps.
struct FlowSql {
    /// Inserts the flow record: `(key, input hash, input, token)`.
    claim: &'static str,
    /// The transition: `(to, id, from, version)`.
    update: &'static str,
    /// Its history row: `(id, seq, from, to, event, ref)`.
    insert: &'static str,
    /// The step row: `(key, index, name, token, output)`.
    step: &'static str,
    /// The fenced update of the flow record: `(next step, status, output, key, token)`.
    touch: &'static str,
}

/// The hand-written flow on `$pool`, each step's transaction begun by `$begin`.
macro_rules! flow_hand {
    ($pool:expr, $begin:expr, $id:expr, $sql:expr) => {{
        use sha2::Digest;
        let (id, sql): (i64, &FlowSql) = ($id, $sql);
        let key = format!("flow-{id}");
        let token = uuid::Uuid::new_v4().simple().to_string();
        let input = id.to_string();
        let hash = hex::encode(sha2::Sha256::digest(&input));
        let n = sqlx::query(sql.claim)
            .bind(&key)
            .bind(&hash)
            .bind(&input)
            .bind(&token)
            .execute($pool)
            .await?
            .rows_affected();
        ensure(n == 1, "flow by hand: claim", id)?;
        let steps = [
            ("Pay", "Created", "Paid", "pay"),
            ("Ship", "Paid", "Shipped", "ship"),
        ];
        for (i, (name, from, to, event)) in steps.into_iter().enumerate() {
            let version = i as i64;
            let mut tx = $begin.await?;
            let n = sqlx::query(sql.update)
                .bind(to)
                .bind(id)
                .bind(from)
                .bind(version)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            ensure(n == 1, "flow by hand: update", id)?;
            sqlx::query(sql.insert)
                .bind(id)
                .bind(version + 1)
                .bind(from)
                .bind(to)
                .bind(if i == 0 { "Pay" } else { "Ship" })
                .bind(format!("{event}-{id}"))
                .execute(&mut *tx)
                .await?;
            let output = (version + 1).to_string();
            sqlx::query(sql.step)
                .bind(&key)
                .bind(i as i32)
                .bind(name)
                .bind(&token)
                .bind(&output)
                .execute(&mut *tx)
                .await?;
            let last = i == 1;
            let n = sqlx::query(sql.touch)
                .bind(i as i32 + 1)
                .bind(if last { "COMPLETED" } else { "RUNNING" })
                .bind(last.then(|| format!("{{\"Pay\":1,\"Ship\":{output}}}")))
                .bind(&key)
                .bind(&token)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            ensure(n == 1, "flow by hand: touch", id)?;
            tx.commit().await?;
        }
        Ok(())
    }};
}

orderly::flow! {
    /// The bench's flow: two local steps.
    pub PayShip {
        kind: "bench";
        version: 1;
        steps: PayShipStep {
            Pay:  local,
            Ship: local,
        }
    }
}

/// The flows of the bench: `PayShip`, each step a transition inside its checkpoint
/// transaction.
fn bench_flows<S: FlowStore>(engine: &Engine<OrderMachine, S>) -> Flows<S> {
    let (pay, ship) = (engine.clone(), engine.clone());
    let def = Definition::<S, i64>::new(PayShip)
        .local(PayShipStep::Pay, move |conn, ctx| {
            let e = pay.clone();
            Box::pin(async move {
                let id = *ctx.input();
                let out = e
                    .transition(id, OrderEvent::Pay, &bench_ref(id))
                    .within(conn)
                    .await?;
                Ok(out.version())
            })
        })
        .local(PayShipStep::Ship, move |conn, ctx| {
            let e = ship.clone();
            Box::pin(async move {
                let id = *ctx.input();
                let out = e
                    .transition(id, OrderEvent::Ship, &format!("ship-{id}"))
                    .within(conn)
                    .await?;
                Ok(out.version())
            })
        });
    Flows::new(engine.store().clone(), FlowConfig::default())
        .and_then(|f| f.register(def))
        .expect("a valid flow")
}

/// `Flows::start` of order `id`'s flow; whether it was replayed. A retryable error is
/// re-sent, as a client would.
async fn flow_run<S: FlowStore>(flows: &Flows<S>, id: i64) -> Result<bool, BoxError> {
    let mut tries = 0;
    let started = loop {
        match flows.start(PayShip, &format!("flow-{id}"), &id).await {
            Err(e) if e.is_retryable() && tries < 20 => tries += 1,
            other => break other?,
        }
    };
    let FlowOutcome::Completed(out) = &started.outcome else {
        return Err(format!("flow of order {id}: {:?}", started.outcome).into());
    };
    ensure(out.get::<i64>(PayShipStep::Ship)? == 2, "flow", id)?;
    Ok(started.replayed)
}

/// The scope of the engine's idempotent requests in the bench.
const SCOPE: &str = "bench";

fn bench_records<S: FlowStore>(store: S) -> Records<S> {
    Records::new(store)
        .scope(
            SCOPE,
            ScopeConfig {
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(24 * 3600),
            },
        )
        .expect("a valid scope")
}

/// `Records::run` with the transition of order `id` inside; whether it was replayed.
/// A retryable error (a deadlock between the locking reads of concurrent callers'
/// transactions on MariaDB) is re-sent, as a client would.
async fn records_run<S: FlowStore>(
    records: &Records<S>,
    engine: &Engine<OrderMachine, S>,
    id: i64,
) -> Result<bool, BoxError> {
    let mut tries = 0;
    let ran = loop {
        let e = engine.clone();
        let ran = records
            .run(SCOPE, &format!("key-{id}"), &id, move |tx| {
                Box::pin(async move {
                    let out = e
                        .transition(id, OrderEvent::Pay, &bench_ref(id))
                        .within(tx)
                        .await?;
                    Ok::<_, orderly::Error>(Done::<i64, ()>::Succeeded(out.version()))
                })
            })
            .await;
        match ran {
            Err(e) if e.is_retryable() && tries < 20 => tries += 1,
            other => break other?,
        }
    };
    ensure(ran.outcome == Ok(1), "records", id)?;
    Ok(ran.replayed)
}

/// `INSERT … VALUES` statements creating orders `1..=orders` at Created, 1000 per statement.
fn order_inserts(orders: i64) -> Vec<String> {
    (1..=orders)
        .collect::<Vec<_>>()
        .chunks(1000)
        .map(|chunk| {
            let values: Vec<String> = chunk
                .iter()
                .map(|id| format!("({id}, 'Created', 0)"))
                .collect();
            format!(
                "INSERT INTO orders (id, status, version) VALUES {}",
                values.join(",")
            )
        })
        .collect()
}

/// `INSERT … VALUES` statements creating `rows` history rows of other orders (negative
/// ids, four transitions each), 1000 per statement.
fn history_inserts(rows: i64) -> Vec<String> {
    (0..rows)
        .collect::<Vec<_>>()
        .chunks(1000)
        .map(|chunk| {
            let values: Vec<String> = chunk
                .iter()
                .map(|g| format!("({}, {}, 'Created', 'Paid', 'Pay', 'pre-{g}')", -1 - g / 4, g % 4 + 1))
                .collect();
            format!(
                "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES {}",
                values.join(",")
            )
        })
        .collect()
}

#[derive(Debug, Clone, Default)]
struct Stats {
    ops: u64,
    secs: f64,
    micros: Vec<u32>,
    /// CPU this process (the client: driver, pool, engine) spent, in microseconds.
    client_cpu: f64,
    /// CPU the whole machine spent (all cores, from `/proc/stat`), in microseconds:
    /// the client, the database server, and any background load.
    machine_cpu: f64,
}

/// CPU time of this process, in microseconds.
fn process_cpu_micros() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant of libc.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}

/// Busy CPU time of the whole machine (all cores, excluding idle and iowait), in
/// microseconds, from `/proc/stat`; 0 where that file is missing.
fn machine_cpu_micros() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    if ticks.len() < 5 {
        return 0.0;
    }
    let busy = ticks.iter().sum::<f64>() - ticks[3] - ticks[4];
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return 0.0;
    }
    busy * 1e6 / hz as f64
}

impl Stats {
    fn throughput(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    /// CPU microseconds per operation: (the client's, everything else's).
    fn cpu_per_op(&self) -> (f64, f64) {
        let ops = self.ops.max(1) as f64;
        let other = (self.machine_cpu - self.client_cpu).max(0.0);
        (self.client_cpu / ops, other / ops)
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return 0.0;
        }
        let i = ((self.micros.len() as f64 - 1.0) * p).round() as usize;
        self.micros[i] as f64 / 1000.0
    }
}

impl Stats {
    fn absorb(&mut self, slice: Stats) {
        self.ops += slice.ops;
        self.secs += slice.secs;
        self.client_cpu += slice.client_cpu;
        self.machine_cpu += slice.machine_cpu;
        self.micros.extend(slice.micros);
    }

    fn finish(mut self) -> Self {
        self.micros.sort_unstable();
        self
    }
}

/// One mode's ids: `first + n` for the n-th operation of the mode, across slices;
/// `cycle` wraps around (replays) instead of stopping at `span`.
struct Lane {
    first: i64,
    cursor: Arc<AtomicI64>,
    stats: Stats,
}

impl Lane {
    fn new(first: i64) -> Self {
        Lane {
            first,
            cursor: Arc::new(AtomicI64::new(0)),
            stats: Stats::default(),
        }
    }

    /// How many ids this lane has used (all of them completed).
    fn used(&self, span: i64) -> i64 {
        self.cursor.load(Ordering::Relaxed).min(span)
    }

    /// A slice of `Engine::transition` calls, every one of which must apply.
    async fn engine_slice<S: Store>(
        &mut self,
        engine: &Engine<OrderMachine, S>,
        c: usize,
        seconds: f64,
        span: i64,
    ) -> Result<(), BoxError> {
        let e = engine.clone();
        self.slice(c, seconds, span, false, move |id| {
            let e = e.clone();
            async move {
                let out = e.transition(id, OrderEvent::Pay, &bench_ref(id)).await?;
                ensure(matches!(out, Outcome::Applied { .. }), "engine", id)
            }
        })
        .await
    }

    /// One worker calls `op(ids)` with `k` ids at a time for `seconds`, or until `span`
    /// ids are used; each request's latency is its call's. `op` answers the latencies
    /// itself if it measured them per request (`Some`), else `None`.
    async fn batch_slice<F, Fut>(
        &mut self,
        k: usize,
        seconds: f64,
        span: i64,
        op: F,
    ) -> Result<(), BoxError>
    where
        F: Fn(Vec<i64>) -> Fut,
        Fut: Future<Output = Result<Option<Vec<u32>>, BoxError>>,
    {
        if span < 1 {
            return Ok(());
        }
        let deadline = Duration::from_secs_f64(seconds);
        let (client0, machine0) = (process_cpu_micros(), machine_cpu_micros());
        let start = Instant::now();
        let mut slice = Stats::default();
        while start.elapsed() < deadline {
            let n = self.cursor.load(Ordering::Relaxed);
            let take = (k as i64).min(span - n);
            if take < 1 {
                break;
            }
            self.cursor.store(n + take, Ordering::Relaxed);
            let ids: Vec<i64> = (n..n + take).map(|i| self.first + i).collect();
            let t = Instant::now();
            let micros = op(ids).await?;
            let took = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
            slice
                .micros
                .extend(micros.unwrap_or_else(|| vec![took; take as usize]));
        }
        slice.secs = start.elapsed().as_secs_f64();
        slice.ops = slice.micros.len() as u64;
        slice.client_cpu = process_cpu_micros() - client0;
        slice.machine_cpu = machine_cpu_micros() - machine0;
        self.stats.absorb(slice);
        Ok(())
    }

    /// `c` workers call `op(id)` for `seconds`, or until `span` ids are used (unless
    /// `cycle`). A failed operation aborts the bench.
    async fn slice<F, Fut>(
        &mut self,
        c: usize,
        seconds: f64,
        span: i64,
        cycle: bool,
        op: F,
    ) -> Result<(), BoxError>
    where
        F: Fn(i64) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send,
    {
        if span < 1 {
            return Ok(());
        }
        let deadline = Duration::from_secs_f64(seconds);
        let (client0, machine0) = (process_cpu_micros(), machine_cpu_micros());
        let start = Instant::now();
        let first = self.first;
        let workers: Vec<_> = (0..c)
            .map(|_| {
                let (next, op) = (self.cursor.clone(), op.clone());
                tokio::spawn(async move {
                    let mut micros = Vec::new();
                    while start.elapsed() < deadline {
                        // Never past `span` (unless cycling): the next slice goes on from
                        // where this one stopped, with no id skipped.
                        let Ok(n) = next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            (cycle || n < span).then_some(n + 1)
                        }) else {
                            break;
                        };
                        let id = first + n % span;
                        let t = Instant::now();
                        op(id).await?;
                        micros.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    Ok::<_, BoxError>(micros)
                })
            })
            .collect();
        let mut slice = Stats::default();
        for w in workers {
            slice.micros.extend(w.await??);
        }
        slice.secs = start.elapsed().as_secs_f64();
        slice.ops = slice.micros.len() as u64;
        slice.client_cpu = process_cpu_micros() - client0;
        slice.machine_cpu = machine_cpu_micros() - machine0;
        self.stats.absorb(slice);
        Ok(())
    }
}

/// Runs every mode on `db`; with `big` (a second database whose history table holds
/// `--compare-history` rows), also the engine mode on it, interleaved, so that both
/// history sizes see the same background load.
async fn run<B: BenchDb>(db: B, big: Option<B>, args: &Args) -> Result<(), BoxError> {
    let db = Arc::new(db);
    let engine = db.engine();
    let records = bench_records(engine.store().clone());
    let flows = bench_flows(&engine);
    let emitting: Engine<EmitMachine, B::S> = Engine::new(engine.store().clone())?;
    let big_engine = big.as_ref().map(|b| b.engine());
    println!(
        "# orderly bench: backend={} orders={} seconds={} rounds={} history_rows={}",
        args.backend, args.orders, args.seconds, args.rounds, args.history_rows
    );
    println!("# {}", db.describe());
    if args.explain {
        println!(
            "# plans of the statements the engine prepared:\n{}",
            db.explain().await?
        );
    }
    println!(
        "{:>3}  {:<12} {:>9} {:>10} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "c", "mode", "ops", "ops/s", "p50 ms", "p99 ms", "vs floor", "client us", "other us"
    );
    let mut ratios = Vec::new();
    let mut scales = Vec::new();
    // Each write mode owns a sixth of the orders; the modes alternate in short slices,
    // round after round, so that all of them see the same background load.
    let share = args.orders / 6;
    let alone_engine = Engine::<OrderMachine, B::S>::with_config(
        engine.store().clone(),
        EngineConfig {
            coalesce_writes: false,
            ..EngineConfig::default()
        },
    )?;
    let slice = args.seconds / args.rounds as f64;
    for &c in &args.concurrency {
        db.reset().await?;
        if let Some(big) = &big {
            big.reset().await?;
        }
        let mut big_lane = Lane::new(1 + 2 * share);
        let (mut floor, mut naive, mut applied) =
            (Lane::new(1), Lane::new(1 + share), Lane::new(1 + 2 * share));
        let (mut replay, mut read) = (Lane::new(1 + 2 * share), Lane::new(1 + 2 * share));
        let (mut alone, mut floor_batch, mut driver) = (
            Lane::new(1 + 3 * share),
            Lane::new(1 + 4 * share),
            Lane::new(1 + 5 * share),
        );
        for round in 1..=i64::from(args.rounds) {
            // Each round may use its share of a write mode's orders, so that a fast mode
            // does not run out early and miss the later rounds' background load.
            let quota = share * round / i64::from(args.rounds);
            let d = db.clone();
            floor
                .slice(c, slice, quota, false, move |id| {
                    let d = d.clone();
                    async move { d.floor(id).await }
                })
                .await?;
            let d = db.clone();
            naive
                .slice(c, slice, quota, false, move |id| {
                    let d = d.clone();
                    async move { d.naive(id).await }
                })
                .await?;
            applied.engine_slice(&engine, c, slice, quota).await?;
            alone.engine_slice(&alone_engine, c, slice, quota).await?;
            let d = db.clone();
            floor_batch
                .batch_slice(c, slice, quota, move |ids| {
                    let d = d.clone();
                    async move { d.floor_batch(&ids).await.map(|()| None) }
                })
                .await?;
            let d = db.clone();
            driver
                .batch_slice(256, slice, quota, move |ids| {
                    let d = d.clone();
                    // Elsewhere than on SQLite: no requests, no row.
                    async move { Ok(Some(d.driver_limit(&ids).await?.unwrap_or_default())) }
                })
                .await?;
            if let Some(e) = &big_engine {
                big_lane.engine_slice(e, c, slice, quota).await?;
            }
            // Replays of requests the engine lane applied, cycling over them.
            let done = applied.used(quota);
            let e = engine.clone();
            replay
                .slice(c, slice, done, true, move |id| {
                    let e = e.clone();
                    async move {
                        let out = e.transition(id, OrderEvent::Pay, &bench_ref(id)).await?;
                        ensure(matches!(out, Outcome::Replayed { .. }), "replay", id)
                    }
                })
                .await?;
            let d = db.clone();
            read.slice(c, slice, done, true, move |id| {
                let d = d.clone();
                async move { d.read(id).await }
            })
            .await?;
        }
        let [
            floor,
            naive,
            applied,
            replay,
            read,
            big_applied,
            alone,
            floor_batch,
            driver,
        ] = [
            floor,
            naive,
            applied,
            replay,
            read,
            big_lane,
            alone,
            floor_batch,
            driver,
        ]
        .map(|lane| lane.stats.finish());
        let f = floor.throughput();
        let mut rows = vec![
            ("floor", &floor),
            ("naive", &naive),
            ("engine", &applied),
            ("alone", &alone),
            ("floor-batch", &floor_batch),
            ("replay", &replay),
            ("read", &read),
        ];
        if driver.ops > 0 {
            rows.push(("driver-limit", &driver));
        }
        if let Some(rows_b) = args.compare_history {
            rows.push(("engine-b", &big_applied));
            scales.push(format!(
                "scale backend={} c={c} history_a={} history_b={rows_b} engine_p50_a={:.3} engine_p50_b={:.3} b_vs_a={:.2}",
                args.backend,
                args.history_rows,
                applied.percentile(0.5),
                big_applied.percentile(0.5),
                big_applied.percentile(0.5) / applied.percentile(0.5)
            ));
        }
        for (mode, s) in rows {
            let (client, other) = s.cpu_per_op();
            println!(
                "{c:>3}  {mode:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
                s.ops,
                s.throughput(),
                s.percentile(0.5),
                s.percentile(0.99),
                s.throughput() / f
            );
        }
        ratios.push(format!(
            "ratio backend={} c={c} engine_vs_floor={:.2} engine_vs_naive={:.2} replay_vs_engine={:.2}",
            args.backend,
            applied.throughput() / f,
            applied.throughput() / naive.throughput(),
            replay.throughput() / applied.throughput()
        ));
        ratios.push(format!(
            "coalesce backend={} c={c} engine_vs_alone={:.2} engine_vs_floor_batch={:.2} engine_p99_ms={:.2} alone_p99_ms={:.2}{}",
            args.backend,
            applied.throughput() / alone.throughput(),
            applied.throughput() / floor_batch.throughput(),
            applied.percentile(0.99),
            alone.percentile(0.99),
            if driver.ops > 0 {
                format!(" engine_vs_driver={:.2}", applied.throughput() / driver.throughput())
            } else {
                String::new()
            }
        ));
        ratios.push(records_pass(&db, &engine, &records, c, args).await?);
        ratios.push(flows_pass(&db, &flows, c, args).await?);
        ratios.push(outbox_pass(&db, &emitting, c, args).await?);
    }
    if let Some(url) = &args.redis {
        storm_pass(&records, url, args, &mut ratios).await?;
    }
    ratios.push(deadline_pass(&db, &engine, args).await?);
    ratios.push(match &args.nats {
        Some(url) => relay_nats(&db, url, args).await?,
        None => {
            let (sink, mut rx) = ChannelSink::new();
            tokio::spawn(async move { while rx.recv().await.is_some() {} });
            relay_pass(&db, sink, "channel", args).await?
        }
    });
    for line in scales.into_iter().chain(ratios) {
        println!("{line}");
    }
    Ok(())
}

/// The relay to JetStream at `url` (feature `nats`).
async fn relay_nats<B: BenchDb>(db: &Arc<B>, url: &str, args: &Args) -> Result<String, BoxError> {
    #[cfg(feature = "nats")]
    {
        use async_nats::jetstream::{self, stream};
        let prefix = "orderly_bench";
        let js = jetstream::new(async_nats::connect(url).await?);
        let _ = js.delete_stream(prefix).await;
        js.create_stream(stream::Config {
            name: prefix.into(),
            subjects: vec![format!("{prefix}.>")],
            storage: stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
        let sink = orderly::outbox::NatsSink::connect(url, prefix).await?;
        let line = relay_pass(db, sink, "jetstream", args).await;
        js.delete_stream(prefix).await?;
        line
    }
    #[cfg(not(feature = "nats"))]
    {
        let _ = (db, url, args);
        Err("--nats needs the bench built with --features nats".into())
    }
}

/// The relay's throughput: `--relay-events` events of a quarter as many entities (four
/// each, so one entity's events go out one after another), drained by four relays
/// (`relay`: `Relay::relay_once` in a loop, batches of 128) and by four hand-written
/// loops (`relay-hand`: `SKIP LOCKED` + publish + mark in one transaction, no per-entity
/// order), each twice, alternating, to the same sink. Returns the `relay …` line.
async fn relay_pass<B: BenchDb, K: Sink + Clone>(
    db: &Arc<B>,
    sink: K,
    sink_name: &str,
    args: &Args,
) -> Result<String, BoxError> {
    let events = args.relay_events.max(4);
    let entities = (events / 4).max(1);
    let seed = || async {
        db.exec("DELETE FROM outbox".into()).await?;
        let mut rows = Vec::new();
        for i in 0..events {
            let (entity, version) = (i % entities + 1, i / entities + 1);
            rows.push(format!(
                "('EmitMachine', {entity}, {version}, 'OrderPaid', 'Pay', 'Created', 'Paid', 'pay-{entity}-{version}')"
            ));
        }
        for chunk in rows.chunks(1000) {
            db.exec(format!(
                "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) VALUES {}",
                chunk.join(", ")
            ))
            .await?;
        }
        Ok::<(), BoxError>(())
    };
    let (mut relay_time, mut hand_time) = (Duration::ZERO, Duration::ZERO);
    let config = RelayConfig {
        batch: 128,
        ..RelayConfig::default()
    };
    for _ in 0..2 {
        seed().await?;
        let start = Instant::now();
        let done = Arc::new(AtomicI64::new(0));
        let loops: Vec<_> = (0..4)
            .map(|_| {
                let relay = Relay::new(db.engine().store().clone(), sink.clone())
                    .with_config(config.clone());
                let done = done.clone();
                tokio::spawn(async move {
                    let relay = relay?;
                    while done.load(Ordering::SeqCst) < events {
                        let round = match relay.relay_once().await {
                            Ok(round) => round,
                            // A deadlock between claims (MariaDB): the round is run again.
                            Err(e) if e.is_retryable() => continue,
                            Err(e) => return Err(e.into()),
                        };
                        if round.dead + round.retried > 0 {
                            return Err::<(), BoxError>(format!("relay round {round:?}").into());
                        }
                        done.fetch_add(round.published as i64, Ordering::SeqCst);
                    }
                    Ok(())
                })
            })
            .collect();
        for l in loops {
            l.await??;
        }
        relay_time += start.elapsed();

        seed().await?;
        let start = Instant::now();
        let done = Arc::new(AtomicI64::new(0));
        let loops: Vec<_> = (0..4)
            .map(|_| {
                let (db, sink, done) = (db.clone(), sink.clone(), done.clone());
                tokio::spawn(async move {
                    while done.load(Ordering::SeqCst) < events {
                        match db.relay_hand(128, &sink).await {
                            Ok(n) => done.fetch_add(n as i64, Ordering::SeqCst),
                            // A deadlock between the loops (MariaDB): run the round again.
                            Err(e) if is_deadlock(&e) => 0,
                            Err(e) => return Err(e),
                        };
                    }
                    Ok::<(), BoxError>(())
                })
            })
            .collect();
        for l in loops {
            l.await??;
        }
        hand_time += start.elapsed();
    }
    db.exec("DELETE FROM outbox".into()).await?;
    let rate = |t: Duration| 2.0 * events as f64 / t.as_secs_f64();
    println!(
        "{:<10} {:>8} events {:>10.0}/s   (4 relays, batches of 128, {entities} entities, sink: {sink_name})",
        "relay",
        2 * events,
        rate(relay_time)
    );
    println!(
        "{:<10} {:>8} events {:>10.0}/s   (4 hand-written SKIP LOCKED + publish + mark loops)",
        "relay-hand",
        2 * events,
        rate(hand_time)
    );
    Ok(format!(
        "relay backend={} relay_vs_hand={:.2}",
        args.backend,
        rate(relay_time) / rate(hand_time)
    ))
}

/// Whether `e` is a deadlock or serialization failure (SQLSTATE 40001, 40P01).
fn is_deadlock(e: &BoxError) -> bool {
    matches!(
        e.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if matches!(db.code().as_deref(), Some("40001" | "40P01"))
    )
}

/// Publishes `rows` through `sink` together.
async fn publish_all<K: Sink>(sink: &K, rows: &[EventRow]) -> Result<(), BoxError> {
    let sent = futures_util::future::join_all(
        rows.iter()
            .map(|row| async move { sink.publish(&Message::from_row(row)).await }),
    )
    .await;
    for outcome in sent {
        outcome?;
    }
    Ok(())
}

/// Client timeouts: twice as many callers as the pool has connections, every
/// transition awaited under a deadline of `--deadline-ms` (a client that gives up), over
/// new orders, for `--seconds`. A call the caller stops waiting for is finished off its
/// task, so its connection goes back to the pool warm. Then every request told
/// `Applied` must be recorded (a connection handed on inside a transaction nobody began
/// would lose it), and every request re-sent is answered as the history says. Returns
/// the `deadline …` line: the share of calls answered in time.
async fn deadline_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<OrderMachine, B::S>,
    args: &Args,
) -> Result<String, BoxError> {
    db.reset().await?;
    let pool = *args.concurrency.iter().max().unwrap_or(&1);
    let callers = 2 * pool;
    let limit = Duration::from_millis(args.deadline_ms);
    let run_for = Duration::from_secs_f64(args.seconds);
    let next = Arc::new(AtomicI64::new(1));
    let start = Instant::now();
    let workers: Vec<_> = (0..callers)
        .map(|_| {
            let (e, next, orders) = (engine.clone(), next.clone(), args.orders);
            tokio::spawn(async move {
                // (order, told Applied in time)
                let mut calls = Vec::new();
                while start.elapsed() < run_for {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id > orders {
                        break;
                    }
                    let r = bench_ref(id);
                    let call = e.transition(id, OrderEvent::Pay, &r).into_future();
                    let applied = match tokio::time::timeout(limit, call).await {
                        Ok(Ok(out)) => Some(out.is_applied()),
                        Ok(Err(e)) if e.is_retryable() => Some(false),
                        Ok(Err(e)) => return Err(BoxError::from(format!("order {id}: {e}"))),
                        Err(_) => None,
                    };
                    calls.push((id, applied));
                }
                Ok(calls)
            })
        })
        .collect();
    let mut calls = Vec::new();
    for w in workers {
        calls.extend(w.await??);
    }
    let in_time = calls.iter().filter(|(_, a)| a.is_some()).count();
    let applied = calls.iter().filter(|(_, a)| *a == Some(true)).count();
    // The calls given up on finish off their callers' tasks; then the history decides.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (id, told) in &calls {
        let again = engine
            .transition(*id, OrderEvent::Pay, &bench_ref(*id))
            .await?;
        if *told == Some(true) {
            ensure(
                matches!(again, Outcome::Replayed { .. }),
                "an acknowledged write lost",
                *id,
            )?;
        }
        ensure(
            engine.get(*id).await?.version == 1,
            "a request applied twice",
            *id,
        )?;
    }
    let share = |n: usize| n as f64 / calls.len().max(1) as f64;
    println!(
        "#    deadline storm: {callers} callers, pool {pool}, {} ms deadlines: {} calls, {} answered in time ({:.1} %), {} of them Applied",
        args.deadline_ms,
        calls.len(),
        in_time,
        100.0 * share(in_time),
        applied
    );
    Ok(format!(
        "deadline backend={} callers={callers} pool={pool} deadline_ms={} calls={} in_time={:.3} applied_in_time={:.3}",
        args.backend,
        args.deadline_ms,
        calls.len(),
        share(in_time),
        share(applied)
    ))
}

/// A layer's pass at `c` callers, on a reset database: its write mode (`names[0]`, run
/// by `write`), the same writes by hand (`names[1]`, by `hand`) and replays of the
/// requests the write mode completed (`names[2]`, by `replay`), alternating in slices
/// (half the orders each for the two write modes). Prints a row per mode, the `vs
/// floor` column against the hand mode, and returns the ratio line `{label} backend=…
/// c=… {ratios[0]}=write/hand {ratios[1]}=replay/write`.
#[allow(clippy::too_many_arguments)]
async fn layer_pass<B, W, WF, H, HF, R, RF>(
    db: &Arc<B>,
    c: usize,
    args: &Args,
    label: &str,
    names: [&str; 3],
    ratios: [&str; 2],
    (write, hand, replay): (W, H, R),
) -> Result<String, BoxError>
where
    B: BenchDb,
    W: Fn(i64) -> WF + Clone + Send + Sync + 'static,
    WF: Future<Output = Result<(), BoxError>> + Send,
    H: Fn(i64) -> HF + Clone + Send + Sync + 'static,
    HF: Future<Output = Result<(), BoxError>> + Send,
    R: Fn(i64) -> RF + Clone + Send + Sync + 'static,
    RF: Future<Output = Result<(), BoxError>> + Send,
{
    db.reset().await?;
    let half = args.orders / 2;
    let slice = args.seconds / args.rounds as f64;
    let (mut run, mut by_hand, mut again) = (Lane::new(1), Lane::new(1 + half), Lane::new(1));
    for round in 1..=i64::from(args.rounds) {
        let quota = half * round / i64::from(args.rounds);
        run.slice(c, slice, quota, false, write.clone()).await?;
        by_hand.slice(c, slice, quota, false, hand.clone()).await?;
        let done = run.used(quota);
        again.slice(c, slice, done, true, replay.clone()).await?;
    }
    let [run, by_hand, again] = [run, by_hand, again].map(|lane| lane.stats.finish());
    println!(
        "{c:>3}  ({label}: the `vs floor` column is against {})",
        names[1]
    );
    for (mode, s) in names.iter().zip([&run, &by_hand, &again]) {
        let (client, other) = s.cpu_per_op();
        println!(
            "{c:>3}  {mode:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
            s.ops,
            s.throughput(),
            s.percentile(0.5),
            s.percentile(0.99),
            s.throughput() / by_hand.throughput()
        );
    }
    Ok(format!(
        "{label} backend={} c={c} {}={:.2} {}={:.2}",
        args.backend,
        ratios[0],
        run.throughput() / by_hand.throughput(),
        ratios[1],
        again.throughput() / run.throughput()
    ))
}

/// The idempotency layer at `c` callers: `Records::run` with a transition inside
/// (`records`), the same writes by hand (`rec-hand`), and replays of the requests the
/// first applied (`replay-r`).
async fn records_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<OrderMachine, B::S>,
    records: &Records<B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    // Each lane its own adaptive window (`read_first`), as a service whose traffic is
    // all new requests, or all repeats, would have: each lane measures its own path.
    let run = |replayed: bool| {
        let (r, e) = (
            records.clone().read_first(ReadFirst::Adaptive),
            engine.clone(),
        );
        move |id| {
            let (r, e) = (r.clone(), e.clone());
            async move { ensure(records_run(&r, &e, id).await? == replayed, "records", id) }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.records_hand(id).await }
    };
    let names = ["records", "rec-hand", "replay-r"];
    let ratios = ["records_vs_hand", "replay_vs_records"];
    layer_pass(
        db,
        c,
        args,
        "records",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await
}

/// Flows at `c` callers: `Flows::start` of a flow of two local steps (`flow`), the same
/// writes by hand (`flow-hand`), and replays of the flows the first completed
/// (`replay-f`).
async fn flows_pass<B: BenchDb>(
    db: &Arc<B>,
    flows: &Flows<B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    // Each lane its own adaptive window, as for the records above.
    let run = |replayed: bool| {
        let f = flows.clone().read_first(ReadFirst::Adaptive);
        move |id| {
            let f = f.clone();
            async move { ensure(flow_run(&f, id).await? == replayed, "flow", id) }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.flow_hand(id).await }
    };
    let names = ["flow", "flow-hand", "replay-f"];
    let ratios = ["flow_vs_hand", "replay_vs_flow"];
    layer_pass(
        db,
        c,
        args,
        "flows",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await
}

/// Transitions that emit an event at `c` callers: `Engine::transition` along an edge that
/// emits (the outbox row in the transition's unit, `outbox`), the same writes by hand
/// (`out-hand`), and replays of the requests the first applied (`replay-o`, no row).
async fn outbox_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<EmitMachine, B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    let run = |replayed: bool| {
        let e = engine.clone();
        move |id| {
            let e = e.clone();
            async move {
                let out = e.transition(id, EmitEvent::Pay, &bench_ref(id)).await?;
                ensure(out.is_applied() != replayed, "outbox", id)
            }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.outbox_hand(id).await }
    };
    let names = ["outbox", "out-hand", "replay-o"];
    let ratios = ["outbox_vs_hand", "replay_vs_outbox"];
    layer_pass(
        db,
        c,
        args,
        "outbox",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await
}

/// Storms of identical claims (as a double-click or a retrying gateway makes), one storm
/// after another for `--seconds`: a request claims, 63 identical ones arrive at once
/// while it runs and are answered in flight, then it completes. Once on the database
/// alone (`storm`), once behind the Redis front (`storm-r`), whose held marker answers
/// the 63. The `vs floor` column is
/// against `storm`; `other us` shows what the database server spent per answer.
async fn storm_pass<S: RecordStore>(
    records: &Records<S>,
    url: &str,
    args: &Args,
    ratios: &mut Vec<String>,
) -> Result<(), BoxError> {
    #[cfg(feature = "redis")]
    {
        let front = records.clone().front(orderly::RedisFront::new(
            url,
            orderly::FrontConfig::default(),
        )?);
        let plain = storms(records, "db", args.seconds).await?;
        let fronted = storms(&front, "redis", args.seconds).await?;
        println!("     (storms of 64 identical claims: the `vs floor` column is against storm)");
        for (mode, s) in [("storm", &plain), ("storm-r", &fronted)] {
            let (client, other) = s.cpu_per_op();
            println!(
                " 64  {mode:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
                s.ops,
                s.throughput(),
                s.percentile(0.5),
                s.percentile(0.99),
                s.throughput() / plain.throughput()
            );
        }
        ratios.push(format!(
            "front backend={} storm_redis_vs_db={:.2} other_cpu_redis_vs_db={:.2}",
            args.backend,
            fronted.throughput() / plain.throughput(),
            fronted.cpu_per_op().1 / plain.cpu_per_op().1.max(1.0)
        ));
        Ok(())
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = (records, url, args, ratios);
        Err("--redis needs the redis feature (use --all-features)".into())
    }
}

/// Storms on `records` for `seconds`: the first claim must be granted, the 63 others
/// answered in flight.
#[cfg(feature = "redis")]
async fn storms<S: RecordStore>(
    records: &Records<S>,
    tag: &str,
    seconds: f64,
) -> Result<Stats, BoxError> {
    let (client0, machine0) = (process_cpu_micros(), machine_cpu_micros());
    let start = Instant::now();
    let mut stats = Stats::default();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < seconds {
        n += 1;
        let key = format!("storm-{tag}-{}-{n}", std::process::id());
        let t = Instant::now();
        let first = records.claim(SCOPE, &key, &"storm").await?;
        stats
            .micros
            .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        let orderly::Claim::Claimed(held) = first else {
            return Err(format!("storm {key}: the first claim was not granted").into());
        };
        let barrier = Arc::new(tokio::sync::Barrier::new(63));
        let claims: Vec<_> = (0..63)
            .map(|_| {
                let (r, key, barrier) = (records.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let t = Instant::now();
                    let answer = r.claim(SCOPE, &key, &"storm").await;
                    (answer, t.elapsed())
                })
            })
            .collect();
        for claim in claims {
            let (answer, took) = claim.await?;
            stats
                .micros
                .push(took.as_micros().min(u32::MAX as u128) as u32);
            match answer {
                Err(orderly::Error::InFlight { .. }) => {}
                other => return Err(format!("storm: unexpected {other:?}").into()),
            }
        }
        records.complete(&held, &"done").await?;
    }
    stats.secs = start.elapsed().as_secs_f64();
    stats.ops = stats.micros.len() as u64;
    stats.client_cpu = process_cpu_micros() - client0;
    stats.machine_cpu = machine_cpu_micros() - machine0;
    Ok(stats.finish())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let pool_size = *args.concurrency.iter().max().unwrap_or(&1) as u32;
    // The bench database, and the one with the larger history for `--compare-history`.
    #[allow(unused_macros)]
    macro_rules! start {
        ($backend:ident) => {{
            let db =
                $backend::Db::setup(&args, pool_size, "orderly_bench", args.history_rows).await?;
            let big = match args.compare_history {
                Some(n) => Some($backend::Db::setup(&args, pool_size, "orderly_bench_b", n).await?),
                None => None,
            };
            run(db, big, &args).await
        }};
    }
    match args.backend.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => start!(sqlite),
        #[cfg(feature = "postgres")]
        "postgres" => start!(postgres),
        #[cfg(feature = "mysql")]
        "mysql" => start!(mysql),
        other => Err(format!(
            "backend {other:?} is unknown or its cargo feature is off (use --all-features)"
        )
        .into()),
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use orderly::SqliteStore;
    use orderly::store::sqlite::{connect_options, migrate};
    use sqlx::sqlite::{SqliteConnection, SqlitePool, SqlitePoolOptions};
    use sqlx::{AssertSqlSafe, Connection, Row};

    pub struct Db {
        pool: SqlitePool,
        _dir: tempfile::TempDir,
    }

    impl Db {
        pub async fn setup(
            args: &Args,
            pool_size: u32,
            name: &str,
            history_rows: i64,
        ) -> Result<Self, BoxError> {
            let dir = tempfile::tempdir()?;
            let url = format!(
                "sqlite://{}",
                dir.path().join(format!("{name}.db")).display()
            );
            let pool = SqlitePoolOptions::new()
                .max_connections(pool_size)
                .min_connections(pool_size)
                // No ping round trip on every acquire, for every mode alike (see docs/benchmarks.md).
                .test_before_acquire(false)
                .connect_with(connect_options(&url)?)
                .await?;
            migrate(&pool).await?;
            for sql in order_inserts(args.orders) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
            }
            for sql in history_inserts(history_rows) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
            }
            sqlx::raw_sql("ANALYZE").execute(&pool).await?;
            Ok(Db { pool, _dir: dir })
        }
    }

    /// The floor's two statements for `id`, in an open transaction.
    async fn sqlite_floor_statements(conn: &mut SqliteConnection, id: i64) -> Result<(), BoxError> {
        let n = sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
            .bind("Paid").bind(id).bind("Created").bind(0_i64)
            .execute(&mut *conn).await?.rows_affected();
        ensure(n == 1, "floor", id)?;
        sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
            .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
            .execute(conn).await?;
        Ok(())
    }

    impl BenchDb for Db {
        type S = SqliteStore;

        async fn exec(&self, sql: String) -> Result<(), BoxError> {
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&self.pool)
                .await?;
            Ok(())
        }

        async fn relay_hand<K: Sink>(&self, batch: i64, sink: &K) -> Result<usize, BoxError> {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let rows: Vec<EventRow> = sqlx::query_as(
                "SELECT machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, status, attempts, last_error, 0 AS age_ms FROM outbox WHERE status = 'PENDING' LIMIT ?1",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            publish_all(sink, &rows).await?;
            for row in &rows {
                sqlx::query("UPDATE outbox SET status = 'PUBLISHED', published_at = 0 WHERE machine = ?1 AND entity_id = ?2 AND version = ?3")
                    .bind(&row.machine).bind(row.entity_id).bind(row.version)
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(rows.len())
        }

        fn engine(&self) -> Engine<OrderMachine, SqliteStore> {
            Engine::new(SqliteStore::new(self.pool.clone())).expect("valid machine")
        }

        async fn floor(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let n = sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
                .bind("Paid").bind(id).bind("Created").bind(0_i64)
                .execute(&mut *tx).await?.rows_affected();
            ensure(n == 1, "floor", id)?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn floor_batch(&self, ids: &[i64]) -> Result<(), BoxError> {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            for &id in ids {
                sqlite_floor_statements(&mut tx, id).await?;
            }
            tx.commit().await?;
            Ok(())
        }

        async fn driver_limit(&self, ids: &[i64]) -> Result<Option<Vec<u32>>, BoxError> {
            let mut conn =
                SqliteConnection::connect_with(self.pool.connect_options().as_ref()).await?;
            let mut micros = Vec::with_capacity(ids.len());
            for &id in ids {
                let t = Instant::now();
                sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await?;
                sqlite_floor_statements(&mut conn, id).await?;
                sqlx::query("COMMIT").execute(&mut conn).await?;
                micros.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            conn.close().await?;
            Ok(Some(micros))
        }

        async fn outbox_hand(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let n = sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
                .bind("Paid").bind(id).bind("Created").bind(0_i64)
                .execute(&mut *tx).await?.rows_affected();
            ensure(n == 1, "out-hand", id)?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            sqlx::query("INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")
                .bind("EmitMachine").bind(id).bind(1_i64).bind("OrderPaid").bind("Pay").bind("Created").bind("Paid").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn naive(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let row = sqlx::query("SELECT status, version FROM orders WHERE id = ?1")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
            let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            ensure(status == "Created", "naive", id)?;
            sqlx::query("UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4")
                .bind("Paid").bind(id).bind(&status).bind(version)
                .execute(&mut *tx).await?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn read(&self, id: i64) -> Result<(), BoxError> {
            let seq: Option<i64> = sqlx::query_scalar("SELECT seq FROM order_transitions WHERE order_id = ?1 AND event = ?2 AND ref_id = ?3")
                .bind(id).bind("Pay").bind(bench_ref(id))
                .fetch_optional(&self.pool).await?;
            ensure(seq.is_some(), "read", id)
        }

        async fn records_hand(&self, id: i64) -> Result<(), BoxError> {
            records_hand!(
                &self.pool,
                self.pool.begin_with("BEGIN IMMEDIATE"),
                id,
                &HandSql {
                    claim: "INSERT INTO idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                            attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                        SELECT 'hand', ?1, ?2, 'PROCESSING', ?3, 1, ms + 30000, ms + 86400000, NULL, 0, ms, ms \
                        FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms) WHERE true \
                        ON CONFLICT DO NOTHING",
                    update: "UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4",
                    insert: "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    complete: "UPDATE idempotency_records SET status = 'SUCCEEDED', result = ?1, \
                               updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) \
                           WHERE scope = 'hand' AND idem_key = ?2 AND owner_token = ?3 AND status = 'PROCESSING'",
                }
            )
        }

        async fn flow_hand(&self, id: i64) -> Result<(), BoxError> {
            flow_hand!(
                &self.pool,
                self.pool.begin_with("BEGIN IMMEDIATE"),
                id,
                &FlowSql {
                    claim: "INSERT INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) SELECT 'hand', ?1, 1, ?2, ?3, 'RUNNING', NULL, 0, ?4, 1, ms + 30000, NULL, NULL, ms, ms FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms) WHERE true ON CONFLICT DO NOTHING",
                    update: "UPDATE orders SET status = ?1, version = version + 1 WHERE id = ?2 AND status = ?3 AND version = ?4",
                    insert: "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    step: "INSERT INTO flow_steps (kind, flow_key, step_index, phase, name, status, attempt, downstream_key, owner_token, output, error, started_at, finished_at) SELECT 'hand', ?1, ?2, 'F', ?3, 'SUCCEEDED', 1, NULL, ?4, ?5, NULL, ms, ms FROM (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS ms)",
                    touch: "UPDATE flows SET step_at = ?1, status = ?2, output = COALESCE(?3, output), attempt = 1, lease_until = CAST(unixepoch('subsec') * 1000 AS INTEGER) + 30000, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) WHERE kind = 'hand' AND flow_key = ?4 AND owner_token = ?5 AND park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')",
                }
            )
        }

        async fn reset(&self) -> Result<(), BoxError> {
            sqlx::raw_sql(
                "DELETE FROM order_transitions WHERE order_id > 0; \
                 UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0; \
                 DELETE FROM idempotency_records; \
                 DELETE FROM flows; \
                 DELETE FROM flow_steps; \
                 DELETE FROM outbox; \
                 PRAGMA wal_checkpoint(TRUNCATE);",
            )
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn explain(&self) -> Result<String, BoxError> {
            Ok("(--explain is implemented for PostgreSQL)".into())
        }

        fn describe(&self) -> String {
            "SQLite file in WAL mode, synchronous=NORMAL, one pool for every mode".into()
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use orderly::store::OwnedKey;
    use orderly::store::postgres::migrate;
    use orderly::{EngineConfig, PgStore, ReadFirst};
    use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
    use sqlx::{AssertSqlSafe, Connection, Row};
    use std::str::FromStr;

    pub struct Db {
        pool: PgPool,
    }

    impl Db {
        pub async fn setup(
            args: &Args,
            pool_size: u32,
            name: &str,
            history_rows: i64,
        ) -> Result<Self, BoxError> {
            let url = std::env::var("ORDERLY_PG_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
            let admin = PgConnectOptions::from_str(&url)?;
            let mut conn = PgConnection::connect_with(&admin).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&mut conn)
            .await?;
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await?;
            let pool = PgPoolOptions::new()
                .max_connections(pool_size)
                .min_connections(pool_size)
                // No ping round trip on every acquire, for every mode alike (see docs/benchmarks.md).
                .test_before_acquire(false)
                .connect_with(admin.database(name))
                .await?;
            migrate(&pool).await?;
            sqlx::raw_sql(AssertSqlSafe(format!(
                "INSERT INTO orders (id, status, version) SELECT g, 'Created', 0 FROM generate_series(1, {}) g",
                args.orders
            )))
            .execute(&pool)
            .await?;
            if history_rows > 0 {
                // Other orders' history (negative ids), four transitions per order.
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) \
                     SELECT -1 - g / 4, g % 4 + 1, 'Created', 'Paid', 'Pay', 'pre-' || g FROM generate_series(0, {} - 1) g",
                    history_rows
                )))
                .execute(&pool)
                .await?;
            }
            sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
            Ok(Db { pool })
        }
    }

    impl BenchDb for Db {
        type S = PgStore;

        async fn exec(&self, sql: String) -> Result<(), BoxError> {
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&self.pool)
                .await?;
            Ok(())
        }

        async fn relay_hand<K: Sink>(&self, batch: i64, sink: &K) -> Result<usize, BoxError> {
            let mut tx = self.pool.begin().await?;
            let rows: Vec<EventRow> = sqlx::query_as(
                "SELECT machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, status, attempts, last_error, 0::bigint AS age_ms FROM outbox WHERE status = 'PENDING' \
                 LIMIT $1 FOR UPDATE SKIP LOCKED",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            publish_all(sink, &rows).await?;
            let machines: Vec<&str> = rows.iter().map(|r| r.machine.as_str()).collect();
            let entities: Vec<i64> = rows.iter().map(|r| r.entity_id).collect();
            let versions: Vec<i64> = rows.iter().map(|r| r.version).collect();
            sqlx::query(
                "UPDATE outbox SET status = 'PUBLISHED', published_at = 0 \
                 WHERE (machine, entity_id, version) IN (SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bigint[]))",
            )
            .bind(machines).bind(entities).bind(versions)
            .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(rows.len())
        }

        fn engine(&self) -> Engine<OrderMachine, PgStore> {
            Engine::new(PgStore::new(self.pool.clone())).expect("valid machine")
        }

        async fn floor(&self, id: i64) -> Result<(), BoxError> {
            let n = sqlx::query(
                "WITH u AS (UPDATE orders SET status = $2, version = version + 1 \
                   WHERE id = $1 AND status = $3 AND version = $4 RETURNING version) \
                 INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) \
                 SELECT $1, version, $3, $2, $5, $6 FROM u",
            )
            .bind(id).bind("Paid").bind("Created").bind(0_i64).bind("Pay").bind(bench_ref(id))
            .execute(&self.pool).await?.rows_affected();
            ensure(n == 1, "floor", id)
        }

        async fn floor_batch(&self, ids: &[i64]) -> Result<(), BoxError> {
            let mut tx = self.pool.begin().await?;
            for &id in ids {
                let n = sqlx::query(
                    "WITH u AS (UPDATE orders SET status = $2, version = version + 1 \
                       WHERE id = $1 AND status = $3 AND version = $4 RETURNING version) \
                     INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) \
                     SELECT $1, version, $3, $2, $5, $6 FROM u",
                )
                .bind(id).bind("Paid").bind("Created").bind(0_i64).bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?.rows_affected();
                ensure(n == 1, "floor-batch", id)?;
            }
            tx.commit().await?;
            Ok(())
        }

        async fn outbox_hand(&self, id: i64) -> Result<(), BoxError> {
            let n = sqlx::query(
                "WITH u AS (UPDATE orders SET status = $2, version = version + 1 \
                   WHERE id = $1 AND status = $3 AND version = $4 RETURNING version), \
                 h AS (INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) \
                   SELECT $1, version, $3, $2, $5, $6 FROM u) \
                 INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
                 SELECT 'EmitMachine', $1, version, 'OrderPaid', $5, $3, $2, $6 FROM u",
            )
            .bind(id).bind("Paid").bind("Created").bind(0_i64).bind("Pay").bind(bench_ref(id))
            .execute(&self.pool).await?.rows_affected();
            ensure(n == 1, "out-hand", id)
        }

        async fn naive(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query("SELECT status, version FROM orders WHERE id = $1 FOR UPDATE")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
            let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            ensure(status == "Created", "naive", id)?;
            sqlx::query("UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4")
                .bind("Paid").bind(id).bind(&status).bind(version)
                .execute(&mut *tx).await?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn read(&self, id: i64) -> Result<(), BoxError> {
            let seq: Option<i64> = sqlx::query_scalar("SELECT seq FROM order_transitions WHERE order_id = $1 AND event = $2 AND ref_id = $3")
                .bind(id).bind("Pay").bind(bench_ref(id))
                .fetch_optional(&self.pool).await?;
            ensure(seq.is_some(), "read", id)
        }

        async fn records_hand(&self, id: i64) -> Result<(), BoxError> {
            records_hand!(
                &self.pool,
                self.pool.begin(),
                id,
                &HandSql {
                    claim: "INSERT INTO idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                            attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                        SELECT 'hand', $1, $2, 'PROCESSING', $3, 1, ms + 30000, ms + 86400000, NULL, FALSE, ms, ms \
                        FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now \
                        ON CONFLICT DO NOTHING",
                    update: "UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4",
                    insert: "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)",
                    complete: "UPDATE idempotency_records SET status = 'SUCCEEDED', result = $1, \
                               updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
                           WHERE scope = 'hand' AND idem_key = $2 AND owner_token = $3 AND status = 'PROCESSING'",
                }
            )
        }

        async fn flow_hand(&self, id: i64) -> Result<(), BoxError> {
            flow_hand!(
                &self.pool,
                self.pool.begin(),
                id,
                &FlowSql {
                    claim: "INSERT INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) SELECT 'hand', $1, 1, $2, $3, 'RUNNING', NULL, 0, $4, 1, ms + 30000, NULL, NULL, ms, ms FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now ON CONFLICT DO NOTHING",
                    update: "UPDATE orders SET status = $1, version = version + 1 WHERE id = $2 AND status = $3 AND version = $4",
                    insert: "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ($1, $2, $3, $4, $5, $6)",
                    step: "INSERT INTO flow_steps (kind, flow_key, step_index, phase, name, status, attempt, downstream_key, owner_token, output, error, started_at, finished_at) SELECT 'hand', $1, $2, 'F', $3, 'SUCCEEDED', 1, NULL, $4, $5, NULL, ms, ms FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms) now",
                    touch: "UPDATE flows SET step_at = $1, status = $2, output = COALESCE($3, output), attempt = 1, lease_until = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 30000, updated_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint WHERE kind = 'hand' AND flow_key = $4 AND owner_token = $5 AND park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')",
                }
            )
        }

        async fn reset(&self) -> Result<(), BoxError> {
            sqlx::raw_sql(
                "DELETE FROM order_transitions WHERE order_id > 0; \
                 UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0; \
                 DELETE FROM idempotency_records; \
                 DELETE FROM flows; \
                 DELETE FROM flow_steps; \
                 DELETE FROM outbox;",
            )
            .execute(&self.pool)
            .await?;
            sqlx::raw_sql(
                "VACUUM ANALYZE orders, order_transitions, idempotency_records, flows, flow_steps, outbox",
            )
            .execute(&self.pool)
            .await?;
            Ok(())
        }

        async fn explain(&self) -> Result<String, BoxError> {
            // The plans of the statements the engine itself prepared, found by their text in
            // `pg_prepared_statements` on a pool of one connection: the statement for a new
            // request (executed by EXPLAIN ANALYZE, so in a transaction rolled back), the
            // read that answers a replay when the engine reads first, and the batched read
            // for 8 requests in its generic plan (the one a prepared statement keeps).
            self.reset().await?;
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect_with(self.pool.connect_options().as_ref().clone())
                .await?;
            let store = PgStore::new(pool.clone());
            let config = |read_first| EngineConfig {
                read_first,
                ..EngineConfig::default()
            };
            let writer =
                Engine::<OrderMachine, _>::with_config(store.clone(), config(ReadFirst::Never))?;
            let reader =
                Engine::<OrderMachine, _>::with_config(store.clone(), config(ReadFirst::Always))?;
            writer.transition(1, OrderEvent::Pay, &bench_ref(1)).await?;
            reader.transition(1, OrderEvent::Pay, &bench_ref(1)).await?;
            let mut conn = pool.acquire().await?;
            let keys: Vec<OwnedKey> = (1..=8)
                .map(|id| OwnedKey {
                    order_id: id,
                    event: "Pay",
                    ref_id: bench_ref(id),
                })
                .collect();
            store.priors(&mut conn, &keys).await?;
            let prepared: Vec<(String, String)> =
                sqlx::query_as("SELECT name, statement FROM pg_prepared_statements")
                    .fetch_all(&mut *conn)
                    .await?;
            let named = |what: &str, test: &dyn Fn(&str) -> bool| {
                prepared
                    .iter()
                    .find(|(_, sql)| test(sql))
                    .map(|(name, _)| name.clone())
                    .ok_or_else(|| format!("the engine prepared no {what}"))
            };
            let write = named("apply-first statement", &|sql| {
                sql.starts_with("WITH upd") && sql.contains("$6::text, $7::text")
            })?;
            let read = named("read", &|sql| sql.starts_with("SELECT from_status"))?;
            let batch = named("batched read", &|sql| sql.contains("(VALUES"))?;
            async fn explain(conn: &mut PgConnection, sql: String) -> Result<String, BoxError> {
                let rows = sqlx::raw_sql(AssertSqlSafe(format!(
                    "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"
                )))
                .fetch_all(conn)
                .await?;
                let lines: Result<Vec<String>, _> = rows.iter().map(|r| r.try_get(0)).collect();
                Ok(lines?.join("\n"))
            }
            let ref2 = bench_ref(2);
            sqlx::raw_sql("BEGIN").execute(&mut *conn).await?;
            let applied = explain(
                &mut conn,
                format!("EXECUTE {write}(2, 'Pay', '{ref2}', NULL, NULL, 'Created', 'Paid', 42)"),
            )
            .await;
            sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await?;
            let replay = explain(
                &mut conn,
                format!("EXECUTE {read}(1, 'Pay', '{}')", bench_ref(1)),
            )
            .await?;
            sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
                .execute(&mut *conn)
                .await?;
            let args: Vec<String> = (1..=8)
                .map(|id| format!("{id}, 'Pay', '{}'", bench_ref(id)))
                .collect();
            let batched =
                explain(&mut conn, format!("EXECUTE {batch}({})", args.join(", "))).await?;
            drop(conn);
            pool.close().await;
            Ok(format!(
                "-- the statement, for a new request (applied, then rolled back):\n{}\n\
                 -- the read that answers a replay when the engine reads first:\n{replay}\n\
                 -- the same read for a batch of 8 concurrent requests (generic plan):\n{batched}",
                applied?
            ))
        }

        fn describe(&self) -> String {
            "PostgreSQL, default settings (synchronous_commit=on), one pool for every mode".into()
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use orderly::MySqlStore;
    use orderly::store::mysql::migrate;
    use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
    use sqlx::{AssertSqlSafe, Connection, Row};
    use std::str::FromStr;

    pub struct Db {
        pool: MySqlPool,
    }

    impl Db {
        pub async fn setup(
            args: &Args,
            pool_size: u32,
            name: &str,
            history_rows: i64,
        ) -> Result<Self, BoxError> {
            let url = std::env::var("ORDERLY_MYSQL_URL")
                .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
            let admin = MySqlConnectOptions::from_str(&url)?;
            let mut conn = MySqlConnection::connect_with(&admin).await?;
            sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
                .execute(&mut conn)
                .await?;
            sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await?;
            let pool = MySqlPoolOptions::new()
                .max_connections(pool_size)
                .min_connections(pool_size)
                // No ping round trip on every acquire, for every mode alike (see docs/benchmarks.md).
                .test_before_acquire(false)
                .connect_with(admin.database(name))
                .await?;
            migrate(&pool).await?;
            for sql in order_inserts(args.orders) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
            }
            for sql in history_inserts(history_rows) {
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(&pool).await?;
            }
            sqlx::raw_sql("ANALYZE TABLE orders, order_transitions")
                .execute(&pool)
                .await?;
            Ok(Db { pool })
        }
    }

    impl BenchDb for Db {
        type S = MySqlStore;

        async fn exec(&self, sql: String) -> Result<(), BoxError> {
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&self.pool)
                .await?;
            Ok(())
        }

        async fn relay_hand<K: Sink>(&self, batch: i64, sink: &K) -> Result<usize, BoxError> {
            let mut tx = self.pool.begin().await?;
            let rows: Vec<EventRow> = sqlx::query_as(
                "SELECT machine, entity_id, version, event, transition, from_status, to_status, ref_id, body, status, attempts, last_error, CAST(0 AS SIGNED) AS age_ms FROM outbox WHERE status = 'PENDING' \
                 LIMIT ? FOR UPDATE SKIP LOCKED",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            publish_all(sink, &rows).await?;
            if !rows.is_empty() {
                let keys = vec!["(machine = ? AND entity_id = ? AND version = ?)"; rows.len()]
                    .join(" OR ");
                let sql = format!(
                    "UPDATE outbox SET status = 'PUBLISHED', published_at = 0 WHERE {keys}"
                );
                let mut update = sqlx::query(AssertSqlSafe(sql));
                for row in &rows {
                    update = update
                        .bind(&row.machine)
                        .bind(row.entity_id)
                        .bind(row.version);
                }
                update.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(rows.len())
        }

        fn engine(&self) -> Engine<OrderMachine, MySqlStore> {
            Engine::new(MySqlStore::new(self.pool.clone())).expect("valid machine")
        }

        async fn floor(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin().await?;
            let n = sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
                .bind("Paid").bind(id).bind("Created").bind(0_i64)
                .execute(&mut *tx).await?.rows_affected();
            ensure(n == 1, "floor", id)?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn floor_batch(&self, ids: &[i64]) -> Result<(), BoxError> {
            let mut tx = self.pool.begin().await?;
            for &id in ids {
                let n = sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
                    .bind("Paid").bind(id).bind("Created").bind(0_i64)
                    .execute(&mut *tx).await?.rows_affected();
                ensure(n == 1, "floor-batch", id)?;
                sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
                    .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
                    .execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        }

        async fn outbox_hand(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin().await?;
            let n = sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
                .bind("Paid").bind(id).bind("Created").bind(0_i64)
                .execute(&mut *tx).await?.rows_affected();
            ensure(n == 1, "out-hand", id)?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(id).bind(1_i64).bind("Created").bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            sqlx::query("INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
                .bind("EmitMachine").bind(id).bind(1_i64).bind("OrderPaid").bind("Pay").bind("Created").bind("Paid").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn naive(&self, id: i64) -> Result<(), BoxError> {
            let mut tx = self.pool.begin().await?;
            let row = sqlx::query("SELECT status, version FROM orders WHERE id = ? FOR UPDATE")
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
            let (status, version): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            ensure(status == "Created", "naive", id)?;
            sqlx::query("UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?")
                .bind("Paid").bind(id).bind(&status).bind(version)
                .execute(&mut *tx).await?;
            sqlx::query("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(id).bind(version + 1).bind(&status).bind("Paid").bind("Pay").bind(bench_ref(id))
                .execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        }

        async fn read(&self, id: i64) -> Result<(), BoxError> {
            let seq: Option<i64> = sqlx::query_scalar(
                "SELECT seq FROM order_transitions WHERE order_id = ? AND event = ? AND ref_id = ?",
            )
            .bind(id)
            .bind("Pay")
            .bind(bench_ref(id))
            .fetch_optional(&self.pool)
            .await?;
            ensure(seq.is_some(), "read", id)
        }

        async fn records_hand(&self, id: i64) -> Result<(), BoxError> {
            records_hand!(
                &self.pool,
                self.pool.begin(),
                id,
                &HandSql {
                    claim: "INSERT IGNORE INTO idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
                            attempt, lease_until, expires_at, result, terminal, created_at, updated_at) \
                        VALUES ('hand', ?, ?, 'PROCESSING', ?, 1, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000, \
                            CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 86400000, NULL, FALSE, \
                            CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
                    update: "UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?",
                    insert: "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)",
                    complete: "UPDATE idempotency_records SET status = 'SUCCEEDED', result = ?, \
                               updated_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) \
                           WHERE scope = 'hand' AND idem_key = ? AND owner_token = ? AND status = 'PROCESSING'",
                }
            )
        }

        async fn flow_hand(&self, id: i64) -> Result<(), BoxError> {
            flow_hand!(
                &self.pool,
                self.pool.begin(),
                id,
                &FlowSql {
                    claim: "INSERT IGNORE INTO flows (kind, flow_key, version, input_hash, input, status, park_reason, step_at, owner_token, attempt, lease_until, output, last_error, created_at, updated_at) VALUES ('hand', ?, 1, ?, ?, 'RUNNING', NULL, 0, ?, 1, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000, NULL, NULL, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
                    update: "UPDATE orders SET status = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?",
                    insert: "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (?, ?, ?, ?, ?, ?)",
                    step: "INSERT INTO flow_steps (kind, flow_key, step_index, phase, name, status, attempt, downstream_key, owner_token, output, error, started_at, finished_at) VALUES ('hand', ?, ?, 'F', ?, 'SUCCEEDED', 1, NULL, ?, ?, NULL, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED))",
                    touch: "UPDATE flows SET step_at = ?, status = ?, output = COALESCE(?, output), attempt = 1, lease_until = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 30000, updated_at = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) WHERE kind = 'hand' AND flow_key = ? AND owner_token = ? AND park_reason IS NULL AND status IN ('RUNNING', 'COMPENSATING')",
                }
            )
        }

        async fn reset(&self) -> Result<(), BoxError> {
            sqlx::raw_sql("DELETE FROM order_transitions WHERE order_id > 0")
                .execute(&self.pool)
                .await?;
            for table in ["idempotency_records", "flows", "flow_steps", "outbox"] {
                sqlx::raw_sql(AssertSqlSafe(format!("DELETE FROM {table}")))
                    .execute(&self.pool)
                    .await?;
            }
            sqlx::raw_sql("UPDATE orders SET status = 'Created', version = 0 WHERE version <> 0")
                .execute(&self.pool)
                .await?;
            Ok(())
        }

        async fn explain(&self) -> Result<String, BoxError> {
            Ok("(--explain is implemented for PostgreSQL)".into())
        }

        fn describe(&self) -> String {
            "MariaDB/MySQL, default settings (innodb_flush_log_at_trx_commit=1), one pool for every mode".into()
        }
    }
}
