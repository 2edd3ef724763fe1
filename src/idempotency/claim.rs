//! The claim: the lock and the judgement of "one lock, two judgements, three updates"
//! (the outcome table in `docs/idempotency.md`), and the Redis front's part in it.

use std::time::Duration;

use serde::Serialize;
use tracing::Instrument;

use super::claims::Owned;
use super::{
    CLAIM_ROUNDS, Claim, Claimed, NewClaim, RecordRow, RecordStore, Records, Stored, millis,
};
use crate::coalesce::queue::Entered;
use crate::error::Error;
use crate::error::Result;
use crate::store::{ErrorClass, Lease, db_error};
use crate::support::input::{fingerprint_of, validate_reference};

impl<S: RecordStore> Records<S> {
    /// Claims `(scope, key)` for a request with `payload` (any serializable value; `&()`
    /// for none). The outcome table is in `docs/idempotency.md`.
    pub async fn claim<P: Serialize + ?Sized>(
        &self,
        scope: &str,
        key: &str,
        payload: &P,
    ) -> Result<Claim> {
        let span = tracing::info_span!("orderly.claim", scope, outcome = tracing::field::Empty);
        let out = match fingerprint_of(payload) {
            Ok(hash) => {
                // A caller that stops waiting leaves the claim to finish off its task (its
                // connection goes back warm); a claim granted to nobody is released.
                let (records, scope, key) = (self.clone(), scope.to_string(), key.to_string());
                let releaser = self.clone();
                crate::support::detach::finished_off_task(
                    self.deadline,
                    true,
                    async move { records.claim_now(&scope, &key, &hash).await },
                    move |answer| async move {
                        if let Ok(Claim::Claimed(held)) = answer
                            && let Err(e) = releaser.release(&held).await
                        {
                            tracing::warn!(error = %e, key = held.key, "releasing a claim its caller left failed; it is claimable again when its lease runs out");
                        }
                    },
                )
                .instrument(span.clone())
                .await
            }
            Err(e) => Err(e),
        };
        let outcome = match &out {
            Ok(Claim::Claimed(_)) => "claimed",
            Ok(Claim::Replayed(_)) => "replayed",
            Err(e) => crate::observe::error_label(e),
        };
        span.record("outcome", outcome);
        // A label names only a scope this instance knows: a caller's unknown one could
        // be anything.
        let label = if self.scope_config(scope).is_some() {
            scope
        } else {
            "unknown"
        };
        crate::observe::claim(label, outcome);
        out
    }

    async fn claim_now(&self, scope: &str, key: &str, hash: &str) -> Result<Claim> {
        let config = self.config(scope)?;
        validate_reference("an idempotency key", key)?;
        let hash = hash.to_string();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let claim = NewClaim {
            scope,
            key,
            payload_hash: Some(&hash),
            token: &token,
            lease_ms: millis(config.lease),
            retention_ms: millis(config.retention),
        };
        let marker = self.mark(&claim, config.lease).await?;
        match self.claim_db(&claim, &hash).await {
            // Granted: whoever set the pending marker, this claim's held one replaces it.
            Ok(Claim::Claimed(held)) => {
                let marker = self.hold(&claim, config.lease).await;
                Ok(Claim::Claimed(Claimed { marker, ..held }))
            }
            other => {
                if let Some(marker) = &marker {
                    self.unmark(scope, key, marker).await;
                }
                other
            }
        }
    }

