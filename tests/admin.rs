//! The operators' page on SQLite, PostgreSQL and MySQL/MariaDB, over HTTP (the router
//! nested under `/admin`, driven with `oneshot`): who may see and act (no access, read
//! only, full), the CSRF token, escaping of what the database holds, and every action
//! (requeue one dead event, requeue every one a filter matches in batches, resume a
//! parked flow, re-arm and cancel a dead timer), each checked in the database and in the
//! audit trail.
//!
//! Servers: `ORDERLY_PG_URL` and `ORDERLY_MYSQL_URL`, as for their suites; each test
//! makes a database of its own.

mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use futures_util::StreamExt;
use orderly::admin::{Admin, AdminStore, Viewer};
use orderly::cli::{Cli, Exit};
use orderly::flow::{Definition, FlowConfig, FlowOutcome, Flows, ParkReason, StepError};
use orderly::idempotency::{Claim, ScopeConfig};
use orderly::{Engine, Records, Store};
use sqlx::{AssertSqlSafe, Connection};
use tower::ServiceExt;

orderly::state_machine! {
    /// A shop's order: paying it emits an event.
    pub Shop {
        states: ShopState { Created, Paid, Cancelled }
        events: ShopEvent { Pay, Cancel }
        initial: Created;
        terminal: [Paid, Cancelled];
        transitions: {
            Created + Pay    => Paid emits OrderPaid,
            Created + Cancel => Cancelled,
        }
    }
}

orderly::flow! {
    /// A payment at a gateway without idempotency keys.
    pub Legacy {
        kind: "legacy";
        version: 1;
        steps: LegacyStep {
            Post: unsafe + nothing_to_undo,
        }
    }
}

/// A hostile reference and error text: shown as text, never as markup.
const HOSTILE: &str = "<script>alert('x')</script>";

/// How many dead events the bulk requeue moves (more than one of its batches), and how
/// many it leaves (another error text).
const BULK: i64 = 10_000;
const OTHERS: i64 = 30;

struct Page {
    router: axum::Router,
}

impl Page {
    async fn call(
        &self,
        user: &str,
        method: &str,
        uri: &str,
        form: Option<String>,
    ) -> (StatusCode, String, Option<String>) {
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header("x-user", user);
        if form.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let request = request.body(Body::from(form.unwrap_or_default())).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let location = response
            .headers()
            .get(header::LOCATION)
            .map(|l| l.to_str().unwrap().to_string());
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap(), location)
    }

    async fn get(&self, user: &str, uri: &str) -> String {
        let (status, body, _) = self.call(user, "GET", uri, None).await;
        assert_eq!(status, StatusCode::OK, "GET {uri} as {user}: {body}");
        body
    }

    async fn json(&self, user: &str, uri: &str) -> serde_json::Value {
        let sep = if uri.contains('?') { '&' } else { '?' };
        let body = self.get(user, &format!("{uri}{sep}format=json")).await;
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{uri}: {e}: {body}"))
    }

    /// A POST of `fields` as `user`: its status and where it sends them.
    async fn post(
        &self,
        user: &str,
        path: &str,
        fields: &[(&str, &str)],
    ) -> (StatusCode, String, Option<String>) {
        let form = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        self.call(user, "POST", path, Some(form)).await
    }
}

/// The CSRF token in a page's forms.
fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("the page has a form");
    let rest = &html[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

async fn count<S: Store>(exec: &Exec<S>, sql: &str) -> i64 {
    (exec.scalar)(sql.to_string()).await
}

/// Literal SQL on the test's database.
struct Exec<S> {
    run: Box<dyn Fn(String) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>,
    scalar: Box<dyn Fn(String) -> futures_util::future::BoxFuture<'static, i64> + Send + Sync>,
    _s: std::marker::PhantomData<S>,
}

/// [`Exec`] over a pool.
macro_rules! exec_on {
    ($pool:expr) => {{
        let (p1, p2) = ($pool.clone(), $pool.clone());
        Exec {
            run: Box::new(move |sql: String| {
                let p = p1.clone();
                Box::pin(async move {
                    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&p).await.unwrap();
                })
            }),
            scalar: Box::new(move |sql: String| {
                let p = p2.clone();
                Box::pin(async move {
                    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                        .fetch_one(&p)
                        .await
                        .unwrap()
                })
            }),
            _s: std::marker::PhantomData,
        }
    }};
}

/// What the pages show: dead events (one with a hostile reference and error, `bulk`
/// with one error text, [`OTHERS`] with another), a dead timer, two parked flows (whose
/// gateway comes back when `down` is cleared), a record stuck past its lease.
struct Fixture<S: AdminStore> {
    flows: Flows<S>,
    records: Records<S>,
    engine: Engine<Shop, S>,
    down: Arc<AtomicBool>,
    router: axum::Router,
    exec: Exec<S>,
    total: i64,
}

/// The idempotency scope of the stuck record, and its key.
const SCOPE: &str = "checkout";
const STUCK_KEY: &str = "req-stuck";

/// The page (and the command line) over the fixture's store, flows, records and machine.
fn admin_of<S: AdminStore>(
    store: &S,
    flows: &Flows<S>,
    records: &Records<S>,
    engine: &Engine<Shop, S>,
) -> Admin<S> {
    Admin::new(store.clone())
        .flows(flows.clone())
        .records(records.clone())
        .machine(engine.clone())
}

