//! The timers modes: `timers` (four `Timers` jobs) against `timer-hand` (four hand loops:
//! `SKIP LOCKED` + a transition each + mark fired, in one transaction), draining the same
//! due timers; and `timers-steady`, timers falling due at a steady rate, for their
//! lateness.

use orderly::{Timers, TimersConfig};

use super::*;

orderly::state_machine! {
    /// The bench's expiring order: cancelled by its timer.
    pub TimerMachine {
        states: TimerState { Created, Cancelled }
        events: TimerEvent { Cancel }
        initial: Created;
        terminal: [Cancelled];
        transitions: {
            Created + Cancel => Cancelled,
        }
        timers: {
            Created after 1 h => Cancel,
        }
    }
}

/// The timers due at once in the drain.
const DRAIN: i64 = 5000;

/// The first entity id of the timers modes, far above the other modes' orders.
const BASE: i64 = 2_000_000_000;

/// Removes the timers modes' entities, history and timers.
async fn clear<B: BenchDb>(db: &B) -> Result<(), BoxError> {
    db.exec("DELETE FROM orderly_timers".into()).await?;
    db.exec(format!(
        "DELETE FROM orderly_transitions WHERE order_id >= {BASE}"
    ))
    .await?;
    db.exec(format!("DELETE FROM orders WHERE id >= {BASE}"))
        .await?;
    Ok(())
}

/// `n` entities at `Created`, each with its state's timer (as the create would arm it),
/// due `due_sql` (an SQL expression of `i`, the entity's place from 0); the tables
/// analyzed.
async fn seed<B: BenchDb>(db: &B, n: i64, due: impl Fn(i64) -> String) -> Result<(), BoxError> {
    clear(db).await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let orders: Vec<String> = chunk
            .iter()
            .map(|i| format!("({}, 'Created', 0)", BASE + i))
            .collect();
        db.exec(format!(
            "INSERT INTO orders (id, status, version) VALUES {}",
            orders.join(", ")
        ))
        .await?;
        let timers: Vec<String> = chunk
            .iter()
            .map(|i| {
                let due = due(*i);
                format!(
                    "('TimerMachine', {}, 'Cancel', 'timer:Created:0', 'Created', 0, {due}, {due}, 0)",
                    BASE + i
                )
            })
            .collect();
        db.exec(format!(
            "INSERT INTO orderly_timers (machine, entity_id, event, ref_id, state, version, due_at, \
             next_at, created_at) VALUES {}",
            timers.join(", ")
        ))
        .await?;
    }
    // Statistics that know the rows, as a live table's do (planned as empty, a claim
    // over thousands of rows sorts them all).
    db.exec(db.analyze("orderly_timers")).await?;
    db.exec(db.analyze("orders")).await?;
    Ok(())
}

/// Four jobs firing until `n` timers fired; the time it took.
async fn jobs<B: BenchDb>(
    engine: &Engine<TimerMachine, B::S>,
    n: i64,
    idle: Duration,
) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let done = Arc::new(AtomicI64::new(0));
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let job = Timers::new(engine.store().clone())
                .with_config(TimersConfig::default().batch(128).idle(idle))
                .map(|job| job.fire(engine.clone()));
            let done = done.clone();
            tokio::spawn(async move {
                let job = job?;
                while done.load(Ordering::SeqCst) < n {
                    let round = match job.fire_once().await {
                        Ok(round) => round,
                        Err(e) if e.is_retryable() => continue,
                        Err(e) => return Err(e.into()),
                    };
                    if round.dead + round.retried + round.moot > 0 {
                        return Err::<(), BoxError>(format!("timer round {round:?}").into());
                    }
                    done.fetch_add((round.applied + round.replayed) as i64, Ordering::SeqCst);
                    if round.claimed == 0 {
                        tokio::time::sleep(idle).await;
                    }
                }
                Ok(())
            })
        })
        .collect();
    for l in loops {
        l.await??;
    }
    Ok(start.elapsed())
}

