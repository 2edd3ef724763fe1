//! A holder's finish (a completion, a failure, a release) as it waits in the queue of
//! coalesced finishes (`crate::coalesce::claims`): while one finish statement is in
//! flight, those that arrive go together in the next, one transaction and one commit.

use super::{Finish, RecordStore};
use crate::coalesce::claims::Queued;

/// A [`Finish`] that owns its strings.
pub(crate) struct Owned {
    scope: String,
    key: String,
    token: String,
    status: &'static str,
    result: Option<String>,
    terminal: bool,
    retention_ms: i64,
    /// The call the finish is made for.
    caller: crate::support::detach::Caller,
}

impl Owned {
    pub(crate) fn new(f: &Finish<'_>) -> Self {
        Owned {
            scope: f.scope.to_string(),
            key: f.key.to_string(),
            token: f.token.to_string(),
            status: f.status,
            result: f.result.map(str::to_string),
            terminal: f.terminal,
            retention_ms: f.retention_ms,
            caller: crate::support::detach::Caller::current(),
        }
    }

    fn as_finish(&self) -> Finish<'_> {
        Finish {
            scope: &self.scope,
            key: &self.key,
            token: &self.token,
            status: self.status,
            result: self.result.as_deref(),
            terminal: self.terminal,
            // A finish keeps the lease as it is (only an extension, never queued, sets it).
            lease_ms: 0,
            retention_ms: self.retention_ms,
        }
    }
}

impl<S: RecordStore> Queued<S> for Owned {
    /// The finish wrote: the record is finished under this holder's token.
    type Answer = ();

    fn left(&self) -> bool {
        self.caller.left()
    }

    /// Marks the caller's write sent: past its deadline it is told its finish is in
    /// doubt, not that nothing was sent.
    fn send(&self) -> bool {
        self.caller.send()
    }

    /// A holder that finishes its record twice at once has one of the two sent: the
    /// other is answered "wrote nothing", and its read-back tells whether the record
    /// holds what it would have written.
    async fn write(
        store: &S,
        conn: &mut S::Conn,
        batch: &[Self],
    ) -> Result<Vec<Option<()>>, sqlx::Error> {
        let mut sent: Vec<usize> = Vec::with_capacity(batch.len());
        for (i, f) in batch.iter().enumerate() {
            if !sent.iter().any(|&j| batch[j].token == f.token) {
                sent.push(i);
            }
        }
        // In the order of their keys (where the store writes them in turn, two batches
        // never wait on each other's rows in opposite orders; PostgreSQL's one statement
        // locks them in its plan's order, and two batches share no row but a holder's
        // own twice-finished one).
        sent.sort_unstable_by(|&i, &j| {
            (&batch[i].scope, &batch[i].key).cmp(&(&batch[j].scope, &batch[j].key))
        });
        let finishes: Vec<Finish<'_>> = sent.iter().map(|&i| batch[i].as_finish()).collect();
        let wrote = store.finish_many(conn, &finishes).await?;
        let mut answers = vec![None; batch.len()];
        for i in sent {
            if wrote.iter().any(|token| *token == batch[i].token) {
                answers[i] = Some(());
            }
        }
        Ok(answers)
    }
}
