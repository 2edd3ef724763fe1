//! One body per behaviour, run against every backend through the `conformance!` macro.
//! Each test gets its own fresh database from its backend's `Backend::fresh`.
#![allow(dead_code)]

pub mod audit;
pub mod coalesce;
pub mod faults;
pub mod flow_deadline;
pub mod flows;
pub mod idempotency;
pub mod outbox;
pub mod records_faults;
pub mod records_jobs;
pub mod records_model;
pub mod schema;
#[allow(unused_imports)]
pub use audit::*;
#[allow(unused_imports)] // used through `conformance!`; a binary without it has no use
pub use coalesce::*;
#[allow(unused_imports)]
pub use faults::*;
#[allow(unused_imports)]
pub use flow_deadline::*;
#[allow(unused_imports)]
pub use flows::*;
#[allow(unused_imports)] // the Galera suites share the harness, not these bodies
pub use idempotency::*;
#[allow(unused_imports)]
pub use outbox::*;
#[allow(unused_imports)]
pub use records_faults::*;
#[allow(unused_imports)]
pub use records_jobs::*;
#[allow(unused_imports)]
pub use records_model::*;
#[allow(unused_imports)]
pub use schema::*;

use std::collections::HashMap;
use std::ops::DerefMut;
use std::sync::Arc;
use std::time::Duration;

use orderly::store::{OwnedKey, Store, Txn};
use orderly::testing::{check_engine, steps};
use orderly::{Engine, EngineConfig, Error, Outcome, ReadFirst, Tables};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

orderly::state_machine! {
    /// The worked example of the core issue.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Delivered, Cancelled, Refunded }
        events: OrderEvent { Pay, Ship, Deliver, Cancel, Refund }
        initial: Created;
        terminal: [Delivered, Cancelled, Refunded];
        transitions: {
            Created + Pay     => Paid     emits OrderPaid,
            Created + Cancel  => Cancelled,
            Paid    + Ship    => Shipped  emits OrderShipped,
            Paid    + Refund  => Refunded,
            Shipped + Deliver => Delivered,
        }
    }
}

use OrderEvent::*;
use OrderState::*;

pub type Eng<B> = Engine<OrderMachine, <B as Backend>::S>;

/// What a test needs from a backend: a fresh database and a few dialect-specific moves.
#[allow(async_fn_in_trait)]
pub trait Backend: Sized + Send + Sync + 'static {
    type S: orderly::flow::FlowStore + orderly::outbox::OutboxStore;
    /// An open transaction on its own connection, held by the test.
    type Tx: DerefMut<Target = <Self::S as Store>::Conn> + Send;

    /// A new, empty, migrated database.
    async fn fresh() -> Self;
    /// The harness's [`ReadFirst`] policy, for the engines of every test that does not
    /// choose one itself.
    const POLICY: ReadFirst;
    /// A store on the default tables; `lock_timeout` bounds how long a statement waits
    /// for a row lock before the database reports a retryable error.
    async fn store(&self, lock_timeout: Duration) -> Self::S;
    /// Creates `shop_orders` (with extra columns) and `shop_order_log`, and a store on them.
    async fn custom_store(&self) -> Self::S;
    /// Runs literal SQL.
    async fn exec(&self, sql: &str);
    /// Selects one integer.
    async fn scalar(&self, sql: &str) -> i64;
    /// Begins a transaction the way a caller would (write intent on SQLite).
    async fn begin(&self) -> Self::Tx;
    /// A transaction on a connection the test holds.
    type TxOn<'c>: DerefMut<Target = <Self::S as Store>::Conn> + Send;
    /// Begins one the way a caller would, on `conn`.
    async fn begin_on(conn: &mut <Self::S as Store>::Conn) -> Self::TxOn<'_>;
    /// Commits what [`begin_on`](Self::begin_on) began.
    async fn commit_on(tx: Self::TxOn<'_>);
    async fn exec_in(tx: &mut Self::Tx, sql: &str);
    /// Runs literal SQL on a connection (inside whatever transaction is open on it), as a
    /// flow's local step would.
    fn exec_conn<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        sql: String,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>>;
    async fn commit(tx: Self::Tx);
    async fn rollback(tx: Self::Tx);
    /// Commits; whether it succeeded.
    async fn try_commit(tx: Self::Tx) -> bool;
    /// Drops the database.
    async fn cleanup(self);
    /// A store on a pool of at most `max` connections.
    async fn small_store(&self, max: u32) -> Self::S;
    /// The store's pool: `(connections open, connections idle)`.
    fn pool_counts(store: &Self::S) -> (u32, usize);
    /// How many sessions on this database hold a transaction open while idle (on SQLite:
    /// whether another connection holds the write lock).
    async fn open_transactions(&self) -> i64;
    /// How many sessions on this database wait for a lock another holds (SQLite has no
    /// row locks: 0).
    async fn lock_waits(&self) -> i64;
    /// What a child process needs to reach this database: [`child_store`](Self::child_store)
    /// turns it into a store.
    fn child_handle(&self) -> String;
    /// A store on the database of [`child_handle`](Self::child_handle), in a child process.
    async fn child_store(handle: &str) -> Self::S;
}

/// How the harness's engines start a transition (`EngineConfig::read_first`).
pub trait Policy: Send + Sync + 'static {
    const READ_FIRST: ReadFirst;
}

/// The default.
pub struct Adaptive;
impl Policy for Adaptive {
    const READ_FIRST: ReadFirst = ReadFirst::Adaptive;
}

/// Every transition reads the request's history row first.
pub struct Always;
impl Policy for Always {
    const READ_FIRST: ReadFirst = ReadFirst::Always;
}

/// The `Backend` methods that only run literal SQL, for a harness with a `pool` field;
/// `$conn` is the backend's connection type.
#[macro_export]
macro_rules! harness_sql_methods {
    ($conn:ty) => {
        async fn exec(&self, sql: &str) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(&self.pool)
                .await
                .unwrap();
        }

        async fn scalar(&self, sql: &str) -> i64 {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
                .fetch_one(&self.pool)
                .await
                .unwrap()
        }

        async fn exec_in(tx: &mut Self::Tx, sql: &str) {
            let conn: &mut $conn = tx;
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(conn)
                .await
                .unwrap();
        }

        fn exec_conn<'c>(
            conn: &'c mut $conn,
            sql: String,
        ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>> {
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(conn)
                    .await
                    .map(drop)
            })
        }

        async fn commit(tx: Self::Tx) {
            tx.commit().await.unwrap();
        }

        async fn rollback(tx: Self::Tx) {
            tx.rollback().await.unwrap();
        }

        async fn try_commit(tx: Self::Tx) -> bool {
            tx.commit().await.is_ok()
        }
    };
}

