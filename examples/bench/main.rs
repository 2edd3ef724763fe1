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
//! line is `relay backend=… relay_vs_hand=…`. With `--kafka BROKERS` (feature `kafka`) the
//! same again to a Kafka-protocol broker (a `relay_kafka …` line), and with `--traced`
//! (feature `otel`), last, the outbox and relay passes again with every span recorded
//! by OpenTelemetry (a `traced …` line; `traced.rs`).
//!
//! A `call backend=… c=… reference=… engine_vs_reference=… engine_client_us=…
//! records_vs_hand=… flows_vs_hand=…` line per concurrency gathers the cost of one call:
//! the engine over pgbench (PostgreSQL), the direct loop (SQLite) or the floor, its
//! client CPU a call, and the layers over their hand-written writes.
//!
//! The last lines are one `ratio backend=… c=… engine_vs_floor=… engine_vs_naive=…
//! replay_vs_engine=…`, one `coalesce backend=… c=… engine_vs_alone=…
//! engine_vs_floor_batch=… engine_p99_ms=… alone_p99_ms=…` (and `engine_vs_driver=…` on
//! SQLite) and one `records backend=… c=… records_vs_hand=…
//! replay_vs_records=…` and one `flows backend=… c=… flow_vs_hand=… replay_vs_flow=…` and
//! one `outbox backend=… c=… outbox_vs_hand=… replay_vs_outbox=…` and one `guarded
//! backend=… c=… guarded_vs_hand=… replay_vs_guarded=…` per concurrency, and the
//! `relay …` line, for scripts.
//! On stderr, each pass's wall time (`# pass records c=8: 2.1 s`), and the setup's.
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
mod args;
mod db;
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
mod traced;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use args::*;
use db::*;
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
    let concurrency: &[usize] =
        if args.runs(Only::Guarded) || matches!(args.only, Some(Only::Engine | Only::Layers)) {
            &args.concurrency
        } else {
            &[]
        };
    for &c in concurrency {
        db.reset().await?;
        if args.only == Some(Only::Guarded) {
            ratios.push(timed("guarded", c, guarded_pass(&db, &guarded, c, args)).await?);
            continue;
        }
        if args.only == Some(Only::Engine) {
            engine_alone(&engine, c, args).await?;
            continue;
        }
        if args.only == Some(Only::Layers) {
            ratios.push(timed("records", c, records_pass(&db, &engine, &records, c, args)).await?);
            ratios.push(timed("flows", c, flows_pass(&db, &flows, c, args)).await?);
            continue;
        }
        if let Some(big) = &big {
            big.reset().await?;
        }
        let lanes_started = Instant::now();
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
        eprintln!(
            "# pass transitions c={c}: {:.1} s",
            lanes_started.elapsed().as_secs_f64()
        );
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
        let pgbench = db.pgbench_floor(c, transitions).await?;
        if let Some(pgbench) = pgbench {
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
        let records_line =
            timed("records", c, records_pass(&db, &engine, &records, c, args)).await?;
        let flows_line = timed("flows", c, flows_pass(&db, &flows, c, args)).await?;
        // The cost of one call, in one line: the engine against the cheapest reference
        // there is (pgbench on PostgreSQL, the direct loop on SQLite, the floor
        // elsewhere), its client CPU a call, and the layers against their hand-written
        // writes.
        let (reference, per_s) = match pgbench {
            Some(per_s) => ("pgbench", per_s),
            None if direct.ops > 0 => ("direct", direct.throughput()),
            None => ("floor", f),
        };
        ratios.push(format!(
            "call backend={} c={c} reference={reference} engine_vs_reference={:.2} engine_client_us={:.0} records_vs_hand={} flows_vs_hand={}",
            args.backend,
            applied.throughput() / per_s,
            applied.cpu_per_op().0,
            field(&records_line, "records_vs_hand").unwrap_or("-"),
            field(&flows_line, "flow_vs_hand").unwrap_or("-"),
        ));
        ratios.push(records_line);
        ratios.push(flows_line);
        ratios.push(timed("outbox", c, outbox_pass(&db, &emitting, c, args)).await?);
        ratios.push(timed("guarded", c, guarded_pass(&db, &guarded, c, args)).await?);
    }
    let most = args.concurrency.iter().copied().max().unwrap_or(1);
    if args.runs(Only::Hot) {
        ratios.push(timed("hot", most, hot_pass(&db, most, args)).await?);
    }
    if args.runs(Only::Http) {
        ratios.push(timed("http", most, http_pass(&db, most, args)).await?);
    }
    if args.only.is_none() {
        if let Some(url) = &args.redis {
            timed("front", most, storm_pass(&records, url, args, &mut ratios)).await?;
        }
        ratios.push(
            timed(
                "deadline",
                8,
                deadline_pass(&db, &engine, &records, &flows, args),
            )
            .await?,
        );
    }
    if args.runs(Only::Relay) {
        ratios.push(match &args.nats {
            Some(url) => timed("relay", 4, relay_nats(&db, url, args)).await?,
            None => {
                let (sink, mut rx) = ChannelSink::new();
                tokio::spawn(async move { while rx.recv().await.is_some() {} });
                relay_pass(&db, sink, "channel", args).await?
            }
        });
        if let Some(brokers) = &args.kafka {
            ratios.push(timed("relay_kafka", 4, traced::relay_kafka(&db, brokers, args)).await?);
        }
    }
    if args.runs(Only::Timers) {
        ratios.push(timed("timers", 4, timers_pass(&db, args)).await?);
    }
    if let Some(history) = args.admin_history.filter(|_| args.runs(Only::Admin)) {
        #[cfg(feature = "admin")]
        ratios.push(timed("admin", most, admin::admin_pass(&db, most, history, args)).await?);
        #[cfg(not(feature = "admin"))]
        return Err(
            format!("--admin-history {history}: the admin mode needs the `admin` feature").into(),
        );
    }
    // The last pass: it leaves a subscriber recording every span.
    if args.traced && args.only.is_none() {
        ratios.push(
            timed(
                "traced",
                most,
                traced::traced_pass(&db, &emitting, most, args, &ratios),
            )
            .await?,
        );
    }
    for line in scales.into_iter().chain(ratios) {
        println!("{line}");
    }
    Ok(())
}

