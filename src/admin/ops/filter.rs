//! Which dead events a list or a bulk requeue takes, and how a parked flow is resumed
//! or a timer handled, as a form or a command line names them.

use std::collections::HashMap;

use crate::admin::lookup::EventFilter;
use crate::flow::Resume;

use crate::error::Error;

use crate::error::Result;

/// Which dead events a list or a bulk requeue takes: each field absent meaning any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    pub(crate) machine: Option<String>,
    pub(crate) event: Option<String>,
    /// Text the last error contains.
    pub(crate) error: Option<String>,
    /// Dead events at least this old (from their write), in seconds.
    pub(crate) older_than_s: Option<u64>,
}

impl Filter {
    /// The filter of a form or a query (`machine`, `event`, `error`, `older` in
    /// seconds), blank fields meaning any; an `older` that is no count of seconds is
    /// [`Error::InvalidInput`].
    pub(crate) fn from_fields(q: &HashMap<String, String>) -> Result<Self> {
        let want = |k: &str| {
            q.get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let older_than_s = match want("older") {
            None => None,
            Some(text) => Some(text.parse().map_err(|_| {
                Error::InvalidInput(format!("older is a count of seconds, not {text:?}"))
            })?),
        };
        Ok(Filter {
            machine: want("machine"),
            event: want("event"),
            error: want("error"),
            older_than_s,
        })
    }

    /// The filter as form fields (blank for any).
    pub(crate) fn fields(&self) -> [(&'static str, String); 4] {
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        [
            ("machine", text(&self.machine)),
            ("event", text(&self.event)),
            ("error", text(&self.error)),
            (
                "older",
                self.older_than_s
                    .map_or_else(String::new, |s| s.to_string()),
            ),
        ]
    }

    /// The filter as the store reads it.
    pub(crate) fn events(&self) -> EventFilter<'_> {
        EventFilter {
            machine: self.machine.as_deref(),
            event: self.event.as_deref(),
            error_contains: self.error.as_deref(),
            older_than_ms: self
                .older_than_s
                .map(|s| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)),
        }
    }

    /// The filter in words, as the audit trail records it.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("machine", &self.machine),
            ("event", &self.event),
            ("error", &self.error),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        }
        if let Some(s) = self.older_than_s {
            parts.push(format!("older than {s} s"));
        }
        if parts.is_empty() {
            "every dead event".to_string()
        } else {
            format!("dead events where {}", parts.join(", "))
        }
    }
}

/// How to resume a parked flow, by its name on a form or a command line.
pub(crate) fn resume_how(how: &str, output: Option<&str>) -> Result<Resume> {
    match how {
        "retry" => Ok(Resume::Retry),
        "compensate" => Ok(Resume::Compensate),
        "applied" => {
            let text = output
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .unwrap_or("null");
            let value = serde_json::from_str(text).map_err(|e| {
                Error::InvalidInput(format!("the step's output is not JSON ({e}): {text:?}"))
            })?;
            Ok(Resume::Applied(value))
        }
        other => Err(Error::InvalidInput(format!(
            "a resume is retry, applied or compensate, not {other:?}"
        ))),
    }
}

/// What a bulk action does to each dead event it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDead {
    /// Back to PENDING, to be published.
    Requeue,
    /// Deleted, never published.
    Discard,
}

impl OnDead {
    /// Its name in the audit trail.
    pub(crate) fn action(self) -> &'static str {
        match self {
            OnDead::Requeue => "outbox.requeue",
            OnDead::Discard => "outbox.discard",
        }
    }
}

/// What to do with a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnTimer {
    Rearm,
    Cancel,
}
