//! The checks of a run's calls to the doubles: which step made each, whether its keys
//! held from attempt to attempt, and whether the flow's end fits the effects taken.

use std::collections::BTreeMap;

use super::Phase;
use super::doubles::{Call, split_key};
use crate::flow::{StepClass, StepSpec, Undo};

/// The steps of a flow by name: their place and declaration.
pub(super) type Names<'s> = BTreeMap<&'s str, (usize, &'s StepSpec)>;

/// "step Charge" or "the compensation of step Charge".
pub(super) fn step_words(name: &str, phase: Phase) -> String {
    match phase {
        Phase::Forward => format!("step {name}"),
        Phase::Undo => format!("the compensation of step {name}"),
    }
}

/// The step (and phase) a call belongs to: the step whose code made it; for a call made
/// outside any step's code (on a task of its own), the step its key names, if it is a
/// step's stable key or one made from it (else a problem is noted).
pub(super) fn step_of<'s>(
    prefix: &str,
    names: &Names<'s>,
    call: &Call,
    out: &mut Vec<String>,
) -> Option<(usize, &'s StepSpec, Phase)> {
    if let Some(step) = &call.step {
        return names
            .get(step.as_str())
            .map(|&(i, spec)| (i, spec, call.phase));
    }
    if let Some((step, phase)) = split_key(prefix, &call.key)
        && let Some(&(i, spec)) = names.get(step)
    {
        return Some((i, spec, phase));
    }
    // A key made from a step's stable key is counted as that step's.
    let made_from = call.key.strip_prefix(prefix).and_then(|rest| {
        let (name, &(i, spec)) = names
            .iter()
            .filter(|(name, _)| rest.starts_with(&format!("{name}:")))
            .max_by_key(|(name, _)| name.len())?;
        let phase = if rest[name.len()..].starts_with(":undo") {
            Phase::Undo
        } else {
            Phase::Forward
        };
        Some((i, spec, phase))
    });
    if made_from.is_none() {
        let kind = if call.keyed { "keyed" } else { "unsafe" };
        out.push(format!(
            "the {kind} double {} was called outside any step's code with key {:?}, which \
             names no step ({prefix}<step> or {prefix}<step>:undo, as Ctx::key gives): the \
             kit cannot tell which step took its effect",
            call.double, call.key
        ));
    }
    made_from
}

/// One attempt at a step (its entry into the step's code) and the keys it gave one
/// double, in order.
type Attempt<'c> = (u64, Vec<&'c str>);

/// The keys each step gave the keyed doubles: attempt by attempt, and who used each.
#[derive(Default)]
pub(super) struct Keys<'c> {
    /// By step, phase and double: each attempt's keys, in the order it called.
    attempts: BTreeMap<(usize, Phase, &'c str), Vec<Attempt<'c>>>,
    /// By double and key: the steps (and phases) that called it with that key.
    users: BTreeMap<(&'c str, &'c str), Vec<(usize, Phase)>>,
}

impl<'c> Keys<'c> {
    /// Notes `call`, made by step `index` in `phase`.
    pub(super) fn note(
        &mut self,
        call: &'c Call,
        index: usize,
        spec: &StepSpec,
        phase: Phase,
        out: &mut Vec<String>,
    ) {
        if !call.keyed {
            return;
        }
        if call.key.trim().is_empty() {
            out.push(format!(
                "{} called the keyed double {} with an empty key: a key names the effect, \
                 the same on every attempt",
                step_words(spec.name, phase),
                call.double
            ));
        }
        if let Some(attempt) = call.attempt {
            let list = self
                .attempts
                .entry((index, phase, call.double.as_str()))
                .or_default();
            match list.iter_mut().find(|(a, _)| *a == attempt) {
                Some((_, made)) => made.push(&call.key),
                None => list.push((attempt, vec![&call.key])),
            }
        }
        let by = self
            .users
            .entry((call.double.as_str(), call.key.as_str()))
            .or_default();
        if !by.contains(&(index, phase)) {
            by.push((index, phase));
        }
    }

