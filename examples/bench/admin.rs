//! The admin mode (feature `admin`; `--admin-history N` or `--only admin`): the
//! operators' page over a database the size of a live one — N history rows, N/10 outbox
//! rows (1 in 100 dead, 1 in 100 waiting), N/100 idempotency records (1 in 100 stuck),
//! N/100 timers (1 in 100 dead, the rest pending) and N/100 flows (1 in 100 parked, the
//! rest finished), of entities and keys of their own — its overview, a search by
//! reference, an entity's timeline and every list timed through the router; then the
//! engine's hot path alone and with the overview polled every second, alternating. Its
//! lines are `admin backend=… history=… overview_p50_ms=… overview_p99_ms=…
//! search_p99_ms=… entity_p99_ms=… polled_vs_alone=…` and `admin_lists backend=…
//! history=… <list>_p99_ms=… … max_p99_ms=…`.

use orderly::admin::{Admin, Viewer};
use tower::ServiceExt;

use super::*;

/// The admin mode's entities: below every other mode's (the other modes' history rows of
/// other orders are at -1 and down, four rows each).
const FIRST: i64 = -1_000_000_000_000;

/// How many times each page is asked for.
const ASKS: usize = 200;

/// Removes the mode's rows.
async fn clear<B: BenchDb>(db: &B) -> Result<(), BoxError> {
    db.exec(format!(
        "DELETE FROM orderly_transitions WHERE order_id <= {FIRST}"
    ))
    .await?;
    db.exec(format!(
        "DELETE FROM orderly_outbox WHERE entity_id <= {FIRST}"
    ))
    .await?;
    db.exec("DELETE FROM orderly_idempotency_records WHERE scope = 'admin-bench'".into())
        .await?;
    db.exec(format!(
        "DELETE FROM orderly_timers WHERE entity_id <= {FIRST}"
    ))
    .await?;
    db.exec("DELETE FROM orderly_flows WHERE kind = 'admin-bench'".into())
        .await?;
    Ok(())
}

/// `rows` rows made by `row(i)`, inserted 1000 at a time with `head`.
async fn fill<B: BenchDb>(
    db: &B,
    head: &str,
    rows: i64,
    row: impl Fn(i64) -> String,
) -> Result<(), BoxError> {
    for chunk in (0..rows).collect::<Vec<_>>().chunks(1000) {
        let values: Vec<String> = chunk.iter().map(|i| row(*i)).collect();
        db.exec(format!("{head} VALUES {}", values.join(", ")))
            .await?;
    }
    Ok(())
}

/// The mode's rows: `history` history rows (four per entity), a tenth as many outbox
/// rows, a hundredth as many records.
async fn seed<B: BenchDb>(db: &B, history: i64, backend: &str) -> Result<(), BoxError> {
    clear(db).await?;
    fill(
        db,
        "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id)",
        history,
        |g| {
            format!(
                "({}, {}, 'Created', 'Paid', 'Pay', 'adm-{g}')",
                FIRST - g / 4,
                g % 4 + 1
            )
        },
    )
    .await?;
    fill(
        db,
        "INSERT INTO orderly_outbox (machine, entity_id, version, event, transition, from_status, \
         to_status, ref_id, status, last_error)",
        history / 10,
        |i| {
            let (status, error) = match i % 100 {
                0 => ("DEAD", "'the broker refused it'"),
                1 => ("PENDING", "NULL"),
                _ => ("PUBLISHED", "NULL"),
            };
            format!(
                "('OrderMachine', {}, 1, 'OrderPaid', 'Pay', 'Created', 'Paid', 'adm-{i}', \
                 '{status}', {error})",
                FIRST - i
            )
        },
    )
    .await?;
    let now = db.now_ms_sql();
    fill(
        db,
        "INSERT INTO orderly_idempotency_records (scope, idem_key, payload_hash, status, owner_token, \
         attempt, lease_until, expires_at, result, terminal, created_at, updated_at)",
        history / 100,
        |i| {
            let (status, token, lease) = if i % 100 == 0 {
                ("PROCESSING", "'gone'", format!("{now} - 60000"))
            } else {
                ("SUCCEEDED", "NULL", "0".to_string())
            };
            format!(
                "('admin-bench', 'key-{i}', NULL, '{status}', {token}, 1, {lease}, \
                 {now} + 86400000, NULL, FALSE, {now}, {now})"
            )
        },
    )
    .await?;
    // Timers due a day from now (no job fires them), 1 in 100 dead.
    fill(
        db,
        "INSERT INTO orderly_timers (machine, entity_id, event, ref_id, due_at, next_at, \
         status, last_error, created_at)",
        history / 100,
        |i| {
            let (status, error) = if i % 100 == 0 {
                ("DEAD", "'it kept failing'")
            } else {
                ("PENDING", "NULL")
            };
            format!(
                "('OrderMachine', {}, 'Cancel', 'adm-t-{i}', {now} + 86400000 + {i}, \
                 {now} + 86400000 + {i}, '{status}', {error}, {now})",
                FIRST - i
            )
        },
    )
    .await?;
    // Flows, 1 in 100 parked, the rest finished.
    fill(
        db,
        "INSERT INTO orderly_flows (kind, flow_key, version, input_hash, input, status, \
         park_reason, step_at, owner_token, attempt, lease_until, output, last_error, \
         created_at, updated_at)",
        history / 100,
        |i| {
            let (status, reason, output) = if i % 100 == 0 {
                ("RUNNING", "'NEEDS_RECONCILIATION'", "NULL")
            } else {
                ("COMPLETED", "NULL", "'{}'")
            };
            format!(
                "('admin-bench', 'flow-{i:09}', 1, 'h', '1', '{status}', {reason}, 0, 'gone', 1, \
                 0, {output}, NULL, {now}, {now})"
            )
        },
    )
    .await?;
    // A live database has its planner's statistics and, on PostgreSQL, the visibility
    // map of rows long written: gathered now, as autovacuum does after a load (the pages
    // are timed on the plans and index-only scans a live database gets).
    let analyze = match backend {
        "mysql" => "ANALYZE TABLE orderly_transitions, orderly_outbox, \
                    orderly_idempotency_records, orderly_timers, orderly_flows"
            .to_string(),
        "postgres" => "VACUUM ANALYZE".to_string(),
        _ => "ANALYZE".to_string(),
    };
    db.exec(analyze).await
}

