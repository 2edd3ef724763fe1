//! A connection of the pool's kept out of it between a store's conversations
//! (PostgreSQL): a lone caller's next unit, claim or step goes on it without taking a
//! connection from the pool and giving it back, which costs a round trip to the server
//! each time (sqlx tests every connection it takes back) and a task.
//!
//! The pool is never starved by it. An apply-first unit takes a connection only where the
//! pool has one idle (never one it would open, never one a waiting task is owed); every
//! other conversation takes the kept one ([`Kept::take_kept`]) or else borrows from the
//! pool as ever. Each is tested as the pool tests the connections it hands out (but
//! without its `before_acquire` hook): one taken from the pool, and the kept one if it
//! sat kept longer than [`FRESH`] (1 ms), so that conversations back to back pay no
//! test. It goes back to the pool after a conversation that leaves the pool with
//! none idle at its size limit, 10 to 20 ms after the last one ([`IDLE`]), and once the
//! pool is closed. A connection that was lost, whose conversation was dropped midway, or
//! whose apply-first unit failed is closed, never kept nor given back.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// How often the reaper looks: the kept connection goes back to the pool once a whole
/// `IDLE` passed with no conversation on it, 10 to 20 ms after the last.
pub(crate) const IDLE: Duration = Duration::from_millis(10);

/// A connection kept longer than this since its last conversation is tested before its
/// next (where the pool tests what it hands out): one killed while kept is then found
/// dead before a statement is sent on it, unless it died within this last moment, as a
/// pooled one can between its test and its statement. A streak of conversations, back
/// to back, pays no test.
pub(crate) const FRESH: Duration = Duration::from_millis(1);

/// The kept connection, shared by a store's clones.
pub(crate) struct Kept<DB: Database> {
    state: Arc<Mutex<State<DB>>>,
}

impl<DB: Database> Clone for Kept<DB> {
    fn clone(&self) -> Self {
        Kept {
            state: Arc::clone(&self.state),
        }
    }
}

impl<DB: Database> std::fmt::Debug for Kept<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("holds", &lock(&self.state).conn.is_some())
            .finish()
    }
}

impl<DB: Database> Default for Kept<DB> {
    fn default() -> Self {
        Kept {
            state: Arc::new(Mutex::new(State {
                conn: None,
                since: Instant::now(),
                uses: 0,
                reaper: false,
            })),
        }
    }
}

struct State<DB: Database> {
    /// The connection, while no conversation uses it.
    conn: Option<PoolConnection<DB>>,
    /// When it was last given back.
    since: Instant,
    /// Counts the conversations that gave it back: the reaper gives it to the pool only
    /// after a whole [`IDLE`] in which this did not move.
    uses: u64,
    /// Whether a reaper task watches it.
    reaper: bool,
}

/// A connection still kept when the last of the store's clones and its reaper are gone
/// (a runtime shut down under them) is closed, not given back: giving back starts a task,
/// and no runtime may be left to run it.
impl<DB: Database> Drop for State<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

