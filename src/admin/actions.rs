//! The page's actions: each a POST from a viewer with full access and their CSRF token,
//! made through the library's own fenced calls, recorded in the audit trail, and answered
//! with a redirect to the page it came from, carrying what it did.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use super::Access;
use super::AdminStore;
use super::app::{App, Seen, refused};
use super::pages::matches;
use crate::flow::Resume;
use crate::outbox::{EventKey, Outbox};
use crate::store::audit::AuditEntry;
use crate::store::{Lease, db_error};
use crate::timer::{TimerKey, Timers};
use crate::{Error, Result};

/// How many dead events a bulk requeue reads, and requeues, at a time.
const BATCH: u32 = 500;

type Fields = HashMap<String, String>;

/// The action may go ahead: the viewer has full access and sent their token.
fn allowed<S: AdminStore>(app: &App<S>, seen: &Seen, form: &Fields) -> Option<Response> {
    if seen.frame.access != Access::Full {
        return Some(refused("a read-only viewer takes no action"));
    }
    let token = form.get("csrf").map_or("", String::as_str);
    if !app.csrf_holds(&seen.frame.who, token) {
        return Some(refused("the form's CSRF token is missing or not yours"));
    }
    None
}

fn field<'f>(form: &'f Fields, name: &str) -> Result<&'f str> {
    form.get(name)
        .map(String::as_str)
        .ok_or_else(|| Error::InvalidInput(format!("the form has no {name}")))
}

fn int(form: &Fields, name: &str) -> Result<i64> {
    let text = field(form, name)?;
    text.trim()
        .parse()
        .map_err(|_| Error::InvalidInput(format!("{name} is an integer, not {text:?}")))
}

/// What an action did: how many things it changed, or the error it stopped at and how
/// many it had changed by then.
type Acted = std::result::Result<i64, (Error, i64)>;

/// The longest `who` and `target` recorded (the audit table holds them).
const MAX_WHO: usize = 255;
const MAX_TARGET: usize = 4096;

