//! What an operator looks things up by: a reference, an idempotency key, a flow key or a
//! message id, and the records stuck in PROCESSING across every scope: the page's own
//! seam. Reads only; each backend implements [`LookupStore`] in
//! `src/backend/<backend>/lookup.rs`.

use std::future::Future;

use crate::outbox::{EventKey, EventRow, OutboxStore};
use crate::store::timers::ClaimedTimer;
use crate::store::{RawTransition, RefRow, Store};

/// An idempotency record found by its key (its texts read lossily: a byte that is not
/// UTF-8 shows as U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecordHit {
    /// Its scope (the operation).
    pub scope: String,
    /// Its key.
    pub idem_key: String,
    /// `PROCESSING`, `SUCCEEDED` or `FAILED`.
    pub status: String,
    /// How many times it was claimed.
    pub attempt: i32,
    /// Milliseconds left on its lease (negative once run out), by the database's clock.
    pub lease_left_ms: i64,
    /// Milliseconds since it was claimed first.
    pub age_ms: i64,
}

crate::support::text::shown_row!(RecordHit {
    scope: text,
    idem_key: text,
    status: text,
    attempt: plain,
    lease_left_ms: plain,
    age_ms: plain,
});

/// A flow found by its key (its texts read lossily: a byte that is not
/// UTF-8 shows as U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FlowHit {
    /// Its kind.
    pub kind: String,
    /// Its key.
    pub flow_key: String,
    /// `RUNNING`, `COMPENSATING`, `COMPLETED` or `COMPENSATED`.
    pub status: String,
    /// Why it is parked, if it is.
    pub park_reason: Option<String>,
}

crate::support::text::shown_row!(FlowHit {
    kind: text,
    flow_key: text,
    status: text,
    park_reason: maybe_text,
});

/// Which outbox events to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsBy<'a> {
    /// The events of the transitions made with this reference.
    Ref(&'a str),
    /// The events of one entity, newest first.
    Entity {
        /// The machine.
        machine: &'a str,
        /// The entity.
        entity_id: i64,
    },
    /// One event, by its message id's parts (`{machine}:{entity_id}:{version}`).
    Id {
        /// The machine.
        machine: &'a str,
        /// The entity.
        entity_id: i64,
        /// The entity's version the event was emitted at.
        version: i64,
    },
}

/// Which outbox events of a status to read or count: each field `None` meaning any.
/// `EventFilter::default()` takes every event of the status; set the fields wanted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventFilter<'a> {
    /// The events of this machine.
    pub machine: Option<&'a str>,
    /// The events of this name.
    pub event: Option<&'a str>,
    /// The events whose last error contains this text (compared as stored: case
    /// counts).
    pub error_contains: Option<&'a str>,
    /// The events written at least this many milliseconds ago, by the database's clock.
    pub older_than_ms: Option<i64>,
}

impl EventFilter<'_> {
    /// Whether `row` matches (its status aside).
    pub fn matches(&self, row: &EventRow) -> bool {
        self.machine.is_none_or(|m| m == row.machine)
            && self.event.is_none_or(|e| e == row.event)
            && self
                .error_contains
                .is_none_or(|t| row.last_error.as_deref().is_some_and(|e| e.contains(t)))
            && self
                .older_than_ms
                .is_none_or(|at_least| row.age_ms.is_some_and(|age| age >= at_least))
    }
}

/// A page of outbox events as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventPage {
    /// The rows that read as events, in key order.
    pub rows: Vec<EventRow>,
    /// How many rows the read returned, counting those that do not read as events (left
    /// out of `rows`, named in the log): a page that read its whole limit may have more
    /// after it.
    pub read: usize,
}

/// Whether `row`'s key comes after `after` in key order (machine, entity, version).
fn past(row: &EventRow, after: Option<&EventKey>) -> bool {
    after.is_none_or(|k| {
        (row.machine.as_str(), row.entity_id, row.version)
            > (k.machine.as_str(), k.entity_id, k.version)
    })
}