fn lock<DB: Database>(state: &Mutex<State<DB>>) -> std::sync::MutexGuard<'_, State<DB>> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<DB: Database> Kept<DB> {
    /// The kept connection, or else one the pool holds idle, tested first as the pool
    /// tests the connections it hands out (unless the pool's `test_before_acquire` is
    /// off; the kept one only if kept longer than [`FRESH`]): one that fails the test is
    /// closed. `None` if neither is free.
    pub(crate) async fn take(&self, pool: &Pool<DB>) -> Option<Taken<'_, DB>> {
        if let Some(taken) = self.kept_one(pool).await {
            return Some(taken);
        }
        if pool.is_closed() {
            return None;
        }
        let mut taken = self.taken(pool.try_acquire()?);
        if pool.options().get_test_before_acquire() {
            // Dropped or failed, the test leaves the connection to be closed.
            sqlx::Connection::ping(taken.conn()).await.ok()?;
        }
        Some(taken)
    }

    /// The kept connection for a conversation of the store's own (a claim, a flow's
    /// step, any statement borrowed through the store's `acquire`), tested as
    /// [`take`](Self::take) tests it: `None` if none is kept, or if the kept one fails
    /// its test (it is then closed). Given back through [`give_back`](Self::give_back).
    pub(crate) async fn take_kept(&self, pool: &Pool<DB>) -> Option<PoolConnection<DB>> {
        self.kept_one(pool).await?.conn.take()
    }

    /// The kept connection, tested if kept longer than [`FRESH`].
    async fn kept_one(&self, pool: &Pool<DB>) -> Option<Taken<'_, DB>> {
        let (kept, since) = {
            let mut state = lock(&self.state);
            (state.conn.take(), state.since)
        };
        if pool.is_closed() {
            // Closing waits for every connection: this one goes at once.
            drop(kept.map(PoolConnection::detach));
            return None;
        }
        let mut taken = self.taken(kept?);
        if since.elapsed() > FRESH && pool.options().get_test_before_acquire() {
            // Dropped or failed, the test leaves the connection to be closed.
            sqlx::Connection::ping(taken.conn()).await.ok()?;
        }
        Some(taken)
    }

    /// A connection whose conversation ended cleanly: kept for the next, or given back
    /// to the pool where the pool has no connection idle at its size limit (a task may
    /// wait for one), is closed, or another is kept already.
    pub(crate) fn give_back(&self, conn: PoolConnection<DB>, pool: &Pool<DB>) {
        let full = pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections();
        let mut state = lock(&self.state);
        if full || pool.is_closed() || state.conn.is_some() {
            drop(state);
            drop(conn);
            return;
        }
        state.conn = Some(conn);
        state.since = Instant::now();
        state.uses = state.uses.wrapping_add(1);
        if !state.reaper {
            state.reaper = true;
            tokio::spawn(reap(Reaper {
                state: Arc::clone(&self.state),
                done: false,
            }));
        }
    }

    fn taken(&self, conn: PoolConnection<DB>) -> Taken<'_, DB> {
        Taken {
            kept: self,
            conn: Some(conn),
        }
    }

    /// Whether a connection is kept now (none while a unit uses it).
    #[cfg(test)]
    fn holds(&self) -> bool {
        lock(&self.state).conn.is_some()
    }
}

/// A connection taken for one unit. Dropped without [`keep`](Self::keep) (its unit
/// failed, or its future was dropped mid-conversation), it is closed: its state is
/// unknown, and closing its socket rolls back whatever it held open.
pub(crate) struct Taken<'a, DB: Database> {
    kept: &'a Kept<DB>,
    conn: Option<PoolConnection<DB>>,
}

impl<DB: Database> Taken<'_, DB> {
    /// The connection.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("taken until kept or dropped")
    }

    /// After a unit that ended cleanly: kept for the next ([`Kept::give_back`]).
    pub(crate) fn keep(mut self, pool: &Pool<DB>) {
        if let Some(conn) = self.conn.take() {
            self.kept.give_back(conn, pool);
        }
    }
}

impl<DB: Database> Drop for Taken<'_, DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Detached, it no longer counts against the pool; dropped, its socket closes.
            drop(conn.detach());
        }
    }
}

/// The reaper's hold on the kept connection. Dropped with its task unfinished (its
/// runtime shut down), it closes the connection and lets a later unit start another.
struct Reaper<DB: Database> {
    state: Arc<Mutex<State<DB>>>,
    /// Its task ended as it should (the flag is then another reaper's, if any).
    done: bool,
}

impl<DB: Database> Drop for Reaper<DB> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = lock(&self.state);
        if s.reaper {
            s.reaper = false;
            let conn = s.conn.take();
            drop(s);
            drop(conn.map(PoolConnection::detach));
        }
    }
}

