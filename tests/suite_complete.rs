//! The conformance suite cannot skip a body silently: every behaviour written in
//! `tests/conformance/` runs on every backend it applies to. A body that is neither in
//! the `conformance!` lists nor called by each backend's file fails this test.

const BODIES: [&str; 43] = [
    include_str!("conformance/mod.rs"),
    include_str!("conformance/finishes.rs"),
    include_str!("conformance/audit.rs"),
    include_str!("conformance/coalesce.rs"),
    include_str!("conformance/faults/mod.rs"),
    include_str!("conformance/faults/cancel.rs"),
    include_str!("conformance/faults/lost.rs"),
    include_str!("conformance/faults/hooked.rs"),
    include_str!("conformance/faults/identity.rs"),
    include_str!("conformance/flow_deadline.rs"),
    include_str!("conformance/flows/mod.rs"),
    include_str!("conformance/flows/cuts.rs"),
    include_str!("conformance/flows/definitions.rs"),
    include_str!("conformance/flows/parking.rs"),
    include_str!("conformance/flows/recovery.rs"),
    include_str!("conformance/flows/runs.rs"),
    include_str!("conformance/flows/waits.rs"),
    include_str!("conformance/idempotency.rs"),
    include_str!("conformance/outbox/mod.rs"),
    include_str!("conformance/outbox/relays.rs"),
    include_str!("conformance/outbox/cancel.rs"),
    include_str!("conformance/outbox/killed.rs"),
    include_str!("conformance/outbox/events.rs"),
    include_str!("conformance/outbox/trace.rs"),
    include_str!("conformance/records_faults.rs"),
    include_str!("conformance/records_jobs.rs"),
    include_str!("conformance/records_model.rs"),
    include_str!("conformance/schema.rs"),
    include_str!("conformance/rules/mod.rs"),
    include_str!("conformance/rules/dropped.rs"),
    include_str!("conformance/rules/kit.rs"),
    include_str!("conformance/rules/layers.rs"),
    include_str!("conformance/rules/once.rs"),
    include_str!("conformance/storms.rs"),
    include_str!("conformance/reads.rs"),
    include_str!("conformance/outcomes.rs"),
    include_str!("conformance/events.rs"),
    include_str!("conformance/cycles.rs"),
    include_str!("conformance/callers.rs"),
    include_str!("conformance/timers.rs"),
    include_str!("conformance/timer_faults.rs"),
    include_str!("conformance/timer_config.rs"),
    include_str!("conformance/timer_batches.rs"),
];
const BACKENDS: [(&str, &str, bool); 3] = [
    ("sqlite", include_str!("sqlite.rs"), false),
    ("postgres", include_str!("postgres.rs"), true),
    ("mysql", include_str!("mysql.rs"), true),
];

/// Bodies that apply to some backends only, and why.
const NOT_ON: [(&str, &str, &str); 4] = [
    (
        "finish_in_a_batch_past_its_deadline_is_in_doubt",
        "sqlite",
        "two held writers at once: SQLite has one write lock",
    ),
    (
        "deadlock_scenario",
        "sqlite",
        "one writer at a time: SQLite has no deadlocks",
    ),
    (
        "a_kept_connection_goes_back_and_dies_harmlessly",
        "mysql",
        "MySQL keeps no connection out of the pool",
    ),
    (
        "a_unit_cut_with_no_connection_left_is_never_unsent",
        "mysql",
        "a unit's parameters go to MySQL in its first statement, before its COMMIT",
    ),
];

/// `(name, bound)` of every `pub async fn name<B: Bound>` in the suite.
fn bodies() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for source in BODIES {
        for line in source.lines() {
            let Some(rest) = line.strip_prefix("pub async fn ") else {
                continue;
            };
            let Some((name, generics)) = rest.split_once("<B: ") else {
                continue;
            };
            let bound: String = generics
                .chars()
                .take_while(|c| c.is_alphanumeric())
                .collect();
            found.push((name.to_string(), bound));
        }
    }
    found
}

/// The names in one arm of the `conformance!` macro: the arm that starts with `arm`.
fn listed(arm: &str) -> Vec<String> {
    let macro_text = BODIES[0]
        .split_once("macro_rules! conformance")
        .expect("the conformance! macro")
        .1;
    let arm = macro_text.split_once(arm).expect("the macro arm").1;
    let list = arm.split_once(";\n").expect("the arm's list").1;
    let list = list.split_once(");").expect("the end of the list").0;
    list.split(',')
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

#[test]
fn every_conformance_body_runs_on_every_backend() {
    let bodies = bodies();
    assert!(bodies.len() > 20, "found only {} bodies", bodies.len());
    let everywhere = listed("($backend:ty) => {");
    let networked = listed("(@networked $backend:ty) => {");
    for (name, bound) in &bodies {
        for (backend, source, is_server) in BACKENDS {
            let exempt = NOT_ON.iter().any(|(n, b, _)| n == name && *b == backend);
            let runs = match bound.as_str() {
                "Backend" => {
                    everywhere.contains(name) || source.contains(&format!("conformance::{name}("))
                }
                "Networked" => {
                    !is_server
                        || networked.contains(name)
                        || source.contains(&format!("conformance::{name}("))
                }
                other => panic!("{name}: unknown bound {other}"),
            };
            assert!(
                runs || exempt,
                "{name} never runs on {backend}: list it in conformance! or call it from tests/{backend}.rs"
            );
        }
    }
    for name in everywhere.iter().chain(&networked) {
        assert!(
            bodies.iter().any(|(n, _)| n == name),
            "conformance! lists {name}, which is not a body"
        );
    }
    // Every backend instantiates the lists, under both read-first policies.
    for (backend, source, is_server) in BACKENDS {
        let instantiations = source.matches("conformance!(").count();
        let expected = if is_server { 3 } else { 2 };
        assert_eq!(
            instantiations, expected,
            "tests/{backend}.rs instantiates conformance! {instantiations} times"
        );
        assert!(
            source.contains("<super::Always>);"),
            "{backend}: no read-first run"
        );
        if is_server {
            assert!(
                source.contains("conformance!(@networked "),
                "{backend}: no network faults"
            );
        }
    }
}
