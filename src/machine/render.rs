//! The graph rendered for people: Mermaid and Graphviz DOT.

use std::fmt::Write as _;

use super::{StateMachine, StateTimer, Transition};

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

/// The timers a graph is drawn with: the machine's as declared, or as an engine's
/// configuration set their delays.
type Timers<M> = [StateTimer<<M as StateMachine>::State, <M as StateMachine>::Event>];

/// An edge's label: its event, the timer that fires it from its state (`(after 30 min)`),
/// its guard in brackets, then after a slash its effect and the domain event it emits
/// (`Pay [amount_matches] / record_payment, OrderPaid`).
fn label<M: StateMachine>(t: &Transition<M::State, M::Event>, timers: &Timers<M>) -> String {
    let mut label = t.event.to_string();
    for timer in timers
        .iter()
        .filter(|timer| timer.state == t.from && timer.event == t.event)
    {
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

/// Renders the graph as a Mermaid `stateDiagram-v2`, with its timers as declared (an
/// engine draws them as configured: [`Engine::mermaid`](crate::Engine::mermaid)).
pub fn mermaid<M: StateMachine>() -> String {
    mermaid_with::<M>(M::TIMERS)
}

/// [`mermaid`] with these timers.
pub(crate) fn mermaid_with<M: StateMachine>(timers: &Timers<M>) -> String {
    let mut out = String::from("stateDiagram-v2\n");
    let _ = writeln!(out, "    [*] --> {}", M::INITIAL);
    for t in M::TRANSITIONS {
        let _ = writeln!(
            out,
            "    {} --> {} : {}",
            t.from,
            t.to,
            label::<M>(t, timers)
        );
    }
    for s in M::TERMINAL {
        let _ = writeln!(out, "    {s} --> [*]");
    }
    out
}

/// Renders the graph in Graphviz DOT, with its timers as declared (an engine draws them
/// as configured: [`Engine::dot`](crate::Engine::dot)).
pub fn dot<M: StateMachine>() -> String {
    dot_with::<M>(M::TIMERS)
}

/// [`dot`] with these timers.
pub(crate) fn dot_with<M: StateMachine>(timers: &Timers<M>) -> String {
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
            label::<M>(t, timers)
        );
    }
    out.push_str("}\n");
    out
}

/// Text escaped for SVG and HTML.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Renders the graph as an SVG picture, laid out in columns by distance from the initial
/// state: edges that go forward are straight arrows, edges that go back (or stay) curve
/// below their states; terminal states have a double border. Self-contained: no script,
/// no font or style fetched. Its timers as declared (an engine draws them as configured:
/// [`Engine::svg`](crate::Engine::svg)).
pub fn svg<M: StateMachine>() -> String {
    svg_with::<M>(M::TIMERS)
}

