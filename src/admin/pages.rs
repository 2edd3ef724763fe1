//! The pages: the overview, the lists of what is stuck (dead events, parked flows, dead
//! timers), an entity's timeline, a machine's graph and the audit trail, each as HTML
//! or, with `?format=json`, its data.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};
use serde_json::json;

use super::AdminStore;
use super::app::{Admin, App, PAGE, Seen, failed};
use crate::flow::Listing;
use crate::outbox::Outbox;
use crate::store::audit::AuditRow;
use crate::store::{Lease, db_error};
use crate::timer::Timers;

/// A page as HTML, or its data as JSON.
fn answer(
    seen: &Seen,
    title: &str,
    notice: Option<&str>,
    data: serde_json::Value,
    body: Markup,
) -> Response {
    if seen.json {
        axum::Json(data).into_response()
    } else {
        Html(seen.frame.page(title, notice, body).into_string()).into_response()
    }
}

/// The notice an action left in the query (`done`), if this page signed it (`sig`): a
/// link made elsewhere shows none.
fn notice<'q, S: AdminStore>(app: &Admin<S>, q: &'q HashMap<String, String>) -> Option<&'q str> {
    let text = q.get("done")?;
    let sig = q.get("sig")?;
    app.signed(text, sig).then_some(text.as_str())
}

pub(super) async fn audit_rows<S: AdminStore>(
    store: &S,
    limit: i64,
) -> crate::Result<Vec<AuditRow>> {
    leased!(store, |c| store.list_audit(c, limit))
}

pub(super) async fn overview<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let store = &app.store;
    let outbox = match Outbox::new(store.clone()).stats().await {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    let timers = match Timers::new(store.clone()).stats().await {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    let (parked, running) = match &app.flows {
        None => (0, 0),
        Some(f) => match (
            f.list(Listing::Parked, None, PAGE).await,
            f.list(Listing::Running, None, PAGE).await,
        ) {
            (Ok(p), Ok(r)) => (p.len(), r.len()),
            (Err(e), _) | (_, Err(e)) => return failed(&e),
        },
    };
    let recent = match audit_rows(store, 10).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let machines: Vec<&str> = app.machines.keys().copied().collect();
    let data = json!({
        "outbox": {
            "pending": outbox.pending, "dead": outbox.dead, "corrupt": outbox.corrupt,
            "oldest_pending_ms": u64::try_from(outbox.oldest_pending.as_millis()).unwrap_or(u64::MAX),
        },
        "timers": {
            "pending": timers.pending, "due": timers.due, "dead": timers.dead,
            "oldest_late_ms": timers.oldest_late_ms,
        },
        "flows": { "parked": parked, "running": running },
        "machines": machines,
        "audit": recent,
    });
    let card = |label: &str, n: String, bad: bool, href: &str| {
        html! {
            a.card href=(href) style="color:inherit;text-decoration:none" {
                div { (label) }
                div.n.bad[bad] { (n) }
            }
        }
    };
    let body = html! {
        div.cards {
            (card("Events pending", outbox.pending.to_string(), false, "outbox"))
            (card("Events dead", outbox.dead.to_string(), outbox.dead > 0, "outbox"))
            (card("Oldest pending", format!("{:.1} s", outbox.oldest_pending.as_secs_f64()), false, "outbox"))
            (card("Flows parked", parked.to_string(), parked > 0, "flows"))
            (card("Flows running", running.to_string(), false, "flows"))
            (card("Timers due", timers.due.to_string(), false, "timers"))
            (card("Timers dead", timers.dead.to_string(), timers.dead > 0, "timers"))
            (card("Oldest lateness", format!("{:.1} s", timers.oldest_late_ms as f64 / 1000.0), false, "timers"))
        }
        h2 { "An entity's timeline" }
        (lookup(&machines, None, None))
        h2 { "Machines" }
        ul {
            @for m in &machines {
                li { a href={ "graph?machine=" (m) } { (m) } }
            }
        }
        h2 { "Latest actions" }
        (audit_table(&recent))
    };
    answer(&seen, "Overview", notice(&app, &q), data, body)
}

/// The form that opens an entity's timeline.
fn lookup(machines: &[&str], machine: Option<&str>, id: Option<&str>) -> Markup {
    html! {
        form method="get" action="entity" {
            select name="machine" {
                @for m in machines {
                    option value=(m) selected[Some(*m) == machine] { (m) }
                }
            }
            " "
            input type="text" name="id" placeholder="entity id" value=(id.unwrap_or(""));
            " "
            button type="submit" { "Open" }
        }
    }
}

fn audit_table(rows: &[AuditRow]) -> Markup {
    html! {
        table {
            tr { th { "When" } th { "Who" } th { "Action" } th { "On" } th { "Changed" } }
            @for r in rows {
                tr {
                    td { (time_text(r.at_ms)) }
                    td { (r.who) }
                    td { (r.action) }
                    td { (r.target) }
                    td { (r.affected) }
                }
            }
        }
    }
}

/// Milliseconds since the epoch as an RFC 3339 time.
pub(super) fn time_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), |t| t.to_rfc3339())
}

