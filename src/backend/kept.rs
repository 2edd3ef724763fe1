//! A connection of the pool's kept out of it between apply-first units (PostgreSQL): a
//! lone caller's next unit goes on it without taking a connection from the pool and
//! giving it back, which costs a round trip to the server each time (sqlx tests every
//! connection it takes back) and a task.
//!
//! The pool is never starved by it. A connection is taken only where the pool has one
//! idle (never one it would open, never one a waiting task is owed), tested as the pool
//! tests the connections it hands out (but without its `before_acquire` hook). It goes
//! back to the pool after a unit that leaves the pool with none idle at its size limit,
//! 10 to 20 ms after the last unit ([`IDLE`]), and once the pool is closed. A connection
//! whose unit failed or was dropped mid-conversation is closed, never kept nor given
//! back.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// How often the reaper looks: the kept connection goes back to the pool once a whole
/// `IDLE` passed with no unit, 10 to 20 ms after the last.
pub(crate) const IDLE: Duration = Duration::from_millis(10);

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
                units: 0,
                reaper: false,
            })),
        }
    }
}

struct State<DB: Database> {
    /// The connection, while no unit uses it.
    conn: Option<PoolConnection<DB>>,
    /// Counts the units that gave it back: the reaper gives it to the pool only after a
    /// whole [`IDLE`] in which this did not move.
    units: u64,
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
    /// off): one that fails the test is closed. `None` if neither is free.
    pub(crate) async fn take(&self, pool: &Pool<DB>) -> Option<Taken<'_, DB>> {
        let kept = lock(&self.state).conn.take();
        if pool.is_closed() {
            // Closing waits for every connection: this one goes at once.
            drop(kept.map(PoolConnection::detach));
            return None;
        }
        if let Some(conn) = kept {
            return Some(self.taken(conn));
        }
        let mut taken = self.taken(pool.try_acquire()?);
        if pool.options().get_test_before_acquire() {
            // Dropped or failed, the test leaves the connection to be closed.
            sqlx::Connection::ping(taken.conn()).await.ok()?;
        }
        Some(taken)
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

    /// After a unit that ended cleanly: kept for the next unit, or given back to the pool
    /// where the pool has no connection idle at its size limit (a task may wait for one)
    /// or another is kept already.
    pub(crate) fn keep(mut self, pool: &Pool<DB>) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let full = pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections();
        let mut state = lock(&self.kept.state);
        if full || pool.is_closed() || state.conn.is_some() {
            drop(state);
            drop(conn);
            return;
        }
        state.conn = Some(conn);
        state.units = state.units.wrapping_add(1);
        if !state.reaper {
            state.reaper = true;
            tokio::spawn(reap(Reaper {
                state: Arc::clone(&self.kept.state),
                done: false,
            }));
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

/// Gives the kept connection back to the pool once a whole [`IDLE`] passed with no unit
/// (so 10 to 20 ms after the last); ends when no connection is kept (a unit that keeps
/// one again starts another).
async fn reap<DB: Database>(mut reaper: Reaper<DB>) {
    let mut seen = None;
    loop {
        tokio::time::sleep(IDLE).await;
        let mut s = lock(&reaper.state);
        if s.conn.is_none() || seen == Some(s.units) {
            s.reaper = false;
            reaper.done = true;
            let conn = s.conn.take();
            drop(s);
            // Back to the pool (outside the lock: sqlx starts its test of it).
            drop(conn);
            return;
        }
        seen = Some(s.units);
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

    #[tokio::test]
    async fn a_kept_connection_goes_back_to_the_pool_when_idle() {
        let pool = pool(2).await;
        let kept = Kept::default();
        let taken = kept.take(&pool).await.expect("an idle connection");
        taken.keep(&pool);
        assert!(kept.holds());
        assert_eq!(pool.num_idle(), 0, "the kept connection is out of the pool");
        let back = async {
            while pool.num_idle() != 1 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(2), back)
            .await
            .expect("the kept connection never went back to the pool");
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
