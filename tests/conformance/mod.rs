//! One body per behaviour, run against every backend through the `conformance!` macro.
//! Each test gets its own fresh database from its backend's `Backend::fresh`.
#![allow(dead_code)]

pub mod audit;
pub mod callers;
pub mod coalesce;
pub mod cycles;
pub mod events;
pub mod faults;
pub mod finishes;
pub mod flow_deadline;
pub mod flows;
pub mod idempotency;
pub mod outbox;
pub mod outcomes;
pub mod reads;
pub mod records_faults;
pub mod records_jobs;
pub mod records_model;
pub mod rules;
pub mod schema;
pub mod storms;
pub mod timer_batches;
pub mod timer_config;
pub mod timer_faults;
pub mod timers;
// The bodies, for `conformance!`; a binary that runs only some of them (the Galera
// suites share the harness) leaves the rest unused.
#[allow(unused_imports)]
pub use self::{
    audit::*, callers::*, coalesce::*, cycles::*, events::*, faults::*, finishes::*,
    flow_deadline::*, flows::*, idempotency::*, outbox::*, outcomes::*, reads::*,
    records_faults::*, records_jobs::*, records_model::*, rules::*, schema::*, storms::*,
    timer_batches::*, timer_config::*, timer_faults::*, timers::*,
};

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
    type S: orderly::flow::FlowStore + orderly::outbox::OutboxStore + orderly::TimerStore;
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
    /// `sql` as this backend names orderly's tables: the tests write each as MariaDB and
    /// SQLite name it in the default namespace (`orderly_outbox`); PostgreSQL keeps it in
    /// the schema `orderly` (`orderly.outbox`).
    fn sql(sql: &str) -> String {
        sql.to_owned()
    }
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
    /// Forgets the statements the connection keeps prepared: its next use of each
    /// prepares it again, as a fresh connection's would.
    async fn forget_statements(tx: &mut Self::Tx);
    /// Runs literal SQL on a connection (inside whatever transaction is open on it), as a
    /// flow's local step would.
    fn exec_conn<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        sql: String,
    ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>>;
    /// Selects one integer on a connection (inside whatever transaction is open on it),
    /// as a guard would.
    fn scalar_conn<'c>(
        conn: &'c mut <Self::S as Store>::Conn,
        sql: String,
    ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>>;
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
            sqlx::raw_sql(sqlx::AssertSqlSafe(Self::sql(sql)))
                .execute(&self.pool)
                .await
                .unwrap();
        }

        async fn scalar(&self, sql: &str) -> i64 {
            sqlx::query_scalar(sqlx::AssertSqlSafe(Self::sql(sql)))
                .fetch_one(&self.pool)
                .await
                .unwrap()
        }

        async fn exec_in(tx: &mut Self::Tx, sql: &str) {
            let conn: &mut $conn = tx;
            sqlx::raw_sql(sqlx::AssertSqlSafe(Self::sql(sql)))
                .execute(conn)
                .await
                .unwrap();
        }

        async fn forget_statements(tx: &mut Self::Tx) {
            let conn: &mut $conn = tx;
            sqlx::Connection::clear_cached_statements(conn)
                .await
                .unwrap();
        }

        fn exec_conn<'c>(
            conn: &'c mut $conn,
            sql: String,
        ) -> orderly::idempotency::Work<'c, Result<(), sqlx::Error>> {
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(Self::sql(&sql)))
                    .execute(conn)
                    .await
                    .map(drop)
            })
        }

        fn scalar_conn<'c>(
            conn: &'c mut $conn,
            sql: String,
        ) -> orderly::idempotency::Work<'c, Result<i64, sqlx::Error>> {
            // Through RuleConn, as docs/design.md tells a guard that may be dropped to
            // run its statements on MariaDB.
            Box::pin(async move {
                orderly::RuleConn::fetch_i64(conn, &Self::sql(&sql), &[])
                    .await?
                    .ok_or(sqlx::Error::RowNotFound)
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
            stored_state_names_are_the_applications,
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
            guards_and_effects_run_once_inside_the_unit,
            guards_judge_what_the_locked_data_says,
            rules_written_once_run_on_every_backend,
            guarded_calls_dropped_at_every_await_point,
            rules_agree_with_the_oracle,
            rules_agree_with_the_oracle_in_races,
            guarded_and_plain_requests_share_a_coalescing_engine,
            guarded_transitions_in_records_and_flows,
            guarded_request_behind_the_lock_sees_what_the_holder_recorded,
            own_statement_errors_classify_as_the_stores_do,
            emitting_edges_write_their_event_with_the_transition,
            claim_follows_the_outcome_table,
            expired_lease_is_taken_over_and_the_late_holder_fenced,
            identical_claims_storm_one_runs,
            coalesced_claims_answer_each_claim_truly,
            claims_dropped_while_queued_are_never_sent,
            coalesced_finishes_answer_each_finish_truly,
            finishes_dropped_while_queued_are_never_sent,
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
            trace_context_is_stored_with_the_event_and_published,
            events_commit_with_flow_local_steps,
            coalesced_writes_answer_each_request,
            a_failing_request_leaves_its_unit_true,
            callers_dropped_around_their_unit,
            apply_first_unit_dropped_at_every_await_point,
            one_entity_many_requests_coalesced,
            coalesced_engine_agrees_with_the_model,
            timers_are_armed_by_the_unit_that_enters_their_state,
            a_due_timer_fires_once,
            a_timer_is_moot_once_its_entity_moved_on,
            a_timer_racing_the_payment_fires_or_is_moot,
            timer_jobs_race_over_many_due_timers,
            corrupt_timer_rows_are_set_aside,
            timers_scheduled_and_cancelled_by_hand,
            a_timer_job_killed_by_sigkill_mid_batch_loses_nothing,
            timers_that_fell_due_while_no_job_ran_fire_once_in_due_order,
            a_guard_on_the_fired_edge_is_judged,
            tokens_and_notes_of_any_text_are_stored_as_given,
            a_timer_due_at_no_time_is_set_aside_and_blocks_nothing,
            a_timer_its_job_applied_is_never_cancelled,
            one_failed_record_holds_back_no_other_outcome,
            a_batch_firing_refused_by_the_history_is_undone_whole,
            a_batch_fires_the_armed_and_judges_the_rest,
            a_timer_job_shut_down_mid_round_stops_after_the_firings_under_way,
            a_timer_job_dropped_at_every_await_point_fires_each_once,
            timer_delays_from_the_config_arm_and_draw,
            an_idle_job_wakes_for_the_next_timer,
            flow_waits_on_a_timer_and_wakes_once,
            flow_wait_woken_once_by_the_timer_or_the_recovery,
        );
    };
    // The network faults, for a backend that implements `Networked`.
    (@networked $backend:ty) => {
        $crate::conformance!(@tests $backend;
            a_flow_wait_cut_at_each_statement_wakes_once,
            in_doubt_commit_is_read_back,
            guarded_unit_cut_at_each_statement,
            resent_request_cut_under_its_write_is_replayed,
            own_write_landing_late_is_applied,
            dead_database_answers_within_the_deadline,
            cancelled_calls_return_their_connection_warm,
            killed_connections_are_retryable,
            records_lost_acknowledgements_are_read_back,
            records_write_lost_before_the_server_is_retried,
            records_dead_database_answers_within_the_deadline,
            locked_relay_dropped_at_every_await_point_frees_its_batch_at_once,
            locked_relay_cut_at_each_statement,
            locked_relay_killed_by_sigkill_another_finishes,
            a_timer_job_cut_at_each_statement_fires_each_once,
            a_timer_job_killed_by_sigkill_inside_its_batch_undoes_it_whole,
            a_batch_held_up_by_the_applications_lock_is_undone_in_time,
            a_record_met_by_contention_is_made_again,
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

/// A child process of a test that kills one: the relay's, the timer job's or the flow
/// runner's.
pub(crate) async fn child<B: Backend>(spec: &str) {
    if let Some(relay) = spec.strip_prefix(outbox::RELAY_CHILD) {
        return outbox::relay_child::<B>(relay).await;
    }
    if let Some(handle) = spec.strip_prefix(timer_faults::BATCH_CHILD) {
        return timer_faults::batch_child::<B>(handle).await;
    }
    match spec.strip_prefix(timers::TIMER_CHILD) {
        Some(timers) => timers::timer_child::<B>(timers).await,
        None => flows::flow_child::<B>(spec).await,
    }
}

pub(crate) async fn engine<B: Backend>(b: &B) -> Eng<B> {
    with_policy(b.store(Duration::from_secs(10)).await, B::POLICY)
}

/// The default configuration with `policy`.
pub(crate) fn config(policy: ReadFirst) -> EngineConfig {
    EngineConfig::default().read_first(policy)
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

/// How many rounds a storm test runs, each on an entity of its own, until one shows
/// that its callers raced (on a loaded machine one round may happen to run them one
/// after another).
pub const RACE_ROUNDS: usize = 20;

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

#[allow(unused_imports)]
pub use crate::server::in_schema;

/// The test application's tables: its own entity table, `orders`; orderly's in the
/// default namespace.
#[allow(dead_code)]
pub fn app_tables() -> orderly::Tables {
    orderly::Tables::new("orders").unwrap()
}

/// Creates the test application's `orders`, as its own migration would (the layout
/// [`Schema::create_tables_sql`](orderly::Schema::create_tables_sql) gives), on `pool`.
#[allow(dead_code)]
pub async fn create_app_orders<S, DB>(store: &S, pool: &sqlx::Pool<DB>)
where
    S: orderly::Schema,
    DB: sqlx::Database,
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
{
    for sql in store.create_tables_sql() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap();
    }
}