    /// A key that changed between attempts of a step (the nth call of an attempt to a
    /// double against the nth of an earlier attempt), and a key two steps share.
    pub(super) fn problems(&self, specs: &[StepSpec]) -> Vec<String> {
        let mut out = Vec::new();
        for (&(index, phase, double), attempts) in &self.attempts {
            let mut first: Vec<&str> = Vec::new();
            let changed = attempts.iter().find_map(|(_, made)| {
                for (n, key) in made.iter().enumerate() {
                    match first.get(n) {
                        Some(was) if was != key => return Some((*was, *key)),
                        Some(_) => {}
                        None => first.push(key),
                    }
                }
                None
            });
            if let Some((one, other)) = changed {
                // In the keys' order, so that the same mistake reads the same in every run.
                let (was, now) = if one <= other {
                    (one, other)
                } else {
                    (other, one)
                };
                out.push(format!(
                    "{} called the keyed double {double} with key {was:?} on one attempt and \
                     {now:?} on another: a key that changes between attempts lets a repeat \
                     take its effect again (a key must be the same on every attempt of a \
                     step: Ctx::key, or one of your own made from the flow's input)",
                    step_words(specs[index].name, phase)
                ));
            }
        }
        for (&(double, key), by) in &self.users {
            if by.len() > 1 {
                let who: Vec<String> = by
                    .iter()
                    .map(|&(i, phase)| step_words(specs[i].name, phase))
                    .collect();
                out.push(format!(
                    "{} called the keyed double {double} with the same key {key:?}: the \
                     downstream answers the later call with the earlier one's answer and \
                     takes no effect for it; each step, and each compensation, needs a key \
                     of its own",
                    who.join(" and ")
                ));
            }
        }
        out
    }
}

/// On a completed flow: a step that called downstreams, none of whose calls took an
/// effect, succeeded all the same (an error turned into success).
pub(super) fn success_without_effect(
    specs: &[StepSpec],
    called: &BTreeMap<usize, Vec<&Call>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (&i, calls) in called {
        let spec = &specs[i];
        if spec.class == StepClass::Local || calls.iter().any(|c| c.effect) {
            continue;
        }
        let doubles: Vec<&str> = calls.iter().map(|c| c.double.as_str()).collect();
        out.push(format!(
            "the flow completed, but none of step {}'s calls ({}) took its effect: a step \
             that succeeds when its downstream refused or could not be reached turns an \
             error into success (return the error: StepError::from)",
            spec.name,
            dedup(doubles).join(", ")
        ));
    }
    out
}

/// On a compensated flow: a step declared `nothing_to_undo` whose call took an effect,
/// which stays while the flow is undone, unless the kit was told it may
/// ([`Kit::may_stay`](super::Kit::may_stay)).
pub(super) fn effects_left_in_place(
    specs: &[StepSpec],
    called: &BTreeMap<usize, Vec<&Call>>,
    may_stay: &[&str],
) -> Vec<String> {
    let mut out = Vec::new();
    for (&i, calls) in called {
        let spec = &specs[i];
        if spec.undo != Undo::NothingToUndo || may_stay.contains(&spec.name) {
            continue;
        }
        let took: Vec<&str> = calls
            .iter()
            .filter(|c| c.effect)
            .map(|c| c.double.as_str())
            .collect();
        if took.is_empty() {
            continue;
        }
        out.push(format!(
            "the flow compensated, but step {} took its effect (a call to {}) and declares \
             nothing to undo, so the effect stays while the flow is undone: give the step a \
             compensation, or tell the kit the effect may stay (Kit::may_stay)",
            spec.name,
            dedup(took).join(", ")
        ));
    }
    out
}

fn dedup(mut names: Vec<&str>) -> Vec<&str> {
    names.sort_unstable();
    names.dedup();
    names
}