/// The value of `key=` in a printed line.
fn field<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The engine mode alone at `c` callers (`--only engine`): one table row, for a
/// profiler to see nothing else.
async fn engine_alone<S: Store>(
    engine: &Engine<OrderMachine, S>,
    c: usize,
    args: &Args,
) -> Result<(), BoxError> {
    let mut lane = Lane::new(1);
    let span = args.orders - 1;
    for round in 1..=i64::from(args.rounds) {
        let quota = span * round / i64::from(args.rounds);
        lane.engine_slice(engine, c, args.seconds / args.rounds as f64, quota)
            .await?;
    }
    let s = lane.stats.finish();
    let (client, other) = s.cpu_per_op();
    println!(
        "{c:>3}  {:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9} {client:>10.0} {other:>10.0}",
        "engine",
        s.ops,
        s.throughput(),
        s.percentile(0.5),
        s.percentile(0.99),
        "-"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    // As many connections as the most callers; at least four where the relay or timer
    // passes run: each runs four loops, each holding a connection for its round, and with
    // fewer they would take turns on the pool instead of racing each other.
    let loops = if args.runs(Only::Relay) || args.runs(Only::Timers) {
        4
    } else {
        1
    };
    let pool_size = (*args.concurrency.iter().max().unwrap_or(&1)).max(loops) as u32;
    // The bench database, and the one with the larger history for `--compare-history`.
    #[allow(unused_macros)]
    macro_rules! start {
        ($backend:ident) => {{
            let started = Instant::now();
            let db =
                $backend::Db::setup(&args, pool_size, "orderly_bench", args.history_rows).await?;
            let big = match args.compare_history {
                Some(n) => Some($backend::Db::setup(&args, pool_size, "orderly_bench_b", n).await?),
                None => None,
            };
            eprintln!("# setup: {:.1} s", started.elapsed().as_secs_f64());
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
