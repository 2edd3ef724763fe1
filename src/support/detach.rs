//! A call on the engine's own connections that, when its caller stops waiting (a client
//! timeout, a `select!`, a deadline), is finished off the caller's task instead of being
//! cut in the middle of its conversation with the database.
//!
//! Cut, the connection would have to be closed (its state is unknown: a `BEGIN` sent, a
//! reply half read), and under a burst of client timeouts the pool would spend its time
//! reconnecting. Finished, the unit commits or rolls back as it would have, and the
//! connection goes back to the pool warm. A finished call's answer has nobody to go to;
//! a re-send is answered as the database then says (`Replayed` where it committed).
//!
//! The work finishes what it is in the middle of (a read, a write unit, the read-back of
//! a write in doubt) but sends no write it had not sent when its caller stopped waiting,
//! so the answer the caller got (`DeadlineExceeded { in_doubt: false }`: nothing sent)
//! stays true. It is bounded: past `grace` it is dropped after all, and its connection is
//! then closed (see `store/lease.rs`), never handed out mid-conversation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

/// Whether `err` means that no connection was to be had: the pool's timeout, or a
/// server's refusal (see `backend::errors::refused`).
pub(crate) fn no_connection(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::ConnectionRefused,
        _ => false,
    }
}

/// How far a call got, for the answer when its deadline passes.
#[derive(Debug, Default)]
pub(crate) struct Stage(AtomicU8);

tokio::task_local! {
    /// The stage of the call running on this task, for calls that do not pass theirs
    /// down (see [`within_deadline`]): every [`Lease`](crate::store::Lease) that gets a
    /// connection marks it.
    static CALL: Arc<Stage>;
}

/// Marks the current call, if it is run by [`within_deadline`], as holding a connection.
pub(crate) fn mark_connected() {
    let _ = CALL.try_with(|stage| stage.connected());
}

/// Runs `call` within `deadline`. Past it the call is dropped (its connection closed)
/// and the answer is [`Error::Unavailable`](crate::Error::Unavailable) if it never got a
/// connection, else [`Error::DeadlineExceeded`](crate::Error::DeadlineExceeded), in doubt
/// if the call `writes` (whatever it sent may have landed). A call that ends, without a
/// connection of its own, on the pool's timeout or the server's refusal to connect is
/// [`Error::Unavailable`] too.
pub(crate) async fn within_deadline<T>(
    deadline: Duration,
    writes: bool,
    call: impl Future<Output = crate::error::Result<T>>,
) -> crate::error::Result<T> {
    let stage = Arc::new(Stage::default());
    let started = tokio::time::Instant::now();
    match tokio::time::timeout(deadline, CALL.scope(stage.clone(), call)).await {
        Ok(Err(crate::error::Error::Database {
            source,
            retryable: true,
        })) if stage.never_connected() && no_connection(&source) => {
            Err(crate::error::Error::Unavailable {
                waited: started.elapsed(),
            })
        }
        Ok(answer) => answer,
        Err(_) if stage.never_connected() => {
            Err(crate::error::Error::Unavailable { waited: deadline })
        }
        Err(_) => Err(crate::error::Error::DeadlineExceeded {
            deadline,
            in_doubt: writes,
        }),
    }
}

/// Runs `call` within `deadline` as [`within_deadline`] does, but as a [`Detached`]
/// unit: a caller that stops waiting (drops this future, or the deadline passes) leaves
/// it to finish what it is in the middle of off the caller's task, for at most `deadline`
/// more, so that its connection goes back to the pool warm instead of being closed. It
/// sends no write it had not sent by then ([`abandoned`] says so). What it answers then
/// goes to `abandoned`, which undoes what nobody will use (a claim granted to a caller
/// that left is released).
pub(crate) async fn finished_off_task<T, A, U>(
    deadline: Duration,
    writes: bool,
    call: impl Future<Output = crate::error::Result<T>> + Send + 'static,
    abandoned: A,
) -> crate::error::Result<T>
where
    T: Send + 'static,
    A: FnOnce(crate::error::Result<T>) -> U + Send + 'static,
    U: Future<Output = ()> + Send + 'static,
{
    let stage = Arc::new(Stage::default());
    let seen = stage.clone();
    let started = tokio::time::Instant::now();
    let work = CALL.scope(stage.clone(), async move {
        let out = call.await;
        if seen.0.load(Ordering::Acquire) & Stage::ABANDONED != 0 {
            abandoned(out).await;
            return None;
        }
        Some(out)
    });
    let detached = Detached::new(work, deadline, stage.clone());
    match tokio::time::timeout(deadline, detached).await {
        Ok(Some(Err(crate::error::Error::Database {
            source,
            retryable: true,
        }))) if stage.never_connected() && no_connection(&source) => {
            Err(crate::error::Error::Unavailable {
                waited: started.elapsed(),
            })
        }
        Ok(Some(answer)) => answer,
        // Abandoned while it was being polled here: it cannot be (the caller is here).
        Ok(None) => Err(crate::error::Error::DeadlineExceeded {
            deadline,
            in_doubt: writes,
        }),
        Err(_) => Err(past_deadline(&stage, deadline, writes)),
    }
}

