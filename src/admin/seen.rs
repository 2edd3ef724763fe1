//! Who is looking at a request (with their CSRF token), and the answers every page and
//! action gives when it cannot go on.

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::page::Frame;
use super::panel::App;
use super::{Access, AdminStore};
use crate::error::Error;

/// Who is looking at this request, and how to answer: the frame of the page, and
/// whether JSON was asked for (`?format=json`).
pub(super) struct Seen {
    pub(super) frame: Frame,
    pub(super) json: bool,
    /// Why the request came from another site, if the browser says it did
    /// (`Sec-Fetch-Site`, or an `Origin` that is not the request's own host).
    pub(super) cross_site: Option<String>,
    /// The browser's session with the page, which its CSRF tokens are bound to: its
    /// cookie's value, or one drawn now.
    pub(super) session: String,
    /// The `Set-Cookie` value that gives the browser the session drawn now, if it had none.
    pub(super) new_session: Option<String>,
}

/// The cookie naming the browser's session with the page.
const SESSION_COOKIE: &str = "orderly_admin_session";

/// The session the request's cookie names, if it holds one this page could have drawn
/// (32 hexadecimal digits).
fn session_of(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|c| c.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
        .find(|v| v.len() == 32 && v.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_string)
}

/// Whether the request came over HTTPS, as its URI or its proxy
/// (`X-Forwarded-Proto`) says: the session cookie is then sent over HTTPS only.
fn over_https(parts: &Parts) -> bool {
    parts.uri.scheme_str() == Some("https")
        || parts
            .headers
            .get("x-forwarded-proto")
            .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// Why a request came from another site, by what the browser sent: `Sec-Fetch-Site`
/// other than `same-origin` or `none` (typed or bookmarked); without it, an `Origin`
/// whose host is not the request's `Host` (`null` included). A client that sends neither (a script, a test) is not
/// judged here: the CSRF token is.
fn cross_site(parts: &Parts) -> Option<String> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    // A browser that says where the request came from is believed; one that does not
    // is judged by its `Origin`.
    if let Some(site) = header("sec-fetch-site") {
        return (site != "same-origin" && site != "none")
            .then(|| format!("Sec-Fetch-Site: {site}"));
    }
    let origin = header("origin")?;
    // The request's host: its `Host` header, or over HTTP/2 the URI's authority.
    let host = header("host")
        .or_else(|| parts.uri.authority().map(ToString::to_string))
        .unwrap_or_default();
    let origin_host = origin
        .split_once("://")
        .map_or(origin.as_str(), |(_, rest)| rest);
    (!origin_host.eq_ignore_ascii_case(&host))
        .then(|| format!("Origin: {origin}, not this page's host {host}"))
}

impl<S: AdminStore> FromRequestParts<App<S>> for Seen {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, Response> {
        let viewer = (app.resolver)(parts);
        if viewer.access == Access::None {
            return Err(refused("this page is not yours to see"));
        }
        let path = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(path, |o| o.0.path());
        // The mount point: the original path less the router's own.
        let mount = original
            .strip_suffix(path)
            .unwrap_or_else(|| original.trim_end_matches('/'));
        let mount = mount.trim_end_matches('/');
        let base = format!("{mount}/");
        let home = if mount.is_empty() {
            "/".to_string()
        } else {
            mount.to_string()
        };
        // A NUL in a query value is no text a database takes (PostgreSQL refuses it):
        // a 400, before any read.
        if let Some(query) = parts.uri.query()
            && form_urlencoded::parse(query.as_bytes())
                .any(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            return Err((StatusCode::BAD_REQUEST, "a query value holds a NUL").into_response());
        }
        let json = parts
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "format=json"));
        // A browser without a session is given one with the page: the tokens of its
        // forms hold in that session only (the cookie is the page's, sent to no script
        // and with no POST from another site; `Lax`, not `Strict`, so that a link
        // followed from elsewhere keeps the session of the tabs already open).
        let (session, new_session) = match session_of(parts) {
            Some(session) => (session, None),
            None => {
                let session = hex::encode(uuid::Uuid::new_v4().as_bytes());
                let secure = if over_https(parts) { "; Secure" } else { "" };
                let cookie = format!(
                    "{SESSION_COOKIE}={session}; Path={home}; HttpOnly; SameSite=Lax{secure}"
                );
                (session, Some(cookie))
            }
        };
        Ok(Seen {
            frame: Frame {
                base,
                csrf: app.csrf(&viewer.who, &session),
                home,
                who: viewer.who,
                access: viewer.access,
            },
            json,
            cross_site: cross_site(parts),
            session,
            new_session,
        })
    }
}

/// 403, with why.
pub(super) fn refused(why: &str) -> Response {
    (StatusCode::FORBIDDEN, why.to_string()).into_response()
}

/// The answer to a failed read: 503 for what may pass, 500 otherwise; the error as text.
pub(super) fn failed(e: &Error) -> Response {
    let status = if e.is_retryable() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (status, e.to_string()).into_response()
}