/// A record held in PROCESSING past its lease, in any scope.
/// Its texts read lossily: a byte that is not UTF-8 shows as U+FFFD.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StuckRecord {
    /// Its scope.
    pub scope: String,
    /// Its key.
    pub idem_key: String,
    /// How many times it was claimed.
    pub attempt: i32,
    /// Milliseconds since its lease ran out.
    pub stuck_ms: i64,
    /// Milliseconds since it was claimed first.
    pub age_ms: i64,
}

crate::support::text::shown_row!(StuckRecord {
    scope: text,
    idem_key: text,
    attempt: plain,
    stuck_ms: plain,
    age_ms: plain,
});

/// What a search by prefix found in the page's own store: records and flows whose key,
/// and outbox events whose reference, starts with it.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct PrefixHits {
    /// Idempotency records, by key.
    pub records: Vec<RecordHit>,
    /// Flows, by key.
    pub flows: Vec<FlowHit>,
    /// Outbox events, by reference.
    pub events: Vec<EventRow>,
}

/// Which records held in `PROCESSING` a list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Held {
    /// Their lease run out (inside their retention): their holder is likely gone.
    Stuck,
    /// Their lease still running: a request at work now.
    InFlight,
}

/// The record a page of held records starts after, in the list's order (lease end,
/// scope, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    /// Its lease's end, in milliseconds since the epoch.
    pub lease_until: i64,
    /// Its scope.
    pub scope: String,
    /// Its key.
    pub idem_key: String,
}

/// A record held in `PROCESSING` (its texts read lossily: a byte that is not UTF-8
/// shows as U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldRecord {
    /// Its scope.
    pub scope: String,
    /// Its key.
    pub idem_key: String,
    /// How many times it was claimed.
    pub attempt: i32,
    /// Its lease's end, in milliseconds since the epoch.
    pub lease_until: i64,
    /// Milliseconds left on its lease, by the database's clock (negative once run out:
    /// how long it has been stuck).
    pub lease_left_ms: i64,
    /// Milliseconds since it was claimed first.
    pub age_ms: i64,
}

crate::support::text::shown_row!(HeldRecord {
    scope: text,
    idem_key: text,
    attempt: plain,
    lease_until: plain,
    lease_left_ms: plain,
    age_ms: plain,
});

/// Where a timer stands in the timers' lists, which are in the order of their next
/// attempt: a page starts after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerAt {
    /// When the job tries it next, in milliseconds since the epoch (its due time until a
    /// failed attempt puts it later).
    pub next_at: i64,
    /// Its row's id.
    pub id: i64,
}

/// A page of timers: each row as read, and where the next page starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TimerPage {
    /// The timers, each as read (a row that does not read as a timer, as such).
    pub rows: Vec<ClaimedTimer>,
    /// Where the next page starts: `None` when this page read fewer rows than asked for,
    /// or when the store pages no further.
    pub next: Option<TimerAt>,
}