/// `ASKS` GETs of `uri` through the router, each answered 200; their latencies.
async fn ask(router: &axum::Router, uri: &str) -> Result<Stats, BoxError> {
    let mut stats = Stats::default();
    let start = Instant::now();
    for _ in 0..ASKS {
        let request = axum::http::Request::get(uri)
            .header("x-user", "bench")
            .body(axum::body::Body::empty())?;
        let t = Instant::now();
        let response = router.clone().oneshot(request).await?;
        let status = response.status();
        axum::body::to_bytes(response.into_body(), usize::MAX).await?;
        stats
            .micros
            .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        if !status.is_success() {
            return Err(format!("admin: GET {uri} answered {status}").into());
        }
    }
    stats.secs = start.elapsed().as_secs_f64();
    stats.ops = ASKS as u64;
    Ok(stats.finish())
}

/// The admin mode; its line.
pub(crate) async fn admin_pass<B: BenchDb>(
    db: &Arc<B>,
    c: usize,
    history: i64,
    args: &Args,
) -> Result<String, BoxError> {
    let t = Instant::now();
    seed(&**db, history, &args.backend).await?;
    println!(
        "# admin: {history} history rows, {} outbox rows, {} records seeded in {:.1} s",
        history / 10,
        history / 100,
        t.elapsed().as_secs_f64()
    );
    let engine = db.engine();
    let router = Admin::new(engine.store().clone())
        .machine(engine.clone())
        .access(|_| Viewer::read_only("bench"))
        .router();
    // The overview's counts hold what was seeded.
    let overview = router
        .clone()
        .oneshot(
            axum::http::Request::get("/?format=json")
                .header("x-user", "bench")
                .body(axum::body::Body::empty())?,
        )
        .await?;
    let body = axum::body::to_bytes(overview.into_body(), usize::MAX).await?;
    let o: serde_json::Value = serde_json::from_slice(&body)?;
    let dead = o["outbox"]["dead"].as_i64().unwrap_or(-1);
    let stuck = o["records"]["stuck"].as_i64().unwrap_or(-1);
    let (want_dead, want_stuck) = ((history / 10 + 99) / 100, (history / 100 + 99) / 100);
    if dead < want_dead || stuck < want_stuck.min(500) {
        return Err(format!(
            "admin: the overview counts {dead} dead events and {stuck} stuck records, \
             seeded {want_dead} and {want_stuck}"
        )
        .into());
    }
    let overview = ask(&router, "/?format=json").await?;
    let probe = format!("adm-{}", history / 2);
    let search = ask(&router, &format!("/search?q={probe}&format=json")).await?;
    let entity = ask(
        &router,
        &format!(
            "/entity?machine=OrderMachine&id={}&format=json",
            FIRST - history / 8
        ),
    )
    .await?;
    for (page, s) in [
        ("overview", &overview),
        ("search", &search),
        ("entity", &entity),
    ] {
        println!(
            "  admin {page:<9} {ASKS} asks  p50 {:>8.3} ms  p99 {:>8.3} ms",
            s.percentile(0.5),
            s.percentile(0.99)
        );
    }
    // Every list, first pages and a page deep in the middle.
    let middle = format!("OrderMachine:{}:1", FIRST - history / 20);
    let lists = [
        ("dead", "/outbox?format=json".to_string()),
        (
            "dead_filtered",
            "/outbox?machine=OrderMachine&error=refused&format=json".to_string(),
        ),
        ("dead_after", format!("/outbox?after={middle}&format=json")),
        ("backlog", "/outbox?status=pending&format=json".to_string()),
        ("flows_parked", "/flows?format=json".to_string()),
        (
            "flows_finished",
            "/flows?which=finished&format=json".to_string(),
        ),
        ("timers_dead", "/timers?format=json".to_string()),
        (
            "timers_pending",
            "/timers?status=pending&format=json".to_string(),
        ),
        (
            "timers_after",
            format!(
                "/timers?status=pending&after_at={}&after_id=0&format=json",
                chrono::Utc::now().timestamp_millis() + 86_400_000 + history / 200
            ),
        ),
        ("records_stuck", "/records?format=json".to_string()),
        ("audit", "/audit?format=json".to_string()),
        (
            "event",
            format!("/event?id=OrderMachine:{FIRST}:1&format=json"),
        ),
        (
            "flow",
            "/flow?kind=admin-bench&key=flow-000000000&format=json".to_string(),
        ),
        (
            "entity_older",
            format!(
                "/entity?machine=OrderMachine&id={}&before=3&format=json",
                FIRST - history / 8
            ),
        ),
    ];
    let mut listed = Vec::new();
    for (name, uri) in &lists {
        let s = ask(&router, uri).await?;
        println!(
            "  admin {name:<15} {ASKS} asks  p50 {:>8.3} ms  p99 {:>8.3} ms",
            s.percentile(0.5),
            s.percentile(0.99)
        );
        listed.push((*name, s.percentile(0.99)));
    }
    let max = listed.iter().map(|(_, p)| *p).fold(0.0, f64::max);
    let lists_line = format!(
        "admin_lists backend={} history={history} {} max_p99_ms={max:.3}",
        args.backend,
        listed
            .iter()
            .map(|(name, p)| format!("{name}_p99_ms={p:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );

    // The hot path alone, and with the overview polled every second, alternating.
    db.reset().await?;
    let span = args.orders / 2;
    let (mut alone, mut polled) = (Lane::new(1), Lane::new(1 + span));
    let slice = args.seconds / args.rounds as f64;
    for round in 1..=i64::from(args.rounds) {
        let quota = span * round / i64::from(args.rounds);
        alone.engine_slice(&engine, c, slice, quota).await?;
        let poller = {
            let router = router.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(1));
                loop {
                    every.tick().await;
                    let request = axum::http::Request::get("/?format=json")
                        .header("x-user", "bench")
                        .body(axum::body::Body::empty())
                        .expect("a request of constants");
                    let Ok(r) = router.clone().oneshot(request).await;
                    let _ = axum::body::to_bytes(r.into_body(), usize::MAX).await;
                }
            })
        };
        let ran = polled.engine_slice(&engine, c, slice, quota).await;
        poller.abort();
        ran?;
    }
    let [alone, polled] = [alone, polled].map(|lane| lane.stats.finish());
    for (mode, s) in [("engine", &alone), ("eng-polled", &polled)] {
        let (client, other) = s.cpu_per_op();
        println!(
            "{c:>3}  {mode:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
            s.ops,
            s.throughput(),
            s.percentile(0.5),
            s.percentile(0.99),
            s.throughput() / alone.throughput()
        );
    }
    clear(&**db).await?;
    Ok(format!(
        "admin backend={} history={history} overview_p50_ms={:.3} overview_p99_ms={:.3} \
         search_p99_ms={:.3} entity_p99_ms={:.3} polled_vs_alone={:.2}\n{lists_line}",
        args.backend,
        overview.percentile(0.5),
        overview.percentile(0.99),
        search.percentile(0.99),
        entity.percentile(0.99),
        polled.throughput() / alone.throughput()
    ))
}
