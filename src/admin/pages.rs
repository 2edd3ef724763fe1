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
use super::ops::{Event, Filter, time_text};
use super::panel::{Admin, App, LIST_MAX, PAGE};
use super::seen::{Seen, failed};
use crate::Error;
use crate::flow::Listing;
use crate::outbox::Outbox;
use crate::store::audit::AuditRow;
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

pub(super) async fn overview<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let o = match app.overview().await {
        Ok(o) => o,
        Err(e) => return failed(&e),
    };
    let recent = match app.audit(10).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let machines: Vec<&str> = app.machines.keys().copied().collect();
    let mut data = json!(o);
    data["audit"] = json!(recent);
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
            (card("Events pending", o.outbox.pending.to_string(), false, "outbox"))
            (card("Events dead", o.outbox.dead.to_string(), o.outbox.dead > 0, "outbox"))
            (card("Oldest pending", format!("{:.1} s", o.outbox.oldest_pending_ms as f64 / 1000.0), false, "outbox"))
            (card("Flows parked", capped(o.flows.parked), o.flows.parked > 0, "flows"))
            (card("Flows running", capped(o.flows.running), false, "flows"))
            (card("Records stuck", capped(o.records.stuck), o.records.stuck > 0, "records"))
            (card("Timers due", o.timers.due.to_string(), false, "timers"))
            (card("Timers dead", o.timers.dead.to_string(), o.timers.dead > 0, "timers"))
            (card("Oldest lateness", format!("{:.1} s", o.timers.oldest_late_ms as f64 / 1000.0), false, "timers"))
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

