//! The page over HTTP: who may see and act, the CSRF token, escaping, and every action,
//! each checked in the database and in the audit trail.

use super::*;

/// The whole suite on one store.
pub(super) async fn suite<S: AdminStore>(store: S, exec: Exec<S>) {
    let Fixture {
        flows,
        records,
        engine,
        down,
        router,
        exec,
        total,
    } = fixture(store, exec, BULK).await;
    let page = Page::new(router);

    // Hardened: every answer (a page, its JSON, a refusal) may not be framed, runs and
    // loads nothing but its own style (by its hash), is kept by no cache, sends no
    // Referer, and has its type believed.
    for (user, uri) in [
        ("bob", "/admin"),
        ("bob", "/admin/outbox?format=json"),
        ("bob", "/admin/graph?machine=Shop"),
        ("mallory", "/admin"),
    ] {
        let (status, headers) = page.headers(user, uri).await;
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
        let csp = header("content-security-policy").unwrap_or_default();
        assert!(
            csp.starts_with("default-src 'none'; style-src 'sha256-"),
            "{uri} ({status}): {csp}"
        );
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'self'"),
            "{csp}"
        );
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(header("x-frame-options").as_deref(), Some("DENY"), "{uri}");
        assert_eq!(
            header("x-content-type-options").as_deref(),
            Some("nosniff"),
            "{uri}"
        );
        assert_eq!(
            header("cache-control").as_deref(),
            Some("no-store"),
            "{uri}"
        );
        assert_eq!(
            header("referrer-policy").as_deref(),
            Some("same-origin"),
            "{uri}"
        );
    }
    // The one style the page embeds is the one the policy's hash names, and no element
    // carries a style of its own (the policy would refuse it).
    let html = page.get("bob", "/admin/graph?machine=Shop").await;
    let (_, headers) = page.headers("bob", "/admin").await;
    let csp = headers["content-security-policy"].to_str().unwrap();
    let style = {
        let from = html.find("<style>").unwrap() + "<style>".len();
        &html[from..from + html[from..].find("</style>").unwrap()]
    };
    let hash = {
        use base64::Engine as _;
        use sha2::Digest as _;
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(style))
    };
    assert!(csp.contains(&format!("style-src 'sha256-{hash}'")), "{csp}");
    assert_eq!(html.matches("<style").count(), 1);
    // The one script, the overview's, is the one the policy's hash names; no other page
    // carries one.
    let overview = page.get("bob", "/admin").await;
    let script = {
        let from = overview.find("<script>").unwrap() + "<script>".len();
        &overview[from..from + overview[from..].find("</script>").unwrap()]
    };
    let hash = {
        use base64::Engine as _;
        use sha2::Digest as _;
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(script))
    };
    assert!(
        csp.contains(&format!("script-src 'sha256-{hash}'")),
        "{csp}"
    );
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    assert_eq!(overview.matches("<script").count(), 1);
    assert!(!html.contains("<script"), "the graph page runs a script");
    for path in ["/admin", "/admin/graph?machine=Shop", "/admin/outbox"] {
        assert!(
            !page.get("bob", path).await.contains(" style="),
            "{path} has an inline style"
        );
    }

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
    // With a trailing slash, sent to the overview.
    let (status, _, location) = page.call("bob", "GET", "/admin/", None).await;
    assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(location.as_deref(), Some("/admin"));
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
    // The pages of one thing: an event, a flow, a timer; each linked from its list,
    // escaped, with its actions for alice and none for bob.
    let dead_page = page.get("bob", "/admin/outbox?machine=Shop").await;
    assert!(
        dead_page.contains("href=\"event?id=Shop%3A1%3A1\""),
        "the list links the event"
    );
    assert!(
        flows_page.contains("href=\"flow?kind=legacy&amp;key=L-1\""),
        "the list links the flow"
    );
    let event = page.json("bob", "/admin/event?id=Shop:1:1").await;
    assert_eq!(event["status"], "DEAD", "{event}");
    assert_eq!(event["last_error"], HOSTILE, "{event}");
    assert_eq!(event["ref_id"], HOSTILE, "{event}");
    assert!(
        event["headers"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(["Orderly-Id", "Shop:1:1"])),
        "{event}"
    );
    for (user, acts) in [("bob", false), ("alice", true)] {
        let html = page.get(user, "/admin/event?id=Shop:1:1").await;
        assert!(
            html.contains("&lt;script&gt;") && !html.contains(HOSTILE),
            "{html}"
        );
        assert_eq!(html.contains("action=\"requeue\""), acts, "{user}: {html}");
        let html = page.get(user, "/admin/flow?kind=legacy&key=L-1").await;
        assert!(
            html.contains("NEEDS_RECONCILIATION") && !html.contains(HOSTILE),
            "{html}"
        );
        assert_eq!(html.contains("action=\"resume\""), acts, "{user}: {html}");
        let html = page
            .get(
                user,
                "/admin/timer?machine=Shop&id=99999&event=Cancel&ref=late",
            )
            .await;
        assert!(html.contains("it kept failing"), "{html}");
        assert_eq!(
            html.contains("action=\"rearm\"") && html.contains("action=\"cancel-timer\""),
            acts,
            "{user}: {html}"
        );
    }
    let flow = page.json("bob", "/admin/flow?kind=legacy&key=L-1").await;
    let steps = flow["steps"].as_array().unwrap();
    assert!(!steps.is_empty(), "{flow}");
    assert!(
        steps.iter().any(|s| s["error"] == HOSTILE),
        "each step with its error: {flow}"
    );
    let timer = page
        .json(
            "bob",
            "/admin/timer?machine=Shop&id=99999&event=Cancel&ref=late",
        )
        .await;
    assert_eq!(timer["status"], "DEAD", "{timer}");
    for (uri, want) in [
        ("/admin/event?id=Shop:424242:1", StatusCode::NOT_FOUND),
        ("/admin/event?id=nope", StatusCode::BAD_REQUEST),
        ("/admin/flow?kind=legacy&key=none", StatusCode::NOT_FOUND),
        ("/admin/flow?kind=legacy", StatusCode::BAD_REQUEST),
        (
            "/admin/timer?machine=Shop&id=99999&event=Cancel&ref=other",
            StatusCode::NOT_FOUND,
        ),
        (
            "/admin/timer?machine=Shop&id=x&event=Cancel&ref=late",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, body, _) = page.call("bob", "GET", uri, None).await;
        assert_eq!(status, want, "{uri}: {body}");
    }
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
    // By prefix: what starts with the term, case counting; the first 100 of a kind.
    let found = page.json("bob", "/admin/search?q=pay-100&prefix=1").await;
    let mut refs: Vec<i64> = found["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["order_id"].as_i64().unwrap())
        .collect();
    refs.sort_unstable();
    let expected: Vec<i64> = (2..=total)
        .filter(|id| format!("pay-{id}").starts_with("pay-100"))
        .collect();
    assert_eq!(refs, expected, "{found}");
    assert_eq!(found["events"].as_array().unwrap().len(), expected.len());
    assert_eq!(
        found["entities"],
        serde_json::json!([]),
        "no entity by prefix"
    );
    let found = page.json("bob", "/admin/search?q=PAY-100&prefix=1").await;
    assert_eq!(
        found["history"],
        serde_json::json!([]),
        "case counts: {found}"
    );
    let found = page.json("bob", "/admin/search?q=req-st&prefix=1").await;
    assert_eq!(found["records"][0]["idem_key"], STUCK_KEY, "{found}");
    let found = page.json("bob", "/admin/search?q=L-&prefix=1").await;
    let keys: Vec<&str> = found["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["flow_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["L-1", "L-2"], "{found}");
    let html = page.get("bob", "/admin/search?q=pay-&prefix=1").await;
    assert!(
        html.contains("(starts with)") && html.contains("Only the first 100 of a kind"),
        "{html}"
    );
    // Characters a LIKE pattern would take as wildcards are text here.
    let found = page.json("bob", "/admin/search?q=pay-1%25&prefix=1").await;
    assert_eq!(found["history"], serde_json::json!([]), "{found}");
    let found = page.json("bob", "/admin/search?q=pay_1&prefix=1").await;
    assert_eq!(found["history"], serde_json::json!([]), "{found}");
    let (status, body, _) = page.call("bob", "GET", "/admin/search?q=a%0Ab", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body, _) = page
        .call("bob", "GET", "/admin/outbox?older=soon", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let stuck = page.json("bob", "/admin/records").await;
    assert_eq!(stuck["stuck"][0]["idem_key"], STUCK_KEY, "{stuck}");
    assert_eq!(stuck["count"], 1, "{stuck}");
    assert_eq!(page.json("bob", "/admin/timers").await["count"], 1);
    // Parked flows: counted, and paged by kind and key.
    let parked = page.json("bob", "/admin/flows").await;
    assert_eq!(parked["count"], 2, "{parked}");
    assert_eq!(parked["parked"].as_array().unwrap().len(), 2, "{parked}");
    assert_eq!(parked["next"], serde_json::Value::Null, "{parked}");
    let after = page
        .json("bob", "/admin/flows?after_kind=legacy&after_key=L-1")
        .await;
    assert_eq!(after["count"], 2, "{after}");
    let keys: Vec<_> = after["parked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["flow_key"].clone())
        .collect();
    assert_eq!(keys, [serde_json::json!("L-2")], "{after}");
    assert!(
        page.get("bob", "/admin/flows?after_kind=legacy&after_key=L-1")
            .await
            .contains("2 flows are parked; this page shows 1."),
        "the page after says how many there are"
    );
    let (status, body, _) = page
        .call("bob", "GET", "/admin/flows?after_kind=legacy", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
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
    let dead_now = count(
        &exec,
        "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'",
    )
    .await;
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
            "SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = 1 AND status = 'PENDING'"
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
            ("confirm", "yes"),
        ]
    };
    // The few come after the many in key order: the filter is the statement's, so the
    // page lists them all and counts them true, whatever comes before them.
    let dead_now = count(
        &exec,
        "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'",
    )
    .await;
    assert!(dead_now > 500, "{dead_now}");
    let listed = page
        .json("bob", "/admin/outbox?machine=Shop&error=schema")
        .await;
    assert_eq!(listed["matching"], OTHERS, "the matches of error=schema");
    assert_eq!(listed["next"], serde_json::Value::Null, "{listed}");
    let few = listed["dead"].as_array().unwrap();
    assert_eq!(few.len() as i64, OTHERS);
    assert!(
        few.iter()
            .all(|r| r["last_error"].as_str().unwrap().contains("schema")),
        "{listed}"
    );
    let html = page
        .get("alice", "/admin/outbox?machine=Shop&error=schema")
        .await;
    assert!(
        html.contains(&format!("{OTHERS} dead events match."))
            && html.contains(&format!("Requeue every match ({OTHERS})"))
            && !html.contains("Next page"),
        "the page counts the matches true"
    );
    // Each condition in the statement, each way: the text of the error (case counts),
    // the event, the machine, the age.
    let matching = |query: &'static str| {
        let page = &page;
        async move { page.json("bob", &format!("/admin/outbox?{query}")).await["matching"].clone() }
    };
    let event = few[0]["event"].as_str().unwrap().to_string();
    assert_eq!(matching("error=SCHEMA").await, 0);
    assert_eq!(matching("machine=Nope").await, 0);
    assert_eq!(matching("event=Nope").await, 0);
    assert_eq!(
        page.json("bob", &format!("/admin/outbox?event={event}"))
            .await["matching"],
        dead_now
    );
    assert_eq!(matching("older=0").await, dead_now);
    assert_eq!(matching("older=3600").await, 0);
    // The many, paged: every page at most 500, in key order, each event once, until the
    // page with no next.
    let (mut seen_keys, mut pages, mut uri) = (
        Vec::new(),
        0,
        "/admin/outbox?machine=Shop&error=gateway".to_string(),
    );
    loop {
        let listed = page.json("bob", &uri).await;
        assert_eq!(listed["matching"], BULK, "{uri}");
        let rows = listed["dead"].as_array().unwrap();
        assert!(
            !rows.is_empty() && rows.len() <= 500,
            "{uri}: {}",
            rows.len()
        );
        seen_keys.extend(rows.iter().map(|r| {
            (
                r["entity_id"].as_i64().unwrap(),
                r["version"].as_i64().unwrap(),
            )
        }));
        pages += 1;
        match listed["next"].as_str() {
            Some(next) => {
                assert_eq!(
                    next,
                    format!(
                        "Shop:{}:{}",
                        seen_keys.last().unwrap().0,
                        seen_keys.last().unwrap().1
                    )
                );
                uri = format!("/admin/outbox?machine=Shop&error=gateway&after={next}");
            }
            None => break,
        }
    }
    assert_eq!(seen_keys.len() as i64, BULK, "every match read");
    assert!(
        seen_keys.windows(2).all(|w| w[0] < w[1]),
        "in key order, each once"
    );
    assert_eq!(pages, (BULK + 499) / 500);
    // The page links the next, and from there the first.
    let first = page
        .get("bob", "/admin/outbox?machine=Shop&error=gateway")
        .await;
    let next = format!(
        "outbox?machine=Shop&amp;error=gateway&amp;after=Shop%3A{}%3A{}",
        seen_keys[499].0, seen_keys[499].1
    );
    assert!(
        first.contains(&next) && !first.contains("First page"),
        "{first}"
    );
    let second = page
        .get(
            "bob",
            &next
                .replace("&amp;", "&")
                .replace("outbox?", "/admin/outbox?"),
        )
        .await;
    assert!(
        second.contains("outbox?machine=Shop&amp;error=gateway\">← First page"),
        "{second}"
    );
    let (status, body, _) = page
        .call("bob", "GET", "/admin/outbox?after=Shop:x", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("message id"), "{body}");
    // Asked first: without confirm=yes, a page saying how many it would requeue, whose
    // one button posts the same fields confirmed; nothing done, nothing recorded.
    let audit_before = count(&exec, "SELECT COUNT(*) FROM orderly_audit").await;
    let unconfirmed = &bulk("schema")[..4];
    let (status, ask, _) = page
        .post("alice", "/admin/requeue-matching", unconfirmed)
        .await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(
        ask.contains(&format!(
            "Requeue dead events where machine=Shop, error=schema: {OTHERS} now"
        )) && ask.contains("name=\"confirm\" value=\"yes\"")
            && ask.contains("action=\"requeue-matching\""),
        "{ask}"
    );
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'"
        )
        .await,
        dead_now,
        "nothing requeued before the confirmation"
    );
    assert_eq!(
        count(&exec, "SELECT COUNT(*) FROM orderly_audit").await,
        audit_before
    );
    let (status, body, location) = page
        .post("alice", "/admin/requeue-matching", &bulk("schema"))
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains(&format!("{OTHERS}+changed")));
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'"
        )
        .await,
        BULK
    );
    // The many, and the client hangs up once the requeue is under way (axum then drops
    // the handler): the action runs to its end and is recorded all the same.
    let dead = || {
        count(
            &exec,
            "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'",
        )
    };
    let audited = || count(&exec, "SELECT COUNT(*) FROM orderly_audit");
    let form = bulk("gateway");
    let hung_up = tokio::select! {
        answer = page.post("alice", "/admin/requeue-matching", &form) => {
            panic!("the requeue of {BULK} answered before the client hung up: {answer:?}")
        }
        at = async {
            loop {
                let now = dead().await;
                if now < BULK {
                    break (now, audited().await);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } => at,
    };
    // Evidence the hang-up came mid-action: some moved, not all, nothing recorded yet.
    assert!(hung_up.0 > 0 && hung_up.0 < BULK, "{hung_up:?}");
    assert_eq!(hung_up.1, 2, "recorded before it ended: {hung_up:?}");
    let until = std::time::Instant::now() + Duration::from_secs(600);
    while audited().await < 3 {
        assert!(
            std::time::Instant::now() < until,
            "the hung-up requeue was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dead().await, 0);
    // Every event is waiting now (no relay runs here): the backlog, counted and paged,
    // each row with its age in words and its time on hover.
    let waiting = count(
        &exec,
        "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'PENDING'",
    )
    .await;
    assert!(waiting > 500, "{waiting}");
    let backlog = page.json("bob", "/admin/outbox?status=pending").await;
    assert_eq!(backlog["matching"], waiting);
    assert_eq!(backlog["pending"].as_array().unwrap().len(), 500);
    let next = backlog["next"].as_str().unwrap().to_string();
    let second = page
        .json("bob", &format!("/admin/outbox?status=pending&after={next}"))
        .await;
    assert_eq!(
        second["pending"][0]["entity_id"],
        backlog["pending"][499]["entity_id"].as_i64().unwrap() + 1,
        "the next page goes on past the last key"
    );
    let html = page.get("alice", "/admin/outbox?status=pending").await;
    assert!(
        html.contains(&format!("{waiting} events waiting match"))
            && html.contains("<span class=\"when\" title=\"")
            && !html.contains("action=\"requeue"),
        "the backlog: counted, ages in words, nothing to requeue"
    );
    assert!(
        html.contains("outbox?status=pending&amp;after="),
        "its next page keeps the status"
    );
    // A NUL in a query value: a 400 on every backend (PostgreSQL refuses it in a text).
    for uri in [
        "/admin/outbox?machine=a%00b",
        "/admin/event?id=Sh%00op:1:1",
        "/admin/flow?kind=legacy&key=L%00",
    ] {
        let (status, body, _) = page.call("bob", "GET", uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
    }
    let (status, body, _) = page
        .call("bob", "GET", "/admin/outbox?status=gone", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
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
    // The flows by listing: the finished one, the parked other.
    let finished = page.json("bob", "/admin/flows?which=finished").await;
    assert_eq!(finished["count"], 1, "{finished}");
    assert_eq!(finished["finished"][0]["flow_key"], "L-1", "{finished}");
    assert_eq!(
        page.json("bob", "/admin/flows?which=parked").await["count"],
        1
    );
    assert_eq!(
        page.json("bob", "/admin/flows?which=running").await["count"],
        0
    );
    let (status, body, _) = page
        .call("bob", "GET", "/admin/flows?which=gone", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
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
        ("confirm", "yes"),
    ];
    let (status, ask, _) = page.post("alice", "/admin/release", &release[..3]).await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(
        ask.contains("Are you sure?") && ask.contains("Yes, do it"),
        "{ask}"
    );
    assert_eq!(
        page.json("bob", "/admin").await["records"]["stuck"],
        1,
        "asked, not done"
    );
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
    // More stuck than a page: the overview and the list count them all, the list shows
    // a page. (The claim above holds its key for 100 ms as well.)
    const MANY: i64 = 600;
    futures_util::stream::iter(0..MANY)
        .for_each_concurrent(8, |i| {
            let records = records.clone();
            async move {
                let claimed = records
                    .claim(SCOPE, &format!("many-{i}"), &1)
                    .await
                    .unwrap();
                assert!(matches!(claimed, Claim::Claimed(_)));
            }
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        page.json("bob", "/admin").await["records"]["stuck"],
        MANY + 1
    );
    let stuck = page.json("bob", "/admin/records").await;
    assert_eq!(stuck["count"], MANY + 1);
    assert_eq!(stuck["stuck"].as_array().unwrap().len(), 500);
    assert!(
        page.get("bob", "/admin/records").await.contains(&format!(
            "{} records are stuck; this page shows 500.",
            MANY + 1
        )),
        "the list says how many there are"
    );

    // Every stuck record, page after page by the next link, each once; all with one
    // lease end, so that the pages turn on the scope and key alone.
    (exec.run)(
        "UPDATE orderly_idempotency_records SET lease_until = 1000 \
         WHERE scope = 'checkout' AND status = 'PROCESSING'"
            .into(),
    )
    .await;
    let mut seen_keys = std::collections::BTreeSet::new();
    let mut uri = "/admin/records?format=json".to_string();
    let mut pages = 0;
    loop {
        let listed = page.json("bob", &uri).await;
        assert_eq!(listed["count"], MANY + 1);
        let rows = listed["stuck"].as_array().unwrap();
        assert!(rows.len() <= 500);
        for r in rows {
            assert!(
                seen_keys.insert(r["idem_key"].as_str().unwrap().to_string()),
                "{r} listed twice"
            );
        }
        pages += 1;
        let Some(next) = listed["next"].as_object() else {
            break;
        };
        uri = format!(
            "/admin/records?format=json&after_lease={}&after_scope={}&after_key={}",
            next["lease_until"],
            next["scope"].as_str().unwrap(),
            next["idem_key"].as_str().unwrap()
        );
    }
    assert_eq!((pages, seen_keys.len() as i64), (2, MANY + 1));
    assert!(
        page.get("bob", "/admin/records")
            .await
            .contains("records?after_lease="),
        "the list links its next page"
    );
    // Records in flight: claimed under a long lease, listed apart from the stuck.
    let held = Records::new(flows.store().clone())
        .scope(
            "held",
            ScopeConfig::new(Duration::from_secs(3600), Duration::from_secs(86_400)),
        )
        .unwrap();
    for key in ["h-1", "h-2", "h-3"] {
        assert!(matches!(
            held.claim("held", key, &1).await.unwrap(),
            Claim::Claimed(_)
        ));
    }
    let inflight = page
        .json("bob", "/admin/records?which=inflight&scope=held")
        .await;
    assert_eq!(inflight["count"], 3, "{inflight}");
    let keys: Vec<&str> = inflight["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["idem_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["h-1", "h-2", "h-3"], "in lease order");
    assert!(inflight["in_flight"][0]["lease_left_ms"].as_i64().unwrap() > 3_000_000);
    assert_eq!(page.json("bob", "/admin").await["records"]["in_flight"], 3);
    assert_eq!(
        page.json("bob", "/admin/records?scope=held").await["count"],
        0,
        "none of them is stuck"
    );
    let html = page.get("alice", "/admin/records?which=inflight").await;
    assert!(
        html.contains("3 records are in flight.") && !html.contains("action=\"release\""),
        "in flight: counted, nothing to release"
    );
    for uri in [
        "/admin/records?which=gone",
        "/admin/records?after_lease=soon",
    ] {
        let (status, body, _) = page.call("bob", "GET", uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
    }

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
            "SELECT COUNT(*) FROM orderly_timers WHERE entity_id = 99999 AND status = 'PENDING'"
        )
        .await,
        1
    );
    let pending = page.json("bob", "/admin/timers?status=pending").await;
    assert_eq!(pending["count"], 1, "{pending}");
    assert_eq!(pending["pending"][0]["entity_id"], 99_999, "{pending}");
    assert_eq!(page.json("bob", "/admin/timers").await["count"], 0);
    let (status, ask, _) = page.post("alice", "/admin/cancel-timer", &key).await;
    assert_eq!(status, StatusCode::OK, "asked first: {ask}");
    assert!(
        ask.contains("Cancel timer Cancel late of Shop 99999"),
        "{ask}"
    );
    let confirmed: Vec<(&str, &str)> = key.iter().copied().chain([("confirm", "yes")]).collect();
    assert_eq!(
        page.post("alice", "/admin/cancel-timer", &confirmed)
            .await
            .0,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM orderly_timers WHERE entity_id = 99999 AND status = 'CANCELLED'"
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

    // Timers past a page: 601 pending, their next attempts in ties of three (broken by
    // id) and their due times the other way round, read page after page by the next
    // link, each once, in the order of their next attempt.
    let values: Vec<String> = (1..=601)
        .map(|i| {
            let next = 4_102_444_800_000_i64 + i64::from(i / 3);
            let due = 4_102_444_800_000_i64 - i64::from(i);
            format!("('Paged', {i}, 'Cancel', 'p', {due}, {next}, 'PENDING', 0)")
        })
        .collect();
    (exec.run)(format!(
        "INSERT INTO orderly_timers (machine, entity_id, event, ref_id, due_at, next_at, \
         status, created_at) VALUES {}",
        values.join(", ")
    ))
    .await;
    let (mut seen_timers, mut order, mut pages) = (std::collections::BTreeSet::new(), vec![], 0);
    let mut uri = "/admin/timers?status=pending&format=json".to_string();
    loop {
        let listed = page.json("bob", &uri).await;
        assert_eq!(listed["count"], 601, "{listed}");
        for t in listed["pending"].as_array().unwrap() {
            assert!(
                seen_timers.insert(t["entity_id"].as_i64().unwrap()),
                "{t} listed twice"
            );
            order.push(t["entity_id"].as_i64().unwrap());
        }
        pages += 1;
        let Some(next) = listed["next"].as_object() else {
            break;
        };
        uri = format!(
            "/admin/timers?status=pending&format=json&after_at={}&after_id={}",
            next["next_at"], next["id"]
        );
    }
    assert_eq!((pages, seen_timers.len()), (2, 601));
    // Entity i was inserted i-th (its id in that order), next attempt i / 3, due -i.
    assert!(
        order.is_sorted(),
        "in the order of their next attempt, then of their id: {order:?}"
    );
    let html = page.get("bob", "/admin/timers?status=pending").await;
    assert!(
        html.contains("601 timers are pending; this page shows 500.")
            && html.contains("timers?status=pending&amp;after_at="),
        "the list counts and links its next page"
    );
    for uri in [
        "/admin/timers?after_at=soon&after_id=1",
        "/admin/timers?after_at=1",
    ] {
        let (status, body, _) = page.call("bob", "GET", uri, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
    }
    (exec.run)("DELETE FROM orderly_timers WHERE machine = 'Paged'".into()).await;

    // Discard a dead event: asked first (nothing done, nothing recorded), then deleted,
    // recorded; never a pending one; refused to a read-only viewer.
    (exec.run)("UPDATE orderly_outbox SET status = 'DEAD' WHERE entity_id = 3".into()).await;
    let listed = page.get("alice", "/admin/outbox").await;
    assert!(listed.contains("action=\"discard\""), "{listed}");
    assert!(
        !page
            .get("bob", "/admin/outbox")
            .await
            .contains("action=\"discard\"")
    );
    let token = csrf_of(&listed);
    let third = [("machine", "Shop"), ("entity_id", "3"), ("version", "1")];
    let audited = || async { count(&exec, "SELECT COUNT(*) FROM orderly_audit").await };
    let before = audited().await;
    let (status, ask, _) = page
        .post("alice", "/admin/discard", &with(&third, &token))
        .await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(
        ask.contains("Discard dead event Shop 3 v1") && ask.contains("never published"),
        "{ask}"
    );
    let rows_of = |id: i64| {
        let exec = &exec;
        async move {
            count(
                exec,
                &format!("SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = {id}"),
            )
            .await
        }
    };
    assert_eq!(rows_of(3).await, 1, "asked, not done");
    assert_eq!(audited().await, before, "asked, not recorded");
    let mut confirmed = with(&third, &token);
    confirmed.push(("confirm", "yes"));
    assert_eq!(
        page.post("bob", "/admin/discard", &confirmed).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(rows_of(3).await, 1, "a read-only viewer discarded");
    let (status, body, location) = page.post("alice", "/admin/discard", &confirmed).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains("1+changed"));
    assert_eq!(rows_of(3).await, 0, "the dead event is gone");
    let audit = page.json("bob", "/admin/audit").await;
    assert_eq!(audit["audit"][0]["action"], "outbox.discard", "{audit}");
    assert_eq!(audit["audit"][0]["target"], "Shop 3 v1");
    assert_eq!(audit["audit"][0]["affected"], 1);
    let (_, _, location) = page.post("alice", "/admin/discard", &confirmed).await;
    assert!(location.unwrap().contains("0+changed"), "discarded twice");
    // A pending event is not discarded.
    let fourth = [
        ("machine", "Shop"),
        ("entity_id", "4"),
        ("version", "1"),
        ("csrf", token.as_str()),
        ("confirm", "yes"),
    ];
    let (_, _, location) = page.post("alice", "/admin/discard", &fourth).await;
    assert!(location.unwrap().contains("0+changed"));
    assert_eq!(rows_of(4).await, 1, "a pending event was discarded");
    let (status, body, _) = page
        .post(
            "alice",
            "/admin/discard",
            &[
                ("machine", "Shop"),
                ("entity_id", "x"),
                ("version", "1"),
                ("csrf", &token),
                ("confirm", "yes"),
            ],
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Discard every match: asked first with how many, then deleted, recorded once; the
    // pending events and the dead of other filters left alone.
    (exec.run)(
        "UPDATE orderly_outbox SET status = 'DEAD', last_error = 'discard me' \
         WHERE machine = 'Shop' AND entity_id IN (6, 7, 8)"
            .into(),
    )
    .await;
    (exec.run)(
        "UPDATE orderly_outbox SET status = 'DEAD', last_error = 'keep me' \
         WHERE machine = 'Shop' AND entity_id = 9"
            .into(),
    )
    .await;
    let listed = page.get("alice", "/admin/outbox?error=discard+me").await;
    assert!(listed.contains("Discard every match (3)"), "{listed}");
    let matching = [
        ("machine", ""),
        ("event", ""),
        ("error", "discard me"),
        ("older", ""),
    ];
    let before = audited().await;
    let (status, ask, _) = page
        .post("alice", "/admin/discard-matching", &with(&matching, &token))
        .await;
    assert_eq!(status, StatusCode::OK, "{ask}");
    assert!(
        ask.contains("Discard dead events where error=discard me: 3 now")
            && ask.contains("never published")
            && ask.contains("action=\"discard-matching\""),
        "{ask}"
    );
    assert_eq!(
        (rows_of(6).await, audited().await),
        (1, before),
        "asked, not done"
    );
    let mut confirmed = with(&matching, &token);
    confirmed.push(("confirm", "yes"));
    assert_eq!(
        page.post("bob", "/admin/discard-matching", &confirmed)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    let (status, body, location) = page
        .post("alice", "/admin/discard-matching", &confirmed)
        .await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert!(location.unwrap().contains("3+changed"));
    for id in [6, 7, 8] {
        assert_eq!(rows_of(id).await, 0, "dead event {id} left");
    }
    assert_eq!(
        (rows_of(9).await, rows_of(4).await),
        (1, 1),
        "others discarded"
    );
    let audit = page.json("bob", "/admin/audit").await;
    assert_eq!(audit["audit"][0]["action"], "outbox.discard", "{audit}");
    assert_eq!(
        audit["audit"][0]["target"],
        "dead events where error=discard me"
    );
    assert_eq!(audit["audit"][0]["affected"], 3);
    assert_eq!(audited().await, before + 1);
    (exec.run)("UPDATE orderly_outbox SET status = 'PENDING' WHERE entity_id = 9".into()).await;

    // The overview's live part (its counts and charts, which its script reads every few
    // seconds) and its charts of the last hour, sampled by the page's own task: an event
    // that dies shows in the later samples.
    let sampled = Page::new(
        admin_of(flows.store(), &flows, &records, &engine)
            .sample_every(Duration::from_millis(100))
            .access(|_| Viewer::read_only("bob"))
            .router_at("/admin"),
    );
    let first = sampled.json("bob", "/admin").await;
    assert_eq!(first["outbox"]["dead"], 0, "{first}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    (exec.run)("UPDATE orderly_outbox SET status = 'DEAD' WHERE entity_id = 5".into()).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = sampled.json("bob", "/admin").await;
    let trend: Vec<u64> = later["trend"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["dead"].as_u64().unwrap())
        .collect();
    assert!(trend.len() >= 5, "sampled while no one looked: {trend:?}");
    assert_eq!((trend[0], trend[trend.len() - 1]), (0, 1), "{trend:?}");
    let live = sampled.get("bob", "/admin?part=live").await;
    assert!(
        live.contains("id=\"chart-dead\"")
            && live.contains("<polyline")
            && live.contains("Events dead: <b>1</b> now")
            && !live.contains("<html"),
        "{live}"
    );
    let overview = sampled.get("bob", "/admin").await;
    assert!(
        overview.contains("<div id=\"live\">") && overview.contains("id=\"chart-pending\""),
        "{overview}"
    );
    // The throughput: what a relay publishes now counts as published in the last minute,
    // and is charted.
    let published = |o: serde_json::Value| o["outbox"]["published_last_minute"].as_u64().unwrap();
    let before = published(sampled.json("bob", "/admin").await);
    assert_eq!(before, 0, "no relay ran before here");
    let (sink, _received) = orderly::outbox::ChannelSink::new();
    let round = orderly::outbox::Relay::new(flows.store().clone(), sink)
        .relay_once()
        .await
        .unwrap();
    assert!(round.published > 0, "{round:?}");
    let after = published(sampled.json("bob", "/admin").await);
    assert_eq!(after, before + round.published as u64);
    let live = sampled.get("bob", "/admin?part=live").await;
    assert!(
        live.contains("id=\"chart-published\"")
            && live.contains(&format!("Events published a minute: <b>{after}</b> now")),
        "{live}"
    );

    // A long timeline is paged, newest first, 500 at a time, read by the history's key:
    // entity 2 with 1,200 more rows (versions 2 to 1,201).
    for chunk in (2..=1201).collect::<Vec<i64>>().chunks(300) {
        let rows: Vec<String> = chunk
            .iter()
            .map(|seq| format!("(2, {seq}, 'Paid', 'Paid', 'Pay', 'bulk-{seq}')"))
            .collect();
        (exec.run)(format!(
            "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) \
             VALUES {}",
            rows.join(", ")
        ))
        .await;
    }
    let mut before = None::<i64>;
    let mut seen = Vec::new();
    for page_no in 0..4 {
        let uri = match before {
            None => "/admin/entity?machine=Shop&id=2".to_string(),
            Some(b) => format!("/admin/entity?machine=Shop&id=2&before={b}"),
        };
        let t = page.json("bob", &uri).await;
        let versions: Vec<i64> = t["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["seq"].as_i64().unwrap())
            .collect();
        assert!(
            versions.len() <= 500,
            "page {page_no}: {} rows",
            versions.len()
        );
        assert!(versions.windows(2).all(|w| w[0] > w[1]), "newest first");
        seen.extend(versions);
        let html = page.get("bob", &uri).await;
        match t["older"].as_i64() {
            Some(older) => {
                assert_eq!(Some(&older), seen.last(), "{uri}");
                assert!(
                    html.contains(&format!("before={older}")),
                    "no link to older"
                );
                before = Some(older);
            }
            None => {
                assert!(!html.contains("Older history"), "{uri}");
                break;
            }
        }
    }
    assert_eq!(
        seen,
        (1..=1201).rev().collect::<Vec<i64>>(),
        "every version once, in order"
    );
    let (status, body, _) = page
        .call(
            "bob",
            "GET",
            "/admin/entity?machine=Shop&id=2&before=soon",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}
