//! The holder's writes: complete, fail, release and extend, each fenced by the owner
//! token, read back when an acknowledgement is lost.

use serde::Serialize;

use super::{Claimed, Failure, Finish, RecordStore, Records, millis};
use crate::coalesce::queue::Entered;
use crate::error::Error;
use crate::error::Result;
use crate::store::{ErrorClass, Lease, Txn, db_error};

impl<S: RecordStore> Records<S> {
    /// Completes the held record with `result`, stored as JSON and replayed byte for byte
    /// to every later claim. [`Error::LeaseLost`] if the record is no longer this
    /// holder's (nothing is written); a result that does not serialize is
    /// [`Error::InvalidInput`], before any write. A write lost with its connection is
    /// read back and, if it did not land while the record is still this holder's, sent
    /// again; a retryable error means the record is still held: call again.
    pub async fn complete<R: Serialize + ?Sized>(&self, held: &Claimed, result: &R) -> Result<()> {
        let json = to_json(result)?;
        self.fenced(held, "SUCCEEDED", Some(json), false).await
    }

    /// [`complete`](Self::complete) inside the caller's transaction: the record commits
    /// or rolls back with the caller's own writes.
    pub async fn complete_in<R: Serialize + ?Sized>(
        &self,
        conn: &mut S::Conn,
        held: &Claimed,
        result: &R,
    ) -> Result<()> {
        let out = self.complete_on(conn, held, result, Txn::Caller).await;
        if out.is_ok() {
            self.unmark_held(held).await;
        }
        out
    }

    /// Completes on `conn`, inside a transaction that is the caller's (the write in a
    /// savepoint) or orderly's own.
    pub(super) async fn complete_on<R: Serialize + ?Sized>(
        &self,
        conn: &mut S::Conn,
        held: &Claimed,
        result: &R,
        txn: Txn,
    ) -> Result<()> {
        let json = to_json(result)?;
        let finish = self.finish(held, "SUCCEEDED", Some(&json), false)?;
        let wrote = self
            .store
            .finish(conn, &finish, txn)
            .await
            .map_err(db_error::<S>)?;
        lease_held(held, wrote)
    }

    /// Fails the held record with `failure` (stored as JSON). [`Failure::Terminal`]:
    /// replayed to later claims; [`Failure::Retryable`]: the next claim with the same
    /// payload runs the request again.
    pub async fn fail<F: Serialize + ?Sized>(
        &self,
        held: &Claimed,
        failure: &F,
        kind: Failure,
    ) -> Result<()> {
        let json = to_json(failure)?;
        self.fenced(held, "FAILED", Some(json), kind == Failure::Terminal)
            .await
    }

    /// Gives the held record up, storing nothing: the next claim runs the request again.
    pub async fn release(&self, held: &Claimed) -> Result<()> {
        self.fenced(held, "FAILED", None, false).await
    }

    /// Extends the held record's lease by the scope's lease, from now.
    pub async fn extend(&self, held: &Claimed) -> Result<()> {
        self.fenced(held, "PROCESSING", None, false).await
    }

