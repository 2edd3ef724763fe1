//! Throughput and latency of `transition` against the raw SQL floor and the naive pattern.
//!
//! | file | what |
//! |---|---|
//! | `main.rs` | options, the transition modes (floor, naive, engine, alone, floor-batch, driver-limit, replay, read) and the run |
//! | `lanes.rs` | how a mode runs and is measured; a layer's pass against its hand-written writes |
//! | `records.rs`, `flows.rs`, `outbox.rs`, `deadline.rs` | each layer's modes |
//! | `sqlite.rs`, `postgres.rs`, `mysql.rs` | each backend's database, its hand-written statements, its plans |
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
//! inspection (`bench/pgbench-guarded.sh` runs on it). On PostgreSQL the floor is also
//! driven by pgbench after each concurrency (a `pgbench …` line).
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
//! Guarded transitions have three more: `guarded` is `Engine::transition` of a machine
//! whose `Pay` edge has a guard reading the amount due (one business row) and an effect
//! writing a ledger row (one more), run inside the transition's unit; `guard-hand` the
//! same work by hand (BEGIN, `SELECT … FOR UPDATE`, the guard's SELECT, UPDATE, INSERT
//! of the history row, INSERT of the ledger row, COMMIT); `replay-g` replays of what
//! `guarded` applied (no rule runs). `--only guarded` runs these three alone.
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
//! one `outbox backend=… c=… outbox_vs_hand=… replay_vs_outbox=…` and one `guarded
//! backend=… c=… guarded_vs_hand=… replay_vs_guarded=…` per concurrency, and the
//! `relay …` line, for scripts.
//!
//! With `--admin-history N` (or `--only admin`), the admin mode (`admin.rs`): the
//! operators' page timed over a database of N history rows, and the engine with the page
//! polled; its `admin …` line.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use orderly::flow::{Definition, FlowConfig, FlowOutcome, FlowStore, Flows};
use orderly::idempotency::RecordStore;
use orderly::outbox::{
    ChannelSink, Claim, EventRow, Message, OutboxStore, Relay, RelayConfig, Sink,
};
use orderly::store::Store;
use orderly::{Done, Engine, EngineConfig, Outcome, ReadFirst, Records, ScopeConfig};

#[cfg(feature = "admin")]
mod admin;
#[macro_use]
mod records;
#[macro_use]
mod flows;
mod deadline;
mod guarded;
mod hot;
mod http;
mod lanes;
mod outbox;
mod timers;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use deadline::*;
use flows::*;
use guarded::*;
use hot::*;
use http::*;
use lanes::*;
use outbox::*;
use records::*;
use timers::*;

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
    timers: i64,
    nats: Option<String>,
    /// History rows of the admin mode, if it runs.
    admin_history: Option<i64>,
    /// The part run alone, if one is.
    only: Option<Only>,
}

/// A part of the bench that can run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Only {
    Guarded,
    Relay,
    Hot,
    Http,
    Timers,
    Admin,
}

impl Args {
    /// Whether this run includes `part`.
    fn runs(&self, part: Only) -> bool {
        self.only.is_none_or(|only| only == part)
    }
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
        timers: 20_000,
        nats: None,
        admin_history: None,
        only: None,
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
            "--timers" => args.timers = value()?.parse()?,
            "--nats" => args.nats = Some(value()?),
            "--admin-history" => args.admin_history = Some(value()?.parse()?),
            "--only" => match value()?.as_str() {
                "guarded" => args.only = Some(Only::Guarded),
                "relay" => args.only = Some(Only::Relay),
                "hot" => args.only = Some(Only::Hot),
                "http" => args.only = Some(Only::Http),
                "timers" => args.only = Some(Only::Timers),
                "admin" => args.only = Some(Only::Admin),
                other => {
                    return Err(format!(
                        "--only {other}: only `guarded`, `relay`, `hot`, `http`, `timers` or `admin` can run alone"
                    )
                    .into());
                }
            },
            "--help" | "-h" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (see --help)").into()),
        }
    }
    if args.only == Some(Only::Admin) && args.admin_history.is_none() {
        args.admin_history = Some(1_000_000);
    }
    if args.admin_history.is_some_and(|n| n < 100) {
        return Err("--admin-history must be 100 or more".into());
    }
    if args.orders < 3 || args.rounds == 0 || args.concurrency.contains(&0) || args.seconds <= 0.0 {
        return Err("--orders, --concurrency and --seconds must be positive".into());
    }
    Ok(args)
}