/// A backend of the operators' lookups. Each read is one statement and returns at most
/// `limit` rows.
pub trait LookupStore: Store {
    /// How many entities are in each state, by state (an operator's count: it reads the
    /// entity table whole).
    fn count_by_status(
        &self,
        conn: &mut Self::Conn,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, sqlx::Error>> + Send;

    /// Up to `limit` history rows of any entity made with the reference `ref_id`, by
    /// entity and version (an operator's search: the history table has no index on the
    /// reference alone, so this reads it whole unless the application adds one).
    fn by_ref(
        &self,
        conn: &mut Self::Conn,
        ref_id: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RefRow>, sqlx::Error>> + Send;

    /// Up to `limit` history rows of entity `order_id` whose version is below `before`,
    /// newest first: a page of its timeline, read by the history's key. The default
    /// reads the whole history and keeps the page (a store of your own may do better).
    fn history_page(
        &self,
        conn: &mut Self::Conn,
        order_id: i64,
        before: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RawTransition>, sqlx::Error>> + Send {
        async move {
            let mut rows = self.history(conn, order_id).await?;
            rows.retain(|r| r.seq < before);
            rows.reverse();
            rows.truncate(usize::try_from(limit).unwrap_or(0));
            Ok(rows)
        }
    }

    /// The records of any scope whose key is `key`.
    fn records_by_key(
        &self,
        conn: &mut Self::Conn,
        key: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RecordHit>, sqlx::Error>> + Send;

    /// The flows of any kind whose key is `key`.
    fn flows_by_key(
        &self,
        conn: &mut Self::Conn,
        key: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<FlowHit>, sqlx::Error>> + Send;

    /// Outbox events, whatever their status (a row that does not read as an event is
    /// left out; [`Outbox::corrupt`](crate::outbox::Outbox::corrupt) lists it).
    fn events_by(
        &self,
        conn: &mut Self::Conn,
        by: EventsBy<'_>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<EventRow>, sqlx::Error>> + Send;

    /// Up to `limit` events in `status` (`DEAD`, `PENDING`) `filter` matches whose keys
    /// come after `after`, in key order (machine, entity, version): a page of them, the
    /// next read after the last key of this one. The default reads every event of the
    /// status and keeps the page (a store of your own may do better); the backends
    /// filter and page in one statement.
    fn events_in(
        &self,
        conn: &mut Self::Conn,
        status: &str,
        filter: &EventFilter<'_>,
        after: Option<&EventKey>,
        limit: i64,
    ) -> impl Future<Output = Result<EventPage, sqlx::Error>> + Send
    where
        Self: OutboxStore,
    {
        async move {
            let mut rows = self.list_events(conn, status, i64::MAX).await?;
            rows.retain(|r| filter.matches(r) && past(r, after));
            rows.truncate(usize::try_from(limit).unwrap_or(0));
            let read = rows.len();
            Ok(EventPage { rows, read })
        }
    }

    /// How many events in `status` `filter` matches (of the dead, what a bulk requeue of
    /// them acts on). The default reads every event of the status; the backends count in
    /// one statement.
    fn count_events_in(
        &self,
        conn: &mut Self::Conn,
        status: &str,
        filter: &EventFilter<'_>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send
    where
        Self: OutboxStore,
    {
        async move {
            let rows = self.list_events(conn, status, i64::MAX).await?;
            Ok(rows.iter().filter(|r| filter.matches(r)).count() as i64)
        }
    }

    /// The records of every scope, or of `scope`, held in PROCESSING past their lease
    /// (inside their retention), the longest stuck first.
    fn stuck_records(
        &self,
        conn: &mut Self::Conn,
        scope: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<StuckRecord>, sqlx::Error>> + Send;

    /// How many records of every scope, or of `scope`, are held in PROCESSING past their
    /// lease (inside their retention). The default reads them all and counts; the
    /// backends count in one statement.
    fn count_stuck_records(
        &self,
        conn: &mut Self::Conn,
        scope: Option<&str>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send {
        async move {
            let rows = self.stuck_records(conn, scope, i64::MAX).await?;
            Ok(rows.len() as i64)
        }
    }

    /// Up to `limit` records of every scope, or of `scope`, held in `PROCESSING` as
    /// `held` says, after `after` in lease order (lease end, scope, key): a page of them.
    /// The default reads the first page of the stuck by
    /// [`stuck_records`](Self::stuck_records) (their lease ends taken from this process's
    /// clock) and answers that this store pages no further and lists none in flight; the
    /// backends read a page in one statement.
    fn held_records(
        &self,
        conn: &mut Self::Conn,
        held: Held,
        scope: Option<&str>,
        after: Option<&HeldKey>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<HeldRecord>, sqlx::Error>> + Send {
        async move {
            if held != Held::Stuck || after.is_some() {
                return Err(sqlx::Error::InvalidArgument(
                    "this store does not page the records held in PROCESSING".into(),
                ));
            }
            let now = chrono::Utc::now().timestamp_millis();
            let rows = self.stuck_records(conn, scope, limit).await?;
            Ok(rows
                .into_iter()
                .map(|r| HeldRecord {
                    scope: r.scope,
                    idem_key: r.idem_key,
                    attempt: r.attempt,
                    lease_until: now.saturating_sub(r.stuck_ms),
                    lease_left_ms: r.stuck_ms.saturating_neg(),
                    age_ms: r.age_ms,
                })
                .collect())
        }
    }

    /// How many records of every scope, or of `scope`, are held in `PROCESSING` as
    /// `held` says. The default counts the stuck by
    /// [`count_stuck_records`](Self::count_stuck_records) and answers that this store
    /// does not count those in flight; the backends count in one statement.
    fn count_held_records(
        &self,
        conn: &mut Self::Conn,
        held: Held,
        scope: Option<&str>,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send {
        async move {
            match held {
                Held::Stuck => self.count_stuck_records(conn, scope).await,
                Held::InFlight => Err(sqlx::Error::InvalidArgument(
                    "this store does not count the records in flight".into(),
                )),
            }
        }
    }

    /// Up to `limit` history rows of any entity whose reference starts with `prefix`, by
    /// entity and version (as [`by_ref`](Self::by_ref), a read of the history table
    /// whole; case counts). The default answers that this store does not search by
    /// prefix; the backends do.
    fn by_ref_prefix(
        &self,
        conn: &mut Self::Conn,
        prefix: &str,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<RefRow>, sqlx::Error>> + Send {
        let _ = (conn, prefix, limit);
        async {
            Err(sqlx::Error::InvalidArgument(
                "this store does not search by prefix".into(),
            ))
        }
    }

    /// Up to `limit` each of the records and flows whose key, and the outbox events whose
    /// reference, starts with `prefix` (case counts). The default answers that this store
    /// does not search by prefix; the backends do, in one statement each.
    fn by_prefix(
        &self,
        conn: &mut Self::Conn,
        prefix: &str,
        limit: i64,
    ) -> impl Future<Output = Result<PrefixHits, sqlx::Error>> + Send
    where
        Self: OutboxStore,
    {
        let _ = (conn, prefix, limit);
        async {
            Err(sqlx::Error::InvalidArgument(
                "this store does not search by prefix".into(),
            ))
        }
    }

    /// Up to `limit` timers in `status` (`DEAD`, `PENDING`) after `after`, in the order
    /// of their next attempt (then of their id), read by the timers' index: a page of
    /// them. The default reads the first page by
    /// [`TimerStore::list_timers`](crate::timer::TimerStore::list_timers) (earliest due
    /// first) and answers that this store pages no further; the backends read a page in
    /// one statement.
    fn timers_page(
        &self,
        conn: &mut Self::Conn,
        status: &str,
        after: Option<&TimerAt>,
        limit: i64,
    ) -> impl Future<Output = Result<TimerPage, sqlx::Error>> + Send
    where
        Self: crate::timer::TimerStore,
    {
        async move {
            if after.is_some() {
                return Err(sqlx::Error::InvalidArgument(
                    "this store does not page the timers".into(),
                ));
            }
            let rows = self.list_timers(conn, status, limit).await?;
            Ok(TimerPage { rows, next: None })
        }
    }

    /// How many events were published in the last `ms` milliseconds, by the database's
    /// clock: read by the outbox's index on `(status, next_at)`, where a published
    /// event's `next_at` is when it was published. The default answers that this store
    /// does not count them; the backends count in one statement.
    fn count_published_since(
        &self,
        conn: &mut Self::Conn,
        ms: i64,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send {
        let _ = (conn, ms);
        async {
            Err(sqlx::Error::InvalidArgument(
                "this store does not count the events published lately".into(),
            ))
        }
    }

    /// How many timers are in `status` (`DEAD`, `PENDING`): the count of one list, read
    /// by the timers' index alone. The default reads the timers' counts
    /// ([`TimerStore::timer_stats`](crate::timer::TimerStore::timer_stats)); the backends
    /// count in one statement.
    fn count_timers_in(
        &self,
        conn: &mut Self::Conn,
        status: &str,
    ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send
    where
        Self: crate::timer::TimerStore,
    {
        async move {
            let stats = self.timer_stats(conn).await?;
            Ok(match status {
                "DEAD" => stats.dead,
                "PENDING" => stats.pending,
                _ => 0,
            })
        }
    }
}
