//! Timers on every backend: armed in the unit that enters their state (not by a replay or
//! a refusal), fired once through the engine, moot once the entity has moved on (also when
//! it came back to the state), racing the move that makes them moot, jobs racing over
//! many due timers, corrupt rows set aside, timers scheduled and cancelled by hand.

use std::time::{Duration, Instant};

use orderly::timer::{TimerKey, TimerRow};
use orderly::{Engine, EngineConfig, Error, Outcome, Timers};

use super::{Backend, Networked};

orderly::state_machine! {
    /// An order that is cancelled when it is not paid in time, and whose payment can be
    /// taken back (the order is then unpaid again, and its clock starts again).
    pub Unpaid {
        states: UnpaidState { Created, Paid, Shipped, Cancelled }
        events: UnpaidEvent { Pay, Unpay, Ship, Cancel }
        initial: Created;
        terminal: [Shipped, Cancelled];
        transitions: {
            Created + Pay    => Paid,
            Created + Cancel => Cancelled,
            Paid    + Unpay  => Created,
            Paid    + Ship   => Shipped,
        }
        timers: {
            Created after 30 min => Cancel,
            Paid after 7 days => Ship,
        }
    }
}

use UnpaidEvent::{Cancel, Pay, Ship, Unpay};
use UnpaidState::{Cancelled, Created, Paid};

pub(crate) type TEng<B> = Engine<Unpaid, <B as Backend>::S>;

pub(crate) async fn timed_engine<B: Backend>(b: &B) -> TEng<B> {
    Engine::with_config(
        b.store(Duration::from_secs(10)).await,
        EngineConfig::default().read_first(B::POLICY),
    )
    .unwrap()
}

pub(crate) fn job<B: Backend>(engine: &TEng<B>) -> Timers<B::S> {
    Timers::new(engine.store().clone()).fire(engine.clone())
}

/// The entity's timers that read, earliest due first.
pub(crate) async fn timers_of<M: orderly::StateMachine, S: orderly::TimerStore>(
    engine: &Engine<M, S>,
    id: i64,
) -> Vec<TimerRow> {
    engine
        .timers(id)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.expect("every timer row reads"))
        .collect()
}

/// Makes every pending timer of `id` due (long ago, keeping their order).
pub(crate) async fn make_due<B: Backend>(b: &B, id: i64) {
    b.exec(&format!(
        "UPDATE orderly_timers SET due_at = due_at - 100000000000, next_at = 0 \
         WHERE entity_id = {id} AND status = 'PENDING'"
    ))
    .await;
}

pub async fn timers_are_armed_by_the_unit_that_enters_their_state<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    engine.create(1).await.unwrap();
    // A repeated create arms nothing new.
    engine.create(1).await.unwrap();
    let armed = timers_of(&engine, 1).await;
    assert_eq!(armed.len(), 1, "{armed:?}");
    let t = &armed[0];
    assert_eq!(
        (t.event.as_str(), t.ref_id.as_str()),
        ("Cancel", "timer:Created:0")
    );
    assert_eq!((t.state.as_deref(), t.version), (Some("Created"), Some(0)));
    assert_eq!(t.status, "PENDING");
    // Due 30 minutes after the create, by the database's clock.
    assert!(
        (-30 * 60 * 1000 - 60_000..=-30 * 60 * 1000 + 60_000).contains(&t.late_ms),
        "{t:?}"
    );
    // A refused request arms nothing; the move into Paid arms Paid's timer; its replay
    // arms nothing more.
    assert!(matches!(
        engine.transition(1, Ship, "s-1").await,
        Err(Error::InvalidTransition { .. })
    ));
    assert!(engine.transition(1, Pay, "p-1").await.unwrap().is_applied());
    assert!(matches!(
        engine.transition(1, Pay, "p-1").await.unwrap(),
        Outcome::Replayed { .. }
    ));
    let armed = timers_of(&engine, 1).await;
    let refs: Vec<(&str, &str)> = armed
        .iter()
        .map(|t| (t.event.as_str(), t.ref_id.as_str()))
        .collect();
    assert_eq!(
        refs,
        [("Cancel", "timer:Created:0"), ("Ship", "timer:Paid:1")]
    );
    // Inside a caller's transaction that rolls back, neither the move nor its timer stays.
    engine.create(2).await.unwrap();
    let mut tx = b.begin().await;
    assert!(
        engine
            .transition(2, Pay, "p-2")
            .within(&mut tx)
            .await
            .unwrap()
            .is_applied()
    );
    B::rollback(tx).await;
    assert_eq!(timers_of(&engine, 2).await.len(), 1);
    assert_eq!(engine.get(2).await.unwrap().state, Created);
}