/// What `--help` prints.
const USAGE: &str = "\
usage: bench [options]   (cargo run --release --all-features --example bench -- [options])

  --backend sqlite|postgres|mysql   the database [sqlite]; servers from ORDERLY_PG_URL,
                                    ORDERLY_MYSQL_URL (as for the test suites)
  --orders N                        orders created per pass [100000]
  --concurrency C1,C2,...           callers per pass [1,8,32]
  --seconds S                       time per mode and concurrency [5]
  --rounds R                        slices each mode's time is cut into, interleaved [5]
  --history-rows N                  history rows of other orders loaded first [10000]
  --compare-history N               also run the engine on orderly_bench_b with N rows
                                    (a `scale` line)
  --explain                         print the plans of the engine's statements (PostgreSQL)
  --redis URL                       storms of identical claims, database alone and behind
                                    the Redis front (a `front` line)
  --deadline-ms MS                  the client deadline of the deadline storm [10]
  --relay-events N                  events drained by the relays and the hand loops [20000]
  --timers N                        due timers drained by the timer jobs and the hand loops
                                    [20000]
  --nats URL                        relay to NATS JetStream instead of an in-process sink
  --only guarded                    the guarded modes alone (a table and a `guarded` line
                                    per concurrency)
  --only relay                      the relays alone (the `relay` line)
  --only hot                        the hot-rows mode alone (the `hot` line)
  --only http                       the HTTP mode alone (the `http` line)
  --only timers                     the timers modes alone (the `timers` line)
  --admin-history N                 also the admin mode (feature `admin`): the operators'
                                    page over N history rows, N/10 outbox rows and N/100
                                    records, and the engine with the page polled (an
                                    `admin` line)
  --only admin                      the admin mode alone [N = 1000000]
  --help                            this text

It prints a table per concurrency and `ratio`, `coalesce`, `records`, `flows`, `outbox`,
`guarded`, `relay`, `timers`, `deadline` (and `front`, `scale`) lines; docs/benchmarks.md reads them.
";

/// What the bench needs of a store: with the `admin` feature, all the operators' page
/// needs (the admin mode).
#[cfg(feature = "admin")]
trait BenchStore: orderly::admin::AdminStore {}
#[cfg(feature = "admin")]
impl<S: orderly::admin::AdminStore> BenchStore for S {}
#[cfg(not(feature = "admin"))]
trait BenchStore {}
#[cfg(not(feature = "admin"))]
impl<S> BenchStore for S {}

