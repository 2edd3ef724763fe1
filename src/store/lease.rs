//! Pooled connections that go back to the pool only when the conversation on them ended.
//!
//! Any future orderly returns may be dropped at any await point: a timeout, a `select!`,
//! an HTTP handler whose client went away. A connection abandoned mid-conversation is in
//! a state nobody knows: a `BEGIN` sent but not yet counted by the driver (sqlx 0.9.0's
//! `begin()` on PostgreSQL), a reply half read, a transaction open. Returned to the pool,
//! it would hand the next caller a transaction that caller never began (whose writes are
//! then never committed), or hang the pool's check on a stream out of step.
//!
//! So the engine never relies on the driver's guards: a [`Lease`] closes its connection
//! when it is dropped, and only [`Lease::release`], called once the engine's work on the
//! connection has run to its end, gives it back to its store (to the pool, or, on
//! PostgreSQL, kept for the store's next conversation). Closing the socket makes the
//! server roll back whatever was open. The price of a cancelled call is one reconnect;
//! a call that completes pays nothing.

use super::errors::db_error;
use super::{ErrorClass, Store};

/// A connection borrowed from a store's pool: closed on drop unless released.
pub(crate) struct Lease<S: Store> {
    conn: Option<S::Pooled>,
    /// The store it goes back to ([`Store::give_back`]).
    store: S,
    /// The writer's turn a write lease holds (dropped after the connection).
    _turn: Option<super::WriteTurn>,
    /// Taken for a write: with the writer's turn, where the store hands them out.
    for_write: bool,
}

impl<S: Store> Lease<S> {
    /// Borrows a connection.
    pub(crate) async fn acquire(store: &S) -> Result<Self, sqlx::Error> {
        let conn = store.acquire().await?;
        crate::support::detach::mark_connected();
        Ok(Lease::held(store, conn))
    }

    /// Borrows a connection for a write, after taking the store's writer's turn (if it
    /// hands them out), which it holds until it is released or dropped.
    pub(crate) async fn acquire_for_write(store: &S) -> Result<Self, sqlx::Error> {
        let turn = store.write_turn().await;
        let conn = store.acquire().await?;
        crate::support::detach::mark_connected();
        Ok(Lease {
            conn: Some(conn),
            store: store.clone(),
            _turn: turn,
            for_write: true,
        })
    }

    /// Whether it was taken for a write ([`acquire_for_write`](Self::acquire_for_write)):
    /// with the store's writer's turn, where the store hands them out.
    pub(crate) fn for_write(&self) -> bool {
        self.for_write
    }

    /// Holds a connection already borrowed from `store`.
    pub(crate) fn held(store: &S, conn: S::Pooled) -> Self {
        Lease {
            conn: Some(conn),
            store: store.clone(),
            _turn: None,
            for_write: false,
        }
    }

    /// Hands the connection on, its conversation finished.
    #[cfg(feature = "mysql")]
    pub(crate) fn into_inner(mut self) -> Option<S::Pooled> {
        self.conn.take()
    }

    /// The connection.
    pub(crate) fn conn(&mut self) -> &mut S::Conn {
        // Only `release` and `drop` take the connection, and both consume the lease.
        self.conn
            .as_deref_mut()
            .expect("a lease holds its connection until it is released or dropped")
    }

    /// Gives the connection back to its store ([`Store::give_back`]): the work on it ran
    /// to its end, and no transaction of orderly's is open on it.
    pub(crate) fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            self.store.give_back(conn);
        }
    }

    /// Runs one `statement` of `store` on a leased connection: the connection goes back
    /// to its store once the statement ran to its end, and is closed if it was lost or
    /// the future dropped. Errors are the store's, judged as [`db_error`] judges them.
    pub(crate) async fn run<T>(
        store: &S,
        statement: impl AsyncFnOnce(&mut S::Conn) -> Result<T, sqlx::Error>,
    ) -> crate::error::Result<T> {
        let mut lease = Lease::acquire(store).await.map_err(db_error::<S>)?;
        let out = statement(lease.conn()).await;
        lease.release_after(&out);
        out.map_err(db_error::<S>)
    }

    /// Releases the connection after work that ended with `result`, unless that work
    /// lost the connection, which is then closed.
    pub(crate) fn release_after<T>(self, result: &Result<T, sqlx::Error>) {
        match result {
            Err(e) if S::classify(e) == ErrorClass::ConnectionLost => drop(self),
            _ => self.release(),
        }
    }
}

impl<S: Store> Drop for Lease<S> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            S::discard(conn);
        }
    }
}
