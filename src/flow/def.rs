//! A flow's declared shape, and the checks [`flow!`](crate::flow!) runs on it at compile
//! time.

/// What running a step does to the world, which decides what may be re-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepClass {
    /// Database writes (a `transition_in`, your own rows) committed in the step's
    /// checkpoint transaction: exactly once.
    Local,
    /// A call to another service that takes an idempotency key of ours, derived from the
    /// flow key and the step: re-run with the same key after a crash.
    Keyed,
    /// A call that cannot be made safe to repeat: never re-run automatically; a crash
    /// during it parks the flow for reconciliation.
    Unsafe,
    /// A wait: the flow sleeps for the step's duration on a durable timer (the timers'
    /// table and job), then goes on. It has no effect, so nothing to undo.
    Wait,
}

/// Whether a step's effect is undone when a later step fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undo {
    /// It has a compensation.
    Compensated,
    /// It has no effect to undo (declared with `nothing_to_undo`).
    NothingToUndo,
    /// Nothing declared: allowed for local steps (whose effect, if any, a later step's
    /// failure leaves in place) and for steps at or after the pivot.
    None,
}

/// One declared step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepSpec {
    /// Its name, unique in the flow.
    pub name: &'static str,
    /// Its effect class.
    pub class: StepClass,
    /// Its compensation.
    pub undo: Undo,
}

impl StepSpec {
    /// A step from the words of its declaration: the class (`local`, `keyed`, `unsafe`,
    /// `wait`) and the modifiers (`undo`, `nothing_to_undo`). An unknown word panics, which in a
    /// `const` is a compile error naming it.
    pub const fn declared(name: &'static str, class: &str, modifiers: &[&str]) -> StepSpec {
        let class = if eq(class, "local") {
            StepClass::Local
        } else if eq(class, "keyed") {
            StepClass::Keyed
        } else if eq(class, "unsafe") {
            StepClass::Unsafe
        } else if eq(class, "wait") {
            StepClass::Wait
        } else {
            panic!("flow!: a step's class is `local`, `keyed`, `unsafe` or `wait`")
        };
        let mut undo = Undo::None;
        let mut i = 0;
        while i < modifiers.len() {
            let word = modifiers[i];
            let this = if eq(word, "undo") {
                Undo::Compensated
            } else if eq(word, "nothing_to_undo") {
                Undo::NothingToUndo
            } else {
                panic!("flow!: a step's modifier is `undo` or `nothing_to_undo`")
            };
            if !matches!(undo, Undo::None) {
                panic!("flow!: a step is declared with `undo` or `nothing_to_undo`, once");
            }
            undo = this;
            i += 1;
        }
        if matches!(class, StepClass::Wait) && !matches!(undo, Undo::None) {
            panic!(
                "flow!: a wait step has no effect, so nothing to undo: declare it without a modifier"
            );
        }
        StepSpec { name, class, undo }
    }
}

/// A step of a declared flow: the enum [`flow!`](crate::flow!) generates.
pub trait FlowStep: Copy + Send + Sync + 'static {
    /// The step's name.
    fn name(self) -> &'static str;
    /// The step's position in the flow, from 0.
    fn index(self) -> usize;
}

/// A declared flow: what [`flow!`](crate::flow!) implements.
pub trait Flow: Send + Sync + 'static {
    /// The enum of its steps.
    type Step: FlowStep;
    /// The flow's kind, part of its identity `(kind, flow_key)`.
    const KIND: &'static str;
    /// The definition's version, stored with every flow record: a runner leaves a flow
    /// of a version it does not know alone.
    const VERSION: u32;
    /// The steps, in order.
    const STEPS: &'static [StepSpec];
    /// The index of the pivot, the first step never compensated, if there is one.
    const PIVOT: Option<usize>;
}

const fn eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Compile-time checks used by the macro; a panic in const evaluation is a compile error
/// with its message.
#[doc(hidden)]
pub mod __check {
    use super::{StepClass, StepSpec, Undo, eq};

    /// The declaration as a whole: a kind of 1 to 64 of `[A-Za-z0-9_.:-]`, a version
    /// from 1, at least one step, unique step names of at most 64 characters, and a pivot naming a step. The
    /// pivot's index.
    pub const fn flow(
        kind: &str,
        version: u32,
        steps: &[StepSpec],
        pivot: Option<&str>,
    ) -> Option<usize> {
        let bytes = kind.as_bytes();
        if bytes.is_empty() || bytes.len() > 64 {
            panic!("flow!: the kind must be 1 to 64 characters");
        }
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if !(c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b':' || c == b'-') {
                panic!("flow!: the kind must be of [A-Za-z0-9_.:-]");
            }
            i += 1;
        }
        if version == 0 {
            panic!("flow!: versions start at 1");
        }
        if steps.is_empty() {
            panic!("flow!: a flow has at least one step");
        }
        let mut i = 0;
        while i < steps.len() {
            if steps[i].name.len() > 64 {
                panic!("flow!: a step's name is at most 64 characters");
            }
            let mut j = i + 1;
            while j < steps.len() {
                if eq(steps[i].name, steps[j].name) {
                    panic!("flow!: two steps have one name");
                }
                j += 1;
            }
            i += 1;
        }
        match pivot {
            None => None,
            Some(name) => {
                let mut found = None;
                let mut i = 0;
                while i < steps.len() {
                    if eq(steps[i].name, name) {
                        found = Some(i);
                    }
                    i += 1;
                }
                if found.is_none() {
                    panic!("flow!: the pivot names no step of the flow");
                }
                found
            }
        }
    }

    /// Panics with `msg` if the step at `index` is keyed or unsafe, before the pivot,
    /// and declares neither a compensation nor `nothing_to_undo`.
    pub const fn compensable(steps: &[StepSpec], index: usize, pivot: Option<usize>, msg: &str) {
        let before_pivot = match pivot {
            Some(p) => index < p,
            None => true,
        };
        let step = steps[index];
        let external = matches!(step.class, StepClass::Keyed | StepClass::Unsafe);
        if before_pivot && external && matches!(step.undo, Undo::None) {
            panic!("{}", msg);
        }
    }
}
