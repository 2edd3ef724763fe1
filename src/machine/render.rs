//! The graph rendered for people: Mermaid and Graphviz DOT.

use std::fmt::Write as _;

use super::{StateMachine, Transition};

/// A timer's delay as people write it: the largest unit that divides it (`30 min`,
/// `7 days`, `1500 ms`).
pub fn duration_text(ms: u64) -> String {
    const UNITS: [(u64, &str, &str); 4] = [
        (24 * 3600 * 1000, "day", "days"),
        (3600 * 1000, "h", "h"),
        (60 * 1000, "min", "min"),
        (1000, "s", "s"),
    ];
    for (size, one, many) in UNITS {
        if ms >= size && ms.is_multiple_of(size) {
            let n = ms / size;
            return format!("{n} {}", if n == 1 { one } else { many });
        }
    }
    format!("{ms} ms")
}

/// An edge's label: its event, the timer that fires it from its state (`(after 30 min)`),
/// its guard in brackets, then after a slash its effect and the domain event it emits
/// (`Pay [amount_matches] / record_payment, OrderPaid`).
fn label<M: StateMachine>(t: &Transition<M::State, M::Event>) -> String {
    let mut label = t.event.to_string();
    for timer in M::timers_of(t.from).filter(|timer| timer.event == t.event) {
        let _ = write!(label, " (after {})", duration_text(timer.after_ms));
    }
    if let Some(guard) = t.guard {
        let _ = write!(label, " [{guard}]");
    }
    let actions: Vec<&str> = [t.effect, t.emits].into_iter().flatten().collect();
    if !actions.is_empty() {
        let _ = write!(label, " / {}", actions.join(", "));
    }
    label
}

/// Renders the graph as a Mermaid `stateDiagram-v2`.
pub fn mermaid<M: StateMachine>() -> String {
    let mut out = String::from("stateDiagram-v2\n");
    let _ = writeln!(out, "    [*] --> {}", M::INITIAL);
    for t in M::TRANSITIONS {
        let _ = writeln!(out, "    {} --> {} : {}", t.from, t.to, label::<M>(t));
    }
    for s in M::TERMINAL {
        let _ = writeln!(out, "    {s} --> [*]");
    }
    out
}

/// Renders the graph in Graphviz DOT.
pub fn dot<M: StateMachine>() -> String {
    let mut out = format!("digraph {} {{\n    __start [shape=point];\n", M::NAME);
    let _ = writeln!(out, "    __start -> \"{}\";", M::INITIAL);
    for s in M::TERMINAL {
        let _ = writeln!(out, "    \"{s}\" [shape=doublecircle];");
    }
    for t in M::TRANSITIONS {
        let _ = writeln!(
            out,
            "    \"{}\" -> \"{}\" [label=\"{}\"];",
            t.from,
            t.to,
            label::<M>(t)
        );
    }
    out.push_str("}\n");
    out
}
