//! The round whose claim is a lease written under a token of its own, fenced by that
//! token in every later statement.

use super::{Relay, RelayRound, set_aside, sort_out};
use crate::error::Result;
use crate::outbox::{EventKey, FailedEvent, OutboxStore, Sink, millis};
use crate::store::Lease;
use crate::support::text::bounded;

impl<S: OutboxStore, K: Sink> Relay<S, K> {
    /// A round whose claim is a lease written under a token of its own.
    pub(super) async fn leased_round(&self) -> Result<RelayRound> {
        let store = self.outbox.store();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let claim = crate::outbox::ClaimEvents {
            token: &token,
            lease_ms: millis(self.config.lease),
            limit: i64::from(self.config.batch),
        };
        let claimed = Lease::run(store, async |c| store.claim_events(c, &claim).await).await?;
        let mut round = RelayRound {
            claimed: claimed.len(),
            ..RelayRound::default()
        };
        if claimed.is_empty() {
            return Ok(round);
        }
        let (rows, corrupt) = sort_out(claimed);
        for (key, reason) in corrupt {
            self.set_aside_leased(key, &reason, &token, &mut round)
                .await;
        }
        let (published, failed) = self.publish_batch(&rows).await;
        if !published.is_empty() {
            let marked = Lease::run(store, async |c| {
                store.mark_published(c, &token, &published).await
            })
            .await?;
            let marked = usize::try_from(marked).unwrap_or(0);
            round.published = marked;
            round.lost += published.len().saturating_sub(marked);
        }
        let mut unrecorded = None;
        for (key, attempts, error) in failed {
            let (error, retry_in_ms, dead) = self.failure(&key, attempts, error);
            let failure = FailedEvent {
                key: &key,
                token: &token,
                error: &error,
                retry_in_ms,
                dead,
            };
            // One failure that cannot be recorded does not keep the others from being
            // recorded: it is due again when its claim runs out.
            match Lease::run(store, async |c| store.mark_failed(c, &failure).await).await {
                Ok(false) => round.lost += 1,
                Ok(true) if dead => round.dead += 1,
                Ok(true) => round.retried += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "recording a failed publish failed");
                    unrecorded = Some(e);
                }
            }
        }
        match unrecorded {
            Some(e) if round.published + round.retried + round.dead == 0 => Err(e),
            _ => Ok(round),
        }
    }

    /// A claimed row that must not be published: dead, with the reason, under the
    /// claim's token. One whose key did not read is left to its lease.
    async fn set_aside_leased(
        &self,
        key: Option<EventKey>,
        reason: &str,
        token: &str,
        round: &mut RelayRound,
    ) {
        let store = self.outbox.store();
        round.corrupt += 1;
        let Some(key) = set_aside(key, reason) else {
            return;
        };
        let error = bounded(format!("corrupt row: {reason}"));
        let failure = FailedEvent {
            key: &key,
            token,
            error: &error,
            retry_in_ms: 0,
            dead: true,
        };
        let mark =
            async { Lease::run(store, async |c| store.mark_failed(c, &failure).await).await };
        match mark.await {
            Ok(true) => {}
            Ok(false) => round.lost += 1,
            Err(e) => tracing::warn!(error = %e, ?key, "setting a corrupt outbox row aside failed"),
        }
    }
}
