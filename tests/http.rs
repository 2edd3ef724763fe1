//! The Idempotency-Key layer, row by row of its table (`orderly::http`), driven with
//! `tower::ServiceExt::oneshot` over a handler that counts its runs, on SQLite records;
//! and under axum's `Router`, keyed by the matched route.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use orderly::http::{IdempotencyLayer, IdempotentRequest, InFlight, RoutePolicy};
use orderly::{Records, ScopeConfig, SqliteStore};
use sqlx::Connection;
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt};

type Body = BoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// The handler: counts its runs and answers by path.
#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicUsize>,
    records: Records<SqliteStore>,
    /// Told when a `/slow` request has begun.
    started: Arc<Notify>,
}

impl Handler {
    async fn answer(self, request: Request<Full<Bytes>>) -> Result<Response<Body>, Infallible> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let path = request.uri().path().to_string();
        let held = request
            .extensions()
            .get::<IdempotentRequest<SqliteStore>>()
            .cloned();
        let body = request.into_body().collect().await.unwrap().to_bytes();
        let json = format!(
            "{{\"run\":{n},\"path\":\"{path}\",\"echo\":{}}}",
            body.len()
        );
        let mut response = Response::builder()
            .header("content-type", "application/json")
            .header("set-cookie", "session=secret")
            .header("x-run", n.to_string());
        response = match path.as_str() {
            "/orders" | "/other" => response.status(StatusCode::CREATED),
            "/slow" => {
                self.started.notify_one();
                tokio::time::sleep(Duration::from_millis(400)).await;
                response.status(StatusCode::CREATED)
            }
            "/refused" => response.status(StatusCode::BAD_REQUEST),
            "/broken" => response.status(StatusCode::INTERNAL_SERVER_ERROR),
            "/big" => {
                return Ok(response
                    .status(StatusCode::OK)
                    .body(full(vec![b'x'; 2 << 20]))
                    .unwrap());
            }
            "/stream" => {
                let chunks = futures_util::stream::iter(
                    (0..3).map(|i| Ok(http_body::Frame::data(Bytes::from(format!("chunk{i};"))))),
                );
                return Ok(response
                    .status(StatusCode::OK)
                    .body(StreamBody::new(chunks).boxed())
                    .unwrap());
            }
            "/in-tx" | "/in-tx-rollback" => {
                let held = held.expect("a checked request carries its key");
                let mut conn = self.records.store().pool().acquire().await.unwrap();
                let mut tx = conn.begin().await.unwrap();
                sqlx::query("INSERT INTO http_effects (note) VALUES (?1)")
                    .bind(format!("run {n}"))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let mut headers = HeaderMap::new();
                headers.insert("content-type", "application/json".parse().unwrap());
                headers.insert("x-run", n.to_string().parse().unwrap());
                held.complete_in(&mut tx, StatusCode::CREATED, &headers, json.as_bytes())
                    .await
                    .unwrap();
                if path == "/in-tx" {
                    tx.commit().await.unwrap();
                } else {
                    tx.rollback().await.unwrap();
                }
                let mut out = Response::new(full(json));
                *out.status_mut() = StatusCode::CREATED;
                *out.headers_mut() = headers;
                return Ok(out);
            }
            _ => response.status(StatusCode::OK),
        };
        Ok(response.body(full(json)).unwrap())
    }
}

struct Rig {
    records: Records<SqliteStore>,
    runs: Arc<AtomicUsize>,
    started: Arc<Notify>,
    _dir: tempfile::TempDir,
}

async fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("http.db").display());
    let store = SqliteStore::demo(&url).await.unwrap();
    sqlx::query("CREATE TABLE http_effects (note TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let records = Records::new(store)
        .scope(
            "http",
            ScopeConfig::new(Duration::from_secs(10), Duration::from_secs(3600)),
        )
        .unwrap();
    Rig {
        records,
        runs: Arc::new(AtomicUsize::new(0)),
        started: Arc::new(Notify::new()),
        _dir: dir,
    }
}

impl Rig {
    fn layer(&self) -> IdempotencyLayer<SqliteStore> {
        IdempotencyLayer::new(self.records.clone(), "http").unwrap()
    }

