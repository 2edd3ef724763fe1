//! The `metrics` feature: a capturing recorder sees the counters move as the outcome
//! tables say (transitions, re-judges and retried database errors, claims, flows and
//! parks, recovery rounds, timers fired by outcome and their lateness), and the gauges of
//! held records, of the outbox and of overdue timers, on SQLite.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use orderly::flow::{Ctx, Definition, FlowConfig, FlowOutcome, Flows, StepError};
use orderly::outbox::Outbox;
use orderly::{
    Claim, Engine, Error, Outcome, Reconciled, Records, ScopeConfig, SqliteStore, Stuck,
};

orderly::state_machine! {
    pub PayMachine {
        states: PayState { Created, Paid, Refunded }
        events: PayEvent { Pay, Refund }
        initial: Created;
        terminal: [Refunded];
        transitions: {
            Created + Pay    => Paid,
            Paid    + Refund => Refunded,
        }
    }
}

orderly::state_machine! {
    /// An order cancelled by its timer when it is not paid.
    pub TimedMachine {
        states: TimedState { Created, Paid, Cancelled }
        events: TimedEvent { Pay, Cancel }
        initial: Created;
        terminal: [Paid, Cancelled];
        transitions: {
            Created + Pay    => Paid,
            Created + Cancel => Cancelled,
        }
        timers: {
            Created after 1 h => Cancel,
        }
    }
}

orderly::flow! {
    pub Note {
        kind: "note";
        version: 1;
        steps: NoteStep { Write: local, }
    }
}

orderly::flow! {
    /// One step at the pivot that fails for good: the flow parks.
    pub Fragile {
        kind: "fragile";
        version: 1;
        steps: FragileStep { Boom: local, }
        pivot: Boom;
    }
}

/// What the recorder has seen: the recorder's snapshots hand out counters and histograms
/// as what came since the last snapshot, so they are added up here; gauges as they are.
#[derive(Default)]
struct Seen {
    values: RefCell<HashMap<String, f64>>,
}

impl Seen {
    /// The value of the counter or gauge `name` with exactly `labels` (a histogram: how
    /// many values it recorded), if recorded.
    fn value(&self, snap: &Snapshotter, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut values = self.values.borrow_mut();
        for (key, _, _, v) in snap.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let id = format!("{}{{{}}}", key.name(), labels.join(","));
            match v {
                DebugValue::Counter(n) => *values.entry(id).or_default() += n as f64,
                DebugValue::Gauge(g) => {
                    values.insert(id, g.into_inner());
                }
                DebugValue::Histogram(h) => *values.entry(id).or_default() += h.len() as f64,
            }
        }
        let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        want.sort();
        values
            .get(&format!("{name}{{{}}}", want.join(",")))
            .copied()
    }

    /// What the last snapshot left for `name` with exactly `labels`, without taking
    /// another: the recorder hands each gauge's value to one snapshot only (it reads
    /// zero in the next), so gauges set together are read together.
    fn last(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        want.sort();
        self.values
            .borrow()
            .get(&format!("{name}{{{}}}", want.join(",")))
            .copied()
    }

    /// The sum of the counter `name` over every series whose labels include `labels`.
    fn sum(&self, snap: &Snapshotter, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(snap, name, &[]);
        let values = self.values.borrow();
        values
            .iter()
            .filter(|(id, _)| {
                id.strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('{'))
                    .and_then(|rest| rest.strip_suffix('}'))
                    .is_some_and(|have| {
                        let have: Vec<&str> = have.split(',').collect();
                        labels
                            .iter()
                            .all(|(k, v)| have.contains(&format!("{k}={v}").as_str()))
                    })
            })
            .map(|(_, v)| v)
            .sum()
    }
}

#[test]
fn counters_and_gauges_move_as_the_outcome_tables_say() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || runtime.block_on(scenario(&snap)));
}

