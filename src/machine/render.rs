//! The graph rendered for people: Mermaid and Graphviz DOT.

use std::fmt::Write as _;

use super::{StateMachine, Transition};

/// An edge's label: its event, its guard in brackets, then after a slash its effect and
/// the domain event it emits (`Pay [amount_matches] / record_payment, OrderPaid`).
fn label<S, E: std::fmt::Display>(t: &Transition<S, E>) -> String {
    let mut label = t.event.to_string();
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
        let _ = writeln!(out, "    {} --> {} : {}", t.from, t.to, label(t));
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
            label(t)
        );
    }
    out.push_str("}\n");
    out
}