/// [`svg`] with these timers.
pub(crate) fn svg_with<M: StateMachine>(timers: &Timers<M>) -> String {
    const H: i64 = 34;
    const ROW: i64 = 96;
    const GAP: i64 = 170;
    const MARGIN: i64 = 40;
    // Columns by shortest distance from the initial state; unreachable states last.
    let mut states: Vec<String> = vec![M::INITIAL.to_string()];
    let mut column: Vec<i64> = vec![0];
    let mut i = 0;
    while i < states.len() {
        let from = states[i].clone();
        let next: Vec<String> = M::TRANSITIONS
            .iter()
            .filter(|t| t.from.to_string() == from)
            .map(|t| t.to.to_string())
            .collect();
        for to in next {
            if !states.contains(&to) {
                states.push(to);
                column.push(column[i] + 1);
            }
        }
        i += 1;
    }
    let last = column.iter().copied().max().unwrap_or(0) + 1;
    let named = M::TRANSITIONS
        .iter()
        .flat_map(|t| [t.from.to_string(), t.to.to_string()])
        .chain(M::TERMINAL.iter().map(|s| s.to_string()));
    for s in named {
        if !states.contains(&s) {
            states.push(s);
            column.push(last);
        }
    }
    let width = |s: &str| (s.chars().count() as i64 * 8 + 28).max(84);
    let box_w = states.iter().map(|s| width(s)).max().unwrap_or(84);
    let mut row_of = vec![0i64; states.len()];
    let mut rows_in: std::collections::BTreeMap<i64, i64> = Default::default();
    for (k, c) in column.iter().enumerate() {
        let n = rows_in.entry(*c).or_default();
        row_of[k] = *n;
        *n += 1;
    }
    let x = |k: usize| MARGIN + 30 + column[k] * (box_w + GAP);
    let y = |k: usize| MARGIN + row_of[k] * ROW;
    let at = |name: &str| states.iter().position(|s| s == name).unwrap_or(0);
    let columns = column.iter().copied().max().unwrap_or(0) + 1;
    let rows = rows_in.values().copied().max().unwrap_or(1);
    let total_w = MARGIN * 2 + 30 + columns * box_w + (columns - 1) * GAP;
    let total_h = MARGIN * 2 + rows * ROW + 40;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"graph\" width=\"{total_w}\" \
         height=\"{total_h}\" viewBox=\"0 0 {total_w} {total_h}\" font-family=\"sans-serif\" \
         font-size=\"12\"><title>{}</title>\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" \
         markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#44505c\"/></marker></defs>",
        escaped(M::NAME)
    );
    // The initial state's dot.
    let k0 = 0;
    let _ = write!(
        out,
        "<circle cx=\"{}\" cy=\"{}\" r=\"6\" fill=\"#1d2329\"/>\
         <line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#44505c\" marker-end=\"url(#arrow)\"/>",
        MARGIN,
        y(k0) + H / 2,
        MARGIN + 6,
        y(k0) + H / 2,
        x(k0),
        y(k0) + H / 2
    );
    // Edges first, under the states; a pair's several edges spread their labels.
    let mut seen: std::collections::HashMap<(usize, usize), i64> = Default::default();
    for t in M::TRANSITIONS {
        let (a, b) = (at(t.from.as_ref()), at(t.to.as_ref()));
        let nth = seen.entry((a, b)).or_default();
        let shift = *nth * 15;
        *nth += 1;
        let text = escaped(&label::<M>(t, timers));
        if a == b {
            let (cx, top) = (x(a) + box_w / 2, y(a));
            let _ = write!(
                out,
                "<path d=\"M {} {top} C {} {} {} {} {} {top}\" fill=\"none\" stroke=\"#44505c\" \
                 marker-end=\"url(#arrow)\"/><text x=\"{cx}\" y=\"{}\" text-anchor=\"middle\">{text}</text>",
                cx - 14,
                cx - 30,
                top - 40,
                cx + 30,
                top - 40,
                cx + 14,
                top - 36 - shift
            );
        } else if column[b] > column[a] {
            let (x1, y1) = (x(a) + box_w, y(a) + H / 2);
            let (x2, y2) = (x(b), y(b) + H / 2);
            let _ = write!(
                out,
                "<line x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\" stroke=\"#44505c\" \
                 marker-end=\"url(#arrow)\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{text}</text>",
                (x1 + x2) / 2,
                (y1 + y2) / 2 - 6 - shift
            );
        } else {
            let (x1, y1) = (x(a) + box_w / 2, y(a) + H);
            let (x2, y2) = (x(b) + box_w / 2, y(b) + H);
            let dip = y1.max(y2) + 34 + shift;
            let _ = write!(
                out,
                "<path d=\"M {x1} {y1} C {x1} {dip} {x2} {dip} {x2} {y2}\" fill=\"none\" \
                 stroke=\"#44505c\" stroke-dasharray=\"4 3\" marker-end=\"url(#arrow)\"/>\
                 <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{text}</text>",
                (x1 + x2) / 2,
                dip + 4
            );
        }
    }
    for (k, s) in states.iter().enumerate() {
        let terminal = M::TERMINAL.iter().any(|t| t.to_string() == *s);
        let _ = write!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"{box_w}\" height=\"{H}\" rx=\"8\" fill=\"#eef4fb\" \
             stroke=\"#1d2329\" stroke-width=\"{}\"/>",
            x(k),
            y(k),
            if terminal { 3 } else { 1 }
        );
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-weight=\"600\">{}</text>",
            x(k) + box_w / 2,
            y(k) + H / 2 + 4,
            escaped(s)
        );
    }
    out.push_str("</svg>");
    out
}
