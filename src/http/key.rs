//! The `Idempotency-Key` header: its value (a Structured Field string, `"…"`, or the bare
//! token many clients send), and the record key it becomes, scoped by principal (and,
//! if asked, by method and route).

use http::HeaderMap;
use sha2::{Digest, Sha256};

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest key a client may send, in characters (printable ASCII).
pub const MAX_CLIENT_KEY: usize = 200;

/// Why a request's key was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    /// No `Idempotency-Key` header.
    Missing,
    /// Present but not a key: what is wrong with it.
    Malformed(&'static str),
}

/// The client's key in `headers`, if there is one.
pub(crate) fn client_key(headers: &HeaderMap) -> Result<String, KeyProblem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Err(KeyProblem::Missing);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Malformed("the header is sent more than once"));
    }
    let raw = value
        .to_str()
        .map_err(|_| KeyProblem::Malformed("the key is not printable ASCII"))?
        .trim_matches(|c| c == ' ' || c == '\t');
    let key = match raw.strip_prefix('"') {
        Some(quoted) => sf_string(quoted)?,
        None => raw.to_string(),
    };
    if key.is_empty() {
        return Err(KeyProblem::Malformed("the key is empty"));
    }
    if key.starts_with(' ') || key.ends_with(' ') {
        return Err(KeyProblem::Malformed("the key begins or ends with a space"));
    }
    if key.chars().count() > MAX_CLIENT_KEY {
        return Err(KeyProblem::Malformed(
            "the key is longer than 200 characters",
        ));
    }
    if !key.chars().all(|c| (' '..='~').contains(&c)) {
        return Err(KeyProblem::Malformed("the key is not printable ASCII"));
    }
    Ok(key)
}

/// The rest of a Structured Field string after its opening quote (RFC 8941, 3.3.3):
/// `\"` and `\\` are the only escapes, and nothing may follow the closing quote.
fn sf_string(rest: &str) -> Result<String, KeyProblem> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err(KeyProblem::Malformed("a bad escape in the quoted key")),
            },
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyProblem::Malformed("text after the quoted key"))
                };
            }
            c => out.push(c),
        }
    }
    Err(KeyProblem::Malformed("the quoted key is not closed"))
}

/// The record key of a client's key: 16 hex digits naming its scope (the principal, and
/// the method and route where keys are scoped by them), a colon, the client's key.
pub(crate) fn record_key(principal: &str, route_scope: Option<(&str, &str)>, key: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(principal.as_bytes());
    if let Some((method, route)) = route_scope {
        hash.update([0]);
        hash.update(method.as_bytes());
        hash.update([0]);
        hash.update(route.as_bytes());
    }
    let digest = hex::encode(hash.finalize());
    format!("{}:{key}", &digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key_of(values: &[&[u8]]) -> Result<String, KeyProblem> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        client_key(&headers)
    }

    #[test]
    fn keys_are_read_quoted_or_bare_and_refused_when_malformed() {
        assert_eq!(key_of(&[b"\"abc-1\""]), Ok("abc-1".into()));
        assert_eq!(key_of(&[b"abc-1"]), Ok("abc-1".into()));
        assert_eq!(key_of(&[br#""a\"b\\c""#]), Ok(r#"a"b\c"#.into()));
        assert_eq!(key_of(&[]), Err(KeyProblem::Missing));
        for bad in [
            &b"\"\""[..],
            b"\"abc",
            b"\"abc\"x",
            br#""a\nb""#,
            b"\" a\"",
            b"\"a \"",
            b"\xff\xfe",
            b"",
        ] {
            assert!(
                matches!(key_of(&[bad]), Err(KeyProblem::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            key_of(&[b"a", b"b"]),
            Err(KeyProblem::Malformed(_))
        ));
        let long = vec![b'k'; MAX_CLIENT_KEY + 1];
        assert!(matches!(key_of(&[&long]), Err(KeyProblem::Malformed(_))));
        let longest = vec![b'k'; MAX_CLIENT_KEY];
        assert!(key_of(&[&longest]).is_ok());
    }

    #[test]
    fn record_keys_differ_by_principal_and_optionally_by_route() {
        let a = record_key("alice", None, "k");
        assert_eq!(a.len(), 18);
        assert!(a.ends_with(":k"));
        assert_ne!(a, record_key("bob", None, "k"));
        assert_ne!(
            record_key("alice", Some(("POST", "/a")), "k"),
            record_key("alice", Some(("POST", "/b")), "k")
        );
        assert_eq!(a, record_key("alice", None, "k"));
    }
}