async fn fixture<S: AdminStore>(store: S, exec: Exec<S>, bulk: i64) -> Fixture<S> {
    let engine: Engine<Shop, S> = Engine::new(store.clone()).unwrap();
    let total = 1 + bulk + OTHERS;
    futures_util::stream::iter(1..=total)
        .for_each_concurrent(8, |id| {
            let engine = engine.clone();
            async move {
                engine.create(id).await.unwrap();
                let reference = if id == 1 {
                    HOSTILE.to_string()
                } else {
                    format!("pay-{id}")
                };
                engine
                    .transition(id, ShopEvent::Pay, &reference)
                    .await
                    .unwrap();
            }
        })
        .await;
    (exec.run)(format!(
        "UPDATE outbox SET status = 'DEAD', last_error = CASE \
             WHEN entity_id = 1 THEN '{}' \
             WHEN entity_id <= {} THEN 'gateway timed out' ELSE 'schema rejected' END",
        HOSTILE.replace('\'', "''"),
        1 + bulk
    ))
    .await;
    // A dead timer.
    engine.create(99_999).await.unwrap();
    engine
        .schedule(99_999, ShopEvent::Cancel, "late", Duration::from_secs(3600))
        .await
        .unwrap();
    (exec.run)(
        "UPDATE timers SET status = 'DEAD', last_error = 'it kept failing' WHERE entity_id = 99999"
            .into(),
    )
    .await;
    // A parked flow: its unsafe call asked to be retried.
    let down = Arc::new(AtomicBool::new(true));
    let gateway = down.clone();
    let def = Definition::<S, i64>::new(Legacy).call(LegacyStep::Post, move |_ctx| {
        let down = gateway.clone();
        Box::pin(async move {
            if down.load(Ordering::SeqCst) {
                Err(StepError::retry(HOSTILE))
            } else {
                Ok("posted")
            }
        })
    });
    let flows = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(def)
        .unwrap();
    for key in ["L-1", "L-2"] {
        let started = flows.start(Legacy, key, &7i64).await.unwrap();
        assert!(matches!(
            started.outcome,
            FlowOutcome::Parked {
                reason: ParkReason::NeedsReconciliation,
                ..
            }
        ));
    }
    // A record whose holder died: its lease runs out.
    let records = Records::new(store.clone())
        .scope(
            SCOPE,
            ScopeConfig::new(Duration::from_millis(100), Duration::from_secs(86_400)),
        )
        .unwrap();
    let Claim::Claimed(_) = records.claim(SCOPE, STUCK_KEY, &1).await.unwrap() else {
        panic!("a new key is claimed");
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let admin = admin_of(&store, &flows, &records, &engine).access(|parts| {
        // The header a test sends, or the cookie a browser keeps.
        let header = parts.headers.get("x-user").and_then(|u| u.to_str().ok());
        let cookie = parts
            .headers
            .get(header::COOKIE)
            .and_then(|c| c.to_str().ok())
            .and_then(|c| c.split("; ").find_map(|kv| kv.strip_prefix("user=")));
        match header.or(cookie) {
            Some("alice") => Viewer::full("alice"),
            Some("bob") => Viewer::read_only("bob"),
            _ => Viewer::none(),
        }
    });
    Fixture {
        flows,
        records,
        engine,
        down,
        router: axum::Router::new().nest("/admin", admin.router()),
        exec,
        total,
    }
}

/// The whole suite on one store.
async fn suite<S: AdminStore>(store: S, exec: Exec<S>) {
    let Fixture {
        flows,
        records,
        down,
        router,
        exec,
        total,
        ..
    } = fixture(store, exec, BULK).await;
    let page = Page { router };

    // Access.
    let (status, _, _) = page.call("mallory", "GET", "/admin", None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let overview = page.json("bob", "/admin").await;
    assert_eq!(overview["outbox"]["dead"], total);
    assert_eq!(overview["timers"]["dead"], 1);
    assert_eq!(overview["flows"]["parked"], 2);
    assert_eq!(overview["records"]["stuck"], 1);
    let html = page.get("bob", "/admin").await;
    assert!(html.contains("<base href=\"/admin/\">"), "{html}");
    for path in [
        "/admin",
        "/admin/outbox",
        "/admin/flows",
        "/admin/timers",
        "/admin/records",
    ] {
        let html = page.get("bob", path).await;
        assert!(
            !html.contains("method=\"post\""),
            "{path} shows bob an action"
        );
    }
    // Escaping: the hostile reference and error are text.
    let dead = page.get("bob", "/admin/outbox?error=alert").await;
    assert!(dead.contains("&lt;script&gt;alert"), "{dead}");
    assert!(!dead.contains(HOSTILE), "a raw script on the page");
    let timeline = page.get("bob", "/admin/entity?machine=Shop&id=1").await;
    assert!(timeline.contains("&lt;script&gt;") && !timeline.contains(HOSTILE));
    let flows_page = page.get("bob", "/admin/flows").await;
    assert!(flows_page.contains("NEEDS_RECONCILIATION") && !flows_page.contains(HOSTILE));
    let history = page.json("bob", "/admin/entity?machine=Shop&id=1").await;
    assert_eq!(history["state"], "Paid");
    assert_eq!(history["history"][0]["ref_id"], HOSTILE);
    // The timeline's outbox events, with their publish status.
    assert_eq!(history["events"][0]["id"], "Shop:1:1");
    assert_eq!(history["events"][0]["status"], "DEAD");
    assert_eq!(history["events"][0]["event"], "OrderPaid");

    // Search: by a reference, a message id, an entity id, a record's key, a flow key.
    let found = page.json("bob", "/admin/search?q=pay-5").await;
    assert_eq!(found["history"][0]["machine"], "Shop");
    assert_eq!(found["history"][0]["order_id"], 5);
    assert_eq!(found["history"][0]["event"], "Pay");
    assert_eq!(found["events"][0]["id"], "Shop:5:1");
    assert_eq!(found["history"].as_array().unwrap().len(), 1, "{found}");
    let found = page.json("bob", "/admin/search?q=Shop:7:1").await;
    assert_eq!(found["events"][0]["ref_id"], "pay-7", "{found}");
    let found = page.json("bob", "/admin/search?q=7").await;
    assert_eq!(
        found["entities"],
        serde_json::json!([["Shop", 7]]),
        "{found}"
    );
    let found = page
        .json("bob", &format!("/admin/search?q={STUCK_KEY}"))
        .await;
    assert_eq!(found["records"][0]["scope"], SCOPE, "{found}");
    assert_eq!(found["records"][0]["status"], "PROCESSING");
    let found = page.json("bob", "/admin/search?q=L-2").await;
    assert_eq!(found["flows"][0]["kind"], "legacy", "{found}");
    assert_eq!(found["flows"][0]["park_reason"], "NEEDS_RECONCILIATION");
    let found = page.json("bob", "/admin/search?q=no-such-thing").await;
    for kind in ["history", "events", "records", "flows", "entities"] {
        assert_eq!(found[kind], serde_json::json!([]), "{kind}: {found}");
    }
    let html = page
        .get(
            "bob",
            "/admin/search?q=%3Cscript%3Ealert(%27x%27)%3C%2Fscript%3E",
        )
        .await;
    assert!(
        html.contains("2 found for") && html.contains("&lt;script&gt;"),
        "{html}"
    );
    assert!(!html.contains(HOSTILE), "a raw script on the page");
    let (status, body, _) = page.call("bob", "GET", "/admin/search?q=a%0Ab", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body, _) = page
        .call("bob", "GET", "/admin/outbox?older=soon", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let stuck = page.json("bob", "/admin/records").await;
    assert_eq!(stuck["stuck"][0]["idem_key"], STUCK_KEY, "{stuck}");
    let graph = page.get("bob", "/admin/graph?machine=Shop").await;
    assert!(graph.contains("stateDiagram-v2"), "{graph}");
    assert!(
        graph.contains("<svg") && graph.contains(">Cancelled</text>"),
        "{graph}"
    );
    assert!(graph.contains(">Pay / OrderPaid</text>"), "{graph}");
    // Entities by state: every one paid, but the one of the dead timer.
    let states = page.json("bob", "/admin/graph?machine=Shop").await;
    assert_eq!(
        states["states"],
        serde_json::json!([["Created", 1], ["Paid", total]]),
        "{states}"
    );

    // Forged and tokenless POSTs change nothing.
    let alice_page = page.get("alice", "/admin/outbox").await;
    let token = csrf_of(&alice_page);
    let one = [("machine", "Shop"), ("entity_id", "1"), ("version", "1")];
    fn with<'a>(one: &[(&'a str, &'a str)], token: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut f = one.to_vec();
        f.push(("csrf", token));
        f
    }
    assert_eq!(
        page.post("bob", "/admin/requeue", &with(&one, &token))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        page.post("alice", "/admin/requeue", &one).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        page.post("alice", "/admin/requeue", &with(&one, "00ff"))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        page.post("mallory", "/admin/requeue", &with(&one, &token))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let dead_now = count(&exec, "SELECT COUNT(*) FROM outbox WHERE status = 'DEAD'").await;
    assert_eq!(dead_now, total, "a refused POST changed something");
    assert_eq!(count(&exec, "SELECT COUNT(*) FROM orderly_audit").await, 0);

    // Requeue one.
    let (status, body, location) = page
        .post("alice", "/admin/requeue", &with(&one, &token))
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let location = location.unwrap();
    assert!(location.starts_with("outbox?done="), "{location}");
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM outbox WHERE entity_id = 1 AND status = 'PENDING'"
        )
        .await,
        1
    );
    let shown = page.get("alice", &format!("/admin/{location}")).await;
    assert!(
        shown.contains("outbox.requeue Shop 1 v1: 1 changed"),
        "{shown}"
    );
    // Bad input: a clear 400, nothing changed.
    let bad = [
        ("machine", "Shop"),
        ("entity_id", "one"),
        ("version", "1"),
        ("csrf", token.as_str()),
    ];
    let (status, body, _) = page.post("alice", "/admin/requeue", &bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("entity_id is an integer"), "{body}");

    // Requeue every match of a filter: in batches, recorded once. First the few whose
    // rows come after more than a batch of others (read on past them), then the many.
    let bulk = |error: &'static str| {
        [
            ("machine", "Shop"),
            ("event", ""),
            ("error", error),
            ("csrf", token.as_str()),
        ]
    };
    let (status, body, location) = page
        .post("alice", "/admin/requeue-matching", &bulk("schema"))
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains(&format!("{OTHERS}+changed")));
    assert_eq!(
        count(&exec, "SELECT COUNT(*) FROM outbox WHERE status = 'DEAD'").await,
        BULK
    );
    let (status, body, location) = page
        .post("alice", "/admin/requeue-matching", &bulk("gateway"))
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains(&format!("{BULK}+changed")));
    assert_eq!(
        count(&exec, "SELECT COUNT(*) FROM outbox WHERE status = 'DEAD'").await,
        0
    );
    let audit = page.json("bob", "/admin/audit").await;
    let rows = audit["audit"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{audit}");
    assert_eq!(rows[0]["who"], "alice");
    assert_eq!(rows[0]["action"], "outbox.requeue");
    assert_eq!(rows[0]["affected"], BULK);
    assert_eq!(
        rows[0]["target"],
        "dead events where machine=Shop, error=gateway"
    );
    assert_eq!(rows[1]["affected"], OTHERS);
    assert_eq!(rows[2]["affected"], 1);

    // Resume the parked flow once the gateway is back.
    down.store(false, Ordering::SeqCst);
    let token = csrf_of(&page.get("alice", "/admin/flows").await);
    let resume = [
        ("kind", "legacy"),
        ("key", "L-1"),
        ("how", "retry"),
        ("csrf", token.as_str()),
    ];
    let (status, body, _) = page.post("alice", "/admin/resume", &resume).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let view = flows.get("legacy", "L-1").await.unwrap().unwrap();
    assert_eq!(view.flow.status, "COMPLETED");
    // The other is marked applied by hand (the gateway did post it), with its output;
    // an output that is not JSON is refused, nothing done.
    let applied = |output: &'static str| {
        [
            ("kind", "legacy"),
            ("key", "L-2"),
            ("how", "applied"),
            ("output", output),
            ("csrf", token.as_str()),
        ]
    };
    let (status, body, _) = page.post("alice", "/admin/resume", &applied("{oops")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        flows
            .get("legacy", "L-2")
            .await
            .unwrap()
            .unwrap()
            .flow
            .status,
        "RUNNING"
    );
    let (status, body, _) = page
        .post("alice", "/admin/resume", &applied("\"posted by hand\""))
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let view = flows.get("legacy", "L-2").await.unwrap().unwrap();
    assert_eq!(view.flow.status, "COMPLETED");
    assert!(view.flow.output.unwrap().contains("posted by hand"));
    assert_eq!(page.json("bob", "/admin").await["flows"]["parked"], 0);

    // Release the stuck record: the next claim runs the request again.
    let token = csrf_of(&page.get("alice", "/admin/records").await);
    let release = [
        ("scope", SCOPE),
        ("key", STUCK_KEY),
        ("csrf", token.as_str()),
    ];
    let (status, body, location) = page.post("alice", "/admin/release", &release).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains("1+changed"));
    assert_eq!(page.json("bob", "/admin").await["records"]["stuck"], 0);
    let (_, _, location) = page.post("alice", "/admin/release", &release).await;
    assert!(
        location.unwrap().contains("0+changed"),
        "a second release changed something"
    );
    assert!(matches!(
        records.claim(SCOPE, STUCK_KEY, &1).await.unwrap(),
        Claim::Claimed(_)
    ));

    // Re-arm the dead timer, then cancel it.
    let token = csrf_of(&page.get("alice", "/admin/timers").await);
    let key = [
        ("machine", "Shop"),
        ("entity_id", "99999"),
        ("event", "Cancel"),
        ("ref_id", "late"),
        ("csrf", token.as_str()),
    ];
    assert_eq!(
        page.post("alice", "/admin/rearm", &key).await.0,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM timers WHERE entity_id = 99999 AND status = 'PENDING'"
        )
        .await,
        1
    );
    assert_eq!(
        page.post("alice", "/admin/cancel-timer", &key).await.0,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM timers WHERE entity_id = 99999 AND status = 'CANCELLED'"
        )
        .await,
        1
    );
    let audit = page.json("bob", "/admin/audit").await;
    let actions: Vec<&str> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "timers.cancel",
            "timers.rearm",
            "records.release",
            "records.release",
            "flows.resume",
            "flows.resume",
            "outbox.requeue",
            "outbox.requeue",
            "outbox.requeue"
        ]
    );
}

