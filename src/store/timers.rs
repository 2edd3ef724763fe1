//! What timers need from a backend ([`TimerStore`]), and the rows they read and write:
//! the seam below the engine (which arms and schedules timers) and the timer job (which
//! fires them), re-exported by [`crate::timer`]. Every time is the database's clock, in
//! milliseconds since the epoch.

use std::future::Future;

use super::Store;

/// A timer's identity: the machine, the entity, the event it fires and its reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerKey<'a> {
    /// The machine's name.
    pub machine: &'a str,
    /// The entity.
    pub entity_id: i64,
    /// The event it fires.
    pub event: &'a str,
    /// Its reference: the history row's `ref_id` when it fires.
    pub ref_id: &'a str,
}

/// A timer an application schedules by hand (or a flow's wait step), due `after_ms`
/// from now by the database's clock.
#[derive(Debug, Clone, Copy)]
pub struct NewTimer<'a> {
    /// Its identity.
    pub key: TimerKey<'a>,
    /// Milliseconds from now.
    pub after_ms: i64,
    /// What it is tied to, as its `state` and `version`: `None` for one scheduled by
    /// hand; a flow's wait step's name and position.
    pub at: Option<(&'a str, i64)>,
}

/// The timers a state carries, armed by the unit that entered it.
#[derive(Debug, Clone, Copy)]
pub struct Arm<'a> {
    /// The machine's name.
    pub machine: &'static str,
    /// The entity.
    pub entity_id: i64,
    /// The state entered.
    pub state: &'static str,
    /// The entity's version after entering it.
    pub version: i64,
    /// Each timer's event and delay in milliseconds.
    pub timers: &'a [(&'static str, u64)],
}

impl Arm<'_> {
    /// The reference the timers fire with: `timer:{state}:{version}`.
    pub fn ref_id(&self) -> String {
        state_ref(self.state, self.version)
    }
}

/// The reference of a state's timer armed at `version`.
fn state_ref(state: &str, version: i64) -> String {
    format!("timer:{state}:{version}")
}

/// A timer row as read.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TimerRow {
    /// The row's id.
    pub id: i64,
    /// The machine's name.
    pub machine: String,
    /// The entity.
    pub entity_id: i64,
    /// The event it fires.
    pub event: String,
    /// Its reference.
    pub ref_id: String,
    /// The state whose entering armed it (`None` for one scheduled by hand).
    pub state: Option<String>,
    /// The entity's version after entering that state.
    pub version: Option<i64>,
    /// When it is due, in milliseconds since the epoch (database clock).
    pub due_at: i64,
    /// `PENDING`, `FIRED`, `CANCELLED` or `DEAD`.
    pub status: String,
    /// How a fired timer ended: `applied`, `replayed`, `moot` or `refused`.
    pub outcome: Option<String>,
    /// Claims so far.
    pub attempts: i32,
    /// The last error, or why a fired timer was moot or refused.
    pub last_error: Option<String>,
    /// Milliseconds since it was due (negative while it is not).
    pub late_ms: i64,
}

/// A claimed row the job cannot fire: its id if that much could be read, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timer row {id:?} does not read: {reason}")]
pub struct CorruptTimer {
    /// The row's id; `None` if even that could not be read.
    pub id: Option<i64>,
    /// What is wrong with it.
    pub reason: String,
}

/// A claimed row: a timer to fire, or one to set aside.
pub type ClaimedTimer = std::result::Result<TimerRow, CorruptTimer>;

/// A job's claim.
#[derive(Debug, Clone, Copy)]
pub struct ClaimTimers<'a> {
    /// The machine whose timers it claims.
    pub machine: &'a str,
    /// The token this claim mints.
    pub token: &'a str,
    /// How long the claim lasts, in milliseconds.
    pub lease_ms: i64,
    /// The most timers to claim.
    pub limit: i64,
}

/// A timer fired, as recorded.
#[derive(Debug, Clone, Copy)]
pub struct FiredTimer<'a> {
    /// The row's id.
    pub id: i64,
    /// `applied`, `replayed`, `moot` or `refused`.
    pub outcome: &'a str,
    /// Why it was moot or refused.
    pub note: Option<&'a str>,
}

/// A firing that did not take, recorded.
#[derive(Debug, Clone, Copy)]
pub struct FailedTimer<'a> {
    /// The row's id.
    pub id: i64,
    /// The claim's token.
    pub token: &'a str,
    /// The error, bounded.
    pub error: &'a str,
    /// Due again after this many milliseconds.
    pub retry_in_ms: i64,
    /// Set aside as `DEAD` instead.
    pub dead: bool,
}

/// Counts of the timers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct TimerStats {
    /// Timers waiting to fire (due or not).
    pub pending: i64,
    /// Pending timers whose due time has passed.
    pub due: i64,
    /// Timers set aside after failing (re-armable).
    pub dead: i64,
    /// How late the most overdue pending timer is, in milliseconds (0 if none is due).
    pub oldest_late_ms: i64,
}

