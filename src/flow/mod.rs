//! Flows: multi-step lock → judge → update with compensation steps.
//!
//! A flow is declared with [`flow!`](crate::flow!): its kind, its definition version,
//! and its steps in order, each with its effect class ([`StepClass`]) and whether it has
//! a compensation. The declaration is checked at compile time: no empty flow, no two
//! steps of one name, and no keyed or unsafe step with an effect but no compensation
//! before the pivot (the first step that is never compensated, after which steps are only
//! retried forward).
//!
//! A [`Definition`] attaches the actions; [`Flows`] registers definitions, starts flows
//! ([`Flows::start`]), resumes parked ones ([`Flows::resume`]), runs the recovery job
//! ([`Flows::recover`], [`Flows::recovery_loop`]) and shows what is recorded
//! ([`Flows::get`], [`Flows::list`]). The model and its guarantees are in
//! `docs/flows.md`.

mod def;
mod drive;
mod flows;
mod macros;
mod outcome;
mod recovery;
mod resume;
mod run;
mod seam;
mod starts;
mod steps;
mod wait;

pub use def::{Flow, FlowStep, StepClass, StepSpec, Undo};
pub use flows::{FlowConfig, Flows};
pub use outcome::{FlowOutcome, FlowView, FlowWait, Listed, Outputs, ParkReason, Resume, Started};
pub use recovery::FlowsRecovered;
pub use seam::{FlowRow, FlowStore, Listing, NewFlow, StepRow, StepWrite, TakeDue, Touch};
pub use steps::{Ctx, Definition, MAX_ERROR_BYTES, StepError};
pub use wait::WAIT_MACHINE;
pub(crate) use wait::Woken;

#[doc(hidden)]
pub use def::__check;