/// A move that arms a timer (`Unpay`, back into `Created`) inside a caller's
/// transaction, dropped after each of its polls in turn (the update, the history row,
/// the timer's insert, the release), each statement prepared afresh where a driver
/// prepares: the caller wrote a row before the call and writes one after it. The
/// caller's connection answers within [`HUNG`](crate::conformance::rules::HUNG); a commit
/// that succeeds holds both of the caller's rows, and the move with its timer or neither;
/// a commit that fails holds nothing.
pub async fn a_dropped_call_that_arms_a_timer_keeps_the_callers_writes<B: Backend>(b: &B) {
    let e = timed_engine(b).await;
    b.exec("DROP TABLE IF EXISTS caller_rows").await;
    b.exec("CREATE TABLE caller_rows (k BIGINT NOT NULL, what VARCHAR(10) NOT NULL)")
        .await;
    let ids: Vec<i64> = (5000..5120).collect();
    for &id in &ids {
        e.create(id).await.unwrap();
        e.transition(id, Pay, &format!("pay-{id}")).await.unwrap();
    }
    let wait = crate::conformance::rules::HUNG;
    let mut dropped = 0;
    for (i, &id) in ids.iter().enumerate() {
        let insert =
            |what: &str| format!("INSERT INTO caller_rows (k, what) VALUES ({id}, '{what}')");
        let mut tx = b.begin().await;
        B::exec_in(&mut tx, &insert("before")).await;
        // Every statement of the call is prepared afresh where a driver prepares, so that
        // drops land on the prepares too.
        B::forget_statements(&mut tx).await;
        let reference = format!("unpay-{id}");
        let call = e
            .transition(id, Unpay, &reference)
            .within(&mut tx)
            .into_future();
        let answer = crate::conformance::faults::poll_at_most(call, i % 10).await;
        match &answer {
            Some(Ok(Outcome::Applied { .. })) => {}
            Some(other) => panic!("order {id}: {other:?}"),
            None => dropped += 1,
        }
        let after = tokio::time::timeout(wait, B::exec_conn(&mut tx, insert("after")))
            .await
            .unwrap_or_else(|_| {
                panic!("order {id}, poll {}: the caller's connection hung", i % 10)
            });
        let committed = match after {
            Ok(()) => tokio::time::timeout(wait, B::try_commit(tx))
                .await
                .unwrap_or_else(|_| panic!("order {id}: the caller's commit hung")),
            Err(_) => {
                B::rollback(tx).await;
                false
            }
        };
        let rows = b
            .scalar(&format!("SELECT count(*) FROM caller_rows WHERE k = {id}"))
            .await;
        let moved = e
            .history(id)
            .await
            .unwrap()
            .iter()
            .any(|r| r.event == Unpay);
        let armed = timers_of(&e, id)
            .await
            .iter()
            .any(|t| t.state.as_deref() == Some("Created") && t.version == Some(2));
        assert_eq!(
            moved, armed,
            "order {id}: the move and its timer, whole or neither"
        );
        if committed {
            assert_eq!(rows, 2, "order {id}: the caller's rows");
        } else {
            assert_eq!((rows, moved), (0, false), "order {id}: a failed commit");
        }
        if answer.is_some() {
            assert!(committed && moved, "order {id}: answered Applied");
        }
    }
    assert!(
        dropped > 3,
        "dropped {dropped} times: the test shows nothing"
    );
    println!("dropped {dropped} of {}", ids.len());
}

pub async fn a_due_timer_fires_once<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    engine.create(1).await.unwrap();
    assert_eq!(timers.fire_once().await.unwrap().claimed, 0, "not due yet");
    make_due(b, 1).await;
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.applied), (1, 1), "{round:?}");
    assert_eq!(engine.get(1).await.unwrap().state, Cancelled);
    let history = engine.history(1).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].ref_id, "timer:Created:0");
    assert_eq!(history[0].actor.as_deref(), Some("timer"));
    assert_eq!(timers.fire_once().await.unwrap().claimed, 0);
    let t = &timers_of(&engine, 1).await[0];
    assert_eq!(
        (t.status.as_str(), t.outcome.as_deref()),
        ("FIRED", Some("applied"))
    );
    assert!(t.late_ms > 0);
    // A job that crashed after the commit and before recording it: the timer is fired
    // again, and the engine answers from the history.
    b.exec("UPDATE orderly_timers SET status = 'PENDING', outcome = NULL WHERE entity_id = 1")
        .await;
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.replayed), (1, 1), "{round:?}");
    assert_eq!(engine.history(1).await.unwrap().len(), 1);
}

