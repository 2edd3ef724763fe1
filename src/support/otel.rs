//! The bridge to OpenTelemetry (feature `otel`): a [`TraceContext`] read from a `tracing`
//! span as the `tracing-opentelemetry` layer records it, and a context set as a span's
//! remote parent. Without that layer in the subscriber, a span has no OpenTelemetry
//! context: nothing is read from it and no parent is set.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::trace::TraceContext;

impl TraceContext {
    /// The context of `span` as the `tracing-opentelemetry` layer records it: its trace,
    /// with `span` as the parent. `None` when no such layer records the span (or it is
    /// disabled). Reading it starts the span in OpenTelemetry's view: set its parent
    /// first.
    pub fn of_span(span: &tracing::Span) -> Option<TraceContext> {
        of_context(&span.context())
    }

    /// This context as OpenTelemetry's span context of a remote parent.
    pub(crate) fn span_context(&self) -> SpanContext {
        let trace_id = TraceId::from_hex(self.trace_id()).unwrap_or(TraceId::INVALID);
        let span_id = SpanId::from_hex(self.parent_id()).unwrap_or(SpanId::INVALID);
        let flags = if self.sampled() {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let state = self
            .tracestate()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(trace_id, span_id, flags, true, state)
    }

    /// Makes `span`, not yet started, a child of this context in OpenTelemetry's view:
    /// `false` when it cannot be (no layer records the span, it is disabled, or its
    /// context was read already).
    pub fn set_parent_of(&self, span: &tracing::Span) -> bool {
        let parent = opentelemetry::Context::new().with_remote_span_context(self.span_context());
        span.set_parent(parent).is_ok()
    }
}

/// The trace context of an OpenTelemetry context's span, if it has a valid one.
fn of_context(cx: &opentelemetry::Context) -> Option<TraceContext> {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    let traceparent = format!(
        "00-{:032x}-{:016x}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    let state = sc.trace_state().header();
    TraceContext::from_values(
        Some(&traceparent),
        Some(state.as_str()).filter(|s| !s.is_empty()),
    )
}

/// The relay's publish span `span` (kind PRODUCER, not yet started): made a child of the
/// event's stored context and linked to the relay round's span (the current one). The
/// context the message then carries: the span's own, so that the consumer is its child;
/// the stored one when no layer records the span.
pub(crate) fn producer(
    span: &tracing::Span,
    stored: Option<&TraceContext>,
) -> Option<TraceContext> {
    if let Some(stored) = stored {
        stored.set_parent_of(span);
    }
    let round = tracing::Span::current().context();
    span.add_link(round.span().span_context().clone());
    TraceContext::of_span(span).or_else(|| stored.cloned())
}
