//! What the library tells an operator: `tracing` events always, and with the `metrics`
//! feature counters, gauges and histograms through the `metrics` facade (the
//! application installs the exporter). Labels are bounded: machine, event, outcome,
//! backend, scope, flow kind, reason, job; never an id or a key. The names are in
//! `docs/observability.md`.

use std::time::Duration;

use crate::error::Error;

/// The outcome label of an error: what the caller is told, in a word.
pub(crate) fn error_label(e: &Error) -> &'static str {
    match e {
        Error::InvalidInput(_) => "invalid_input",
        Error::NotFound { .. } => "not_found",
        Error::AlreadyExists { .. } => "already_exists",
        Error::InvalidTransition { .. } => "invalid_transition",
        Error::RefConflict { .. } => "ref_conflict",
        Error::PayloadMismatch { .. } => "payload_mismatch",
        Error::InFlight { .. } => "in_flight",
        Error::LeaseLost { .. } => "lease_lost",
        Error::TokenRejected { .. } => "token_rejected",
        Error::FlowVersion { .. } => "flow_version",
        Error::CorruptRecord { .. } => "corrupt_record",
        Error::CorruptState { .. } => "corrupt_state",
        Error::MissingColumn { .. } => "missing_column",
        Error::Refused { .. } => "refused",
        Error::Moot { .. } => "moot",
        Error::RuleFailed { .. } => "rule_failed",
        Error::Contention { .. } => "contention",
        Error::InDoubt { .. } => "in_doubt",
        Error::Unavailable { .. } => "unavailable",
        Error::DeadlineExceeded { .. } => "deadline_exceeded",
        Error::Database { .. } => "database_error",
        Error::InvalidMachine(_) => "invalid_machine",
        Error::Migrate(_) => "migrate_error",
    }
}

/// A transition answered: by outcome, and how long it took.
pub(crate) fn transition(
    machine: &'static str,
    event: &'static str,
    outcome: &'static str,
    took: Duration,
) {
    tracing::debug!(
        machine,
        event,
        outcome,
        took_ms = took.as_millis() as u64,
        "orderly.transition"
    );
    if outcome == "payload_mismatch" {
        payload_mismatch("transition");
    }
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("orderly_transitions_total", "machine" => machine, "event" => event, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("orderly_transition_duration_seconds", "machine" => machine, "outcome" => outcome)
            .record(took.as_secs_f64());
    }
}

/// A transition read and judged again (a lost race, a retryable error).
pub(crate) fn rejudge(machine: &'static str, reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("orderly_transition_rejudge_total", "machine" => machine, "reason" => reason)
        .increment(1);
    let _ = (machine, reason);
}

/// A database error the library retried or read back: by backend, class and code.
pub(crate) fn retryable_db_error(backend: &'static str, class: &'static str, e: &sqlx::Error) {
    let code = e
        .as_database_error()
        .and_then(|d| {
            // MySQL's SQLSTATE is HY000 for most errors: its error number says more.
            #[cfg(feature = "mysql")]
            if let Some(my) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return Some(my.number().to_string());
            }
            d.code().map(|c| c.into_owned())
        })
        .unwrap_or_else(|| match e {
            sqlx::Error::PoolTimedOut => "pool_timeout".into(),
            sqlx::Error::Io(_) => "io".into(),
            _ => "other".into(),
        });
    tracing::debug!(backend, class, code, error = %e, "orderly.db_error");
    #[cfg(feature = "metrics")]
    metrics::counter!("orderly_db_retryable_errors_total", "backend" => backend, "class" => class, "code" => code)
        .increment(1);
}

/// A write unit of coalesced requests sent: how many it carried.
pub(crate) fn write_unit(backend: &'static str, requests: usize) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("orderly_write_unit_requests", "backend" => backend)
        .record(requests as f64);
    let _ = (backend, requests);
}

/// A claim of an idempotency record answered.
pub(crate) fn claim(scope: &str, outcome: &'static str) {
    tracing::debug!(scope, outcome, "orderly.claim");
    if outcome == "payload_mismatch" {
        payload_mismatch("claim");
    }
    #[cfg(feature = "metrics")]
    metrics::counter!("orderly_claims_total", "scope" => scope.to_string(), "outcome" => outcome)
        .increment(1);
}

