//! The page's actions: each a POST from a viewer with full access and their CSRF token,
//! made through the library's own fenced calls, recorded in the audit trail, and answered
//! with a redirect to the page it came from, carrying what it did.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;

use super::Access;
use super::AdminStore;
use super::ops::{Acted, Filter, OnDead, OnTimer, resume_how};
use super::panel::App;
use super::seen::{Seen, refused};
use crate::error::Error;
use crate::error::Result;
use crate::outbox::EventKey;
use crate::timer::TimerKey;

type Fields = HashMap<String, String>;

/// The action may go ahead: it came from the page's own site, the viewer has full
/// access and sent their token, drawn for them and not expired.
fn allowed<S: AdminStore>(app: &App<S>, seen: &Seen, form: &Fields) -> Option<Response> {
    if let Some(why) = &seen.cross_site {
        return Some(refused(&format!(
            "an action posted from another site is refused ({why})"
        )));
    }
    if seen.frame.access != Access::Full {
        return Some(refused("a read-only viewer takes no action"));
    }
    let token = form.get("csrf").map_or("", String::as_str);
    if !app.csrf_holds(&seen.frame.who, &seen.session, token) {
        return Some(refused(
            "the form's CSRF token is missing, not yours, not of this browser session, or \
             expired: reload the page",
        ));
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

/// Runs the action `act` and records it in the audit trail (what it changed, and why it
/// stopped if it failed) on a task of its own, then answers: a redirect to `page` with
/// a notice of what changed; for a failure, its status (as a read's: 503 for what may
/// pass, 500 otherwise; 400 for bad input) and the notice. A client that hangs up drops
/// this handler, not the task: the action runs to its end and is recorded whatever the
/// client does (a panic in it is recorded as its failure).
async fn done<S, F, Fut>(
    app: &App<S>,
    seen: &Seen,
    page: &str,
    action: &'static str,
    target: String,
    act: F,
) -> Response
where
    S: AdminStore,
    F: FnOnce(App<S>) -> Fut + Send + 'static,
    Fut: Future<Output = Acted> + Send + 'static,
{
    let (app, who) = (Arc::clone(app), seen.frame.who.clone());
    let task = tokio::spawn({
        let app = Arc::clone(&app);
        async move {
            let acted = AssertUnwindSafe(act(Arc::clone(&app)))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    Err((
                        Error::RuleFailed {
                            rule: "an operator's action",
                            reason: format!("{action} {target} panicked"),
                        },
                        0,
                    ))
                });
            let notice = app.record(&who, action, &target, &acted).await;
            (acted, notice)
        }
    });
    let (acted, notice) = match task.await {
        Ok(done) => done,
        Err(e) => {
            let notice = format!("{action}: its task ended without an answer: {e}");
            return (StatusCode::INTERNAL_SERVER_ERROR, notice).into_response();
        }
    };
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

/// A destructive or bulk action asks first: a form without `confirm=yes` is answered
/// with a page saying what it would do (`what`), whose one button posts the same fields
/// again with `confirm=yes` (and a fresh token), beside a link back to `back`. Nothing
/// is done or recorded until then.
fn confirmed(seen: &Seen, form: &Fields, to: &str, what: &str, back: &str) -> Option<Response> {
    if form.get("confirm").is_some_and(|c| c == "yes") {
        return None;
    }
    let mut fields: Vec<(&str, &str)> = form
        .iter()
        .filter(|(k, _)| k.as_str() != "csrf" && k.as_str() != "confirm")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    fields.sort_unstable();
    fields.push(("confirm", "yes"));
    let body = maud::html! {
        p id="confirm" { (what) }
        p {
            (seen.frame.action(to, &fields, "Yes, do it"))
            " "
            a href=(back) { "No, go back" }
        }
    };
    let page = seen.frame.page("Are you sure?", None, body).into_string();
    Some(axum::response::Html(page).into_response())
}

/// A form field that does not read: 400, nothing done, nothing recorded.
fn bad_input(e: &Error) -> Response {
    (StatusCode::BAD_REQUEST, e.to_string()).into_response()
}

/// The event a form names by machine, entity id and version.
fn form_event(form: &Fields) -> Result<EventKey> {
    Ok(EventKey {
        machine: field(form, "machine")?.to_string(),
        entity_id: int(form, "entity_id")?,
        version: int(form, "version")?,
    })
}

pub(super) async fn requeue<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let key = match form_event(&form) {
        Ok(key) => key,
        Err(e) => return bad_input(&e),
    };
    let target = format!("{} {} v{}", key.machine, key.entity_id, key.version);
    done(
        &app,
        &seen,
        "outbox",
        "outbox.requeue",
        target,
        async move |app| app.requeue_one(&key).await,
    )
    .await
}

