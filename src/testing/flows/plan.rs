//! Fault plans: which fault happens at which recorded point, written and read back as
//! text so that a failing plan can be pasted into a regression test.

use std::fmt;
use std::str::FromStr;

use proptest::prelude::*;

use super::{Phase, Point, Record, When};

/// What happens at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// The runner stops there, as a process killed: nothing more is written by it, and
    /// the recovery job takes the flow over once its lease runs out. At a call, the
    /// downstream's effect happens and the runner stops before it hears the answer.
    Crash,
    /// The runner is held up past its lease there, then goes on: the recovery job takes
    /// the flow over meanwhile, and the first write of the held-up runner is refused.
    /// At a call, the downstream takes its effect and answers that late.
    Hang,
    /// A retryable error there: before a record, the write is not made; after one, its
    /// commit's acknowledgement is lost; at a call, the downstream is unavailable and
    /// takes no effect.
    Error,
    /// At a call only: the downstream takes its effect, and its answer is lost (the
    /// runner is told the call failed, retryably).
    LostAnswer,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 4] = [Fault::Crash, Fault::Hang, Fault::Error, Fault::LostAnswer];

    /// Whether the fault can happen at `point`: a lost answer only at a call.
    pub fn fits(self, point: &Point) -> bool {
        self != Fault::LostAnswer || point.record == Record::Call
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Crash => "crash",
            Fault::Hang => "hang",
            Fault::Error => "error",
            Fault::LostAnswer => "lost answer",
        })
    }
}

/// A point and which time it is reached in a run, from 1 (a retried step reaches its
/// points again).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reached {
    /// The point.
    pub point: Point,
    /// Which time, from 1.
    pub nth: u32,
}

impl fmt::Display for Reached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{}", self.point, self.nth)
    }
}

/// The faults of one run, each at a point reached for the nth time. Its text (its
/// `Display`) reads back with [`str::parse`]: `crash after start of Capture #1; lost
/// answer at call of Authorize (undo) #1`; the empty plan is `none`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Plan {
    /// The faults.
    pub faults: Vec<(Reached, Fault)>,
}

impl Plan {
    /// No fault.
    pub fn none() -> Self {
        Plan::default()
    }

    /// One fault.
    pub fn one(at: Reached, fault: Fault) -> Self {
        Plan {
            faults: vec![(at, fault)],
        }
    }

    /// The fault at `point` reached for the `nth` time, if any.
    pub(super) fn at(&self, point: &Point, nth: u32) -> Option<Fault> {
        self.faults
            .iter()
            .find(|(r, _)| r.nth == nth && &r.point == point)
            .map(|(_, f)| *f)
    }

    /// Whether a fault of the plan touches step `step`'s forward call or stands between
    /// its start and its result: an unsafe step there may park the flow for
    /// reconciliation.
    pub(super) fn touches_call_of(&self, step: &str, phase: Phase) -> bool {
        self.faults.iter().any(|(r, _)| {
            let p = &r.point;
            p.step.as_deref() == Some(step)
                && p.phase == phase
                && matches!(
                    (p.when, p.record),
                    (When::After, Record::Start)
                        | (_, Record::Call)
                        | (When::Before, Record::Result)
                        | (_, Record::Retry)
                        | (_, Record::Failed)
                )
        })
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.faults.is_empty() {
            return f.write_str("none");
        }
        for (i, (at, fault)) in self.faults.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{fault} {at}")?;
        }
        Ok(())
    }
}

/// A plan's text that does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a fault plan: {0}")]
pub struct BadPlan(String);

impl FromStr for Plan {
    type Err = BadPlan;

    fn from_str(text: &str) -> Result<Self, BadPlan> {
        let text = text.trim();
        if text == "none" || text.is_empty() {
            return Ok(Plan::none());
        }
        let faults = text
            .split(';')
            .map(|part| fault_at(part.trim()).ok_or_else(|| BadPlan(part.trim().to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Plan { faults })
    }
}

/// `crash after start of Capture (undo) #2`.
fn fault_at(text: &str) -> Option<(Reached, Fault)> {
    let (text, fault) = [
        ("lost answer ", Fault::LostAnswer),
        ("crash ", Fault::Crash),
        ("hang ", Fault::Hang),
        ("error ", Fault::Error),
    ]
    .into_iter()
    .find_map(|(word, fault)| text.strip_prefix(word).map(|rest| (rest, fault)))?;
    let (text, nth) = text.rsplit_once(" #")?;
    let nth: u32 = nth.trim().parse().ok().filter(|&n| n > 0)?;
    let (text, phase) = match text.strip_suffix(" (undo)") {
        Some(rest) => (rest, Phase::Undo),
        None => (text, Phase::Forward),
    };
    let (head, step) = match text.split_once(" of ") {
        Some((head, step)) if !step.trim().is_empty() => (head, Some(step.trim().to_string())),
        Some(_) => return None,
        None => (text, None),
    };
    let (when, record) = head.split_once(' ')?;
    let when = match when {
        "before" => When::Before,
        "after" => When::After,
        "at" => When::At,
        _ => return None,
    };
    let record = match record.trim() {
        "claim" => Record::Claim,
        "start" => Record::Start,
        "call" => Record::Call,
        "result" => Record::Result,
        "commit" => Record::Commit,
        "retry" => Record::Retry,
        "failed" => Record::Failed,
        "wait" => Record::Wait,
        "park" => Record::Park,
        "complete" => Record::Complete,
        "compensated" => Record::Compensated,
        _ => return None,
    };
    let point = Point {
        when,
        record,
        step,
        phase,
    };
    let fault = Some(fault).filter(|f| f.fits(&point))?;
    Some((Reached { point, nth }, fault))
}

/// One plan for each point reached (each time it was reached) and each fault that fits
/// there.
pub(super) fn each_fault_at(points: &[Reached]) -> Vec<Plan> {
    points
        .iter()
        .flat_map(|at| {
            Fault::ALL
                .into_iter()
                .filter(|f| f.fits(&at.point))
                .map(|f| Plan::one(at.clone(), f))
        })
        .collect()
}

/// Plans of 1 to `most` faults at the points given (those a run reaches: see
/// [`Kit::points`](super::Kit::points)), each at the point's first or second reach.
/// proptest shrinks a failing plan (then [`Kit::minimize`](super::Kit::minimize) takes out
/// the faults it does not need).
pub fn plans(points: Vec<Point>, most: usize) -> impl Strategy<Value = Plan> {
    let n = points.len().max(1);
    let one = (0..n, 0..Fault::ALL.len(), 1u32..=2).prop_filter_map(
        "a lost answer is only at a call",
        move |(i, f, nth)| {
            let point = points.get(i)?.clone();
            let fault = Fault::ALL[f];
            fault
                .fits(&point)
                .then_some((Reached { point, nth }, fault))
        },
    );
    proptest::collection::vec(one, 1..=most.max(1)).prop_map(|faults| Plan { faults })
}
