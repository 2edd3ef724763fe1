//! The overview (what is stuck, counted) and the audit trail.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::Response;
use maud::html;
use serde_json::json;

use super::{answer, audit_table, lookup, notice};
use crate::admin::AdminStore;
use crate::admin::panel::{App, PAGE};
use crate::admin::seen::{Seen, failed};

pub(in crate::admin) async fn overview<S: AdminStore>(
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
            a.card href=(href) {
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
            (card("Flows parked", o.flows.parked.to_string(), o.flows.parked > 0, "flows"))
            (card("Flows running", o.flows.running.to_string(), false, "flows"))
            (card("Records stuck", o.records.stuck.to_string(), o.records.stuck > 0, "records"))
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

pub(in crate::admin) async fn audit<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
) -> Response {
    let rows = match app.audit(i64::from(PAGE)).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let data = json!({ "audit": rows });
    let body = audit_table(&rows);
    answer(&seen, "Audit", None, data, body)
}
