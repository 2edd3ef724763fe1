//! One entity's timeline, the search that finds entities, and a machine's graph.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde_json::json;

use super::{
    answer, entity_link, events_table, flow_link, long_text, lookup, timer_link, urlencoding,
};
use crate::admin::AdminStore;
use crate::admin::ops::FOUND_MAX;
use crate::admin::ops::time_text;
use crate::admin::panel::App;
use crate::admin::seen::{Seen, failed};
use crate::error::Error;
use crate::timer::TimerKey;

pub(in crate::admin) async fn entity<S: AdminStore>(
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
    let before = match q.get("before").map(|b| b.trim().parse::<i64>()) {
        None => None,
        Some(Ok(before)) => Some(before),
        Some(Err(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "before is a version, an integer".to_string(),
            )
                .into_response();
        }
    };
    let t = match app.timeline(machine, id, before).await {
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
        h2 { "History, newest first" }
        table id="history" {
            tr { th { "Version" } th { "From" } th { "To" } th { "Event" } th { "Reference" }
                 th { "Payload" } th { "Who" } th { "Why" } th { "When" } }
            @for l in &t.history {
                tr {
                    td { (l.seq) } td { (l.from) } td { (l.to) } td { (l.event) } td { (l.ref_id) }
                    td { (l.payload_hash.as_deref().map_or_else(String::new, |h| h.chars().take(12).collect())) }
                    td { (l.actor.as_deref().unwrap_or("")) }
                    td { (long_text(l.reason.as_deref().unwrap_or(""), None)) }
                    td { (l.at) }
                }
            }
        }
        @if let Some(older) = t.older {
            p id="older" {
                a href=(format!("entity?machine={}&id={id}&before={older}", urlencoding(machine))) {
                    "Older history, below version " (older) " →"
                }
            }
        }
        h2 { "Outbox events" }
        (events_table(&t.events))
        h2 { "Timers" }
        table id="entity-timers" {
            tr { th { "Event" } th { "Reference" } th { "Due" } th { "Status" } th { "Outcome" } th { "Note" } }
            @for t in &t.timers {
                // A row that does not read has no key to open it by.
                @let whole = t.due_at.is_some().then(|| timer_link(&TimerKey {
                    machine, entity_id: id, event: &t.event, ref_id: &t.ref_id,
                }));
                tr {
                    td { @if let Some(href) = &whole { a href=(href) { (t.event) } } @else { (t.event) } }
                    td { (t.ref_id) } td { (t.due_at.map(time_text).unwrap_or_default()) } td { (t.status) }
                    td { (t.outcome.as_deref().unwrap_or("")) }
                    td.err { (long_text(t.last_error.as_deref().unwrap_or(""), whole.as_deref())) }
                }
            }
        }
    };
    answer(&seen, &title, None, data, body)
}

pub(in crate::admin) async fn search<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let term = q.get("q").map_or("", |t| t.trim());
    if term.is_empty() {
        let body = html! { p { "Search by a reference, an idempotency key, a flow key, a message id or an entity id: the box at the top." } };
        return answer(&seen, "Search", None, json!({}), body);
    }
    let prefix = q.get("prefix").is_some_and(|p| !p.is_empty() && p != "0");
    let found = match app.search(term, prefix).await {
        Ok(found) => found,
        Err(e @ Error::InvalidInput(_)) => {
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
        Err(e) => return failed(&e),
    };
    let data = json!(found);
    let entity = entity_link;
    let body = html! {
        form method="get" action="search" {
            input type="search" name="q" value=(found.term);
            label { " " input type="checkbox" name="prefix" value="1" checked[prefix]; " starts with" }
            " " button type="submit" { "Search" }
        }
        p id="found" {
            (found.count()) " found for " b { (found.term) } @if prefix { " (starts with)" } "."
            @if found.full() { " Only the first " (FOUND_MAX) " of a kind are shown: narrow the search." }
        }
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
                    tr { td { (fl.kind) } td { a href=(flow_link(&fl.kind, &fl.flow_key)) { (fl.flow_key) } } td { (fl.status) }
                         td { (fl.park_reason.as_deref().unwrap_or("")) } }
                }
            }
        }
    };
    answer(&seen, &format!("Search: {term}"), None, data, body)
}

pub(in crate::admin) async fn graph<S: AdminStore>(
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
        div id="picture" {
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