/// One command of the command line: its exit code, what it printed, and its errors.
async fn cli<S: AdminStore>(cli: &Cli<S>, args: &[&str]) -> (Exit, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let line = std::iter::once("orderly").chain(args.iter().copied());
    let code = cli.run(line, &mut out, &mut err).await;
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// A command that prints JSON: its exit code and the JSON, parsed back.
async fn cli_json<S: AdminStore>(c: &Cli<S>, args: &[&str]) -> (Exit, serde_json::Value) {
    let mut line = vec!["--json"];
    line.extend_from_slice(args);
    let (code, out, err) = cli(c, &line).await;
    let json = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out} {err}"));
    (code, json)
}

/// The `orderly` binary on `url`: its exit code and what it printed.
fn binary(url: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_orderly"));
    command.env_remove("ORDERLY_DATABASE_URL");
    if let Some(url) = url {
        command.args(["--database-url", url]);
    }
    let out = command.args(args).output().unwrap();
    (
        out.status.code().expect("the binary exits, not killed"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The command line over the fixture: every command, its `--json` parsed back, each
/// action checked in the database and the audit trail, and the exit codes; then the
/// `orderly` binary against the database at `url`.
async fn cli_suite<S: AdminStore>(store: S, exec: Exec<S>, url: &str) {
    const FEW: i64 = 20;
    let Fixture {
        flows,
        records,
        engine,
        down,
        exec,
        total,
        ..
    } = fixture(store.clone(), exec, FEW).await;
    let c = Cli::new(admin_of(&store, &flows, &records, &engine));
    let dead = || count(&exec, "SELECT COUNT(*) FROM outbox WHERE status = 'DEAD'");

    let (code, o) = cli_json(&c, &["overview"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(o["outbox"]["dead"], total);
    assert_eq!(o["records"]["stuck"], 1);
    assert_eq!(o["flows"]["parked"], 2);
    let (code, out, _) = cli(&c, &["overview"]).await;
    assert_eq!(code, Exit::Ok);
    assert!(
        out.contains(&format!("events dead         {total}")),
        "{out}"
    );

    // Reads.
    let (code, found) = cli_json(&c, &["search", "pay-5"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(found["history"][0]["order_id"], 5);
    assert_eq!(found["events"][0]["id"], "Shop:5:1");
    let (code, out, _) = cli(&c, &["search", "no-such-thing"]).await;
    assert_eq!(code, Exit::NotFound);
    assert!(out.contains("(none)"), "{out}");
    let (code, t) = cli_json(&c, &["history", "Shop", "1"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(t["history"][0]["ref_id"], HOSTILE);
    assert_eq!(t["events"][0]["status"], "DEAD");
    let (code, out, _) = cli(&c, &["history", "Shop", "1"]).await;
    assert_eq!(code, Exit::Ok);
    assert!(out.starts_with("Shop 1: Paid at version 1"), "{out}");
    assert_eq!(
        cli(&c, &["history", "Shop", "424242"]).await.0,
        Exit::NotFound
    );
    let (code, rows) = cli_json(&c, &["outbox", "dead", "--error", "schema"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(rows.as_array().unwrap().len(), OTHERS as usize);
    let (_, rows) = cli_json(&c, &["outbox", "dead", "--older-than", "1h"]).await;
    assert_eq!(rows, serde_json::json!([]), "nothing is an hour old");
    let (code, rows) = cli_json(&c, &["records", "stuck"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(rows[0]["idem_key"], STUCK_KEY);
    let (code, rows) = cli_json(&c, &["flows", "parked"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(rows.as_array().unwrap().len(), 2);
    let (code, rows) = cli_json(&c, &["timers", "dead"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(rows[0]["entity_id"], 99_999);
    let (code, out, _) = cli(&c, &["graph", "Shop"]).await;
    assert_eq!(code, Exit::Ok);
    assert!(out.contains("stateDiagram-v2"), "{out}");
    let (code, graph) = cli_json(&c, &["graph", "Shop"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(
        graph["states"],
        serde_json::json!([["Created", 1], ["Paid", total]])
    );

    // Bad lines: nothing done.
    for line in [
        &["outbox", "requeue"][..],
        &["outbox", "requeue", "--older-than", "soon"],
        &["outbox", "requeue", "--id", "Shop:one:1"],
        &["flows", "resume", "legacy", "L-1", "--how", "later"],
        &["graph", "Nope"],
        &["history", "Shop", "one"],
        &["no-such-command"],
    ] {
        let (code, _, err) = cli(&c, line).await;
        assert_eq!(code, Exit::Usage, "{line:?}: {err}");
        assert!(!err.is_empty(), "{line:?} said nothing");
    }
    assert_eq!(dead().await, total, "a refused command changed something");
    assert_eq!(count(&exec, "SELECT COUNT(*) FROM orderly_audit").await, 0);

    // Actions.
    let (code, _, err) = cli(
        &c,
        &[
            "--who", "ops-bot", "outbox", "requeue", "--error", "gateway",
        ],
    )
    .await;
    assert_eq!(code, Exit::Ok, "{err}");
    assert!(err.contains(&format!("requeued {FEW} so far")), "{err}");
    assert_eq!(dead().await, total - FEW);
    let (code, done) = cli_json(&c, &["outbox", "requeue", "--id", "Shop:1:1"]).await;
    assert_eq!(code, Exit::Ok);
    assert_eq!(done["changed"], 1);
    let (code, done) = cli_json(&c, &["outbox", "requeue", "--id", "Shop:1:1"]).await;
    assert_eq!(code, Exit::NotFound, "requeued twice: {done}");
    assert_eq!(done["changed"], 0);
    assert_eq!(
        cli(&c, &["records", "release", SCOPE, STUCK_KEY]).await.0,
        Exit::Ok
    );
    assert_eq!(
        cli(&c, &["records", "release", SCOPE, STUCK_KEY]).await.0,
        Exit::NotFound
    );
    assert!(matches!(
        records.claim(SCOPE, STUCK_KEY, &1).await.unwrap(),
        Claim::Claimed(_)
    ));
    down.store(false, Ordering::SeqCst);
    assert_eq!(
        cli(&c, &["flows", "resume", "legacy", "L-1", "--how", "retry"])
            .await
            .0,
        Exit::Ok
    );
    let line = [
        "flows",
        "resume",
        "legacy",
        "L-2",
        "--how",
        "applied",
        "--output",
        "\"by hand\"",
    ];
    assert_eq!(cli(&c, &line).await.0, Exit::Ok);
    for key in ["L-1", "L-2"] {
        assert_eq!(
            flows.get("legacy", key).await.unwrap().unwrap().flow.status,
            "COMPLETED"
        );
    }
    let timer = ["Shop", "99999", "Cancel", "late"];
    assert_eq!(
        cli(&c, &[&["timers", "rearm"][..], &timer].concat())
            .await
            .0,
        Exit::Ok
    );
    assert_eq!(
        cli(&c, &[&["timers", "cancel"][..], &timer].concat())
            .await
            .0,
        Exit::Ok
    );
    let (code, audit) = cli_json(&c, &["audit"]).await;
    assert_eq!(code, Exit::Ok);
    let actions: Vec<(&str, i64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap(),
                r["affected"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            ("timers.cancel", 1),
            ("timers.rearm", 1),
            ("flows.resume", 1),
            ("flows.resume", 1),
            ("records.release", 0),
            ("records.release", 1),
            ("outbox.requeue", 0),
            ("outbox.requeue", 1),
            ("outbox.requeue", FEW),
        ]
    );
    assert_eq!(audit[8]["who"], "ops-bot");
    assert_eq!(audit[8]["target"], "dead events where error=gateway");

    // The binary: the same reads with nothing registered, and its exit codes.
    let (code, out, err) = binary(
        Some(url),
        &["--json", "outbox", "dead", "--error", "schema"],
    );
    assert_eq!(code, 0, "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), OTHERS as usize);
    let (code, out, _) = binary(Some(url), &["--json", "search", "pay-9"]);
    assert_eq!(code, 0);
    let found: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(found["history"][0]["order_id"], 9, "{found}");
    assert_eq!(binary(Some(url), &["search", "no-such-thing"]).0, 1);
    let (code, _, err) = binary(Some(url), &["records", "release", SCOPE, "k"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no idempotency records are registered"),
        "{err}"
    );
    let (code, _, err) = binary(None, &["overview"]);
    assert_eq!(code, 2);
    assert!(err.contains("--database-url"), "{err}");
    let (code, out, _) = binary(None, &["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("outbox"), "{out}");
}

/// A database of the test's own on the PostgreSQL server, migrated; its URL.
async fn postgres_store() -> (orderly::backend::postgres::PgStore, String) {
    let url = server::url(
        "ORDERLY_PG_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    );
    let name = server::unique_db_name();
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required for this suite: {e}"));
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let at = format!("{}/{name}", url.rsplit_once('/').unwrap().0);
    let store = orderly::backend::postgres::PgStore::connect(&at)
        .await
        .unwrap();
    (store, at)
}

/// A database of the test's own on the MySQL/MariaDB server, migrated; its URL.
async fn mysql_store() -> (orderly::backend::mysql::MySqlStore, String) {
    let url = server::url("ORDERLY_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let name = server::unique_db_name();
    let mut conn = sqlx::MySqlConnection::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("MySQL/MariaDB at {url} is required for this suite: {e}"));
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let at = format!("{}/{name}", url.rsplit_once('/').unwrap().0);
    let store = orderly::backend::mysql::MySqlStore::connect(&at)
        .await
        .unwrap();
    (store, at)
}

#[tokio::test]
async fn admin_page_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("admin.db").display());
    let store = orderly::SqliteStore::connect(&url).await.unwrap();
    let exec = exec_on!(store.pool());
    suite(store, exec).await;
}

/// SQLite keeps any value in any column: an outbox row whose entity id or version is
/// not an integer is set `DEAD` by the relay's first claim, and the dead-events page
/// lists it, as stored and with its reason, beside the events that read.
#[tokio::test]
async fn corrupt_outbox_rows_show_on_the_dead_events_page_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("corrupt.db").display());
    let store = orderly::SqliteStore::connect(&url).await.unwrap();
    let exec: Exec<orderly::SqliteStore> = exec_on!(store.pool());
    let engine: Engine<Shop, _> = Engine::new(store.clone()).unwrap();
    for id in 1..=3 {
        engine.create(id).await.unwrap();
        engine
            .transition(id, ShopEvent::Pay, &format!("pay-{id}"))
            .await
            .unwrap();
    }
    (exec.run)("UPDATE outbox SET entity_id = 'zz' WHERE entity_id = 1".into()).await;
    (exec.run)("UPDATE outbox SET version = 'abc' WHERE entity_id = 2".into()).await;
    struct Nowhere;
    impl orderly::outbox::Sink for Nowhere {
        async fn publish(
            &self,
            _: &orderly::outbox::Message,
        ) -> Result<(), orderly::outbox::SinkError> {
            Ok(())
        }
    }
    let relay = orderly::outbox::Relay::new(store.clone(), Nowhere);
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.published, round.corrupt), (1, 2), "{round:?}");
    assert_eq!(
        count(&exec, "SELECT count(*) FROM outbox WHERE status = 'DEAD'").await,
        2,
        "both set aside at the first claim"
    );
    let admin = Admin::new(store.clone()).access(|_| Viewer::read_only("bob"));
    let page = Page {
        router: axum::Router::new().nest("/admin", admin.router()),
    };
    let dead = page.json("bob", "/admin/outbox").await;
    let corrupt = dead["corrupt"].as_array().unwrap();
    let keys: Vec<_> = corrupt
        .iter()
        .map(|c| {
            (
                c["entity_id"].as_str().unwrap(),
                c["version"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(keys, [("2", "abc"), ("zz", "1")], "{dead}");
    assert!(
        corrupt.iter().all(
            |c| c["reason"] == "an entity id or version that is not an integer"
                && c["status"] == "DEAD"
        ),
        "{dead}"
    );
    let html = page.get("bob", "/admin/outbox").await;
    assert!(
        html.contains("Rows orderly never writes") && html.contains("<td>zz</td>"),
        "{html}"
    );
}

#[tokio::test]
async fn command_line_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("cli.db").display());
    let store = orderly::SqliteStore::connect(&url).await.unwrap();
    let exec = exec_on!(store.pool());
    cli_suite(store, exec, &url).await;
    // A database that is not there is not made: a failure to open it that another try
    // will not mend, exit 4; a server that does not answer may come back, exit 3.
    let missing = format!("sqlite://{}", dir.path().join("none/x.db").display());
    let (code, _, err) = binary(Some(&missing), &["overview"]);
    assert_eq!(code, 4, "{err}");
    let (code, _, err) = binary(Some("postgres://postgres@127.0.0.1:1/none"), &["overview"]);
    assert_eq!(code, 3, "{err}");
    assert!(!dir.path().join("none").exists());
}

#[tokio::test]
async fn admin_page_on_postgres() {
    let (store, _) = postgres_store().await;
    let exec = exec_on!(store.pool());
    suite(store, exec).await;
}

#[tokio::test]
async fn command_line_on_postgres() {
    let (store, at) = postgres_store().await;
    let exec = exec_on!(store.pool());
    cli_suite(store, exec, &at).await;
}

#[tokio::test]
async fn admin_page_on_mysql() {
    let (store, _) = mysql_store().await;
    let exec = exec_on!(store.pool());
    suite(store, exec).await;
}

#[tokio::test]
async fn command_line_on_mysql() {
    let (store, at) = mysql_store().await;
    let exec = exec_on!(store.pool());
    cli_suite(store, exec, &at).await;
}

/// A WebDriver of Debian's `chromium-driver`, on a port of its own, killed (by pid) when
/// the test ends.
struct Driver {
    child: std::process::Child,
    port: u16,
}

impl Driver {
    async fn start() -> Driver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) is required for this test");
        let up = server::eventually(Duration::from_secs(20), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        assert!(up, "chromedriver did not listen on {port}");
        Driver { child, port }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The page in a real browser (headless Chromium through WebDriver), on SQLite: the
/// overview, an entity's timeline opened through the form (the hostile reference shown
/// as text, no script run), a dead event requeued with its button, a parked flow retried
/// with its button, each page checked after; a read-only viewer sees no button. The
/// screenshots are saved under the test's output directory (`admin-screens/`).
#[tokio::test]
async fn admin_page_in_a_browser() {
    use fantoccini::{ClientBuilder, Locator};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("admin.db").display());
    let store = orderly::SqliteStore::connect(&url).await.unwrap();
    let exec = exec_on!(store.pool());
    let Fixture {
        flows,
        down,
        router,
        exec,
        total,
        ..
    } = fixture(store, exec, 3).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let screens = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin-screens");
    std::fs::create_dir_all(&screens).unwrap();

    let driver = Driver::start().await;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,860"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let c = ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session of headless Chromium");
    // `localhost`, not the address: a cookie is set for a host name.
    let base = format!("http://localhost:{}/admin", addr.port());
    let shot = |name: &'static str| {
        let c = c.clone();
        let path = screens.join(name);
        async move {
            let png = c.screenshot().await.unwrap();
            std::fs::write(&path, png).unwrap();
        }
    };

    // Without a user the page is refused; alice has full access.
    c.goto(&base).await.unwrap();
    assert!(c.source().await.unwrap().contains("not yours to see"));
    // The session cookie the application's resolver reads, set by the page's own script
    // context (chromedriver refuses a cookie's domain on a loopback host).
    c.execute("document.cookie = 'user=alice; path=/'", vec![])
        .await
        .unwrap();
    c.goto(&base).await.unwrap();
    assert_eq!(c.title().await.unwrap(), "Overview · orderly");
    let cards = c
        .find(Locator::Css(".cards"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(cards.contains(&format!("Events dead\n{total}")), "{cards}");
    assert!(cards.contains("Flows parked\n2"), "{cards}");
    assert!(cards.contains("Records stuck\n1"), "{cards}");
    shot("overview.png").await;

    // Search a reference from the header's box; its entity's link opens the timeline.
    let typed = c
        .find(Locator::Css("header input[name=q]"))
        .await
        .unwrap()
        .send_keys("pay-3\u{E007}")
        .await;
    match typed {
        Ok(()) => {}
        // The Enter submits the form, and chromedriver may answer the key press with the
        // navigation it started; the page that comes is checked below.
        Err(fantoccini::error::CmdError::NotW3C(v))
            if v.as_str() == Some("aborted by navigation") => {}
        Err(e) => panic!("typing the search: {e:?}"),
    }
    let found = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("found"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(found, "2 found for pay-3.");
    let rows = c
        .find(Locator::Id("found-history"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(rows.contains("Shop 3 1 Pay Created Paid"), "{rows}");
    shot("search.png").await;
    c.find(Locator::Css("#found-history a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let now = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("now"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(now, "Now Paid, version 1.");
    assert!(
        c.current_url()
            .await
            .unwrap()
            .as_str()
            .ends_with("entity?machine=Shop&id=3")
    );
    c.goto(&base).await.unwrap();

    // The timeline, through the form. (A click that navigates returns before the next
    // page is there: each check after one waits for an element only that page has.)
    c.find(Locator::Css("input[name=id]"))
        .await
        .unwrap()
        .send_keys("1")
        .await
        .unwrap();
    c.find(Locator::Css("form[action=entity] button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let now = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("now"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(now, "Now Paid, version 1.");
    let history = c
        .find(Locator::Id("history"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        history.contains(HOSTILE),
        "the reference is shown as text: {history}"
    );
    assert!(
        c.get_alert_text().await.is_err(),
        "a script of the database ran"
    );
    shot("timeline.png").await;

    // A dead event requeued with its button.
    c.goto(&format!("{base}/outbox")).await.unwrap();
    let buttons = c.find_all(Locator::Css("#dead button")).await.unwrap();
    assert_eq!(buttons.len(), total as usize);
    buttons[0].click().await.unwrap();
    let notice = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("notice"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(notice.ends_with(": 1 changed"), "{notice}");
    assert_eq!(
        c.find_all(Locator::Css("#dead button"))
            .await
            .unwrap()
            .len(),
        total as usize - 1
    );
    let dead = (exec.scalar)("SELECT COUNT(*) FROM outbox WHERE status = 'DEAD'".into()).await;
    assert_eq!(dead, total - 1);
    shot("dead-events.png").await;
    // A row orderly never writes (SQLite keeps text in an integer column): listed under
    // the dead events as stored, with why.
    (exec.run)(
        "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, \
         to_status, ref_id, status) VALUES ('Shop', 'zz', 1, 'OrderPaid', 'Pay', 'Created', \
         'Paid', 'pay-zz', 'DEAD')"
            .into(),
    )
    .await;
    c.goto(&format!("{base}/outbox")).await.unwrap();
    let corrupt = c
        .find(Locator::Css("#corrupt"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        corrupt.contains("zz")
            && corrupt.contains("an entity id or version that is not an integer"),
        "{corrupt}"
    );
    shot("dead-events-corrupt.png").await;
    (exec.run)("DELETE FROM outbox WHERE entity_id = 'zz'".into()).await;

    // The parked flow retried with its button, once its gateway is back.
    down.store(false, Ordering::SeqCst);
    c.goto(&format!("{base}/flows")).await.unwrap();
    c.find(Locator::XPath(
        "//table[@id='parked']//button[text()='Retry']",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    let notice = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("notice"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        notice.starts_with("flows.resume flow legacy L-1: retry: 1 changed"),
        "{notice}"
    );
    let parked = c
        .find(Locator::Id("parked"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !parked.contains("L-1") && parked.contains("L-2"),
        "{parked}"
    );
    assert_eq!(
        flows
            .get("legacy", "L-1")
            .await
            .unwrap()
            .unwrap()
            .flow
            .status,
        "COMPLETED"
    );
    // The stuck record released with its button.
    c.goto(&format!("{base}/records")).await.unwrap();
    c.find(Locator::XPath(
        "//table[@id='stuck']//button[text()='Release']",
    ))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    let notice = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("notice"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        notice,
        format!("records.release record {SCOPE} {STUCK_KEY}: 1 changed")
    );
    assert!(
        c.find_all(Locator::Css("#stuck button"))
            .await
            .unwrap()
            .is_empty()
    );
    shot("records.png").await;
    c.goto(&format!("{base}/audit")).await.unwrap();
    let audit = c
        .find(Locator::Css("main table"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        audit.contains("flows.resume") && audit.contains("outbox.requeue"),
        "{audit}"
    );
    shot("audit.png").await;
    // The graph, drawn on the server.
    c.goto(&format!("{base}/graph?machine=Shop")).await.unwrap();
    let drawn = c
        .find(Locator::Css("#picture svg"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in ["Created", "Paid", "Cancelled", "Pay / OrderPaid"] {
        assert!(drawn.contains(name), "{name} is not drawn: {drawn}");
    }
    shot("graph.png").await;

    // Bob reads, and sees no button.
    c.execute("document.cookie = 'user=bob; path=/'", vec![])
        .await
        .unwrap();
    for path in ["", "/outbox", "/flows", "/timers", "/records"] {
        c.goto(&format!("{base}{path}")).await.unwrap();
        assert!(
            c.find_all(Locator::Css("main form[method=post]"))
                .await
                .unwrap()
                .is_empty(),
            "{path}"
        );
    }
    c.goto(&format!("{base}/outbox")).await.unwrap();
    assert_eq!(
        c.find_all(Locator::Css("#dead tr")).await.unwrap().len(),
        total as usize
    );
    shot("read-only.png").await;
    c.close().await.unwrap();
}