/// Records the action (what it changed, and why it stopped if it failed), then answers:
/// a redirect to `page` with a notice of what changed; for a failure, its status (as a
/// read's: 503 for what may pass, 500 otherwise; 400 for bad input) and the notice.
async fn done<S: AdminStore>(
    app: &App<S>,
    seen: &Seen,
    page: &str,
    action: &str,
    target: &str,
    acted: Acted,
) -> Response {
    let (n, failure) = match &acted {
        Ok(n) => (*n, None),
        Err((e, n)) => (*n, Some(e)),
    };
    let recorded_target = match failure {
        None => bounded_str(target),
        Some(e) => bounded_str(&format!("{target} (failed: {e})")),
    };
    let who: String = seen.frame.who.chars().take(MAX_WHO).collect();
    let entry = AuditEntry {
        who: &who,
        action,
        target: &recorded_target,
        affected: n,
    };
    let store = &app.store;
    let recorded: Result<()> = async { leased!(store, |c| store.record_audit(c, &entry)) }.await;
    let mut notice = match failure {
        None => format!("{action} {target}: {n} changed"),
        Some(e) => format!("{action} {target} failed after {n} changed: {e}"),
    };
    if let Err(e) = recorded {
        // The action stands; only its record failed: say so.
        notice.push_str(&format!(" (the audit record failed: {e})"));
    }
    if let Some(e) = failure {
        let status = match e {
            Error::InvalidInput(_) => StatusCode::BAD_REQUEST,
            e if e.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        return (status, notice).into_response();
    }
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("done", &notice)
        .append_pair("sig", &app.sign(&notice))
        .finish();
    let location = format!("{page}?{query}");
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// `text` cut to [`MAX_TARGET`] bytes at a character boundary.
fn bounded_str(text: &str) -> String {
    let mut end = text.len().min(MAX_TARGET);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// A form field that does not read: 400, nothing done, nothing recorded.
fn bad_input(e: &Error) -> Response {
    (StatusCode::BAD_REQUEST, e.to_string()).into_response()
}

pub(super) async fn requeue<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let key = (|| {
        Ok::<_, Error>(EventKey {
            machine: field(&form, "machine")?.to_string(),
            entity_id: int(&form, "entity_id")?,
            version: int(&form, "version")?,
        })
    })();
    let key = match key {
        Ok(key) => key,
        Err(e) => return bad_input(&e),
    };
    let target = format!("{} {} v{}", key.machine, key.entity_id, key.version);
    let acted = Outbox::new(app.store.clone())
        .requeue(&key)
        .await
        .map(i64::from)
        .map_err(|e| (e, 0));
    done(&app, &seen, "outbox", "outbox.requeue", &target, acted).await
}

/// Requeues every dead event the filter matches, a batch at a time, recorded once.
pub(super) async fn requeue_matching<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let filter: Vec<String> = ["machine", "event", "error"]
        .iter()
        .filter_map(|k| {
            let v = form.get(*k)?.trim();
            (!v.is_empty()).then(|| format!("{k}={v}"))
        })
        .collect();
    let target = if filter.is_empty() {
        "every dead event".to_string()
    } else {
        format!("dead events where {}", filter.join(", "))
    };
    let outbox = Outbox::new(app.store.clone());
    let mut requeued = 0i64;
    // Each round reads the dead events up to a batch past the ones it left dead (those
    // the filter does not match, and any that did not move) and requeues the matching
    // ones, which leave the dead state. It ends once a round has read every dead event.
    let mut left = 0u32;
    let acted = loop {
        let limit = left.saturating_add(BATCH);
        let rows = match outbox.dead(limit).await {
            Ok(rows) => rows,
            Err(e) => break Err((e, requeued)),
        };
        let all_read = rows.len() < limit as usize || limit == u32::MAX;
        let mut moved = 0u32;
        let mut failed = None;
        for r in rows
            .iter()
            .filter(|r| matches(&form, &r.machine, &r.event, r.last_error.as_deref()))
        {
            let key = EventKey {
                machine: r.machine.clone(),
                entity_id: r.entity_id,
                version: r.version,
            };
            match outbox.requeue(&key).await {
                Ok(true) => moved += 1,
                Ok(false) => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        requeued += i64::from(moved);
        if let Some(e) = failed {
            break Err((e, requeued));
        }
        if all_read {
            break Ok(requeued);
        }
        left = u32::try_from(rows.len())
            .unwrap_or(u32::MAX)
            .saturating_sub(moved);
    };
    done(&app, &seen, "outbox", "outbox.requeue", &target, acted).await
}

pub(super) async fn resume<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let (kind, key) = (
        form.get("kind").map_or("", String::as_str),
        form.get("key").map_or("", String::as_str),
    );
    let how = form.get("how").map_or("", String::as_str);
    let target = format!("flow {kind} {key}: {how}");
    let how = match how {
        "retry" => Resume::Retry,
        "compensate" => Resume::Compensate,
        other => {
            return bad_input(&Error::InvalidInput(format!(
                "a resume is retry or compensate, not {other:?}"
            )));
        }
    };
    let Some(flows) = app.flows.as_ref() else {
        return bad_input(&Error::InvalidInput(
            "no flows are registered with this page".into(),
        ));
    };
    // A step that panics is this action's failure, not the page's.
    let resumed = AssertUnwindSafe(flows.resume(kind, key, how))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            Err(Error::InvalidInput(format!(
                "a step of flow {kind} {key} panicked"
            )))
        });
    let acted = resumed.map(|_| 1).map_err(|e| (e, 0));
    done(&app, &seen, "flows", "flows.resume", &target, acted).await
}

fn timer_key(form: &Fields) -> Result<(String, i64, String, String)> {
    Ok((
        field(form, "machine")?.to_string(),
        int(form, "entity_id")?,
        field(form, "event")?.to_string(),
        field(form, "ref_id")?.to_string(),
    ))
}

/// What to do with a timer.
#[derive(Clone, Copy)]
enum OnTimer {
    Rearm,
    Cancel,
}

pub(super) async fn rearm<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    on_timer(app, seen, form, OnTimer::Rearm).await
}

pub(super) async fn cancel_timer<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    on_timer(app, seen, form, OnTimer::Cancel).await
}

/// Re-arms a dead timer ([`Timers::rearm`]) or cancels a pending or dead one no job is
/// firing (the store's fenced `cancel_timer`).
async fn on_timer<S: AdminStore>(app: App<S>, seen: Seen, form: Fields, what: OnTimer) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let (machine, entity_id, event, ref_id) = match timer_key(&form) {
        Ok(key) => key,
        Err(e) => return bad_input(&e),
    };
    let target = format!("{machine} {entity_id} {event} {ref_id}");
    let key = TimerKey {
        machine: &machine,
        entity_id,
        event: &event,
        ref_id: &ref_id,
    };
    let store = &app.store;
    let (action, changed) = match what {
        OnTimer::Rearm => ("timers.rearm", Timers::new(store.clone()).rearm(&key).await),
        OnTimer::Cancel => (
            "timers.cancel",
            async { leased!(store, |c| store.cancel_timer(c, &key)) }.await,
        ),
    };
    let acted = changed.map(i64::from).map_err(|e| (e, 0));
    done(&app, &seen, "timers", action, &target, acted).await
}
