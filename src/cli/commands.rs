//! Each command of the command line: what it reads or does, and how it shows it.

use super::Cli;
use super::args::{Command, Exit, FlowsCmd, OutboxCmd, RecordsCmd, TimersCmd};
use super::out::Out;
use super::table::Table;
use crate::admin::AdminStore;
use crate::admin::ops::{Event, OnDead, OnTimer, event_key, id_of, resume_how, time_text};
use crate::admin::panel::LIST_MAX;
use crate::error::Error;
use crate::flow::Listing;
use crate::timer::Timers;

impl<S: AdminStore> Cli<S> {
    /// Runs one parsed command as `who`, printing to `out`.
    pub(super) async fn command(&self, command: Command, who: &str, out: &mut Out<'_>) -> Exit {
        let a = &self.admin;
        match command {
            Command::Overview => match a.overview().await {
                Ok(o) => out.show(&o, || {
                    let mut t = Table::new(["", "count"]);
                    t.row(["events pending", &o.outbox.pending.to_string()]);
                    t.row(["events dead", &o.outbox.dead.to_string()]);
                    t.row(["events corrupt", &o.outbox.corrupt.to_string()]);
                    t.row([
                        "oldest pending (s)",
                        &format!("{:.1}", o.outbox.oldest_pending_ms as f64 / 1000.0),
                    ]);
                    t.row(["flows parked", &o.flows.parked.to_string()]);
                    t.row(["flows running", &o.flows.running.to_string()]);
                    t.row(["records stuck", &o.records.stuck.to_string()]);
                    t.row(["timers pending", &o.timers.pending.to_string()]);
                    t.row(["timers due", &o.timers.due.to_string()]);
                    t.row(["timers dead", &o.timers.dead.to_string()]);
                    t.render()
                }),
                Err(e) => out.fail(&e),
            },
            Command::History { machine, id } => match a.timeline(&machine, id, None).await {
                Ok(t) if t.state.is_none() && t.history.is_empty() => {
                    out.show(&t, || format!("{machine} {id}: no such entity"));
                    Exit::NotFound
                }
                Ok(t) => out.show(&t, || {
                    let mut s = format!(
                        "{machine} {id}: {} at version {}\n\n",
                        t.state.as_deref().unwrap_or("(absent)"),
                        t.version.unwrap_or(0)
                    );
                    let mut h = Table::new([
                        "version",
                        "from",
                        "to",
                        "event",
                        "reference",
                        "who",
                        "why",
                        "when",
                    ]);
                    for l in &t.history {
                        h.row([
                            &l.seq.to_string(),
                            &l.from,
                            &l.to,
                            &l.event,
                            &l.ref_id,
                            l.actor.as_deref().unwrap_or(""),
                            l.reason.as_deref().unwrap_or(""),
                            &l.at,
                        ]);
                    }
                    s.push_str(&h.render());
                    if let Some(older) = t.older {
                        s.push_str(&format!(
                            "(the newest {} rows; older ones, below version {older}, on the \
                             page's timeline)\n",
                            t.history.len()
                        ));
                    }
                    if !t.events.is_empty() {
                        let mut e =
                            Table::new(["message id", "event", "status", "attempts", "last error"]);
                        for ev in &t.events {
                            e.row([
                                &ev.id,
                                &ev.event,
                                &ev.status,
                                &ev.attempts.to_string(),
                                ev.last_error.as_deref().unwrap_or(""),
                            ]);
                        }
                        s.push_str("\noutbox events\n");
                        s.push_str(&e.render());
                    }
                    if !t.timers.is_empty() {
                        let mut e = Table::new([
                            "event",
                            "reference",
                            "due (ms)",
                            "status",
                            "outcome",
                            "note",
                        ]);
                        for ti in &t.timers {
                            e.row([
                                &ti.event,
                                &ti.ref_id,
                                &ti.due_at.map(|d| d.to_string()).unwrap_or_default(),
                                &ti.status,
                                ti.outcome.as_deref().unwrap_or(""),
                                ti.last_error.as_deref().unwrap_or(""),
                            ]);
                        }
                        s.push_str("\ntimers\n");
                        s.push_str(&e.render());
                    }
                    s
                }),
                Err(e) => out.fail(&e),
            },
            Command::Search { term, prefix } => match a.search(&term, prefix).await {
                Ok(found) => {
                    let n = found.count();
                    out.show(&found, || {
                        let mut t = Table::new(["kind", "where", "what", "status"]);
                        for (m, id) in &found.entities {
                            t.row(["entity", m, &id.to_string(), ""]);
                        }
                        for h in &found.history {
                            t.row([
                                "transition",
                                &h.machine,
                                &format!("{} v{} {}", h.row.order_id, h.row.seq, h.row.event),
                                &h.row.to,
                            ]);
                        }
                        for e in &found.events {
                            t.row(["event", &e.machine, &e.id, &e.status]);
                        }
                        for r in &found.records {
                            t.row(["record", &r.scope, &r.idem_key, &r.status]);
                        }
                        for f in &found.flows {
                            t.row(["flow", &f.kind, &f.flow_key, &f.status]);
                        }
                        t.render()
                    });
                    if n == 0 { Exit::NotFound } else { Exit::Ok }
                }
                Err(e) => out.fail(&e),
            },
            Command::Outbox(OutboxCmd::Dead { filter, after }) => {
                let filter = filter.filter();
                let after = match after.as_deref().map(event_key).transpose() {
                    Ok(after) => after,
                    Err(e) => return out.fail(&e),
                };
                let read = match a
                    .events_page("DEAD", &filter, after.as_ref(), LIST_MAX)
                    .await
                {
                    Ok((rows, next)) => match next {
                        None => Ok((rows, None)),
                        Some(next) => a
                            .count_events("DEAD", &filter)
                            .await
                            .map(|n| (rows, Some((next, n)))),
                    },
                    Err(e) => Err(e),
                };
                match read {
                    Ok((rows, more)) => {
                        let rows: Vec<_> = rows.into_iter().map(Event::from).collect();
                        if let Some((next, n)) = &more {
                            out.note(&format!(
                                "{} of {n} matches shown; the next with --after {}",
                                rows.len(),
                                id_of(next)
                            ));
                        }
                        out.show(&rows, || {
                            let mut t = Table::new([
                                "message id",
                                "event",
                                "reference",
                                "attempts",
                                "age (s)",
                                "last error",
                            ]);
                            for e in &rows {
                                t.row([
                                    &e.id,
                                    &e.event,
                                    &e.ref_id,
                                    &e.attempts.to_string(),
                                    &e.age_ms
                                        .map_or_else(String::new, |ms| (ms / 1000).to_string()),
                                    e.last_error.as_deref().unwrap_or(""),
                                ]);
                            }
                            t.render()
                        })
                    }
                    Err(e) => out.fail(&e),
                }
            }
            Command::Outbox(OutboxCmd::Requeue { filter, id, all }) => {
                self.on_dead(who, OnDead::Requeue, filter, id, all, out)
                    .await
            }
            Command::Outbox(OutboxCmd::Discard { filter, id, all }) => {
                self.on_dead(who, OnDead::Discard, filter, id, all, out)
                    .await
            }
            Command::Flows(FlowsCmd::Parked { kind }) => {
                let listed = match a.flows_here() {
                    Ok(flows) => flows.list(Listing::Parked, None, LIST_MAX).await,
                    Err(e) => Err(e),
                };
                match listed {
                    Ok(rows) => {
                        let rows: Vec<_> = rows
                            .into_iter()
                            .filter(|l| kind.as_deref().is_none_or(|k| k == l.flow.kind))
                            .map(|l| {
                                serde_json::json!({
                                    "kind": l.flow.kind, "flow_key": l.flow.flow_key,
                                    "version": l.flow.version, "status": l.flow.status,
                                    "park_reason": l.flow.park_reason, "step_at": l.flow.step_at,
                                    "last_error": l.flow.last_error, "known": l.known,
                                })
                            })
                            .collect();
                        out.show(&rows, || {
                            let mut t = Table::new([
                                "kind",
                                "key",
                                "status",
                                "reason",
                                "step",
                                "last error",
                            ]);
                            for r in &rows {
                                let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
                                t.row([
                                    &s("kind"),
                                    &s("flow_key"),
                                    &s("status"),
                                    &s("park_reason"),
                                    &r["step_at"].to_string(),
                                    &s("last_error"),
                                ]);
                            }
                            t.render()
                        })
                    }
                    Err(e) => out.fail(&e),
                }
            }
            Command::Flows(FlowsCmd::Resume {
                kind,
                key,
                how,
                output,
            }) => {
                let resume = match resume_how(&how, output.as_deref()) {
                    Ok(r) => r,
                    Err(e) => return out.fail(&e),
                };
                let target = format!("flow {kind} {key}: {how}");
                let acted = a.resume_flow(&kind, &key, resume).await;
                self.acted(who, "flows.resume", &target, acted, out).await
            }
            Command::Records(RecordsCmd::Stuck { scope }) => {
                match a.stuck_records(scope.as_deref()).await {
                    Ok(rows) => out.show(&rows, || {
                        let mut t =
                            Table::new(["scope", "key", "attempt", "stuck (s)", "claimed (s ago)"]);
                        for r in &rows {
                            t.row([
                                &r.scope,
                                &r.idem_key,
                                &r.attempt.to_string(),
                                &(r.stuck_ms / 1000).to_string(),
                                &(r.age_ms / 1000).to_string(),
                            ]);
                        }
                        t.render()
                    }),
                    Err(e) => out.fail(&e),
                }
            }
            Command::Records(RecordsCmd::Release { scope, key }) => {
                let target = format!("record {scope} {key}");
                let acted = a.release_record(&scope, &key).await;
                self.acted(who, "records.release", &target, acted, out)
                    .await
            }
            Command::Timers(TimersCmd::Dead) => {
                match Timers::new(a.store().clone())
                    .dead(i64::from(LIST_MAX))
                    .await
                {
                    Ok(rows) => {
                        let rows: Vec<_> = rows.into_iter().filter_map(Result::ok).collect();
                        let data: Vec<_> = rows
                            .iter()
                            .map(|t| serde_json::json!({
                                "machine": t.machine, "entity_id": t.entity_id, "event": t.event,
                                "ref_id": t.ref_id, "due_at": t.due_at, "attempts": t.attempts,
                                "last_error": t.last_error,
                            }))
                            .collect();
                        out.show(&data, || {
                            let mut tb = Table::new([
                                "machine",
                                "entity",
                                "event",
                                "reference",
                                "attempts",
                                "last error",
                            ]);
                            for t in &rows {
                                tb.row([
                                    &t.machine,
                                    &t.entity_id.to_string(),
                                    &t.event,
                                    &t.ref_id,
                                    &t.attempts.to_string(),
                                    t.last_error.as_deref().unwrap_or(""),
                                ]);
                            }
                            tb.render()
                        })
                    }
                    Err(e) => out.fail(&e),
                }
            }
            Command::Timers(TimersCmd::Rearm(t)) => self.timer(who, OnTimer::Rearm, &t, out).await,
            Command::Timers(TimersCmd::Cancel(t)) => {
                self.timer(who, OnTimer::Cancel, &t, out).await
            }
            Command::Graph { machine } => {
                let Some(text) = a.graph(&machine) else {
                    return out.fail(&Error::InvalidInput(format!(
                        "no machine {machine:?} is registered with this command line"
                    )));
                };
                let states = match a.states(&machine).await {
                    Ok(states) => states.unwrap_or_default(),
                    Err(e) => return out.fail(&e),
                };
                let data =
                    serde_json::json!({ "machine": machine, "mermaid": text, "states": states });
                out.show(&data, || {
                    let mut t = Table::new(["state", "entities"]);
                    for (state, n) in &states {
                        t.row([state, &n.to_string()]);
                    }
                    format!("{text}\n{}", t.render())
                })
            }
            Command::Audit { limit } => match a.audit(i64::from(limit)).await {
                Ok(rows) => out.show(&rows, || {
                    let mut t = Table::new(["when", "who", "action", "on", "changed"]);
                    for r in &rows {
                        t.row([
                            &time_text(r.at_ms),
                            &r.who,
                            &r.action,
                            &r.target,
                            &r.affected.to_string(),
                        ]);
                    }
                    t.render()
                }),
                Err(e) => out.fail(&e),
            },
        }
    }
}