/// A count made up to [`LIST_MAX`]: `500+` when it reached it.
fn capped(n: usize) -> String {
    if n >= LIST_MAX as usize {
        format!("{n}+")
    } else {
        n.to_string()
    }
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

pub(super) async fn dead_events<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let rows = match Outbox::new(app.store().clone()).dead(PAGE).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let filter = match Filter::from_fields(&q) {
        Ok(filter) => filter,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    // Rows orderly never writes (a key that is not an integer, a status it does not
    // know, a column of the wrong type) are not events: listed apart, as stored.
    let corrupt = match Outbox::new(app.store().clone()).corrupt(PAGE).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let rows: Vec<_> = rows.into_iter().filter(|r| filter.matches(r)).collect();
    let data = json!({ "dead": rows.iter().map(|r| json!({
        "machine": r.machine, "entity_id": r.entity_id, "version": r.version,
        "event": r.event, "ref_id": r.ref_id, "attempts": r.attempts,
        "last_error": r.last_error, "age_ms": r.age_ms,
    })).collect::<Vec<_>>(), "corrupt": corrupt.iter().map(|c| json!({
        "machine": c.machine, "entity_id": c.entity_id, "version": c.version,
        "status": c.status, "reason": c.reason,
    })).collect::<Vec<_>>() });
    let f = &seen.frame;
    let fields = filter.fields();
    let field = |k: &str| {
        fields
            .iter()
            .find(|(n, _)| *n == k)
            .map_or("", |(_, v)| v.as_str())
    };
    let body = html! {
        // Rare, and nothing a requeue mends: shown first, where an operator looks.
        @if !corrupt.is_empty() {
            h2 { "Rows orderly never writes" }
            p { "No relay publishes these; the relay sets aside each it claims. Mend or delete them by hand." }
            table id="corrupt" {
                tr { th { "Machine" } th { "Entity" } th { "Version" } th { "Status" } th { "Why" } }
                @for c in &corrupt {
                    tr {
                        td { (c.machine) } td { (c.entity_id) } td { (c.version) }
                        td { (c.status) } td.err { (c.reason) }
                    }
                }
            }
        }
        form method="get" action="outbox" {
            "Machine " input type="text" name="machine" value=(field("machine"));
            " Event " input type="text" name="event" value=(field("event"));
            " Error contains " input type="text" name="error" value=(field("error"));
            " Older than " input type="text" name="older" size="6" value=(field("older")) " s";
            " " button type="submit" { "Filter" }
        }
        p { (rows.len()) " dead events match." }
        @if !rows.is_empty() {
            (f.action("requeue-matching", &[
                ("machine", field("machine")), ("event", field("event")), ("error", field("error")),
                ("older", field("older")),
            ], "Requeue every match"))
        }
        table id="dead" {
            tr { th { "Machine" } th { "Entity" } th { "Version" } th { "Event" } th { "Reference" }
                 th { "Attempts" } th { "Last error" } th { "Age" } th {} }
            @for r in &rows {
                tr {
                    td { (r.machine) }
                    td { a href=(entity_link(&r.machine, r.entity_id)) { (r.entity_id) } }
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
    let listed = match app.flows_here() {
        Ok(flows) => flows.list(Listing::Parked, None, PAGE).await,
        Err(e) => Err(e),
    };
    let rows = match listed {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let data = json!({ "parked": rows.iter().map(|l| json!({
        "kind": l.flow.kind, "flow_key": l.flow.flow_key, "version": l.flow.version,
        "status": l.flow.status, "park_reason": l.flow.park_reason, "step_at": l.flow.step_at,
        "last_error": l.flow.last_error, "known": l.known,
    })).collect::<Vec<_>>() });
    let f = &seen.frame;
    let body = html! {
        @if app.flows.is_none() {
            p { "No flows are registered with this page: it lists them, and resumes none." }
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
                            (f.action_with("resume", &[("kind", &l.flow.kind), ("key", &l.flow.flow_key), ("how", "applied")],
                                Some(("output", "output JSON")), "Mark applied"))
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
    let rows = match Timers::new(app.store().clone()).dead(i64::from(PAGE)).await {
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
    if !app.knows_machine(machine) {
        return (
            StatusCode::NOT_FOUND,
            format!("no machine {machine} on this page"),
        )
            .into_response();
    }
    let Ok(id) = id_text.parse::<i64>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("an entity id is an integer, not {id_text:?}"),
        )
            .into_response();
    };
    let t = match app.timeline(machine, id).await {
        Ok(t) => t,
        Err(e) => return failed(&e),
    };
    let data = json!(t);
    let title = format!("{machine} {id}");
    let body = html! {
        (lookup(&machines, Some(machine), Some(id_text)))
        @match (&t.state, t.version) {
            (Some(state), Some(version)) => p id="now" { "Now " b { (state) } ", version " (version) "." },
            _ => p id="now" { "No such entity." },
        }
        h2 { "History" }
        table id="history" {
            tr { th { "Version" } th { "From" } th { "To" } th { "Event" } th { "Reference" }
                 th { "Payload" } th { "Who" } th { "Why" } th { "When" } }
            @for l in &t.history {
                tr {
                    td { (l.seq) } td { (l.from) } td { (l.to) } td { (l.event) } td { (l.ref_id) }
                    td { (l.payload_hash.as_deref().map_or_else(String::new, |h| h.chars().take(12).collect())) }
                    td { (l.actor.as_deref().unwrap_or("")) }
                    td { (l.reason.as_deref().unwrap_or("")) }
                    td { (l.at) }
                }
            }
        }
        h2 { "Outbox events" }
        (events_table(&t.events))
        h2 { "Timers" }
        table id="entity-timers" {
            tr { th { "Event" } th { "Reference" } th { "Due" } th { "Status" } th { "Outcome" } th { "Note" } }
            @for t in &t.timers {
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

/// The link to an entity's timeline.
fn entity_link(machine: &str, id: i64) -> String {
    let machine: String = form_urlencoded::byte_serialize(machine.as_bytes()).collect();
    format!("entity?machine={machine}&id={id}")
}

/// Outbox events with their publish status.
fn events_table(events: &[Event]) -> Markup {
    html! {
        table.events {
            tr { th { "Message id" } th { "Event" } th { "Reference" } th { "Status" }
                 th { "Attempts" } th { "Last error" } }
            @for e in events {
                tr {
                    td { (e.id) } td { (e.event) } td { (e.ref_id) }
                    td.bad[e.status == "DEAD"] { (e.status) }
                    td { (e.attempts) }
                    td.err { (e.last_error.as_deref().unwrap_or("")) }
                }
            }
        }
    }
}

pub(super) async fn search<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let term = q.get("q").map_or("", |t| t.trim());
    if term.is_empty() {
        let body = html! { p { "Search by a reference, an idempotency key, a flow key, a message id or an entity id: the box at the top." } };
        return answer(&seen, "Search", None, json!({}), body);
    }
    let found = match app.search(term).await {
        Ok(found) => found,
        Err(e @ Error::InvalidInput(_)) => {
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
        Err(e) => return failed(&e),
    };
    let data = json!(found);
    let entity = entity_link;
    let body = html! {
        p id="found" { (found.count()) " found for " b { (found.term) } "." }
        @if !found.entities.is_empty() {
            h2 { "Entities" }
            ul { @for (m, id) in &found.entities {
                li { @if m.is_empty() { (id) } @else { a href=(entity(m, *id)) { (m) " " (id) } } }
            } }
        }
        @if !found.history.is_empty() {
            h2 { "Transitions with this reference" }
            table id="found-history" {
                tr { th { "Machine" } th { "Entity" } th { "Version" } th { "Event" } th { "From" } th { "To" } }
                @for h in &found.history {
                    tr {
                        td { (h.machine) }
                        td { @if h.machine.is_empty() { (h.row.order_id) } @else { a href=(entity(&h.machine, h.row.order_id)) { (h.row.order_id) } } }
                        td { (h.row.seq) } td { (h.row.event) } td { (h.row.from) } td { (h.row.to) }
                    }
                }
            }
        }
        @if !found.events.is_empty() {
            h2 { "Outbox events" }
            (events_table(&found.events))
        }
        @if !found.records.is_empty() {
            h2 { "Idempotency records with this key" }
            table id="found-records" {
                tr { th { "Scope" } th { "Key" } th { "Status" } th { "Attempt" } th { "Lease left" } }
                @for r in &found.records {
                    tr { td { (r.scope) } td { (r.idem_key) } td { (r.status) } td { (r.attempt) }
                         td { (format!("{:.1} s", r.lease_left_ms as f64 / 1000.0)) } }
                }
            }
        }
        @if !found.flows.is_empty() {
            h2 { "Flows with this key" }
            table id="found-flows" {
                tr { th { "Kind" } th { "Key" } th { "Status" } th { "Parked" } }
                @for fl in &found.flows {
                    tr { td { (fl.kind) } td { (fl.flow_key) } td { (fl.status) }
                         td { (fl.park_reason.as_deref().unwrap_or("")) } }
                }
            }
        }
    };
    answer(&seen, &format!("Search: {term}"), None, data, body)
}

pub(super) async fn stuck_records<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let scope = q.get("scope").map(|s| s.trim()).filter(|s| !s.is_empty());
    let rows = match app.stuck_records(scope).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let data = json!({ "stuck": rows });
    let f = &seen.frame;
    let body = html! {
        form method="get" action="records" {
            "Scope " input type="text" name="scope" value=(scope.unwrap_or(""));
            " " button type="submit" { "Filter" }
        }
        @if app.records.is_none() {
            p { "No idempotency records are registered with this page: it lists them, and releases none." }
        }
        table id="stuck" {
            tr { th { "Scope" } th { "Key" } th { "Attempt" } th { "Stuck for" } th { "Claimed" } th {} }
            @for r in &rows {
                tr {
                    td { (r.scope) } td { (r.idem_key) } td { (r.attempt) }
                    td { (format!("{:.0} s", r.stuck_ms as f64 / 1000.0)) }
                    td { (format!("{:.0} s ago", r.age_ms as f64 / 1000.0)) }
                    td { @if app.records.as_ref().is_some_and(|rec| rec.scope_config(&r.scope).is_some()) {
                        (f.action("release", &[("scope", &r.scope), ("key", &r.idem_key)], "Release"))
                    } }
                }
            }
        }
    };
    answer(&seen, "Stuck records", notice(&app, &q), data, body)
}

pub(super) async fn graph<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let machine = q.get("machine").map_or("", String::as_str);
    let (Some(view), Some(text)) = (app.machines.get(machine), app.graph(machine)) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no machine {machine:?} on this page"),
        )
            .into_response();
    };
    let states = match app.states(machine).await {
        Ok(states) => states.unwrap_or_default(),
        Err(e) => return failed(&e),
    };
    let data = json!({ "machine": machine, "mermaid": text, "states": states });
    let body = html! {
        // Drawn on the server, its text escaped there; nothing fetched.
        div id="picture" style="overflow:auto;background:#fff;border:1px solid #dde1e6" {
            (maud::PreEscaped(view.picture()))
        }
        h2 { "Entities by state" }
        table id="states" {
            tr { th { "State" } th { "Entities" } }
            @for (state, n) in &states { tr { td { (state) } td { (n) } } }
        }
        details { summary { "As Mermaid text" } pre id="graph" { (text) } }
    };
    answer(&seen, &format!("The graph of {machine}"), None, data, body)
}

pub(super) async fn audit<S: AdminStore>(State(app): State<App<S>>, seen: Seen) -> Response {
    let rows = match app.audit(i64::from(PAGE)).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let data = json!({ "audit": rows });
    let body = audit_table(&rows);
    answer(&seen, "Audit", None, data, body)
}