/// Discards one dead event (deleted, never published), once the operator confirms.
pub(super) async fn discard<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let key = match form_event(&form) {
        Ok(key) => key,
        Err(e) => return bad_input(&e),
    };
    let target = format!("{} {} v{}", key.machine, key.entity_id, key.version);
    let what = format!(
        "Discard dead event {target}: it is deleted and never published, and the entity's \
         later events are published without it?"
    );
    if let Some(ask) = confirmed(&seen, &form, "discard", &what, "outbox") {
        return ask;
    }
    done(
        &app,
        &seen,
        "outbox",
        "outbox.discard",
        target,
        async move |app| app.discard_one(&key).await,
    )
    .await
}

/// Requeues every dead event the filter matches, a batch at a time, recorded once.
pub(super) async fn requeue_matching<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    on_matching(app, seen, form, OnDead::Requeue).await
}

/// Discards every dead event the filter matches, a batch at a time, recorded once.
pub(super) async fn discard_matching<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    on_matching(app, seen, form, OnDead::Discard).await
}

/// A bulk action on the dead events a filter matches, once the operator confirms it
/// (asked with how many it would act on now).
async fn on_matching<S: AdminStore>(
    app: App<S>,
    seen: Seen,
    form: Fields,
    what: OnDead,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let filter = match Filter::from_fields(&form) {
        Ok(filter) => filter,
        Err(e) => return bad_input(&e),
    };
    let target = filter.describe();
    if form.get("confirm").is_none_or(|c| c != "yes") {
        let n = match app.count_events("DEAD", &filter).await {
            Ok(n) => n,
            Err(e) => return super::seen::failed(&e),
        };
        let (to, ask) = match what {
            OnDead::Requeue => (
                "requeue-matching",
                format!(
                    "Requeue {target}: {n} now (the requeue acts on those dead when it reads them)?"
                ),
            ),
            OnDead::Discard => (
                "discard-matching",
                format!(
                    "Discard {target}: {n} now (the discard acts on those dead when it reads \
                     them)? Each is deleted and never published, and its entity's later \
                     events are published without it."
                ),
            ),
        };
        if let Some(ask) = confirmed(&seen, &form, to, &ask, "outbox") {
            return ask;
        }
    }
    done(
        &app,
        &seen,
        "outbox",
        what.action(),
        target,
        async move |app| app.on_matching(&filter, what, &mut |_| {}).await,
    )
    .await
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
    if how_name == "compensate"
        && let Some(ask) = confirmed(
            &seen,
            &form,
            "resume",
            &format!("Compensate flow {kind} {key}: undo the steps it completed, newest first?"),
            "flows",
        )
    {
        return ask;
    }
    let (kind, key) = (kind.to_string(), key.to_string());
    done(
        &app,
        &seen,
        "flows",
        "flows.resume",
        target,
        async move |app| app.resume_flow(&kind, &key, how).await,
    )
    .await
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
    let what = format!(
        "Release record {scope} {key}: its holder is taken to be gone, and the next claim \
         of the key runs its request again?"
    );
    if let Some(ask) = confirmed(&seen, &form, "release", &what, "records") {
        return ask;
    }
    let (scope, key) = (scope.to_string(), key.to_string());
    done(
        &app,
        &seen,
        "records",
        "records.release",
        target,
        async move |app| app.release_record(&scope, &key).await,
    )
    .await
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
    if what == OnTimer::Cancel
        && let Some(ask) = confirmed(
            &seen,
            &form,
            "cancel-timer",
            &format!("Cancel timer {event} {ref_id} of {machine} {entity_id}: it will not fire?"),
            "timers",
        )
    {
        return ask;
    }
    let action = match what {
        OnTimer::Rearm => "timers.rearm",
        OnTimer::Cancel => "timers.cancel",
    };
    done(&app, &seen, "timers", action, target, async move |app| {
        let key = TimerKey {
            machine: &machine,
            entity_id,
            event: &event,
            ref_id: &ref_id,
        };
        app.on_timer(&key, what).await.1
    })
    .await
}
