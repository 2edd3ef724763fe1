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
    let store = PgStore::connect(&url()).await.unwrap();
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

async fn join_all<T>(handles: Vec<JoinHandle<Vec<T>>>) -> Vec<T> {
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    all
}

type Transition = Call<(i64, FailoverEvent), Outcome<FailoverState>>;

/// Eight tasks walking orders of their own until the round stops, Pay then Ship, each
/// call re-sent until it is answered; half of them on the coalescing engine, half on the
/// one writing alone.
fn transitions_load(lab: &Lab, base: i64, shared: &Shared) -> Vec<JoinHandle<Vec<Transition>>> {
    const TASKS: i64 = 8;
    // Orders of one task: ids far apart, and as many as the round walks.
    const SPAN: i64 = 1_000_000;
    (0..TASKS)
        .map(|t| {
            // Half the tasks on each engine.
            let engine = if t % 2 == 0 { &lab.engine } else { &lab.alone };
            let (engine, shared) = (engine.clone(), shared.clone());
            tokio::spawn(async move {
                let mut calls = Vec::new();
                for n in 0..SPAN {
                    let id = base + t * SPAN + n;
                    // Created as it is reached (a create is answered alike if re-sent).
                    let since = Instant::now();
                    while let Err(e) = engine.create(id).await {
                        assert!(
                            e.is_retryable() && since.elapsed() < Duration::from_secs(60),
                            "creating order {id}: {e:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    for (event, reference) in [
                        (FailoverEvent::Pay, "pay-1"),
                        (FailoverEvent::Ship, "ship-1"),
                    ] {
                        until_answered(&(id, event), &mut calls, || {
                            let engine = engine.clone();
                            async move { engine.transition(id, event, reference).await }
                        })
                        .await;
                        if matches!(
                            calls.last(),
                            Some(Call {
                                answer: Ok(Outcome::Applied { .. }),
                                ..
                            })
                        ) {
                            shared.applied.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    if shared.stopping() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                calls
            })
        })
        .collect()
}

/// Requests one after another, each writing its effect row in the record's transaction;
/// the answer is whether it was replayed.
fn requests_load(
    records: Records<PgStore>,
    prefix: String,
    shared: Shared,
) -> JoinHandle<Vec<Call<String, bool>>> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        let mut i = 0;
        while !shared.stopping() {
            let key = format!("{prefix}-{i}");
            i += 1;
            let answered = until_answered(&key, &mut calls, || {
                let (records, k) = (records.clone(), key.clone());
                async move {
                    let effect = k.clone();
                    records
                        .run("payments", &k, &1, move |conn| {
                            Box::pin(async move {
                                sqlx::query("INSERT INTO failover_effects (idem_key) VALUES ($1)")
                                    .bind(&effect)
                                    .execute(&mut *conn)
                                    .await?;
                                Ok::<_, Error>(Done::<(), ()>::Succeeded(()))
                            })
                        })
                        .await
                        .map(|ran| ran.replayed)
                }
            })
            .await;
            if answered {
                shared.requests.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        calls
    })
}

/// Shop flows one after another (a local insert, a keyed reservation, a local coupon, a
/// keyed charge, a keyed shipment), each start re-sent until it is answered.
fn flows_load(
    flows: Flows<PgStore>,
    prefix: String,
    first: i64,
    shared: Shared,
) -> JoinHandle<Vec<Call<String, Started>>> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        let mut i = 0;
        while !shared.stopping() {
            let key = format!("{prefix}-{i}");
            let order = Order {
                id: first + i,
                amount: 100,
            };
            i += 1;
            let answered = until_answered(&key, &mut calls, || {
                let (flows, key, order) = (flows.clone(), key.clone(), order.clone());
                async move { flows.start(Shop, &key, &order).await }
            })
            .await;
            if answered {
                shared.flows.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        calls
    })
}

/// A job's round: its number, and how many it took or published.
type Round = Call<usize, usize>;

/// Events a relay published but could not record, as `(entity, version)`.
type Unrecorded = HashSet<(i64, i64)>;

/// The flows' recovery job from the kill on, a round every 200 ms: how many it took, per round.
fn recovery_load(flows: Flows<PgStore>, shared: Shared) -> JoinHandle<Vec<Round>> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        let mut n = 0;
        while !shared.killed.load(Ordering::SeqCst) && !shared.stopping() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while !shared.stopping() {
            let asked = Instant::now();
            let answer = flows.recover(16).await.map(|r| r.taken);
            calls.push(Call {
                key: n,
                asked,
                took: asked.elapsed(),
                answer,
            });
            n += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        calls
    })
}

