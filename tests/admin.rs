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

/// The page's router, called as a browser would: each user keeps the session cookie the
/// page gives them and sends it back.
struct Page {
    router: axum::Router,
    sessions: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// The session cookie (`name=value`) a response gives, if it gives one.
fn session_cookie(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("orderly_admin_session="))
        .and_then(|c| c.split(';').next())
        .map(str::to_string)
}

impl Page {
    fn new(router: axum::Router) -> Self {
        Page {
            router,
            sessions: Default::default(),
        }
    }

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
        let session = self.sessions.lock().unwrap().get(user).cloned();
        if let Some(cookie) = session {
            request = request.header(header::COOKIE, cookie);
        }
        if form.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let request = request.body(Body::from(form.unwrap_or_default())).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        if let Some(cookie) = session_cookie(response.headers()) {
            self.sessions
                .lock()
                .unwrap()
                .insert(user.to_string(), cookie);
        }
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

    /// The headers of a GET of `uri` as `user`, and its status.
    async fn headers(&self, user: &str, uri: &str) -> (StatusCode, axum::http::HeaderMap) {
        let request = Request::builder()
            .uri(uri)
            .header("x-user", user)
            .body(Body::empty())
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        (response.status(), response.headers().clone())
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
        // orderly's tables as the tests write them, or in PostgreSQL's schema.
        let pg = std::any::type_name_of_val(&$pool).contains("Postgres");
        let named = move |sql: String| if pg { server::in_schema(&sql) } else { sql };
        Exec {
            run: Box::new(move |sql: String| {
                let (p, sql) = (p1.clone(), named(sql));
                Box::pin(async move {
                    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&p).await.unwrap();
                })
            }),
            scalar: Box::new(move |sql: String| {
                let (p, sql) = (p2.clone(), named(sql));
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
        "UPDATE orderly_outbox SET status = 'DEAD', last_error = CASE \
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
        "UPDATE orderly_timers SET status = 'DEAD', last_error = 'it kept failing' WHERE entity_id = 99999"
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
        router: admin.router_at("/admin"),
        exec,
        total,
    }
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
    let store = orderly::backend::postgres::PgStore::demo(&at)
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
    let store = orderly::backend::mysql::MySqlStore::demo(&at)
        .await
        .unwrap();
    (store, at)
}

#[tokio::test]
async fn admin_page_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("admin.db").display());
    let store = orderly::SqliteStore::demo(&url).await.unwrap();
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
    let store = orderly::SqliteStore::demo(&url).await.unwrap();
    let exec: Exec<orderly::SqliteStore> = exec_on!(store.pool());
    let engine: Engine<Shop, _> = Engine::new(store.clone()).unwrap();
    for id in 1..=3 {
        engine.create(id).await.unwrap();
        engine
            .transition(id, ShopEvent::Pay, &format!("pay-{id}"))
            .await
            .unwrap();
    }
    (exec.run)("UPDATE orderly_outbox SET entity_id = 'zz' WHERE entity_id = 1".into()).await;
    (exec.run)("UPDATE orderly_outbox SET version = 'abc' WHERE entity_id = 2".into()).await;
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
        count(
            &exec,
            "SELECT count(*) FROM orderly_outbox WHERE status = 'DEAD'"
        )
        .await,
        2,
        "both set aside at the first claim"
    );
    let admin = Admin::new(store.clone()).access(|_| Viewer::read_only("bob"));
    let page = Page::new(axum::Router::new().nest("/admin", admin.router()));
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

