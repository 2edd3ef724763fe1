//! The common case in a few lines: claim, run the caller's work inside one transaction,
//! and complete the record in that same transaction, or apply the failure policy.

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Claim, Claimed, Failure, RecordStore, Records, Stored};
use crate::error::Error;
use crate::store::{ErrorClass, Lease, Txn, db_error};
use crate::support::hook::{Phase, Point, Record, Stop, When};

/// The future a request's work returns: boxed, because it borrows the transaction's
/// connection (`|tx| Box::pin(async move { … })`).
pub type Work<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// What a request's work decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done<R, F> {
    /// It succeeded with `R`: its writes commit, with the record completed in the same
    /// transaction.
    Succeeded(R),
    /// It failed with `F`: its writes roll back, and the failure is stored per the policy.
    Failed(F, Failure),
}

/// What [`Records::run`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran<R, F> {
    /// The request's result or failure, this time's or the stored one.
    pub outcome: Result<R, F>,
    /// Whether it is the stored outcome of an earlier request with this key.
    pub replayed: bool,
}

impl<S: RecordStore> Records<S> {
    /// Runs a request exactly once: claims `(scope, key)` for `payload`; if it was done
    /// before, answers its stored outcome (`replayed`); otherwise begins a transaction
    /// and runs `work` in it, then:
    /// - [`Done::Succeeded`]: completes the record in the same transaction and commits
    ///   (the work's writes and the record, all or nothing);
    /// - [`Done::Failed`]: rolls the work back and stores the failure
    ///   ([`Failure::Terminal`] is replayed, [`Failure::Retryable`] runs again);
    /// - `Err(e)`: rolls the work back, releases the record (the next claim runs the
    ///   request again) and returns `e`.
    ///
    /// The claim's answers ([`Error::InFlight`], [`Error::PayloadMismatch`], bad input)
    /// come back as `E`. [`Error::LeaseLost`] means the lease ran out while the work ran
    /// and another request took the record over: the work was rolled back. If this
    /// future is dropped part way, the claim (if it was in the middle of it) finishes off
    /// the caller's task and a record it granted is released; dropped during the work,
    /// the transaction rolls back (its connection is closed) and the record is released
    /// by a task of its own, so the next claim runs the request again at once (if that
    /// release cannot be written, the record is held until its lease runs out).
    pub async fn run<P, R, F, E, W>(
        &self,
        scope: &str,
        key: &str,
        payload: &P,
        work: W,
    ) -> Result<Ran<R, F>, E>
    where
        P: Serialize + ?Sized,
        R: Serialize + DeserializeOwned,
        F: Serialize + DeserializeOwned,
        E: From<Error>,
        W: for<'c> FnOnce(&'c mut S::Conn) -> Work<'c, Result<Done<R, F>, E>>,
    {
        let held = match self.claim(scope, key, payload).await? {
            Claim::Replayed(stored) => return Ok(replay(&stored)?),
            Claim::Claimed(held) => held,
        };
        // The testing kit may stop the run here, as a crash would: the record stays held.
        self.point(&held, When::After, Record::Claim)
            .await
            .map_err(Stop::into_error)?;
        let guard = ReleaseOnDrop {
            records: Some(self.clone()),
            held: held.clone(),
        };
        let ran = self.run_held(&held, work).await;
        guard.disarm();
        match ran {
            Ok(ran) => Ok(ran),
            Err(Failed::Work(e)) => {
                self.release_quietly(&held).await;
                Err(e)
            }
            Err(Failed::Orderly(e)) => {
                if !matches!(e, Error::LeaseLost { .. }) {
                    self.release_quietly(&held).await;
                }
                Err(e.into())
            }
            Err(Failed::Stopped(e)) => Err(e.into()),
        }
    }

    /// A recorded point of a run: the testing kit's hook, if there is one, may stop the
    /// run there (an error) or hold it up.
    async fn point(&self, held: &Claimed, when: When, record: Record) -> Result<(), Stop> {
        let point = Point {
            when,
            record,
            step: None,
            phase: Phase::Forward,
        };
        self.hook.at(&held.key, point).await
    }

    async fn run_held<R, F, E, W>(&self, held: &Claimed, work: W) -> Result<Ran<R, F>, Failed<E>>
    where
        R: Serialize,
        F: Serialize,
        W: for<'c> FnOnce(&'c mut S::Conn) -> Work<'c, Result<Done<R, F>, E>>,
    {
        let orderly = |e: sqlx::Error| Failed::Orderly(db_error::<S>(e));
        let mut lease = Lease::acquire_for_write(&self.store)
            .await
            .map_err(orderly)?;
        let mut tx = S::begin(lease.conn()).await.map_err(orderly)?;
        let decided = match work(&mut tx).await {
            Ok(decided) => decided,
            Err(e) => {
                if tx.rollback().await.is_ok() {
                    lease.release();
                }
                return Err(Failed::Work(e));
            }
        };
        match decided {
            Done::Succeeded(result) => {
                // The work's writes are made, the record's not: an error here is a
                // failed write (the record is released), a crash leaves it held.
                if let Err(stop) = self.point(held, When::Before, Record::Commit).await {
                    return Err(stop.before());
                }
                // Our own transaction: the write needs no savepoint of its own, since a
                // failure rolls the whole transaction back anyway.
                if let Err(e) = self.complete_on(&mut tx, held, &result, Txn::Own).await {
                    if tx.rollback().await.is_ok() {
                        lease.release();
                    }
                    return Err(Failed::Orderly(e));
                }
                match tx.commit().await {
                    Ok(()) => lease.release(),
                    Err(e) if S::classify(&e) == ErrorClass::ConnectionLost => {
                        drop(lease);
                        // The commit may have landed: then the record is completed under
                        // this holder's token, which nobody else could have written.
                        if !self.landed(held, "SUCCEEDED", None).await.unwrap_or(false) {
                            return Err(orderly(e));
                        }
                    }
                    Err(e) => return Err(orderly(e)),
                }
                self.unmark_held(held).await;
                if let Err(stop) = self.point(held, When::After, Record::Commit).await {
                    return Err(Failed::Stopped(stop.into_error()));
                }
                Ok(Ran {
                    outcome: Ok(result),
                    replayed: false,
                })
            }
            Done::Failed(failure, kind) => {
                tx.rollback().await.map_err(orderly)?;
                lease.release();
                if let Err(stop) = self.point(held, When::Before, Record::Failed).await {
                    return Err(stop.before());
                }
                self.fail(held, &failure, kind)
                    .await
                    .map_err(Failed::Orderly)?;
                if let Err(stop) = self.point(held, When::After, Record::Failed).await {
                    return Err(Failed::Stopped(stop.into_error()));
                }
                Ok(Ran {
                    outcome: Err(failure),
                    replayed: false,
                })
            }
        }
    }

    /// Gives the record up after the work failed; if that fails too, the lease runs out.
    async fn release_quietly(&self, held: &Claimed) {
        if let Err(e) = self.release(held).await {
            tracing::warn!(error = %e, scope = held.scope, key = held.key, "release after a failed request");
        }
    }
}

