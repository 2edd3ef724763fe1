//! One-time tokens: the server issues a random token before the request (a form, a
//! checkout page), the request carries it, and consuming it succeeds once.

use std::time::Duration;

use super::{MAX_SPAN, RecordStore, Records, millis};
use crate::error::Error;
use crate::error::Result;
use crate::error::TokenRejection;
use crate::store::{Lease, db_error};
use crate::support::input::validate_reference;

impl<S: RecordStore> Records<S> {
    /// Issues a new one-time token for `scope` (a known scope), valid for `ttl`: 128
    /// random bits as 32 hex characters. A `ttl` under a millisecond or over 100 years is
    /// [`Error::InvalidInput`].
    pub async fn issue(&self, scope: &str, ttl: Duration) -> Result<String> {
        self.config(scope)?;
        if ttl < Duration::from_millis(1) || ttl > MAX_SPAN {
            return Err(Error::InvalidInput(
                "a token's time to live must be between a millisecond and 100 years".into(),
            ));
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self
            .store
            .issue_token(lease.conn(), scope, &token, millis(ttl))
            .await;
        lease.release_after(&out);
        out.map_err(db_error::<S>)?;
        Ok(token)
    }

    /// Consumes `token` of `scope`: `Ok` exactly once, for the first request to arrive
    /// (one conditional update, so 64 racing requests get one `Ok`). Later, or for a
    /// token never issued or expired, [`Error::TokenRejected`] says why; nothing changes.
    ///
    /// A connection lost after the update was sent is a retryable database error, and
    /// the token may have been consumed: a retry of that request is then rejected as
    /// [`TokenRejection::Used`]. Pair a token with an idempotency key where the request
    /// itself must survive that.
    pub async fn consume(&self, scope: &str, token: &str) -> Result<()> {
        self.config(scope)?;
        validate_reference("a one-time token", token)?;
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self.store.consume_token(lease.conn(), scope, token).await;
        lease.release_after(&out);
        if out.map_err(db_error::<S>)? {
            return Ok(());
        }
        let mut lease = Lease::acquire(&self.store).await.map_err(db_error::<S>)?;
        let out = self.store.read_token(lease.conn(), scope, token).await;
        lease.release_after(&out);
        let reason = match out.map_err(db_error::<S>)? {
            None => TokenRejection::Unknown,
            Some(row) if row.used => TokenRejection::Used,
            Some(row) if row.expired != 0 => TokenRejection::Expired,
            // Unused and live now, yet the update found nothing to take: the row did not
            // exist when the update ran.
            Some(_) => TokenRejection::Unknown,
        };
        Err(Error::TokenRejected {
            scope: scope.to_string(),
            reason,
        })
    }
}