/// SQLite stores a text's bytes as given: a history reason and a dead event's error that
/// are not UTF-8 show with U+FFFD, the entity page answers 200 and the dead-events list
/// keeps the row; an error of 100,000 bytes shows its first 1,024 and folds the whole
/// under "show all".
#[tokio::test]
async fn bad_bytes_and_long_texts_show_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("bytes.db").display());
    let store = orderly::SqliteStore::demo(&url).await.unwrap();
    let exec: Exec<orderly::SqliteStore> = exec_on!(store.pool());
    let engine: Engine<Shop, _> = Engine::new(store.clone()).unwrap();
    for id in 1..=2 {
        engine.create(id).await.unwrap();
        engine
            .transition(id, ShopEvent::Pay, &format!("pay-{id}"))
            .await
            .unwrap();
    }
    // "ok", a byte that is no UTF-8, "!".
    (exec.run)(
        "UPDATE orderly_transitions SET reason = CAST(x'6f6bff21' AS TEXT) WHERE order_id = 1"
            .into(),
    )
    .await;
    (exec.run)(
        "UPDATE orderly_outbox SET status = 'DEAD', last_error = CAST(x'626164ff' AS TEXT) WHERE entity_id = 1"
            .into(),
    )
    .await;
    (exec.run)(
        "UPDATE orderly_outbox SET status = 'DEAD', \
         last_error = replace(hex(zeroblob(50000)), '0', 'e') WHERE entity_id = 2"
            .into(),
    )
    .await;
    assert_eq!(
        count(
            &exec,
            "SELECT count(*) FROM orderly_transitions WHERE order_id = 1 AND CAST(reason AS BLOB) = x'6f6bff21'"
        )
        .await,
        1,
        "the bad byte is stored"
    );
    let admin = Admin::new(store.clone())
        .machine(engine.clone())
        .access(|_| Viewer::read_only("bob"));
    let page = Page::new(axum::Router::new().nest("/admin", admin.router()));
    let history = page.json("bob", "/admin/entity?machine=Shop&id=1").await;
    let reasons: Vec<_> = history["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["reason"].clone())
        .collect();
    assert!(
        reasons.contains(&serde_json::json!("ok\u{fffd}!")),
        "{history}"
    );
    let html = page.get("bob", "/admin/entity?machine=Shop&id=1").await;
    assert!(html.contains("ok\u{fffd}!"), "{html}");
    let dead = page.json("bob", "/admin/outbox").await;
    let mut errors: Vec<(i64, usize)> = dead["dead"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let e = d["last_error"].as_str().unwrap();
            (d["entity_id"].as_i64().unwrap(), e.len())
        })
        .collect();
    errors.sort_unstable();
    assert_eq!(
        errors,
        [(1, 6), (2, 100_000)],
        "both dead events listed: {dead}"
    );
    assert!(
        dead["dead"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["last_error"] == "bad\u{fffd}"),
        "{dead}"
    );
    // A stuck record, an audit row and a timer of entity 1, each with a byte that is no
    // UTF-8 in a text: each page shows its row, the timer as one that does not read.
    (exec.run)(
        "INSERT INTO orderly_idempotency_records (scope, idem_key, status, attempt, \
         lease_until, expires_at, created_at, updated_at) \
         VALUES ('pay', CAST(x'6b6579ff' AS TEXT), 'PROCESSING', 1, 0, 9000000000000, 0, 0)"
            .into(),
    )
    .await;
    (exec.run)(
        "INSERT INTO orderly_audit (at_ms, who, action, target, affected) \
         VALUES (0, CAST(x'6576ff65' AS TEXT), 'requeue', 'x', 1)"
            .into(),
    )
    .await;
    (exec.run)(
        "INSERT INTO orderly_timers (id, machine, entity_id, event, ref_id, due_at, next_at, \
         created_at) VALUES (77, 'Shop', 1, CAST(x'6578ff' AS TEXT), 'r', 0, 0, 0)"
            .into(),
    )
    .await;
    let records = page.json("bob", "/admin/records").await;
    assert!(
        records.to_string().contains("key\u{fffd}"),
        "the stuck record listed: {records}"
    );
    let audit = page.json("bob", "/admin/audit").await;
    assert!(
        audit.to_string().contains("ev\u{fffd}e"),
        "the audit row listed: {audit}"
    );
    let entity = page.json("bob", "/admin/entity?machine=Shop&id=1").await;
    let timers = entity["timers"].as_array().unwrap();
    assert_eq!(timers.len(), 1, "{entity}");
    assert_eq!(timers[0]["status"], "UNREADABLE", "{entity}");
    assert!(
        timers[0]["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("timer 77: ")),
        "{entity}"
    );
    let html = page.get("bob", "/admin/entity?machine=Shop&id=1").await;
    assert!(html.contains("UNREADABLE"), "{html}");
    // Parked flows whose texts for people hold a byte that is no UTF-8: one in its last
    // error and its step's error, one in its park reason. Both listed, both opened.
    for (key, reason, error) in [
        ("F-1", "'NEEDS_RECONCILIATION'", "CAST(x'676174ff' AS TEXT)"),
        ("F-2", "CAST(x'4e45ff' AS TEXT)", "'plain'"),
    ] {
        (exec.run)(format!(
            "INSERT INTO orderly_flows (kind, flow_key, version, input_hash, input, status, \
             park_reason, step_at, owner_token, attempt, lease_until, output, last_error, \
             created_at, updated_at) VALUES ('legacy', '{key}', 1, 'h', '7', 'RUNNING', \
             {reason}, 0, 't', 1, 0, NULL, {error}, 0, 0)"
        ))
        .await;
        (exec.run)(format!(
            "INSERT INTO orderly_flow_steps (kind, flow_key, step_index, phase, name, status, \
             attempt, downstream_key, owner_token, output, error, started_at, finished_at) \
             VALUES ('legacy', '{key}', 0, 'F', 'Post', 'STARTED', 1, NULL, 't', NULL, {error}, 0, NULL)"
        ))
        .await;
    }
    let parked = page.json("bob", "/admin/flows").await;
    let listed: Vec<_> = parked["parked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["flow_key"].clone(),
                f["park_reason"].clone(),
                f["last_error"].clone(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (
                serde_json::json!("F-1"),
                serde_json::json!("NEEDS_RECONCILIATION"),
                serde_json::json!("gat\u{fffd}")
            ),
            (
                serde_json::json!("F-2"),
                serde_json::json!("NE\u{fffd}"),
                serde_json::json!("plain")
            ),
        ],
        "{parked}"
    );
    assert!(
        page.get("bob", "/admin/flows")
            .await
            .contains("gat\u{fffd}")
    );
    let flow = page.json("bob", "/admin/flow?kind=legacy&key=F-1").await;
    assert_eq!(flow["steps"][0]["error"], "gat\u{fffd}", "{flow}");
    assert!(
        page.get("bob", "/admin/flow?kind=legacy&key=F-2")
            .await
            .contains("NE\u{fffd}")
    );
    let html = page.get("bob", "/admin/outbox").await;
    let cut = format!("{}…", "e".repeat(1024));
    assert!(html.contains(&cut), "the cell shows the first 1,024 bytes");
    // The list holds the cut, and links the event's page, which shows it whole.
    assert!(
        html.contains(
            "<a class=\"all\" href=\"event?id=Shop%3A2%3A1\">show all (100000 bytes)</a>"
        ),
        "{html}"
    );
    assert!(
        !html.contains(&"e".repeat(1025)) && html.len() < 20_000,
        "the list sends the cut only ({} bytes)",
        html.len()
    );
    let whole = page.get("bob", "/admin/event?id=Shop%3A2%3A1").await;
    assert!(
        whole.contains(&format!(
            "<pre class=\"whole\">{}</pre>",
            "e".repeat(100_000)
        )),
        "the event's page shows the error whole"
    );
    let event = page.json("bob", "/admin/event?id=Shop:1:1").await;
    assert_eq!(event["last_error"], "bad\u{fffd}", "{event}");
    assert!(
        page.get("bob", "/admin/event?id=Shop:1:1")
            .await
            .contains("bad\u{fffd}")
    );
}