    /// The handler under `layer`.
    fn service(
        &self,
        layer: IdempotencyLayer<SqliteStore>,
    ) -> impl Service<
        Request<Full<Bytes>>,
        Response = Response<orderly::http::LayerBody<Body>>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + use<> {
        let handler = Handler {
            runs: self.runs.clone(),
            records: self.records.clone(),
            started: self.started.clone(),
        };
        layer.layer(tower::service_fn(move |r| handler.clone().answer(r)))
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn post(path: &str, key: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut request = Request::builder().method(Method::POST).uri(path);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn problem_type(&self) -> String {
        assert_eq!(
            self.headers.get("content-type").unwrap(),
            "application/problem+json"
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        assert_eq!(v["status"], self.status.as_u16());
        v["type"].as_str().unwrap().to_string()
    }
}

async fn send<Svc>(service: &Svc, request: Request<Full<Bytes>>) -> Answer
where
    Svc: Service<
            Request<Full<Bytes>>,
            Response = Response<orderly::http::LayerBody<Body>>,
            Error = Infallible,
        > + Clone,
{
    let response = service.clone().oneshot(request).await.unwrap();
    let (head, body) = response.into_parts();
    Answer {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

#[tokio::test]
async fn a_repeat_is_replayed_with_status_headers_and_body() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    let first = send(&svc, post("/orders", Some("\"k-1\""), "{\"sku\":1}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.headers.get("set-cookie").unwrap(), "session=secret");
    for _ in 0..3 {
        let again = send(&svc, post("/orders", Some("k-1"), "{\"sku\":1}")).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers.get("x-run").unwrap(), "1");
        assert_eq!(
            again.headers.get("content-type").unwrap(),
            "application/json"
        );
        assert!(
            again.headers.get("set-cookie").is_none(),
            "a cookie replayed"
        );
    }
    assert_eq!(rig.runs(), 1);
}

#[tokio::test]
async fn missing_and_malformed_keys_are_refused_and_unchecked_methods_pass() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    let missing = send(&svc, post("/orders", None, "{}")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem_type(),
        "urn:orderly:problem:idempotency-key-missing"
    );
    let long = "k".repeat(201);
    for bad in ["\"\"", "\"open", "\" padded\"", long.as_str()] {
        let answer = send(&svc, post("/orders", Some(bad), "{}")).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(
            answer.problem_type(),
            "urn:orderly:problem:idempotency-key-malformed"
        );
    }
    let mut twice = post("/orders", Some("a"), "{}");
    twice
        .headers_mut()
        .append("idempotency-key", "b".parse().unwrap());
    assert_eq!(send(&svc, twice).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(rig.runs(), 0, "a refused request ran");
    // GET is not checked: no key needed, never replayed.
    for n in 1..=2 {
        let get = Request::get("/read").body(Full::new(Bytes::new())).unwrap();
        let answer = send(&svc, get).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert!(!answer.replayed());
        assert_eq!(rig.runs(), n);
    }
    // An optional route runs without a key, unchecked; a route left out passes.
    let svc = rig.service(
        rig.layer()
            .route(Method::POST, "/orders", Some(RoutePolicy::optional()))
            .route(Method::POST, "/other", None),
    );
    assert_eq!(
        send(&svc, post("/orders", None, "{}")).await.status,
        StatusCode::CREATED
    );
    let other = send(&svc, post("/other", Some("x"), "{}")).await;
    let again = send(&svc, post("/other", Some("x"), "{}")).await;
    assert!(!other.replayed() && !again.replayed());
    assert_eq!(rig.runs(), 5);
}

#[tokio::test]
async fn a_key_used_for_another_request_is_refused_with_422() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    send(&svc, post("/orders", Some("k"), "{\"sku\":1}")).await;
    for other in [
        post("/orders", Some("k"), "{\"sku\":2}"),
        post("/other", Some("k"), "{\"sku\":1}"),
        post("/orders?x=1", Some("k"), "{\"sku\":1}"),
        Request::patch("/orders")
            .header("idempotency-key", "k")
            .body(Full::new(Bytes::from("{\"sku\":1}")))
            .unwrap(),
    ] {
        let answer = send(&svc, other).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            answer.problem_type(),
            "urn:orderly:problem:idempotency-key-reused"
        );
    }
    assert_eq!(rig.runs(), 1);
    // Scoped by route, the same key on another route is another request.
    let scoped = rig.service(rig.layer().scope_by_route(true));
    let a = send(&scoped, post("/orders", Some("s"), "{}")).await;
    let b = send(&scoped, post("/other", Some("s"), "{}")).await;
    assert!(!a.replayed() && !b.replayed());
    assert_eq!(rig.runs(), 3);
}

#[tokio::test]
async fn keys_of_different_principals_never_meet() {
    let rig = rig().await;
    let layer = rig.layer().principal(|parts| {
        parts
            .headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    let svc = rig.service(layer);
    let as_user = |user: &str, body: &str| {
        let mut r = post("/orders", Some("same-key"), body);
        r.headers_mut().insert("x-user", user.parse().unwrap());
        r
    };
    let alice = send(&svc, as_user("alice", "{\"a\":1}")).await;
    let bob = send(&svc, as_user("bob", "{\"b\":2}")).await;
    assert!(!alice.replayed() && !bob.replayed());
    assert_eq!(rig.runs(), 2);
    let alice_again = send(&svc, as_user("alice", "{\"a\":1}")).await;
    assert!(alice_again.replayed());
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(rig.runs(), 2);
}

#[tokio::test]
async fn a_key_in_flight_is_409_with_retry_after_or_waited_for() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post("/slow", Some("slow-1"), "{}")).await }
    });
    rig.started.notified().await;
    let twin = send(&svc, post("/slow", Some("slow-1"), "{}")).await;
    assert_eq!(twin.status, StatusCode::CONFLICT);
    assert_eq!(
        twin.problem_type(),
        "urn:orderly:problem:idempotency-key-in-flight"
    );
    let retry: u64 = twin
        .headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "retry-after {retry}");
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(rig.runs(), 1, "the first request had not finished: a race");

    // Waiting: the twin gets the first request's response.
    let waiting = rig.service(
        rig.layer()
            .in_flight(InFlight::Wait(Duration::from_secs(5)))
            .unwrap(),
    );
    let first = tokio::spawn({
        let svc = waiting.clone();
        async move { send(&svc, post("/slow", Some("slow-2"), "{}")).await }
    });
    rig.started.notified().await;
    assert_eq!(rig.runs(), 2, "the first request is running");
    let twin = send(&waiting, post("/slow", Some("slow-2"), "{}")).await;
    let first = first.await.unwrap();
    assert_eq!(twin.status, StatusCode::CREATED);
    assert!(twin.replayed());
    assert_eq!(twin.body, first.body);
    assert_eq!(rig.runs(), 2);
    assert!(
        rig.layer()
            .in_flight(InFlight::Wait(Duration::from_secs(61)))
            .is_err()
    );

    // A wait shorter than the first request: 409 when it runs out.
    let short = rig.service(
        rig.layer()
            .in_flight(InFlight::Wait(Duration::from_millis(100)))
            .unwrap(),
    );
    let first = tokio::spawn({
        let svc = short.clone();
        async move { send(&svc, post("/slow", Some("slow-3"), "{}")).await }
    });
    rig.started.notified().await;
    let twin = send(&short, post("/slow", Some("slow-3"), "{}")).await;
    assert_eq!(twin.status, StatusCode::CONFLICT);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(rig.runs(), 3);
}

