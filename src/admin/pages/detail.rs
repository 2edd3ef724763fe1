//! One thing whole: an outbox event (its body, the headers the relay sends, its last
//! error), a flow (its steps, each with its attempts, times and error), a timer; each
//! with the actions that apply to it and links to its entity's timeline.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde_json::json;

use super::{ago, answer, at, entity_link, long_text, notice, resume_actions, timer_actions};
use crate::admin::AdminStore;
use crate::admin::ops::{event_key, time_text};
use crate::admin::panel::App;
use crate::admin::seen::{Seen, failed};
use crate::outbox::Message;
use crate::timer::TimerKey;

/// A 400 naming what the query lacks or got wrong.
fn bad(why: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, why.into()).into_response()
}

/// A stored text whole, as preformatted text (JSON pretty-printed); a dash for none.
fn whole(text: Option<&str>) -> Markup {
    let Some(text) = text else {
        return html! { p { "—" } };
    };
    let shown = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .filter(|v| v.is_object() || v.is_array())
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string());
    html! { pre.whole { (shown) } }
}

/// One outbox event: `event?id=machine:entity_id:version`.
pub(in crate::admin) async fn event<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let key = match event_key(q.get("id").map_or("", |id| id.trim())) {
        Ok(key) => key,
        Err(e) => return bad(e.to_string()),
    };
    let row = match app.event(&key).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            let id = Message::id_of(&key.machine, key.entity_id, key.version);
            return (StatusCode::NOT_FOUND, format!("no outbox event {id}")).into_response();
        }
        Err(e) => return failed(&e),
    };
    let message = Message::from_row(&row);
    let headers = message.headers();
    let data = json!({
        "id": message.id, "machine": row.machine, "entity_id": row.entity_id,
        "version": row.version, "event": row.event, "transition": row.transition,
        "from": row.from_status, "to": row.to_status, "ref_id": row.ref_id,
        "status": row.status, "attempts": row.attempts, "age_ms": row.age_ms,
        "last_error": row.last_error, "body": row.body,
        "headers": headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
    });
    let f = &seen.frame;
    let body = html! {
        table.fields id="event" {
            tr { th { "Message id" } td { (message.id) } }
            tr { th { "Entity" } td { a href=(entity_link(&row.machine, row.entity_id)) { (row.machine) " " (row.entity_id) } } }
            tr { th { "Version" } td { (row.version) } }
            tr { th { "Event" } td { (row.event) } }
            tr { th { "Transition" } td { (row.transition) ": " (row.from_status) " → " (row.to_status) } }
            tr { th { "Reference" } td { (row.ref_id) } }
            tr { th { "Status" } td.bad[row.status == "DEAD"] { (row.status) } }
            tr { th { "Attempts" } td { (row.attempts) } }
            tr { th { "Written" } td { @if let Some(ms) = row.age_ms { (ago(ms)) } } }
        }
        @if row.status == "DEAD" {
            @let key = [
                ("machine", row.machine.as_str()), ("entity_id", &row.entity_id.to_string()),
                ("version", &row.version.to_string()),
            ];
            p { (f.action("requeue", &key, "Requeue")) " " (f.action("discard", &key, "Discard")) }
        }
        h2 { "Last error" }
        div.err { (whole(row.last_error.as_deref())) }
        h2 { "Headers the relay sends" }
        table id="headers" {
            @for (name, value) in &headers { tr { th { (name) } td { (value) } } }
        }
        h2 { "Body" }
        (whole(row.body.as_deref()))
    };
    answer(
        &seen,
        &format!("Event {}", message.id),
        notice(&app, &q),
        data,
        body,
    )
}

