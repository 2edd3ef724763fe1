//! A W3C trace context (the `traceparent` and `tracestate` headers of W3C Trace Context,
//! level 1), checked as it comes in: from a request's headers, a stored outbox row, a
//! broker's message. A `traceparent` that does not read starts no trace (the context is
//! none); a `tracestate` that does not read is dropped and the `traceparent` kept, as the
//! recommendation says.

use crate::error::{Error, Result};

/// The header (and column) name.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The header (and column) name.
pub(crate) const TRACESTATE: &str = "tracestate";

/// At most this many list members in a `tracestate`.
const MAX_MEMBERS: usize = 32;
/// At most this many bytes of `tracestate` are kept (the recommendation's floor for what
/// a platform propagates); a longer one is cut as the recommendation says.
const MAX_TRACESTATE: usize = 512;

/// A W3C trace context: a `traceparent` of version `00` (a higher version is read as the
/// recommendation says and kept in the `00` form), and its `tracestate` if it had a valid
/// one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from its two header values: an error naming what is wrong when either
    /// does not read (use [`from_values`](Self::from_values) to keep a good `traceparent`
    /// whose `tracestate` is bad).
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self> {
        let traceparent = parse_traceparent(traceparent)?;
        let tracestate = match tracestate {
            Some(state) => parse_tracestate(state)?,
            None => None,
        };
        Ok(TraceContext {
            traceparent,
            tracestate,
        })
    }

    /// A context from its two values as they came (headers, a stored row), leniently: none
    /// when `traceparent` is missing or does not read; a `tracestate` that does not read
    /// is left out.
    pub fn from_values(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = parse_traceparent(traceparent?).ok()?;
        let tracestate = tracestate.and_then(|s| parse_tracestate(s).ok().flatten());
        Some(TraceContext {
            traceparent,
            tracestate,
        })
    }

    /// A context built from its parts: a trace id of 32 and a parent (span) id of 16
    /// lowercase hex digits, neither all zeros.
    pub fn new(trace_id: &str, parent_id: &str, sampled: bool) -> Result<Self> {
        let flags = if sampled { "01" } else { "00" };
        Self::parse(&format!("00-{trace_id}-{parent_id}-{flags}"), None)
    }

    /// The same context with `tracestate` (checked; an empty list is none).
    pub fn with_tracestate(mut self, tracestate: &str) -> Result<Self> {
        self.tracestate = parse_tracestate(tracestate)?;
        Ok(self)
    }

    /// The `traceparent` value, version `00`.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value, if there is one.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The parent (span) id: 16 lowercase hex digits.
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the caller sampled the trace (the `sampled` flag).
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }

    /// The headers that carry it: `traceparent`, and `tracestate` if there is one.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![(TRACEPARENT, self.traceparent.clone())];
        if let Some(state) = &self.tracestate {
            headers.push((TRACESTATE, state.clone()));
        }
        headers
    }
}

impl std::fmt::Display for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.traceparent)
    }
}

fn invalid(what: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("{what}: {why}"))
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A `traceparent`, in its version-`00` form.
fn parse_traceparent(value: &str) -> Result<String> {
    let what = TRACEPARENT;
    let value = value.trim_matches([' ', '\t']);
    if !value.is_ascii() || value.len() < 55 {
        return Err(invalid(
            what,
            "must be version-traceid-parentid-flags (55 characters)",
        ));
    }
    let (version, trace_id, parent_id, flags) =
        (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
    let dashes = [2, 35, 52].iter().all(|&i| value.as_bytes()[i] == b'-');
    if !dashes {
        return Err(invalid(
            what,
            "must be version-traceid-parentid-flags, dash-separated",
        ));
    }
    if !is_lower_hex(version) || version == "ff" {
        return Err(invalid(
            what,
            format!("version {version:?} is not a version"),
        ));
    }
    // Version 00 is exactly 55 characters; a higher one may carry more, after a dash.
    if (version == "00" && value.len() != 55) || (value.len() > 55 && value.as_bytes()[55] != b'-')
    {
        return Err(invalid(
            what,
            format!("version {version} has another length"),
        ));
    }
    if !is_lower_hex(trace_id) || trace_id.bytes().all(|b| b == b'0') {
        return Err(invalid(
            what,
            "the trace id must be 32 lowercase hex digits, not all zeros",
        ));
    }
    if !is_lower_hex(parent_id) || parent_id.bytes().all(|b| b == b'0') {
        return Err(invalid(
            what,
            "the parent id must be 16 lowercase hex digits, not all zeros",
        ));
    }
    if !is_lower_hex(flags) {
        return Err(invalid(what, "the flags must be 2 lowercase hex digits"));
    }
    // Of a higher version only the sampled flag is known; the rest are not passed on.
    let flags = match version {
        "00" => flags.to_string(),
        _ => format!("{:02x}", u8::from_str_radix(flags, 16).unwrap_or(0) & 1),
    };
    Ok(format!("00-{trace_id}-{parent_id}-{flags}"))
}

/// A `tracestate`: its list members, each `key=value`, empty ones dropped; none when it
/// has no member.
fn parse_tracestate(value: &str) -> Result<Option<String>> {
    let what = TRACESTATE;
    let mut members = Vec::new();
    let mut keys = std::collections::HashSet::new();
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let Some((key, val)) = member.split_once('=') else {
            return Err(invalid(what, format!("{member:?} is not key=value")));
        };
        if !valid_key(key) {
            return Err(invalid(what, format!("{key:?} is not a key")));
        }
        if !valid_value(val) {
            return Err(invalid(
                what,
                format!("the value of {key:?} is not printable ASCII of 1 to 256 characters"),
            ));
        }
        if !keys.insert(key) {
            return Err(invalid(what, format!("{key:?} appears twice")));
        }
        members.push(member);
    }
    if members.len() > MAX_MEMBERS {
        return Err(invalid(
            what,
            format!("{} list members; at most {MAX_MEMBERS}", members.len()),
        ));
    }
    // Kept to what every platform propagates, cut as the recommendation says: members
    // over 128 characters go first, then members from the end.
    let size = |m: &[&str]| {
        m.iter()
            .map(|s| s.len() + 1)
            .sum::<usize>()
            .saturating_sub(1)
    };
    while size(&members) > MAX_TRACESTATE {
        match members.iter().rposition(|m| m.len() > 128) {
            Some(long) => members.remove(long),
            None => members.remove(members.len() - 1),
        };
    }
    Ok(Some(members.join(",")).filter(|s| !s.is_empty()))
}

