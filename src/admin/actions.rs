//! The page's actions: each a POST from a viewer with full access and their CSRF token,
//! made through the library's own fenced calls, recorded in the audit trail, and answered
//! with a redirect to the page it came from, carrying what it did.

use std::collections::HashMap;

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Access;
use super::AdminStore;
use super::ops::{Acted, Filter, OnTimer, resume_how};
use super::panel::App;
use super::seen::{Seen, refused};
use crate::error::Error;
use crate::error::Result;
use crate::outbox::EventKey;
use crate::timer::TimerKey;

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
    let notice = app.record(&seen.frame.who, action, target, &acted).await;
    if let Err((e, _)) = &acted {
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
    let acted = app.requeue_one(&key).await;
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
    let filter = match Filter::from_fields(&form) {
        Ok(filter) => filter,
        Err(e) => return bad_input(&e),
    };
    let acted = app.requeue_matching(&filter, &mut |_| {}).await;
    let target = filter.describe();
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
    let how_name = form.get("how").map_or("", String::as_str);
    let how = match resume_how(how_name, form.get("output").map(String::as_str)) {
        Ok(how) => how,
        Err(e) => return bad_input(&e),
    };
    if app.flows.is_none() {
        return bad_input(&Error::InvalidInput(
            "no flows are registered with this page".into(),
        ));
    }
    let target = format!("flow {kind} {key}: {how_name}");
    let acted = app.resume_flow(kind, key, how).await;
    done(&app, &seen, "flows", "flows.resume", &target, acted).await
}

/// Releases a record stuck in PROCESSING past its lease.
pub(super) async fn release<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let (scope, key) = match (field(&form, "scope"), field(&form, "key")) {
        (Ok(scope), Ok(key)) => (scope, key),
        (Err(e), _) | (_, Err(e)) => return bad_input(&e),
    };
    if app.records.is_none() {
        return bad_input(&Error::InvalidInput(
            "no idempotency records are registered with this page".into(),
        ));
    }
    let target = format!("record {scope} {key}");
    let acted = app.release_record(scope, key).await;
    done(&app, &seen, "records", "records.release", &target, acted).await
}

fn timer_key(form: &Fields) -> Result<(String, i64, String, String)> {
    Ok((
        field(form, "machine")?.to_string(),
        int(form, "entity_id")?,
        field(form, "event")?.to_string(),
        field(form, "ref_id")?.to_string(),
    ))
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

/// Re-arms or cancels a timer.
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
    let (action, acted) = app.on_timer(&key, what).await;
    done(&app, &seen, "timers", action, &target, acted).await
}