/// Instantiates every behaviour for one backend.
#[macro_export]
macro_rules! conformance {
    ($backend:ty) => {
        $crate::conformance!(@tests $backend;
            applied_moves_the_order_once,
            duplicate_callback_is_replayed,
            replay_after_the_order_moved_on,
            payload_is_fingerprinted,
            second_payment_is_a_ref_conflict,
            disallowed_event_is_invalid_transition,
            missing_order_is_not_found,
            create_is_idempotent_at_initial_state,
            corrupt_status_is_reported_not_panicked,
            bad_input_is_rejected_before_any_query,
            contention_after_the_retry_budget,
            lost_race_is_rejudged_not_reapplied,
            caller_transaction_commits_or_rolls_back_both,
            caller_transactions_race_one_applies,
            custom_table_names_drive_an_existing_table,
            identical_requests_storm_one_applied,
            distinct_refs_storm_one_wins,
            hot_rows_no_lost_update_no_double_apply,
            engine_agrees_with_reference_model,
            many_source_event_records_its_source,
            cycle_replays_by_ref_not_by_state,
            caller_transaction_replays_a_recorded_twin,
            cycle_storm_answers_match_the_history,
            batched_read_answers_each_request,
            replay_storm_answers_each_caller,
            cancelled_calls_leave_the_pool_clean,
            twin_on_a_cycle_is_replayed_not_a_conflict,
            racing_engines_never_conflict_with_themselves,
            same_payload_in_any_member_order_is_replayed,
            corrupt_rows_are_reported_not_written_over,
            version_at_its_limit_is_corrupt_state,
            records_impossible_rows_are_reported_not_replayed,
            write_unit_carries_several_requests,
            own_statement_errors_classify_as_the_stores_do,
            emitting_edges_write_their_event_with_the_transition,
            claim_follows_the_outcome_table,
            expired_lease_is_taken_over_and_the_late_holder_fenced,
            identical_claims_storm_one_runs,
            coalesced_claims_answer_each_claim_truly,
            claims_dropped_while_queued_are_never_sent,
            complete_in_commits_with_the_callers_writes,
            expired_records_count_as_absent,
            recovery_applies_the_reconcilers_verdict,
            recovery_jobs_race_each_record_once,
            recovery_loop_stops_on_shutdown,
            purge_removes_only_expired_records,
            tokens_are_consumed_once,
            run_commits_the_work_with_its_record,
            records_calls_dropped_at_every_await_point,
            records_agree_with_the_table_model,
            flow_runs_each_step_once,
            flow_failure_compensates_in_reverse,
            flow_compensation_is_retried,
            flow_failing_compensation_parks_until_resumed,
            flow_concurrent_starts_run_once,
            flow_coalesced_starts_each_run_once,
            flow_crash_at_every_point_is_recovered,
            flow_dropped_by_its_caller_runs_to_its_end,
            flow_recovery_jobs_race,
            flow_unsafe_step_parks_for_reconciliation,
            flow_attempt_cap_parks_a_crashing_step,
            flow_unknown_version_is_left_alone,
            flow_bad_definitions_are_rejected,
            flow_payment_callback_delivered_three_times,
            flow_runner_killed_by_sigkill_is_recovered,
            flow_failure_past_the_pivot_parks,
            flow_purge_removes_only_finished_flows,
            flow_unrecordable_call_output_is_never_compensated,
            flow_long_step_error_is_stored_cut_with_a_marker,
            flow_step_of_another_flow_is_refused,
            flow_unknown_park_reason_is_corrupt_to_start_and_resume,
            flow_attempt_counter_at_its_limit_parks,
            relays_race_each_event_once_in_order,
            relays_keep_order_while_events_commit,
            poison_event_dies_without_holding_back_others,
            corrupt_rows_are_set_aside_and_hold_back_only_their_entity,
            a_table_without_write_id_is_refused_with_its_fix,
            who_and_why_are_stored_with_the_history_row,
            event_bodies_are_bounded_when_written,
            records_calls_dropped_in_flight_finish_off_task,
            a_flow_whose_caller_stops_waiting_runs_to_its_end,
            relay_dropped_at_every_await_point_leaves_nothing_claimed,
            relay_shutdown_finishes_the_batch_in_hand,
            outbox_purge_and_stats,
            inbox_dedupes_inside_the_consumers_transaction,
            events_commit_with_records_run,
            relay_killed_by_sigkill_another_finishes,
            event_body_is_published_as_the_message_body,
            events_commit_with_flow_local_steps,
            coalesced_writes_answer_each_request,
            a_failing_request_leaves_its_unit_true,
            callers_dropped_around_their_unit,
            one_entity_many_requests_coalesced,
            coalesced_engine_agrees_with_the_model,
        );
    };
    // The network faults, for a backend that implements `Networked`.
    (@networked $backend:ty) => {
        $crate::conformance!(@tests $backend;
            in_doubt_commit_is_read_back,
            resent_request_cut_under_its_write_is_replayed,
            own_write_landing_late_is_applied,
            dead_database_answers_within_the_deadline,
            cancelled_calls_return_their_connection_warm,
            killed_connections_are_retryable,
            records_lost_acknowledgements_are_read_back,
            records_write_lost_before_the_server_is_retried,
            records_dead_database_answers_within_the_deadline,
        );
    };
    (@tests $backend:ty; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                // A child process of a test that kills one: be the child, nothing else.
                if let Ok(spec) = std::env::var($crate::conformance::CHILD) {
                    return $crate::conformance::child::<$backend>(&spec).await;
                }
                let backend = <$backend as $crate::conformance::Backend>::fresh().await;
                $crate::conformance::$name(&backend).await;
                backend.cleanup().await;
            }
        )+
    };
}

/// A child process of a test that kills one: the relay's or the flow runner's.
pub(crate) async fn child<B: Backend>(spec: &str) {
    match spec.strip_prefix(outbox::RELAY_CHILD) {
        Some(relay) => outbox::relay_child::<B>(relay).await,
        None => flows::flow_child::<B>(spec).await,
    }
}

pub(crate) async fn engine<B: Backend>(b: &B) -> Eng<B> {
    with_policy(b.store(Duration::from_secs(10)).await, B::POLICY)
}

/// The default configuration with `policy`.
pub(crate) fn config(policy: ReadFirst) -> EngineConfig {
    EngineConfig {
        read_first: policy,
        ..EngineConfig::default()
    }
}

/// An engine on `store` that starts its transitions as `policy` says.
pub(crate) fn with_policy<M: orderly::StateMachine, S: Store>(
    store: S,
    policy: ReadFirst,
) -> Engine<M, S> {
    Engine::with_config(store, config(policy)).expect("valid machine")
}

pub(crate) fn applied(from: OrderState, to: OrderState, version: i64) -> Outcome<OrderState> {
    Outcome::Applied { from, to, version }
}

pub(crate) fn replayed(from: OrderState, to: OrderState, version: i64) -> Outcome<OrderState> {
    Outcome::Replayed { from, to, version }
}

pub(crate) async fn assert_order<S: Store>(
    e: &Engine<OrderMachine, S>,
    id: i64,
    state: OrderState,
    version: i64,
    rows: usize,
) {
    let order = e.get(id).await.unwrap();
    assert_eq!((order.state, order.version), (state, version), "order {id}");
    assert_eq!(e.history(id).await.unwrap().len(), rows, "history of {id}");
}

pub async fn applied_moves_the_order_once<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let out = e.transition(1, Pay, "p-1").await.unwrap();
    assert_eq!(out, applied(Created, Paid, 1));
    assert_order(&e, 1, Paid, 1, 1).await;
    let h = e.history(1).await.unwrap();
    assert_eq!(
        (h[0].seq, h[0].from, h[0].to, h[0].event),
        (1, Created, Paid, Pay)
    );
    assert_eq!(h[0].ref_id, "p-1");
    assert_eq!(h[0].payload, None);
}

pub async fn duplicate_callback_is_replayed<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    for _ in 0..2 {
        assert_eq!(
            e.transition(1, Pay, "p-1").await.unwrap(),
            replayed(Created, Paid, 1)
        );
    }
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn replay_after_the_order_moved_on<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    e.transition(1, Pay, "p-1").await.unwrap();
    e.transition(1, Ship, "s-1").await.unwrap();
    e.transition(1, Deliver, "d-1").await.unwrap();
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        replayed(Created, Paid, 1)
    );
    assert_eq!(
        e.transition(1, Ship, "s-1").await.unwrap(),
        replayed(Paid, Shipped, 2)
    );
    assert_order(&e, 1, Delivered, 3, 3).await;
}

pub async fn payload_is_fingerprinted<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let body = serde_json::json!({"amount": 100, "currency": "EUR"});
    let out = e.transition(1, Pay, "p-1").payload(&body).await.unwrap();
    assert_eq!(out, applied(Created, Paid, 1));
    let same = e.transition(1, Pay, "p-1").payload(&body).await.unwrap();
    assert_eq!(same, replayed(Created, Paid, 1));
    let other = serde_json::json!({"amount": 200, "currency": "EUR"});
    let err = e
        .transition(1, Pay, "p-1")
        .payload(&other)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::PayloadMismatch { ref reference, .. } if reference == "p-1"),
        "{err:?}"
    );
    assert!(err.is_conflict());
    // Without a payload it is a different request under the same reference, too.
    let bare = e.transition(1, Pay, "p-1").await.unwrap_err();
    assert!(matches!(bare, Error::PayloadMismatch { .. }), "{bare:?}");
    let h = e.history(1).await.unwrap();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].payload.as_ref(), Some(&body));
    assert_eq!(h[0].payload_hash.as_ref().map(String::len), Some(64));
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn second_payment_is_a_ref_conflict<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    e.transition(1, Pay, "p-1").await.unwrap();
    let err = e.transition(1, Pay, "p-2").await.unwrap_err();
    assert!(
        matches!(err, Error::RefConflict { ref existing_ref, .. } if existing_ref == "p-1"),
        "{err:?}"
    );
    assert!(err.is_conflict() && !err.is_retryable());
    // Still named after the order moved on.
    e.transition(1, Ship, "s-1").await.unwrap();
    let err = e.transition(1, Pay, "p-3").await.unwrap_err();
    assert!(
        matches!(err, Error::RefConflict { ref existing_ref, .. } if existing_ref == "p-1"),
        "{err:?}"
    );
    assert_order(&e, 1, Shipped, 2, 2).await;
}