pub async fn a_timer_is_moot_once_its_entity_moved_on<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    // Paid in time: the cancellation is moot, and recorded so.
    engine.create(1).await.unwrap();
    engine.transition(1, Pay, "p-1").await.unwrap();
    make_due(b, 1).await;
    b.exec("UPDATE orderly_timers SET status = 'CANCELLED' WHERE ref_id = 'timer:Paid:1'")
        .await;
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.moot), (1, 1), "{round:?}");
    assert_eq!(engine.get(1).await.unwrap().state, Paid);
    let t = &timers_of(&engine, 1).await[0];
    assert_eq!(
        (t.status.as_str(), t.outcome.as_deref()),
        ("FIRED", Some("moot"))
    );
    assert!(
        t.last_error.as_deref().unwrap_or("").contains("moot"),
        "{t:?}"
    );
    // Paid, then unpaid: back in Created at version 2, with a clock of its own. The first
    // clock is moot although the state is the same; the second one cancels.
    engine.create(2).await.unwrap();
    engine.transition(2, Pay, "p-2").await.unwrap();
    engine.transition(2, Unpay, "u-2").await.unwrap();
    make_due(b, 2).await;
    b.exec("UPDATE orderly_timers SET status = 'CANCELLED' WHERE ref_id = 'timer:Paid:1'")
        .await;
    // One entity's timers fire one at a time, in due order: the older first.
    let first = timers.fire_once().await.unwrap();
    assert_eq!((first.claimed, first.moot), (1, 1), "{first:?}");
    let second = timers.fire_once().await.unwrap();
    assert_eq!((second.claimed, second.applied), (1, 1), "{second:?}");
    let order = engine.get(2).await.unwrap();
    assert_eq!((order.state, order.version), (Cancelled, 3));
    let cancel = engine.history(2).await.unwrap().pop().unwrap();
    assert_eq!(cancel.ref_id, "timer:Created:2");
}

pub async fn a_timer_racing_the_payment_fires_or_is_moot<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    let (mut paid, mut cancelled, mut overlapped) = (0, 0, 0);
    for id in 1..=32 {
        engine.create(id).await.unwrap();
        make_due(b, id).await;
        let (pay, fired) = tokio::join!(
            async {
                let start = Instant::now();
                let out = engine.transition(id, Pay, "pay").await;
                (start, Instant::now(), out)
            },
            async {
                let start = Instant::now();
                let out = timers.fire_once().await.unwrap();
                (start, Instant::now(), out)
            },
        );
        let ((pay_start, pay_end, pay), (fire_start, fire_end, round)) = (pay, fired);
        if pay_start < fire_end && fire_start < pay_end {
            overlapped += 1;
        }
        let order = engine.get(id).await.unwrap();
        let history = engine.history(id).await.unwrap();
        assert_eq!(history.len(), 1, "one move, never both: {history:?}");
        match pay {
            Ok(Outcome::Applied { .. }) => {
                paid += 1;
                assert_eq!(order.state, Paid);
                assert_eq!(round.applied, 0, "no cancellation after an applied payment");
                // Fired in this round and moot, or not yet claimed: then it is moot later.
                if round.claimed == 0 {
                    let later = timers.fire_once().await.unwrap();
                    assert_eq!((later.claimed, later.moot), (1, 1), "{later:?}");
                } else {
                    assert_eq!(round.moot, 1, "{round:?}");
                }
            }
            Err(Error::InvalidTransition { .. }) => {
                cancelled += 1;
                assert_eq!(order.state, Cancelled);
                assert_eq!(round.applied, 1, "{round:?}");
            }
            other => panic!("the payment answered {other:?}"),
        }
    }
    eprintln!("timer race: paid {paid}, cancelled {cancelled}, overlapping {overlapped} of 32");
    assert_eq!(paid + cancelled, 32);
    assert!(
        overlapped >= 16,
        "the payment and the firing overlapped in {overlapped} of 32 rounds"
    );
}

