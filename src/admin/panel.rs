//! The page itself: what it shows (its stores, flows, records and machines), who may
//! look, and the key its CSRF tokens and notices are signed with.

use std::sync::Arc;

use axum::http::request::Parts;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{AdminStore, Machines, Resolver, Viewer};
use crate::error::Error;
use crate::flow::Flows;
use crate::idempotency::Records;

/// The operators' page over a store: build it, then mount [`router`](Self::router).
pub struct Admin<S: AdminStore> {
    pub(super) store: S,
    pub(super) flows: Option<Flows<S>>,
    pub(super) records: Option<Records<S>>,
    pub(super) machines: Machines<S>,
    pub(super) resolver: Resolver,
    /// The key of the viewers' CSRF tokens: random for each page built, unless given.
    secret: Vec<u8>,
    /// How long a CSRF token a page drew is taken.
    csrf_lifetime: std::time::Duration,
    /// The overview's counts over the last hour.
    pub(super) trend: super::trend::Trend,
    /// How often they are sampled.
    pub(super) sample_every: std::time::Duration,
    /// The page's reads at work at once ([`READS_AT_ONCE`]).
    pub(super) reads: tokio::sync::Semaphore,
}

impl<S: AdminStore> std::fmt::Debug for Admin<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("machines", &self.machines.keys().collect::<Vec<_>>())
            .field("flows", &self.flows.is_some())
            .field("records", &self.records.is_some())
            .finish_non_exhaustive()
    }
}

pub(super) type App<S> = Arc<Admin<S>>;

/// How many rows a list shows, and how far a count goes.
pub(crate) const LIST_MAX: u32 = 500;

/// How many rows a list shows.
pub(super) const PAGE: u32 = LIST_MAX;

/// How many of the page's reads run at once, however many look at it: each holds a
/// connection of the pool the engine uses.
pub(crate) const READS_AT_ONCE: usize = 3;

/// How long a CSRF token is taken by default: a working day.
const CSRF_LIFETIME: std::time::Duration = std::time::Duration::from_secs(8 * 3600);

/// How far ahead another replica's clock may run: a token it drew expires at most this
/// much later than one drawn here would.
const CLOCK_SLACK_SECS: u64 = 60;

/// Seconds since the epoch, by this process's clock.
/// What a CSRF token signs: the viewer, their browser session, when it expires.
fn csrf_text(who: &str, session: &str, expires: u64) -> String {
    format!("csrf\u{0}{who}\u{0}{session}\u{0}{expires}")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl<S: AdminStore> Admin<S> {
    /// The page over `store`, showing its outbox, timers and audit trail; add the flows
    /// ([`flows`](Self::flows)), the machines ([`machine`](Self::machine)) and who may
    /// look ([`access`](Self::access): until then every request is refused).
    pub fn new(store: S) -> Self {
        let mut secret = [0u8; 32];
        secret[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        secret[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Admin {
            store,
            flows: None,
            records: None,
            machines: Machines::new(),
            resolver: Arc::new(|_: &Parts| Viewer::none()),
            secret: secret.to_vec(),
            csrf_lifetime: CSRF_LIFETIME,
            trend: super::trend::Trend::default(),
            sample_every: super::trend::SAMPLE_EVERY,
            reads: tokio::sync::Semaphore::new(READS_AT_ONCE),
        }
    }

    /// The CSRF token of `who` in the browser session `session` (the page's session
    /// cookie), drawn now: when it expires (seconds since the epoch), and an HMAC of their
    /// name, the session and that time under this page's key.
    pub(super) fn csrf(&self, who: &str, session: &str) -> String {
        let expires = unix_now().saturating_add(self.csrf_lifetime.as_secs().max(1));
        let mac = self.mac(&csrf_text(who, session, expires));
        format!("{expires}.{}", hex::encode(mac.finalize().into_bytes()))
    }

    /// Whether `token` is a CSRF token this page drew for `who` in `session` and it has
    /// not expired (the HMAC compared in constant time).
    pub(super) fn csrf_holds(&self, who: &str, session: &str, token: &str) -> bool {
        let Some((expires, mac)) = token.split_once('.') else {
            return false;
        };
        let Ok(at) = expires.parse::<u64>() else {
            return false;
        };
        let now = unix_now();
        // A replica whose clock runs ahead draws tokens a little later to expire.
        let latest = now
            .saturating_add(self.csrf_lifetime.as_secs().max(1))
            .saturating_add(CLOCK_SLACK_SECS);
        now < at && at <= latest && self.holds(&csrf_text(who, session, at), mac)
    }

    /// How long a CSRF token a page draws is taken (default 8 hours, at least a
    /// second): a form left open longer is refused, and drawn again by reloading it.
    pub fn csrf_lifetime(mut self, lifetime: std::time::Duration) -> Self {
        self.csrf_lifetime = lifetime.max(std::time::Duration::from_secs(1));
        self
    }

    /// How often the overview's counts are sampled for its charts of the last hour
    /// (default 15 s, at least 100 ms). The sampling starts with the first look at the
    /// overview and reads the overview's counts each time.
    pub fn sample_every(mut self, every: std::time::Duration) -> Self {
        self.sample_every = every.max(std::time::Duration::from_millis(100));
        self
    }

    fn mac(&self, who: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key");
        mac.update(who.as_bytes());
        mac
    }

    /// The signature of a notice this page shows after an action.
    pub(super) fn sign(&self, notice: &str) -> String {
        let mac = self.mac(&format!("notice\u{0}{notice}"));
        hex::encode(mac.finalize().into_bytes())
    }

    /// Whether `sig` is this page's signature of `notice`.
    pub(super) fn signed(&self, notice: &str, sig: &str) -> bool {
        self.holds(&format!("notice\u{0}{notice}"), sig)
    }

    /// Whether `mac` (hexadecimal) is this page's HMAC of `text`.
    fn holds(&self, text: &str, mac: &str) -> bool {
        hex::decode(mac).is_ok_and(|bytes| self.mac(text).verify_slice(&bytes).is_ok())
    }

    /// The same page with the key of its CSRF tokens (and notices) set, so that every
    /// replica of the service accepts the forms any of them drew. At least 32 bytes,
    /// kept secret; [`Error::InvalidInput`] otherwise. By default a random key is drawn
    /// for each page built.
    pub fn csrf_key(mut self, key: &[u8]) -> crate::error::Result<Self> {
        if key.len() < 32 {
            return Err(Error::InvalidInput(
                "a CSRF key is at least 32 bytes".into(),
            ));
        }
        self.secret = key.to_vec();
        Ok(self)
    }
}
