//! A response as the record keeps it: status, the headers a replay may repeat, and the
//! body (base64), or only the status where the body was too large or streamed.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::header::{CONNECTION, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

/// Headers a replay never repeats: hop-by-hop (RFC 9110, 7.6.1), the message's framing
/// (recomputed for the replay), `date` (the replay's own), `set-cookie` (a session is
/// not handed to whoever holds the key).
const NOT_REPLAYED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "date",
    "set-cookie",
];

/// The record's result for a finished request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// `(name, base64 of the value)`, in order.
    pub headers: Vec<(String, String)>,
    /// The body, base64; `None` where it was not kept (too large or streamed).
    pub body: Option<String>,
}

impl StoredResponse {
    /// The replayable parts of a response, with its whole body.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: Option<&[u8]>) -> Self {
        // The headers `Connection` names are hop-by-hop too.
        let named: Vec<String> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        StoredResponse {
            status: status.as_u16(),
            headers: headers
                .iter()
                .filter(|(name, _)| {
                    !NOT_REPLAYED.contains(&name.as_str())
                        && !named.iter().any(|t| t == name.as_str())
                })
                .map(|(name, value)| (name.to_string(), STANDARD.encode(value.as_bytes())))
                .collect(),
            body: body.map(|b| STANDARD.encode(b)),
        }
    }

    /// Status, headers and body to send again; `None` if the record holds something
    /// that is not a response this layer stored.
    pub fn parts(&self) -> Option<(StatusCode, HeaderMap, Option<Bytes>)> {
        let status = StatusCode::from_u16(self.status).ok()?;
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let value = HeaderValue::from_bytes(&STANDARD.decode(value).ok()?).ok()?;
            headers.append(name, value);
        }
        let body = match &self.body {
            Some(b) => Some(Bytes::from(STANDARD.decode(b).ok()?)),
            None => None,
        };
        Some((status, headers, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_round_trips_without_the_headers_a_replay_must_not_repeat() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-trace", HeaderValue::from_bytes(b"a\xffb").unwrap());
        headers.append("x-trace", HeaderValue::from_static("second"));
        for name in NOT_REPLAYED {
            headers.insert(*name, HeaderValue::from_static("gone"));
        }
        headers.insert("connection", HeaderValue::from_static("close, X-Hop"));
        headers.insert("x-hop", HeaderValue::from_static("gone"));
        let stored = StoredResponse::new(StatusCode::CREATED, &headers, Some(b"{\"id\":1}"));
        let text = serde_json::to_string(&stored).unwrap();
        let back: StoredResponse = serde_json::from_str(&text).unwrap();
        let (status, replayed, body) = back.parts().unwrap();
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(body.as_deref(), Some(&b"{\"id\":1}"[..]));
        assert_eq!(replayed.len(), 3);
        let traces: Vec<_> = replayed.get_all("x-trace").iter().collect();
        assert_eq!(traces, [&b"a\xffb"[..], b"second"]);
        for name in NOT_REPLAYED.iter().chain(&["x-hop"]) {
            assert!(replayed.get(*name).is_none(), "{name} replayed");
        }
    }

    #[test]
    fn a_foreign_result_is_not_taken_for_a_response() {
        let bad = StoredResponse {
            status: 42,
            headers: vec![],
            body: None,
        };
        assert!(bad.parts().is_none());
        let bad = StoredResponse {
            status: 200,
            headers: vec![("bad name".into(), String::new())],
            body: None,
        };
        assert!(bad.parts().is_none());
    }
}