async fn scenario(snap: &Snapshotter) {
    let seen = Seen::default();
    let value =
        |snap: &Snapshotter, name: &str, labels: &[(&str, &str)]| seen.value(snap, name, labels);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = SqliteStore::demo(&url).await.unwrap();
    let transitions = |outcome: &str| {
        value(
            snap,
            "orderly_transitions_total",
            &[
                ("machine", "PayMachine"),
                ("event", "Pay"),
                ("outcome", outcome),
            ],
        )
    };

    // Transitions: applied, replayed, refused (another payment for a paid order).
    let engine: Engine<PayMachine, SqliteStore> = Engine::new(store.clone()).unwrap();
    engine.create(1).await.unwrap();
    assert!(matches!(
        engine.transition(1, PayEvent::Pay, "pay-1").await,
        Ok(Outcome::Applied { .. })
    ));
    assert_eq!(transitions("applied"), Some(1.0));
    assert_eq!(transitions("replayed"), None);
    assert!(matches!(
        engine.transition(1, PayEvent::Pay, "pay-1").await,
        Ok(Outcome::Replayed { .. })
    ));
    assert_eq!(transitions("replayed"), Some(1.0));
    let refused = engine
        .transition(1, PayEvent::Pay, "pay-2")
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::RefConflict { .. }), "{refused:?}");
    assert_eq!(transitions("ref_conflict"), Some(1.0));
    assert_eq!(
        transitions("applied"),
        Some(1.0),
        "a refusal counted as applied"
    );
    assert_eq!(
        value(
            snap,
            "orderly_transition_duration_seconds",
            &[("machine", "PayMachine"), ("outcome", "applied")]
        ),
        Some(1.0),
        "one duration recorded for the applied transition"
    );

    // A retried database error and its re-judge: another connection holds SQLite's write
    // lock, and a store with no busy timeout meets SQLITE_BUSY at once; the transition
    // retries and applies once the lock is let go.
    let impatient = SqliteStore::new(
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(2)
            .connect_with(
                orderly::backend::sqlite::connect_options(&url)
                    .unwrap()
                    .busy_timeout(Duration::ZERO),
            )
            .await
            .unwrap(),
        orderly::Tables::demo(),
    );
    let blocked: Engine<PayMachine, SqliteStore> = Engine::new(impatient).unwrap();
    blocked.create(2).await.unwrap();
    let mut holder = store.pool().acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
    });
    assert!(matches!(
        blocked.transition(2, PayEvent::Pay, "pay-3").await,
        Ok(Outcome::Applied { .. })
    ));
    release.await.unwrap();
    let busy = seen.sum(
        snap,
        "orderly_db_retryable_errors_total",
        &[("backend", "sqlite"), ("class", "retryable")],
    );
    assert!(
        busy >= 1.0,
        "SQLITE_BUSY counted as a retried error: {busy}"
    );
    let rejudged = value(
        snap,
        "orderly_transition_rejudge_total",
        &[
            ("machine", "PayMachine"),
            ("reason", "retryable database error"),
        ],
    )
    .unwrap_or(0.0);
    assert_eq!(rejudged, busy, "each retried error is one re-judge");
    assert_eq!(transitions("applied"), Some(2.0));

    // Claims: claimed, replayed, payload mismatch, in flight; the held gauge.
    let records = Records::new(store.clone())
        .scope(
            "pay",
            ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(3600)),
        )
        .unwrap();
    let claims = |outcome: &str| {
        value(
            snap,
            "orderly_claims_total",
            &[("scope", "pay"), ("outcome", outcome)],
        )
    };
    let Claim::Claimed(held) = records.claim("pay", "k1", &1).await.unwrap() else {
        panic!("a new key is claimed");
    };
    assert_eq!(claims("claimed"), Some(1.0));
    assert!(matches!(
        records.claim("pay", "k1", &1).await,
        Err(Error::InFlight { .. })
    ));
    assert_eq!(claims("in_flight"), Some(1.0));
    let now = records.held("pay").await.unwrap();
    assert_eq!(now.count, 1);
    assert_eq!(
        value(snap, "orderly_records_held", &[("scope", "pay")]),
        Some(1.0)
    );
    records.complete(&held, &"done").await.unwrap();
    assert!(matches!(
        records.claim("pay", "k1", &1).await,
        Ok(Claim::Replayed(_))
    ));
    assert_eq!(claims("replayed"), Some(1.0));
    assert!(matches!(
        records.claim("pay", "k1", &2).await,
        Err(Error::PayloadMismatch { .. })
    ));
    assert_eq!(claims("payload_mismatch"), Some(1.0));
    assert_eq!(
        value(
            snap,
            "orderly_payload_mismatches_total",
            &[("layer", "claim")]
        ),
        Some(1.0)
    );
    records.held("pay").await.unwrap();
    assert_eq!(
        value(snap, "orderly_records_held", &[("scope", "pay")]),
        Some(0.0)
    );

    // A recovery round.
    records
        .recover("pay", 10, &|_: Stuck| async { Reconciled::Unknown })
        .await
        .unwrap();
    assert_eq!(
        value(
            snap,
            "orderly_recovery_rounds_total",
            &[("job", "records"), ("outcome", "ok")]
        ),
        Some(1.0)
    );

    // Flows: completed, then its replay.
    sqlx::query("CREATE TABLE notes (id INTEGER PRIMARY KEY)")
        .execute(store.pool())
        .await
        .unwrap();
    let definition = Definition::new(Note).local(NoteStep::Write, |conn, _ctx: &Ctx<i64>| {
        Box::pin(async move {
            sqlx::query("INSERT INTO notes DEFAULT VALUES")
                .execute(conn)
                .await?;
            Ok(1)
        })
    });
    let flows = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(definition)
        .unwrap();
    for replayed in ["false", "true"] {
        let started = flows.start(Note, "n1", &7_i64).await.unwrap();
        assert!(matches!(started.outcome, FlowOutcome::Completed(_)));
        assert_eq!(
            value(
                snap,
                "orderly_flows_total",
                &[
                    ("kind", "note"),
                    ("outcome", "completed"),
                    ("replayed", replayed)
                ]
            ),
            Some(1.0)
        );
    }

    // A park: the step at the pivot fails for good.
    let fragile = Definition::new(Fragile).local(FragileStep::Boom, |_conn, _ctx: &Ctx<i64>| {
        Box::pin(async move { Err::<i64, _>(StepError::fail("the warehouse said no")) })
    });
    let flows = flows.register(fragile).unwrap();
    let parked = flows.start(Fragile, "f1", &1_i64).await.unwrap();
    assert!(
        matches!(parked.outcome, FlowOutcome::Parked { .. }),
        "{:?}",
        parked.outcome
    );
    assert_eq!(
        value(
            snap,
            "orderly_flows_parked_total",
            &[("kind", "fragile"), ("reason", "FAILED_PAST_PIVOT")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            snap,
            "orderly_flows_total",
            &[
                ("kind", "fragile"),
                ("outcome", "parked"),
                ("replayed", "false")
            ]
        ),
        Some(1.0)
    );
    // Its replay is answered parked, and not counted as a second park.
    flows.start(Fragile, "f1", &1_i64).await.unwrap();
    assert_eq!(
        value(
            snap,
            "orderly_flows_parked_total",
            &[("kind", "fragile"), ("reason", "FAILED_PAST_PIVOT")]
        ),
        Some(1.0)
    );

    // The outbox's gauges.
    let stats = Outbox::new(store.clone()).stats().await.unwrap();
    assert_eq!(stats.pending, 0);
    assert_eq!(value(snap, "orderly_outbox_pending", &[]), Some(0.0));
    assert_eq!(value(snap, "orderly_outbox_dead", &[]), Some(0.0));

    // Timers: one applied, one moot (its order paid in time), one not due; the lateness
    // of the two that fired, and the overdue gauges.
    let timed: Engine<TimedMachine, SqliteStore> = Engine::new(store.clone()).unwrap();
    for id in 101..=103 {
        timed.create(id).await.unwrap();
    }
    timed
        .transition(102, TimedEvent::Pay, "pay-102")
        .await
        .unwrap();
    sqlx::query("UPDATE orderly_timers SET due_at = due_at - 3600000 - 5000, next_at = 0 WHERE entity_id IN (101, 102)")
        .execute(store.pool())
        .await
        .unwrap();
    let timers = orderly::Timers::new(store.clone()).fire(timed.clone());
    let stats = timers.stats().await.unwrap();
    assert_eq!((stats.pending, stats.due), (3, 2), "{stats:?}");
    assert_eq!(value(snap, "orderly_timers_overdue", &[]), Some(2.0));
    let late = seen
        .last("orderly_timers_oldest_lateness_seconds", &[])
        .unwrap();
    assert!((5.0..60.0).contains(&late), "{late} {stats:?}");
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.applied, round.moot), (1, 1), "{round:?}");
    for outcome in ["applied", "moot"] {
        assert_eq!(
            value(
                snap,
                "orderly_timers_fired_total",
                &[("machine", "TimedMachine"), ("outcome", outcome)]
            ),
            Some(1.0),
            "{outcome}"
        );
    }
    assert_eq!(
        value(
            snap,
            "orderly_timer_lateness_seconds",
            &[("machine", "TimedMachine")]
        ),
        Some(2.0),
        "two lateness values recorded"
    );
    timers.stats().await.unwrap();
    assert_eq!(value(snap, "orderly_timers_overdue", &[]), Some(0.0));
    assert_eq!(
        seen.last("orderly_timers_oldest_lateness_seconds", &[]),
        Some(0.0)
    );
}