    fn finish<'a>(
        &self,
        held: &'a Claimed,
        status: &'static str,
        result: Option<&'a str>,
        terminal: bool,
    ) -> Result<Finish<'a>> {
        let config = self.config(&held.scope)?;
        Ok(Finish {
            scope: &held.scope,
            key: &held.key,
            token: &held.token,
            status,
            result,
            terminal,
            lease_ms: millis(config.lease),
            retention_ms: millis(config.retention),
        })
    }

    /// A fenced write on the engine's own connection. If it wrote nothing, or the
    /// connection failed after it was sent, the record is read back: finished as this
    /// write would leave it, under this holder's token (which no other holder could have
    /// written), it landed; still held by this holder, it did not land, and it is sent
    /// again on a fresh connection (a few times; then a retryable error, the record
    /// still held); held by another token or finished otherwise, [`Error::LeaseLost`].
    ///
    /// A caller that stops waiting leaves the write to finish off its task (its
    /// connection goes back to the pool warm); one not sent by then is never sent.
    async fn fenced(
        &self,
        held: &Claimed,
        status: &'static str,
        result: Option<String>,
        terminal: bool,
    ) -> Result<()> {
        // The scope is known (checked here, before anything is sent).
        self.finish(held, status, None, terminal)?;
        let (records, owned) = (self.clone(), held.clone());
        let out = crate::support::detach::finished_off_task(
            self.deadline,
            true,
            async move {
                let finish = records.finish(&owned, status, result.as_deref(), terminal)?;
                records.fenced_now(&owned, &finish).await
            },
            |_| async {},
        )
        .await;
        // Finished (by this holder or, if the lease was lost, by another): the request
        // is no longer running, and the front's marker goes, outside the deadline, so that
        // a deadline passing as the write lands cannot leave the marker shedding repeats.
        let unsure = matches!(
            out,
            Err(Error::Database { .. }
                | Error::Contention { .. }
                | Error::Unavailable { .. }
                | Error::DeadlineExceeded { .. })
        );
        if status != "PROCESSING" && !unsure {
            self.unmark_held(held).await;
        }
        out
    }

    async fn fenced_now(&self, held: &Claimed, finish: &Finish<'_>) -> Result<()> {
        const SENDS: u32 = 3;
        let write = || async {
            let mut lease = Lease::acquire_for_write(&self.store).await?;
            if crate::support::detach::abandoned() {
                // Its caller left before it was sent: it never is (the record stays held,
                // as the caller was told).
                lease.release();
                return Err(sqlx::Error::PoolTimedOut);
            }
            let out = self.store.finish(lease.conn(), finish, Txn::Own).await;
            lease.release_after(&out);
            out
        };
        // An extension leaves the record as it found it, so a read cannot tell whether
        // it landed: a lost one is an error to retry, never taken for success.
        let finishes = finish.status != "PROCESSING";
        // The first send goes with the finishes in flight, where they are coalesced: a
        // batch that failed, or left it out, leaves it to be sent its ordinary way.
        let mut batched = match &self.finishes {
            Some(queue) if finishes => match queue.turn(|| super::finishes::Owned::new(finish)) {
                Entered::Alone(turn) => {
                    let out = write().await;
                    turn.hand_on();
                    Some(out)
                }
                Entered::Queued(answer) => answer.await.ok().map(|wrote| Ok(wrote.is_some())),
            },
            _ => None,
        };
        let mut sends = 0;
        loop {
            sends += 1;
            let sent = match batched.take() {
                Some(sent) => sent,
                None => write().await,
            };
            let lost = match sent {
                Ok(true) => break Ok(()),
                Ok(false) if !finishes => break lease_held(held, false),
                // Nothing written: the record is not this holder's any more, unless this
                // very write landed before (a retry of a write whose acknowledgement was
                // lost).
                Ok(false) => None,
                Err(e) if finishes && S::classify(&e) == ErrorClass::ConnectionLost => Some(e),
                Err(e) => break Err(db_error::<S>(e)),
            };
            match self.fate(held, finish.status, Some(finish)).await {
                Ok(Fate::Landed) => break Ok(()),
                Ok(Fate::Lost) => break lease_held(held, false),
                Ok(Fate::Held) if sends < SENDS => {
                    tracing::debug!(
                        scope = held.scope,
                        key = held.key,
                        "a fenced write did not land: sending it again"
                    );
                }
                Ok(Fate::Held) => {
                    break Err(match lost {
                        Some(e) => db_error::<S>(e),
                        None => Error::Contention { attempts: sends },
                    });
                }
                Err(read) => break Err(db_error::<S>(lost.unwrap_or(read))),
            }
        }
    }

    /// Removes the Redis front's marker of a request that is no longer running.
    pub(super) async fn unmark(&self, scope: &str, key: &str, marker: &str) {
        #[cfg(feature = "redis")]
        if let Some(front) = &self.front {
            front.unmark(scope, key, marker).await;
        }
        let _ = (scope, key, marker);
    }

    /// Removes the held record's marker, if its claim set one.
    pub(crate) async fn unmark_held(&self, held: &Claimed) {
        if let Some(marker) = &held.marker {
            self.unmark(&held.scope, &held.key, marker).await;
        }
    }

    /// Whether a write whose acknowledgement was lost landed: the record is in `status`
    /// under this holder's token, which no other holder could have written (and, given
    /// `finish`, holds what it wrote).
    pub(super) async fn landed(
        &self,
        held: &Claimed,
        status: &str,
        finish: Option<&Finish<'_>>,
    ) -> Result<bool, sqlx::Error> {
        Ok(self.fate(held, status, finish).await? == Fate::Landed)
    }

    /// What became of a holder's write to `status` whose answer was lost or empty, as
    /// the record now says.
    async fn fate(
        &self,
        held: &Claimed,
        status: &str,
        finish: Option<&Finish<'_>>,
    ) -> Result<Fate, sqlx::Error> {
        let row = self.read(&held.scope, &held.key).await?;
        Ok(match row {
            Some(r) if r.owner_token.as_deref() == Some(held.token.as_str()) => {
                let same = finish
                    .is_none_or(|f| r.result.as_deref() == f.result && r.terminal == f.terminal);
                if r.status == status && same {
                    Fate::Landed
                } else if r.status == "PROCESSING" {
                    Fate::Held
                } else {
                    Fate::Lost
                }
            }
            _ => Fate::Lost,
        })
    }
}

/// What a holder's write whose answer was lost did, as the record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// It landed.
    Landed,
    /// It did not land, and the record is still this holder's.
    Held,
    /// The record is another holder's now, or finished otherwise.
    Lost,
}

fn lease_held(held: &Claimed, wrote: bool) -> Result<()> {
    if wrote {
        Ok(())
    } else {
        Err(Error::LeaseLost {
            scope: held.scope.clone(),
            key: held.key.clone(),
        })
    }
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| Error::InvalidInput(format!("the result does not serialize as JSON: {e}")))
}
