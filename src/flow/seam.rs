//! What the flow layer needs from a backend: a few statements, each one round trip (the
//! claim of due flows, one atomic unit), over the backend's own connection. Each backend
//! implements [`FlowStore`] in `src/backend/<backend>/flows.rs`; transactions are begun
//! with [`RecordStore::begin`].

use std::future::Future;

use crate::idempotency::RecordStore;
use crate::store::timers::TimerStore;

/// A backend of the flow layer. Every time is the database's clock, in milliseconds
/// since the epoch. A flow's wait is a timer, armed through [`TimerStore`].
pub trait FlowStore: RecordStore + TimerStore {
    /// Starts a flow, atomically (one statement; on MySQL an insert, then a conditional
    /// update): inserts it RUNNING under `start.token`, or takes
    /// over one of the same input and version that is running or compensating, not
    /// parked, and whose lease ran out. The attempt number if this start holds the flow
    /// now; `None` otherwise ([`read_flow`](Self::read_flow) tells why).
    fn start_flow(
        &self,
        conn: &mut Self::Conn,
        start: &NewFlow<'_>,
    ) -> impl Future<Output = Result<Option<i32>, sqlx::Error>> + Send;

    /// Whether [`start_flows`](Self::start_flows) writes several starts in one statement:
    /// [`Flows`](crate::Flows) then coalesces concurrent starts.
    const BATCHES_STARTS: bool = false;

