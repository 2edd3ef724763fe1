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
use super::app::{App, Seen, matches, refused};
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

/// Records the action, then sends the viewer back to `page` with `notice`.
async fn done<S: AdminStore>(
    app: &App<S>,
    seen: &Seen,
    page: &str,
    action: &str,
    target: &str,
    affected: Result<i64>,
) -> Response {
    let notice = match &affected {
        Ok(n) => {
            let entry = AuditEntry {
                who: &seen.frame.who,
                action,
                target,
                affected: *n,
            };
            let store = &app.store;
            let recorded: Result<()> =
                async { leased!(store, |c| store.record_audit(c, &entry)) }.await;
            match recorded {
                Ok(()) => format!("{action} {target}: {n} changed"),
                // The action stands; only its record failed: say so.
                Err(e) => {
                    format!("{action} {target}: {n} changed, but the audit record failed: {e}")
                }
            }
        }
        Err(e) => format!("{action} {target} failed: {e}"),
    };
    let status = match &affected {
        Err(Error::InvalidInput(_)) => StatusCode::BAD_REQUEST,
        _ => StatusCode::SEE_OTHER,
    };
    if status != StatusCode::SEE_OTHER {
        return (status, notice).into_response();
    }
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("done", &notice)
        .finish();
    let location = format!("{page}?{query}");
    (status, [(header::LOCATION, location)]).into_response()
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
    let target = key.as_ref().map_or_else(
        |_| "an event".to_string(),
        |k| format!("{} {} v{}", k.machine, k.entity_id, k.version),
    );
    let affected = match key {
        Ok(key) => Outbox::new(app.store.clone())
            .requeue(&key)
            .await
            .map(i64::from),
        Err(e) => Err(e),
    };
    done(&app, &seen, "outbox", "outbox.requeue", &target, affected).await
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
    let affected = async {
        let mut requeued = 0i64;
        // Each round reads the dead events up to a batch past the ones it leaves (those
        // the filter does not match stay dead) and requeues the matching ones, which
        // leave the dead state. It ends once a round has read every dead event, or
        // requeued none.
        let mut skipped = 0u32;
        loop {
            let limit = skipped.saturating_add(BATCH);
            let rows = outbox.dead(limit).await?;
            let all_read = rows.len() < limit as usize;
            let matching: Vec<_> = rows
                .iter()
                .filter(|r| matches(&form, &r.machine, &r.event, r.last_error.as_deref()))
                .collect();
            skipped = u32::try_from(rows.len() - matching.len()).unwrap_or(u32::MAX);
            let mut moved = 0;
            for r in matching {
                let key = EventKey {
                    machine: r.machine.clone(),
                    entity_id: r.entity_id,
                    version: r.version,
                };
                if outbox.requeue(&key).await? {
                    moved += 1;
                }
            }
            requeued += moved;
            if all_read || moved == 0 {
                return Ok::<_, Error>(requeued);
            }
        }
    };
    let affected = affected.await;
    done(&app, &seen, "outbox", "outbox.requeue", &target, affected).await
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
    let affected = async {
        let how = match how {
            "retry" => Resume::Retry,
            "compensate" => Resume::Compensate,
            other => {
                return Err(Error::InvalidInput(format!(
                    "a resume is retry or compensate, not {other:?}"
                )));
            }
        };
        let flows = app
            .flows
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("no flows are registered with this page".into()))?;
        flows.resume(kind, key, how).await.map(|_| 1)
    };
    let affected = affected.await;
    done(&app, &seen, "flows", "flows.resume", &target, affected).await
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
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let key = timer_key(&form);
    let target = key.as_ref().map_or_else(
        |_| "a timer".to_string(),
        |(m, id, e, r)| format!("{m} {id} {e} {r}"),
    );
    let affected = match key {
        Ok((machine, entity_id, event, ref_id)) => {
            let key = TimerKey {
                machine: &machine,
                entity_id,
                event: &event,
                ref_id: &ref_id,
            };
            Timers::new(app.store.clone())
                .rearm(&key)
                .await
                .map(i64::from)
        }
        Err(e) => Err(e),
    };
    done(&app, &seen, "timers", "timers.rearm", &target, affected).await
}

pub(super) async fn cancel_timer<S: AdminStore>(
    State(app): State<App<S>>,
    seen: Seen,
    Form(form): Form<Fields>,
) -> Response {
    if let Some(no) = allowed(&app, &seen, &form) {
        return no;
    }
    let key = timer_key(&form);
    let target = key.as_ref().map_or_else(
        |_| "a timer".to_string(),
        |(m, id, e, r)| format!("{m} {id} {e} {r}"),
    );
    let store = &app.store;
    let affected = match key {
        Ok((machine, entity_id, event, ref_id)) => {
            let key = TimerKey {
                machine: &machine,
                entity_id,
                event: &event,
                ref_id: &ref_id,
            };
            let cancelled: Result<bool> =
                async { leased!(store, |c| store.cancel_timer(c, &key)) }.await;
            cancelled.map(i64::from)
        }
        Err(e) => Err(e),
    };
    done(&app, &seen, "timers", "timers.cancel", &target, affected).await
}
