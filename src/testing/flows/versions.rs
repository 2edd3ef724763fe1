//! Definition versions: the unfinished flows of a store, saved with the shape of the
//! definition they run under, and checked against the definitions a new release
//! registers: each saved flow's kind and version still registered, and every step it
//! recorded still there, by name at its place, of its class, with its compensation.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::flow::{FlowStore, Flows, Listing, StepClass, StepSpec, Undo};

/// A declared step, as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedSpec {
    /// Its name.
    pub name: String,
    /// `local`, `keyed`, `unsafe` or `wait`.
    pub class: String,
    /// Whether it has a compensation.
    pub compensated: bool,
}

/// A recorded step row, as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedStep {
    /// Its place in the flow.
    pub index: i32,
    /// `F` (forward) or `C` (compensation).
    pub phase: String,
    /// The step's name.
    pub name: String,
    /// Its status.
    pub status: String,
}

/// An unfinished flow as recorded, with the definition it ran under (when the saving
/// release had it registered). Serializes as JSON, to be kept beside a test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// Its kind.
    pub kind: String,
    /// Its key.
    pub key: String,
    /// The definition's version it runs under.
    pub version: i32,
    /// `RUNNING` or `COMPENSATING`.
    pub status: String,
    /// Why it is parked, if it is.
    pub parked: Option<String>,
    /// The step it stands at.
    pub step_at: i32,
    /// Its step rows.
    pub steps: Vec<SavedStep>,
    /// The steps its definition declared.
    pub declared: Option<Vec<SavedSpec>>,
    /// Its definition's pivot, if it had one.
    pub pivot: Option<String>,
}

fn class_name(class: StepClass) -> &'static str {
    match class {
        StepClass::Local => "local",
        StepClass::Keyed => "keyed",
        StepClass::Unsafe => "unsafe",
        StepClass::Wait => "wait",
    }
}

fn saved_specs(specs: &[StepSpec]) -> Vec<SavedSpec> {
    specs
        .iter()
        .map(|s| SavedSpec {
            name: s.name.to_string(),
            class: class_name(s.class).to_string(),
            compensated: s.undo == Undo::Compensated,
        })
        .collect()
}

/// The unfinished flows (running, waiting, stuck or parked) on `flows`' store, saved.
pub async fn save<S: FlowStore>(flows: &Flows<S>) -> Result<Vec<Saved>> {
    let mut saved = Vec::new();
    // One listing of every flow: one that moves between running and stuck while the
    // pages are read is read once.
    let mut after: Option<(String, String)> = None;
    loop {
        let from = after.as_ref().map(|(k, f)| (k.as_str(), f.as_str()));
        let page = flows.list(Listing::All, from, 500).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.flow.kind.clone(), last.flow.flow_key.clone()));
        for listed in page {
            let row = listed.flow;
            let unfinished = row.park_reason.is_some()
                || matches!(row.status.as_str(), "RUNNING" | "COMPENSATING");
            if !unfinished {
                continue;
            }
            let Some(view) = flows.get(&row.kind, &row.flow_key).await? else {
                continue;
            };
            let shape = flows.declared(&row.kind, row.version);
            let declared = shape.map(|(specs, _)| saved_specs(specs));
            let pivot = shape.and_then(|(specs, p)| p.and_then(|p| specs.get(p)));
            saved.push(Saved {
                kind: row.kind,
                key: row.flow_key,
                version: row.version,
                status: row.status,
                parked: row.park_reason,
                step_at: row.step_at,
                steps: view
                    .steps
                    .into_iter()
                    .map(|s| SavedStep {
                        index: s.step_index,
                        phase: s.phase,
                        name: s.name,
                        status: s.status,
                    })
                    .collect(),
                declared,
                pivot: pivot.map(|s| s.name.to_string()),
            });
        }
    }
    Ok(saved)
}

/// What stands in the way of `flows` (the definitions a new release registers)
/// finishing the saved flows; empty when nothing does.
pub fn unfinishable<S: FlowStore>(flows: &Flows<S>, saved: &[Saved]) -> Vec<String> {
    let mut out = Vec::new();
    for flow in saved {
        let name = format!("flow {} {} (version {})", flow.kind, flow.key, flow.version);
        let Some((specs, pivot)) = flows.declared(&flow.kind, flow.version) else {
            out.push(format!(
                "{name} is not registered in this release: runners leave it alone; keep \
                 version {} registered until its flows finish",
                flow.version
            ));
            continue;
        };
        let at = usize::try_from(flow.step_at).unwrap_or(usize::MAX);
        if at > specs.len() {
            out.push(format!(
                "{name} stands at step #{}, past the {} steps version {} now has",
                flow.step_at,
                specs.len(),
                flow.version
            ));
        }
        for step in &flow.steps {
            let spec = usize::try_from(step.index).ok().and_then(|i| specs.get(i));
            match spec {
                Some(spec) if spec.name == step.name => {}
                Some(spec) => out.push(format!(
                    "{name} recorded step {} at #{}, which version {} now names {}: a \
                     changed definition needs a new version",
                    step.name, step.index, flow.version, spec.name
                )),
                None => out.push(format!(
                    "{name} recorded step {} at #{}, which version {} no longer has",
                    step.name, step.index, flow.version
                )),
            }
        }
        let Some(declared) = &flow.declared else {
            continue;
        };
        let pivot_now = pivot.and_then(|p| specs.get(p)).map(|s| s.name);
        if flow.pivot.as_deref() != pivot_now {
            out.push(format!(
                "{name} ran under a version {} whose pivot was {}; it is now {}: a changed \
                 definition needs a new version",
                flow.version,
                flow.pivot.as_deref().unwrap_or("none"),
                pivot_now.unwrap_or("none")
            ));
        }
        for (i, was) in declared.iter().enumerate() {
            let Some(now) = specs.get(i) else {
                out.push(format!(
                    "{name} ran under a version {} with step {} at #{i}, which it no longer has",
                    flow.version, was.name
                ));
                continue;
            };
            let now_class = class_name(now.class);
            if now.name != was.name || now_class != was.class {
                out.push(format!(
                    "{name} ran under a version {} whose step #{i} was {} ({}); it is now {} \
                     ({now_class}): a changed definition needs a new version",
                    flow.version, was.name, was.class, now.name
                ));
            } else if was.compensated && now.undo != Undo::Compensated {
                out.push(format!(
                    "{name} ran under a version {} whose step {} had a compensation; it has \
                     none now, so a flow that compensates would leave its effect",
                    flow.version, was.name
                ));
            }
        }
    }
    out
}
