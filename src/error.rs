//! The crate-wide error type. Variants are named for what the caller does next.

/// Everything that can go wrong, named for what the caller should do about it.
///
/// An outcome that is not a failure is not an error: a repeated request is
/// [`Outcome::Replayed`](crate::Outcome::Replayed), returned as `Ok`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request was malformed (empty or over-long `ref_id`, unknown event name, bad
    /// table name). Nothing was read or written. Fix the caller.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// No entity with this id. Create it first.
    #[error("order {order_id} not found")]
    NotFound {
        /// The id that was asked for.
        order_id: i64,
    },

    /// `create` found the entity already past its initial state.
    #[error("order {order_id} already exists in state {state}")]
    AlreadyExists {
        /// The id that was asked for.
        order_id: i64,
        /// Its current state.
        state: String,
    },

    /// The graph does not allow `event` from `state`. Tell the client; nothing was written.
    #[error("event {event} is not allowed in state {state}")]
    InvalidTransition {
        /// The current state.
        state: &'static str,
        /// The refused event.
        event: &'static str,
    },

    /// The same event already reached this entity under another reference: a second
    /// payment for a paid order. Refund or reject the loser; `existing_ref` names the winner.
    #[error("event {event} was already applied with reference {existing_ref}")]
    RefConflict {
        /// The event.
        event: &'static str,
        /// The reference under which it was applied.
        existing_ref: String,
    },

    /// This reference was used before with a different payload: a client reusing a
    /// reference (a transition's `ref_id`, an idempotency key) for a different request.
    /// Nothing was written.
    #[error("reference {reference} was already used for {subject} with a different payload")]
    PayloadMismatch {
        /// What the reference was used for: `Pay on order 42`, `scope payments`.
        subject: String,
        /// The reused reference or key.
        reference: String,
    },

    /// The idempotency record is held by a request still running elsewhere, under a live
    /// lease. Retry after `retry_after`; the answer will then be its stored outcome.
    #[error("request {key} in scope {scope} is in flight; retry after {retry_after:?}")]
    InFlight {
        /// The scope.
        scope: String,
        /// The idempotency key.
        key: String,
        /// What is left of the holder's lease.
        retry_after: std::time::Duration,
    },

    /// The idempotency record is no longer this holder's (its lease expired and another
    /// claim took it over, or it was finished): nothing was written. Claim again to learn
    /// what the record says now.
    #[error("the lease on request {key} in scope {scope} was lost")]
    LeaseLost {
        /// The scope.
        scope: String,
        /// The idempotency key.
        key: String,
    },

    /// A one-time token was not accepted: nothing was consumed. The request it came with
    /// must not run; the client fetches a new token.
    #[error("token rejected in scope {scope}: {reason}")]
    TokenRejected {
        /// The scope.
        scope: String,
        /// Why.
        reason: TokenRejection,
    },

    /// The flow is recorded under a version of its definition this runner does not
    /// know: it is left alone, for a runner that knows that version (a rolling deploy).
    #[error("flow {kind} {key} runs under version {version}, unknown to this runner")]
    FlowVersion {
        /// The flow's kind.
        kind: String,
        /// The flow key.
        key: String,
        /// The version it is recorded under.
        version: i32,
    },

    /// A record (an idempotency record, or a flow's) holds a value orderly never writes:
    /// an unknown status or park reason, or a completed record without its result.
    /// Investigate; nothing is replayed or run from it.
    #[error("record {key} in scope {scope} holds a value orderly never writes: {value:?}")]
    CorruptRecord {
        /// The scope.
        scope: String,
        /// The idempotency key.
        key: String,
        /// The unknown value.
        value: String,
    },

    /// The database holds a status or history value that is not part of the machine, a
    /// version that cannot move (negative, or at `i64::MAX`), or an outbox row at the
    /// version a write would make. Someone wrote it outside orderly, or the graph lost a
    /// state; investigate. Nothing was written.
    #[error("order {order_id} holds a value orderly cannot go on from: {value:?}")]
    CorruptState {
        /// The entity whose row is corrupt.
        order_id: i64,
        /// The unparseable value.
        value: String,
    },

    /// A table orderly drives lacks a column this version needs: a table of your own,
    /// made before an upgrade (the default tables are upgraded by the migrations).
    /// Nothing was written. Run `fix`, then retry.
    #[error(
        "table {table} has no column {column}, which this version of orderly needs; add it with: {fix}"
    )]
    MissingColumn {
        /// The table, as configured.
        table: String,
        /// The missing column.
        column: String,
        /// The statement that adds it, in the backend's dialect.
        fix: String,
    },

    /// A guard of the edge refused the move: the business does not allow it now (the
    /// amount does not match, the stock is gone). Nothing was written. Not retryable as
    /// it is; a re-send is judged afresh, since the business data may have changed.
    #[error("refused by {guard}: {code}: {message}")]
    Refused {
        /// The guard that refused.
        guard: &'static str,
        /// The guard's code for the refusal, for programs.
        code: String,
        /// The guard's message, for people.
        message: String,
    },

    /// A timer's firing found the entity no longer at the version its state's timer was
    /// armed at: the entity has left that state since (and perhaps come back to it, armed
    /// again). Nothing was written; the timer job records the timer moot. Only a timer's
    /// firing gets this answer.
    #[error(
        "moot: {event} on order {order_id} was armed at version {armed_version}, the order is at {version}"
    )]
    Moot {
        /// The entity.
        order_id: i64,
        /// The event the timer fires.
        event: &'static str,
        /// The version the timer was armed at.
        armed_version: i64,
        /// The entity's version now.
        version: i64,
    },

    /// A guard or an effect of the edge failed (an error of its own, or a panic):
    /// nothing of the transition's unit was written.
    #[error("{rule} failed: {reason}")]
    RuleFailed {
        /// The guard or effect that failed.
        rule: &'static str,
        /// What it said, or what its panic carried.
        reason: String,
    },

    /// Lost the race too many times in a row, or the database kept reporting a
    /// serialization failure, deadlock or busy lock. Retry later; nothing of this request
    /// was applied.
    #[error("gave up after {attempts} contended attempts")]
    Contention {
        /// How many attempts were made.
        attempts: u32,
    },

    /// The connection failed after this request's write was sent, and the request could
    /// not be read back on a fresh connection either: it may or may not have been
    /// applied. **Re-send the same request; it is safe**: a request that was applied is
    /// answered [`Outcome::Replayed`](crate::Outcome::Replayed), one that was not is
    /// judged afresh, and it is never applied twice.
    #[error(
        "in doubt: the connection failed after the write of {event} {ref_id} on order {order_id} was sent; re-send the same request, it is safe: {source}"
    )]
    InDoubt {
        /// The entity.
        order_id: i64,
        /// The event.
        event: &'static str,
        /// The caller's reference.
        ref_id: String,
        /// The error that made the write's fate unknown.
        #[source]
        source: sqlx::Error,
    },

    /// The database could not be reached: no connection within the call's deadline
    /// ([`EngineConfig::deadline`](crate::EngineConfig::deadline)), or every attempt to
    /// get one failed, and no write of this request was sent. Retry later.
    #[error("database unavailable: no connection within {waited:?}")]
    Unavailable {
        /// How long the call waited.
        waited: std::time::Duration,
    },

    /// The call did not finish within its deadline
    /// ([`EngineConfig::deadline`](crate::EngineConfig::deadline)). With `in_doubt`, its
    /// write had been sent: the unit is finished off the caller's task and may still
    /// commit. **Re-send the same request; it is safe**: one that was applied is
    /// answered [`Outcome::Replayed`](crate::Outcome::Replayed).
    #[error(
        "no answer within the deadline of {deadline:?} (write sent: {in_doubt}); re-send the same request, it is safe"
    )]
    DeadlineExceeded {
        /// The deadline.
        deadline: std::time::Duration,
        /// Whether the call's write had been sent, so that it may still land.
        in_doubt: bool,
    },

    /// A database error. `retryable` is set for serialization failures, deadlocks, lock
    /// timeouts, busy databases, pool timeouts and lost connections, as classified by the
    /// store: re-sending the same request is safe then (a request whose write did land is
    /// answered `Replayed`). Inside a caller's transaction, a lost connection took that
    /// transaction with it: nothing of it committed; run the whole transaction again.
    #[error("database error (retryable: {retryable}): {source}")]
    Database {
        /// The driver's error.
        #[source]
        source: sqlx::Error,
        /// Whether retrying the same request later may succeed.
        retryable: bool,
    },

    /// A hand-written machine's graph is unsound.
    #[error("invalid state machine: {0}")]
    InvalidMachine(#[from] crate::machine::GraphError),

    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl Error {
    /// Whether re-sending the same request is safe and may succeed: contention,
    /// serialization failure, deadlock, busy, pool timeout, a lost connection, and
    /// [`Error::InDoubt`]. A transition is never applied twice, so re-sending one that
    /// did land is answered [`Outcome::Replayed`](crate::Outcome::Replayed).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Contention { .. }
                | Error::InDoubt { .. }
                | Error::InFlight { .. }
                | Error::Unavailable { .. }
                | Error::DeadlineExceeded { .. }
                | Error::Database {
                    retryable: true,
                    ..
                }
        )
    }

    /// Whether the request conflicts with what is already recorded (another reference
    /// won, or the reference was reused with another payload).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::RefConflict { .. } | Error::PayloadMismatch { .. }
        )
    }
}

/// Why a one-time token was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::Display)]
#[strum(serialize_all = "lowercase")]
pub enum TokenRejection {
    /// Never issued in this scope (or purged after it expired).
    Unknown,
    /// Issued, but its time to live ran out before it was consumed.
    Expired,
    /// Consumed already: this request is a repeat.
    Used,
}

/// Result alias for orderly.
pub type Result<T, E = Error> = std::result::Result<T, E>;