#[tokio::test]
async fn command_line_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("cli.db").display());
    let store = orderly::SqliteStore::demo(&url).await.unwrap();
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

// After the macros above, which they use.
#[path = "admin/browser.rs"]
mod browser;
#[path = "admin/cli.rs"]
mod cli;
#[path = "admin/page.rs"]
mod page;

use cli::{binary, cli_suite};
use page::suite;

/// A CSRF token expires (here after three seconds, counted in whole seconds), and a POST the browser says came from
/// another site (`Origin`, `Sec-Fetch-Site`) is refused whatever its token: 403,
/// nothing changed, nothing recorded. The same POST from the page's own origin acts.
#[tokio::test]
async fn stale_tokens_and_other_sites_are_refused_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("admin.db").display());
    let store = orderly::SqliteStore::demo(&url).await.unwrap();
    let engine: Engine<Shop, _> = Engine::new(store.clone()).unwrap();
    engine.create(1).await.unwrap();
    engine.transition(1, ShopEvent::Pay, "pay-1").await.unwrap();
    sqlx::query("UPDATE orderly_outbox SET status = 'DEAD'")
        .execute(store.pool())
        .await
        .unwrap();
    let admin = Admin::new(store.clone())
        .machine(engine)
        .access(|_| Viewer::full("alice"))
        .csrf_lifetime(Duration::from_secs(3));
    let router = axum::Router::new().nest("/admin", admin.router());
    let audited = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM orderly_audit")
            .fetch_one(store.pool())
            .await
            .unwrap()
    };
    let post = |token: String, cookie: Option<String>, headers: &[(&'static str, &'static str)]| {
        let router = router.clone();
        let headers = headers.to_vec();
        async move {
            let form = form_urlencoded::Serializer::new(String::new())
                .extend_pairs([
                    ("machine", "Shop"),
                    ("entity_id", "1"),
                    ("version", "1"),
                    ("csrf", token.as_str()),
                ])
                .finish();
            let mut request = Request::builder()
                .method("POST")
                .uri("/admin/requeue")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
            for (name, value) in headers {
                request = request.header(name, value);
            }
            if let Some(cookie) = cookie {
                request = request.header(header::COOKIE, cookie);
            }
            let response = router
                .oneshot(request.body(Body::from(form)).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    // A form drawn in a browser session: its token and the session's cookie.
    let drawn = || async {
        let request = Request::builder()
            .uri("/admin/outbox")
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let cookie = session_cookie(response.headers()).expect("a page gives a session");
        assert!(
            response.headers()[header::SET_COOKIE]
                .to_str()
                .unwrap()
                .ends_with("; Path=/admin; HttpOnly; SameSite=Lax"),
            "{:?}",
            response.headers()
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (csrf_of(&String::from_utf8_lossy(&body)), cookie)
    };
    let (token, cookie) = drawn().await;
    let ours = || Some(cookie.clone());
    // Behind a proxy that says the browser came over HTTPS, the cookie goes over HTTPS only.
    let request = Request::builder()
        .uri("/admin/outbox")
        .header("x-forwarded-proto", "https")
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let set = response.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(set.ends_with("; SameSite=Lax; Secure"), "{set}");
    for headers in [
        &[
            ("host", "localhost:8080"),
            ("origin", "http://evil.example"),
        ][..],
        &[("host", "localhost:8080"), ("origin", "null")][..],
        &[("sec-fetch-site", "cross-site")][..],
        &[("sec-fetch-site", "same-site")][..],
    ] {
        let (status, body) = post(token.clone(), ours(), headers).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}: {body}");
        assert!(body.contains("posted from another site"), "{body}");
    }
    assert_eq!(audited().await, 0, "a refused POST was recorded");
    // The token holds in the session it was drawn in only: not without its cookie, not
    // in another session of the same viewer.
    let (_, other) = drawn().await;
    assert_ne!(other, cookie);
    for cookie in [None, Some(other)] {
        let (status, body) = post(token.clone(), cookie.clone(), &[]).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{cookie:?}: {body}");
        assert!(body.contains("not of this browser session"), "{body}");
    }
    assert_eq!(audited().await, 0, "a refused POST was recorded");
    // A token whose expiry was moved (within the lifetime) is not the page's: the HMAC
    // covers it.
    let (expires, mac) = token.split_once('.').unwrap();
    let moved = format!("{}.{mac}", expires.parse::<u64>().unwrap() - 1);
    let (status, body) = post(moved, ours(), &[]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("CSRF token"), "{body}");
    // Past its lifetime the token is refused; the page draws a new one.
    tokio::time::sleep(Duration::from_millis(4100)).await;
    let (status, body) = post(token, ours(), &[("sec-fetch-site", "same-origin")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("expired: reload the page"), "{body}");
    assert_eq!(audited().await, 0);
    let (fresh, cookie) = drawn().await;
    let same_origin: &'static [(&str, &str)] = &[
        ("host", "localhost:8080"),
        ("origin", "http://localhost:8080"),
        ("sec-fetch-site", "same-origin"),
    ];
    let (status, body) = post(fresh, Some(cookie), same_origin).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(audited().await, 1);
}