/// What a backend provides to the bench: the raw patterns, and a reset between passes.
trait BenchDb: Send + Sync + 'static {
    type S: BenchStore + FlowStore + OutboxStore + orderly::TimerStore;
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
    /// A fresh database `name` for the example service, its URL: the service's stock
    /// table created, with `skus` skus `sku-c-0…` of plenty each (the service creates
    /// its other tables and seeds its own skus when it starts).
    fn service_db(
        &self,
        name: &str,
        skus: usize,
    ) -> impl Future<Output = Result<String, BoxError>> + Send;
    /// A count, from literal SQL.
    fn count(&self, sql: String) -> impl Future<Output = Result<i64, BoxError>> + Send;
    /// The integers of the first column of literal SQL's rows.
    fn lateness_ms(&self, sql: String) -> impl Future<Output = Result<Vec<i64>, BoxError>> + Send;
    /// The database's clock in milliseconds since the epoch, as an SQL expression.
    fn now_ms_sql(&self) -> &'static str;
    /// One round of the hand-written timer loop: in one transaction, up to `batch`
    /// pending due timers chosen with `SKIP LOCKED` (SQLite: under `BEGIN IMMEDIATE`),
    /// each fired through `engine` inside it (`transition(…).within`), marked fired; how
    /// many.
    fn timers_hand(
        &self,
        batch: i64,
        engine: &Engine<TimerMachine, Self::S>,
    ) -> impl Future<Output = Result<usize, BoxError>> + Send;
    /// By hand, one request of the hot-rows mode: in one transaction, hot entity `id`
    /// locked (SQLite: `BEGIN IMMEDIATE`), its version moved on, the history row with
    /// `ref_id` (whose unique key refuses a replay).
    fn hot_hand(&self, id: i64, ref_id: &str) -> impl Future<Output = Result<(), BoxError>> + Send;
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
    /// SQLite only (`None` elsewhere): the floor's statements for each of `ids` through a
    /// direct binding (rusqlite) on a connection of its own, `per_commit` requests per
    /// transaction; each request's latency in microseconds.
    fn direct(
        &self,
        ids: &[i64],
        per_commit: usize,
    ) -> impl Future<Output = Result<Option<Vec<u32>>, BoxError>> + Send {
        let _ = (ids, per_commit);
        async { Ok(None) }
    }
    /// PostgreSQL only (`None` elsewhere): the floor's statement driven by pgbench (a C
    /// client, one commit per request) at `c` clients for exactly `transitions`
    /// transitions, on orders of its own that are all there (it cannot run out), and
    /// what it applied, counted from the history: transitions per second.
    fn pgbench_floor(
        &self,
        c: usize,
        transitions: i64,
    ) -> impl Future<Output = Result<Option<f64>, BoxError>> + Send {
        let _ = (c, transitions);
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
    /// The `guarded` mode's guard: the amount `id` is due, read on the unit's connection.
    fn due<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>>;
    /// The `guarded` mode's effect: `id`'s ledger row, written on the unit's connection.
    fn ledger<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        id: i64,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>>;
    /// By hand, what a guarded transition does: in one transaction, the entity locked
    /// (SQLite: `BEGIN IMMEDIATE`), the guard's read, the update, the history row and the
    /// effect's ledger row.
    fn guarded_hand(&self, id: i64) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Every bench order back to `Created`, version 0, its history, outbox rows and the
    /// idempotency records gone.
    fn reset(&self) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn explain(&self) -> impl Future<Output = Result<String, BoxError>> + Send;
    fn describe(&self) -> String;
}

/// `url` with its database (the path) replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = base.rsplit_once('/').map_or(base, |(head, _)| head);
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
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