/// A request whose client goes away while the handler runs (its future dropped): the
/// handler runs to its end and its response is kept, so a repeat is replayed, not run.
#[tokio::test]
async fn a_request_dropped_mid_handler_still_keeps_its_response() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    let gone = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post("/slow", Some("gone"), "{}")).await }
    });
    rig.started.notified().await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let again = loop {
        let again = send(&svc, post("/slow", Some("gone"), "{}")).await;
        if again.status != StatusCode::CONFLICT {
            break again;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the record stayed held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed(), "the dropped request's handler ran again");
    assert_eq!(rig.runs(), 1);

    // A server shutting down waits for such a handler: once `handlers_finished` returns,
    // the dropped request's response is kept (its repeat replays at once).
    let layer = rig.layer();
    let svc = rig.service(layer.clone());
    let gone = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post("/slow", Some("gone-2"), "{}")).await }
    });
    rig.started.notified().await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    assert_eq!(
        send(&svc, post("/slow", Some("gone-2"), "{}")).await.status,
        StatusCode::CONFLICT,
        "the handler had already finished: the wait below shows nothing"
    );
    layer.handlers_finished().await;
    let again = send(&svc, post("/slow", Some("gone-2"), "{}")).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(rig.runs(), 2);
}

/// A handler that fails (the service's error): the record is released, and a repeat
/// runs it again.
#[tokio::test]
async fn a_failing_service_releases_the_key() {
    let rig = rig().await;
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = rig.layer().layer(tower::service_fn({
        let calls = calls.clone();
        move |_r: Request<Full<Bytes>>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<Response<Body>, std::io::Error>(std::io::Error::other("down")) }
        }
    }));
    for n in 1..=2 {
        let out = svc.clone().oneshot(post("/orders", Some("e"), "{}")).await;
        assert_eq!(out.unwrap_err().to_string(), "down");
        assert_eq!(calls.load(Ordering::SeqCst), n);
    }
}

