//! What comes in from a caller (references, payloads, event names) and from the database
//! (status names, versions, history rows), checked before it is trusted.

use super::Record;
use crate::error::Error;
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::RawTransition;
pub use crate::support::input::MAX_REF_LEN;
pub(crate) use crate::support::input::{Payload, fingerprint, validate_reference};

/// Parses an event name as received from a client or a queue.
pub fn parse_event<M: StateMachine>(name: &str) -> Result<M::Event> {
    name.parse()
        .map_err(|_| Error::InvalidInput(format!("unknown event {name:?} for machine {}", M::NAME)))
}

pub(super) fn validate_ref(ref_id: &str) -> Result<()> {
    validate_reference("ref_id", ref_id)
}

/// The longest reason a request may carry, in characters.
pub(super) const MAX_REASON_LEN: usize = 1000;

/// Who asked and why: the actor is checked as a reference is ("actor", 1 to 255
/// characters, no control or invisible format characters, no padding); the reason is free text (line
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

pub(super) fn parse_state<M: StateMachine>(order_id: i64, value: &str) -> Result<M::State> {
    value.parse().map_err(|_| Error::CorruptState {
        order_id,
        value: value.to_string(),
    })
}

/// The outcome of a write that applied, as the store reported it: its states parsed.
pub(super) fn applied<M: StateMachine>(
    order_id: i64,
    from: &str,
    to: &str,
    version: i64,
) -> Result<crate::engine::Outcome<M::State>> {
    Ok(crate::engine::Outcome::Applied {
        from: parse_state::<M>(order_id, from)?,
        to: parse_state::<M>(order_id, to)?,
        version,
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
