//! The command line over the same reads and actions, in-process and as the `orderly`
//! binary.

use super::*;

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
pub(super) fn binary(url: Option<&str>, args: &[&str]) -> (i32, String, String) {
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
pub(super) async fn cli_suite<S: AdminStore>(store: S, exec: Exec<S>, url: &str) {
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
    let dead = || {
        count(
            &exec,
            "SELECT COUNT(*) FROM orderly_outbox WHERE status = 'DEAD'",
        )
    };

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
    // The page after a message id: the matches past it in key order.
    let (code, rows) = cli_json(
        &c,
        &[
            "outbox",
            "dead",
            "--error",
            "schema",
            "--after",
            "Shop:40:1",
        ],
    )
    .await;
    assert_eq!(code, Exit::Ok);
    let ids: Vec<i64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["entity_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, (41..=total).collect::<Vec<_>>());
    let (code, _, err) = cli(&c, &["outbox", "dead", "--after", "Shop:x"]).await;
    assert_eq!(code, Exit::Usage, "{err}");
    assert!(err.contains("message id"), "{err}");
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
        &["outbox", "discard"],
        &[
            "outbox", "discard", "--id", "Shop:1:1", "--error", "gateway",
        ],
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
    // Discard: never a pending event (Shop:1:1 was requeued); every dead match of a
    // filter, deleted.
    let (code, done) = cli_json(&c, &["outbox", "discard", "--id", "Shop:1:1"]).await;
    assert_eq!((code, done["changed"].as_i64()), (Exit::NotFound, Some(0)));
    (exec.run)(
        "UPDATE orderly_outbox SET status = 'DEAD', last_error = 'discard me' \
         WHERE machine = 'Shop' AND entity_id IN (2, 3, 4)"
            .into(),
    )
    .await;
    let (code, _, err) = cli(&c, &["outbox", "discard", "--error", "discard me"]).await;
    assert_eq!(code, Exit::Ok, "{err}");
    assert!(err.contains("discarded 3 so far"), "{err}");
    assert_eq!(
        count(
            &exec,
            "SELECT COUNT(*) FROM orderly_outbox WHERE machine = 'Shop' AND entity_id IN (2, 3, 4)"
        )
        .await,
        0
    );
    assert_eq!(dead().await, total - FEW - 1, "the others left dead");
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
            ("outbox.discard", 3),
            ("outbox.discard", 0),
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
    assert_eq!(audit[10]["who"], "ops-bot");
    assert_eq!(audit[10]["target"], "dead events where error=gateway");

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
    // A reason holding terminal control sequences (a title, a clear screen, a CSI) is
    // printed as escapes: the operator's terminal is not rewritten by stored data.
    let hostile = "cancelled \u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m by support";
    engine.create(424_241).await.unwrap();
    engine
        .transition(424_241, ShopEvent::Cancel, "cancel-424241")
        .reason(hostile)
        .await
        .unwrap();
    let (code, out, _) = cli(&c, &["history", "Shop", "424241"]).await;
    assert_eq!(code, Exit::Ok);
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{9b}'),
        "{out:?}"
    );
    assert!(
        out.contains("cancelled \\x1b]0;owned\\x07\\x1b[2J\\u{9b}31m by support"),
        "{out}"
    );
    let (code, out, _) = cli(&c, &["--json", "history", "Shop", "424241"]).await;
    assert_eq!(code, Exit::Ok);
    assert!(
        !out.chars().any(|ch| ch.is_control() && ch != '\n'),
        "{out:?}"
    );
    let t: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        t["history"][0]["reason"], hostile,
        "the JSON reads back as stored"
    );
}
