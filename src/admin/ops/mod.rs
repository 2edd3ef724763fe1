//! What the page and the command line read and do, written once: an entity's timeline,
//! the search, the filter of dead events, and the actions, each going through the
//! library's own fenced calls and recorded in the audit trail.

mod acts;
mod filter;
mod reads;
mod views;

pub(crate) use filter::{Filter, OnDead, OnTimer, resume_how};
pub(crate) use reads::unsupported;
pub(crate) use views::*;

/// How many dead events a bulk requeue or discard reads, and acts on, at a time.
pub(crate) const BATCH: u32 = 500;

/// How many rows of each kind a search shows.
pub(crate) const FOUND_MAX: i64 = 100;

/// What an action did: how many things it changed, or the error it stopped at and how
/// many it had changed by then.
pub(crate) type Acted = std::result::Result<i64, (crate::error::Error, i64)>;

/// The longest `who` and `target` recorded (the audit table holds them).
const MAX_WHO: usize = 255;
const MAX_TARGET: usize = 4096;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::error::Error;

    #[test]
    fn message_ids_read_back_into_their_parts() {
        assert_eq!(message_id("Order:12:3"), Some(("Order", 12, 3)));
        assert_eq!(message_id("a:b:12:3"), Some(("a:b", 12, 3)));
        assert_eq!(message_id(":12:3"), None);
        assert_eq!(message_id("Order:x:3"), None);
        assert_eq!(message_id("pay_123"), None);
    }

    #[test]
    fn a_filter_reads_its_fields_and_refuses_a_bad_age() {
        let q: HashMap<String, String> = [("machine", " M "), ("event", ""), ("older", "60")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let f = Filter::from_fields(&q).unwrap();
        assert_eq!(f.machine.as_deref(), Some("M"));
        assert_eq!(f.event, None);
        assert_eq!(f.older_than_s, Some(60));
        assert_eq!(f.describe(), "dead events where machine=M, older than 60 s");
        let bad: HashMap<String, String> = [("older".to_string(), "an hour".to_string())].into();
        assert!(matches!(
            Filter::from_fields(&bad),
            Err(Error::InvalidInput(_))
        ));
    }
}