/// A handle on the call running on this task (see [`finished_off_task`]): whether its
/// caller stopped waiting, for work done for it on another task (a queued claim).
#[derive(Debug, Clone, Default)]
pub(crate) struct Caller(Option<Arc<Stage>>);

impl Caller {
    /// The call running on this task, if any.
    pub(crate) fn current() -> Self {
        Caller(CALL.try_with(Arc::clone).ok())
    }

    /// Marks its write sent, for a write sent for it on another task (a queued finish):
    /// `false`, and nothing is to be sent, if its caller stopped waiting. Without a call,
    /// always sent.
    pub(crate) fn send(&self) -> bool {
        self.0.as_ref().is_none_or(|s| s.wrote())
    }

    /// Whether its caller stopped waiting.
    pub(crate) fn left(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|s| s.0.load(Ordering::Acquire) & Stage::ABANDONED != 0)
    }
}

/// Whether the caller of the call running on this task stopped waiting (see
/// [`finished_off_task`]): it then sends no further write.
pub(crate) fn abandoned() -> bool {
    CALL.try_with(|stage| stage.0.load(Ordering::Acquire) & Stage::ABANDONED != 0)
        .unwrap_or(false)
}

/// The answer of a call whose deadline passed, by how far it got.
fn past_deadline(stage: &Stage, deadline: Duration, writes: bool) -> crate::error::Error {
    if stage.never_connected() {
        crate::error::Error::Unavailable { waited: deadline }
    } else {
        crate::error::Error::DeadlineExceeded {
            deadline,
            in_doubt: writes,
        }
    }
}

impl Stage {
    const WAITING: u8 = 0;
    const CONNECTED: u8 = 1;
    const WROTE: u8 = 2;
    /// Set, with either of the above, once the caller stopped waiting: a call that has
    /// not sent its write by then never sends it.
    const ABANDONED: u8 = 4;

    /// It holds a connection that answered.
    pub(crate) fn connected(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & !Self::ABANDONED == Self::WAITING).then_some(s | Self::CONNECTED)
            });
    }

    /// Its write is about to be sent: from here on it may land. `false` (and nothing is
    /// to be sent) if the caller stopped waiting before.
    pub(crate) fn wrote(&self) -> bool {
        let before = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & Self::ABANDONED == 0).then_some(s | Self::WROTE)
            });
        before.is_ok()
    }

    /// The write marked [`wrote`](Self::wrote) was not sent after all (the store had no
    /// writer free): the call is as it was before.
    pub(crate) fn wrote_nothing(&self) {
        self.0.fetch_and(!Self::WROTE, Ordering::AcqRel);
    }

    /// The caller stopped waiting.
    fn abandon(&self) {
        self.0.fetch_or(Self::ABANDONED, Ordering::AcqRel);
    }

    /// Whether it never got a connection.
    pub(crate) fn never_connected(&self) -> bool {
        self.0.load(Ordering::Acquire) & !Self::ABANDONED == Self::WAITING
    }

    /// Whether its write was sent.
    pub(crate) fn sent_a_write(&self) -> bool {
        self.0.load(Ordering::Acquire) & Self::WROTE != 0
    }
}

/// Work that runs on the caller's task while the caller waits, and on a task of its own,
/// for at most `grace`, once the caller stops waiting.
pub(crate) struct Detached<T: Send + 'static> {
    work: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    grace: Duration,
    stage: Arc<Stage>,
}

impl<T: Send + 'static> Detached<T> {
    pub(crate) fn new(
        work: impl Future<Output = T> + Send + 'static,
        grace: Duration,
        stage: Arc<Stage>,
    ) -> Self {
        Detached {
            work: Some(Box::pin(work)),
            grace,
            stage,
        }
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(work) = self.work.as_mut() else {
            // Polled after it completed: a caller's bug, not the database's.
            return Poll::Pending;
        };
        match work.as_mut().poll(cx) {
            Poll::Ready(out) => {
                self.work = None;
                Poll::Ready(out)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        // From here on the work finishes what it is in the middle of, but sends no write
        // it had not sent yet: a caller told "not sent" is told the truth.
        self.stage.abandon();
        // Nothing sent yet: nothing to finish, and nothing is held but a place in the
        // pool's queue.
        if self.stage.never_connected() {
            return;
        }
        // Without a runtime (it is shutting down) the work is dropped, and its
        // connection closed.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let grace = self.grace;
            runtime.spawn(async move {
                if tokio::time::timeout(grace, work).await.is_err() {
                    tracing::debug!(?grace, "a detached call outlived its grace: dropped");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Stage;

    /// A call abandoned before its write never sends it; one abandoned after still counts
    /// its write as sent (the answer "in doubt" stays true).
    #[test]
    fn abandoned_before_the_write_never_sends_it() {
        let early = Stage::default();
        early.connected();
        early.abandon();
        assert!(!early.wrote());
        assert!(!early.sent_a_write() && !early.never_connected());

        let late = Stage::default();
        late.connected();
        assert!(late.wrote());
        late.abandon();
        assert!(late.sent_a_write());
        assert!(!late.wrote(), "no further write once abandoned");
        assert!(late.sent_a_write());

        let waiting = Stage::default();
        waiting.abandon();
        assert!(waiting.never_connected());
    }
}