    /// The claim in the database.
    async fn claim_db(&self, claim: &NewClaim<'_>, hash: &str) -> Result<Claim> {
        let (scope, key, token) = (claim.scope, claim.key, claim.token);
        let claimed = |attempt| {
            Claim::Claimed(Claimed {
                scope: scope.to_string(),
                key: key.to_string(),
                token: token.to_string(),
                attempt,
                marker: None,
            })
        };
        let repeat = |answer: Result<Claim>| {
            self.first.note(true);
            answer
        };
        if self.first.reads_first() {
            // A read that fails leaves the claim's write to settle it.
            let row = self.read(scope, key).await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, scope, key, "read before the claim failed");
                None
            });
            match judge(row.as_ref(), hash, token, scope, key) {
                Ok(Seen::Claimable) => {}
                Ok(Seen::Mine(attempt)) => return Ok(claimed(attempt)),
                Ok(Seen::Done(stored)) => return repeat(Ok(Claim::Replayed(stored))),
                Err(e) => return repeat(Err(e)),
            }
        }
        for round in 0..CLAIM_ROUNDS {
            if crate::support::detach::abandoned() {
                // Its caller left before this round's claim was sent: it never is.
                return Err(Error::DeadlineExceeded {
                    deadline: self.deadline,
                    in_doubt: round > 0,
                });
            }
            let once = match (round, &self.claims) {
                (0, Some(claims)) => match claims.turn(|| Owned::new(claim)) {
                    Entered::Alone(slot) => {
                        let once = self.claim_once(claim).await;
                        slot.hand_on();
                        once
                    }
                    // Held by the batch's statement; or nothing written for it, or the
                    // batch failed (the sender dropped): the read below tells which. (A
                    // caller that leaves while queued is left out of the next batch, or,
                    // if its batch was on its way, its claim is released by the batch.)
                    Entered::Queued(answer) => Ok(answer.await.ok().flatten()),
                },
                _ => self.claim_once(claim).await,
            };
            match once {
                Ok(Some(attempt)) => {
                    self.first.note(false);
                    return Ok(claimed(attempt));
                }
                Ok(None) => {}
                // The claim may have committed with its acknowledgement lost: the read
                // below recognises the record as this claim's own by its token.
                Err(e) if S::classify(&e) != ErrorClass::Fatal => {
                    tracing::debug!(error = %e, scope, key, "claim failed; reading the record");
                }
                Err(e) => return Err(db_error::<S>(e)),
            }
            let row = self.read(scope, key).await.map_err(db_error::<S>)?;
            match judge(row.as_ref(), hash, token, scope, key) {
                Ok(Seen::Claimable) => continue,
                Ok(Seen::Mine(attempt)) => return Ok(claimed(attempt)),
                Ok(Seen::Done(stored)) => return repeat(Ok(Claim::Replayed(stored))),
                Err(e) => return repeat(Err(e)),
            }
        }
        Err(Error::Contention {
            attempts: CLAIM_ROUNDS,
        })
    }

    /// The claim statement on a pooled connection (closed unless the statement ran to its
    /// end, as for every statement below).
    async fn claim_once(&self, claim: &NewClaim<'_>) -> Result<Option<i32>, sqlx::Error> {
        let mut lease = Lease::acquire_for_write(&self.store).await?;
        if crate::support::detach::abandoned() {
            // Its caller left while it waited for the connection: nothing is sent.
            lease.release();
            return Ok(None);
        }
        let out = self.store.claim(lease.conn(), claim).await;
        lease.release_after(&out);
        out
    }

    /// Asks the Redis front, if there is one: the marker this claim set, or
    /// [`Error::InFlight`] if an identical request holds one.
    async fn mark(&self, claim: &NewClaim<'_>, lease: Duration) -> Result<Option<String>> {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.front {
            let hash = claim.payload_hash.unwrap_or_default();
            return match front
                .mark(claim.scope, claim.key, hash, claim.token, lease)
                .await
            {
                super::front::Mark::Set => Ok(Some(claim.token.to_string())),
                super::front::Mark::Held(retry_after) => Err(Error::InFlight {
                    scope: claim.scope.to_string(),
                    key: claim.key.to_string(),
                    retry_after,
                }),
                super::front::Mark::Pass => Ok(None),
            };
        }
        let _ = (claim, lease);
        Ok(None)
    }

    /// Tells the Redis front that this claim was granted: its held marker now sheds
    /// identical requests. The token the marker is under, if there is a front.
    async fn hold(&self, claim: &NewClaim<'_>, lease: Duration) -> Option<String> {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.front {
            let hash = claim.payload_hash.unwrap_or_default();
            front
                .hold(claim.scope, claim.key, hash, claim.token, lease)
                .await;
            return Some(claim.token.to_string());
        }
        let _ = (claim, lease);
        None
    }
}

/// What a read of the record says to a claim.
enum Seen {
    /// Absent, expired, its lease run out, or failed retryably: claim again.
    Claimable,
    /// This claim's own (its commit's acknowledgement was lost).
    Mine(i32),
    /// Finished: replay it.
    Done(Stored),
}

/// The outcome table of a claim, on a record as read. The payload is checked before
/// anything else but absence: a changed payload is a mismatch even while the first
/// request runs.
fn judge(row: Option<&RecordRow>, hash: &str, token: &str, scope: &str, key: &str) -> Result<Seen> {
    let Some(row) = row.filter(|r| r.expired == 0) else {
        return Ok(Seen::Claimable);
    };
    if row.owner_token.as_deref() == Some(token) && row.status == "PROCESSING" {
        return Ok(Seen::Mine(row.attempt));
    }
    if row.payload_hash.as_deref() != Some(hash) {
        return Err(Error::PayloadMismatch {
            subject: format!("scope {scope}"),
            reference: key.to_string(),
        });
    }
    match row.status.as_str() {
        "PROCESSING" if row.lease_left_ms > 0 => Err(Error::InFlight {
            scope: scope.to_string(),
            key: key.to_string(),
            retry_after: Duration::from_millis(row.lease_left_ms.unsigned_abs()),
        }),
        "PROCESSING" => Ok(Seen::Claimable),
        // orderly always stores a completed request's result; a row without one was
        // written behind its back, and replaying it as `null` would be an answer made up.
        "SUCCEEDED" => match &row.result {
            Some(result) => Ok(Seen::Done(Stored::Succeeded(result.clone()))),
            None => Err(Error::CorruptRecord {
                scope: scope.to_string(),
                key: key.to_string(),
                value: "SUCCEEDED with no result".into(),
            }),
        },
        "FAILED" if row.terminal => Ok(Seen::Done(Stored::Failed(row.result.clone()))),
        "FAILED" => Ok(Seen::Claimable),
        other => Err(Error::CorruptRecord {
            scope: scope.to_string(),
            key: key.to_string(),
            value: other.to_string(),
        }),
    }
}