pub async fn timer_jobs_race_over_many_due_timers<B: Backend>(b: &B) {
    const N: i64 = 300;
    let engine = timed_engine(b).await;
    for id in 1..=N {
        engine.create(id).await.unwrap();
    }
    b.exec("UPDATE orderly_timers SET due_at = due_at - 100000000000, next_at = 0")
        .await;
    let jobs: Vec<Timers<B::S>> = (0..4)
        .map(|_| {
            Timers::new(engine.store().clone())
                .with_config(orderly::TimersConfig::default().batch(16))
                .unwrap()
                .fire(engine.clone())
        })
        .collect();
    let rounds = futures_util::future::join_all(jobs.iter().map(|job| async move {
        let mut total = orderly::timer::TimerRound::default();
        loop {
            let round = job.fire_once().await.unwrap();
            if round.claimed == 0 {
                return total;
            }
            total.applied += round.applied;
            total.replayed += round.replayed;
            total.claimed += round.claimed;
            total.lost += round.lost;
        }
    }))
    .await;
    let applied: usize = rounds.iter().map(|r| r.applied).sum();
    let busy = rounds.iter().filter(|r| r.claimed > 0).count();
    eprintln!("timer jobs: {rounds:?}");
    assert_eq!(applied as i64, N, "{rounds:?}");
    assert!(
        busy >= 2,
        "only {busy} of 4 jobs fired anything: {rounds:?}"
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_transitions WHERE event = 'Cancel'")
            .await,
        N
    );
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED' AND outcome = 'applied'"
        )
        .await,
        N
    );
}

pub async fn corrupt_timer_rows_are_set_aside<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    for id in 1..=3 {
        engine.create(id).await.unwrap();
    }
    b.exec("UPDATE orderly_timers SET event = 'Explode' WHERE entity_id = 1")
        .await;
    b.exec("UPDATE orderly_timers SET state = 'Nowhere' WHERE entity_id = 2")
        .await;
    b.exec("UPDATE orderly_timers SET due_at = due_at - 100000000000, next_at = 0")
        .await;
    // On SQLite a column's type is only a hint: a due time that is no time.
    let sqlite = <B::S as orderly::Store>::BACKEND == "sqlite";
    if sqlite {
        engine.create(4).await.unwrap();
        b.exec("UPDATE orderly_timers SET due_at = 'soon', next_at = 'soon' WHERE entity_id = 4")
            .await;
    }
    let round = timers.fire_once().await.unwrap();
    let dead = if sqlite { 3 } else { 2 };
    assert_eq!(
        (round.claimed, round.applied, round.dead),
        (dead + 1, 1, dead),
        "{round:?}"
    );
    if sqlite {
        assert_eq!(engine.get(4).await.unwrap().state, Created);
        let corrupt: Vec<_> = timers
            .dead(10)
            .await
            .unwrap()
            .into_iter()
            .filter_map(Result::err)
            .collect();
        assert_eq!(corrupt.len(), 1, "{corrupt:?}");
        assert!(corrupt[0].reason.contains("unreadable row"), "{corrupt:?}");
        b.exec("DELETE FROM orderly_timers WHERE entity_id = 4")
            .await;
    }
    assert_eq!(engine.get(3).await.unwrap().state, Cancelled);
    assert_eq!(engine.get(1).await.unwrap().state, Created);
    let dead: Vec<TimerRow> = timers
        .dead(10)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.unwrap())
        .collect();
    assert_eq!(dead.len(), 2);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("unknown event"),
        "{dead:?}"
    );
    assert!(
        dead[1]
            .last_error
            .as_deref()
            .unwrap()
            .contains("unknown state"),
        "{dead:?}"
    );
    let stats = timers.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 2), "{stats:?}");
    // Fixed by an operator and re-armed: it fires.
    b.exec("UPDATE orderly_timers SET state = 'Created' WHERE entity_id = 2")
        .await;
    let key = TimerKey {
        machine: "Unpaid",
        entity_id: 2,
        event: "Cancel",
        ref_id: "timer:Created:0",
    };
    assert!(timers.rearm(&key).await.unwrap());
    assert!(!timers.rearm(&key).await.unwrap());
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.applied), (1, 1), "{round:?}");
    assert_eq!(engine.get(2).await.unwrap().state, Cancelled);
}

