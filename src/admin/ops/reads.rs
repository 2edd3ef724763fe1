//! What the page and the command line read: the overview, an entity's timeline, the
//! search, the audit trail.

use std::future::Future;
use std::pin::Pin;

use super::FOUND_MAX;
use super::Filter;
use super::views::{
    Event, FlowCounts, Found, HistoryHit, Line, OutboxCounts, Overview, RecordCounts, Timeline,
    TimerCounts, TimerLine, message_id,
};
use crate::admin::AdminStore;
use crate::admin::lookup::{EventsBy, Held, HeldKey, HeldRecord};
use crate::admin::panel::Admin;
use crate::admin::panel::PAGE;
use crate::error::Error;
use crate::error::Result;
use crate::flow::{FlowConfig, Flows, Listing};
use crate::outbox::{EventKey, EventRow, Outbox};
use crate::store::Lease;
use crate::store::timers::TimerRow;
use crate::timer::TimerKey;
use crate::timer::Timers;

/// The entity's state and its history, read raw from `store` (names as stored).
/// Entity `id` now, and a page of its history: at most [`PAGE`] rows below version
/// `before` (all, if `None`), newest first, read by the history's key; and the version
/// to read the next page below, if there are older rows.
async fn raw_timeline<S: AdminStore>(
    store: &S,
    id: i64,
    before: Option<i64>,
) -> Result<(Option<crate::store::Entity>, Vec<Line>, Option<i64>)> {
    let now = Lease::run(store, async |c| store.get(c, id).await).await?;
    let (below, limit) = (before.unwrap_or(i64::MAX), i64::from(PAGE) + 1);
    let mut rows = Lease::run(store, async |c| {
        store.history_page(c, id, below, limit).await
    })
    .await?;
    let page = PAGE as usize;
    let older = (rows.len() > page).then(|| {
        rows.truncate(page);
        rows.last().map(|r| r.seq)
    });
    let lines = rows
        .into_iter()
        .map(|r| Line {
            seq: r.seq,
            from: r.from,
            to: r.to,
            event: r.event,
            ref_id: r.ref_id,
            payload_hash: r.payload_hash,
            actor: r.actor,
            reason: r.reason,
            at: r.created_at.to_rfc3339(),
        })
        .collect();
    Ok((now, lines, older.flatten()))
}

impl<S: AdminStore> Admin<S> {
    /// The registered flows, or the store's flows under no definition (which lists
    /// them, and resumes none).
    pub(crate) fn flows_here(&self) -> Result<Flows<S>> {
        match &self.flows {
            Some(flows) => Ok(flows.clone()),
            None => Flows::new(self.store.clone(), FlowConfig::default()),
        }
    }

    /// Up to `limit` events in `status` (`DEAD`, `PENDING`) `filter` matches after key
    /// `after`, in key order, and the key to read the next page after if there are more.
    pub(crate) async fn events_page(
        &self,
        status: &str,
        filter: &Filter,
        after: Option<&EventKey>,
        limit: u32,
    ) -> Result<(Vec<EventRow>, Option<EventKey>)> {
        let store = &self.store;
        let matching = filter.events();
        let page = Lease::run(store, async |c| {
            store
                .events_in(c, status, &matching, after, i64::from(limit) + 1)
                .await
        })
        .await?;
        // More follow if the read filled its limit, rows that do not read as events
        // counted (left out, they would end the pages early).
        let mut rows = page.rows;
        rows.truncate(limit as usize);
        let next = (page.read > limit as usize)
            .then(|| rows.last())
            .flatten()
            .map(|r| EventKey {
                machine: r.machine.clone(),
                entity_id: r.entity_id,
                version: r.version,
            });
        Ok((rows, next))
    }

