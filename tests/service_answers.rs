//! The example service's answers at the edges, over real sockets: a client that resets
//! its connection in the first milliseconds never holds its key; a database refusing
//! connections is 503 with `Retry-After`; a key in flight is told when its request is
//! likely done; the same payment sent under a second key while the first runs is a 409
//! with `Retry-After`, and its retry gets the first payment's answer; every error answer
//! is problem+json, one type per cause.

mod example_service;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use example_service::{Service, get, post};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;
use tokio::io::AsyncWriteExt;

/// Sends a whole `POST /orders` with `key` on a raw socket, waits `after`, and resets the
/// connection (SO_LINGER 0: an RST, not a FIN), without reading a byte of the answer.
async fn post_and_reset(svc: &Service, key: &str, after: Duration) {
    let addr = svc.base.trim_start_matches("http://");
    let body = json!({"sku": "sku-1", "qty": 1}).to_string();
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(after).await;
    socket_reset(&stream);
    drop(stream);
}

#[allow(deprecated)]
fn socket_reset(stream: &tokio::net::TcpStream) {
    stream.set_linger(Some(Duration::ZERO)).unwrap();
}

/// Clients reset their connections 0–5 ms after sending, one key each, while four others
/// post orders: each key's repeat is answered (201) within 5 s, far inside the 30 s
/// lease the service runs with, so no key was left held by a request nobody runs. The
/// stock shows every order taken once. Evidence that resets landed after a claim:
/// repeats answered as replays (the reset request ran to its end without its client).
async fn resets_never_hold_a_key(db: &str) {
    let svc = Service::start_with(db, &["--lease-ms", "30000"]);
    let client = reqwest::Client::new();
    let stock = |client: reqwest::Client, url: String| async move {
        get(&client, &url).await["available"].as_i64().unwrap()
    };
    let before = stock(client.clone(), svc.url("/stock/sku-1")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load_created = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..4)
        .map(|t| {
            let (client, url, stop, created) = (
                client.clone(),
                svc.url("/orders"),
                stop.clone(),
                load_created.clone(),
            );
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let key = format!("load-{t}-{n}");
                    let (status, _, body) =
                        post(&client, &url, Some(&key), json!({"sku": "sku-1", "qty": 1})).await;
                    assert_eq!(status, StatusCode::CREATED, "load {key}: {body}");
                    created.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    const KEYS: usize = 48;
    let (mut replayed, mut fresh, mut held_once) = (0, 0, 0);
    let mut longest = Duration::ZERO;
    for i in 0..KEYS {
        let key = format!("reset-{i}");
        // 0 to 5 ms, spread over the keys.
        let after = Duration::from_micros(((i * 1777) % 5001) as u64);
        post_and_reset(&svc, &key, after).await;
        let asked = Instant::now();
        let mut seen_held = false;
        let answer = loop {
            let answer = post(
                &client,
                &svc.url("/orders"),
                Some(&key),
                json!({"sku": "sku-1", "qty": 1}),
            )
            .await;
            if answer.0 != StatusCode::CONFLICT {
                break answer;
            }
            seen_held = true;
            assert!(
                asked.elapsed() < Duration::from_secs(5),
                "{key} (reset after {after:?}) is still held {:?} after the reset: {}",
                asked.elapsed(),
                answer.2
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        longest = longest.max(asked.elapsed());
        assert_eq!(answer.0, StatusCode::CREATED, "{key}: {}", answer.2);
        if answer.1 {
            replayed += 1;
        } else {
            fresh += 1;
        }
        held_once += usize::from(seen_held);
    }
    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.unwrap();
    }
    let created = load_created.load(Ordering::SeqCst) as i64;
    let after = stock(client.clone(), svc.url("/stock/sku-1")).await;
    println!(
        "{db}: {KEYS} resets: {replayed} replayed (ran without their client), {fresh} ran on \
         their repeat, {held_once} seen in flight; longest wait {longest:?}; {created} load orders"
    );
    assert!(
        replayed > 0,
        "no reset landed after its claim: the race was not run"
    );
    assert_eq!(
        before - after,
        created + KEYS as i64,
        "stock taken other than once per order"
    );
    assert!(svc.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_never_hold_a_key_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("service.db").display());
    resets_never_hold_a_key(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_never_hold_a_key_on_postgres() {
    let name = format!("orderly_resets_{}", std::process::id());
    let db = example_service::pg_db(&name).await;
    resets_never_hold_a_key(&db).await;
    example_service::drop_pg_db(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_never_hold_a_key_on_mariadb() {
    let name = format!("orderly_resets_{}", std::process::id());
    let db = example_service::mysql_db(&name).await;
    resets_never_hold_a_key(&db).await;
    example_service::drop_mysql_db(&name).await;
}

/// PostgreSQL refusing the service's database (`ALLOW_CONNECTIONS false`, its sessions
/// ended): a new key is answered 503 `idempotency-unavailable` with `Retry-After`, and
/// once the database takes connections again the same key runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_refusing_connections_is_503_with_retry_after() {
    let name = format!("orderly_refusing_{}", std::process::id());
    let db = example_service::pg_db(&name).await;
    let svc = Service::start(&db);
    let client = reqwest::Client::new();
    let mut admin = sqlx::PgConnection::connect(&example_service::pg_admin())
        .await
        .unwrap();
    let refuse = |allow: bool| {
        sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} ALLOW_CONNECTIONS {allow}; \
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ))
    };
    sqlx::raw_sql(refuse(false))
        .execute(&mut admin)
        .await
        .unwrap();
    // A session the service was opening while the database stopped taking new ones can
    // outlive the first round of terminations: end sessions until none is left twice in
    // a row, 100 ms apart.
    let mut quiet = 0;
    for _ in 0..50 {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1) AS t",
        )
        .bind(&name)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        quiet = if left == 0 { quiet + 1 } else { 0 };
        if quiet == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        quiet, 2,
        "sessions of the refused database kept coming back"
    );
    let response = client
        .post(svc.url("/orders"))
        .header("Idempotency-Key", "refused-1")
        .json(&json!({"sku": "sku-1", "qty": 1}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let retry_after = response.headers().get("retry-after").cloned();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        body["type"], "urn:orderly:problem:idempotency-unavailable",
        "{body}"
    );
    assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));

    sqlx::raw_sql(refuse(true))
        .execute(&mut admin)
        .await
        .unwrap();
    let (status, replayed, body) = post(
        &client,
        &svc.url("/orders"),
        Some("refused-1"),
        json!({"sku": "sku-1", "qty": 1}),
    )
    .await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{body}");
    drop(svc);
    example_service::drop_pg_db(&name).await;
}

