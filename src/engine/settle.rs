//! The read-back of a write left in doubt: a connection that failed at or after a
//! request's write was sent leaves the caller not knowing whether it landed, so the
//! request is read back by its identity, and a history row under this call's own write
//! id is this call's write.

use backon::{BackoffBuilder, ExponentialBuilder};

use super::judge;
use super::req::Req;
use super::{Engine, Outcome};
use crate::error::Error;
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{Lease, Store, Txn};

/// Settles a request whose connection failed at or after its write was sent: reads the
/// request back by its identity on fresh connections, for at most
/// `EngineConfig::in_doubt_timeout`. Recorded by this call (the row carries its write
/// id): `Applied`; recorded by an earlier call: `Replayed` (see docs/design.md, "What
/// happens when the connection fails at or after a write?"); `PayloadMismatch` if the
/// recorded payload is another. `None`: not recorded, so the write did not land; judge
/// afresh. Unreadable: [`Error::InDoubt`].
pub(super) async fn settle<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    req: &Req<'_, M>,
    error: sqlx::Error,
) -> Option<Result<Outcome<M::State>>> {
    let (key, config) = (req.key, &engine.config);
    tracing::debug!(order_id = key.order_id, event = key.event, %error, "write in doubt: reading it back");
    let read_back = async {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(config.min_backoff)
            .with_max_delay(config.max_backoff)
            .without_max_times()
            .build();
        loop {
            let read = async {
                let mut lease = Lease::acquire(&engine.store).await?;
                let prior = engine.store.prior(lease.conn(), key, Txn::Own).await;
                lease.release_after(&prior);
                prior
            };
            match read.await {
                Ok(prior) => return prior,
                Err(e) => {
                    tracing::debug!(error = %e, "reading an in-doubt write back failed");
                    tokio::time::sleep(delays.next().unwrap_or(config.max_backoff)).await;
                }
            }
        }
    };
    let prior = match tokio::time::timeout(config.in_doubt_timeout, read_back).await {
        Ok(prior) => prior?,
        Err(_) => {
            return Some(Err(Error::InDoubt {
                order_id: key.order_id,
                event: key.event,
                ref_id: key.ref_id.to_string(),
                source: error,
            }));
        }
    };
    let answer = judge::replay::<M>(&prior, key, req.event, req.hash());
    Some(own_write(answer, Some(&prior), req))
}

/// A replay of a history row that carries this call's write id is this call's own
/// write: `Applied`. Any other answer stands.
pub(super) fn own_write<M: StateMachine>(
    answer: Result<Outcome<M::State>>,
    prior: Option<&crate::store::Prior>,
    req: &Req<'_, M>,
) -> Result<Outcome<M::State>> {
    match answer {
        Ok(Outcome::Replayed { from, to, version })
            if prior.is_some_and(|p| p.write_id == Some(req.write_id)) =>
        {
            Ok(Outcome::Applied { from, to, version })
        }
        other => other,
    }
}
