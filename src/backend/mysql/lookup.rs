//! The operators' lookups on MySQL/MariaDB.

use crate::admin::lookup::{
    EventFilter, EventPage, EventsBy, FlowHit, Held, HeldKey, HeldRecord, LookupStore, PrefixHits,
    RecordHit, StuckRecord, TimerAt, TimerPage,
};
use crate::backend::lookup_sql;
use crate::backend::lookup_sql::LookupStatements;
use crate::backend::names::PerNamespace;
use crate::backend::sql::Params;
use crate::outbox::{EventKey, EventRow};
use crate::store::RefRow;
use sqlx::mysql::{MySql, MySqlConnection};

use super::MySqlStore;

static LOOKUP: PerNamespace<LookupStatements> = PerNamespace::new(|n| {
    LookupStatements::new(
        n,
        super::timers::NOW,
        super::outbox::EVENT_COLUMNS,
        super::outbox::AGE_MS,
        "INSTR",
        Params::Plain,
    )
});

impl LookupStore for MySqlStore {
    async fn by_ref(
        &self,
        conn: &mut MySqlConnection,
        ref_id: &str,
        limit: i64,
    ) -> Result<Vec<RefRow>, sqlx::Error> {
        sqlx::query_as(self.sql().by_ref.clone())
            .bind(ref_id)
            .bind(limit)
            .fetch_all(conn)
            .await
    }

    async fn by_ref_prefix(
        &self,
        conn: &mut MySqlConnection,
        prefix: &str,
        limit: i64,
    ) -> Result<Vec<RefRow>, sqlx::Error> {
        sqlx::query_as(self.sql().by_ref_prefix.clone())
            .bind(prefix)
            .bind(limit)
            .fetch_all(conn)
            .await
    }

    async fn by_prefix(
        &self,
        conn: &mut MySqlConnection,
        prefix: &str,
        limit: i64,
    ) -> Result<PrefixHits, sqlx::Error> {
        lookup_sql::prefixed::<MySql>(conn, LOOKUP.get(self.names()), prefix, limit).await
    }

    async fn history_page(
        &self,
        conn: &mut MySqlConnection,
        order_id: i64,
        before: i64,
        limit: i64,
    ) -> Result<Vec<crate::store::RawTransition>, sqlx::Error> {
        sqlx::query_as(self.sql().history_page.clone())
            .bind(order_id)
            .bind(before)
            .bind(limit)
            .fetch_all(conn)
            .await
    }

    async fn count_by_status(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<Vec<(String, i64)>, sqlx::Error> {
        sqlx::query_as(self.sql().by_status.clone())
            .fetch_all(conn)
            .await
    }

    async fn records_by_key(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        limit: i64,
    ) -> Result<Vec<RecordHit>, sqlx::Error> {
        lookup_sql::records::<MySql>(conn, LOOKUP.get(self.names()), key, limit).await
    }

    async fn flows_by_key(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        limit: i64,
    ) -> Result<Vec<FlowHit>, sqlx::Error> {
        lookup_sql::flows::<MySql>(conn, LOOKUP.get(self.names()), key, limit).await
    }

    async fn events_by(
        &self,
        conn: &mut MySqlConnection,
        by: EventsBy<'_>,
        limit: i64,
    ) -> Result<Vec<EventRow>, sqlx::Error> {
        lookup_sql::events::<MySql>(conn, LOOKUP.get(self.names()), by, limit).await
    }

    async fn stuck_records(
        &self,
        conn: &mut MySqlConnection,
        scope: Option<&str>,
        limit: i64,
    ) -> Result<Vec<StuckRecord>, sqlx::Error> {
        lookup_sql::stuck::<MySql>(conn, LOOKUP.get(self.names()), scope, limit).await
    }

    async fn events_in(
        &self,
        conn: &mut MySqlConnection,
        status: &str,
        filter: &EventFilter<'_>,
        after: Option<&EventKey>,
        limit: i64,
    ) -> Result<EventPage, sqlx::Error> {
        lookup_sql::events_in::<MySql>(conn, LOOKUP.get(self.names()), status, filter, after, limit)
            .await
    }

    async fn count_events_in(
        &self,
        conn: &mut MySqlConnection,
        status: &str,
        filter: &EventFilter<'_>,
    ) -> Result<i64, sqlx::Error> {
        lookup_sql::count_events_in::<MySql>(conn, LOOKUP.get(self.names()), status, filter).await
    }

    async fn count_stuck_records(
        &self,
        conn: &mut MySqlConnection,
        scope: Option<&str>,
    ) -> Result<i64, sqlx::Error> {
        lookup_sql::count_stuck::<MySql>(conn, LOOKUP.get(self.names()), scope).await
    }

    async fn held_records(
        &self,
        conn: &mut MySqlConnection,
        held: Held,
        scope: Option<&str>,
        after: Option<&HeldKey>,
        limit: i64,
    ) -> Result<Vec<HeldRecord>, sqlx::Error> {
        let s = LOOKUP.get(self.names());
        lookup_sql::held::<MySql>(conn, s, held, scope, after, limit).await
    }

    async fn count_held_records(
        &self,
        conn: &mut MySqlConnection,
        held: Held,
        scope: Option<&str>,
    ) -> Result<i64, sqlx::Error> {
        lookup_sql::count_held::<MySql>(conn, LOOKUP.get(self.names()), held, scope).await
    }

    async fn count_timers_in(
        &self,
        conn: &mut MySqlConnection,
        status: &str,
    ) -> Result<i64, sqlx::Error> {
        lookup_sql::count_timers::<MySql>(conn, LOOKUP.get(self.names()), status).await
    }

    async fn timers_page(
        &self,
        conn: &mut MySqlConnection,
        status: &str,
        after: Option<&TimerAt>,
        limit: i64,
    ) -> Result<TimerPage, sqlx::Error> {
        let s = LOOKUP.get(self.names());
        lookup_sql::timers_page::<MySql>(conn, s, status, after, limit).await
    }

    async fn count_published_since(
        &self,
        conn: &mut MySqlConnection,
        ms: i64,
    ) -> Result<i64, sqlx::Error> {
        lookup_sql::count_published::<MySql>(conn, LOOKUP.get(self.names()), ms).await
    }
}
