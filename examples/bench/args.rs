//! The bench's command line: its options, parsed by hand, and its usage text.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct Args {
    pub(super) backend: String,
    pub(super) orders: i64,
    pub(super) concurrency: Vec<usize>,
    pub(super) seconds: f64,
    pub(super) history_rows: i64,
    pub(super) rounds: u32,
    pub(super) explain: bool,
    pub(super) compare_history: Option<i64>,
    pub(super) redis: Option<String>,
    pub(super) deadline_ms: u64,
    pub(super) relay_events: i64,
    pub(super) timers: i64,
    pub(super) nats: Option<String>,
    pub(super) kafka: Option<String>,
    pub(super) traced: bool,
    /// Every unit through the pool (`keep_connection(false)` on PostgreSQL).
    pub(super) pooled_units: bool,
    /// History rows of the admin mode, if it runs.
    pub(super) admin_history: Option<i64>,
    /// The part run alone, if one is.
    pub(super) only: Option<Only>,
}

/// A part of the bench that can run alone (`--only`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Only {
    Engine,
    Layers,
    Guarded,
    Relay,
    Hot,
    Http,
    Timers,
    Admin,
}

impl Args {
    /// Whether this run includes `part`.
    pub(super) fn runs(&self, part: Only) -> bool {
        self.only.is_none_or(|only| only == part)
    }
}

pub(super) fn parse_args() -> Result<Args, BoxError> {
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
        kafka: None,
        traced: false,
        pooled_units: false,
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
            "--kafka" => args.kafka = Some(value()?),
            "--traced" => args.traced = true,
            "--pooled-units" => args.pooled_units = true,
            "--admin-history" => args.admin_history = Some(value()?.parse()?),
            "--only" => match value()?.as_str() {
                "engine" => args.only = Some(Only::Engine),
                "layers" => args.only = Some(Only::Layers),
                "guarded" => args.only = Some(Only::Guarded),
                "relay" => args.only = Some(Only::Relay),
                "hot" => args.only = Some(Only::Hot),
                "http" => args.only = Some(Only::Http),
                "timers" => args.only = Some(Only::Timers),
                "admin" => args.only = Some(Only::Admin),
                other => {
                    return Err(format!(
                        "--only {other}: only `engine`, `layers`, `guarded`, `relay`, `hot`, `http`, `timers` or `admin` can run alone"
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
pub(super) const USAGE: &str = "\
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
  --kafka BROKERS                   also relay to a Kafka-protocol broker (feature `kafka`;
                                    a topic of the bench's own; a `relay_kafka` line)
  --traced                          also the outbox and relay passes again with a
                                    `tracing-opentelemetry` layer recording every span
                                    (feature `otel`; a `traced` line)
  --pooled-units                    every conversation of the store's (units, claims,
                                    steps) takes a connection from the pool and gives it
                                    back (PostgreSQL: `keep_connection(false)`), to
                                    compare
  --only engine                     the engine mode alone, nothing else (a table per
                                    concurrency; for a profiler)
  --only layers                     the records and flows modes alone (their tables,
                                    `records` and `flows` lines per concurrency)
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
`guarded`, `relay`, `timers`, `deadline` (and `front`, `scale`, `relay_kafka`, `traced`)
lines; docs/benchmarks.md reads them.
";
