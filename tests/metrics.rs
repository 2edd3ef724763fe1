//! The `metrics` feature: a capturing recorder sees the counters move as the outcome
//! tables say (transitions, claims, flows, recovery rounds), and the gauges of held
//! records and of the outbox, on SQLite.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use orderly::flow::{Ctx, Definition, FlowConfig, FlowOutcome, Flows};
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

orderly::flow! {
    pub Note {
        kind: "note";
        version: 1;
        steps: NoteStep { Write: local, }
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
    let store = SqliteStore::connect(&url).await.unwrap();
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

    // Claims: claimed, replayed, payload mismatch, in flight; the held gauge.
    let records = Records::new(store.clone())
        .scope(
            "pay",
            ScopeConfig {
                lease: Duration::from_secs(30),
                retention: Duration::from_secs(3600),
            },
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

    // The outbox's gauges.
    let stats = Outbox::new(store.clone()).stats().await.unwrap();
    assert_eq!(stats.pending, 0);
    assert_eq!(value(snap, "orderly_outbox_pending", &[]), Some(0.0));
    assert_eq!(value(snap, "orderly_outbox_dead", &[]), Some(0.0));
}
