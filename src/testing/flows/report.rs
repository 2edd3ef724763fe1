//! What an exhaustive run found: the failing runs, and their problems grouped so that
//! the same mistake in many runs reads once.

use std::fmt;
use std::time::Duration;

use super::check::{Judged, RunReport};
use super::plan::Reached;

/// What an exhaustive run ([`Kit::exhaustive`](super::Kit::exhaustive),
/// [`WorkKit::exhaustive`](super::WorkKit::exhaustive)) found.
#[derive(Debug, Clone)]
pub struct Report<T = RunReport> {
    /// The run with no fault, which the others are judged against.
    pub baseline: T,
    /// The points the baseline reached: each was given each fault that fits it.
    pub points: Vec<Reached>,
    /// How many runs, the baseline included.
    pub runs: usize,
    /// The runs whose checks found something wrong.
    pub failures: Vec<T>,
    /// How long it all took.
    pub took: Duration,
}

impl<T: Judged> Report<T> {
    /// Whether every run was sound.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// Panics with the report unless every run was sound.
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(self.ok(), "{self}");
    }
}

impl<T: Judged> fmt::Display for Report<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} runs over {} points in {:.1?}: {} failed; the run with no fault ended {}",
            self.runs,
            self.points.len(),
            self.took,
            self.failures.len(),
            self.baseline.ended()
        )?;
        let points: Vec<String> = self.points.iter().map(ToString::to_string).collect();
        writeln!(f, "points: {}", points.join(", "))?;
        let groups = grouped(&self.failures);
        if !groups.is_empty() {
            writeln!(
                f,
                "\n{} problems, the first found first, each with the plans of the runs that \
                 show it:",
                groups.len()
            )?;
        }
        for (n, (problem, runs)) in groups.iter().enumerate() {
            let plans: Vec<String> = runs
                .iter()
                .take(5)
                .map(|&i| self.failures[i].planned())
                .collect();
            let more = runs.len().saturating_sub(plans.len());
            let more = if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            };
            writeln!(
                f,
                "{}. {problem}\n   in {} run{}: {}{more}",
                n + 1,
                runs.len(),
                if runs.len() == 1 { "" } else { "s" },
                plans.join("; ")
            )?;
        }
        // Each run that first showed a problem, in full, once; and every failing run
        // whose problems its report does not list.
        let mut shown: Vec<usize> = Vec::new();
        let firsts = groups.iter().filter_map(|(_, runs)| runs.first().copied());
        let unlisted = (0..self.failures.len()).filter(|&i| self.failures[i].found().is_empty());
        for i in firsts.chain(unlisted) {
            if !shown.contains(&i) {
                shown.push(i);
                writeln!(f, "\n{}", self.failures[i])?;
            }
        }
        Ok(())
    }
}

/// The problems of `failures` with each run's own flow key written `kit-…`, each with
/// the runs that show it, in the order they were first found.
fn grouped<T: Judged>(failures: &[T]) -> Vec<(String, Vec<usize>)> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, run) in failures.iter().enumerate() {
        for problem in run.found() {
            let problem = without_run_keys(problem);
            match groups.iter_mut().find(|(p, _)| *p == problem) {
                Some((_, runs)) if runs.last() != Some(&i) => runs.push(i),
                Some(_) => {}
                None => groups.push((problem, vec![i])),
            }
        }
    }
    groups
}

/// `text` with every run key (`kit-` and twelve hexadecimal digits) written `kit-…`.
fn without_run_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("kit-") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let hex = from[4..]
            .bytes()
            .take(12)
            .take_while(u8::is_ascii_hexdigit)
            .count();
        if hex == 12 {
            out.push_str("kit-…");
            rest = &from[16..];
        } else {
            out.push_str("kit-");
            rest = &from[4..];
        }
    }
    out.push_str(rest);
    out
}
