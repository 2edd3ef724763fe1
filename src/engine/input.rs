//! What comes in from a caller (references, payloads, event names) and from the database
//! (status names, versions, history rows), checked before it is trusted.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::Record;
use crate::machine::StateMachine;
use crate::store::RawTransition;
use crate::{Error, Result};

/// Longest accepted `ref_id`, in characters.
pub const MAX_REF_LEN: usize = 255;

/// Parses an event name as received from a client or a queue.
pub fn parse_event<M: StateMachine>(name: &str) -> Result<M::Event> {
    name.parse()
        .map_err(|_| Error::InvalidInput(format!("unknown event {name:?} for machine {}", M::NAME)))
}

pub(super) fn validate_ref(ref_id: &str) -> Result<()> {
    validate_reference("ref_id", ref_id)
}

/// A caller's reference (a transition's `ref_id`, an idempotency key): 1 to
/// [`MAX_REF_LEN`] characters, no control characters, no whitespace at either end, so a
/// padded copy can never be taken for another reference. `what` names it in the error.
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
    if value.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

/// The longest reason a request may carry, in characters.
pub(super) const MAX_REASON_LEN: usize = 1000;

/// Who asked and why: the actor is checked as a reference is ("actor", 1 to 255
/// characters, no control characters, no padding); the reason is free text (line
/// breaks allowed) of 1 to [`MAX_REASON_LEN`] characters, without NUL, which no backend
/// stores in text.
pub(super) fn validate_audit(audit: &crate::store::Audit<'_>) -> Result<()> {
    if let Some(actor) = audit.actor {
        validate_reference("actor", actor)?;
    }
    if let Some(reason) = audit.reason {
        let len = reason.chars().count();
        if reason.trim().is_empty() {
            return Err(Error::InvalidInput("reason must not be empty".into()));
        }
        if len > MAX_REASON_LEN {
            return Err(Error::InvalidInput(format!(
                "reason is {len} characters long; the limit is {MAX_REASON_LEN}"
            )));
        }
        if reason.contains('\0') {
            return Err(Error::InvalidInput(
                "reason must not contain NUL characters".into(),
            ));
        }
    }
    Ok(())
}

/// A payload's fingerprint and JSON text.
#[derive(Debug, Clone)]
pub(super) struct Payload {
    pub(super) hash: String,
    pub(super) json: String,
}

/// The payload's identity: two payloads are the same payload when they serialize to
/// equal JSON values (`serde_json::Value` equality: the same members whatever their
/// order, the same array elements in the same order, equal strings, and equal numbers of
/// the same kind, so `1` and `1.0` differ and every digit of a large integer counts). The
/// fingerprint is the SHA-256 of the value's canonical JSON text (members sorted by
/// name, no whitespace, numbers as serde_json writes them), which is also the text
/// stored. A payload that does not serialize to JSON, or that holds a NUL character
/// (which PostgreSQL cannot store), is [`Error::InvalidInput`] on every backend.
pub(super) fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<Payload> {
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

pub(super) fn parse_state<M: StateMachine>(order_id: i64, value: &str) -> Result<M::State> {
    value.parse().map_err(|_| Error::CorruptState {
        order_id,
        value: value.to_string(),
    })
}

/// A stored version, checked: below 0, or at the largest (which has no next, so the
/// entity could never move again), it was written outside orderly.
pub(super) fn parse_version(order_id: i64, version: i64) -> Result<i64> {
    if !(0..i64::MAX).contains(&version) {
        return Err(Error::CorruptState {
            order_id,
            value: format!("version {version}"),
        });
    }
    Ok(version)
}

pub(super) fn parse_record<M: StateMachine>(
    order_id: i64,
    raw: RawTransition,
) -> Result<Record<M>> {
    let corrupt = |value: &str| Error::CorruptState {
        order_id,
        value: value.to_string(),
    };
    let payload = match raw.payload.as_deref() {
        Some(text) => Some(serde_json::from_str(text).map_err(|_| corrupt(text))?),
        None => None,
    };
    Ok(Record {
        seq: raw.seq,
        from: parse_state::<M>(order_id, &raw.from)?,
        to: parse_state::<M>(order_id, &raw.to)?,
        event: raw.event.parse().map_err(|_| corrupt(&raw.event))?,
        ref_id: raw.ref_id,
        payload_hash: raw.payload_hash,
        payload,
        actor: raw.actor,
        reason: raw.reason,
        created_at: raw.created_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_are_validated() {
        assert!(validate_ref("p-1").is_ok());
        assert!(validate_ref(&"x".repeat(255)).is_ok());
        assert!(matches!(validate_ref(""), Err(Error::InvalidInput(_))));
        assert!(matches!(validate_ref("  "), Err(Error::InvalidInput(_))));
        assert!(matches!(
            validate_ref(&"x".repeat(256)),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(validate_ref("a\0b"), Err(Error::InvalidInput(_))));
        assert!(matches!(validate_ref("p-1 "), Err(Error::InvalidInput(_))));
    }

    #[test]
    fn fingerprints_ignore_member_order_keep_numbers_and_refuse_nul() {
        let a = fingerprint(&serde_json::json!({"a": 1, "b": [1, 2]})).unwrap();
        let b = fingerprint(&serde_json::json!({"b": [1, 2], "a": 1})).unwrap();
        assert_eq!((&a.hash, &a.json), (&b.hash, &b.json));
        assert_eq!(a.json, r#"{"a":1,"b":[1,2]}"#);
        let c = fingerprint(&serde_json::json!({"a": 1.0, "b": [1, 2]})).unwrap();
        assert_ne!(c.hash, b.hash);
        // Integers are kept whole, also beyond 2^53.
        let big = fingerprint(&serde_json::json!([9_007_199_254_740_993_u64])).unwrap();
        let near = fingerprint(&serde_json::json!([9_007_199_254_740_992_u64])).unwrap();
        assert_ne!(big.hash, near.hash);
        assert_eq!(big.json, "[9007199254740993]");
        let zero = fingerprint(&serde_json::json!([0.0])).unwrap();
        assert_eq!(
            fingerprint(&serde_json::json!([-0.0])).unwrap().hash,
            zero.hash
        );
        let nested =
            fingerprint(&serde_json::json!({"z": {"b": "\"", "a": null}, "y": true})).unwrap();
        assert_eq!(nested.json, r#"{"y":true,"z":{"a":null,"b":"\""}}"#);
        assert!(matches!(
            fingerprint(&serde_json::json!({"a": "x\u{0}"})),
            Err(Error::InvalidInput(_))
        ));
    }
}