/// Whether `row` matches the filter `q` (`machine`, `event`, `error`), each field empty
/// or absent meaning any.
pub(super) fn matches(
    q: &HashMap<String, String>,
    machine: &str,
    event: &str,
    error: Option<&str>,
) -> bool {
    let want = |k: &str| q.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    want("machine").is_none_or(|m| m == machine)
        && want("event").is_none_or(|e| e == event)
        && want("error").is_none_or(|t| error.is_some_and(|e| e.contains(t)))
}

pub(super) async fn dead_events<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let rows = match Outbox::new(app.store.clone()).dead(PAGE).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| matches(&q, &r.machine, &r.event, r.last_error.as_deref()))
        .collect();
    let data = json!({ "dead": rows.iter().map(|r| json!({
        "machine": r.machine, "entity_id": r.entity_id, "version": r.version,
        "event": r.event, "ref_id": r.ref_id, "attempts": r.attempts,
        "last_error": r.last_error, "age_ms": r.age_ms,
    })).collect::<Vec<_>>() });
    let f = &seen.frame;
    let field = |k: &str| q.get(k).cloned().unwrap_or_default();
    let body = html! {
        form method="get" action="outbox" {
            "Machine " input type="text" name="machine" value=(field("machine"));
            " Event " input type="text" name="event" value=(field("event"));
            " Error contains " input type="text" name="error" value=(field("error"));
            " " button type="submit" { "Filter" }
        }
        p { (rows.len()) " dead events match." }
        @if !rows.is_empty() {
            (f.action("requeue-matching", &[
                ("machine", &field("machine")), ("event", &field("event")), ("error", &field("error")),
            ], "Requeue every match"))
        }
        table id="dead" {
            tr { th { "Machine" } th { "Entity" } th { "Version" } th { "Event" } th { "Reference" }
                 th { "Attempts" } th { "Last error" } th { "Age" } th {} }
            @for r in &rows {
                tr {
                    td { (r.machine) }
                    td { a href={ "entity?machine=" (r.machine) "&id=" (r.entity_id) } { (r.entity_id) } }
                    td { (r.version) }
                    td { (r.event) }
                    td { (r.ref_id) }
                    td { (r.attempts) }
                    td.err { (r.last_error.as_deref().unwrap_or("")) }
                    td { (r.age_ms.map_or_else(String::new, |ms| format!("{:.0} s", ms as f64 / 1000.0))) }
                    td { (f.action("requeue", &[
                        ("machine", &r.machine), ("entity_id", &r.entity_id.to_string()),
                        ("version", &r.version.to_string()),
                    ], "Requeue")) }
                }
            }
        }
    };
    answer(&seen, "Dead events", notice(&app, &q), data, body)
}