fn payload_mismatch(layer: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("orderly_payload_mismatches_total", "layer" => layer).increment(1);
    let _ = layer;
}

/// The records of `scope` held right now, and the oldest one's age.
pub(crate) fn records_held(scope: &str, held: u64, oldest: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("orderly_records_held", "scope" => scope.to_string()).set(held as f64);
        metrics::gauge!("orderly_records_oldest_held_seconds", "scope" => scope.to_string())
            .set(oldest.as_secs_f64());
    }
    let _ = (scope, held, oldest);
}

/// A flow's start (or resumption) answered.
pub(crate) fn flow(kind: &str, outcome: &'static str, replayed: bool) {
    tracing::debug!(kind, outcome, replayed, "orderly.flow");
    #[cfg(feature = "metrics")]
    {
        let replayed = if replayed { "true" } else { "false" };
        metrics::counter!("orderly_flows_total", "kind" => kind.to_string(), "outcome" => outcome, "replayed" => replayed)
            .increment(1);
    }
}

/// A flow parked for an operator.
pub(crate) fn flow_parked(kind: &str, reason: &'static str) {
    tracing::info!(kind, reason, "orderly.flow.parked");
    #[cfg(feature = "metrics")]
    metrics::counter!("orderly_flows_parked_total", "kind" => kind.to_string(), "reason" => reason)
        .increment(1);
}

/// One round of a recovery job (`job`: records, flows): what it found and took over,
/// and whether it failed.
pub(crate) fn recovery_round(job: &'static str, found: usize, taken: usize, failed: bool) {
    tracing::debug!(job, found, taken, failed, "orderly.recovery");
    #[cfg(feature = "metrics")]
    {
        let outcome = if failed { "failed" } else { "ok" };
        metrics::counter!("orderly_recovery_rounds_total", "job" => job, "outcome" => outcome)
            .increment(1);
        metrics::counter!("orderly_recovered_total", "job" => job).increment(taken as u64);
    }
    let _ = (found, taken);
}

/// One round of an outbox relay.
pub(crate) fn relay_round(
    published: usize,
    retried: usize,
    dead: usize,
    lost: usize,
    corrupt: usize,
) {
    #[cfg(feature = "metrics")]
    for (outcome, n) in [
        ("published", published),
        ("retried", retried),
        ("dead", dead),
        ("lost", lost),
        ("corrupt", corrupt),
    ] {
        if n > 0 {
            metrics::counter!("orderly_relay_events_total", "outcome" => outcome)
                .increment(n as u64);
        }
    }
    let _ = (published, retried, dead, lost, corrupt);
}

/// The outbox as it is now.
pub(crate) fn outbox(pending: u64, dead: u64, oldest: Duration, corrupt: u64) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("orderly_outbox_pending").set(pending as f64);
        metrics::gauge!("orderly_outbox_dead").set(dead as f64);
        metrics::gauge!("orderly_outbox_oldest_pending_seconds").set(oldest.as_secs_f64());
        metrics::gauge!("orderly_outbox_corrupt").set(corrupt as f64);
    }
    let _ = (pending, dead, oldest, corrupt);
}

/// A timer fired: by outcome, and how late (milliseconds past its due time).
pub(crate) fn timer_fired(machine: &str, outcome: &'static str, late_ms: i64) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("orderly_timers_fired_total", "machine" => machine.to_string(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("orderly_timer_lateness_seconds", "machine" => machine.to_string())
            .record(late_ms.max(0) as f64 / 1000.0);
    }
    let _ = (machine, outcome, late_ms);
}

/// The timers that are due and not fired, and how late the oldest is.
pub(crate) fn timers_overdue(due: i64, oldest_late_ms: i64) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!("orderly_timers_overdue").set(due as f64);
        metrics::gauge!("orderly_timers_oldest_lateness_seconds")
            .set(oldest_late_ms.max(0) as f64 / 1000.0);
    }
    let _ = (due, oldest_late_ms);
}