pub async fn timers_scheduled_and_cancelled_by_hand<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    engine.create(1).await.unwrap();
    engine
        .cancel_timer(1, Cancel, "timer:Created:0")
        .await
        .unwrap();
    assert!(
        engine
            .schedule(1, Pay, "remind-1", Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(
        !engine
            .schedule(1, Pay, "remind-1", Duration::ZERO)
            .await
            .unwrap()
    );
    assert!(matches!(
        engine.schedule(1, Pay, "", Duration::ZERO).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        engine
            .schedule(1, Pay, "far", Duration::from_secs(367 * 24 * 3600))
            .await,
        Err(Error::InvalidInput(_))
    ));
    assert!(
        engine
            .schedule(1, Ship, "ship-1", Duration::from_secs(3600))
            .await
            .unwrap()
    );
    // A timer a job is firing (its claim live) is not cancelled under it.
    b.exec("UPDATE orderly_timers SET owner_token = 'a-job', lease_until = 9000000000000 WHERE ref_id = 'ship-1'")
        .await;
    assert!(!engine.cancel_timer(1, Ship, "ship-1").await.unwrap());
    b.exec(
        "UPDATE orderly_timers SET owner_token = 'a-job', lease_until = 1 WHERE ref_id = 'ship-1'",
    )
    .await;
    assert!(engine.cancel_timer(1, Ship, "ship-1").await.unwrap());
    assert!(!engine.cancel_timer(1, Ship, "ship-1").await.unwrap());
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.applied), (1, 1), "{round:?}");
    let order = engine.get(1).await.unwrap();
    assert_eq!(order.state, Paid);
    // An event the state no longer allows: moot. Scheduled inside a transaction that
    // rolls back: never there.
    assert!(
        engine
            .schedule(1, Cancel, "late", Duration::ZERO)
            .await
            .unwrap()
    );
    let mut tx = b.begin().await;
    assert!(
        engine
            .schedule_within(&mut tx, 1, Unpay, "tx", Duration::ZERO)
            .await
            .unwrap()
    );
    B::rollback(tx).await;
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.moot), (1, 1), "{round:?}");
    // Purge: fired and cancelled timers past the retention go.
    b.exec("UPDATE orderly_timers SET fired_at = 1000 WHERE status IN ('FIRED', 'CANCELLED')")
        .await;
    let before = b.scalar("SELECT COUNT(*) FROM orderly_timers").await;
    let purged = timers.purge(Duration::from_secs(3600), 100).await.unwrap();
    assert_eq!(
        purged as i64,
        before - b.scalar("SELECT COUNT(*) FROM orderly_timers").await
    );
    assert!(purged >= 4, "{purged}");
}

orderly::state_machine! {
    /// An order whose cancellation runs an effect (which the killed job's child hangs in).
    pub Expiring {
        states: ExpiringState { Created, Cancelled }
        events: ExpiringEvent { Cancel }
        initial: Created;
        terminal: [Cancelled];
        rules: ExpiringRules {
            guards: []
            effects: [on_cancel]
        }
        transitions: {
            Created + Cancel => Cancelled / on_cancel,
        }
        timers: {
            Created after 1 h => Cancel,
        }
    }
}

/// The effect: hangs forever for the entity `hang`, once it has written the file `hung`
/// in `dir`; does nothing otherwise.
pub(crate) struct HangOn {
    hang: i64,
    dir: Option<std::path::PathBuf>,
}

impl HangOn {
    /// An effect that never hangs.
    pub(crate) fn none() -> Self {
        HangOn { hang: 0, dir: None }
    }
}