pub(super) async fn parked_flows<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let rows = match &app.flows {
        None => Vec::new(),
        Some(f) => match f.list(Listing::Parked, None, PAGE).await {
            Ok(rows) => rows,
            Err(e) => return failed(&e),
        },
    };
    let data = json!({ "parked": rows.iter().map(|l| json!({
        "kind": l.flow.kind, "flow_key": l.flow.flow_key, "version": l.flow.version,
        "status": l.flow.status, "park_reason": l.flow.park_reason, "step_at": l.flow.step_at,
        "last_error": l.flow.last_error, "known": l.known,
    })).collect::<Vec<_>>() });
    let f = &seen.frame;
    let body = html! {
        @if app.flows.is_none() {
            p { "No flows are registered with this page." }
        }
        table id="parked" {
            tr { th { "Kind" } th { "Key" } th { "Version" } th { "Status" } th { "Reason" }
                 th { "Step" } th { "Last error" } th {} }
            @for l in &rows {
                tr {
                    td { (l.flow.kind) }
                    td { (l.flow.flow_key) }
                    td { (l.flow.version) }
                    td { (l.flow.status) }
                    td { (l.flow.park_reason.as_deref().unwrap_or("")) }
                    td { (l.flow.step_at) }
                    td.err { (l.flow.last_error.as_deref().unwrap_or("")) }
                    td {
                        @if l.known {
                            (f.action("resume", &[("kind", &l.flow.kind), ("key", &l.flow.flow_key), ("how", "retry")], "Retry"))
                            " "
                            (f.action("resume", &[("kind", &l.flow.kind), ("key", &l.flow.flow_key), ("how", "compensate")], "Compensate"))
                        } @else {
                            "version not registered here"
                        }
                    }
                }
            }
        }
    };
    answer(&seen, "Parked flows", notice(&app, &q), data, body)
}

pub(super) async fn dead_timers<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let rows = match Timers::new(app.store.clone()).dead(i64::from(PAGE)).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let (rows, corrupt): (Vec<_>, Vec<_>) = rows.into_iter().partition(Result::is_ok);
    let rows: Vec<_> = rows.into_iter().flatten().collect();
    let corrupt: Vec<String> = corrupt
        .into_iter()
        .filter_map(|c| c.err())
        .map(|c| c.to_string())
        .collect();
    let data = json!({
        "dead": rows.iter().map(|t| json!({
            "machine": t.machine, "entity_id": t.entity_id, "event": t.event, "ref_id": t.ref_id,
            "due_at": t.due_at, "attempts": t.attempts, "last_error": t.last_error,
        })).collect::<Vec<_>>(),
        "corrupt": corrupt,
    });
    let f = &seen.frame;
    let body = html! {
        table id="timers" {
            tr { th { "Machine" } th { "Entity" } th { "Event" } th { "Reference" } th { "Due" }
                 th { "Attempts" } th { "Last error" } th {} }
            @for t in &rows {
                @let key = [("machine", t.machine.as_str()), ("entity_id", &t.entity_id.to_string()),
                            ("event", t.event.as_str()), ("ref_id", t.ref_id.as_str())];
                tr {
                    td { (t.machine) }
                    td { (t.entity_id) }
                    td { (t.event) }
                    td { (t.ref_id) }
                    td { (time_text(t.due_at)) }
                    td { (t.attempts) }
                    td.err { (t.last_error.as_deref().unwrap_or("")) }
                    td { (f.action("rearm", &key, "Re-arm")) " " (f.action("cancel-timer", &key, "Cancel")) }
                }
            }
        }
        @if !corrupt.is_empty() {
            h2 { "Rows that do not read" }
            ul { @for c in &corrupt { li { (c) } } }
        }
    };
    answer(&seen, "Dead timers", notice(&app, &q), data, body)
}

