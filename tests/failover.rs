//! A PostgreSQL failover under load: a Patroni pair behind one HAProxy endpoint
//! (`.ci/patroni.sh`), the primary SIGKILLed while every layer runs through the endpoint,
//! the standby promoted. Four loads at once, each re-sending what failed until it is
//! answered: transitions (on an engine coalescing writes into units and on one writing
//! each alone), `Records::run` requests, flows with
//! keyed steps (and a recovery job), and the outbox relay publishing the transitions'
//! events. Round one kills the primary's postmaster, round two the whole node, Patroni
//! too (then starts it again).
//!
//! What holds, each round: every error on the way is retryable and comes within the
//! deadline; every answered call is what the promoted primary holds (a transition's
//! history row once, a request's effect once, a flow completed with its local effects
//! once and its downstream calls made with their own keys only); a re-sent call that
//! had landed is answered from what was recorded, never applied twice; the relay
//! publishes every event, in version order per order, again only what it published but
//! could not record. Its own test binary: no other test may run on the cluster it kills.
//!
//! Endpoint: `ORDERLY_PATRONI_URL` (default `postgres://postgres@127.0.0.1:15430/postgres`).

mod conformance;
mod server;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use conformance::flows::{Order, Shop, World, config, shop_on};
use conformance::outbox::{Recorder, RecordingSink};
use orderly::flow::{Flows, Listing, Started};
use orderly::outbox::{Outbox, Relay, RelayConfig};
use orderly::{Done, Engine, EngineConfig, Error, Outcome, PgStore, Records, ScopeConfig};
use sqlx::PgConnection;
use tokio::task::JoinHandle;

orderly::state_machine! {
    /// An order paid, then shipped; both emit an event.
    pub FailoverOrder {
        states: FailoverState { Created, Paid, Shipped }
        events: FailoverEvent { Pay, Ship }
        initial: Created;
        terminal: [Shipped];
        transitions: {
            Created + Pay  => Paid    emits OrderPaid,
            Paid    + Ship => Shipped emits OrderShipped,
        }
    }
}

/// The deadline of the engine, the records and the flows.
const DEADLINE: Duration = Duration::from_secs(5);
/// The lease of a request's record and of a flow's runner.
const LEASE: Duration = Duration::from_secs(3);

fn url() -> String {
    std::env::var("ORDERLY_PATRONI_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:15430/postgres".into())
}

/// What `.ci/patroni.sh` with some arguments did.
struct Script {
    ok: bool,
    stdout: String,
    /// Its progress lines, and on a failure the cluster's view and its logs' ends.
    stderr: String,
}

