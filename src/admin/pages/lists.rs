//! The lists of what is stuck: dead events, parked flows, dead timers, records stuck in
//! PROCESSING.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde_json::json;

use super::{
    ago, answer, at, entity_link, event_link, flow_link, long_text, notice, resume_actions,
    timer_actions, timer_link, urlencoding,
};
use crate::admin::AdminStore;
use crate::admin::lookup::{Held, HeldKey, TimerAt};
use crate::admin::ops::{Filter, event_key, id_of, unsupported};
use crate::admin::panel::{App, PAGE};
use crate::admin::seen::{Seen, failed};
use crate::flow::Listing;
use crate::outbox::Outbox;
use crate::timer::TimerKey;

/// How many there are in all (`what`: "flows are parked"), and when not all are
/// shown, how many this page shows.
fn shown(total: u64, here: usize, paged: bool, what: &str) -> String {
    if paged {
        format!("{total} {what}; this page shows {here}.")
    } else {
        format!("{total} {what}.")
    }
}

/// The outbox's events of one status, `?status=dead` (the default) or `pending` (the
/// backlog): filtered, counted, paged.
pub(in crate::admin) async fn events<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (status, dead) = match q.get("status").map_or("dead", |s| s.trim()) {
        "dead" | "" => ("DEAD", true),
        "pending" => ("PENDING", false),
        other => {
            let why = format!("a status of the list is dead or pending, not {other:?}");
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    let filter = match Filter::from_fields(&q) {
        Ok(filter) => filter,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    // The page after a key: its message id, as the link to the next page gives it.
    let after = q.get("after").map(|a| a.trim()).filter(|a| !a.is_empty());
    let after = match after.map(event_key).transpose() {
        Ok(after) => after,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    // The page; what "Requeue every match" acts on, counted by the same filter; and with
    // the dead, the rows orderly never writes (a key that is not an integer, a status it
    // does not know, a column of the wrong type), which are not events: listed apart, as
    // stored. Three reads at once, each on a connection of its own.
    let corrupt = async {
        match dead {
            true => Outbox::new(app.store().clone()).corrupt(PAGE).await,
            false => Ok(Vec::new()),
        }
    };
    let read = tokio::try_join!(
        app.gated(app.events_page(status, &filter, after.as_ref(), PAGE)),
        app.gated(app.count_events(status, &filter)),
        app.gated(corrupt)
    );
    let ((rows, next), matching, corrupt) = match read {
        Ok(read) => read,
        Err(e) => return failed(&e),
    };
    let next = next.as_ref().map(id_of);
    let list = if dead { "dead" } else { "pending" };
    let data = json!({ "matching": matching, "after": after.as_ref().map(id_of), "next": next,
        list: rows.iter().map(|r| json!({
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
                        td { (c.status) } td.err { (long_text(&c.reason, None)) }
                    }
                }
            }
        }
        p.tabs {
            a.here[dead] href="outbox" { "Dead" } " · " a.here[!dead] href="outbox?status=pending" { "Waiting to be published" }
        }
        form method="get" action="outbox" {
            @if !dead { input type="hidden" name="status" value="pending"; }
            "Machine " input type="text" name="machine" value=(field("machine"));
            " Event " input type="text" name="event" value=(field("event"));
            " Error contains " input type="text" name="error" value=(field("error"));
            " Older than " input type="text" name="older" size="6" value=(field("older")) " s";
            " " button type="submit" { "Filter" }
        }
        p id="matching" {
            (matching) (if dead { " dead events match" } else { " events waiting match" })
            @if after.is_some() || next.is_some() {
                "; shown here: " (rows.len()) ", in key order"
                @if let Some(a) = &after { ", after " (id_of(a)) }
            }
            "."
        }
        @if dead && matching > 0 {
            @let filter = [
                ("machine", field("machine")), ("event", field("event")), ("error", field("error")),
                ("older", field("older")),
            ];
            (f.action("requeue-matching", &filter, &format!("Requeue every match ({matching})")))
            " "
            (f.action("discard-matching", &filter, &format!("Discard every match ({matching})")))
        }
        table id=(list) {
            tr { th { "Machine" } th { "Entity" } th { "Version" } th { "Event" } th { "Reference" }
                 th { "Attempts" } th { "Last error" } th { "Written" } @if dead { th {} } }
            @for r in &rows {
                @let event = event_link(&r.machine, r.entity_id, r.version);
                tr {
                    td { (r.machine) }
                    td { a href=(entity_link(&r.machine, r.entity_id)) { (r.entity_id) } }
                    td { (r.version) }
                    td { a href=(event) { (r.event) } }
                    td { (r.ref_id) }
                    td { (r.attempts) }
                    td.err { (long_text(r.last_error.as_deref().unwrap_or(""), Some(&event))) }
                    td { @if let Some(ms) = r.age_ms { (ago(ms)) } }
                    @if dead {
                        @let key = [
                            ("machine", r.machine.as_str()), ("entity_id", &r.entity_id.to_string()),
                            ("version", &r.version.to_string()),
                        ];
                        td { (f.action("requeue", &key, "Requeue")) " " (f.action("discard", &key, "Discard")) }
                    }
                }
            }
        }
    };
    // The same filter, from its first page or after a key.
    let link = |after: Option<&str>| {
        let mut parts: Vec<String> = (!dead)
            .then(|| "status=pending".to_string())
            .into_iter()
            .collect();
        parts.extend(
            fields
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| format!("{k}={}", urlencoding(v))),
        );
        parts.extend(after.map(|a| format!("after={}", urlencoding(a))));
        format!("outbox?{}", parts.join("&"))
    };
    let body = html! {
        (body)
        p id="pages" {
            @if after.is_some() { a href=(link(None)) { "← First page" } " " }
            @if let Some(n) = &next { a href=(link(Some(n))) { "Next page →" } }
        }
    };
    let title = if dead {
        "Dead events"
    } else {
        "Events waiting to be published"
    };
    answer(&seen, title, notice(&app, &q), data, body)
}

/// The flows of one listing, `?which=parked` (the default), `running`, `stuck` (their
/// lease run out, for the recovery job) or `finished`: counted, paged by kind and key.
pub(in crate::admin) async fn flows<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (listing, which) = match q.get("which").map_or("parked", |w| w.trim()) {
        "parked" | "" => (Listing::Parked, "parked"),
        "running" => (Listing::Running, "running"),
        "stuck" => (Listing::Stuck, "stuck"),
        "finished" => (Listing::Finished, "finished"),
        other => {
            let why =
                format!("a listing of flows is parked, running, stuck or finished, not {other:?}");
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    let parked = listing == Listing::Parked;
    // The page after a flow: its kind and key, as the link to the next page gives them.
    let after = match (q.get("after_kind"), q.get("after_key")) {
        (Some(kind), Some(key)) => Some((kind.as_str(), key.as_str())),
        (None, None) => None,
        _ => {
            let why = "a page after a flow names both after_kind and after_key";
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    let flows = match app.flows_here() {
        Ok(flows) => flows,
        Err(e) => return failed(&e),
    };
    let (mut rows, count) =
        match tokio::try_join!(flows.list(listing, after, PAGE + 1), flows.count(listing)) {
            Ok(read) => read,
            Err(e) => return failed(&e),
        };
    let next = (rows.len() > PAGE as usize).then(|| {
        rows.truncate(PAGE as usize);
        rows.last()
            .map(|l| (l.flow.kind.clone(), l.flow.flow_key.clone()))
    });
    let next = next.flatten();
    let data = json!({ "count": count, "next": next.as_ref().map(|(kind, key)| json!({"kind": kind, "key": key})),
        which: rows.iter().map(|l| json!({
        "kind": l.flow.kind, "flow_key": l.flow.flow_key, "version": l.flow.version,
        "status": l.flow.status, "park_reason": l.flow.park_reason, "step_at": l.flow.step_at,
        "last_error": l.flow.last_error, "known": l.known,
    })).collect::<Vec<_>>() });
    let f = &seen.frame;
    let body = html! {
        @if app.flows.is_none() {
            p { "No flows are registered with this page: it lists them, and resumes none." }
        }
        p.tabs {
            @for (i, w) in ["parked", "running", "stuck", "finished"].into_iter().enumerate() {
                @if i > 0 { " · " }
                a.here[w == which] href=(format!("flows?which={w}")) { (w) }
            }
        }
        p id="count" { (shown(count, rows.len(), after.is_some() || next.is_some(), &format!("flows are {which}"))) }
        table id=(which) {
            tr { th { "Kind" } th { "Key" } th { "Version" } th { "Status" } th { "Reason" }
                 th { "Step" } th { "Last error" } th {} }
            @for l in &rows {
                @let whole = flow_link(&l.flow.kind, &l.flow.flow_key);
                tr {
                    td { (l.flow.kind) }
                    td { a href=(whole) { (l.flow.flow_key) } }
                    td { (l.flow.version) }
                    td { (l.flow.status) }
                    td { (long_text(l.flow.park_reason.as_deref().unwrap_or(""), Some(&whole))) }
                    td { (l.flow.step_at) }
                    td.err { (long_text(l.flow.last_error.as_deref().unwrap_or(""), Some(&whole))) }
                    td {
                        @if !parked {
                        } @else if l.known {
                            (resume_actions(f, &l.flow.kind, &l.flow.flow_key))
                        } @else {
                            "version not registered here"
                        }
                    }
                }
            }
        }
    };
    let body = html! {
        (body)
        p id="pages" {
            @if after.is_some() { a href=(format!("flows?which={which}")) { "← First page" } " " }
            @if let Some((kind, key)) = &next {
                a href=(format!("flows?which={which}&after_kind={}&after_key={}", urlencoding(kind), urlencoding(key))) {
                    "Next page →"
                }
            }
        }
    };
    let title = format!("Flows {which}");
    answer(&seen, &title, notice(&app, &q), data, body)
}

/// The timers of one status, `?status=dead` (the default) or `pending`, in the order of
/// their next attempt: counted, paged by that and their id.
pub(in crate::admin) async fn timers<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (status, which) = match q.get("status").map_or("dead", |w| w.trim()) {
        "dead" | "" => ("DEAD", "dead"),
        "pending" => ("PENDING", "pending"),
        other => {
            let why = format!("a status of the list is dead or pending, not {other:?}");
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    // The page after a timer: its next attempt and id, as the next link gives them.
    let number = |name: &str| -> Result<Option<i64>, String> {
        match q.get(name).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{name} is an integer, not {v:?}")),
        }
    };
    let after = match (number("after_at"), number("after_id")) {
        (Ok(Some(next_at)), Ok(Some(id))) => Some(TimerAt { next_at, id }),
        (Ok(None), Ok(None)) => None,
        (Err(why), _) | (_, Err(why)) => return (StatusCode::BAD_REQUEST, why).into_response(),
        _ => {
            let why = "a page after a timer names both after_at and after_id";
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    let read = tokio::try_join!(
        app.gated(app.timers_page(status, after.as_ref(), PAGE)),
        app.gated(app.count_timers(status))
    );
    let (page, count) = match read {
        Ok(read) => read,
        // A store of one's own that pages no further (its default) was asked for a page.
        Err(e) if unsupported(&e) => {
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
        Err(e) => return failed(&e),
    };
    // A page that ends where it began made no progress (on SQLite, a next attempt stored
    // as text sorts after every number, and a page of those reads back the same): no
    // next page then.
    let next = page.next.filter(|n| Some(*n) != after);
    let read = page.rows.len();
    let (rows, corrupt): (Vec<_>, Vec<_>) = page.rows.into_iter().partition(Result::is_ok);
    let rows: Vec<_> = rows.into_iter().flatten().collect();
    let corrupt: Vec<String> = corrupt
        .into_iter()
        .filter_map(|c| c.err())
        .map(|c| c.to_string())
        .collect();
    let data = json!({
        "count": count,
        "next": next.map(|n| json!({"next_at": n.next_at, "id": n.id})),
        which: rows.iter().map(|t| json!({
            "machine": t.machine, "entity_id": t.entity_id, "event": t.event, "ref_id": t.ref_id,
            "due_at": t.due_at, "attempts": t.attempts, "last_error": t.last_error,
        })).collect::<Vec<_>>(),
        "corrupt": corrupt,
    });
    let link = |after: Option<TimerAt>| {
        let mut parts: Vec<String> = Vec::new();
        if which == "pending" {
            parts.push("status=pending".into());
        }
        if let Some(a) = after {
            parts.push(format!("after_at={}&after_id={}", a.next_at, a.id));
        }
        format!("timers?{}", parts.join("&"))
    };
    let f = &seen.frame;
    let body = html! {
        p.tabs {
            a.here[which == "dead"] href="timers" { "Dead" } " · "
            a.here[which == "pending"] href="timers?status=pending" { "Pending" }
        }
        p id="count" {
            (shown(count, read, after.is_some() || next.is_some() || count > read as u64, &format!("timers are {which}")))
            " In the order of their next attempt."
        }
        table id="timers" {
            tr { th { "Machine" } th { "Entity" } th { "Event" } th { "Reference" } th { "Due" }
                 th { "Attempts" } th { "Last error" } th {} }
            @for t in &rows {
                @let key = TimerKey { machine: &t.machine, entity_id: t.entity_id, event: &t.event, ref_id: &t.ref_id };
                @let whole = timer_link(&key);
                tr {
                    td { (t.machine) }
                    td { a href=(entity_link(&t.machine, t.entity_id)) { (t.entity_id) } }
                    td { a href=(whole) { (t.event) } }
                    td { (t.ref_id) }
                    td { (at(t.due_at)) }
                    td { (t.attempts) }
                    td.err { (long_text(t.last_error.as_deref().unwrap_or(""), Some(&whole))) }
                    td { (timer_actions(f, &key, &t.status)) }
                }
            }
        }
        @if !corrupt.is_empty() {
            h2 { "Rows that do not read" }
            ul { @for c in &corrupt { li { (c) } } }
        }
        p id="pages" {
            @if after.is_some() { a href=(link(None)) { "← First page" } " " }
            @if let Some(n) = next { a href=(link(Some(n))) { "Next page →" } }
        }
    };
    let title = if which == "dead" {
        "Dead timers"
    } else {
        "Pending timers"
    };
    answer(&seen, title, notice(&app, &q), data, body)
}

/// The idempotency records held in PROCESSING, `?which=stuck` (the default: their lease
/// run out) or `inflight` (at work now), of one scope or of all: counted, paged in lease
/// order.
pub(in crate::admin) async fn stuck_records<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (held, stuck) = match q.get("which").map_or("stuck", |w| w.trim()) {
        "stuck" | "" => (Held::Stuck, true),
        "inflight" => (Held::InFlight, false),
        other => {
            let why = format!("a list of records is stuck or inflight, not {other:?}");
            return (StatusCode::BAD_REQUEST, why).into_response();
        }
    };
    let scope = q.get("scope").map(|s| s.trim()).filter(|s| !s.is_empty());
    // The page after a record: its lease's end, scope and key, as the next link gives them.
    let after = match q
        .get("after_lease")
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
    {
        None => None,
        Some(lease) => match lease.parse() {
            Ok(lease_until) => Some(HeldKey {
                lease_until,
                scope: q.get("after_scope").cloned().unwrap_or_default(),
                idem_key: q.get("after_key").cloned().unwrap_or_default(),
            }),
            Err(_) => {
                let why = format!("after_lease is an integer, not {lease:?}");
                return (StatusCode::BAD_REQUEST, why).into_response();
            }
        },
    };
    let read = tokio::try_join!(
        app.gated(app.held_page(held, scope, after.as_ref(), PAGE)),
        app.gated(app.count_held(held, scope))
    );
    let ((rows, next), count) = match read {
        Ok(read) => read,
        // A store of one's own that pages no further, or lists none in flight (its
        // defaults), was asked for that.
        Err(e) if unsupported(&e) => {
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
        Err(e) => return failed(&e),
    };
    let list = if stuck { "stuck" } else { "in_flight" };
    let data = json!({ "count": count, list: rows, "next": next.as_ref().map(|n| json!({
        "lease_until": n.lease_until, "scope": n.scope, "idem_key": n.idem_key,
    })) });
    let f = &seen.frame;
    let releases = |scope: &str| {
        stuck
            && app
                .records
                .as_ref()
                .is_some_and(|rec| rec.scope_config(scope).is_some())
    };
    let what = if stuck {
        "records are stuck"
    } else {
        "records are in flight"
    };
    let body = html! {
        p.tabs {
            a.here[stuck] href="records" { "Stuck" } " · " a.here[!stuck] href="records?which=inflight" { "In flight" }
        }
        form method="get" action="records" {
            @if !stuck { input type="hidden" name="which" value="inflight"; }
            "Scope " input type="text" name="scope" value=(scope.unwrap_or(""));
            " " button type="submit" { "Filter" }
        }
        @if app.records.is_none() && stuck {
            p { "No idempotency records are registered with this page: it lists them, and releases none." }
        }
        p id="count" { (shown(count, rows.len(), after.is_some() || next.is_some(), what)) }
        table id=(list) {
            tr { th { "Scope" } th { "Key" } th { "Attempt" }
                 th { (if stuck { "Stuck for" } else { "Lease left" }) } th { "Claimed" } @if stuck { th {} } }
            @for r in &rows {
                tr {
                    td { (r.scope) } td { (r.idem_key) } td { (r.attempt) }
                    td { (format!("{:.0} s", r.lease_left_ms.unsigned_abs() as f64 / 1000.0)) }
                    td { (ago(r.age_ms)) }
                    @if stuck {
                        td { @if releases(&r.scope) {
                            (f.action("release", &[("scope", &r.scope), ("key", &r.idem_key)], "Release"))
                        } }
                    }
                }
            }
        }
    };
    let link = |after: Option<&HeldKey>| {
        let mut parts: Vec<String> = Vec::new();
        if !stuck {
            parts.push("which=inflight".into());
        }
        parts.extend(scope.map(|s| format!("scope={}", urlencoding(s))));
        if let Some(a) = after {
            parts.push(format!("after_lease={}", a.lease_until));
            parts.push(format!("after_scope={}", urlencoding(&a.scope)));
            parts.push(format!("after_key={}", urlencoding(&a.idem_key)));
        }
        format!("records?{}", parts.join("&"))
    };
    let body = html! {
        (body)
        p id="pages" {
            @if after.is_some() { a href=(link(None)) { "← First page" } " " }
            @if let Some(n) = &next { a href=(link(Some(n))) { "Next page →" } }
        }
    };
    let title = if stuck {
        "Stuck records"
    } else {
        "Records in flight"
    };
    answer(&seen, title, notice(&app, &q), data, body)
}
