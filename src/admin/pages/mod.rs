//! The pages: the overview, the lists of what is stuck (dead events, parked flows, dead
//! timers), an entity's timeline, a machine's graph and the audit trail, each as HTML
//! or, with `?format=json`, its data: the overview and the audit trail in `overview.rs`,
//! the lists in `lists.rs`, an entity, the search and a graph in `entity.rs`; what they
//! share (the answer as HTML or JSON, the notice of an action, small tables) here.

mod detail;
mod entity;
mod lists;
mod overview;

pub(in crate::admin) use detail::{event, flow, timer};
pub(in crate::admin) use entity::{entity, graph, search};
pub(in crate::admin) use lists::{events, flows, stuck_records, timers};
pub(in crate::admin) use overview::{audit, overview};

use std::collections::HashMap;

use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, html};

use super::AdminStore;
use super::ops::{Event, time_text};
use super::panel::Admin;
use super::seen::Seen;
use crate::store::audit::AuditRow;

/// A page as HTML, or its data as JSON.
fn answer(
    seen: &Seen,
    title: &str,
    notice: Option<&str>,
    data: serde_json::Value,
    body: Markup,
) -> Response {
    let mut response = if seen.json {
        axum::Json(data).into_response()
    } else {
        Html(seen.frame.page(title, notice, body).into_string()).into_response()
    };
    // The browser's session with the page, which its forms' tokens are bound to.
    if let Some(cookie) = &seen.new_session
        && let Ok(value) = axum::http::HeaderValue::from_str(cookie)
    {
        response
            .headers_mut()
            .append(axum::http::header::SET_COOKIE, value);
    }
    response
}

/// The notice an action left in the query (`done`), if this page signed it (`sig`): a
/// link made elsewhere shows none.
fn notice<'q, S: AdminStore>(app: &Admin<S>, q: &'q HashMap<String, String>) -> Option<&'q str> {
    let text = q.get("done")?;
    let sig = q.get("sig")?;
    app.signed(text, sig).then_some(text.as_str())
}

/// `text` as a query value.
fn urlencoding(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
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
                @let whole = event_link(&e.machine, e.entity_id, e.version);
                tr {
                    td { a href=(whole) { (e.id) } } td { (e.event) } td { (e.ref_id) }
                    td.bad[e.status == "DEAD"] { (e.status) }
                    td { (e.attempts) }
                    td.err { (long_text(e.last_error.as_deref().unwrap_or(""), Some(&whole))) }
                }
            }
        }
    }
}

/// The most bytes of a stored text a table cell shows before the rest is folded away.
const CELL_BYTES: usize = 1024;

/// A stored text (an error, a reason) in a table cell: whole up to [`CELL_BYTES`], longer
/// cut on a character boundary with how long it is, and a way to see it all: a link to
/// the page that shows it whole, or else the whole folded under "show all" (a
/// `<details>`: no script).
fn long_text(text: &str, whole_at: Option<&str>) -> Markup {
    if text.len() <= CELL_BYTES {
        return html! { (text) };
    }
    let cut = &text[..text.floor_char_boundary(CELL_BYTES)];
    let all = format!("show all ({} bytes)", text.len());
    html! {
        (cut) "…"
        @if let Some(href) = whole_at {
            " " a.all href=(href) { (all) }
        } @else {
            details.all {
                summary { (all) }
                pre { (text) }
            }
        }
    }
}

/// A span of `ms` milliseconds in words, the way an operator reads an age: "just now",
/// "42 s", "3 min", "5 h", "2 d".
fn span_words(ms: i64) -> String {
    let s = ms.unsigned_abs() / 1000;
    match s {
        0 => "just now".into(),
        1..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// An age of `ms` milliseconds: "3 min ago", with the exact time (UTC) on hover.
fn ago(ms: i64) -> Markup {
    when(chrono::Utc::now().timestamp_millis().saturating_sub(ms), ms)
}

/// A time, `at_ms` since the epoch: "3 min ago" or "in 5 min" by this server's clock,
/// with the exact time on hover.
fn at(at_ms: i64) -> Markup {
    when(
        at_ms,
        chrono::Utc::now().timestamp_millis().saturating_sub(at_ms),
    )
}

fn when(at_ms: i64, ago_ms: i64) -> Markup {
    let words = span_words(ago_ms);
    let words = match (ago_ms < 0, words.as_str()) {
        (_, "just now") => words,
        (true, _) => format!("in {words}"),
        (false, _) => format!("{words} ago"),
    };
    html! { span.when title=(super::ops::time_text(at_ms)) { (words) } }
}

/// The link to an outbox event's page.
fn event_link(machine: &str, entity_id: i64, version: i64) -> String {
    let id = crate::outbox::Message::id_of(machine, entity_id, version);
    format!("event?id={}", urlencoding(&id))
}

/// The link to a flow's page.
fn flow_link(kind: &str, key: &str) -> String {
    format!("flow?kind={}&key={}", urlencoding(kind), urlencoding(key))
}

/// The link to a timer's page.
fn timer_link(key: &crate::timer::TimerKey<'_>) -> String {
    format!(
        "timer?machine={}&id={}&event={}&ref={}",
        urlencoding(key.machine),
        key.entity_id,
        urlencoding(key.event),
        urlencoding(key.ref_id)
    )
}

/// The ways to resume a parked flow: retry its step, mark it applied (with the step's
/// output), compensate.
fn resume_actions(f: &super::page::Frame, kind: &str, key: &str) -> Markup {
    let named = |how| [("kind", kind), ("key", key), ("how", how)];
    html! {
        (f.action("resume", &named("retry"), "Retry"))
        " "
        (f.action_with("resume", &named("applied"), Some(("output", "output JSON")), "Mark applied"))
        " "
        (f.action("resume", &named("compensate"), "Compensate"))
    }
}

/// What can be done to a timer in `status`: re-arm a dead one, cancel a pending or dead
/// one.
fn timer_actions(f: &super::page::Frame, key: &crate::timer::TimerKey<'_>, status: &str) -> Markup {
    let id = key.entity_id.to_string();
    let fields = [
        ("machine", key.machine),
        ("entity_id", id.as_str()),
        ("event", key.event),
        ("ref_id", key.ref_id),
    ];
    html! {
        @if status == "DEAD" { (f.action("rearm", &fields, "Re-arm")) " " }
        @if status == "DEAD" || status == "PENDING" { (f.action("cancel-timer", &fields, "Cancel")) }
    }
}
