//! The open unit of a guarded request: one transaction on the engine's connection (a
//! savepoint inside a caller's), in which the entity is locked, the request judged, the
//! rules run and the rows written. Every statement of the unit goes through it, and a
//! unit dropped before it ends is given up the way its backend must give it up.

use super::timers::Arm;
use super::{Apply, Entity, ErrorClass, Key, Prior, Store, Txn, Written};

/// An open unit ([`Store::begin_unit`]). Committed with [`commit`](Self::commit), undone
/// with [`rollback`](Self::rollback); dropped before either (its call was dropped, or
/// its connection failed), it is abandoned: the undo is queued for the connection's next
/// use and the connection is left as it was before the unit
/// ([`Store::abandon_rules_unit`], [`Store::abandon_ending_unit`]).
pub struct Unit<'a, S: Store> {
    store: &'a S,
    conn: &'a mut S::Conn,
    txn: Txn,
    /// sqlx's count of open transactions before the unit; `None` once it has ended.
    depth: Option<usize>,
    /// Its commit or rollback is in flight.
    ending: bool,
}

impl<S: Store> std::fmt::Debug for Unit<'_, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unit")
            .field("txn", &self.txn)
            .field("open", &self.depth.is_some())
            .finish()
    }
}

impl<'a, S: Store> Unit<'a, S> {
    /// Opens a unit on `conn` (see [`Store::begin_rules_unit`]).
    pub(super) async fn begin(
        store: &'a S,
        conn: &'a mut S::Conn,
        txn: Txn,
    ) -> Result<Self, sqlx::Error> {
        let depth = store.begin_rules_unit(conn, txn).await?;
        Ok(Unit {
            store,
            conn,
            txn,
            depth: Some(depth),
            ending: false,
        })
    }

    /// The unit's connection, for the application's guards and effects: what they write
    /// commits or is undone with the unit.
    pub fn conn(&mut self) -> &mut S::Conn {
        self.conn
    }

    /// The entity, locked until the unit ends ([`Store::lock`]).
    pub async fn lock(&mut self, order_id: i64) -> Result<Option<Entity>, sqlx::Error> {
        self.store.lock(self.conn, order_id).await
    }

    /// The entity locked and this request's history row ([`Store::lock_observe`]).
    pub async fn lock_observe(
        &mut self,
        key: Key<'_>,
    ) -> Result<(Option<Entity>, Option<Prior>), sqlx::Error> {
        self.store.lock_observe(self.conn, key, self.txn).await
    }

    /// This request's history row ([`Store::prior`]).
    pub async fn prior(&mut self, key: Key<'_>) -> Result<Option<Prior>, sqlx::Error> {
        self.store.prior(self.conn, key, self.txn).await
    }

    /// The event's latest reference, for a refusal ([`Store::latest_ref`]).
    pub async fn latest_ref(&mut self, key: Key<'_>) -> Result<Option<String>, sqlx::Error> {
        self.store.latest_ref(self.conn, key, self.txn).await
    }

    /// Checks, where the backend needs a write for it, that the unit's transaction is
    /// still open before the rules run ([`Store::write_before_rules`]).
    pub async fn check_open(&mut self, order_id: i64, version: i64) -> Result<(), sqlx::Error> {
        self.store
            .write_before_rules(self.conn, order_id, version)
            .await
    }

    /// Creates the entity at its initial state, or finds it ([`Store::create`]).
    pub async fn create(
        &mut self,
        order_id: i64,
        initial: &'static str,
    ) -> Result<Entity, sqlx::Error> {
        self.store
            .create(self.conn, order_id, initial, Txn::Caller)
            .await
    }

    /// The conditional write ([`Store::apply_in_unit`]).
    pub async fn apply(&mut self, apply: &Apply<'_>) -> Result<Written, sqlx::Error> {
        self.store.apply_in_unit(self.conn, apply).await
    }

    /// Arms the timers of the state the unit enters ([`Store::arm_timers`]).
    pub async fn arm(&mut self, arm: &Arm<'_>) -> Result<(), sqlx::Error> {
        self.store.arm_timers(self.conn, arm).await
    }

    /// Commits the unit (or releases its savepoint). An error after the commit was sent
    /// leaves its fate in doubt; the connection is as it was before the unit.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        self.end(true).await
    }

    /// Undoes the unit; the connection is as it was before it.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        self.end(false).await
    }

    /// Ends the unit after the error `e`: undone, or, on a connection that failed, given
    /// up without a round trip. Returns `e`.
    pub async fn fail(mut self, e: sqlx::Error) -> sqlx::Error {
        if S::classify(&e) != ErrorClass::ConnectionLost {
            let _ = self.end(false).await;
        }
        e
    }

    async fn end(&mut self, commit: bool) -> Result<(), sqlx::Error> {
        let Some(depth) = self.depth else {
            return Ok(());
        };
        self.ending = true;
        let ended = self.store.end_rules_unit(self.conn, commit, depth).await;
        self.depth = None;
        ended
    }
}

impl<S: Store> Drop for Unit<'_, S> {
    fn drop(&mut self) {
        match self.depth.take() {
            Some(depth) if self.ending => self.store.abandon_ending_unit(self.conn, depth),
            Some(depth) => self.store.abandon_rules_unit(self.conn, depth),
            None => {}
        }
    }
}
