//! What every layer shares, below all of them: a call's deadline and what happens when
//! its caller stops waiting (`detach.rs`), when a call reads before it writes
//! (`read_first.rs`), what comes in from a caller (`input.rs`: references, payload
//! fingerprints), free text bounded before it is recorded (`text.rs`), and the
//! background jobs' retry delays (`retry.rs`), a W3C trace context as it comes in
//! (`trace.rs`) and its bridge to OpenTelemetry (`otel.rs`, feature `otel`), and the
//! setters of the public configuration structs (`config.rs`). It imports no layer.

pub(crate) mod config;
pub(crate) mod detach;
pub(crate) mod hook;
pub(crate) mod input;
#[cfg(feature = "otel")]
pub(crate) mod otel;
pub(crate) mod read_first;
pub(crate) mod retry;
pub(crate) mod text;
pub(crate) mod trace;