#[tokio::test]
async fn server_errors_are_retried_and_client_errors_kept_as_the_route_says() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    for n in 1..=2 {
        let answer = send(&svc, post("/broken", Some("b"), "{}")).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!answer.replayed());
        assert_eq!(rig.runs(), n, "a 5xx is retried");
    }
    let refused = send(&svc, post("/refused", Some("r"), "{}")).await;
    let again = send(&svc, post("/refused", Some("r"), "{}")).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert!(again.replayed());
    assert_eq!(again.body, refused.body);
    assert_eq!(rig.runs(), 3);
    // Per route: keep 5xx, retry 4xx.
    let flipped = RoutePolicy {
        store_client_errors: false,
        store_server_errors: true,
        ..RoutePolicy::required()
    };
    let svc = rig.service(
        rig.layer()
            .route(Method::POST, "/broken", Some(flipped))
            .route(Method::POST, "/refused", Some(flipped)),
    );
    send(&svc, post("/broken", Some("b2"), "{}")).await;
    assert!(
        send(&svc, post("/broken", Some("b2"), "{}"))
            .await
            .replayed()
    );
    send(&svc, post("/refused", Some("r2"), "{}")).await;
    assert!(
        !send(&svc, post("/refused", Some("r2"), "{}"))
            .await
            .replayed()
    );
    assert_eq!(rig.runs(), 6);
}

#[tokio::test]
async fn bodies_are_bounded_and_large_or_streamed_responses_delivered_intact() {
    let rig = rig().await;
    let svc = rig.service(rig.layer().max_request_body(64));
    let large = send(&svc, post("/orders", Some("big-req"), &"y".repeat(65))).await;
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        large.problem_type(),
        "urn:orderly:problem:request-too-large"
    );
    assert_eq!(rig.runs(), 0);
    assert_eq!(
        send(&svc, post("/orders", Some("fits"), &"y".repeat(64)))
            .await
            .status,
        StatusCode::CREATED
    );
    for (path, expected) in [
        ("/big", Bytes::from(vec![b'x'; 2 << 20])),
        ("/stream", Bytes::from("chunk0;chunk1;chunk2;")),
    ] {
        let runs = rig.runs();
        let first = send(&svc, post(path, Some(path), "{}")).await;
        assert_eq!(first.status, StatusCode::OK);
        assert_eq!(first.body, expected, "{path} delivered cut");
        let again = send(&svc, post(path, Some(path), "{}")).await;
        assert_eq!(again.status, StatusCode::CONFLICT);
        assert!(again.replayed());
        assert_eq!(
            again.problem_type(),
            "urn:orderly:problem:response-not-replayable"
        );
        assert_eq!(rig.runs(), runs + 1, "{path} ran again");
    }
}

#[tokio::test]
async fn a_handler_keeps_its_response_in_its_own_transaction() {
    let rig = rig().await;
    let svc = rig.service(rig.layer());
    let first = send(&svc, post("/in-tx", Some("tx-1"), "{}")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = send(&svc, post("/in-tx", Some("tx-1"), "{}")).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers.get("x-run").unwrap(), "1");
    assert_eq!(rig.runs(), 1);
    // Rolled back: neither the effect nor the record committed, and a repeat runs again.
    let rolled = send(&svc, post("/in-tx-rollback", Some("tx-2"), "{}")).await;
    assert_eq!(rolled.status, StatusCode::CREATED);
    let again = send(&svc, post("/in-tx-rollback", Some("tx-2"), "{}")).await;
    assert!(!again.replayed());
    assert_eq!(rig.runs(), 3);
    let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM http_effects")
        .fetch_one(rig.records.store().pool())
        .await
        .unwrap();
    assert_eq!(effects, 1, "only the committed effect is there");
}

