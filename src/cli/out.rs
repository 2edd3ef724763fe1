//! What a command prints: its data as a table for a person or as JSON for a script, and
//! its notes and errors on standard error.

use std::io::Write;

use serde::Serialize;

use super::Exit;
use crate::error::Error;

/// What a command prints: its data, as a table or as JSON.
pub(super) struct Out<'w> {
    pub(super) json: bool,
    pub(super) out: &'w mut (dyn Write + Send),
    pub(super) err: &'w mut (dyn Write + Send),
}

impl Out<'_> {
    /// Prints `data` as JSON, or `table` for a person.
    pub(super) fn show<T: Serialize>(&mut self, data: &T, table: impl FnOnce() -> String) -> Exit {
        let text = if self.json {
            match serde_json::to_string_pretty(data) {
                Ok(text) => text,
                Err(e) => return self.fail(&Error::InvalidInput(e.to_string())),
            }
        } else {
            table()
        };
        let _ = writeln!(self.out, "{text}");
        Exit::Ok
    }

    /// A line on the error stream (progress, and why a command failed).
    pub(super) fn note(&mut self, text: &str) {
        let _ = writeln!(self.err, "{text}");
    }

    /// Says why the command failed, and the exit code that means it.
    pub(super) fn fail(&mut self, e: &Error) -> Exit {
        self.note(&format!("orderly: {e}"));
        Exit::of(e)
    }
}