pub async fn disallowed_event_is_invalid_transition<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let err = e.transition(1, Ship, "s-1").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidTransition {
                state: "Created",
                event: "Ship"
            }
        ),
        "{err:?}"
    );
    assert_order(&e, 1, Created, 0, 0).await;
    // A terminal state refuses everything, including an event never applied before.
    e.transition(1, Cancel, "c-1").await.unwrap();
    let err = e.transition(1, Refund, "r-1").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidTransition {
                state: "Cancelled",
                event: "Refund"
            }
        ),
        "{err:?}"
    );
    assert_order(&e, 1, Cancelled, 1, 1).await;
}

pub async fn missing_order_is_not_found<B: Backend>(b: &B) {
    let e = engine(b).await;
    let err = e.transition(404, Pay, "p-1").await.unwrap_err();
    assert!(matches!(err, Error::NotFound { order_id: 404 }), "{err:?}");
    assert!(matches!(
        e.get(404).await,
        Err(Error::NotFound { order_id: 404 })
    ));
    assert!(e.history(404).await.unwrap().is_empty());
}

pub async fn create_is_idempotent_at_initial_state<B: Backend>(b: &B) {
    let e = engine(b).await;
    let first = e.create(1).await.unwrap();
    assert_eq!((first.state, first.version), (Created, 0));
    let again = e.create(1).await.unwrap();
    assert_eq!(again, first);
    e.transition(1, Pay, "p-1").await.unwrap();
    let err = e.create(1).await.unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists { order_id: 1, ref state } if state == "Paid"),
        "{err:?}"
    );
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn corrupt_status_is_reported_not_panicked<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    b.exec("UPDATE orders SET status = 'Teleported' WHERE id = 1")
        .await;
    let err = e.transition(1, Pay, "p-1").await.unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 1, ref value } if value == "Teleported"),
        "{err:?}"
    );
    assert!(matches!(e.get(1).await, Err(Error::CorruptState { .. })));
    assert_eq!(b.scalar("SELECT COUNT(*) FROM order_transitions").await, 0);
    // A corrupt history row is reported the same way.
    e.create(2).await.unwrap();
    e.transition(2, Pay, "p-1").await.unwrap();
    b.exec("UPDATE order_transitions SET from_status = 'Limbo' WHERE order_id = 2")
        .await;
    assert!(matches!(
        e.transition(2, Pay, "p-1").await,
        Err(Error::CorruptState { .. })
    ));
    assert!(matches!(
        e.history(2).await,
        Err(Error::CorruptState { .. })
    ));
}