#[tokio::test]
async fn an_unknown_scope_is_refused_at_construction() {
    let rig = rig().await;
    assert!(matches!(
        IdempotencyLayer::new(rig.records.clone(), "nope"),
        Err(orderly::Error::InvalidInput(_))
    ));
}

/// Under axum: the layer added with `route_layer`, keyed by the matched route; one
/// policy covers `/orders/{id}/pay`, and a key is not carried from one order to another.
#[tokio::test]
async fn works_under_axum_keyed_by_the_matched_route() {
    use axum::Router;
    use axum::extract::{MatchedPath, Path};
    use axum::routing::post as axum_post;

    let rig = rig().await;
    let runs = rig.runs.clone();
    let layer = rig
        .layer()
        .route_of(|parts| {
            parts
                .extensions
                .get::<MatchedPath>()
                .map(|m| m.as_str().to_string())
        })
        .route(
            Method::POST,
            "/orders/{id}/pay",
            Some(RoutePolicy::required()),
        );
    let app: Router = Router::new()
        .route(
            "/orders/{id}/pay",
            axum_post(move |Path(id): Path<u64>| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("paid {id} (run {n})"))
                }
            }),
        )
        .route_layer(layer);
    let call = |path: &str, key: &str| {
        Request::post(path)
            .header("idempotency-key", key)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let read = |r: Response<axum::body::Body>| async move {
        let (head, body) = r.into_parts();
        (
            head.status,
            head.headers.get("idempotent-replayed").is_some(),
            body.collect().await.unwrap().to_bytes(),
        )
    };
    let first = read(
        app.clone()
            .oneshot(call("/orders/7/pay", "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        first,
        (StatusCode::CREATED, false, Bytes::from("paid 7 (run 1)"))
    );
    let again = read(
        app.clone()
            .oneshot(call("/orders/7/pay", "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        again,
        (StatusCode::CREATED, true, Bytes::from("paid 7 (run 1)"))
    );
    let other = read(
        app.clone()
            .oneshot(call("/orders/8/pay", "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    let missing = app
        .clone()
        .oneshot(
            Request::post("/orders/9/pay")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    assert_eq!(rig.runs(), 1);
}

/// The handler runs in the caller's span, though the layer runs it on a task of its own:
/// its spans, and whatever it reads from the current span, stay in the request's trace.
/// It finds the request's W3C trace context (`traceparent`, the `tracestate` headers as
/// one list) in its extensions, for the transitions whose events carry it; a
/// `traceparent` that does not read gives none.
#[tokio::test]
async fn the_handler_runs_in_the_callers_span_with_its_trace_context() {
    use tracing::Instrument;
    // A subscriber that gives spans ids; the test's runtime has one thread, where the
    // layer's task runs too.
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
    let rig = rig().await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen_in = seen.clone();
    let svc = rig
        .layer()
        .layer(tower::service_fn(move |r: Request<Full<Bytes>>| {
            let seen = seen_in.clone();
            async move {
                let trace = r.extensions().get::<orderly::TraceContext>().cloned();
                seen.lock()
                    .unwrap()
                    .push((tracing::Span::current().id(), trace));
                Ok::<_, Infallible>(Response::new(full("ok")))
            }
        }));
    let request = tracing::info_span!("request");
    assert!(request.id().is_some(), "the subscriber gave the span no id");
    let traced = |key: &str, traceparent: &str| {
        let mut r = post("/orders", Some(key), "{}");
        r.headers_mut()
            .insert("traceparent", traceparent.parse().unwrap());
        r.headers_mut().append("tracestate", "a=1".parse().unwrap());
        r.headers_mut().append("tracestate", "b=2".parse().unwrap());
        r
    };
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for r in [
        traced("k-span", tp),
        traced("k-bad", "00-not-a-trace"),
        post("/orders", Some("k-none"), "{}"),
    ] {
        let answer = send(&svc, r).instrument(request.clone()).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let want = orderly::TraceContext::parse(tp, Some("a=1,b=2")).unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            (request.id(), Some(want)),
            (request.id(), None),
            (request.id(), None)
        ]
    );
}