/// Releases a held record, on a task of its own, if the future that holds it is dropped
/// before it is disarmed: a request dropped during its work leaves nothing held.
struct ReleaseOnDrop<S: RecordStore> {
    records: Option<Records<S>>,
    held: Claimed,
}

impl<S: RecordStore> ReleaseOnDrop<S> {
    fn disarm(mut self) {
        self.records = None;
    }
}

impl<S: RecordStore> Drop for ReleaseOnDrop<S> {
    fn drop(&mut self) {
        let Some(records) = self.records.take() else {
            return;
        };
        let held = self.held.clone();
        // Without a runtime (it is shutting down) the lease runs out instead.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { records.release_quietly(&held).await });
        }
    }
}

/// How a held request went wrong: in the caller's work, or in orderly's own writes.
enum Failed<E> {
    Work(E),
    Orderly(Error),
    /// The testing kit stopped the run, as a crash would: nothing more is written.
    Stopped(Error),
}

impl Stop {
    /// A stop before a write: an error is that write failing (the record is then
    /// released, as for any failed write), a crash leaves everything as it is.
    fn before<E>(self) -> Failed<E> {
        match self {
            Stop::Crash(e) => Failed::Stopped(e),
            Stop::Error(e) => Failed::Orderly(e),
        }
    }
}

fn replay<R: DeserializeOwned, F: DeserializeOwned>(stored: &Stored) -> Result<Ran<R, F>, Error> {
    let outcome = match stored {
        Stored::Succeeded(_) => Ok(stored.parse()?),
        Stored::Failed(_) => Err(stored.parse()?),
    };
    Ok(Ran {
        outcome,
        replayed: true,
    })
}
