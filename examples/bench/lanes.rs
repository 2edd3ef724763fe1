//! How a mode is run and measured: slices of calls on lanes of order ids, latencies, CPU
//! per operation, and a layer's pass against its hand-written writes.

use super::*;

#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    pub(crate) ops: u64,
    pub(crate) secs: f64,
    pub(crate) micros: Vec<u32>,
    /// CPU this process (the client: driver, pool, engine) spent, in microseconds.
    pub(crate) client_cpu: f64,
    /// CPU the whole machine spent (all cores, from `/proc/stat`), in microseconds:
    /// the client, the database server, and any background load.
    pub(crate) machine_cpu: f64,
}

/// CPU time of this process, in microseconds.
pub(crate) fn process_cpu_micros() -> f64 {
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
pub(crate) fn machine_cpu_micros() -> f64 {
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
    pub(crate) fn throughput(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    /// CPU microseconds per operation: (the client's, everything else's).
    pub(crate) fn cpu_per_op(&self) -> (f64, f64) {
        let ops = self.ops.max(1) as f64;
        let other = (self.machine_cpu - self.client_cpu).max(0.0);
        (self.client_cpu / ops, other / ops)
    }

    pub(crate) fn percentile(&self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return 0.0;
        }
        let i = ((self.micros.len() as f64 - 1.0) * p).round() as usize;
        self.micros[i] as f64 / 1000.0
    }
}

impl Stats {
    pub(crate) fn absorb(&mut self, slice: Stats) {
        self.ops += slice.ops;
        self.secs += slice.secs;
        self.client_cpu += slice.client_cpu;
        self.machine_cpu += slice.machine_cpu;
        self.micros.extend(slice.micros);
    }

    pub(crate) fn finish(mut self) -> Self {
        self.micros.sort_unstable();
        self
    }
}

/// One mode's ids: `first + n` for the n-th operation of the mode, across slices;
/// `cycle` wraps around (replays) instead of stopping at `span`.
pub(crate) struct Lane {
    pub(crate) first: i64,
    pub(crate) cursor: Arc<AtomicI64>,
    pub(crate) stats: Stats,
}

impl Lane {
    pub(crate) fn new(first: i64) -> Self {
        Lane {
            first,
            cursor: Arc::new(AtomicI64::new(0)),
            stats: Stats::default(),
        }
    }

    /// How many ids this lane has used (all of them completed).
    pub(crate) fn used(&self, span: i64) -> i64 {
        self.cursor.load(Ordering::Relaxed).min(span)
    }

    /// A slice of `Engine::transition` calls, every one of which must apply.
    pub(crate) async fn engine_slice<S: Store>(
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
    pub(crate) async fn batch_slice<F, Fut>(
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
    pub(crate) async fn slice<F, Fut>(
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

/// A layer's pass at `c` callers, on a reset database: its write mode (`names[0]`, run
/// by `write`), the same writes by hand (`names[1]`, by `hand`) and replays of the
/// requests the write mode completed (`names[2]`, by `replay`), alternating in slices
/// (half the orders each for the two write modes). Prints a row per mode, the `vs
/// floor` column against the hand mode, and returns the ratio line `{label} backend=…
/// c=… {ratios[0]}=write/hand {ratios[1]}=replay/write`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn layer_pass<B, W, WF, H, HF, R, RF>(
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

/// Runs `pass` and prints its name, callers and wall time to stderr (the ratio lines
/// go to stdout), so that a slow pass shows where a run's time went.
pub(crate) async fn timed<T>(name: &str, c: usize, pass: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = pass.await;
    eprintln!(
        "# pass {name} c={c}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    out
}
