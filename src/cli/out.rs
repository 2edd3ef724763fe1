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
                // JSON leaves DEL and the C1 controls (a CSI among them) raw: escape them.
                Ok(text) => json_visible(&text),
                Err(e) => return self.fail(&Error::InvalidInput(e.to_string())),
            }
        } else {
            // What the database holds never reaches the terminal as a control sequence.
            visible(&table(), true)
        };
        let _ = writeln!(self.out, "{text}");
        Exit::Ok
    }

    /// A line on the error stream (progress, and why a command failed).
    pub(super) fn note(&mut self, text: &str) {
        let _ = writeln!(self.err, "{}", visible(text, false));
    }

    /// Says why the command failed, and the exit code that means it.
    pub(super) fn fail(&mut self, e: &Error) -> Exit {
        self.note(&format!("orderly: {e}"));
        Exit::of(e)
    }
}

/// `text` with every control character written as an escape (`\x1b`, `\u{9b}`), so
/// that stored data (a reference, an error) cannot move the cursor, recolour or retitle
/// an operator's terminal; with `lines`, its line breaks kept.
pub(super) fn visible(text: &str, lines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' if lines => out.push('\n'),
            c if c.is_control() && u32::from(c) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// JSON text with DEL and the C1 control characters written as `\u` escapes (they can
/// only stand inside its strings, where an escape means the same).
fn json_visible(json: &str) -> String {
    json.chars()
        .map(|c| match u32::from(c) {
            n @ (0x7f..=0x9f) => format!("\\u{n:04x}"),
            _ => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{json_visible, visible};

    #[test]
    fn json_escapes_what_serde_json_leaves_raw() {
        let raw = serde_json::to_string(&"a\u{9b}31m\u{7f}\u{1b}").unwrap();
        let shown = json_visible(&raw);
        assert_eq!(shown, "\"a\\u009b31m\\u007f\\u001b\"");
        let back: String = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, "a\u{9b}31m\u{7f}\u{1b}");
    }

    #[test]
    fn control_characters_are_written_as_escapes() {
        let hostile = "pay-1\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m\r\nnext";
        assert_eq!(
            visible(hostile, true),
            "pay-1\\x1b]0;owned\\x07\\x1b[2J\\u{9b}31m\\x0d\nnext"
        );
        assert_eq!(visible("a\nb", false), "a\\x0ab");
        assert_eq!(visible("plain été", true), "plain été");
    }
}