/// `simple-key` (a lowercase letter, then up to 255 of `a-z0-9_-*/`), or
/// `tenant@system` (a tenant of up to 241 starting with a letter or digit, a system of up
/// to 14 starting with a letter).
fn valid_key(key: &str) -> bool {
    let rest = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/".contains(&b))
    };
    match key.split_once('@') {
        None => {
            (1..=256).contains(&key.len()) && key.as_bytes()[0].is_ascii_lowercase() && rest(key)
        }
        Some((tenant, system)) => {
            (1..=241).contains(&tenant.len())
                && (1..=14).contains(&system.len())
                && (tenant.as_bytes()[0].is_ascii_lowercase()
                    || tenant.as_bytes()[0].is_ascii_digit())
                && system.as_bytes()[0].is_ascii_lowercase()
                && rest(tenant)
                && rest(system)
        }
    }
}

/// 1 to 256 printable ASCII characters but `,` and `=`, not ending in a space.
fn valid_value(value: &str) -> bool {
    (1..=256).contains(&value.len())
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
        && !value.ends_with(' ')
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_context_reads_and_gives_its_parts() {
        let c = TraceContext::parse(TP, Some("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(c.traceparent(), TP);
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.parent_id(), "00f067aa0ba902b7");
        assert!(c.sampled());
        assert_eq!(
            c.tracestate(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        assert_eq!(
            c.headers(),
            vec![
                (TRACEPARENT, TP.to_string()),
                (
                    TRACESTATE,
                    "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".to_string()
                )
            ]
        );
        let unsampled = TraceContext::new(c.trace_id(), c.parent_id(), false).unwrap();
        assert!(!unsampled.sampled());
        assert_eq!(unsampled.headers().len(), 1);
    }

    #[test]
    fn a_bad_traceparent_is_refused_with_its_reason() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for value in bad {
            match TraceContext::parse(value, None) {
                Err(Error::InvalidInput(why)) => assert!(why.starts_with("traceparent"), "{why}"),
                other => panic!("{value:?}: {other:?}"),
            }
            assert_eq!(TraceContext::from_values(Some(value), None), None);
        }
        assert_eq!(TraceContext::from_values(None, Some("a=b")), None);
    }

    #[test]
    fn a_higher_version_is_read_and_kept_as_version_00() {
        let c = TraceContext::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-what-comes-next",
            None,
        )
        .unwrap();
        assert_eq!(
            c.traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn a_bad_tracestate_is_refused_or_left_out() {
        let bad = [
            "novalue",
            "Upper=1",
            "1abc=1",
            "a=b,a=c",
            "a=has,comma",
            "a=b=c",
            "a=\u{7f}",
            "a@=1",
            "a@1system=1",
            &(0..33)
                .map(|i| format!("k{i}=v"))
                .collect::<Vec<_>>()
                .join(","),
            &format!("a={}", "x".repeat(257)),
        ];
        for value in bad {
            match TraceContext::parse(TP, Some(value)) {
                Err(Error::InvalidInput(why)) => assert!(why.starts_with("tracestate"), "{why}"),
                other => panic!("{value:?}: {other:?}"),
            }
            let kept = TraceContext::from_values(Some(TP), Some(value)).unwrap();
            assert_eq!((kept.traceparent(), kept.tracestate()), (TP, None));
        }
        // Over 512 bytes: cut, the members over 128 characters first, then from the end.
        let long = format!("big={}", "x".repeat(200));
        let many: Vec<String> = (0..20)
            .map(|i| format!("k{i:02}={}", "y".repeat(20)))
            .collect();
        let state = format!("{},{long},{}", many[..10].join(","), many[10..].join(","));
        let cut = TraceContext::parse(TP, Some(&state)).unwrap();
        let kept = cut.tracestate().unwrap();
        assert!(kept.len() <= 512 && !kept.contains("big="), "{kept}");
        assert_eq!(kept, many[..kept.split(',').count()].join(","));
        assert_eq!(kept.split(',').count(), 20, "20 of 24 bytes each fit");
        let thirty: Vec<String> = (0..30)
            .map(|i| format!("k{i:02}={}", "y".repeat(20)))
            .collect();
        let cut = TraceContext::parse(TP, Some(&thirty.join(","))).unwrap();
        assert_eq!(cut.tracestate(), Some(thirty[..20].join(",").as_str()));
        let ok = TraceContext::parse(TP, Some(" , 12tenant@vendor=x-y , ")).unwrap();
        assert_eq!(ok.tracestate(), Some("12tenant@vendor=x-y"));
        assert_eq!(
            TraceContext::parse(TP, Some(" , ")).unwrap().tracestate(),
            None
        );
    }
}
