//! What the kit checks after each run, and how it reports: the end the flow reached
//! against the table of ends each fault allows, and every effect the doubles and the
//! runners' commits show.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::calls::{Keys, Names, effects_left_in_place, step_of, success_without_effect};
use super::doubles::Call;
use super::plan::{Plan, Reached};
use super::{Phase, Record, When};
use crate::flow::{FlowRow, ParkReason, StepClass, StepSpec, Undo};

/// Where a run left the flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every step succeeded.
    Completed,
    /// A step failed and the steps before it were compensated.
    Compensated,
    /// Parked for an operator.
    Parked(ParkReason),
    /// Not finished within the kit's limit: its status (still running or compensating,
    /// or never started).
    Unfinished(String),
}

impl End {
    pub(super) fn of(row: Option<&FlowRow>) -> End {
        let Some(row) = row else {
            return End::Unfinished("never started".into());
        };
        if let Some(reason) = &row.park_reason {
            return ParkReason::from_str(reason).map_or_else(
                |_| End::Unfinished(format!("parked for an unknown reason {reason}")),
                End::Parked,
            );
        }
        match row.status.as_str() {
            "COMPLETED" => End::Completed,
            "COMPENSATED" => End::Compensated,
            other => End::Unfinished(format!(
                "{other}, its lease {}",
                if row.lease_left_ms > 0 {
                    format!("{} ms from running out", row.lease_left_ms)
                } else {
                    "run out".to_string()
                }
            )),
        }
    }

    pub(super) fn finished(&self) -> bool {
        !matches!(self, End::Unfinished(_))
    }
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Completed => f.write_str("completed"),
            End::Compensated => f.write_str("compensated"),
            End::Parked(reason) => write!(f, "parked ({reason:?})"),
            End::Unfinished(status) => write!(f, "unfinished: {status}"),
        }
    }
}

/// One run: its plan, where it ended, and what was wrong.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The plan.
    pub plan: Plan,
    /// The faults that happened (a planned point a run never reached has none).
    pub fired: Vec<String>,
    /// Where the flow ended.
    pub end: End,
    /// The ends the kit's table allows for this plan.
    pub allowed: Vec<End>,
    /// What the start was answered.
    pub answer: String,
    /// What the checks found wrong; empty when the run is sound.
    pub problems: Vec<String>,
    /// The points reached, in order.
    pub trace: Vec<Reached>,
    /// The calls the doubles took, in order.
    pub calls: Vec<Call>,
    /// How long the run took.
    pub took: Duration,
}

impl RunReport {
    /// Whether the checks found nothing wrong.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plan:     {}", self.plan)?;
        if !self.fired.is_empty() {
            writeln!(f, "happened: {}", self.fired.join("; "))?;
        }
        writeln!(f, "end:      {}", self.end)?;
        writeln!(f, "answer:   {}", self.answer)?;
        for p in &self.problems {
            writeln!(f, "  problem: {p}")?;
        }
        let trace: Vec<String> = self.trace.iter().map(ToString::to_string).collect();
        writeln!(f, "  points: {}", trace.join(", "))?;
        let calls: Vec<String> = self
            .calls
            .iter()
            .map(|c| {
                let effect = if c.effect { "effect" } else { "no effect" };
                format!("{}({}): {effect}", c.double, c.key)
            })
            .collect();
        writeln!(f, "  calls:  {}", calls.join(", "))?;
        write!(
            f,
            "  replay: kit.run(&\"{}\".parse().unwrap()).await",
            self.plan
        )
    }
}

/// A run's report, as [`Report`](super::Report) lists them.
pub trait Judged: fmt::Display {
    /// Whether the checks found nothing wrong.
    fn sound(&self) -> bool;
    /// Where the run ended, in words.
    fn ended(&self) -> String;
    /// What the checks found wrong.
    fn found(&self) -> &[String] {
        &[]
    }
    /// The run's plan, as text that reads back.
    fn planned(&self) -> String {
        String::new()
    }
}

impl Judged for RunReport {
    fn sound(&self) -> bool {
        self.ok()
    }

    fn ended(&self) -> String {
        self.end.to_string()
    }

    fn found(&self) -> &[String] {
        &self.problems
    }

    fn planned(&self) -> String {
        self.plan.to_string()
    }
}

/// What one run left, for the checks.
pub(super) struct Seen<'a> {
    pub specs: &'static [StepSpec],
    pub pivot: Option<usize>,
    pub prefix: &'a str,
    pub plan: &'a Plan,
    pub baseline: Option<&'a End>,
    pub end: &'a End,
    /// The start's answer, when it gave a settled outcome.
    pub answered: Option<End>,
    pub trace: &'a [Reached],
    pub calls: &'a [Call],
    /// The steps whose effect may stay on a compensated flow.
    pub may_stay: &'a [&'static str],
}

/// The ends allowed for `plan`: the baseline's; and parked for reconciliation when a
/// fault touches an unsafe step's call (nobody can know whether it took effect).
pub(super) fn allowed(specs: &[StepSpec], plan: &Plan, baseline: Option<&End>) -> Vec<End> {
    let mut ends: Vec<End> = baseline.into_iter().cloned().collect();
    let unsafe_touched = specs.iter().any(|s| {
        s.class == StepClass::Unsafe
            && (plan.touches_call_of(s.name, Phase::Forward)
                || plan.touches_call_of(s.name, Phase::Undo))
    });
    let reconcile = End::Parked(ParkReason::NeedsReconciliation);
    if unsafe_touched && !ends.contains(&reconcile) {
        ends.push(reconcile);
    }
    ends
}