pub(super) async fn entity<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let machines: Vec<&str> = app.machines.keys().copied().collect();
    let machine = q.get("machine").map(String::as_str);
    let id_text = q.get("id").map(|s| s.trim());
    let (Some(machine), Some(id_text)) = (machine, id_text) else {
        return answer(
            &seen,
            "An entity's timeline",
            None,
            json!({}),
            lookup(&machines, machine, id_text),
        );
    };
    let Some(view) = app.machines.get(machine) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no machine {machine} on this page"),
        )
            .into_response();
    };
    let Ok(id) = id_text.parse::<i64>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("an entity id is an integer, not {id_text:?}"),
        )
            .into_response();
    };
    let (now, lines) = match view.timeline(id).await {
        Ok(t) => t,
        Err(e) => return failed(&e),
    };
    let store = &app.store;
    let timers: crate::Result<Vec<_>> =
        async { leased!(store, |c| store.timers_of(c, machine, id)) }.await;
    let timers = match timers {
        Ok(t) => t,
        Err(e) => return failed(&e),
    };
    let timers: Vec<_> = timers.into_iter().filter_map(Result::ok).collect();
    let data = json!({
        "machine": machine, "id": id,
        "state": now.as_ref().map(|(s, _)| s), "version": now.as_ref().map(|(_, v)| v),
        "history": lines,
        "timers": timers.iter().map(|t| json!({
            "event": t.event, "ref_id": t.ref_id, "due_at": t.due_at, "status": t.status,
            "outcome": t.outcome, "last_error": t.last_error,
        })).collect::<Vec<_>>(),
    });
    let title = format!("{machine} {id}");
    let body = html! {
        (lookup(&machines, Some(machine), Some(id_text)))
        @match &now {
            Some((state, version)) => p id="now" { "Now " b { (state) } ", version " (version) "." },
            None => p id="now" { "No such entity." },
        }
        h2 { "History" }
        table id="history" {
            tr { th { "Version" } th { "From" } th { "To" } th { "Event" } th { "Reference" }
                 th { "Payload" } th { "Who" } th { "Why" } th { "When" } }
            @for l in &lines {
                tr {
                    td { (l.seq) } td { (l.from) } td { (l.to) } td { (l.event) } td { (l.ref_id) }
                    td { (l.payload_hash.as_deref().map_or_else(String::new, |h| h.chars().take(12).collect())) }
                    td { (l.actor.as_deref().unwrap_or("")) }
                    td { (l.reason.as_deref().unwrap_or("")) }
                    td { (l.at) }
                }
            }
        }
        h2 { "Timers" }
        table id="entity-timers" {
            tr { th { "Event" } th { "Reference" } th { "Due" } th { "Status" } th { "Outcome" } th { "Note" } }
            @for t in &timers {
                tr {
                    td { (t.event) } td { (t.ref_id) } td { (time_text(t.due_at)) } td { (t.status) }
                    td { (t.outcome.as_deref().unwrap_or("")) }
                    td.err { (t.last_error.as_deref().unwrap_or("")) }
                }
            }
        }
    };
    answer(&seen, &title, None, data, body)
}

pub(super) async fn graph<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let machine = q.get("machine").map_or("", String::as_str);
    let Some(view) = app.machines.get(machine) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no machine {machine:?} on this page"),
        )
            .into_response();
    };
    let text = view.graph();
    let data = json!({ "machine": machine, "mermaid": text });
    let body = html! { pre id="graph" { (text) } };
    answer(&seen, &format!("The graph of {machine}"), None, data, body)
}

pub(super) async fn audit<S: AdminStore>(State(app): State<App<S>>, seen: Seen) -> Response {
    let rows = match audit_rows(&app.store, i64::from(PAGE)).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let data = json!({ "audit": rows });
    let body = audit_table(&rows);
    answer(&seen, "Audit", None, data, body)
}