/// With a 30 s lease, a repeat of a request that takes about 0.8 s (`sku-slow`) is told
/// to come back in a second or two, not in the rest of the lease. On PostgreSQL: on
/// SQLite the slow step holds the single write lock for its 0.8 s, so the repeat's claim
/// waits for it and then races the first request's completion for the lock, and is told
/// in flight or given the kept response by whichever commits first (both true answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_of_a_key_in_flight_is_when_it_is_likely_done() {
    let name = format!("orderly_retry_after_{}", std::process::id());
    let db = example_service::pg_db(&name).await;
    let svc = Service::start_with(&db, &["--lease-ms", "30000"]);
    let client = reqwest::Client::new();
    // The route's handler times, as the service sees them: two slow orders.
    for key in ["slow-a", "slow-b"] {
        let (status, _, body) = post(
            &client,
            &svc.url("/orders"),
            Some(key),
            json!({"sku": "sku-slow", "qty": 1}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // The repeat is sent 200 ms after the first; on a loaded machine the first may not
    // have reached the service by then (the repeat then runs, and the first replays):
    // another key is tried.
    for attempt in 0..5 {
        let key = format!("slow-c-{attempt}");
        let first = {
            let (client, url, key) = (client.clone(), svc.url("/orders"), key.clone());
            tokio::spawn(async move {
                post(
                    &client,
                    &url,
                    Some(&key),
                    json!({"sku": "sku-slow", "qty": 1}),
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let repeat = client
            .post(svc.url("/orders"))
            .header("Idempotency-Key", &key)
            .json(&json!({"sku": "sku-slow", "qty": 1}))
            .send()
            .await
            .unwrap();
        let status = repeat.status();
        let after = repeat.headers().get("retry-after").cloned();
        assert_eq!(first.await.unwrap().0, StatusCode::CREATED);
        if status != StatusCode::CONFLICT {
            continue;
        }
        let after: u64 = after
            .expect("Retry-After")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (1..=2).contains(&after),
            "Retry-After: {after} (lease 30 s, handler 0.8 s)"
        );
        drop(svc);
        example_service::drop_pg_db(&name).await;
        return;
    }
    panic!("no repeat met its first request in flight in 5 tries");
}

/// The same payment (order and card) under a second key while the first still runs (the
/// capture of `slow-4242` takes 0.8 s): 409 naming the conflict, with `Retry-After`; the
/// retry under that second key, once the first is done, is the first payment's answer,
/// and the order was charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_payment_under_a_second_key_is_409_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("service.db").display());
    let svc = Service::start_with(&db, &["--lease-ms", "30000"]);
    let client = reqwest::Client::new();
    let (status, _, order) = post(
        &client,
        &svc.url("/orders"),
        Some("dup-order"),
        json!({"sku": "sku-1", "qty": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let pay = svc.url(&format!("/orders/{}/pay", order["id"]));
    let first = {
        let (client, pay) = (client.clone(), pay.clone());
        tokio::spawn(async move {
            post(
                &client,
                &pay,
                Some("pay-key-1"),
                json!({"card": "slow-4242"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = client
        .post(&pay)
        .header("Idempotency-Key", "pay-key-2")
        .json(&json!({"card": "slow-4242"}))
        .send()
        .await
        .unwrap();
    let status = second.status();
    assert_eq!(
        second.headers()["content-type"],
        "application/problem+json",
        "the in-flight answer is problem+json"
    );
    let after = second.headers().get("retry-after").cloned();
    let body: serde_json::Value = second.json().await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        body["type"], "urn:orderly:problem:idempotency-key-in-flight",
        "the layer's in-flight type, whoever answers: {body}"
    );
    let after: u64 = after
        .expect("Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&after), "Retry-After: {after}");

    let (status, _, paid) = first.await.unwrap();
    assert_eq!(status, StatusCode::ACCEPTED, "{paid}");
    let (status, replayed, again) = post(
        &client,
        &pay,
        Some("pay-key-2"),
        json!({"card": "slow-4242"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert!(!replayed, "the 409 was kept and replayed");
    assert_eq!(again["payment_id"], paid["payment_id"]);
}

/// An error answer: status, content type, `Retry-After`, body.
async fn answer_of(
    request: reqwest::RequestBuilder,
) -> (StatusCode, String, Option<String>, serde_json::Value) {
    let response = request.send().await.expect("the service answers");
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let (kind, after) = (
        header("content-type").unwrap_or_default(),
        header("retry-after"),
    );
    let body = response.json().await.unwrap_or(serde_json::Value::Null);
    (status, kind, after, body)
}

/// Every error answer of the service, its handlers' and the framework's (a body that is
/// no JSON, a wrong media type, a path that does not read, an unknown route, a method a
/// route does not take) and the layer's: `application/problem+json` with `type`,
/// `title`, `status` (the response's) and `detail`, one type per cause; the causes a
/// client retries carry `Retry-After` (the in-flight case in
/// [`a_duplicate_payment_under_a_second_key_is_409_with_retry_after`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_answer_is_problem_json_one_type_per_cause() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("service.db").display());
    let svc = Service::start(&db);
    let client = reqwest::Client::new();
    let (status, _, order) = post(
        &client,
        &svc.url("/orders"),
        Some("problems-1"),
        json!({"sku": "sku-1", "qty": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let id = order["id"].as_i64().unwrap();
    let (status, _, paid) = post(
        &client,
        &svc.url(&format!("/orders/{id}/pay")),
        Some("problems-pay"),
        json!({"card": "4242"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paid}");
    let (status, _, called) = post(
        &client,
        &svc.url("/webhooks/gateway"),
        None,
        json!({"order_id": id, "payment_id": paid["payment_id"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{called}");
    let hold = client
        .put(svc.url(&format!("/orders/{id}/hold")))
        .send()
        .await
        .unwrap();
    assert_eq!(hold.status(), StatusCode::OK);
    let keyed = |r: reqwest::RequestBuilder, key: &str| r.header("Idempotency-Key", key);
    let cases: Vec<(&str, reqwest::RequestBuilder, StatusCode, &str)> = vec![
        (
            "no key",
            client
                .post(svc.url("/orders"))
                .json(&json!({"sku": "sku-1", "qty": 1})),
            StatusCode::BAD_REQUEST,
            "urn:orderly:problem:idempotency-key-missing",
        ),
        (
            "a quantity out of range",
            keyed(client.post(svc.url("/orders")), "problems-2")
                .json(&json!({"sku": "sku-1", "qty": 0})),
            StatusCode::BAD_REQUEST,
            "urn:shop:problem:invalid-request",
        ),
        (
            "a body that is no JSON",
            keyed(client.post(svc.url("/orders")), "problems-3")
                .header("content-type", "application/json")
                .body("{not json"),
            StatusCode::BAD_REQUEST,
            "urn:shop:problem:invalid-request",
        ),
        (
            "a body of the wrong media type",
            keyed(client.post(svc.url("/orders")), "problems-4")
                .header("content-type", "text/plain")
                .body("sku-1"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "urn:shop:problem:unsupported-media-type",
        ),
        (
            "JSON of the wrong shape",
            keyed(client.post(svc.url("/orders")), "problems-5").json(&json!({"sku": 7})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:shop:problem:unprocessable-request",
        ),
        (
            "an id that is no number",
            client.get(svc.url("/orders/abc")),
            StatusCode::BAD_REQUEST,
            "urn:shop:problem:invalid-request",
        ),
        (
            "no such order",
            client.get(svc.url("/orders/987654321")),
            StatusCode::NOT_FOUND,
            "urn:shop:problem:not-found",
        ),
        (
            "no such route",
            client.get(svc.url("/nowhere")),
            StatusCode::NOT_FOUND,
            "urn:shop:problem:not-found",
        ),
        (
            "a method the route does not take",
            client.delete(svc.url("/orders")),
            StatusCode::METHOD_NOT_ALLOWED,
            "urn:shop:problem:method-not-allowed",
        ),
        (
            "paying a paid order",
            keyed(
                client.post(svc.url(&format!("/orders/{id}/pay"))),
                "problems-6",
            )
            .json(&json!({"card": "4242"})),
            StatusCode::CONFLICT,
            "urn:shop:problem:invalid-transition",
        ),
        (
            "a second payment's callback",
            client
                .post(svc.url("/webhooks/gateway"))
                .json(&json!({"order_id": id, "payment_id": "pay_other"})),
            StatusCode::CONFLICT,
            "urn:shop:problem:paid-by-another-payment",
        ),
        (
            "a callback whose reference reads as another",
            client
                .post(svc.url("/webhooks/gateway"))
                .json(&json!({"order_id": id, "payment_id": "pay_1\u{202E}2ab"})),
            StatusCode::BAD_REQUEST,
            "urn:shop:problem:invalid-request",
        ),
        (
            "shipping an order on hold",
            keyed(
                client.post(svc.url(&format!("/orders/{id}/ship"))),
                "problems-7",
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
            "urn:shop:problem:refused",
        ),
        (
            "a resumption of no known kind",
            client
                .post(svc.url("/flows/pay/none/resume"))
                .json(&json!({"how": "sideways"})),
            StatusCode::BAD_REQUEST,
            "urn:shop:problem:invalid-request",
        ),
    ];
    for (what, request, want_status, want_type) in cases {
        let (status, kind, after, body) = answer_of(request).await;
        assert_eq!(status, want_status, "{what}: {body}");
        assert_eq!(kind, "application/problem+json", "{what}: {body}");
        assert_eq!(body["type"], want_type, "{what}: {body}");
        assert_eq!(body["status"], status.as_u16(), "{what}: {body}");
        assert!(
            body["title"].as_str().is_some_and(|t| !t.is_empty())
                && body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{what}: {body}"
        );
        assert_eq!(after, None, "{what}: a retry is not the answer");
        if want_type.ends_with("paid-by-another-payment") {
            assert_eq!(
                body["paid_by"].as_str().map(|p| p.starts_with("pay_")),
                Some(true),
                "{body}"
            );
        }
        if want_type.ends_with("refused") {
            assert_eq!(body["code"], "on_hold", "{body}");
        }
    }
    // A declined card: the payment's own type, the authorization voided.
    let (status, _, order) = post(
        &client,
        &svc.url("/orders"),
        Some("problems-8"),
        json!({"sku": "sku-1", "qty": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let (status, kind, after, body) = answer_of(
        client
            .post(svc.url(&format!("/orders/{}/pay", order["id"])))
            .header("Idempotency-Key", "problems-9")
            .json(&json!({"card": "decline-4000"})),
    )
    .await;
    assert_eq!(
        (status, kind.as_str(), after, body["type"].as_str()),
        (
            StatusCode::PAYMENT_REQUIRED,
            "application/problem+json",
            None,
            Some("urn:shop:problem:payment-declined")
        ),
        "{body}"
    );
    assert_eq!(body["voided"], true, "{body}");
}