    /// How many events in `status` `filter` matches (of the dead: what a requeue of
    /// every match acts on).
    pub(crate) async fn count_events(&self, status: &str, filter: &Filter) -> Result<u64> {
        let store = &self.store;
        let matching = filter.events();
        let n = Lease::run(store, async |c| {
            store.count_events_in(c, status, &matching).await
        })
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Up to [`LIST_MAX`](crate::admin::panel::LIST_MAX) records stuck in PROCESSING past their lease, of one scope or
    /// of all.
    #[cfg(feature = "cli")]
    pub(crate) async fn stuck_records(
        &self,
        scope: Option<&str>,
    ) -> Result<Vec<crate::admin::lookup::StuckRecord>> {
        let store = &self.store;
        Lease::run(store, async |c| {
            store
                .stuck_records(c, scope, i64::from(crate::admin::panel::LIST_MAX))
                .await
        })
        .await
    }

    /// Up to `limit` timers in `status` (`DEAD`, `PENDING`) after `after`, next attempt
    /// first; rows that do not read as timers as such.
    pub(crate) async fn timers_page(
        &self,
        status: &str,
        after: Option<&crate::admin::lookup::TimerAt>,
        limit: u32,
    ) -> Result<crate::admin::lookup::TimerPage> {
        let store = &self.store;
        Lease::run(store, async |c| {
            store.timers_page(c, status, after, i64::from(limit)).await
        })
        .await
    }

    /// The outbox event of `key`, if there is one that reads.
    pub(crate) async fn event(&self, key: &EventKey) -> Result<Option<EventRow>> {
        let store = &self.store;
        let by = EventsBy::Id {
            machine: &key.machine,
            entity_id: key.entity_id,
            version: key.version,
        };
        let rows = Lease::run(store, async |c| store.events_by(c, by, 1).await).await?;
        Ok(rows.into_iter().next())
    }

    /// The timer of `key`, if there is one that reads (from the page's own store, where
    /// the timers are).
    pub(crate) async fn timer(&self, key: &TimerKey<'_>) -> Result<Option<TimerRow>> {
        let store = &self.store;
        let rows = Lease::run(store, async |c| {
            store.timers_of(c, key.machine, key.entity_id).await
        })
        .await?;
        Ok(rows
            .into_iter()
            .flatten()
            .find(|t| t.event == key.event && t.ref_id == key.ref_id))
    }

    /// Up to `limit` records of one scope or of all held in PROCESSING as `held` says,
    /// after `after` in lease order, and the record to read the next page after if there
    /// are more.
    pub(crate) async fn held_page(
        &self,
        held: Held,
        scope: Option<&str>,
        after: Option<&HeldKey>,
        limit: u32,
    ) -> Result<(Vec<HeldRecord>, Option<HeldKey>)> {
        let store = &self.store;
        let mut rows = Lease::run(store, async |c| {
            store
                .held_records(c, held, scope, after, i64::from(limit) + 1)
                .await
        })
        .await?;
        let more = rows.len() > limit as usize;
        rows.truncate(limit as usize);
        let next = more.then(|| rows.last()).flatten().map(|r| HeldKey {
            lease_until: r.lease_until,
            scope: r.scope.clone(),
            idem_key: r.idem_key.clone(),
        });
        Ok((rows, next))
    }

    /// How many timers are in `status` (`DEAD`, `PENDING`).
    pub(crate) async fn count_timers(&self, status: &str) -> Result<u64> {
        let store = &self.store;
        let n = Lease::run(store, async |c| store.count_timers_in(c, status).await).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// How many records of one scope or of all are held in PROCESSING as `held` says.
    pub(crate) async fn count_held(&self, held: Held, scope: Option<&str>) -> Result<u64> {
        let store = &self.store;
        let n = Lease::run(store, async |c| {
            store.count_held_records(c, held, scope).await
        })
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// How many records of one scope or of all are stuck in PROCESSING past their lease.
    pub(crate) async fn count_stuck(&self, scope: Option<&str>) -> Result<u64> {
        let store = &self.store;
        let n = Lease::run(store, async |c| store.count_stuck_records(c, scope).await).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The overview's counts.
    pub(crate) async fn overview(&self) -> Result<Overview> {
        let flows = self.flows_here()?;
        // A store of one's own may not count them (its default answers so): unknown.
        let in_flight = async {
            match self.count_held(Held::InFlight, None).await {
                Ok(n) => Ok(Some(n)),
                Err(e) if unsupported(&e) => Ok(None),
                Err(e) => Err(e),
            }
        };
        let published = async {
            let store = &self.store;
            let read = Lease::run(store, async |c| {
                store.count_published_since(c, 60_000).await
            });
            match read.await {
                Ok(n) => Ok(Some(u64::try_from(n).unwrap_or(0))),
                Err(e) if unsupported(&e) => Ok(None),
                Err(e) => Err(e),
            }
        };
        // The counts at once, as many as the page's reads may be.
        let (events, timed) = (
            Outbox::new(self.store.clone()),
            Timers::new(self.store.clone()),
        );
        let (outbox, timers, parked, running, stuck, in_flight, published) = tokio::try_join!(
            self.gated(events.stats()),
            self.gated(timed.stats()),
            self.gated(flows.count(Listing::Parked)),
            self.gated(flows.count(Listing::Running)),
            self.gated(self.count_stuck(None)),
            self.gated(in_flight),
            self.gated(published)
        )?;
        Ok(Overview {
            outbox: OutboxCounts {
                pending: outbox.pending,
                dead: outbox.dead,
                corrupt: outbox.corrupt,
                oldest_pending_ms: u64::try_from(outbox.oldest_pending.as_millis())
                    .unwrap_or(u64::MAX),
                published_last_minute: published,
            },
            timers: TimerCounts {
                pending: timers.pending,
                due: timers.due,
                dead: timers.dead,
                oldest_late_ms: timers.oldest_late_ms,
            },
            flows: FlowCounts { parked, running },
            records: RecordCounts { stuck, in_flight },
            machines: self.machines.keys().map(|m| m.to_string()).collect(),
        })
    }

    /// Runs one of the page's reads once fewer than
    /// [`READS_AT_ONCE`](crate::admin::panel::READS_AT_ONCE) are at work: the page holds
    /// at most that many of the pool's connections, however many look at it.
    /// (Boxed: a page joins several, and their futures inline would be one large value
    /// on the stack.)
    pub(crate) fn gated<'a, T: 'a>(
        &'a self,
        read: impl Future<Output = T> + Send + 'a,
    ) -> Pin<Box<dyn Future<Output = T> + Send + 'a>> {
        Box::pin(async move {
            // The semaphore is never closed.
            let _permit = self.reads.acquire().await.ok();
            read.await
        })
    }

    /// The store of `machine`'s entities: its registered engine's, else the page's own.
    pub(super) fn entities_of(&self, machine: &str) -> &S {
        self.machines
            .get(machine)
            .map_or(&self.store, |m| m.store())
    }

    /// The store the page reads.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The graph of a registered machine, as Mermaid text.
    pub(crate) fn graph(&self, machine: &str) -> Option<String> {
        self.machines.get(machine).map(|m| m.graph())
    }

    /// How many entities of a registered machine are in each state (a read of its
    /// entity table whole); `None` for a machine not registered.
    pub(crate) async fn states(&self, machine: &str) -> Result<Option<Vec<(String, i64)>>> {
        let Some(view) = self.machines.get(machine) else {
            return Ok(None);
        };
        let store = view.store();
        Ok(Some(
            Lease::run(store, async |c| store.count_by_status(c).await).await?,
        ))
    }

    /// The latest `limit` actions of the audit trail, newest first.
    pub(crate) async fn audit(&self, limit: i64) -> Result<Vec<crate::store::audit::AuditRow>> {
        let store = &self.store;
        Lease::run(store, async |c| store.list_audit(c, limit).await).await
    }

    /// Whether `machine` is registered with this page.
    pub(crate) fn knows_machine(&self, machine: &str) -> bool {
        self.machines.contains_key(machine)
    }

    /// Entity `id` of `machine`: its state and a page of its history, newest first, below
    /// version `before` (from the machine's store, or the page's own for a machine not
    /// registered), its outbox events and its timers.
    pub(crate) async fn timeline(
        &self,
        machine: &str,
        id: i64,
        before: Option<i64>,
    ) -> Result<Timeline> {
        let (now, history, older) = raw_timeline(self.entities_of(machine), id, before).await?;
        let store = &self.store;
        let by = EventsBy::Entity {
            machine,
            entity_id: id,
        };
        let events = Lease::run(store, async |c| store.events_by(c, by, FOUND_MAX).await).await?;
        let timers = Lease::run(store, async |c| store.timers_of(c, machine, id).await).await?;
        Ok(Timeline {
            machine: machine.to_string(),
            id,
            state: now.as_ref().map(|e| e.status.clone()),
            version: now.as_ref().map(|e| e.version),
            history,
            older,
            events: events.into_iter().map(Event::from).collect(),
            timers: timers.into_iter().map(TimerLine::from).collect(),
        })
    }

    /// Everything `term` names: history rows of every registered machine (or of the
    /// page's own store if none is) made with it as their reference, records and flows
    /// with it as their key, outbox events with it as their reference or message id, and
    /// for an integer, the entities with that id. With `prefix`, everything whose
    /// reference or key starts with it (no message id, no entity).
    pub(crate) async fn search(&self, term: &str, prefix: bool) -> Result<Found> {
        let term = term.trim();
        if term.is_empty() {
            return Err(Error::InvalidInput("a search needs a term".into()));
        }
        crate::support::input::validate_reference("a search term", term)?;
        let mut found = Found {
            term: term.to_string(),
            prefix,
            history: Vec::new(),
            records: Vec::new(),
            flows: Vec::new(),
            events: Vec::new(),
            entities: Vec::new(),
        };
        let stores: Vec<(&str, &S)> = if self.machines.is_empty() {
            vec![("", &self.store)]
        } else {
            self.machines.iter().map(|(n, m)| (*n, m.store())).collect()
        };
        for (machine, store) in &stores {
            let rows = Lease::run(*store, async |c| match prefix {
                false => store.by_ref(c, term, FOUND_MAX).await,
                true => store.by_ref_prefix(c, term, FOUND_MAX).await,
            })
            .await?;
            found.history.extend(rows.into_iter().map(|row| HistoryHit {
                machine: machine.to_string(),
                row,
            }));
            if !prefix
                && let Ok(id) = term.parse::<i64>()
                && Lease::run(*store, async |c| store.get(c, id).await)
                    .await?
                    .is_some()
            {
                found.entities.push((machine.to_string(), id));
            }
        }
        let store = &self.store;
        if prefix {
            let hits =
                Lease::run(store, async |c| store.by_prefix(c, term, FOUND_MAX).await).await?;
            found.records = hits.records;
            found.flows = hits.flows;
            found.events = hits.events.into_iter().map(Event::from).collect();
            return Ok(found);
        }
        found.records = Lease::run(store, async |c| {
            store.records_by_key(c, term, FOUND_MAX).await
        })
        .await?;
        found.flows = Lease::run(store, async |c| {
            store.flows_by_key(c, term, FOUND_MAX).await
        })
        .await?;
        let mut events = Lease::run(store, async |c| {
            store.events_by(c, EventsBy::Ref(term), FOUND_MAX).await
        })
        .await?;
        if let Some((machine, entity_id, version)) = message_id(term) {
            let by = EventsBy::Id {
                machine,
                entity_id,
                version,
            };
            events.extend(Lease::run(store, async |c| store.events_by(c, by, 1).await).await?);
        }
        found.events = events.into_iter().map(Event::from).collect();
        Ok(found)
    }
}

/// Whether `e` says the store does not do what was asked (a [`LookupStore`] default's
/// answer, which the lease passes on as a database error), rather than that it failed.
///
/// [`LookupStore`]: crate::admin::lookup::LookupStore
pub(crate) fn unsupported(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidInput(_)
            | Error::Database {
                source: sqlx::Error::InvalidArgument(_),
                ..
            }
    )
}

#[cfg(test)]
mod tests {
    use super::unsupported;
    use crate::error::Error;

    /// A default's "not supported" comes out of the lease as a database error (the lease
    /// wraps every driver error so): still told apart from a failure.
    #[test]
    fn a_defaults_answer_is_told_apart_from_a_failure() {
        let default = Error::Database {
            source: sqlx::Error::InvalidArgument(
                "this store does not count the events published lately".into(),
            ),
            retryable: false,
        };
        assert!(unsupported(&default), "{default:?}");
        let failed = Error::Database {
            source: sqlx::Error::PoolTimedOut,
            retryable: true,
        };
        assert!(!unsupported(&failed), "{failed:?}");
    }
}
