//! The graph rendered for people: Mermaid and Graphviz DOT.

use std::fmt::Write as _;

use super::StateMachine;

/// Renders the graph as a Mermaid `stateDiagram-v2`.
pub fn mermaid<M: StateMachine>() -> String {
    let mut out = String::from("stateDiagram-v2\n");
    let _ = writeln!(out, "    [*] --> {}", M::INITIAL);
    for t in M::TRANSITIONS {
        match t.emits {
            Some(emitted) => {
                let _ = writeln!(out, "    {} --> {} : {} / {emitted}", t.from, t.to, t.event);
            }
            None => {
                let _ = writeln!(out, "    {} --> {} : {}", t.from, t.to, t.event);
            }
        }
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
        let label = match t.emits {
            Some(emitted) => format!("{} / {emitted}", t.event),
            None => t.event.to_string(),
        };
        let _ = writeln!(
            out,
            "    \"{}\" -> \"{}\" [label=\"{label}\"];",
            t.from, t.to
        );
    }
    out.push_str("}\n");
    out
}
