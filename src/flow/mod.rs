//! Flows: multi-step lock → judge → update with compensation steps.
//!
//! A flow is declared with [`flow!`](crate::flow!): its kind, its definition version,
//! and its steps in order, each with its effect class ([`StepClass`]) and whether it has
//! a compensation. The declaration is checked at compile time: no empty flow, no two
//! steps of one name, and no keyed or unsafe step with an effect but no compensation
//! before the pivot (the first step that is never compensated, after which steps are only
//! retried forward).

mod def;
mod macros;

pub use def::{Flow, StepClass, StepSpec, Undo};

#[doc(hidden)]
pub use def::__check;
