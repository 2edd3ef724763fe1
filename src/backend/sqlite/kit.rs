//! The flow test kit on SQLite: a new database in memory for each run.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::SqliteStore;
use crate::error::Result;
use crate::flow::{Definition, Flow};
use crate::idempotency::{Done, Work};
use crate::testing::flows::{Doubles, Kit, WorkKit};

impl<D, I> Kit<SqliteStore, D, I>
where
    D: Flow + Copy,
    I: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// [`Kit::new`] on a new SQLite database in memory for each run.
    pub fn sqlite(
        flow: D,
        input: I,
        define: impl Fn(&Doubles) -> Definition<SqliteStore, I> + Send + Sync + 'static,
    ) -> Self {
        Kit::new(flow, input, fresh, define)
    }
}

impl<P, R, F> WorkKit<SqliteStore, P, R, F>
where
    P: Serialize + Send + Sync + 'static,
    R: Serialize + DeserializeOwned + Send + Sync + 'static,
    F: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// [`WorkKit::new`] on a new SQLite database in memory for each run.
    pub fn sqlite<W>(payload: P, work: W) -> Self
    where
        W: for<'c> Fn(
                Doubles,
                &'c mut <SqliteStore as crate::store::Store>::Conn,
            ) -> Work<'c, Result<Done<R, F>>>
            + Send
            + Sync
            + 'static,
    {
        WorkKit::new(payload, fresh, work)
    }
}

/// A new SQLite database in memory, shared by the pool's connections, migrated.
async fn fresh() -> Result<SqliteStore> {
    let name = uuid::Uuid::new_v4().simple().to_string();
    SqliteStore::demo(&format!("sqlite:file:kit-{name}?mode=memory&cache=shared")).await
}