/// The problems of a run.
pub(super) fn problems(seen: &Seen<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let allowed = allowed(seen.specs, seen.plan, seen.baseline);
    if !seen.end.finished() {
        out.push(format!(
            "the flow did not finish ({}): claimed, or waiting, past the kit's limit",
            seen.end
        ));
    } else if !allowed.is_empty() && !allowed.contains(seen.end) {
        let allowed: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        out.push(format!(
            "the flow ended {}, where this plan allows {}",
            seen.end,
            allowed.join(" or ")
        ));
    }
    if let Some(answered) = &seen.answered
        && answered != seen.end
    {
        out.push(format!(
            "the start was answered {answered}, but the flow ended {}",
            seen.end
        ));
    }
    let names: Names<'_> = seen
        .specs
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name, (i, s)))
        .collect();
    // Every effect, by step, phase and what took it (a double, or the step's commit),
    // at its place among the points reached.
    let mut effects: BTreeMap<(usize, Phase, String), Vec<usize>> = BTreeMap::new();
    let mut keys = Keys::default();
    // The calls of each step's forward phase.
    let mut called: BTreeMap<usize, Vec<&Call>> = BTreeMap::new();
    for call in seen.calls {
        let Some((index, spec, phase)) = step_of(seen.prefix, &names, call, &mut out) else {
            continue;
        };
        keys.note(call, index, spec, phase, &mut out);
        if phase == Phase::Forward {
            called.entry(index).or_default().push(call);
        }
        if spec.class == StepClass::Keyed && !call.keyed {
            let of = if phase == Phase::Undo {
                "its compensation calls"
            } else {
                "calls"
            };
            out.push(format!(
                "step {} is declared keyed, but {of} {}, a downstream that takes no key: \
                 declare it unsafe (a keyed step, and its compensation, is made again after \
                 a crash)",
                spec.name, call.double
            ));
        }
        if call.effect {
            let what = format!("a call to {}", call.double);
            effects
                .entry((index, phase, what))
                .or_default()
                .push(call.at);
        }
    }
    for (place, reached) in seen.trace.iter().enumerate() {
        let p = &reached.point;
        if (p.when, p.record) != (When::After, Record::Commit) {
            continue;
        }
        let Some(&(index, _)) = p.step.as_deref().and_then(|s| names.get(s)) else {
            continue;
        };
        let what = "its commit".to_string();
        effects
            .entry((index, p.phase, what))
            .or_default()
            .push(place);
    }
    for ((index, phase, what), list) in &effects {
        if list.len() > 1 {
            let name = seen.specs[*index].name;
            let of = if *phase == Phase::Undo {
                format!("the compensation of step {name}")
            } else {
                format!("step {name}")
            };
            out.push(format!(
                "{of} took its effect {} times ({what}): at most once",
                list.len()
            ));
        }
    }
    out.extend(keys.problems(seen.specs));
    let applied = |i: usize, phase: Phase| effects.keys().any(|(j, p, _)| (*j, *p) == (i, phase));
    match seen.end {
        End::Completed => {
            out.extend(success_without_effect(seen.specs, &called));
            for (i, spec) in seen.specs.iter().enumerate() {
                if spec.class == StepClass::Local && !applied(i, Phase::Forward) {
                    out.push(format!(
                        "the flow completed, but step {}'s commit never happened",
                        spec.name
                    ));
                }
                if applied(i, Phase::Undo) {
                    out.push(format!(
                        "the flow completed, but step {} was compensated",
                        spec.name
                    ));
                }
            }
        }
        End::Compensated => {
            out.extend(effects_left_in_place(seen.specs, &called, seen.may_stay));
            for (i, spec) in seen.specs.iter().enumerate() {
                let compensable =
                    spec.undo == Undo::Compensated && seen.pivot.is_none_or(|p| i < p);
                let (done, undone) = (applied(i, Phase::Forward), applied(i, Phase::Undo));
                if done && compensable && !undone {
                    out.push(format!(
                        "the flow compensated, but step {} took its effect and was not \
                         compensated (a failure that may have taken effect must be \
                         retried, not failed)",
                        spec.name
                    ));
                }
                if undone && !done {
                    out.push(format!(
                        "the flow compensated step {}, which took no effect",
                        spec.name
                    ));
                }
            }
            // Each compensation at its first effect, in the order they came.
            let mut first: BTreeMap<usize, usize> = BTreeMap::new();
            for ((i, phase, _), list) in &effects {
                if let (Phase::Undo, Some(&at)) = (phase, list.iter().min()) {
                    let slot = first.entry(*i).or_insert(at);
                    *slot = (*slot).min(at);
                }
            }
            let mut order: Vec<(usize, usize)> = first.into_iter().map(|(i, at)| (at, i)).collect();
            order.sort_unstable();
            if order.windows(2).any(|w| w[0].1 < w[1].1) {
                let names: Vec<&str> = order.iter().map(|(_, i)| seen.specs[*i].name).collect();
                out.push(format!(
                    "the compensations ran in the order {}: the reverse of the steps' order \
                     is required",
                    names.join(", ")
                ));
            }
        }
        End::Parked(_) | End::Unfinished(_) => {}
    }
    out
}