/// `.ci/patroni.sh` with `args`.
fn patroni(args: &[&str]) -> Script {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/patroni.sh");
    match Command::new("bash").arg(script).args(args).output() {
        Ok(out) => Script {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Err(e) => panic!("patroni.sh {args:?}: {e}"),
    }
}

/// [`patroni`] off the runtime's workers, asserting it succeeded; its standard output.
async fn patroni_must(args: &[&str]) -> String {
    let owned: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let done = tokio::task::spawn_blocking(move || {
        patroni(&owned.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    assert!(done.ok, "patroni.sh {args:?} failed:\n{}", done.stderr);
    done.stdout
}

/// Waits until the pair has a running leader and a running sync standby.
async fn healthy() {
    let since = Instant::now();
    loop {
        let status = tokio::task::spawn_blocking(|| patroni(&["status"]))
            .await
            .unwrap();
        if status.ok {
            return;
        }
        assert!(
            since.elapsed() < Duration::from_secs(90),
            "the pair did not heal: {}",
            status.stdout
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One call of a load: what it was for, when it was asked, how long it took, its answer.
struct Call<K, T> {
    key: K,
    asked: Instant,
    took: Duration,
    answer: Result<T, Error>,
}

impl<K, T> Call<K, T> {
    fn answered(&self) -> Instant {
        self.asked + self.took
    }
}

/// Sends `send` until it is answered (anything but a retryable error), or a minute has
/// passed; every call is kept. Whether it was answered.
async fn until_answered<K: Clone, T, F, Fut>(
    key: &K,
    calls: &mut Vec<Call<K, T>>,
    mut send: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let since = Instant::now();
    loop {
        let asked = Instant::now();
        let answer = send().await;
        let took = asked.elapsed();
        let again = answer.as_ref().err().is_some_and(Error::is_retryable)
            && since.elapsed() < Duration::from_secs(60);
        let ok = answer.is_ok();
        calls.push(Call {
            key: key.clone(),
            asked,
            took,
            answer,
        });
        if !again {
            return ok;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the loads share: when to stop, and how far each got.
#[derive(Clone, Default)]
struct Shared {
    stop: Arc<AtomicBool>,
    /// Set once the kill has been sent.
    killed: Arc<AtomicBool>,
    /// Set once every other load has ended: the relay then drains the outbox and stops.
    drain: Arc<AtomicBool>,
    applied: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    flows: Arc<AtomicUsize>,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// When the kill was sent: just before the script ran, and when it returned.
#[derive(Clone, Copy)]
struct Kill {
    sent: Instant,
    returned: Instant,
}

/// Everything the rounds run on, over one endpoint.
struct Lab {
    /// Coalescing writes into units (the default).
    engine: Engine<FailoverOrder, PgStore>,
    /// Writing each request alone.
    alone: Engine<FailoverOrder, PgStore>,
    records: Records<PgStore>,
    store: PgStore,
}

/// Literal SQL on a PostgreSQL connection, for the flows' local steps.
fn exec_pg(
    conn: &mut PgConnection,
    sql: String,
) -> orderly::idempotency::Work<'_, Result<(), sqlx::Error>> {
    Box::pin(async move {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .map(drop)
    })
}

/// Writes of transitions the engine read back after their connection failed ("write in
/// doubt"), counted from its debug events.
static IN_DOUBT: AtomicUsize = AtomicUsize::new(0);

/// A tracing subscriber that takes only the engine's in-doubt events, and counts them.
struct InDoubtCounter;

impl tracing::Subscriber for InDoubtCounter {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.is_event() && meta.target() == "orderly::engine::settle"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}").starts_with("write in doubt");
                }
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            IN_DOUBT.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Patroni pair of .ci/patroni.sh; run with --ignored"]
async fn every_layer_survives_the_primary_killed() {
    tracing::subscriber::set_global_default(InDoubtCounter).unwrap();
    let store = PgStore::demo(&url()).await.unwrap();
    orderly::backend::postgres::migrate(store.pool())
        .await
        .unwrap();
    for sql in [
        "CREATE TABLE IF NOT EXISTS failover_effects (idem_key TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS flow_effects (flow_key VARCHAR(255) NOT NULL, what VARCHAR(64) NOT NULL)",
    ] {
        sqlx::raw_sql(sql).execute(store.pool()).await.unwrap();
    }
    let engine = Engine::new(store.clone()).unwrap();
    let alone = Engine::with_config(
        store.clone(),
        EngineConfig::default().coalesce_writes(false),
    )
    .unwrap();
    let records = Records::new(store.clone())
        .scope(
            "payments",
            ScopeConfig::new(LEASE, Duration::from_secs(3600)),
        )
        .unwrap()
        .deadline(DEADLINE)
        .unwrap();
    let lab = Lab {
        engine,
        alone,
        records,
        store,
    };
    healthy().await;
    // The primary's postmaster: Patroni demotes it, the standby is promoted, and the old
    // primary comes back as a standby by itself.
    round(&lab, "postmaster", "kill-postgres").await;
    healthy().await;
    // The whole node, Patroni too: the leader key runs out first. It is started again.
    let killed = round(&lab, "node", "kill-node").await;
    patroni_must(&["restart", &killed]).await;
    healthy().await;
}

/// Every load through the endpoint while `kill` (`kill-postgres` or `kill-node`) hits
/// the primary; then the checks. The node killed (`1` or `2`).
async fn round(lab: &Lab, what: &'static str, kill: &str) -> String {
    // Keys and ids of this round only.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = stamp * 1000;
    let prefix = format!("{what}-{stamp}");
    let shared = Shared::default();
    let doubts = IN_DOUBT.load(Ordering::SeqCst);
    let world = Arc::new(World::default());
    let flows = Flows::new(lab.store.clone(), config(LEASE).deadline(DEADLINE))
        .unwrap()
        .register(shop_on::<PgStore>(&world, exec_pg))
        .unwrap();
    let rec = Arc::new(Recorder::default());
    // Flows whose runner died before the kill (a panic at their reservation), held until
    // their lease runs out: the recovery job, which starts its rounds at the kill, must
    // finish them on the promoted primary.
    const STRANDED: usize = 4;
    let stranded: Vec<String> = (0..STRANDED)
        .map(|i| format!("{prefix}-stranded-{i}"))
        .collect();
    for (i, key) in stranded.iter().enumerate() {
        world.panic_at("Reserve:before");
        let (f, key) = (flows.clone(), key.clone());
        let order = Order {
            id: base + 900_000 + i as i64,
            amount: 1,
        };
        let start = tokio::spawn(async move { f.start(Shop, &key, &order).await });
        assert!(
            start.await.is_err(),
            "{what}: a stranded flow's runner lived"
        );
    }

    let transitions = transitions_load(lab, base, &shared);
    let requests: Vec<_> = (0..2)
        .map(|t| requests_load(lab.records.clone(), format!("{prefix}-{t}"), shared.clone()))
        .collect();
    let starts: Vec<_> = (0..2)
        .map(|t| {
            flows_load(
                flows.clone(),
                format!("{prefix}-{t}"),
                base + t * 10_000,
                shared.clone(),
            )
        })
        .collect();
    let recovery = recovery_load(flows.clone(), shared.clone());
    // Two relays, whose claims race for the same events.
    let relaying: Vec<_> = (0..2)
        .map(|n| relay_load(lab.store.clone(), n, rec.clone(), shared.clone()))
        .collect();
    let running = |transitions: &[JoinHandle<_>]| transitions.iter().all(|h| !h.is_finished());

    // Every load under way, then the kill.
    let since = Instant::now();
    while (shared.applied.load(Ordering::SeqCst) < 150
        || shared.requests.load(Ordering::SeqCst) < 20
        || shared.flows.load(Ordering::SeqCst) < 5
        || rec.received().len() < 50)
        && since.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        since.elapsed() < Duration::from_secs(60),
        "{what}: the loads never got going: {} applied, {} requests, {} flows, {} published",
        shared.applied.load(Ordering::SeqCst),
        shared.requests.load(Ordering::SeqCst),
        shared.flows.load(Ordering::SeqCst),
        rec.received().len()
    );
    assert!(
        running(&transitions),
        "{what}: a client ended before the kill"
    );
    let before = patroni_must(&["primary"]).await;
    let at_kill = (
        shared.applied.load(Ordering::SeqCst),
        shared.requests.load(Ordering::SeqCst),
        shared.flows.load(Ordering::SeqCst),
    );
    let node = before.trim_start_matches('n').to_string();
    let sent = Instant::now();
    patroni_must(&[kill, &node]).await;
    let kill = Kill {
        sent,
        returned: Instant::now(),
    };
    shared.killed.store(true, Ordering::SeqCst);
    // Until each load has gone on well past the promotion.
    while (shared.applied.load(Ordering::SeqCst) < at_kill.0 + 300
        || shared.requests.load(Ordering::SeqCst) < at_kill.1 + 20
        || shared.flows.load(Ordering::SeqCst) < at_kill.2 + 5)
        && kill.returned.elapsed() < Duration::from_secs(90)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        kill.returned.elapsed() < Duration::from_secs(90),
        "{what}: the loads did not go on after the kill: {} applied, {} requests, {} flows \
         (at the kill {at_kill:?})",
        shared.applied.load(Ordering::SeqCst),
        shared.requests.load(Ordering::SeqCst),
        shared.flows.load(Ordering::SeqCst)
    );
    assert!(
        running(&transitions),
        "{what}: a client ended before the round stopped"
    );
    shared.stop.store(true, Ordering::SeqCst);
    let transitions = join_all(transitions).await;
    let requests = join_all(requests).await;
    let starts = join_all(starts).await;
    let recovery = recovery.await.unwrap();
    // Every transition is answered by now, its event written if it landed.
    shared.drain.store(true, Ordering::SeqCst);
    let (mut relay_rounds, mut unrecorded) = (Vec::new(), Unrecorded::new());
    for r in relaying {
        let (rounds, not_recorded) = r.await.unwrap();
        relay_rounds.extend(rounds);
        unrecorded.extend(not_recorded);
    }
    let after = patroni_must(&["primary"]).await;
    assert_ne!(before, after, "{what}: the primary did not change");

    // The outage: from the kill to the first Applied of a transition asked after it.
    let back = transitions
        .iter()
        .filter(|c| c.asked > kill.returned && matches!(c.answer, Ok(Outcome::Applied { .. })))
        .map(Call::answered)
        .min()
        .unwrap_or_else(|| panic!("{what}: nothing applied after the kill"));
    let outage = Outage { what, kill, back };
    println!(
        "failover ({what} killed): primary {before} -> {after}; first Applied of a transition \
         asked after the kill {:.1?} after it",
        back - kill.sent
    );
    let t = outage.judge(
        "transitions",
        &transitions,
        DEADLINE + Duration::from_secs(2),
    );
    assert!(t.met > 0, "{what}: no transition met the failover ({t:?})");
    // A request waits for its claim, its work (bounded by the lease) and its finish.
    let r = outage.judge(
        "requests",
        &requests,
        2 * DEADLINE + LEASE + Duration::from_secs(2),
    );
    let f = outage.judge("flow starts", &starts, DEADLINE + Duration::from_secs(2));
    let rr = outage.judge("relay rounds", &relay_rounds, Duration::from_secs(30));
    outage.judge("recovery rounds", &recovery, Duration::from_secs(30));
    for (name, judged) in [("requests", &r), ("flow starts", &f), ("relay rounds", &rr)] {
        assert!(
            judged.met > 0,
            "{what}: no {name} met the failover ({judged:?})"
        );
        assert!(
            judged.after > 0,
            "{what}: no {name} answered after the failover ({judged:?})"
        );
    }

    check_transitions(lab, what, &transitions).await;
    let units = lab.engine.coalesced_writes();
    println!(
        "failover ({what} killed): transitions: {} writes left in doubt by a lost \
         connection and read back by their write id; so far {} units carried {} requests, \
         {} units failed (their requests each went their own way)",
        IN_DOUBT.load(Ordering::SeqCst) - doubts,
        units.units,
        units.requests,
        units.failed
    );
    check_requests(lab, what, &prefix, &requests).await;
    let taken = recovery
        .iter()
        .filter_map(|r| r.answer.as_ref().ok())
        .sum::<usize>()
        + settle(&flows, what).await;
    println!("failover ({what} killed): flows: {taken} taken over by the recovery job");
    assert!(
        taken >= STRANDED,
        "{what}: the recovery job took {taken} flows, fewer than the {STRANDED} stranded"
    );
    check_flows(lab, what, &prefix, &starts, &stranded, &world).await;
    check_relay(lab, what, &transitions, &rec, &unrecorded).await;
    node
}

// After the items above, which they use.
#[path = "failover/checks.rs"]
mod checks;
#[path = "failover/loads.rs"]
mod loads;

use checks::*;
use loads::*;
