//! The operators' lookups on SQLite.

use crate::admin::lookup::{EventsBy, FlowHit, LookupStore, RecordHit, StuckRecord};
use crate::backend::lookup_sql;
use crate::backend::lookup_sql::LookupStatements;
use crate::backend::sql::Params;
use crate::outbox::EventRow;
use sqlx::sqlite::{Sqlite, SqliteConnection};
use std::sync::LazyLock;

use super::SqliteStore;

static LOOKUP: LazyLock<LookupStatements> = LazyLock::new(|| {
    LookupStatements::new(
        super::timers::NOW,
        super::outbox::EVENT_COLUMNS,
        Params::Numbered,
    )
});

impl LookupStore for SqliteStore {
    async fn records_by_key(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        limit: i64,
    ) -> Result<Vec<RecordHit>, sqlx::Error> {
        lookup_sql::records::<Sqlite>(conn, &LOOKUP, key, limit).await
    }

    async fn flows_by_key(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        limit: i64,
    ) -> Result<Vec<FlowHit>, sqlx::Error> {
        lookup_sql::flows::<Sqlite>(conn, &LOOKUP, key, limit).await
    }

    async fn events_by(
        &self,
        conn: &mut SqliteConnection,
        by: EventsBy<'_>,
        limit: i64,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        lookup_sql::events::<Sqlite>(conn, &LOOKUP, by, limit).await
    }

    async fn stuck_records(
        &self,
        conn: &mut SqliteConnection,
        scope: Option<&str>,
        limit: i64,
    ) -> Result<Vec<StuckRecord>, sqlx::Error> {
        lookup_sql::stuck::<Sqlite>(conn, &LOOKUP, scope, limit).await
    }
}
