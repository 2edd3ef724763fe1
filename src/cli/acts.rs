//! The command line's actions: each recorded in the audit trail, printed, and answered
//! with an exit code.

use super::out::Out;
use super::{Cli, Exit, args};
use crate::admin::AdminStore;
use crate::admin::ops::{Acted, Filter, OnDead, OnTimer, event_key};
use crate::error::Error;
use crate::timer::TimerKey;

impl<S: AdminStore> Cli<S> {
    /// Re-arms or cancels one timer.
    pub(super) async fn timer(
        &self,
        who: &str,
        what: OnTimer,
        t: &args::TimerArgs,
        out: &mut Out<'_>,
    ) -> Exit {
        let key = TimerKey {
            machine: &t.machine,
            entity_id: t.entity_id,
            event: &t.event,
            ref_id: &t.ref_id,
        };
        let target = format!("{} {} {} {}", t.machine, t.entity_id, t.event, t.ref_id);
        let (action, acted) = self.admin.on_timer(&key, what).await;
        self.acted(who, action, &target, acted, out).await
    }

    /// Requeues or discards dead events: one by its message id, or every match of a
    /// filter (a filter or `--all` named: an empty filter alone acts on nothing).
    pub(super) async fn on_dead(
        &self,
        who: &str,
        what: OnDead,
        filter: args::FilterArgs,
        id: Option<String>,
        all: bool,
        out: &mut Out<'_>,
    ) -> Exit {
        let (a, action) = (&self.admin, what.action());
        if let Some(id) = id {
            let key = match event_key(&id) {
                Ok(key) => key,
                Err(e) => return out.fail(&e),
            };
            let target = format!("{} {} v{}", key.machine, key.entity_id, key.version);
            let acted = match what {
                OnDead::Requeue => a.requeue_one(&key).await,
                OnDead::Discard => a.discard_one(&key).await,
            };
            return self.acted(who, action, &target, acted, out).await;
        }
        let filter = filter.filter();
        if filter == Filter::default() && !all {
            let verb = action.trim_start_matches("outbox.");
            return out.fail(&Error::InvalidInput(format!(
                "name the dead events to {verb}: --id, a filter, or --all"
            )));
        }
        let err = &mut *out.err;
        let past = match what {
            OnDead::Requeue => "requeued",
            OnDead::Discard => "discarded",
        };
        let acted = a
            .on_matching(&filter, what, &mut |n| {
                let _ = writeln!(err, "{past} {n} so far");
            })
            .await;
        self.acted(who, action, &filter.describe(), acted, out)
            .await
    }

    /// Records an action in the audit trail, prints what it did, and its exit code:
    /// nothing changed is [`Exit::NotFound`], a failure after some changed
    /// [`Exit::Partial`].
    pub(super) async fn acted(
        &self,
        who: &str,
        action: &str,
        target: &str,
        acted: Acted,
        out: &mut Out<'_>,
    ) -> Exit {
        let notice = self.admin.record(who, action, target, &acted).await;
        let (changed, code) = match &acted {
            Ok(0) => (0, Exit::NotFound),
            Ok(n) => (*n, Exit::Ok),
            Err((e, 0)) => (0, Exit::of(e)),
            Err((_, n)) => (*n, Exit::Partial),
        };
        let data = serde_json::json!({
            "action": action, "target": target, "changed": changed,
            "error": acted.as_ref().err().map(|(e, _)| e.to_string()),
        });
        if acted.is_err() {
            out.note(&format!("orderly: {notice}"));
            if out.json {
                out.show(&data, String::new);
            }
        } else {
            out.show(&data, || notice.clone());
        }
        code
    }
}