/// Runs every mode on `db`; with `big` (a second database whose history table holds
/// `--compare-history` rows), also the engine mode on it, interleaved, so that both
/// history sizes see the same background load.
async fn run<B: BenchDb>(db: B, big: Option<B>, args: &Args) -> Result<(), BoxError> {
    let db = Arc::new(db);
    let engine = db.engine();
    let records = bench_records(engine.store().clone());
    let flows = bench_flows(&engine);
    let emitting: Engine<EmitMachine, B::S> = Engine::new(engine.store().clone())?;
    guarded_tables(&*db, args.orders).await?;
    let guarded = guarded_engine::<B>(engine.store().clone())?;
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
    // Each write mode owns a seventh of the orders; the modes alternate in short slices,
    // round after round, so that all of them see the same background load.
    let share = args.orders / 7;
    let alone_engine = Engine::<OrderMachine, B::S>::with_config(
        engine.store().clone(),
        EngineConfig::default().coalesce_writes(false),
    )?;
    let slice = args.seconds / args.rounds as f64;
    let concurrency: &[usize] = if args.runs(Only::Guarded) {
        &args.concurrency
    } else {
        &[]
    };
    for &c in concurrency {
        db.reset().await?;
        if args.only == Some(Only::Guarded) {
            ratios.push(guarded_pass(&db, &guarded, c, args).await?);
            continue;
        }
        if let Some(big) = &big {
            big.reset().await?;
        }
        let mut big_lane = Lane::new(1 + 2 * share);
        let (mut floor, mut naive, mut applied) =
            (Lane::new(1), Lane::new(1 + share), Lane::new(1 + 2 * share));
        let (mut replay, mut read) = (Lane::new(1 + 2 * share), Lane::new(1 + 2 * share));
        let (mut alone, mut floor_batch, mut driver, mut direct) = (
            Lane::new(1 + 3 * share),
            Lane::new(1 + 4 * share),
            Lane::new(1 + 5 * share),
            Lane::new(1 + 6 * share),
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
            let d = db.clone();
            direct
                .batch_slice(256.max(c), slice, quota, move |ids| {
                    let d = d.clone();
                    // Elsewhere than on SQLite: no requests, no row.
                    async move { Ok(Some(d.direct(&ids, c).await?.unwrap_or_default())) }
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
            direct,
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
            direct,
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
        if direct.ops > 0 {
            rows.push(("direct", &direct));
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
        // The same floor through pgbench, for as many transitions as the engine applied
        // in its time (at least 50 per client).
        let transitions = ((applied.throughput() * args.seconds) as i64).max(50 * c as i64);
        let transitions = (transitions as u64).div_ceil(c as u64) as i64 * c as i64;
        if let Some(pgbench) = db.pgbench_floor(c, transitions).await? {
            ratios.push(format!(
                "pgbench backend={} c={c} transitions={transitions} pgbench_per_s={pgbench:.0} engine_vs_pgbench={:.2}",
                args.backend,
                applied.throughput() / pgbench
            ));
        }
        ratios.push(format!(
            "coalesce backend={} c={c} engine_vs_alone={:.2} engine_vs_floor_batch={:.2} engine_p99_ms={:.2} alone_p99_ms={:.2}{}",
            args.backend,
            applied.throughput() / alone.throughput(),
            applied.throughput() / floor_batch.throughput(),
            applied.percentile(0.99),
            alone.percentile(0.99),
            if driver.ops > 0 && direct.ops > 0 {
                format!(
                    " engine_vs_driver={:.2} engine_vs_direct={:.2}",
                    applied.throughput() / driver.throughput(),
                    applied.throughput() / direct.throughput()
                )
            } else {
                String::new()
            }
        ));
        ratios.push(records_pass(&db, &engine, &records, c, args).await?);
        ratios.push(flows_pass(&db, &flows, c, args).await?);
        ratios.push(outbox_pass(&db, &emitting, c, args).await?);
        ratios.push(guarded_pass(&db, &guarded, c, args).await?);
    }
    let most = args.concurrency.iter().copied().max().unwrap_or(1);
    if args.runs(Only::Hot) {
        ratios.push(hot_pass(&db, most, args).await?);
    }
    if args.runs(Only::Http) {
        ratios.push(http_pass(&db, most, args).await?);
    }
    if args.only.is_none() {
        if let Some(url) = &args.redis {
            storm_pass(&records, url, args, &mut ratios).await?;
        }
        ratios.push(deadline_pass(&db, &engine, &records, &flows, args).await?);
    }
    if args.runs(Only::Relay) {
        ratios.push(match &args.nats {
            Some(url) => relay_nats(&db, url, args).await?,
            None => {
                let (sink, mut rx) = ChannelSink::new();
                tokio::spawn(async move { while rx.recv().await.is_some() {} });
                relay_pass(&db, sink, "channel", args).await?
            }
        });
    }
    if args.runs(Only::Timers) {
        ratios.push(timers_pass(&db, args).await?);
    }
    if let Some(history) = args.admin_history.filter(|_| args.runs(Only::Admin)) {
        #[cfg(feature = "admin")]
        ratios.push(admin::admin_pass(&db, most, history, args).await?);
        #[cfg(not(feature = "admin"))]
        return Err(
            format!("--admin-history {history}: the admin mode needs the `admin` feature").into(),
        );
    }
    for line in scales.into_iter().chain(ratios) {
        println!("{line}");
    }
    Ok(())
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