/// Relay number `n`, round after round: how many each published. Its error rounds back
/// off. It goes on after the other loads have ended, until the outbox is empty; the
/// events it published but could not record are kept.
fn relay_load(
    store: PgStore,
    n: usize,
    rec: Arc<Recorder>,
    shared: Shared,
) -> JoinHandle<(Vec<Round>, Unrecorded)> {
    let outbox = Outbox::new(store.clone());
    let relay = Relay::new(store, RecordingSink::new(rec.clone(), n))
        .with_config(
            RelayConfig::default()
                .batch(16)
                .lease(LEASE)
                .publish_timeout(Duration::from_secs(1))
                .idle(Duration::from_millis(5)),
        )
        .unwrap();
    tokio::spawn(async move {
        let (mut calls, mut unrecorded) = (Vec::new(), HashSet::new());
        let mut round = 0;
        let mut stopped: Option<Instant> = None;
        loop {
            let asked = Instant::now();
            let answer = rec
                .round_noting_unrecorded(&relay, n, &mut unrecorded)
                .await
                .map(|r| r.published);
            let failed = answer.is_err();
            calls.push(Call {
                key: round,
                asked,
                took: asked.elapsed(),
                answer,
            });
            round += 1;
            if shared.drain.load(Ordering::SeqCst) {
                let since = *stopped.get_or_insert_with(Instant::now);
                if outbox.stats().await.is_ok_and(|s| s.pending == 0) {
                    break;
                }
                assert!(
                    since.elapsed() < Duration::from_secs(120),
                    "the relay never drained the outbox"
                );
            }
            let pause = if failed { 100 } else { 3 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        (calls, unrecorded)
    })
}

/// The outage of one round: from the kill to the first transition applied after it.
struct Outage {
    what: &'static str,
    kill: Kill,
    back: Instant,
}

/// What one load's calls met.
#[derive(Debug)]
struct Judged {
    calls: usize,
    /// Answered with a (retryable) error.
    errors: usize,
    /// In flight at some moment of the outage (asked before its end, answered after the
    /// kill had been sent).
    spanning: usize,
    /// Of those, failed or held up half a second or more.
    met: usize,
    /// Answered, asked after the outage.
    after: usize,
    /// Answered within their deadline.
    within: usize,
}

impl Outage {
    /// Every error retryable, every call within `bound`; what the calls met, printed.
    fn judge<K, T>(&self, layer: &str, calls: &[Call<K, T>], bound: Duration) -> Judged {
        let what = self.what;
        for c in calls {
            if let Err(e) = &c.answer {
                assert!(e.is_retryable(), "{what}: {layer}: {e:?}");
            }
        }
        let spanning: Vec<_> = calls
            .iter()
            .filter(|c| c.asked < self.back && c.answered() > self.kill.returned)
            .collect();
        let judged = Judged {
            calls: calls.len(),
            errors: calls.iter().filter(|c| c.answer.is_err()).count(),
            spanning: spanning.len(),
            met: spanning
                .iter()
                .filter(|c| c.answer.is_err() || c.took >= Duration::from_millis(500))
                .count(),
            after: calls
                .iter()
                .filter(|c| c.asked >= self.back && c.answer.is_ok())
                .count(),
            within: calls.iter().filter(|c| c.took <= bound).count(),
        };
        println!(
            "failover ({what} killed): {layer}: {} calls, {} answered with a retryable error, \
             {} in flight during the outage ({} of them failed or held up), {} answered after \
             it, {} of {} within {bound:?}",
            judged.calls,
            judged.errors,
            judged.spanning,
            judged.met,
            judged.after,
            judged.within,
            judged.calls
        );
        assert_eq!(
            judged.within, judged.calls,
            "{what}: {layer}: calls waited past {bound:?}"
        );
        judged
    }
}

/// Keys whose first call is answered `first_replayed`, and keys whose call was re-sent
/// after an error and answered `resent_replayed` (a write that had landed, answered
/// from the record).
fn replays<K: Clone + Eq + std::hash::Hash, T>(
    calls: &[Call<K, T>],
    replayed: impl Fn(&T) -> bool,
) -> (Vec<K>, usize) {
    let mut firsts = Vec::new();
    let mut seen: HashMap<K, bool> = HashMap::new();
    let mut in_doubt = 0;
    for c in calls {
        let failed_before = seen.get(&c.key).copied();
        if let Ok(t) = &c.answer {
            match failed_before {
                None if replayed(t) => firsts.push(c.key.clone()),
                Some(true) if replayed(t) => in_doubt += 1,
                _ => {}
            }
        }
        let failed = failed_before.unwrap_or(false) || c.answer.is_err();
        seen.insert(c.key.clone(), failed);
    }
    (firsts, in_doubt)
}

/// Every acknowledged transition in the promoted primary's history once, as answered;
/// none applied twice; none answered Replayed on its first send.
async fn check_transitions(lab: &Lab, what: &str, calls: &[Transition]) {
    // Each key's answer (a call is re-sent only after an error, so one per key), as
    // `(from, to, version)`.
    let mut answered: HashMap<(i64, FailoverEvent), (FailoverState, FailoverState, i64)> =
        HashMap::new();
    let mut applied = 0;
    for c in calls {
        let answer = match c.answer {
            Ok(Outcome::Applied { from, to, version }) => {
                applied += 1;
                (from, to, version)
            }
            Ok(Outcome::Replayed { from, to, version }) => (from, to, version),
            Err(_) => continue,
        };
        assert!(
            answered.insert(c.key, answer).is_none(),
            "{what}: {:?} answered twice",
            c.key
        );
    }
    let reached: HashSet<_> = calls.iter().map(|c| c.key).collect();
    assert_eq!(
        reached.len(),
        answered.len(),
        "{what}: transitions never answered"
    );
    for (&(id, event), answer) in &answered {
        let history = lab.engine.history(id).await.unwrap();
        let rows: Vec<_> = history.iter().filter(|r| r.event == event).collect();
        assert_eq!(
            rows.len(),
            1,
            "{what}: order {id} {event:?}: {} history rows",
            rows.len()
        );
        assert_eq!(
            *answer,
            (rows[0].from, rows[0].to, rows[0].seq),
            "{what}: order {id} {event:?} answered otherwise than recorded"
        );
    }
    let (firsts, in_doubt) = replays(calls, |o| matches!(o, Outcome::Replayed { .. }));
    assert!(
        firsts.is_empty(),
        "{what}: sent once, answered Replayed: {firsts:?}"
    );
    println!(
        "failover ({what} killed): transitions: {} acknowledged, {applied} applied; \
         {in_doubt} re-sent after an error had landed and were answered Replayed",
        answered.len()
    );
}

/// Every answered request's effect once and its record succeeded; none replayed on its
/// first send; no request's effect twice.
async fn check_requests(lab: &Lab, what: &str, prefix: &str, calls: &[Call<String, bool>]) {
    let like = format!("{prefix}-%");
    let effects: HashMap<String, i64> = sqlx::query_as(
        "SELECT idem_key, COUNT(*) FROM failover_effects WHERE idem_key LIKE $1 GROUP BY idem_key",
    )
    .bind(&like)
    .fetch_all(lab.store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let status: HashMap<String, String> = sqlx::query_as(
        "SELECT idem_key, status FROM idempotency_records WHERE scope = 'payments' AND idem_key LIKE $1",
    )
    .bind(&like)
    .fetch_all(lab.store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let answered: HashSet<&String> = calls
        .iter()
        .filter(|c| c.answer.is_ok())
        .map(|c| &c.key)
        .collect();
    let reached: HashSet<&String> = calls.iter().map(|c| &c.key).collect();
    assert_eq!(
        reached.len(),
        answered.len(),
        "{what}: requests never answered"
    );
    for (key, n) in &effects {
        assert_eq!(*n, 1, "{what}: request {key}: its effect {n} times");
    }
    for key in &answered {
        assert_eq!(
            effects.get(*key),
            Some(&1),
            "{what}: request {key}: no effect"
        );
        assert_eq!(
            status.get(*key).map(String::as_str),
            Some("SUCCEEDED"),
            "{what}: request {key}"
        );
    }
    let (firsts, in_doubt) = replays(calls, |r| *r);
    assert!(firsts.is_empty(), "{what}: sent once, replayed: {firsts:?}");
    println!(
        "failover ({what} killed): requests: {} answered, {in_doubt} re-sent after an \
         error had landed and were replayed",
        answered.len()
    );
}

/// Recovery rounds until no flow runs or is due; how many flows they took.
async fn settle(flows: &Flows<PgStore>, what: &str) -> usize {
    let since = Instant::now();
    let mut taken = 0;
    loop {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "{what}: the flows never settled"
        );
        if let Ok(round) = flows.recover(100).await {
            taken += round.taken;
        }
        let running = flows.list(Listing::Running, None, 1).await;
        let stuck = flows.list(Listing::Stuck, None, 1).await;
        if let (Ok(running), Ok(stuck)) = (running, stuck)
            && running.is_empty()
            && stuck.is_empty()
        {
            return taken;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every flow completed (the stranded ones too), its local effects once, its downstream calls made with their
/// own keys only; none replayed on its first start.
async fn check_flows(
    lab: &Lab,
    what: &str,
    prefix: &str,
    calls: &[Call<String, Started>],
    stranded: &[String],
    world: &World,
) {
    let like = format!("{prefix}-%");
    let started: HashSet<&String> = calls.iter().map(|c| &c.key).collect();
    let answered: HashSet<&String> = calls
        .iter()
        .filter(|c| c.answer.is_ok())
        .map(|c| &c.key)
        .collect();
    assert_eq!(
        started.len(),
        answered.len(),
        "{what}: flow starts never answered"
    );
    let keys: HashSet<&String> = started.into_iter().chain(stranded).collect();
    let status: HashMap<String, String> =
        sqlx::query_as("SELECT flow_key, status FROM flows WHERE flow_key LIKE $1")
            .bind(&like)
            .fetch_all(lab.store.pool())
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(status.len(), keys.len(), "{what}: flows recorded");
    for (key, s) in &status {
        assert_eq!(s, "COMPLETED", "{what}: flow {key}");
    }
    let effects: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT flow_key, what, COUNT(*) FROM flow_effects WHERE flow_key LIKE $1 GROUP BY flow_key, what",
    )
    .bind(&like)
    .fetch_all(lab.store.pool())
    .await
    .unwrap();
    for (key, step, n) in &effects {
        assert_eq!(*n, 1, "{what}: flow {key}: {step} {n} times");
    }
    assert_eq!(effects.len(), 2 * keys.len(), "{what}: local effects");
    let made: HashSet<String> = world
        .calls()
        .into_keys()
        .filter(|k| k.starts_with(&format!("shop:{prefix}-")))
        .collect();
    let stable: HashSet<String> = keys
        .iter()
        .flat_map(|k| ["Reserve", "Charge", "Ship"].map(|s| format!("shop:{k}:{s}")))
        .collect();
    assert_eq!(
        made, stable,
        "{what}: downstream calls with other keys than their steps'"
    );
    let (firsts, in_doubt) = replays(calls, |s| s.replayed);
    assert!(
        firsts.is_empty(),
        "{what}: started once, replayed: {firsts:?}"
    );
    println!(
        "failover ({what} killed): flows: {} completed, {in_doubt} re-sent after an error \
         and answered from the record",
        keys.len()
    );
}

/// Every event of the round's orders published, in version order per order; again only
/// what the relay published but could not record; no two publishes of an order at once.
async fn check_relay(
    lab: &Lab,
    what: &str,
    calls: &[Transition],
    rec: &Recorder,
    unrecorded: &Unrecorded,
) {
    let ids: HashSet<i64> = calls.iter().map(|c| c.key.0).collect();
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut again = 0;
    let mut foreign = 0;
    for (entity, version, _) in rec.received() {
        // Left in the outbox by an earlier run that stopped part way.
        if !ids.contains(&entity) {
            foreign += 1;
            continue;
        }
        if seen.insert((entity, version)) {
            firsts.entry(entity).or_default().push(version);
        } else {
            again += 1;
            assert!(
                unrecorded.contains(&(entity, version)),
                "{what}: event {entity}:{version} published twice, recorded the first time"
            );
        }
    }
    for id in &ids {
        let version = lab.engine.get(*id).await.unwrap().version;
        let published = firsts.remove(id).unwrap_or_default();
        assert_eq!(
            published,
            (1..=version).collect::<Vec<_>>(),
            "{what}: order {id}"
        );
    }
    assert_eq!(rec.overlaps(), 0, "{what}: an order's publishes overlapped");
    println!(
        "failover ({what} killed): relays: {} events published, {again} again (published, \
         not recorded: {}); {foreign} events of earlier runs",
        seen.len(),
        unrecorded.len()
    );
}
