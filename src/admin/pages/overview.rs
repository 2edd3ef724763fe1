//! The overview (what is stuck, counted) and the audit trail.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse, Response};
use maud::{Markup, PreEscaped, html};
use serde_json::json;

use super::{answer, audit_table, lookup, notice};
use crate::admin::AdminStore;
use crate::admin::ops::Overview;
use crate::admin::page::LIVE;
use crate::admin::panel::{App, PAGE};
use crate::admin::seen::{Seen, failed};
use crate::admin::trend::{Sample, chart};

/// The overview: what is stuck and what waits, counted, with charts of the last hour;
/// `?part=live` answers its live part alone (the counts and charts), which the page's
/// script reads every few seconds.
pub(in crate::admin) async fn overview<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    app.sample_on();
    let o = match app.overview().await {
        Ok(o) => o,
        Err(e) => return failed(&e),
    };
    let samples = app.trend.samples_to(&o);
    let live = live(&o, &samples);
    if q.get("part").is_some_and(|p| p == "live") {
        return Html(live.into_string()).into_response();
    }
    let recent = match app.audit(10).await {
        Ok(rows) => rows,
        Err(e) => return failed(&e),
    };
    let machines: Vec<&str> = app.machines.keys().copied().collect();
    let mut data = json!(o);
    data["audit"] = json!(recent);
    data["trend"] = json!(samples);
    let body = html! {
        div id="live" { (live) }
        script { (PreEscaped(LIVE)) }
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

/// The overview's live part: its counts, each linking to its list, and the charts.
fn live(o: &Overview, samples: &[Sample]) -> Markup {
    let card = |label: &str, n: String, bad: bool, href: &str| {
        html! {
            a.card href=(href) {
                div { (label) }
                div.n.bad[bad] { (n) }
            }
        }
    };
    let secs = |ms: i64| format!("{:.1} s", ms as f64 / 1000.0);
    html! {
        div.cards {
            (card("Events pending", o.outbox.pending.to_string(), false, "outbox?status=pending"))
            (card("Events dead", o.outbox.dead.to_string(), o.outbox.dead > 0, "outbox"))
            (card("Published, last minute", o.outbox.published_last_minute.map_or_else(|| "?".to_string(), |n| n.to_string()), false, "outbox?status=pending"))
            (card("Oldest pending", secs(o.outbox.oldest_pending_ms.try_into().unwrap_or(i64::MAX)), false, "outbox?status=pending"))
            (card("Flows parked", o.flows.parked.to_string(), o.flows.parked > 0, "flows"))
            (card("Flows running", o.flows.running.to_string(), false, "flows?which=running"))
            (card("Records stuck", o.records.stuck.to_string(), o.records.stuck > 0, "records"))
            (card("Records in flight", o.records.in_flight.map_or_else(|| "?".to_string(), |n| n.to_string()), false, "records?which=inflight"))
            (card("Timers due", o.timers.due.to_string(), false, "timers?status=pending"))
            (card("Timers dead", o.timers.dead.to_string(), o.timers.dead > 0, "timers"))
            (card("Oldest lateness", secs(o.timers.oldest_late_ms), false, "timers?status=pending"))
        }
        div.charts {
            @if o.outbox.published_last_minute.is_some() {
                (chart("chart-published", "Events published a minute", samples, |s| s.published.unwrap_or(0) as f64))
            }
            (chart("chart-pending", "Events pending", samples, |s| s.pending as f64))
            (chart("chart-dead", "Events dead", samples, |s| s.dead as f64))
            (chart("chart-timers", "Timers due", samples, |s| s.timers_due as f64))
            (chart("chart-parked", "Flows parked", samples, |s| s.parked as f64))
        }
    }
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