pub async fn bad_input_is_rejected_before_any_query<B: Backend>(b: &B) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    for bad in ["", "   ", &"x".repeat(256), "p\n1", "p-1 ", " p-1"] {
        let err = e.transition(1, Pay, bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{bad:?}: {err:?}");
    }
    let err = e.transition_named(1, "Teleport", "t-1").await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(Tables::new("orders; DROP TABLE orders", "h").is_err());
    assert!(Tables::new("orders", "a.b.c").is_err());
    assert_order(&e, 1, Created, 0, 0).await;
    // 255 characters (multi-byte ones too) is the limit, not an error.
    let long = "é".repeat(255);
    assert_eq!(
        e.transition(1, Pay, &long).await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert_eq!(
        e.transition_named(1, "Ship", "s-1").await.unwrap(),
        applied(Paid, Shipped, 2)
    );
    assert_eq!(e.history(1).await.unwrap()[0].ref_id, long);
}

pub async fn contention_after_the_retry_budget<B: Backend>(b: &B) {
    let config = EngineConfig {
        max_attempts: 3,
        ..config(B::POLICY)
    };
    let e: Eng<B> = Engine::with_config(b.store(Duration::from_millis(200)).await, config).unwrap();
    e.create(1).await.unwrap();
    // Another transaction holds the row (and on SQLite, the write lock) past every attempt.
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let err = e.transition(1, Pay, "p-1").await.unwrap_err();
    assert!(matches!(err, Error::Contention { attempts: 3 }), "{err:?}");
    assert!(err.is_retryable());
    B::rollback(holder).await;
    assert_order(&e, 1, Created, 0, 0).await;
    assert_eq!(
        e.transition(1, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
}

pub async fn lost_race_is_rejudged_not_reapplied<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in [1, 2] {
        e.create(id).await.unwrap();
    }
    for (id, ours, expect_conflict) in [(1, "p-2", true), (2, "p-1", false)] {
        // A rival applies Pay p-1 in its own transaction and commits a little later; our
        // request reads the order as Created, waits on the row, loses the CAS, re-reads.
        let mut rival = b.begin().await;
        B::exec_in(
            &mut rival,
            &format!("UPDATE orders SET status = 'Paid', version = version + 1 WHERE id = {id}"),
        )
        .await;
        B::exec_in(
            &mut rival,
            &format!("INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES ({id}, 1, 'Created', 'Paid', 'Pay', 'p-1')"),
        )
        .await;
        let ours_task = {
            let e = e.clone();
            tokio::spawn(async move { e.transition(id, Pay, ours).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The race happened: our request was still waiting behind the rival's write.
        assert!(
            !ours_task.is_finished(),
            "answered before the rival committed: the test shows nothing"
        );
        B::commit(rival).await;
        let result = ours_task.await.unwrap();
        if expect_conflict {
            assert!(
                matches!(result, Err(Error::RefConflict { ref existing_ref, .. }) if existing_ref == "p-1"),
                "{result:?}"
            );
        } else {
            assert_eq!(result.unwrap(), replayed(Created, Paid, 1));
        }
        assert_order(&e, id, Paid, 1, 1).await;
    }
}

/// Waits until every open connection of `store`'s pool is idle (a connection given back
/// is returned by a task of its own, a moment later); panics after 5 s.
pub(crate) async fn until_the_pool_is_idle<B: Backend>(store: &B::S) {
    let waited = std::time::Instant::now();
    loop {
        let (open, idle) = B::pool_counts(store);
        if open as usize == idle {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the pool's connections never came back"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until a connection of `store`'s pool is in use (a request that takes its
/// write turn before its connection then holds the turn), or `finished()`; panics after
/// 5 s. What the test sends next queues behind that request, however long a loaded
/// machine took to get it there. Call [`until_the_pool_is_idle`] before the request.
pub(crate) async fn until_a_connection_is_taken<B: Backend>(
    store: &B::S,
    finished: impl Fn() -> bool,
) {
    let waited = std::time::Instant::now();
    loop {
        let (open, idle) = B::pool_counts(store);
        if open as usize > idle || finished() {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the request never took a connection"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A genuine deadlock, for the backends that detect them: the rival holds the history key
/// of `(1, Pay, p-1)` and then wants the order row; the engine holds the order row and
/// wants the history key. The database aborts the engine's attempt; the engine re-reads
/// and answers `Replayed`, with one application in all. `ballast` runs in the rival's
/// transaction first (InnoDB rolls back the lighter transaction). The caller checks the
/// database's own evidence that a deadlock happened.
pub async fn deadlock_scenario<B: Backend>(b: &B, ballast: &[&str]) {
    let e = engine(b).await;
    e.create(1).await.unwrap();
    let mut rival = b.begin().await;
    for sql in ballast {
        B::exec_in(&mut rival, sql).await;
    }
    B::exec_in(
        &mut rival,
        "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES (1, 1, 'Created', 'Paid', 'Pay', 'p-1')",
    )
    .await;
    let ours = {
        let e = e.clone();
        tokio::spawn(async move { e.transition(1, Pay, "p-1").await })
    };
    // The engine waits on the rival's history row (its unique key) while it holds the
    // order's row: seen, not assumed after a sleep.
    let waited = std::time::Instant::now();
    while b.lock_waits().await == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "the engine never waited on the rival's lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Closes the cycle: blocks on the engine's row lock until the detector aborts the engine.
    B::exec_in(
        &mut rival,
        "UPDATE orders SET status = 'Paid', version = version + 1 WHERE id = 1",
    )
    .await;
    B::commit(rival).await;
    assert_eq!(ours.await.unwrap().unwrap(), replayed(Created, Paid, 1));
    assert_order(&e, 1, Paid, 1, 1).await;
}

pub async fn caller_transaction_commits_or_rolls_back_both<B: Backend>(b: &B) {
    b.exec("CREATE TABLE reservations (order_id BIGINT NOT NULL, sku VARCHAR(32) NOT NULL)")
        .await;
    let e = engine(b).await;
    e.create(1).await.unwrap();

    let mut tx = b.begin().await;
    B::exec_in(
        &mut tx,
        "INSERT INTO reservations (order_id, sku) VALUES (1, 'sku-1')",
    )
    .await;
    let out = e.transition(1, Pay, "p-1").within(&mut tx).await.unwrap();
    assert_eq!(out, applied(Created, Paid, 1));
    B::rollback(tx).await;
    assert_eq!(b.scalar("SELECT COUNT(*) FROM reservations").await, 0);
    assert_order(&e, 1, Created, 0, 0).await;

    let mut tx = b.begin().await;
    B::exec_in(
        &mut tx,
        "INSERT INTO reservations (order_id, sku) VALUES (1, 'sku-1')",
    )
    .await;
    e.transition(1, Pay, "p-1").within(&mut tx).await.unwrap();
    // Inside the same transaction a repeat is already a replay, and a rival a conflict.
    assert_eq!(
        e.transition(1, Pay, "p-1").within(&mut tx).await.unwrap(),
        replayed(Created, Paid, 1)
    );
    assert!(matches!(
        e.transition(1, Pay, "p-2").within(&mut tx).await,
        Err(Error::RefConflict { .. })
    ));
    B::commit(tx).await;
    assert_eq!(b.scalar("SELECT COUNT(*) FROM reservations").await, 1);
    assert_order(&e, 1, Paid, 1, 1).await;

    // An order created and moved inside a transaction that rolls back never existed;
    // committed, it did.
    for commit in [false, true] {
        let mut tx = b.begin().await;
        let created = e.create(2).within(&mut tx).await.unwrap();
        assert_eq!((created.state, created.version), (Created, 0));
        e.transition(2, Pay, "p-9").within(&mut tx).await.unwrap();
        if commit {
            B::commit(tx).await;
            assert_order(&e, 2, Paid, 1, 1).await;
        } else {
            B::rollback(tx).await;
            assert!(matches!(
                e.get(2).await,
                Err(Error::NotFound { order_id: 2 })
            ));
        }
    }
}

/// 16 callers, each in its own transaction: begin, a transition `within` it, commit (or roll back
/// on error). Half send the same reference, half their own: one application in all. The
/// race happened: a loser began before the winner had committed (up to
/// [`RACE_ROUNDS`] rounds, each on an order of its own, until one shows it).
pub async fn caller_transactions_race_one_applies<B: Backend>(b: &B) {
    let e = engine(b).await;
    let mut raced_winner = 0;
    for id in 1..=RACE_ROUNDS as i64 {
        e.create(id).await.unwrap();
        let caller = |r: String| {
            let e = e.clone();
            timed(async move {
                let mut tx = b.begin().await;
                let out = e.transition(id, Pay, &r).within(&mut tx).await;
                match out {
                    Ok(_) => B::commit(tx).await,
                    Err(_) => B::rollback(tx).await,
                }
                (r, out)
            })
        };
        let refs = (0..16).map(|i| {
            if i % 2 == 0 {
                "p-0".to_string()
            } else {
                format!("p-{i}")
            }
        });
        let (results, spans): (Vec<_>, Vec<_>) = futures_util::future::join_all(refs.map(caller))
            .await
            .into_iter()
            .unzip();
        let winner = results
            .iter()
            .position(|(_, out)| matches!(out, Ok(o) if o.is_applied()))
            .expect("one caller applies");
        let winner_ref = results[winner].0.clone();
        for (r, out) in &results {
            match out {
                Ok(o) if o.is_applied() => assert_eq!(r, &winner_ref),
                Ok(o) => assert_eq!(
                    (r, *o),
                    (&winner_ref, replayed(Created, Paid, 1)),
                    "{results:?}"
                ),
                Err(Error::RefConflict { existing_ref, .. }) => {
                    assert_ne!(r, &winner_ref);
                    assert_eq!(existing_ref, &winner_ref);
                }
                Err(other) => panic!("{r}: unexpected {other:?}"),
            }
        }
        let applied = results
            .iter()
            .filter(|(_, o)| matches!(o, Ok(o) if o.is_applied()))
            .count();
        assert_eq!(applied, 1, "{results:?}");
        assert_order(&e, id, Paid, 1, 1).await;
        raced_winner = raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {RACE_ROUNDS} rounds no caller began before the winner committed: no race"
    );
}

pub async fn custom_table_names_drive_an_existing_table<B: Backend>(b: &B) {
    let e: Eng<B> = with_policy(b.custom_store().await, B::POLICY);
    // The user's table has columns of its own; orderly reads and writes only id/status/version.
    b.exec(
        "INSERT INTO shop_orders (id, customer, status, version) VALUES (7, 'ada', 'Created', 0)",
    )
    .await;
    assert_eq!(
        e.transition(7, Pay, "p-1").await.unwrap(),
        applied(Created, Paid, 1)
    );
    assert_eq!(
        e.transition(7, Pay, "p-1").await.unwrap(),
        replayed(Created, Paid, 1)
    );
    e.create(8).await.unwrap();
    assert_order(&e, 7, Paid, 1, 1).await;
    assert_eq!(b.scalar("SELECT COUNT(*) FROM shop_order_log").await, 1);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM shop_orders WHERE customer = 'ada'")
            .await,
        1
    );
    // The default tables were not touched.
    assert_eq!(b.scalar("SELECT COUNT(*) FROM order_transitions").await, 0);
}

/// How many rounds a storm test runs, each on an entity of its own, until one shows
/// that its callers raced (on a loaded machine one round may happen to run them one
/// after another).
pub const RACE_ROUNDS: usize = 5;

/// When a call was sent and when it was answered.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub sent: std::time::Instant,
    pub answered: std::time::Instant,
}

/// Runs `call`, noting when it was sent and when it was answered.
pub async fn timed<T>(call: impl std::future::IntoFuture<Output = T>) -> (T, Span) {
    let sent = std::time::Instant::now();
    let out = call.await;
    let answered = std::time::Instant::now();
    (out, Span { sent, answered })
}

/// How many of the other calls were running while call `first` ran (sent before it was
/// answered, answered after it was sent): the callers that raced it. Callers served one
/// after another have none.
pub fn raced(spans: &[Span], first: usize) -> usize {
    let f = spans[first];
    spans
        .iter()
        .enumerate()
        .filter(|(i, s)| *i != first && s.sent < f.answered && f.sent < s.answered)
        .count()
}

/// `n` concurrent tasks; task `i` sends `Pay` on order `id` with `ref_of(i)`.
async fn storm<S: Store>(
    e: &Engine<OrderMachine, S>,
    id: i64,
    n: usize,
    ref_of: impl Fn(usize) -> String,
) -> (Vec<Result<Outcome<OrderState>, Error>>, Vec<Span>) {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (e, barrier, r) = (e.clone(), barrier.clone(), ref_of(i));
            tokio::spawn(async move {
                barrier.wait().await;
                timed(e.transition(id, Pay, &r)).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out.into_iter().unzip()
}

pub const STORM: usize = 64;

/// 64 identical requests at once: one `Applied`, the others `Replayed`. The race
/// happened: a replay was sent while the applied request was still running.
pub async fn identical_requests_storm_one_applied<B: Backend>(b: &B) {
    let e = engine(b).await;
    let mut raced_winner = 0;
    for id in 1..=RACE_ROUNDS as i64 {
        e.create(id).await.unwrap();
        let (results, spans) = storm(&e, id, STORM, |_| "p-1".to_string()).await;
        let applied_n = results
            .iter()
            .filter(|r| matches!(r, Ok(o) if o.is_applied()))
            .count();
        let replayed_n = results
            .iter()
            .filter(|r| matches!(r, Ok(o) if *o == replayed(Created, Paid, 1)))
            .count();
        assert_eq!((applied_n, replayed_n), (1, STORM - 1), "{results:?}");
        assert_order(&e, id, Paid, 1, 1).await;
        let winner = results
            .iter()
            .position(|r| matches!(r, Ok(o) if o.is_applied()))
            .unwrap();
        raced_winner = raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {RACE_ROUNDS} rounds no replay was sent while the applied request ran: no race"
    );
}

/// 64 payments with references of their own at once: one wins, every other is refused
/// naming it. The race happened: a refused payment was sent while the winner ran.
pub async fn distinct_refs_storm_one_wins<B: Backend>(b: &B) {
    let e = engine(b).await;
    let mut raced_winner = 0;
    for id in 1..=RACE_ROUNDS as i64 {
        e.create(id).await.unwrap();
        let (results, spans) = storm(&e, id, STORM, |i| format!("p-{i}")).await;
        let winner = results
            .iter()
            .position(|r| matches!(r, Ok(o) if o.is_applied()))
            .expect("one payment wins");
        let winner_ref = format!("p-{winner}");
        let conflicts = results
            .iter()
            .filter(|r| matches!(r, Err(Error::RefConflict { existing_ref, .. }) if *existing_ref == winner_ref))
            .count();
        assert_eq!(conflicts, STORM - 1, "{results:?}");
        assert_order(&e, id, Paid, 1, 1).await;
        assert_eq!(e.history(id).await.unwrap()[0].ref_id, winner_ref);
        raced_winner = raced(&spans, winner);
        if raced_winner > 0 {
            break;
        }
    }
    assert!(
        raced_winner > 0,
        "in {RACE_ROUNDS} rounds no refused payment was sent while the winner ran: no race"
    );
}

/// 32 tasks send random events with few references to 200 orders: no update is lost
/// and none applied twice (each order's version, history rows and `Applied` answers
/// agree, and its history is a path). The race happened: a call was sent to an order
/// while another call on that order was still running.
pub async fn hot_rows_no_lost_update_no_double_apply<B: Backend>(b: &B) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const ORDERS: i64 = 200;
    const TASKS: usize = 32;
    const PER_TASK: usize = 100;
    let e = engine(b).await;
    for id in 0..ORDERS {
        e.create(id).await.unwrap();
    }
    // Calls running on each order, right now.
    let running: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ORDERS).map(|_| AtomicUsize::new(0)).collect());
    let events = [Pay, Ship, Deliver, Cancel, Refund];
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (e, running) = (e.clone(), running.clone());
            tokio::spawn(async move {
                let mut seed = [0u8; 32];
                seed[0] = t as u8;
                let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                let mut applied = Vec::new();
                let mut raced = 0;
                for _ in 0..PER_TASK {
                    let id = (rng.next_u64() % ORDERS as u64) as i64;
                    let event = events[(rng.next_u64() % 5) as usize];
                    // Few references per (order, event): duplicates across tasks are common.
                    let r = format!("r{}", rng.next_u64() % 3);
                    if running[id as usize].fetch_add(1, Ordering::SeqCst) > 0 {
                        raced += 1;
                    }
                    let answer = e.transition(id, event, &r).await;
                    running[id as usize].fetch_sub(1, Ordering::SeqCst);
                    match answer {
                        Ok(o) if o.is_applied() => applied.push((id, event, r)),
                        Ok(_)
                        | Err(Error::RefConflict { .. } | Error::InvalidTransition { .. }) => {}
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
                (applied, raced)
            })
        })
        .collect();
    let mut applied: HashMap<i64, Vec<(OrderEvent, String)>> = HashMap::new();
    let mut raced = 0;
    for t in tasks {
        let (mine, n) = t.await.unwrap();
        raced += n;
        for (id, event, r) in mine {
            applied.entry(id).or_default().push((event, r));
        }
    }
    let total: usize = applied.values().map(Vec::len).sum();
    assert!(
        total > ORDERS as usize / 2,
        "the run applied too little to mean anything: {total}"
    );
    assert!(
        raced > 0,
        "no call was sent to an order while another ran on it: no race"
    );
    for id in 0..ORDERS {
        let mine = applied.remove(&id).unwrap_or_default();
        let order = e.get(id).await.unwrap();
        let history = e.history(id).await.unwrap();
        assert_eq!(
            order.version as usize,
            mine.len(),
            "order {id}: version vs Applied outcomes"
        );
        assert_eq!(
            history.len(),
            mine.len(),
            "order {id}: history rows vs Applied outcomes"
        );
        let mut recorded: Vec<_> = history
            .iter()
            .map(|r| (r.event, r.ref_id.clone()))
            .collect();
        let mut reported = mine.clone();
        recorded.sort();
        reported.sort();
        assert_eq!(recorded, reported, "order {id}");
        // The history is a path through the graph ending at the current state.
        let mut state = Created;
        for (i, r) in history.iter().enumerate() {
            assert_eq!((r.seq, r.from), (i as i64 + 1, state), "order {id}");
            state = r.to;
        }
        assert_eq!(state, order.state, "order {id}");
    }
}

pub async fn engine_agrees_with_reference_model<B: Backend>(b: &B) {
    // Invariant: for any sequence full of duplicates, the engine answers as the model does.
    let e = engine(b).await;
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&steps::<OrderMachine>(4, 3, 1..40), |seq| {
        // Each case (and each shrink) uses ids of its own in the same database.
        let first_id = 1000 * (1 + case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        tokio::task::block_in_place(|| handle.block_on(check_engine(&e, first_id, 4, &seq)))
            .map_err(TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

// A second graph, with what the order graph lacks: events leaving from several states
// (`Close`) and a cycle (`Block`/`Unblock`), where the state alone cannot tell a replay
// from a new request.
orderly::state_machine! {
    /// Tickets: a cycle and a many-source event.
    pub TicketMachine {
        states: TicketState { Open, Working, Blocked, Done, Closed }
        events: TicketEvent { Start, Block, Unblock, Finish, Close }
        initial: Open;
        terminal: [Closed];
        transitions: {
            Open    + Start   => Working,
            Working + Block   => Blocked,
            Blocked + Unblock => Working,
            Working + Finish  => Done,
            Open    + Close   => Closed,
            Working + Close   => Closed   emits TicketAbandoned,
            Blocked + Close   => Closed   emits TicketAbandoned,
            Done    + Close   => Closed,
        }
    }
}

async fn tickets<B: Backend>(b: &B) -> Engine<TicketMachine, B::S> {
    with_policy(b.store(Duration::from_secs(10)).await, B::POLICY)
}

pub async fn many_source_event_records_its_source<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    let e = tickets(b).await;
    let paths: [(i64, &[TicketEvent], TicketState); 4] = [
        (1, &[], Open),
        (2, &[Start], Working),
        (3, &[Start, Block], Blocked),
        (4, &[Start, Finish], Done),
    ];
    for (id, path, state) in paths {
        e.create(id).await.unwrap();
        for (i, &event) in path.iter().enumerate() {
            e.transition(id, event, &format!("{i}")).await.unwrap();
        }
        let v = path.len() as i64 + 1;
        let closed = Outcome::Applied {
            from: state,
            to: Closed,
            version: v,
        };
        assert_eq!(e.transition(id, Close, "c").await.unwrap(), closed);
        let replayed = Outcome::Replayed {
            from: state,
            to: Closed,
            version: v,
        };
        assert_eq!(e.transition(id, Close, "c").await.unwrap(), replayed);
        let last = e.history(id).await.unwrap().pop().unwrap();
        assert_eq!(
            (last.seq, last.from, last.to),
            (v, state, Closed),
            "ticket {id}"
        );
        let t = e.get(id).await.unwrap();
        assert_eq!((t.state, t.version), (Closed, v), "ticket {id}");
    }
}

pub async fn cycle_replays_by_ref_not_by_state<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    let e = tickets(b).await;
    e.create(1).await.unwrap();
    e.transition(1, Start, "s").await.unwrap();
    let blocked = |version| Outcome::Applied {
        from: Working,
        to: Blocked,
        version,
    };
    assert_eq!(e.transition(1, Block, "b-1").await.unwrap(), blocked(2));
    assert_eq!(e.transition(1, Unblock, "u-1").await.unwrap().version(), 3);
    // Working again: Block is allowed, but b-1 was applied already.
    let replay = Outcome::Replayed {
        from: Working,
        to: Blocked,
        version: 2,
    };
    assert_eq!(e.transition(1, Block, "b-1").await.unwrap(), replay);
    assert_eq!(e.get(1).await.unwrap().version, 3);
    assert_eq!(e.transition(1, Block, "b-2").await.unwrap(), blocked(4));
    // Blocked again: Unblock is allowed, but u-1 was applied already.
    let replay = Outcome::Replayed {
        from: Blocked,
        to: Working,
        version: 3,
    };
    assert_eq!(e.transition(1, Unblock, "u-1").await.unwrap(), replay);
    let t = e.get(1).await.unwrap();
    assert_eq!((t.state, t.version), (Blocked, 4));
    assert_eq!(e.history(1).await.unwrap().len(), 4);
}

/// Inside a caller's transaction a request recorded before, on a cycle that brought the
/// ticket back to the event's source state, goes first (the engine writes first there
/// while replays are rare) and is stopped by the history's unique key: what it wrote is
/// undone (the entity's version shows it), it is answered `Replayed`, and the caller's
/// transaction goes on, writes, and commits.
pub async fn caller_transaction_replays_a_recorded_twin<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    let e: Engine<TicketMachine, B::S> =
        with_policy(b.store(Duration::from_secs(10)).await, ReadFirst::Never);
    e.create(1).await.unwrap();
    e.transition(1, Start, "s").await.unwrap();
    e.transition(1, Block, "b-1").await.unwrap();
    e.transition(1, Unblock, "u-1").await.unwrap();
    let mut tx = b.begin().await;
    let again = e.transition(1, Block, "b-1").within(&mut tx).await.unwrap();
    let replay = Outcome::Replayed {
        from: Working,
        to: Blocked,
        version: 2,
    };
    assert_eq!(again, replay);
    let next = e.transition(1, Block, "b-2").within(&mut tx).await.unwrap();
    let applied = Outcome::Applied {
        from: Working,
        to: Blocked,
        version: 4,
    };
    assert_eq!(next, applied);
    B::commit(tx).await;
    let t = e.get(1).await.unwrap();
    assert_eq!((t.state, t.version), (Blocked, 4));
    let refs: Vec<_> = e
        .history(1)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.ref_id)
        .collect();
    assert_eq!(refs, ["s", "b-1", "u-1", "b-2"]);
}

/// Concurrent tasks drive tickets around the cycle and close them from any state, with
/// duplicate references across tasks. Every answer must agree with the history row of
/// its request: `Applied` and `Replayed` name exactly the recorded `from`, `to` and
/// version, each request is recorded at most once, and the history is a path.
pub async fn cycle_storm_answers_match_the_history<B: Backend>(b: &B) {
    use TicketEvent::*;
    use TicketState::*;
    const TICKETS: i64 = 40;
    const TASKS: usize = 24;
    const PER_TASK: usize = 120;
    let e = tickets(b).await;
    for id in 0..TICKETS {
        e.create(id).await.unwrap();
        e.transition(id, Start, "s").await.unwrap();
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut seed = [0u8; 32];
                seed[0] = t as u8;
                seed[1] = 0xc7;
                let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
                let mut answers = Vec::new();
                for _ in 0..PER_TASK {
                    let id = (rng.next_u64() % TICKETS as u64) as i64;
                    // Close is rare, so most tickets go round the cycle for a while.
                    let event = match rng.next_u64() % 20 {
                        0 => Close,
                        1 => Finish,
                        n if n % 2 == 0 => Block,
                        _ => Unblock,
                    };
                    let r = format!("r{}", rng.next_u64() % 8);
                    match e.transition(id, event, &r).await {
                        Ok(o) => answers.push((id, event, r, o)),
                        Err(Error::RefConflict { .. } | Error::InvalidTransition { .. }) => {}
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
                answers
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.extend(t.await.unwrap());
    }
    let mut applied = 0;
    let mut recorded = HashMap::new();
    for id in 0..TICKETS {
        let history = e.history(id).await.unwrap();
        let ticket = e.get(id).await.unwrap();
        assert_eq!(ticket.version as usize, history.len(), "ticket {id}");
        let mut state = Open;
        for (i, row) in history.iter().enumerate() {
            assert_eq!((row.seq, row.from), (i as i64 + 1, state), "ticket {id}");
            state = row.to;
            let key = (id, row.event, row.ref_id.clone());
            let twice = recorded.insert(key, (row.from, row.to, row.seq));
            assert!(twice.is_none(), "ticket {id}: {row:?} recorded twice");
        }
        assert_eq!(state, ticket.state, "ticket {id}");
    }
    for (id, event, r, outcome) in answers {
        let (from, to, version) = match outcome {
            Outcome::Applied { from, to, version } => {
                applied += 1;
                (from, to, version)
            }
            Outcome::Replayed { from, to, version } => (from, to, version),
        };
        assert_eq!(
            recorded.get(&(id, event, r.clone())),
            Some(&(from, to, version)),
            "ticket {id}: {event} {r} answered {outcome:?}"
        );
    }
    // Every recorded request but the set-up `Start`s was answered `Applied` exactly once.
    assert_eq!(applied, recorded.len() - TICKETS as usize);
    assert!(
        applied > TICKETS as usize,
        "too little applied to mean anything: {applied}"
    );
}

/// A storm of replays switches `ReadFirst::Adaptive` to reading first, and new requests
/// (inside callers' transactions) switch it back. Seen from outside through a lock that `blocker` takes in a held
/// transaction: one that the store's apply-first attempt waits for and a plain read does
/// not (the point of reading first in a storm: replays do not queue behind writers).
pub async fn adaptive_reads_first_in_a_replay_storm<B: Backend>(b: &B, blocker: &str) {
    let config = |read_first| EngineConfig {
        max_attempts: 2,
        read_first,
        ..EngineConfig::default()
    };
    let wait = Duration::from_millis(200);
    let adaptive: Eng<B> =
        Engine::with_config(b.store(wait).await, config(ReadFirst::Adaptive)).unwrap();
    let never: Eng<B> = Engine::with_config(b.store(wait).await, config(ReadFirst::Never)).unwrap();
    for id in 1..=40 {
        adaptive.create(id).await.unwrap();
    }
    let first = adaptive.transition(1, Pay, "p-1").await.unwrap();
    assert!(first.is_applied());
    let same =
        |o: &Outcome<OrderState>| (o.state(), o.version()) == (first.state(), first.version());
    for _ in 0..30 {
        let again = adaptive.transition(1, Pay, "p-1").await.unwrap();
        assert!(!again.is_applied() && same(&again));
    }

    let mut held = b.begin().await;
    B::exec_in(&mut held, blocker).await;
    let read = adaptive.transition(1, Pay, "p-1").await.unwrap();
    assert!(!read.is_applied() && same(&read), "{read:?}");
    let tried = never.transition(1, Pay, "p-1").await;
    assert!(
        matches!(tried, Err(Error::Contention { .. })),
        "applying first did not wait for the lock, so the test shows nothing: {tried:?}"
    );
    B::rollback(held).await;

    // New requests, each inside a caller's transaction (whose answers count as the
    // engine's own do): each applied once; the share of replays falls, and the store
    // tries to apply first again, so a replay waits for the lock once more.
    for id in 2..=40 {
        let mut tx = b.begin().await;
        let outcome = adaptive
            .transition(id, Pay, &format!("p-{id}"))
            .within(&mut tx)
            .await
            .unwrap();
        B::commit(tx).await;
        assert!(
            outcome.is_applied() && outcome.version() == 1,
            "{outcome:?}"
        );
    }
    let mut held = b.begin().await;
    B::exec_in(&mut held, blocker).await;
    let tried = adaptive.transition(1, Pay, "p-1").await;
    assert!(
        matches!(tried, Err(Error::Contention { .. })),
        "still reading first after 39 new requests: {tried:?}"
    );
    B::rollback(held).await;
    assert_eq!(b.scalar("SELECT count(*) FROM order_transitions").await, 40);
}

/// A batched read (`Store::priors`) answers each request with its own history row, in
/// the order asked: recorded or not, with and without a payload, keys repeated, in
/// batches of every size up to the store's `BATCH_READ_MAX`.
pub async fn batched_read_answers_each_request<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=100 {
        e.create(id).await.unwrap();
    }
    for id in (2..=100).step_by(2) {
        let r = format!("p-{id}");
        let out = if id % 3 == 0 {
            let body = serde_json::json!({ "order": id });
            e.transition(id, Pay, &r).payload(&body).await
        } else {
            e.transition(id, Pay, &r).await
        };
        assert!(out.unwrap().is_applied());
    }
    e.transition(2, Ship, "s-2").await.unwrap();
    // Enough keys for one batch of every size from 1 to 64.
    let keys: Vec<OwnedKey> = (0..2100i64)
        .map(|i| {
            let order_id = (i * 7) % 100 + 1;
            let (event, ref_id) = match i % 10 {
                0 => ("Ship", format!("s-{order_id}")),
                1 => ("Pay", format!("other-{order_id}")),
                _ => ("Pay", format!("p-{order_id}")),
            };
            OwnedKey {
                order_id,
                event,
                ref_id,
            }
        })
        .collect();
    let mut keys = keys;
    for (order_id, event, ref_id) in [(2, "Ship", "s-2"), (6, "Pay", "p-6"), (2, "Ship", "s-2")] {
        keys.push(OwnedKey {
            order_id,
            event,
            ref_id: ref_id.into(),
        });
    }
    let store = e.store();
    let mut conn = store.acquire().await.unwrap();
    let max = <B::S as Store>::BATCH_READ_MAX;
    let (mut batched, mut at, mut size) = (Vec::new(), 0, 1);
    while at < keys.len() {
        let chunk = &keys[at..(at + size).min(keys.len())];
        let read = store.priors(&mut conn, chunk).await.unwrap();
        assert_eq!(read.len(), chunk.len());
        batched.extend(read);
        at += chunk.len();
        size = size % max + 1;
    }
    assert_eq!(batched.len(), keys.len());
    let mut found = 0;
    for (key, got) in keys.iter().zip(&batched) {
        let alone = store
            .prior(&mut conn, key.as_key(), Txn::Own)
            .await
            .unwrap();
        assert_eq!(got, &alone, "{key:?}");
        found += usize::from(got.is_some());
    }
    // The ones added last: order 2's Ship (twice) and order 6's Pay, with its payload.
    let ship = keys
        .iter()
        .position(|k| k.order_id == 2 && k.event == "Ship");
    let ship = batched[ship.expect("order 2's Ship is asked for")].as_ref();
    assert_eq!(
        ship.map(|p| (p.seq, p.from.as_str(), p.to.as_str())),
        Some((2, "Paid", "Shipped"))
    );
    let with_payload = keys
        .iter()
        .position(|k| k.order_id == 6 && k.event == "Pay");
    let with_payload = batched[with_payload.expect("order 6 is asked for")].as_ref();
    assert!(with_payload.is_some_and(|p| p.payload_hash.as_ref().is_some_and(|h| h.len() == 64)));
    assert!(
        (keys.len() / 5..keys.len() * 4 / 5).contains(&found),
        "a mix of recorded and unrecorded requests: {found} of {} found",
        keys.len()
    );
    // Nothing to read is nothing read.
    assert!(store.priors(&mut conn, &[]).await.unwrap().is_empty());
}

/// Many callers at once, each with its own mix of replays, conflicts, mismatched payloads
/// and new requests (twins among them): every caller gets the answer to its own request,
/// as the history records it. Reading first (the `Always` suite, and `Adaptive` once the
/// replays dominate), concurrent reads share statements where the store batches them.
pub async fn replay_storm_answers_each_caller<B: Backend>(b: &B) {
    const ORDERS: i64 = 60;
    const TASKS: i64 = 32;
    const ROUNDS: i64 = 25;
    let e = engine(b).await;
    for id in 1..=ORDERS {
        e.create(id).await.unwrap();
    }
    // The lower half is paid before the storm; the upper half is paid during it.
    for id in 1..=ORDERS / 2 {
        e.transition(id, Pay, &format!("p-{id}")).await.unwrap();
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let e = e.clone();
            tokio::spawn(async move {
                let mut applied = Vec::new();
                for round in 0..ROUNDS {
                    let id = (t * 7 + round * 13) % ORDERS + 1;
                    let r = format!("p-{id}");
                    match (t + round) % 8 {
                        0 => {
                            // Another payment for the order.
                            let q = format!("q-{t}");
                            let out = e.transition(id, Pay, &q).await;
                            let recorded = e.history(id).await.unwrap();
                            let winner = recorded.first().map(|r| r.ref_id.as_str());
                            match out {
                                Ok(o) if o.is_applied() => {
                                    assert!(id > ORDERS / 2, "order {id} paid twice");
                                    assert_eq!(winner, Some(q.as_str()), "order {id}");
                                    applied.push((id, q));
                                }
                                Err(Error::RefConflict { existing_ref, .. }) => {
                                    assert_eq!(Some(existing_ref.as_str()), winner, "order {id}")
                                }
                                other => panic!("order {id}: {other:?}"),
                            }
                        }
                        1 if id <= ORDERS / 2 => {
                            let out = e.transition(id, Pay, &r).payload(&1).await;
                            assert!(
                                matches!(out, Err(Error::PayloadMismatch { .. })),
                                "order {id}: {out:?}"
                            );
                        }
                        _ => {
                            let out = e.transition(id, Pay, &r).await;
                            match out {
                                Ok(o) if o.is_applied() => {
                                    assert!(id > ORDERS / 2, "order {id} paid twice");
                                    applied.push((id, r));
                                }
                                Ok(o) => assert_eq!(o, replayed(Created, Paid, 1), "order {id}"),
                                // Another caller's `q-` ref won this order first.
                                Err(Error::RefConflict { .. }) if id > ORDERS / 2 => {}
                                Err(err) => panic!("order {id}: {err:?}"),
                            }
                        }
                    }
                }
                applied
            })
        })
        .collect();
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(t.await.unwrap());
    }
    // Each order of the upper half that was applied during the storm was applied once,
    // under the reference its history records.
    let mut ids: Vec<i64> = applied.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), before, "an order applied twice: {applied:?}");
    assert!(before > 10, "too little applied to mean anything: {before}");
    for (id, r) in &applied {
        let h = e.history(*id).await.unwrap();
        assert_eq!((h.len(), &h[0].ref_id), (1, r), "order {id}");
    }
    for id in 1..=ORDERS / 2 {
        assert_order(&e, id, Paid, 1, 1).await;
    }
}

/// The apply-first unit carries several requests at once, one commit for all, each
/// answered for itself: a new request applies, one recorded before (on a cycle, at a
/// state its entity came back to) is undone alone, one whose entity is elsewhere writes
/// nothing, one with several source states is tried only where the store can, and the
/// others in the unit are not affected.
pub async fn write_unit_carries_several_requests<B: Backend>(b: &B) {
    use TicketEvent::*;
    use orderly::store::{FirstWrite, Key, Request};
    let e = tickets(b).await;
    for id in 1..=5 {
        e.create(id).await.unwrap();
        e.transition(id, Start, "s").await.unwrap();
    }
    // Ticket 1 goes round the cycle: Block b-1 is recorded, and it is Working again.
    e.transition(1, Block, "b-1").await.unwrap();
    e.transition(1, Unblock, "u-1").await.unwrap();
    // Ticket 3 is Working, so an Unblock finds nothing to move.
    let request = |order_id, event: TicketEvent, ref_id| {
        let (from, to): (&[&'static str], &[&'static str]) = match event {
            Block => (&["Working"], &["Blocked"]),
            Unblock => (&["Blocked"], &["Working"]),
            _ => (
                &["Open", "Working", "Blocked", "Done"],
                &["Closed", "Closed", "Closed", "Closed"],
            ),
        };
        Request {
            key: Key {
                order_id,
                event: event.into(),
                ref_id,
            },
            from_states: from,
            to_states: to,
            payload_hash: None,
            payload: None,
            write_id: order_id,
            audit: Default::default(),
            emits: &[],
            machine: "TicketMachine",
            event_body: None,
        }
    };
    let unit = [
        request(2, Block, "b-2"),
        request(1, Block, "b-1"),
        request(3, Unblock, "u-3"),
        request(4, Close, "c-4"),
        request(5, Block, "b-5"),
    ];
    let store = e.store();
    let mut conn = store.acquire().await.unwrap();
    let written = store.apply_first(&mut conn, &unit).await.unwrap();
    drop(conn);
    let applied = |from: &str, to: &str, version| FirstWrite::Applied {
        from: from.into(),
        to: to.into(),
        version,
    };
    assert_eq!(written.len(), 5);
    assert_eq!(written[0], applied("Working", "Blocked", 2));
    assert_eq!(written[1], FirstWrite::NotApplied);
    assert_eq!(written[2], FirstWrite::NotApplied);
    assert_eq!(written[4], applied("Working", "Blocked", 2));
    let t = |id| e.get(id);
    assert_eq!(t(2).await.unwrap().state, TicketState::Blocked);
    assert_eq!(t(5).await.unwrap().state, TicketState::Blocked);
    // The recorded request was undone alone: ticket 1 did not move, no second row.
    let one = t(1).await.unwrap();
    assert_eq!((one.state, one.version), (TicketState::Working, 3));
    assert_eq!(e.history(1).await.unwrap().len(), 3);
    assert_eq!(t(3).await.unwrap().version, 1);
    match &written[3] {
        FirstWrite::Applied { version, .. } => {
            assert_eq!(*version, 2);
            assert_eq!(t(4).await.unwrap().state, TicketState::Closed);
        }
        FirstWrite::NotTried => assert_eq!(t(4).await.unwrap().version, 1),
        other => panic!("ticket 4: {other:?}"),
    }
    // Every row the unit wrote is in the history, answered as a replay.
    assert!(
        e.transition(2, Block, "b-2")
            .await
            .is_ok_and(|o| !o.is_applied())
    );
}

/// A caller's own statements (inside `Records::run`'s work, a flow's local step) turn a
/// `sqlx::Error` into orderly's `Error` with `?`, classified as the stores classify
/// theirs: a lock the statement waited out is retryable, a statement the server
/// refuses is not.
pub async fn own_statement_errors_classify_as_the_stores_do<B: Backend>(b: &B) {
    let store = b.store(Duration::from_millis(200)).await;
    let e: Eng<B> = with_policy(store.clone(), B::POLICY);
    e.create(1).await.unwrap();
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        "UPDATE orders SET version = version WHERE id = 1",
    )
    .await;
    let mut conn = store.acquire().await.unwrap();
    let locked = B::exec_conn(
        &mut conn,
        "UPDATE orders SET version = version WHERE id = 1".into(),
    )
    .await
    .unwrap_err();
    let err = Error::from(locked);
    assert!(
        matches!(
            err,
            Error::Database {
                retryable: true,
                ..
            }
        ),
        "{err:?}"
    );
    B::rollback(holder).await;
    let refused = B::exec_conn(&mut conn, "UPDATE no_such_table SET x = 1".into())
        .await
        .unwrap_err();
    let err = Error::from(refused);
    assert!(!err.is_retryable(), "{err:?}");
    assert!(Error::from(sqlx::Error::PoolTimedOut).is_retryable());
}

/// The outbox rows of `machine` for `id`, as `(version, event, transition, from, to,
/// ref)`, oldest first.
async fn outbox_rows<B: Backend>(b: &B, machine: &str, id: i64) -> Vec<String> {
    let n = b
        .scalar(&format!(
            "SELECT COUNT(*) FROM outbox WHERE machine = '{machine}' AND entity_id = {id}"
        ))
        .await;
    let mut rows = Vec::new();
    for version in 1..=16 {
        let found = b
            .scalar(&format!(
                "SELECT COUNT(*) FROM outbox WHERE machine = '{machine}' AND entity_id = {id} \
                 AND version = {version}"
            ))
            .await;
        if found == 1 {
            rows.push(version.to_string());
        }
    }
    assert_eq!(
        rows.len() as i64,
        n,
        "outbox rows of {machine} {id} beyond version 16"
    );
    rows
}

/// An edge that emits an event writes its outbox row in the same unit as the
/// transition: one row per application, keyed by (machine, entity, version after the
/// transition), with the event, the transition, its states and reference. A replay, a
/// refusal and an edge that emits nothing write none; a caller's transaction that rolls
/// back takes the row with it; an event with several source states records the edge
/// that moved (and only the edges that emit write). An outbox row already at the new
/// version is `CorruptState`, never mistaken for a twin request.
pub async fn emitting_edges_write_their_event_with_the_transition<B: Backend>(b: &B) {
    let e = engine(b).await;
    for id in 1..=4 {
        e.create(id).await.unwrap();
    }
    assert!(e.transition(1, Pay, "p-1").await.unwrap().is_applied());
    assert_eq!(outbox_rows(b, "OrderMachine", 1).await, ["1"]);
    let row = |cond: &str| {
        format!(
            "SELECT COUNT(*) FROM outbox WHERE machine = 'OrderMachine' AND entity_id = 1 \
             AND version = 1 AND event = 'OrderPaid' AND transition = 'Pay' \
             AND from_status = 'Created' AND to_status = 'Paid' AND ref_id = 'p-1' {cond}"
        )
    };
    assert_eq!(b.scalar(&row("AND status = 'PENDING'")).await, 1);
    // A replay and a refusal write nothing.
    assert!(!e.transition(1, Pay, "p-1").await.unwrap().is_applied());
    assert!(matches!(
        e.transition(1, Pay, "p-2").await,
        Err(Error::RefConflict { .. })
    ));
    assert!(matches!(
        e.transition(1, Deliver, "d-1").await,
        Err(Error::InvalidTransition { .. })
    ));
    assert_eq!(outbox_rows(b, "OrderMachine", 1).await, ["1"]);
    // The next emitting edge, at the next version; an edge that emits nothing writes none.
    e.transition(1, Ship, "s-1").await.unwrap();
    e.transition(1, Deliver, "d-1").await.unwrap();
    assert_eq!(outbox_rows(b, "OrderMachine", 1).await, ["1", "2"]);
    e.transition(2, Cancel, "c-2").await.unwrap();
    assert!(outbox_rows(b, "OrderMachine", 2).await.is_empty());

    // Inside a caller's transaction: rolled back, no row; committed, the row.
    let mut tx = b.begin().await;
    e.transition(3, Pay, "p-3").within(&mut tx).await.unwrap();
    B::rollback(tx).await;
    assert!(outbox_rows(b, "OrderMachine", 3).await.is_empty());
    assert_order(&e, 3, Created, 0, 0).await;
    let mut tx = b.begin().await;
    e.transition(3, Pay, "p-3").within(&mut tx).await.unwrap();
    B::commit(tx).await;
    assert_eq!(outbox_rows(b, "OrderMachine", 3).await, ["1"]);

    // An outbox row already at the version the write would make (the entity's version
    // reused behind orderly's back): `CorruptState`, and nothing is written.
    b.exec(
        "INSERT INTO outbox (machine, entity_id, version, event, transition, from_status, to_status, ref_id) \
         VALUES ('OrderMachine', 4, 1, 'OrderPaid', 'Pay', 'Created', 'Paid', 'old')",
    )
    .await;
    let err = e.transition(4, Pay, "p-4").await.unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 4, .. }),
        "{err:?}"
    );
    assert_order(&e, 4, Created, 0, 0).await;
    let mut tx = b.begin().await;
    let err = e
        .transition(4, Pay, "p-4")
        .within(&mut tx)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::CorruptState { order_id: 4, .. }),
        "{err:?}"
    );
    B::commit(tx).await;
    assert_order(&e, 4, Created, 0, 0).await;

    // Several source states: the edge that moved emits (or not).
    let t: Engine<TicketMachine, B::S> =
        with_policy(b.store(Duration::from_secs(10)).await, B::POLICY);
    for id in 11..=12 {
        t.create(id).await.unwrap();
    }
    t.transition(11, TicketEvent::Start, "st-1").await.unwrap();
    t.transition(11, TicketEvent::Close, "cl-1").await.unwrap();
    assert_eq!(outbox_rows(b, "TicketMachine", 11).await, ["2"]);
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM outbox WHERE machine = 'TicketMachine' AND entity_id = 11 \
             AND event = 'TicketAbandoned' AND from_status = 'Working' AND to_status = 'Closed'"
        )
        .await,
        1
    );
    t.transition(12, TicketEvent::Close, "cl-2").await.unwrap();
    assert!(outbox_rows(b, "TicketMachine", 12).await.is_empty());
}
