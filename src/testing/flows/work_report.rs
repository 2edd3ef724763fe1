//! What the kit for a request's work reports of one run, and the run with no fault the
//! others are judged against.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::check::Judged;
use super::doubles::Call;
use super::plan::{Plan, Reached};

/// One run of a request's work.
#[derive(Debug, Clone)]
pub struct WorkReport {
    /// The plan.
    pub plan: Plan,
    /// The faults that happened.
    pub fired: Vec<String>,
    /// The outcome the client was first answered (JSON: `{"Ok": …}` or `{"Err": …}`),
    /// if it was.
    pub outcome: Option<String>,
    /// Every attempt's answer, in the order they came.
    pub answers: Vec<String>,
    /// How many times the work began.
    pub works: usize,
    /// What the checks found wrong.
    pub problems: Vec<String>,
    /// The points reached, in order.
    pub trace: Vec<Reached>,
    /// Where in `trace` the repeat after the run began.
    pub repeat_from: usize,
    /// The calls the doubles took.
    pub calls: Vec<Call>,
    /// How long the run took.
    pub took: Duration,
}

impl WorkReport {
    /// Whether the checks found nothing wrong.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Judged for WorkReport {
    fn sound(&self) -> bool {
        self.ok()
    }

    fn ended(&self) -> String {
        self.outcome.clone().unwrap_or_else(|| "unanswered".into())
    }

    fn found(&self) -> &[String] {
        &self.problems
    }

    fn planned(&self) -> String {
        self.plan.to_string()
    }
}

impl fmt::Display for WorkReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plan:     {}", self.plan)?;
        if !self.fired.is_empty() {
            writeln!(f, "happened: {}", self.fired.join("; "))?;
        }
        writeln!(f, "outcome:  {}", self.ended())?;
        writeln!(f, "answers:  {}", self.answers.join(" | "))?;
        writeln!(f, "work began {} times", self.works)?;
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

/// What the run with no fault did, which the others are judged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Baseline {
    pub(super) succeeded: bool,
    /// Effects per unsafe double.
    pub(super) unsafe_effects: BTreeMap<String, usize>,
    /// Keys that took an effect, per keyed double.
    pub(super) keyed_keys: BTreeMap<String, usize>,
}

impl Baseline {
    pub(super) fn of(succeeded: bool, calls: &[Call]) -> Self {
        let mut unsafe_effects = BTreeMap::new();
        let mut keys: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for c in calls.iter().filter(|c| c.effect) {
            if c.keyed {
                keys.entry(c.double.clone())
                    .or_default()
                    .insert(c.key.clone());
            } else {
                *unsafe_effects.entry(c.double.clone()).or_insert(0) += 1;
            }
        }
        let keyed_keys = keys.into_iter().map(|(d, k)| (d, k.len())).collect();
        Baseline {
            succeeded,
            unsafe_effects,
            keyed_keys,
        }
    }
}
