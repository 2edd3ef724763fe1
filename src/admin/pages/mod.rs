//! The pages: the overview, the lists of what is stuck (dead events, parked flows, dead
//! timers), an entity's timeline, a machine's graph and the audit trail, each as HTML
//! or, with `?format=json`, its data: the overview and the audit trail in `overview.rs`,
//! the lists in `lists.rs`, an entity, the search and a graph in `entity.rs`; what they
//! share (the answer as HTML or JSON, the notice of an action, small tables) here.

mod entity;
mod lists;
mod overview;

pub(in crate::admin) use entity::{entity, graph, search};
pub(in crate::admin) use lists::{dead_events, dead_timers, parked_flows, stuck_records};
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
                tr {
                    td { (e.id) } td { (e.event) } td { (e.ref_id) }
                    td.bad[e.status == "DEAD"] { (e.status) }
                    td { (e.attempts) }
                    td.err { (long_text(e.last_error.as_deref().unwrap_or(""))) }
                }
            }
        }
    }
}

/// The most bytes of a stored text a table cell shows before the rest is folded away.
const CELL_BYTES: usize = 1024;

/// A stored text (an error, a reason) in a table cell: whole up to [`CELL_BYTES`], longer
/// cut on a character boundary with how long it is, the whole folded under "show all"
/// (a `<details>`: no script).
fn long_text(text: &str) -> Markup {
    if text.len() <= CELL_BYTES {
        return html! { (text) };
    }
    let cut = &text[..text.floor_char_boundary(CELL_BYTES)];
    html! {
        (cut) "…"
        details.all {
            summary { "show all (" (text.len()) " bytes)" }
            pre { (text) }
        }
    }
}
