//! What an attempt of a request ends in: an answer, a read again, or a lost connection;
//! and the step a database error leads to.

use super::Outcome;
use crate::error::Result;
use crate::machine::StateMachine;
use crate::store::{ErrorClass, Store, Txn, db_error};

/// What the loop does after one attempt.
pub(super) enum Step<S> {
    Done(Result<Outcome<S>>),
    /// Read again; the reason is for the trace.
    Retry(&'static str),
    /// The connection failed (and is discarded). `wrote`: at or after this attempt's
    /// write was sent, so the write may have committed.
    Lost {
        error: sqlx::Error,
        wrote: bool,
    },
}

/// The next step after a database error. Inside a caller's transaction every error ends
/// the request: a retryable one (a deadlock, a lost connection) took the caller's
/// transaction with it, and the caller runs the whole transaction again. `wrote`: the
/// error came at or after the attempt's write was sent.
pub(super) fn retry_or_fail<M: StateMachine, S: Store>(
    e: sqlx::Error,
    txn: Txn,
    wrote: bool,
) -> Step<M::State> {
    match S::classify(&e) {
        _ if txn == Txn::Caller => Step::Done(Err(db_error::<S>(e))),
        ErrorClass::Retryable => {
            crate::observe::retryable_db_error(S::BACKEND, "retryable", &e);
            Step::Retry("retryable database error")
        }
        ErrorClass::ConnectionLost => {
            crate::observe::retryable_db_error(S::BACKEND, "connection_lost", &e);
            Step::Lost { error: e, wrote }
        }
        ErrorClass::Fatal => Step::Done(Err(db_error::<S>(e))),
    }
}