/// Gives the kept connection back to the pool once a whole [`IDLE`] passed with no
/// conversation on it (so 10 to 20 ms after the last); ends when no connection is kept
/// (the next to be kept starts another).
async fn reap<DB: Database>(mut reaper: Reaper<DB>) {
    let mut seen = None;
    loop {
        tokio::time::sleep(IDLE).await;
        let mut s = lock(&reaper.state);
        if s.conn.is_none() || seen == Some(s.uses) {
            s.reaper = false;
            reaper.done = true;
            let conn = s.conn.take();
            drop(s);
            // Back to the pool (outside the lock: sqlx starts its test of it).
            drop(conn);
            return;
        }
        seen = Some(s.uses);
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use sqlx::sqlite::SqlitePoolOptions;

    async fn pool(max: u32) -> Pool<sqlx::Sqlite> {
        let pool = SqlitePoolOptions::new()
            .max_connections(max)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        // One connection idle in the pool.
        drop(pool.acquire().await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
        pool
    }

    /// Waits (2 s at most) until the pool holds `idle` connections idle.
    async fn until_idle(pool: &Pool<sqlx::Sqlite>, idle: usize, never: &str) {
        let back = async {
            while pool.num_idle() != idle {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(2), back)
            .await
            .expect(never);
    }

    #[tokio::test]
    async fn a_kept_connection_goes_back_to_the_pool_when_idle() {
        let pool = pool(2).await;
        let kept = Kept::default();
        let taken = kept.take(&pool).await.expect("an idle connection");
        taken.keep(&pool);
        assert!(kept.holds());
        assert_eq!(pool.num_idle(), 0, "the kept connection is out of the pool");
        until_idle(&pool, 1, "the kept connection never went back to the pool").await;
        assert!(!kept.holds());
    }

    #[tokio::test]
    async fn a_pool_at_its_limit_gets_the_connection_back_after_the_unit() {
        let pool = pool(1).await;
        let kept = Kept::default();
        let taken = kept.take(&pool).await.expect("an idle connection");
        assert!(kept.take(&pool).await.is_none(), "nothing else is free");
        taken.keep(&pool);
        assert!(!kept.holds(), "kept though the pool has nothing idle");
        tokio::time::timeout(Duration::from_secs(2), pool.acquire())
            .await
            .expect("the pool was starved")
            .unwrap();
    }

    #[tokio::test]
    async fn a_closed_pool_gets_the_kept_connection_back() {
        let pool = pool(2).await;
        let kept = Kept::default();
        kept.take(&pool)
            .await
            .expect("an idle connection")
            .keep(&pool);
        assert!(kept.holds());
        let closed = tokio::time::timeout(Duration::from_secs(2), async {
            let closing = pool.close();
            // A unit after the close takes nothing, and lets the kept connection go.
            assert!(kept.take(&pool).await.is_none());
            closing.await;
        });
        closed
            .await
            .expect("the pool's close waited on the kept connection");
        assert!(!kept.holds());
    }

    #[tokio::test]
    async fn a_conversation_takes_the_kept_connection_and_gives_it_back() {
        let pool = pool(3).await;
        let kept = Kept::default();
        assert!(kept.take_kept(&pool).await.is_none(), "nothing is kept yet");
        let conn = pool.acquire().await.unwrap();
        kept.give_back(conn, &pool);
        assert!(kept.holds());
        let conn = kept.take_kept(&pool).await.expect("the kept connection");
        assert!(!kept.holds());
        assert_eq!((pool.size(), pool.num_idle()), (1, 0));
        // A second one given back while one is kept goes to the pool.
        let other = pool.acquire().await.unwrap();
        kept.give_back(conn, &pool);
        kept.give_back(other, &pool);
        assert!(kept.holds());
        // (The pool tests it on its way back, on a task of its own.)
        until_idle(
            &pool,
            1,
            "the second connection never went back to the pool",
        )
        .await;
        assert_eq!(pool.size(), 2);
    }

    #[tokio::test]
    async fn a_closed_pool_lends_no_kept_connection() {
        let pool = pool(2).await;
        let kept = Kept::default();
        kept.give_back(pool.acquire().await.unwrap(), &pool);
        // Closing the pool: the kept connection is not handed out, and is closed.
        let closing = pool.close();
        assert!(kept.take_kept(&pool).await.is_none());
        assert!(!kept.holds());
        tokio::time::timeout(Duration::from_secs(2), closing)
            .await
            .expect("the pool's close waited on the kept connection");
    }

    #[tokio::test]
    async fn a_connection_not_kept_is_closed() {
        let pool = pool(2).await;
        let kept = Kept::default();
        let taken = kept.take(&pool).await.expect("an idle connection");
        assert_eq!(pool.size(), 1);
        drop(taken);
        assert_eq!(pool.size(), 0, "the dropped unit's connection still counts");
        assert!(kept.take(&pool).await.is_none());
    }
}