/// One flow and its steps: `flow?kind=K&key=F`.
pub(in crate::admin) async fn flow<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (Some(kind), Some(key)) = (q.get("kind"), q.get("key")) else {
        return bad("a flow is named by its kind and key: flow?kind=K&key=F");
    };
    let flows = match app.flows_here() {
        Ok(flows) => flows,
        Err(e) => return failed(&e),
    };
    let view = match flows.get(kind, key).await {
        Ok(Some(view)) => view,
        Ok(None) => {
            return (StatusCode::NOT_FOUND, format!("no flow {kind} {key}")).into_response();
        }
        Err(e) => return failed(&e),
    };
    let fl = &view.flow;
    let data = json!({
        "kind": fl.kind, "flow_key": fl.flow_key, "version": fl.version, "status": fl.status,
        "park_reason": fl.park_reason, "step_at": fl.step_at, "attempt": fl.attempt,
        "lease_left_ms": fl.lease_left_ms, "input": fl.input, "output": fl.output,
        "last_error": fl.last_error, "created_at": fl.created_at, "updated_at": fl.updated_at,
        "known": view.known,
        "waits": view.waits.as_ref().map(|w| json!({"step": w.step, "until": w.until_ms})),
        "steps": view.steps.iter().map(|s| json!({
            "step_index": s.step_index, "phase": s.phase, "name": s.name, "status": s.status,
            "attempt": s.attempt, "downstream_key": s.downstream_key, "output": s.output,
            "error": s.error, "started_at": s.started_at, "finished_at": s.finished_at,
        })).collect::<Vec<_>>(),
    });
    let f = &seen.frame;
    let body = html! {
        table.fields id="flow" {
            tr { th { "Kind" } td { (fl.kind) } }
            tr { th { "Key" } td { (fl.flow_key) } }
            tr { th { "Version" } td { (fl.version) @if !view.known { " (not registered here)" } } }
            tr { th { "Status" } td { (fl.status) } }
            tr { th { "Parked" } td.bad[fl.park_reason.is_some()] { (fl.park_reason.as_deref().unwrap_or("no")) } }
            tr { th { "Step" } td { (fl.step_at) } }
            tr { th { "Claims since progress" } td { (fl.attempt) } }
            tr { th { "Started" } td { (at(fl.created_at)) } }
            tr { th { "Last written" } td { (at(fl.updated_at)) } }
            @if let Some(w) = &view.waits {
                tr { th { "Waits" } td { (w.step) " until " (time_text(w.until_ms)) } }
            }
        }
        @if fl.park_reason.is_some() && view.known {
            p { (resume_actions(f, &fl.kind, &fl.flow_key)) }
        }
        h2 { "Steps" }
        table id="steps" {
            tr { th { "#" } th { "Phase" } th { "Step" } th { "Status" } th { "Attempts" }
                 th { "Key" } th { "Began" } th { "Took" } th { "Error" } th { "Output" } }
            @for s in &view.steps {
                tr {
                    td { (s.step_index) }
                    td { (if s.phase == "C" { "compensation" } else { "forward" }) }
                    td { (s.name) }
                    td.bad[s.status == "FAILED"] { (s.status) }
                    td { (s.attempt) }
                    td { (s.downstream_key.as_deref().unwrap_or("")) }
                    td { (at(s.started_at)) }
                    td { (s.finished_at.map_or_else(String::new, |end| format!("{} ms", end.saturating_sub(s.started_at)))) }
                    td.err { (long_text(s.error.as_deref().unwrap_or(""), None)) }
                    td { (long_text(s.output.as_deref().unwrap_or(""), None)) }
                }
            }
        }
        h2 { "Last error" }
        div.err { (whole(fl.last_error.as_deref())) }
        h2 { "Input" }
        (whole(Some(&fl.input)))
        h2 { "Output" }
        (whole(fl.output.as_deref()))
    };
    answer(
        &seen,
        &format!("Flow {} {}", fl.kind, fl.flow_key),
        notice(&app, &q),
        data,
        body,
    )
}

/// One timer: `timer?machine=M&id=N&event=E&ref=R`.
pub(in crate::admin) async fn timer<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (Some(machine), Some(id), Some(event), Some(ref_id)) =
        (q.get("machine"), q.get("id"), q.get("event"), q.get("ref"))
    else {
        return bad("a timer is named by machine, id, event and ref");
    };
    let Ok(entity_id) = id.trim().parse::<i64>() else {
        return bad(format!("an entity id is an integer, not {id:?}"));
    };
    let key = TimerKey {
        machine,
        entity_id,
        event,
        ref_id,
    };
    let t = match app.timer(&key).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            let why = format!("no timer {event} {ref_id} of {machine} {entity_id}");
            return (StatusCode::NOT_FOUND, why).into_response();
        }
        Err(e) => return failed(&e),
    };
    let data = json!({
        "machine": t.machine, "entity_id": t.entity_id, "event": t.event, "ref_id": t.ref_id,
        "due_at": t.due_at, "status": t.status, "outcome": t.outcome, "attempts": t.attempts,
        "last_error": t.last_error, "late_ms": t.late_ms, "state": t.state, "version": t.version,
    });
    let f = &seen.frame;
    let body = html! {
        table.fields id="timer" {
            tr { th { "Entity" } td { a href=(entity_link(&t.machine, t.entity_id)) { (t.machine) " " (t.entity_id) } } }
            tr { th { "Event" } td { (t.event) } }
            tr { th { "Reference" } td { (t.ref_id) } }
            tr { th { "Due" } td { (at(t.due_at)) } }
            tr { th { "Status" } td.bad[t.status == "DEAD"] { (t.status) } }
            tr { th { "Outcome" } td { (t.outcome.as_deref().unwrap_or("")) } }
            tr { th { "Attempts" } td { (t.attempts) } }
            @if let (Some(state), Some(version)) = (&t.state, t.version) {
                tr { th { "Armed at" } td { (state) ", version " (version) } }
            }
        }
        p { (timer_actions(f, &key, &t.status)) }
        h2 { "Last error" }
        div.err { (whole(t.last_error.as_deref())) }
    };
    let title = format!(
        "Timer {} {} of {} {}",
        t.event, t.ref_id, t.machine, t.entity_id
    );
    answer(&seen, &title, notice(&app, &q), data, body)
}