/// Four jobs as a service runs them ([`Timers::run`], the default config) until `n`
/// timers fired (counted in the database every 20 ms); the time it took.
async fn run_jobs<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<TimerMachine, B::S>,
    n: i64,
) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let (stop, _) = tokio::sync::watch::channel(false);
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let job = Timers::new(engine.store().clone()).fire(engine.clone());
            let mut stopped = stop.subscribe();
            tokio::spawn(async move {
                job.run(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let fired = loop {
        let fired = db
            .count("SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED'".into())
            .await?;
        if fired >= n || Instant::now() > deadline {
            break fired;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = start.elapsed();
    stop.send_replace(true);
    for l in loops {
        let round = l.await??;
        if round.dead + round.retried + round.moot > 0 {
            return Err(format!("timer rounds {round:?}").into());
        }
    }
    if fired < n {
        return Err(format!("the jobs fired {fired} of {n} timers in 120 s").into());
    }
    Ok(took)
}

/// The fired timers' lateness on the database's clock, p50 and p99, in milliseconds.
async fn lateness<B: BenchDb>(db: &B) -> Result<(i64, i64), BoxError> {
    let mut late = db
        .lateness_ms("SELECT fired_at - due_at FROM orderly_timers WHERE status = 'FIRED'".into())
        .await?;
    late.sort_unstable();
    let pct = |p: f64| {
        late.get(((late.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    };
    Ok((pct(0.5), pct(0.99)))
}

/// Four hand loops until `n` timers fired; the time it took.
async fn hands<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<TimerMachine, B::S>,
    n: i64,
) -> Result<Duration, BoxError> {
    let start = Instant::now();
    let done = Arc::new(AtomicI64::new(0));
    let loops: Vec<_> = (0..4)
        .map(|_| {
            let (db, engine, done) = (db.clone(), engine.clone(), done.clone());
            tokio::spawn(async move {
                while done.load(Ordering::SeqCst) < n {
                    match db.timers_hand(128, &engine).await {
                        Ok(fired) => {
                            done.fetch_add(fired as i64, Ordering::SeqCst);
                        }
                        // A deadlock or a busy database: the round is run again.
                        Err(e) if retryable(&*e) => continue,
                        Err(e) => return Err::<(), BoxError>(e),
                    }
                }
                Ok(())
            })
        })
        .collect();
    for l in loops {
        l.await??;
    }
    Ok(start.elapsed())
}

/// Whether a hand loop's error is worth running the round again for.
fn retryable(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    if let Some(e) = e.downcast_ref::<orderly::Error>() {
        return e.is_retryable();
    }
    let text = e.to_string();
    [
        "deadlock",
        "Deadlock",
        "database is locked",
        "lock wait",
        "could not serialize",
    ]
    .iter()
    .any(|w| text.contains(w))
}

/// `--timers` due timers drained by four jobs (`timers`) and four hand loops
/// (`timer-hand`), each twice, alternating; then timers falling due at 1,000 a second for
/// `--seconds` (at most 5 s), fired by four jobs as a service runs them, for their
/// lateness on the database's clock; then 5,000 timers due at once, for the time four
/// such jobs take to fire them. Returns the `timers …` line.
pub(crate) async fn timers_pass<B: BenchDb>(db: &Arc<B>, args: &Args) -> Result<String, BoxError> {
    let n = args.timers.max(4);
    let engine: Engine<TimerMachine, B::S> = Engine::new(db.engine().store().clone())?;
    let (mut job_time, mut hand_time) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..2 {
        seed(&**db, n, |_| "0".into()).await?;
        job_time += jobs::<B>(&engine, n, Duration::from_millis(1)).await?;
        let fired = db
            .count(
                "SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED' AND outcome = 'applied'".into(),
            )
            .await?;
        // Each timer fired once: as many cancellations in the history as timers.
        let moved = db
            .count(format!(
                "SELECT COUNT(*) FROM orderly_transitions WHERE order_id >= {BASE} AND event = 'Cancel'"
            ))
            .await?;
        if fired != n || moved != n {
            return Err(format!(
                "the jobs fired {fired} of {n} timers, with {moved} cancellations"
            )
            .into());
        }
        seed(&**db, n, |_| "0".into()).await?;
        hand_time += hands(db, &engine, n).await?;
        let fired = db
            .count("SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED'".into())
            .await?;
        if fired != n {
            return Err(format!("the hand loops fired {fired} of {n} timers").into());
        }
    }
    let per_s = |t: Duration| 2.0 * n as f64 / t.as_secs_f64();
    let (job_rate, hand_rate) = (per_s(job_time), per_s(hand_time));
    for (mode, rate, time) in [
        ("timers", job_rate, job_time),
        ("timer-hand", hand_rate, hand_time),
    ] {
        println!(
            "  4  {mode:<12} {:>9} {rate:>10.0} {:>9} {:>9} {:>9.2}",
            2 * n,
            "-",
            format!("{:.0}s", time.as_secs_f64()),
            rate / hand_rate
        );
    }
    // A steady 1,000 timers a second, due from a second after the seed on the database's
    // clock, fired by four jobs as a service runs them.
    let seconds = args.seconds.clamp(0.2, 5.0);
    let steady = (1000.0 * seconds) as i64;
    let now = db.now_ms_sql();
    seed(&**db, steady, |i| format!("{now} + 1000 + {i}")).await?;
    run_jobs(db, &engine, steady).await?;
    let (p50, p99) = lateness(&**db).await?;
    // 5,000 timers due at once, drained by four jobs as a service runs them.
    seed(&**db, DRAIN, |_| now.to_string()).await?;
    let drain = run_jobs(db, &engine, DRAIN).await?;
    let (_, drain_p99) = lateness(&**db).await?;
    clear(&**db).await?;
    Ok(format!(
        "timers backend={} jobs=4 timers={n} job_per_s={job_rate:.0} hand_per_s={hand_rate:.0} job_vs_hand={:.2} steady_per_s=1000 steady_timers={steady} lateness_p50_ms={p50} lateness_p99_ms={p99} drain_timers={DRAIN} drain_ms={} drain_lateness_p99_ms={drain_p99}",
        args.backend,
        job_rate / hand_rate,
        drain.as_millis(),
    ))
}
