//! End to end: the example service (`examples/service/`) as a real process on
//! loopback, driven over real HTTP by reqwest, on SQLite, PostgreSQL and MariaDB (a database
//! of the test's own): one order for 64 concurrent identical requests, a callback
//! delivered three times at once, a second payment refused with the winner's id, the
//! service killed with SIGKILL mid-load and restarted, and a client that hangs up
//! mid-request.

mod example_service;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use example_service::{Service, get, open_transactions, post, scalar, stuck_transactions};
use reqwest::StatusCode;
use serde_json::json;

/// Creates an order under `key`, retrying a 409 in flight, and returns its id.
async fn create(client: &reqwest::Client, svc: &Service, key: &str, sku: &str) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = post(
            client,
            &svc.url("/orders"),
            Some(key),
            json!({"sku": sku, "qty": 1}),
        )
        .await;
        if status == StatusCode::CREATED {
            return body["id"].as_i64().unwrap();
        }
        assert!(
            status == StatusCode::CONFLICT && Instant::now() < deadline,
            "{status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// When a request was sent and when its answer came.
#[derive(Debug, Clone, Copy)]
struct Span {
    sent: Instant,
    answered: Instant,
}

/// Runs `call`, noting when it was sent and when it was answered.
async fn timed<T>(call: impl std::future::Future<Output = T>) -> (T, Span) {
    let sent = Instant::now();
    let out = call.await;
    (
        out,
        Span {
            sent,
            answered: Instant::now(),
        },
    )
}

/// How many requests `counts` picks out that ran while request `first` ran (sent before
/// it was answered, answered after it was sent).
fn raced(spans: &[Span], first: usize, counts: impl Fn(usize) -> bool) -> usize {
    let f = spans[first];
    (0..spans.len())
        .filter(|&i| i != first && counts(i))
        .filter(|&i| spans[i].sent < f.answered && f.sent < spans[i].answered)
        .count()
}

/// The whole story on one database.
async fn story(db: &str) {
    let svc = Service::start(db);
    let client = reqwest::Client::new();
    let before = get(&client, &svc.url("/stock/sku-1")).await["available"]
        .as_i64()
        .unwrap();

    // 64 concurrent identical POSTs with one key: one order; the others replay (or are
    // told 409 while it runs, and replay when they retry).
    let (answers, spans): (Vec<_>, Vec<_>) = futures_util::future::join_all((0..64).map(|_| {
        let (client, url) = (client.clone(), svc.url("/orders"));
        timed(async move {
            post(
                &client,
                &url,
                Some("storm-1"),
                json!({"sku": "sku-1", "qty": 1}),
            )
            .await
        })
    }))
    .await
    .into_iter()
    .unzip();
    let created: Vec<_> = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::CREATED)
        .collect();
    let fresh = created.iter().filter(|(_, replayed, _)| !replayed).count();
    assert_eq!(fresh, 1, "one request ran: {answers:?}");
    for (status, _, body) in &answers {
        assert!(
            *status == StatusCode::CREATED || *status == StatusCode::CONFLICT,
            "{status} {body}"
        );
    }
    let ids: HashSet<_> = created.iter().map(|(_, _, b)| b["id"].clone()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    // The race happened: a request found the first one in flight (409), or was sent
    // while it ran and was answered with its replay.
    let first = answers
        .iter()
        .position(|(s, replayed, _)| *s == StatusCode::CREATED && !replayed)
        .unwrap();
    let in_flight = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::CONFLICT)
        .count();
    let replayed_while_running = raced(&spans, first, |i| answers[i].1);
    assert!(
        in_flight + replayed_while_running > 0,
        "no request of the storm overlapped the one that ran: no race"
    );
    let id = create(&client, &svc, "storm-1", "sku-1").await;
    assert_eq!(
        get(&client, &svc.url("/stock/sku-1")).await["available"],
        before - 1,
        "stock taken once"
    );

    // Pay, and the gateway's callback delivered three times at once: one Paid.
    let (status, _, paid) = post(
        &client,
        &svc.url(&format!("/orders/{id}/pay")),
        Some("pay-1"),
        json!({"card": "4242"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paid}");
    let payment = paid["payment_id"].as_str().unwrap().to_string();
    let (callbacks, spans): (Vec<_>, Vec<_>) = futures_util::future::join_all((0..3).map(|_| {
        let (client, url) = (client.clone(), svc.url("/webhooks/gateway"));
        let payment = payment.clone();
        timed(async move {
            post(
                &client,
                &url,
                None,
                json!({"order_id": id, "payment_id": payment}),
            )
            .await
        })
    }))
    .await
    .into_iter()
    .unzip();
    let applied = callbacks
        .iter()
        .filter(|(s, _, b)| *s == StatusCode::OK && b["replayed"] == false)
        .count();
    assert_eq!(applied, 1, "{callbacks:?}");
    assert!(callbacks.iter().all(|(s, _, _)| *s == StatusCode::OK));
    // The race happened: a callback answered as a replay was sent while the one that
    // applied was still running.
    let first = callbacks
        .iter()
        .position(|(_, _, b)| b["replayed"] == false)
        .unwrap();
    let replayed_while_running = raced(&spans, first, |i| callbacks[i].2["replayed"] == true);
    assert!(
        replayed_while_running > 0,
        "no callback was sent while the one that applied ran: no race"
    );
    // A second payment for the paid order: refused, naming the winner.
    let (status, _, refused) = post(
        &client,
        &svc.url("/webhooks/gateway"),
        None,
        json!({"order_id": id, "payment_id": "pay_second"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["paid_by"], payment.as_str());
    let order = get(&client, &svc.url(&format!("/orders/{id}"))).await;
    assert_eq!(order["state"], "Paid");
    assert_eq!(order["history"].as_array().unwrap().len(), 1);

    // Shipping while the order is on hold: the edge's guard refuses (422, kept for its
    // key); released, the order ships under a new key, and its shipment (the edge's
    // effect) is recorded once however often the request is repeated.
    let hold = client
        .put(svc.url(&format!("/orders/{id}/hold")))
        .send()
        .await
        .unwrap();
    assert_eq!(hold.status(), StatusCode::OK);
    let ship_url = svc.url(&format!("/orders/{id}/ship"));
    let (status, _, held) = post(&client, &ship_url, Some("ship-held"), json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{held}");
    assert_eq!(held["code"], "on_hold");
    let (status, replayed, _) = post(&client, &ship_url, Some("ship-held"), json!({})).await;
    assert_eq!((status, replayed), (StatusCode::UNPROCESSABLE_ENTITY, true));
    let order = get(&client, &svc.url(&format!("/orders/{id}"))).await;
    assert_eq!(
        (order["state"].clone(), order["shipments"].clone()),
        (json!("Paid"), json!(0))
    );
    let released = client
        .delete(svc.url(&format!("/orders/{id}/hold")))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::OK);
    for _ in 0..2 {
        let (status, _, shipped) = post(&client, &ship_url, Some("ship-1"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{shipped}");
        assert_eq!(shipped["state"], "Shipped");
    }
    let order = get(&client, &svc.url(&format!("/orders/{id}"))).await;
    assert_eq!(
        (order["state"].clone(), order["shipments"].clone()),
        (json!("Shipped"), json!(1))
    );

    // A client that hangs up mid-request: the request still finishes, and its repeat is
    // replayed, not run again.
    let (target, slow_key) = (
        create(&client, &svc, "hangup-order", "sku-1").await,
        "hangup-pay",
    );
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let cut = impatient
        .post(svc.url(&format!("/orders/{target}/pay")))
        .header("Idempotency-Key", slow_key)
        .json(&json!({"card": "slow-4242"}))
        .send()
        .await;
    assert!(
        cut.is_err_and(|e| e.is_timeout()),
        "the client did not hang up"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let again = loop {
        let answer = post(
            &client,
            &svc.url(&format!("/orders/{target}/pay")),
            Some(slow_key),
            json!({"card": "slow-4242"}),
        )
        .await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(Instant::now() < deadline, "the hung-up request stayed held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(again.0, StatusCode::ACCEPTED, "{:?}", again.2);
    assert!(
        again.1,
        "the hung-up request ran again instead of replaying"
    );

    // A client that hangs up while its request holds a database transaction open
    // (`sku-slow` sleeps inside the reservation's transaction): the hang-up is seen to
    // land while a transaction is open, the request still finishes, nothing is left in a
    // transaction, and the repeat replays the order.
    let cut = impatient
        .post(svc.url("/orders"))
        .header("Idempotency-Key", "hangup-slow")
        .json(&json!({"sku": "sku-slow", "qty": 1}))
        .send()
        .await;
    assert!(
        cut.is_err_and(|e| e.is_timeout()),
        "the client did not hang up"
    );
    assert!(
        open_transactions(db).await > 0,
        "the hang-up did not land inside the reservation's transaction"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let replay = loop {
        let answer = post(
            &client,
            &svc.url("/orders"),
            Some("hangup-slow"),
            json!({"sku": "sku-slow", "qty": 1}),
        )
        .await;
        if answer.0 != StatusCode::CONFLICT {
            break answer;
        }
        assert!(Instant::now() < deadline, "the hung-up request stayed held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(replay.0, StatusCode::CREATED, "{:?}", replay.2);
    assert!(replay.1, "the hung-up order was created again");
    for _ in 0..5 {
        assert_eq!(
            stuck_transactions(db).await,
            0,
            "a connection stayed in a transaction after the hung-up request"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        get(&client, &svc.url("/stock/sku-slow")).await["available"],
        999,
        "the stock taken once"
    );

    // Killed with SIGKILL mid-load (four clients sending at once), then restarted:
    // every request answered once retried, every order created once, the stock taken
    // once per order. The kill counts only if it left a request held (claimed, not
    // finished): up to three tries.
    let stock = get(&client, &svc.url("/stock/sku-1")).await["available"]
        .as_i64()
        .unwrap();
    let mut svc = svc;
    let mut keys: Vec<String> = Vec::new();
    let mut held = 0;
    for attempt in 0..3 {
        let batch: Vec<String> = (0..60).map(|i| format!("load-{attempt}-{i}")).collect();
        keys.extend(batch.iter().cloned());
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let senders: Vec<_> = batch
            .chunks(15)
            .map(|chunk| {
                let (client, url) = (client.clone(), svc.url("/orders"));
                let (chunk, answered) = (chunk.to_vec(), answered.clone());
                tokio::spawn(async move {
                    for key in chunk {
                        let sent = client
                            .post(&url)
                            .header("Idempotency-Key", &key)
                            .json(&json!({"sku": "sku-1", "qty": 1}))
                            .send()
                            .await;
                        if sent.is_err() {
                            return;
                        }
                        answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while answered.load(std::sync::atomic::Ordering::SeqCst) < 10 {
            assert!(Instant::now() < deadline, "the load never got going");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        svc.kill();
        for sender in senders {
            let _ = sender.await;
        }
        held = scalar(
            db,
            "SELECT COUNT(*) FROM orderly_idempotency_records WHERE status = 'PROCESSING'",
        )
        .await;
        svc = Service::start(db);
        if held > 0 {
            break;
        }
    }
    assert!(
        held > 0,
        "no kill left a request held: the kill never came mid-request"
    );
    for key in &keys {
        create(&client, &svc, key, "sku-1").await;
    }
    assert_eq!(
        scalar(
            db,
            "SELECT COUNT(*) FROM orderly_idempotency_records WHERE status = 'PROCESSING'"
        )
        .await,
        0,
        "a request stayed held"
    );
    let after = get(&client, &svc.url("/stock/sku-1")).await["available"]
        .as_i64()
        .unwrap();
    assert_eq!(
        after,
        stock - keys.len() as i64,
        "an order's stock taken twice or never"
    );
    let metrics = client
        .get(svc.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("orderly_claims_total"), "{metrics}");

    // The operators' page, mounted at /admin: support reads (no action, a POST refused),
    // nobody else sees it.
    let page = |user: Option<&'static str>, path: &str| {
        let mut request = client.get(svc.url(path));
        if let Some(user) = user {
            request = request.header("x-user", user);
        }
        request.send()
    };
    assert_eq!(
        page(None, "/admin").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let overview: serde_json::Value = page(Some("support"), "/admin?format=json")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(overview["machines"], json!(["OrderMachine"]), "{overview}");
    let html = page(Some("support"), "/admin/outbox")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        html.contains("Dead events") && !html.contains("method=\"post\""),
        "{html}"
    );
    let forged = client
        .post(svc.url("/admin/requeue"))
        .header("x-user", "support")
        .form(&[
            ("machine", "OrderMachine"),
            ("entity_id", "1"),
            ("version", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let operator = page(Some("operator"), "/admin/flows")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(operator.contains("operator · full access"), "{operator}");
    assert!(svc.stop().success(), "a graceful stop failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("service.db").display());
    story(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_on_postgres() {
    let name = format!("orderly_service_{}", std::process::id());
    let db = example_service::pg_db(&name).await;
    story(&db).await;
    example_service::drop_pg_db(&name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_on_mariadb() {
    let name = format!("orderly_service_{}", std::process::id());
    let db = example_service::mysql_db(&name).await;
    story(&db).await;
    example_service::drop_mysql_db(&name).await;
}

/// `--help` prints the usage and ends well; an option it does not know, or a value that
/// does not read, ends with status 2 and a line naming it, never a panic.
#[test]
fn the_command_line_answers_help_and_bad_options() {
    let run = |args: &[&str]| {
        std::process::Command::new(example_service::binary())
            .args(args)
            .output()
            .unwrap()
    };
    let help = run(&["--help"]);
    assert!(help.status.success(), "{help:?}");
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("usage: service"));
    for (args, names) in [
        (&["--lease-ms", "soon"][..], "--lease-ms soon: milliseconds"),
        (&["--listen", "nowhere"][..], "--listen nowhere: an address"),
        (&["--frobnicate"][..], "--frobnicate: not an option"),
        (&["--db"][..], "--db needs a value"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