impl<C: Send> ExpiringRules<C> for HangOn {
    async fn on_cancel(
        &self,
        _conn: &mut C,
        judged: &orderly::Judged<'_, Expiring>,
    ) -> Result<(), orderly::Halt> {
        if judged.order_id == self.hang
            && let Some(dir) = &self.dir
        {
            std::fs::write(dir.join("hung"), b"").unwrap();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// What the child of [`a_timer_job_killed_by_sigkill_mid_batch_loses_nothing`] is told.
pub const TIMER_CHILD: &str = "timers|";

/// The entities of the killed job's batch; the last one due hangs in the child.
const KILLED_BATCH: i64 = 10;

/// A timer job in a process of its own, firing one timer at a time, killed with SIGKILL
/// while the last timer of its batch hangs in its unit: the batch's other nine
/// cancellations committed, none of the ten recorded as fired. Another job, here, takes
/// the batch over once the child's lease ran out: nine answered `Replayed` from the
/// history, the tenth `Applied`; every order cancelled once, every timer fired, none lost.
pub async fn a_timer_job_killed_by_sigkill_mid_batch_loses_nothing<B: Backend>(b: &B) {
    let name = "a_timer_job_killed_by_sigkill_mid_batch_loses_nothing";
    let engine: Engine<Expiring, B::S> = Engine::new(b.store(Duration::from_secs(10)).await)
        .unwrap()
        .with_rules(orderly::RulesOf(HangOn { hang: 0, dir: None }));
    for id in 1..=KILLED_BATCH {
        engine.create(id).await.unwrap();
        // Due in order of their ids, the last one last.
        b.exec(&format!(
            "UPDATE orderly_timers SET due_at = {id}, next_at = 0 WHERE entity_id = {id}"
        ))
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let thread = std::thread::current();
    let test = thread.name().filter(|n| n.ends_with(name)).unwrap_or(name);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(
            super::CHILD,
            format!("{TIMER_CHILD}{}|{}", b.child_handle(), dir.path().display()),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let hung = dir.path().join("hung");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !hung.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        assert!(Instant::now() < deadline, "the child never hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
    }
    // The crash came after the child's commits and before it recorded them.
    let cancelled = b
        .scalar("SELECT COUNT(*) FROM orderly_transitions WHERE event = 'Cancel'")
        .await;
    assert_eq!(
        cancelled,
        KILLED_BATCH - 1,
        "the child's commits before the hang"
    );
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_timers WHERE status = 'PENDING' AND owner_token IS NOT NULL"
        )
        .await,
        KILLED_BATCH,
        "the whole batch claimed by the child, none recorded"
    );
    // Once the child's lease ran out, a timer it applied is not cancelled: its event is
    // in the history under its reference.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for id in 1..KILLED_BATCH {
        assert!(
            !engine
                .cancel_timer(id, ExpiringEvent::Cancel, "timer:Created:0")
                .await
                .unwrap(),
            "order {id}: a fired timer cancelled"
        );
    }
    let job = Timers::new(engine.store().clone()).fire(engine.clone());
    let (mut replayed, mut applied) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while replayed + applied < KILLED_BATCH as usize {
        assert!(Instant::now() < deadline, "the batch was never taken over");
        let round = job.fire_once().await.unwrap();
        assert_eq!(round.dead + round.retried + round.moot, 0, "{round:?}");
        replayed += round.replayed;
        applied += round.applied;
        if round.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!((replayed, applied), (KILLED_BATCH as usize - 1, 1));
    for id in 1..=KILLED_BATCH {
        let history = engine.history(id).await.unwrap();
        assert_eq!(history.len(), 1, "order {id}: {history:?}");
        assert_eq!(
            engine.get(id).await.unwrap().state,
            ExpiringState::Cancelled
        );
    }
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED'")
            .await,
        KILLED_BATCH
    );
}

/// The child: a job firing one timer at a time, whose effect hangs on the last entity.
pub(crate) async fn timer_child<B: Backend>(spec: &str) {
    let (handle, dir) = spec.split_once('|').expect("handle|directory");
    let store = B::child_store(handle).await;
    let engine: Engine<Expiring, B::S> = Engine::with_config(
        store.clone(),
        EngineConfig::default()
            // The hang must outlast the kill, however late it comes.
            .deadline(Duration::from_secs(600)),
    )
    .unwrap()
    .with_rules(orderly::RulesOf(HangOn {
        hang: KILLED_BATCH,
        dir: Some(dir.into()),
    }));
    let job = Timers::new(store)
        .with_config(
            orderly::TimersConfig::default()
                .lease(Duration::from_secs(1))
                .concurrency(1),
        )
        .unwrap()
        .fire(engine);
    job.fire_once().await.unwrap();
    panic!("the child's round ended: it was to hang");
}

/// A timer job whose connection is cut at each of its statements, before the server
/// sees it and after the server answered it (the claim, the firing's unit, its commit,
/// the record of the outcome): whatever the round answered, a job on a sound connection
/// then fires what is left, and each timer is fired once (one cancellation in the
/// history, the timer `FIRED`), none lost; a round that answered `applied` is in the
/// history.
pub async fn a_timer_job_cut_at_each_statement_fires_each_once<B: Networked>(b: &B) {
    use crate::server::{Cut, Proxy};
    let engine = timed_engine(b).await;
    let sound = Timers::new(engine.store().clone()).fire(engine.clone());
    let points: [&'static [u8]; 4] = [
        b"SKIP LOCKED",
        b"transitions (order_id",
        b"COMMIT",
        b"'FIRED'",
    ];
    let mut id = 0;
    for point in points {
        for cut in [
            Cut::Request(point),
            Cut::ReplyTo(point),
            Cut::Forward(point),
        ] {
            id += 1;
            engine.create(id).await.unwrap();
            make_due(b, id).await;
            let proxy = Proxy::start(b.server(), cut).await;
            let proxied: TEng<B> = Engine::new(b.store_at(proxy.port, 2).await).unwrap();
            let job = Timers::new(proxied.store().clone())
                .with_config(
                    orderly::TimersConfig::default()
                        .lease(Duration::from_secs(1))
                        .min_backoff(Duration::from_millis(50))
                        .max_backoff(Duration::from_millis(200)),
                )
                .unwrap()
                .fire(proxied);
            let answer = job.fire_once().await;
            assert_eq!(
                proxy.cuts(),
                1,
                "{cut:?}: the proxy never cut, so the test shows nothing ({answer:?})"
            );
            if let Ok(round) = &answer
                && round.applied == 1
            {
                assert_eq!(
                    engine.history(id).await.unwrap().len(),
                    1,
                    "{cut:?}: {round:?}"
                );
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let t = timers_of(&engine, id).await.remove(0);
                if t.status == "FIRED" {
                    assert!(
                        matches!(t.outcome.as_deref(), Some("applied" | "replayed")),
                        "{cut:?}: {t:?}"
                    );
                    break;
                }
                assert_eq!(t.status, "PENDING", "{cut:?}: {t:?}");
                assert!(Instant::now() < deadline, "{cut:?}: never fired: {t:?}");
                let round = sound.fire_once().await.unwrap();
                assert_eq!(round.dead + round.moot, 0, "{cut:?}: {round:?}");
                if round.claimed == 0 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            let history = engine.history(id).await.unwrap();
            assert_eq!(history.len(), 1, "{cut:?}: {history:?}");
            assert_eq!(engine.get(id).await.unwrap().state, Cancelled, "{cut:?}");
        }
    }
}

/// No job runs while timers fall due (two per order: a payment due first, scheduled
/// last, then a cancellation 400 ms after it, a margin above the time one scheduling
/// call takes on a loaded machine, since each is due by the database's clock when it
/// ran); when jobs start, every timer fires once, each order's in due order (paid, then
/// its cancellation moot), and the lateness shows how long they waited.
pub async fn timers_that_fell_due_while_no_job_ran_fire_once_in_due_order<B: Backend>(b: &B) {
    const ORDERS: i64 = 20;
    let engine = timed_engine(b).await;
    for id in 1..=ORDERS {
        engine.create(id).await.unwrap();
        // Scheduled in the reverse of their due order, so the ids disagree with it.
        let cancel = engine.schedule(id, Cancel, "late-cancel", Duration::from_millis(700));
        assert!(cancel.await.unwrap());
        let pay = engine.schedule(id, Pay, "late-pay", Duration::from_millis(300));
        assert!(pay.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stats = job::<B>(&engine).stats().await.unwrap();
    assert_eq!(stats.due, 2 * ORDERS, "{stats:?}");
    assert!(stats.oldest_late_ms >= 400, "{stats:?}");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let jobs: Vec<_> = (0..3).map(|_| job::<B>(&engine)).collect();
    let runs = futures_util::future::join_all(jobs.iter().map(|j| {
        let mut stopped = stopped.clone();
        j.run(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
    }));
    let watch = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        let pending =
            "SELECT COUNT(*) FROM orderly_timers WHERE ref_id LIKE 'late-%' AND status = 'PENDING'";
        while b.scalar(pending).await > 0 {
            assert!(
                Instant::now() < deadline,
                "the jobs never fired every timer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.send(true).unwrap();
    };
    let (rounds, ()) = tokio::join!(runs, watch);
    let (mut applied, mut moot) = (0, 0);
    for r in rounds {
        let r = r.unwrap();
        assert_eq!(r.dead + r.retried + r.replayed, 0, "{r:?}");
        applied += r.applied;
        moot += r.moot;
    }
    assert_eq!((applied, moot), (ORDERS as usize, ORDERS as usize));
    for id in 1..=ORDERS {
        assert_eq!(engine.get(id).await.unwrap().state, Paid, "order {id}");
        let history = engine.history(id).await.unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        assert_eq!(history[0].ref_id, "late-pay");
    }
    let early = "SELECT COUNT(*) FROM orderly_timers WHERE ref_id LIKE 'late-%' AND fired_at - due_at < 400";
    assert_eq!(
        b.scalar(early).await,
        0,
        "every timer fired at least as late as the jobs were down"
    );
}

orderly::state_machine! {
    /// An order whose cancellation a guard may refuse (an order with a hold on it).
    pub Held {
        states: HeldState { Created, Cancelled }
        events: HeldEvent { Cancel }
        initial: Created;
        terminal: [Cancelled];
        rules: HeldRules {
            guards: [not_on_hold]
            effects: []
        }
        transitions: {
            Created + Cancel [not_on_hold] => Cancelled,
        }
        timers: {
            Created after 1 h => Cancel,
        }
    }
}

/// Refuses to cancel an even order: it is on hold.
struct Holds;

impl<C: Send> HeldRules<C> for Holds {
    async fn not_on_hold(
        &self,
        _conn: &mut C,
        judged: &orderly::Judged<'_, Held>,
    ) -> Result<(), orderly::Halt> {
        if judged.order_id % 2 == 0 {
            return Err(orderly::Halt::refuse("on_hold", "the order is on hold"));
        }
        Ok(())
    }
}

/// A guard on the edge a timer fires is judged like any request's: a refusal ends the
/// timer `refused`, with the guard's message, and writes nothing; an allowed move
/// applies.
pub async fn a_guard_on_the_fired_edge_is_judged<B: Backend>(b: &B) {
    let engine: Engine<Held, B::S> = Engine::new(b.store(Duration::from_secs(10)).await)
        .unwrap()
        .with_rules(orderly::RulesOf(Holds));
    engine.create(1).await.unwrap();
    engine.create(2).await.unwrap();
    b.exec("UPDATE orderly_timers SET due_at = due_at - 100000000000, next_at = 0")
        .await;
    let job = Timers::new(engine.store().clone()).fire(engine.clone());
    let round = job.fire_once().await.unwrap();
    assert_eq!((round.applied, round.refused), (1, 1), "{round:?}");
    assert_eq!(engine.get(1).await.unwrap().state, HeldState::Cancelled);
    let held = engine.get(2).await.unwrap();
    assert_eq!((held.state, held.version), (HeldState::Created, 0));
    assert!(engine.history(2).await.unwrap().is_empty());
    let t = timers_of(&engine, 2).await.remove(0);
    assert_eq!(
        (t.status.as_str(), t.outcome.as_deref()),
        ("FIRED", Some("refused"))
    );
    assert!(
        t.last_error
            .as_deref()
            .unwrap_or("")
            .contains("the order is on hold"),
        "{t:?}"
    );
}

/// A claim's token and a firing's note of any text (quotes, backslashes, `?` with a
/// number, a comment, a line break, non-ASCII) are stored and compared as given by the
/// statements whose text is new at each call, which MySQL sends as text with their values
/// written in: the claim reads its rows back by its token, a release under a token that
/// differs in its last character changes nothing, one mark records two firings (one with
/// a note, read back as written, one without) and a release hands the third back.
pub async fn tokens_and_notes_of_any_text_are_stored_as_given<B: Backend>(b: &B) {
    use orderly::timer::{ClaimTimers, FiredTimer};
    use orderly::{Store, TimerStore};
    let engine = timed_engine(b).await;
    for id in [1, 2, 3] {
        engine.create(id).await.unwrap();
        make_due(b, id).await;
    }
    let store = engine.store();
    let mut conn = store.acquire().await.unwrap();
    let token = "t'\"`\\%_ ?1 ?2 ;-- é😀\n";
    let claim = ClaimTimers {
        machine: <Unpaid as orderly::StateMachine>::NAME,
        token,
        lease_ms: 60_000,
        limit: 10,
    };
    let mut claimed: Vec<TimerRow> = store
        .claim_timers(&mut conn, &claim)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.expect("every timer row reads"))
        .collect();
    claimed.sort_by_key(|t| t.entity_id);
    let entities: Vec<i64> = claimed.iter().map(|t| t.entity_id).collect();
    assert_eq!(
        entities,
        [1, 2, 3],
        "the due timers claimed, read back by the token"
    );
    let ids: Vec<i64> = claimed.iter().map(|t| t.id).collect();
    let other = "t'\"`\\%_ ?1 ?2 ;-- é😀\r";
    assert_eq!(
        store.release_timers(&mut conn, other, &ids).await.unwrap(),
        0,
        "another token released the claim"
    );
    let note = "moot: it's \\'; DROP TABLE orders; -- ?1 \"x\"\té😀";
    let fired = [
        FiredTimer {
            id: ids[0],
            outcome: "moot",
            note: Some(note),
        },
        FiredTimer {
            id: ids[1],
            outcome: "replayed",
            note: None,
        },
    ];
    assert_eq!(store.mark_fired(&mut conn, token, &fired).await.unwrap(), 2);
    assert_eq!(
        store
            .release_timers(&mut conn, token, &ids[2..])
            .await
            .unwrap(),
        1
    );
    drop(conn);
    let row = |entity: i64, id: i64| {
        let engine = engine.clone();
        async move {
            timers_of(&engine, entity)
                .await
                .into_iter()
                .find(|t| t.id == id)
                .unwrap()
        }
    };
    let first = row(1, ids[0]).await;
    assert_eq!(
        (first.status.as_str(), first.outcome.as_deref()),
        ("FIRED", Some("moot"))
    );
    assert_eq!(
        first.last_error.as_deref(),
        Some(note),
        "the note as written"
    );
    let second = row(2, ids[1]).await;
    assert_eq!(
        (second.status.as_str(), second.outcome.as_deref()),
        ("FIRED", Some("replayed"))
    );
    assert_eq!(second.last_error, None, "no note");
    let third = row(3, ids[2]).await;
    assert_eq!((third.status.as_str(), third.attempts), ("PENDING", 0));
}