/// A backend of the timers: the unit's arming is [`Store::arm_timers`]; the rest is
/// here. Each backend implements it in `src/backend/<backend>/timers.rs`. Every time is the database's clock, in milliseconds since the epoch.
pub trait TimerStore: Store {
    /// Inserts a timer unless one with its key exists; whether it was inserted.
    fn schedule_timer(
        &self,
        conn: &mut Self::Conn,
        timer: &NewTimer<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Claims up to `claim.limit` timers of `claim.machine` under `claim.token` for
    /// `claim.lease_ms`, in one atomic unit, and returns them, earliest due first. A timer
    /// is claimable when it is `PENDING`, its next try is due, it is under no live lease,
    /// and it is the earliest pending timer of its entity. Each claim counts an attempt.
    /// Rows another job is claiming at this moment are skipped, never waited for (`SKIP
    /// LOCKED` where the backend has it). Each row is decoded on its own.
    fn claim_timers(
        &self,
        conn: &mut Self::Conn,
        claim: &ClaimTimers<'_>,
    ) -> impl Future<Output = Result<Vec<ClaimedTimer>, sqlx::Error>> + Send;

    /// Marks the timers of `fired` still claimed under `token` `FIRED`, each with its
    /// outcome (and a note: why it was moot or refused), in one statement: how many it
    /// marked (a timer whose claim was taken over is not).
    fn mark_fired(
        &self,
        conn: &mut Self::Conn,
        token: &str,
        fired: &[FiredTimer<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Records a failed firing of a timer still claimed under `failed.token`: back to
    /// `PENDING`, tried again after `failed.retry_in_ms`, or `DEAD` if `failed.dead`,
    /// with the error; whether it wrote.
    fn mark_timer_failed(
        &self,
        conn: &mut Self::Conn,
        failed: &FailedTimer<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Cancels a `PENDING` or `DEAD` timer that no job is firing now (no live claim) and
    /// whose event the store's history does not hold for the entity under the timer's
    /// reference (a job applied it, and did not live to record it); whether it did.
    fn cancel_timer(
        &self,
        conn: &mut Self::Conn,
        key: &TimerKey<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Puts a `DEAD` timer back to `PENDING`, due now, its attempts reset; whether it
    /// was dead.
    fn rearm_timer(
        &self,
        conn: &mut Self::Conn,
        key: &TimerKey<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Up to `limit` timers in `status`, earliest due first; rows that do not read as
    /// timers come back as [`CorruptTimer`]s.
    fn list_timers(
        &self,
        conn: &mut Self::Conn,
        status: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ClaimedTimer>, sqlx::Error>> + Send;

    /// An entity's timers of one machine, earliest due first.
    fn timers_of(
        &self,
        conn: &mut Self::Conn,
        machine: &str,
        entity_id: i64,
    ) -> impl Future<Output = Result<Vec<ClaimedTimer>, sqlx::Error>> + Send;

    /// Hands back the timers of `ids` still claimed under `token`, unfired (a job that
    /// stopped before firing them): pending again, under no claim, their claim not
    /// counted as an attempt; how many. A store that cannot answers 0, and they wait for
    /// their lease to end.
    fn release_timers(
        &self,
        conn: &mut Self::Conn,
        token: &str,
        ids: &[i64],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send {
        let _ = (conn, token, ids);
        async { Ok(0) }
    }

    /// Opens the transaction in which a job claims a batch of timers
    /// ([`claim_timers`](Self::claim_timers) on the same connection), fires those whose
    /// edges name no guard or effect inside it (each a unit within it, as
    /// `.within(conn)` runs one), and records them ([`mark_fired`](Self::mark_fired)):
    /// one commit for the claim, the transitions and their records. A statement of it
    /// waits at most `lock_wait` for a row another transaction holds (then fails, and
    /// the job undoes the batch), so that a batch the job gives up on does not live on
    /// in the server holding its rows. Returns the depth to end it with
    /// ([`end_timer_batch`](Self::end_timer_batch)). `None` (the default) where the store
    /// cannot: the job then claims, fires and records in units of their own.
    fn begin_timer_batch(
        &self,
        conn: &mut Self::Conn,
        lock_wait: std::time::Duration,
    ) -> impl Future<Output = Result<Option<usize>, sqlx::Error>> + Send {
        let _ = (conn, lock_wait);
        async { Ok(None) }
    }

    /// Ends the transaction of [`begin_timer_batch`](Self::begin_timer_batch): commits
    /// it if `commit`, else undoes it, and puts the connection back as it was. By
    /// default [`Store::end_rules_unit`].
    fn end_timer_batch(
        &self,
        conn: &mut Self::Conn,
        commit: bool,
        depth: usize,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        self.end_rules_unit(conn, commit, depth)
    }

    /// How long until the next pending timer of `machine` falls due, in milliseconds
    /// (`None` if none is to fall due): how long an idle job may sleep. A store that
    /// cannot tell answers `None`, and the job sleeps its idle pause.
    fn next_due_in_ms(
        &self,
        conn: &mut Self::Conn,
        machine: &str,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send {
        let _ = (conn, machine);
        async { Ok(None) }
    }

    /// Counts of the timers as they are now.
    fn timer_stats(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<TimerStats, sqlx::Error>> + Send;

    /// Deletes up to `limit` `FIRED` or `CANCELLED` timers that ended more than
    /// `retention_ms` ago; how many went.
    fn purge_timers(
        &self,
        conn: &mut Self::Conn,
        retention_ms: i64,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}
