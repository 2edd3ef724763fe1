//! What comes in from a caller, checked the same way by every layer: references (a
//! transition's `ref_id`, an idempotency key, a flow key) and payload fingerprints.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::Error;

use crate::error::Result;

/// Longest accepted `ref_id`, in characters.
pub const MAX_REF_LEN: usize = 255;

/// A caller's reference (a transition's `ref_id`, an idempotency key): 1 to
/// [`MAX_REF_LEN`] characters, no whitespace at either end, so a padded copy can never be
/// taken for another reference; no control character (C0, DEL, C1), no format character
/// (Unicode category Cf: the bidirectional controls U+202A–U+202E and U+2066–U+2069,
/// zero-width spaces and joiners, the byte order mark, soft hyphens, tag characters) and
/// no line or paragraph separator (U+2028, U+2029), so that a reference shown on the
/// operators' page, by the command line or in a log reads as what it is and cannot
/// display as another. `what` names it in the error.
pub(crate) fn validate_reference(what: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::InvalidInput(format!("{what} must not be empty")));
    }
    if value.trim() != value {
        return Err(Error::InvalidInput(format!(
            "{what} must not begin or end with whitespace"
        )));
    }
    let len = value.chars().count();
    if len > MAX_REF_LEN {
        return Err(Error::InvalidInput(format!(
            "{what} is {len} characters long; the limit is {MAX_REF_LEN}"
        )));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(Error::InvalidInput(format!(
            "{what} must not contain control characters (U+{:04X})",
            u32::from(c)
        )));
    }
    if let Some(c) = value.chars().find(|&c| invisible(c)) {
        return Err(Error::InvalidInput(format!(
            "{what} must not contain invisible format characters (U+{:04X})",
            u32::from(c)
        )));
    }
    Ok(())
}

/// A character that changes how the text around it displays without being seen itself:
/// a format character (category Cf, bidirectional controls among them) or a line or
/// paragraph separator.
fn invisible(c: char) -> bool {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    matches!(
        c.general_category(),
        GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

/// A payload's fingerprint and JSON text.
#[derive(Debug, Clone)]
pub(crate) struct Payload {
    pub(crate) hash: String,
    pub(crate) json: String,
}

/// The payload's identity: two payloads are the same payload when they serialize to
/// equal JSON values (`serde_json::Value` equality: the same members whatever their
/// order, the same array elements in the same order, equal strings, and equal numbers of
/// the same kind, so `1` and `1.0` differ and every digit of a large integer counts). The
/// fingerprint is the SHA-256 of the value's canonical JSON text (members sorted by
/// name, no whitespace, numbers as serde_json writes them), which is also the text
/// stored. A payload that does not serialize to JSON, or that holds a NUL character
/// (which PostgreSQL cannot store), is [`Error::InvalidInput`] on every backend.
pub(crate) fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<Payload> {
    let value = serde_json::to_value(payload)
        .map_err(|e| Error::InvalidInput(format!("payload is not serializable as JSON: {e}")))?;
    if holds_nul(&value) {
        return Err(Error::InvalidInput(
            "payload must not contain a NUL character (U+0000)".into(),
        ));
    }
    let mut json = String::new();
    write_canonical(&value, &mut json);
    let hash = hex::encode(Sha256::digest(json.as_bytes()));
    Ok(Payload { hash, json })
}

/// Canonical JSON: RFC 8785's shape (members sorted by name, no whitespace) with the
/// numbers left as they are. RFC 8785 writes every number as an IEEE 754 double, which
/// would make two integers above 2^53 that differ in their last digits (an id, an amount
/// in minor units) one payload.
fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(members) => {
            let mut sorted: Vec<_> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(name.clone()).to_string());
                out.push(':');
                write_canonical(member, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        // `-0.0` equals `0.0` as a value, so it is written as `0.0`.
        Value::Number(n) if n.as_f64() == Some(0.0) && n.is_f64() => out.push_str("0.0"),
        // Compact and exact: strings escaped, integers in full, floats in their shortest
        // form that reads back the same.
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            out.push_str(&value.to_string())
        }
    }
}

fn holds_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(members) => members
            .iter()
            .any(|(k, v)| k.contains('\0') || holds_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// The fingerprint of a payload, as transitions compute it (for the other layers).
pub(crate) fn fingerprint_of<P: Serialize + ?Sized>(payload: &P) -> Result<String> {
    fingerprint(payload).map(|p| p.hash)
}