    /// Several starts, in one statement and one commit where the store can: each flow
    /// inserted RUNNING under its start's token, unless a flow with its key exists (then
    /// nothing is written for it, whatever its state, and the caller starts it alone).
    /// The tokens of the starts that hold their flows now, with their attempt numbers;
    /// two starts of one key in one call hold it at most once. By default, each start's
    /// own [`start_flow`](Self::start_flow) in turn.
    fn start_flows(
        &self,
        conn: &mut Self::Conn,
        starts: &[NewFlow<'_>],
    ) -> impl Future<Output = Result<Vec<(String, i32)>, sqlx::Error>> + Send {
        async move {
            let mut held = Vec::new();
            for start in starts {
                if let Some(attempt) = self.start_flow(conn, start).await? {
                    held.push((start.token.to_string(), attempt));
                }
            }
            Ok(held)
        }
    }

    /// The flow record, judged on the database's clock.
    fn read_flow(
        &self,
        conn: &mut Self::Conn,
        kind: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<FlowRow>, sqlx::Error>> + Send;

    /// The flow's step rows, by step then phase.
    fn read_steps(
        &self,
        conn: &mut Self::Conn,
        kind: &str,
        key: &str,
    ) -> impl Future<Output = Result<Vec<StepRow>, sqlx::Error>> + Send;

    /// The holder's write to the flow record, fenced: `UPDATE … WHERE kind AND key AND
    /// owner_token AND not parked AND running or compensating`. `true` if it wrote.
    /// Inside a transaction it locks the record, so no takeover interleaves with the
    /// rest of that transaction.
    fn touch(
        &self,
        conn: &mut Self::Conn,
        touch: &Touch<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Inserts or updates one step row. Runs in a transaction whose [`touch`](Self::touch)
    /// wrote, which is what fences it.
    fn record_step(
        &self,
        conn: &mut Self::Conn,
        step: &StepWrite<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Sets every STARTED or FAILED step row of `phase` (`F` or `C`) of the flow to RETRY
    /// (an operator's resume). Runs in a fenced transaction.
    fn retry_steps(
        &self,
        conn: &mut Self::Conn,
        kind: &str,
        key: &str,
        phase: &str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Claims up to `due.limit` flows of `due.kind` at `due.version` that are running or
    /// compensating, not parked, and whose lease ran out, oldest first, under
    /// `due.token` (one atomic unit; rows another claimant holds are skipped where the
    /// backend can). The keys claimed, with their attempt numbers.
    fn take_due(
        &self,
        conn: &mut Self::Conn,
        due: &TakeDue<'_>,
    ) -> impl Future<Output = Result<Vec<(String, i32)>, sqlx::Error>> + Send;

    /// Claims a parked flow for an operator's resume, from the token it was read under
    /// (so that of two resumes of one parked flow only one acts): clears the park, sets
    /// the token and a fresh lease, resets the attempts. Whether it did.
    fn unpark(
        &self,
        conn: &mut Self::Conn,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Hands a running flow from the token it waits under to the timer job's `token`
    /// (the wake-up of a wait step): sets the token and a fresh lease, if the flow is
    /// `RUNNING`, not parked, and still held under `from`. Whether it did.
    fn wake_flow(
        &self,
        conn: &mut Self::Conn,
        kind: &str,
        key: &str,
        from: &str,
        token: &str,
        lease_ms: i64,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Deletes up to `limit` finished flows (completed or compensated) last written at
    /// least `age_ms` ago, with their step rows, in one transaction; how many flows went.
    fn purge_flows(
        &self,
        conn: &mut Self::Conn,
        age_ms: i64,
        limit: i64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Up to `limit` flow records matching `which`, by kind and key, after `after` (a
    /// `(kind, key)` from the previous page).
    fn list_flows(
        &self,
        conn: &mut Self::Conn,
        which: Listing,
        after: Option<(&str, &str)>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<FlowRow>, sqlx::Error>> + Send;

    /// How many flow records match `which`. The default reads them all and counts; the
    /// backends count in one statement.
    fn count_flows(
        &self,
        conn: &mut Self::Conn,
        which: Listing,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send {
        async move {
            let rows = self.list_flows(conn, which, None, i64::MAX).await?;
            Ok(rows.len() as i64)
        }
    }
}

/// Which flows a listing shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// Parked, waiting for an operator.
    Parked,
    /// Running or compensating under a live lease (or waiting for a retry's time).
    Running,
    /// Running or compensating, not parked, lease run out: due for the recovery job.
    Stuck,
    /// Completed or compensated.
    Finished,
    /// Every flow.
    All,
}

/// A flow about to be started.
#[derive(Debug, Clone, Copy)]
pub struct NewFlow<'a> {
    /// The flow's kind.
    pub kind: &'a str,
    /// The flow key.
    pub key: &'a str,
    /// The definition's version.
    pub version: i32,
    /// The input's fingerprint.
    pub input_hash: &'a str,
    /// The input, JSON text.
    pub input: &'a str,
    /// The owner token this start mints.
    pub token: &'a str,
    /// How long the lease lasts, in milliseconds.
    pub lease_ms: i64,
}

/// A holder's write to its flow record; `None` fields are left as they are.
#[derive(Debug, Clone, Copy)]
pub struct Touch<'a> {
    /// The flow's kind.
    pub kind: &'a str,
    /// The flow key.
    pub key: &'a str,
    /// The holder's token.
    pub token: &'a str,
    /// The lease (or, for a flow waiting to retry, the time until it is due) from now.
    pub lease_ms: i64,
    /// The flow made progress: its attempts start again from 1.
    pub progress: bool,
    /// The step being run, or the step that failed.
    pub step_at: Option<i32>,
    /// The new status.
    pub status: Option<&'static str>,
    /// Parks the flow for this reason.
    pub park: Option<&'static str>,
    /// The final output (JSON text).
    pub output: Option<&'a str>,
    /// The latest error.
    pub error: Option<&'a str>,
}

/// One step row written.
#[derive(Debug, Clone, Copy)]
pub struct StepWrite<'a> {
    /// The flow's kind.
    pub kind: &'a str,
    /// The flow key.
    pub key: &'a str,
    /// The step's position.
    pub index: i32,
    /// `F` (forward) or `C` (compensation).
    pub phase: &'static str,
    /// The step's name.
    pub name: &'static str,
    /// STARTED, RETRY, WAITING, SUCCEEDED or FAILED.
    pub status: &'static str,
    /// A new attempt begins with this write: the attempt count goes up and the start
    /// time is now.
    pub begins: bool,
    /// The key a keyed or unsafe call is made with.
    pub downstream_key: Option<&'a str>,
    /// The writer's token.
    pub token: &'a str,
    /// The step's output (JSON text).
    pub output: Option<&'a str>,
    /// The step's error.
    pub error: Option<&'a str>,
}

/// A claim of due flows by the recovery job.
#[derive(Debug, Clone, Copy)]
pub struct TakeDue<'a> {
    /// The kind.
    pub kind: &'a str,
    /// The definition's version the job knows.
    pub version: i32,
    /// The token the claimed flows are held under.
    pub token: &'a str,
    /// The new lease, in milliseconds.
    pub lease_ms: i64,
    /// How many at most.
    pub limit: i64,
}

/// A flow record as read, with the database's clock applied. Its texts for people (the
/// park reason, the last error) read lossily: a byte that is not UTF-8 (which SQLite
/// stores as given) shows as U+FFFD, so that an operator can see the flow; a park reason
/// read so names no reason, and the runner takes the flow for corrupt. Every field the
/// runner acts on (kind, key, input, output, status, token) reads as stored or not at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRow {
    /// The flow's kind.
    pub kind: String,
    /// The flow key.
    pub flow_key: String,
    /// The definition's version it runs under.
    pub version: i32,
    /// The input's fingerprint.
    pub input_hash: String,
    /// The input, JSON text.
    pub input: String,
    /// RUNNING, COMPENSATING, COMPLETED or COMPENSATED.
    pub status: String,
    /// Why it is parked, if it is.
    pub park_reason: Option<String>,
    /// The step being run, or the step that failed.
    pub step_at: i32,
    /// The holder's token.
    pub owner_token: String,
    /// Claims since the flow last made progress.
    pub attempt: i32,
    /// Milliseconds left on the lease (negative once it ran out).
    pub lease_left_ms: i64,
    /// The final output.
    pub output: Option<String>,
    /// The latest error.
    pub last_error: Option<String>,
    /// When it was started.
    pub created_at: i64,
    /// When it was last written.
    pub updated_at: i64,
}

crate::support::text::shown_row!(FlowRow {
    kind: plain,
    flow_key: plain,
    version: plain,
    input_hash: plain,
    input: plain,
    status: plain,
    park_reason: maybe_text,
    step_at: plain,
    owner_token: plain,
    attempt: plain,
    lease_left_ms: plain,
    output: plain,
    last_error: maybe_text,
    created_at: plain,
    updated_at: plain,
});

/// A step row as read: its error (text for people) lossily, as [`FlowRow`]'s (the
/// runner copies it into a compensated flow's outcome, U+FFFD and all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRow {
    /// The step's position.
    pub step_index: i32,
    /// `F` (forward) or `C` (compensation).
    pub phase: String,
    /// The step's name.
    pub name: String,
    /// STARTED, RETRY, WAITING, SUCCEEDED or FAILED.
    pub status: String,
    /// How many times it was begun.
    pub attempt: i32,
    /// The key a keyed or unsafe call was made with.
    pub downstream_key: Option<String>,
    /// The token of the runner that wrote it last.
    pub owner_token: String,
    /// Its output (JSON text).
    pub output: Option<String>,
    /// Its latest error.
    pub error: Option<String>,
    /// When its latest attempt began.
    pub started_at: i64,
    /// When it finished, if it did.
    pub finished_at: Option<i64>,
}

crate::support::text::shown_row!(StepRow {
    step_index: plain,
    phase: plain,
    name: plain,
    status: plain,
    attempt: plain,
    downstream_key: plain,
    owner_token: plain,
    output: plain,
    error: maybe_text,
    started_at: plain,
    finished_at: plain,
});
