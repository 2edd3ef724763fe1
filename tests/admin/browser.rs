//! The page in headless Chromium over WebDriver, with screenshots.

use super::*;

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

/// The text of the first element `css` matches on the overview, read again when the
/// page replaced the element between the find and the read (it refreshes its counts in
/// place: a WebDriver then answers "stale element reference").
async fn live_text(c: &fantoccini::Client, css: &str) -> String {
    for _ in 0..20 {
        let found = c.find(fantoccini::Locator::Css(css)).await.unwrap();
        match found.text().await {
            Ok(text) => return text,
            Err(e) if e.is_stale_element_reference() => continue,
            Err(e) => panic!("{css}: {e:?}"),
        }
    }
    panic!("{css}: replaced under every one of 20 reads");
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
    let store = orderly::SqliteStore::demo(&url).await.unwrap();
    let exec = exec_on!(store.pool());
    let Fixture {
        flows,
        records,
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
    let cards = live_text(&c, ".cards").await;
    assert!(cards.contains(&format!("Events dead\n{total}")), "{cards}");
    assert!(cards.contains("Flows parked\n2"), "{cards}");
    assert!(cards.contains("Records stuck\n1"), "{cards}");
    // The page's style applies under its policy (the embedded style, by its hash).
    let header = c
        .execute(
            "return getComputedStyle(document.querySelector('header')).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(header, "rgb(29, 35, 41)", "the page's style did not apply");
    shot("overview.png").await;
    // The overview refreshes its counts in place, with no reload: an event requeued by
    // hand shows within a few seconds in a page that kept its script state.
    c.execute("window.kept = 'this page'", vec![])
        .await
        .unwrap();
    (exec.run)("UPDATE orderly_outbox SET status = 'PENDING' WHERE entity_id = 2".into()).await;
    let dead_card = format!("Events dead\n{}", total - 1);
    let refreshed = server::eventually(Duration::from_secs(15), || {
        let (c, dead_card) = (c.clone(), dead_card.clone());
        async move { live_text(&c, ".cards").await.contains(&dead_card) }
    })
    .await;
    assert!(refreshed, "the overview's counts did not refresh");
    let kept = c.execute("return window.kept", vec![]).await.unwrap();
    assert_eq!(kept, "this page", "the page reloaded");
    let charts = c
        .find_all(Locator::Css("#live figure.chart svg polyline"))
        .await
        .unwrap();
    assert_eq!(charts.len(), 5, "published, pending, dead, timers, parked");
    shot("overview-live.png").await;
    (exec.run)("UPDATE orderly_outbox SET status = 'DEAD' WHERE entity_id = 2".into()).await;

    // Another site may not frame the page: its frame shows the browser's refusal, not
    // the page (nor the page's own answer to a viewer it does not know).
    let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_port = other.local_addr().unwrap().port();
    let framing = format!(
        "<!doctype html><title>another site</title>\
         <iframe src=\"{base}/outbox\" width=900 height=600></iframe>"
    );
    let site = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let framing = framing.clone();
            async move { axum::response::Html(framing) }
        }),
    );
    tokio::spawn(async move { axum::serve(other, site).await.unwrap() });
    c.goto(&format!("http://127.0.0.1:{other_port}/"))
        .await
        .unwrap();
    // The frame's answer, once it has one (the browser's refusal is a page of its own).
    let mut framed = String::new();
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        c.enter_frame(0).await.unwrap();
        framed = c.source().await.unwrap();
        c.enter_parent_frame().await.unwrap();
        if framed.contains("ERR_") || framed.contains("orderly") || framed.contains("not yours") {
            break;
        }
    }
    assert!(
        !framed.contains("orderly") && !framed.contains("not yours to see"),
        "the page was framed by another site: {framed}"
    );
    // The browser's own refusal, by its error code (not a frame still loading).
    assert!(framed.contains("ERR_BLOCKED_BY_RESPONSE"), "{framed}");
    shot("framed.png").await;
    c.goto(&base).await.unwrap();

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
    let buttons = c
        .find_all(Locator::Css("#dead form[action=\"requeue\"] button"))
        .await
        .unwrap();
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
        c.find_all(Locator::Css("#dead form[action=\"requeue\"] button"))
            .await
            .unwrap()
            .len(),
        total as usize - 1
    );
    let dead =
        (exec.scalar)("SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'".into()).await;
    assert_eq!(dead, total - 1);
    shot("dead-events.png").await;
    // A row orderly never writes (SQLite keeps text in an integer column): listed under
    // the dead events as stored, with why.
    (exec.run)(
        "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, \
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
    (exec.run)("DELETE FROM orderly_outbox WHERE entity_id = 'zz'".into()).await;
    // An error of 150,014 bytes: its first 1,024 in the cell, the whole under "show all".
    (exec.run)(
        "UPDATE orderly_outbox SET last_error = 'gateway said: ' || replace(hex(zeroblob(15000)), '00', 'no route; ') \
         WHERE status = 'DEAD' AND entity_id = (SELECT MIN(entity_id) FROM orderly_outbox WHERE status = 'DEAD')"
            .into(),
    )
    .await;
    // In the list, the first 1,024 bytes and a link; the event's page shows it whole.
    c.goto(&format!("{base}/outbox")).await.unwrap();
    let cell = c
        .find(Locator::Css("#dead td.err:has(a.all)"))
        .await
        .unwrap();
    let shown = cell.text().await.unwrap();
    assert!(
        shown.len() < 1_200 && shown.contains("show all (150014 bytes)"),
        "{} bytes shown: {}",
        shown.len(),
        &shown[..shown.len().min(200)]
    );
    shot("dead-events-long-error.png").await;
    cell.find(Locator::Css("a.all"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let whole = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("div.err pre.whole"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        whole.len() > 100_000,
        "the event's page: {} bytes",
        whole.len()
    );
    let headers = c
        .find(Locator::Id("headers"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(headers.contains("Orderly-Id"), "{headers}");
    shot("event.png").await;
    // A parked flow's page: its steps, each with its error, and its actions.
    c.goto(&format!("{base}/flow?kind=legacy&key=L-2"))
        .await
        .unwrap();
    let steps = c
        .find(Locator::Id("steps"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        steps.contains("Post") && steps.contains("<script>alert"),
        "the step, its error as text: {steps}"
    );
    c.find(Locator::XPath("//button[text()='Compensate']"))
        .await
        .unwrap();
    shot("flow.png").await;
    // The dead timer's page, opened from its list.
    c.goto(&format!("{base}/timers")).await.unwrap();
    c.find(Locator::Css("#timers td a[href^='timer?']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let timer = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("timer"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(timer.contains("DEAD"), "{timer}");
    c.find(Locator::XPath("//button[text()='Re-arm']"))
        .await
        .unwrap();
    shot("timer.png").await;

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
    // Asked first; confirmed with the page's one button.
    let ask = c
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("confirm"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(ask.starts_with("Release record"), "{ask}");
    shot("confirm.png").await;
    c.find(Locator::XPath("//button[text()='Yes, do it']"))
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

    // More stuck records than a page: the next page by its link, and back.
    futures_util::stream::iter(0..501)
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
    c.goto(&format!("{base}/records")).await.unwrap();
    let count = || async {
        c.find(Locator::Id("count"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    assert_eq!(count().await, "501 records are stuck; this page shows 500.");
    c.find(Locator::LinkText("Next page →"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::LinkText("← First page"))
        .await
        .unwrap();
    assert_eq!(count().await, "501 records are stuck; this page shows 1.");
    assert_eq!(
        c.find_all(Locator::Css("#stuck tr")).await.unwrap().len(),
        2
    );
    shot("records-next-page.png").await;
    c.close().await.unwrap();
}
