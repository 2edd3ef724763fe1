//! Timers on a bad day, on every backend: a due time that is no time, a timer its job
//! applied and did not live to record, a record that fails amid the round's others, a
//! shutdown in the middle of a round, a round dropped at every await point.

use std::sync::Arc;
use std::time::{Duration, Instant};

use orderly::{Engine, EngineConfig, Outcome, Timers, TimersConfig};

use super::faults::poll_at_most;
use super::timers::{
    Expiring, ExpiringRules, ExpiringState, TEng, UnpaidEvent, UnpaidState, job, make_due,
    timed_engine, timers_of,
};
use super::{Backend, Networked};

/// A timer row whose due time is no time (the smallest 64-bit integer, below which
/// `now - due_at` overflows; the largest) is set aside `DEAD` with the reason in the
/// round that claims it, and the machine's other timers fire in that round; `stats` and
/// the entity's timers keep answering. On SQLite, where a column takes any type, a due
/// time that is text is set aside before the entity's real timer, not after it.
pub async fn a_timer_due_at_no_time_is_set_aside_and_blocks_nothing<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    for id in 1..=3 {
        engine.create(id).await.unwrap();
        make_due(b, id).await;
    }
    b.exec("UPDATE orderly_timers SET due_at = -9223372036854775808 WHERE entity_id = 1")
        .await;
    // Its next try no time either: claimed all the same, to be set aside.
    b.exec(
        "UPDATE orderly_timers SET due_at = 9223372036854775807, next_at = 9223372036854775807 \
         WHERE entity_id = 3",
    )
    .await;
    let stats = timers.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.oldest_late_ms),
        (3, i64::MAX),
        "lateness saturates: {stats:?}"
    );
    let of_one = engine.timers(1).await.unwrap();
    assert!(
        matches!(&of_one[..], [Err(c)] if c.reason.contains("is no time")),
        "{of_one:?}"
    );
    let round = timers.fire_once().await.unwrap();
    assert_eq!(
        (round.claimed, round.applied, round.dead),
        (3, 1, 2),
        "{round:?}"
    );
    assert_eq!(engine.get(2).await.unwrap().state, UnpaidState::Cancelled);
    assert_eq!(engine.get(1).await.unwrap().state, UnpaidState::Created);
    assert_eq!(engine.get(3).await.unwrap().state, UnpaidState::Created);
    let dead = timers.dead(10).await.unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    for row in &dead {
        assert!(
            matches!(row, Err(c) if c.reason.contains("is no time")),
            "{row:?}"
        );
    }
    let set_aside = b
        .scalar(
            "SELECT COUNT(*) FROM orderly_timers WHERE status = 'DEAD' \
             AND last_error LIKE '%is no time%'",
        )
        .await;
    assert_eq!(set_aside, 2, "the reason is recorded with the row");
    let stats = timers.stats().await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 2), "{stats:?}");

    if <B::S as orderly::Store>::BACKEND == "sqlite" {
        // An entity with its state's timer and one by hand whose due time is text: the
        // text one orders first, and is set aside in the first round.
        engine.create(4).await.unwrap();
        make_due(b, 4).await;
        assert!(
            engine
                .schedule(4, UnpaidEvent::Pay, "by-hand", Duration::ZERO)
                .await
                .unwrap()
        );
        b.exec(
            "UPDATE orderly_timers SET due_at = 'soon', next_at = 'soon' \
             WHERE entity_id = 4 AND ref_id = 'by-hand'",
        )
        .await;
        let first = timers.fire_once().await.unwrap();
        assert_eq!(
            (first.claimed, first.dead, first.applied),
            (1, 1, 0),
            "{first:?}"
        );
        let second = timers.fire_once().await.unwrap();
        assert_eq!((second.claimed, second.applied), (1, 1), "{second:?}");
        assert_eq!(engine.get(4).await.unwrap().state, UnpaidState::Cancelled);
    }
}

/// A job that applied a timer's event and died before recording it leaves the timer
/// `PENDING` with its event in the history under its reference: cancelling it answers
/// `false` and leaves it, and the next job records it `FIRED`, `replayed`. A timer whose
/// event is not in the history is cancelled. (The SIGKILL test asks the same of timers
/// a killed job really applied.)
pub async fn a_timer_its_job_applied_is_never_cancelled<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    let reference = "timer:Created:0";
    for id in 1..=2 {
        engine.create(id).await.unwrap();
        make_due(b, id).await;
    }
    // What the job did before it died: the timer's request, under its reference.
    let applied = engine
        .transition(1, UnpaidEvent::Cancel, reference)
        .actor("timer")
        .await
        .unwrap();
    assert!(matches!(applied, Outcome::Applied { .. }), "{applied:?}");
    assert!(
        !engine
            .cancel_timer(1, UnpaidEvent::Cancel, reference)
            .await
            .unwrap()
    );
    assert_eq!(timers_of(&engine, 1).await[0].status, "PENDING");
    assert!(
        engine
            .cancel_timer(2, UnpaidEvent::Cancel, reference)
            .await
            .unwrap()
    );
    let round = timers.fire_once().await.unwrap();
    assert_eq!((round.claimed, round.replayed), (1, 1), "{round:?}");
    let t = timers_of(&engine, 1).await.remove(0);
    assert_eq!(
        (t.status.as_str(), t.outcome.as_deref()),
        ("FIRED", Some("replayed"))
    );
    assert_eq!(timers_of(&engine, 2).await[0].status, "CANCELLED");
    assert_eq!(engine.get(2).await.unwrap().state, UnpaidState::Created);
}

/// A trigger that refuses to record entity 1's timer dead, in the backend's dialect.
fn refuse_dead<B: Backend>() -> (&'static str, &'static str) {
    match <B::S as orderly::Store>::BACKEND {
        "postgres" => (
            "CREATE FUNCTION refuse_dead_timer() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.status = 'DEAD' AND NEW.entity_id = 1 THEN \
             RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER refuse_dead BEFORE UPDATE ON orderly_timers \
             FOR EACH ROW EXECUTE FUNCTION refuse_dead_timer()",
            "DROP TRIGGER refuse_dead ON orderly_timers; DROP FUNCTION refuse_dead_timer()",
        ),
        "mysql" => (
            "CREATE TRIGGER refuse_dead BEFORE UPDATE ON orderly_timers FOR EACH ROW \
             BEGIN IF NEW.status = 'DEAD' AND NEW.entity_id = 1 THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF; END",
            "DROP TRIGGER refuse_dead",
        ),
        _ => (
            "CREATE TRIGGER refuse_dead BEFORE UPDATE ON orderly_timers \
             WHEN NEW.status = 'DEAD' AND NEW.entity_id = 1 \
             BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
            "DROP TRIGGER refuse_dead",
        ),
    }
}

/// A round in which recording one outcome fails (a trigger refuses to record the first
/// timer due dead) still records every other outcome: the round answers the error, the
/// other timers are `FIRED` at once (not left claimed for a lease), and the one not
/// recorded stays claimed until a job takes it over.
pub async fn one_failed_record_holds_back_no_other_outcome<B: Backend>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    for id in 1..=3 {
        engine.create(id).await.unwrap();
        make_due(b, id).await;
    }
    // Entity 1's timer fires an event the machine lacks (dead at once), and is due first.
    b.exec("UPDATE orderly_timers SET event = 'Explode', due_at = 1 WHERE entity_id = 1")
        .await;
    let (create, drop) = refuse_dead::<B>();
    b.exec(create).await;
    let answer = timers.fire_once().await;
    let error = answer.expect_err("the refused record's error");
    assert!(error.to_string().contains("refused by the test"), "{error}");
    for id in 2..=3 {
        let t = timers_of(&engine, id).await.remove(0);
        assert_eq!(
            (t.status.as_str(), t.outcome.as_deref()),
            ("FIRED", Some("applied")),
            "{t:?}"
        );
        assert_eq!(engine.get(id).await.unwrap().state, UnpaidState::Cancelled);
    }
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_timers WHERE entity_id = 1 \
             AND status = 'PENDING' AND owner_token IS NOT NULL"
        )
        .await,
        1,
        "the one not recorded stays claimed"
    );
    b.exec(drop).await;
}

/// A round whose record of a fired timer meets contention (a deadlock the database
/// answers, raised here by a trigger on the first two updates that mark a timer fired:
/// the batch's, which undoes the batch, and the one-by-one round's) records it again: the
/// round answers it applied and the timer is `FIRED` at once, not left claimed for a
/// lease and fired again, `Replayed`. The trigger's sequence shows the third mark landed
/// (on MariaDB a `NOCACHE` one: a Galera node refuses a cached sequence).
pub async fn a_record_met_by_contention_is_made_again<B: Networked>(b: &B) {
    let engine = timed_engine(b).await;
    let timers = job::<B>(&engine);
    engine.create(1).await.unwrap();
    make_due(b, 1).await;
    let (create, drop, tries) = match <B::S as orderly::Store>::BACKEND {
        "postgres" => (
            "CREATE SEQUENCE refused_marks; \
             CREATE FUNCTION contend_mark() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.status = 'FIRED' AND OLD.status = 'PENDING' THEN \
             IF nextval('refused_marks') <= 2 THEN \
             RAISE EXCEPTION 'contention by the test' USING ERRCODE = '40P01'; END IF; END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER contend_mark BEFORE UPDATE ON orderly_timers \
             FOR EACH ROW EXECUTE FUNCTION contend_mark()",
            "DROP TRIGGER contend_mark ON orderly_timers; DROP FUNCTION contend_mark(); \
             DROP SEQUENCE refused_marks",
            "SELECT last_value FROM refused_marks",
        ),
        _ => (
            "CREATE SEQUENCE refused_marks NOCACHE; \
             CREATE TRIGGER contend_mark BEFORE UPDATE ON orderly_timers FOR EACH ROW \
             BEGIN IF NEW.status = 'FIRED' AND OLD.status = 'PENDING' THEN \
             IF NEXTVAL(refused_marks) <= 2 THEN \
             SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, \
             MESSAGE_TEXT = 'contention by the test'; END IF; END IF; END",
            "DROP TRIGGER contend_mark; DROP SEQUENCE refused_marks",
            "SELECT NEXTVAL(refused_marks) - 1",
        ),
    };
    b.exec(create).await;
    let round = timers
        .fire_once()
        .await
        .expect("the round records its firing");
    assert_eq!(
        (round.claimed, round.applied, round.lost),
        (1, 1, 0),
        "{round:?}"
    );
    assert_eq!(
        b.scalar(tries).await,
        3,
        "two marks refused, the third landed"
    );
    b.exec(drop).await;
    let t = timers_of(&engine, 1).await.remove(0);
    assert_eq!(
        (t.status.as_str(), t.outcome.as_deref(), t.attempts),
        ("FIRED", Some("applied"), 1),
        "{t:?}"
    );
    assert_eq!(engine.history(1).await.unwrap().len(), 1);
}

/// The effect of the cancellation: tells the test it began, then takes `0`.
struct SlowCancel(Duration, Arc<tokio::sync::Notify>);

impl<C: Send> ExpiringRules<C> for SlowCancel {
    async fn on_cancel(
        &self,
        _conn: &mut C,
        _judged: &orderly::Judged<'_, Expiring>,
    ) -> Result<(), orderly::Halt> {
        self.1.notify_one();
        tokio::time::sleep(self.0).await;
        Ok(())
    }
}

/// `run`'s shutdown signal completes while the first firings of a round of twelve are
/// under way (each takes 300 ms, two at a time): the firings under way finish and are
/// recorded, no other starts, and `run` returns; the rest are handed back at once, and
/// another job fires each once.
pub async fn a_timer_job_shut_down_mid_round_stops_after_the_firings_under_way<B: Backend>(b: &B) {
    const N: i64 = 12;
    let began = Arc::new(tokio::sync::Notify::new());
    let engine: Engine<Expiring, B::S> = Engine::new(b.store(Duration::from_secs(10)).await)
        .unwrap()
        .with_rules(orderly::RulesOf(SlowCancel(
            Duration::from_millis(300),
            began.clone(),
        )));
    for id in 1..=N {
        engine.create(id).await.unwrap();
        b.exec(&format!(
            "UPDATE orderly_timers SET due_at = {id}, next_at = 0 WHERE entity_id = {id}"
        ))
        .await;
    }
    let config = TimersConfig::default()
        .lease(Duration::from_secs(1))
        .concurrency(2);
    let job = Timers::new(engine.store().clone())
        .with_config(config.clone())
        .unwrap()
        .fire(engine.clone());
    let signal = async move { began.notified().await };
    let total = tokio::time::timeout(Duration::from_secs(60), job.run(signal))
        .await
        .expect("run returned")
        .unwrap();
    let cancelled = b
        .scalar("SELECT COUNT(*) FROM orderly_transitions WHERE event = 'Cancel'")
        .await;
    assert_eq!(
        total.claimed, N as usize,
        "one round claimed all: {total:?}"
    );
    assert!(
        (1..=2).contains(&cancelled),
        "the firings under way finish and no other starts: {cancelled} of {N} fired"
    );
    assert_eq!(total.applied as i64, cancelled, "{total:?}");
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_timers WHERE status = 'FIRED'")
            .await,
        cancelled,
        "the firings under way are recorded"
    );
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_timers WHERE status = 'PENDING' \
             AND owner_token IS NULL AND lease_until = 0 AND attempts = 0"
        )
        .await,
        N - cancelled,
        "the rest are handed back unfired, their claim not counted"
    );
    let other = Timers::new(engine.store().clone())
        .with_config(config)
        .unwrap()
        .fire(engine.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut applied = 0;
    while applied < (N - cancelled) as usize {
        assert!(Instant::now() < deadline, "the rest were never taken over");
        let round = other.fire_once().await.unwrap();
        assert_eq!(round.dead + round.retried + round.moot, 0, "{round:?}");
        applied += round.applied;
        if round.claimed == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for id in 1..=N {
        assert_eq!(engine.history(id).await.unwrap().len(), 1, "order {id}");
        assert_eq!(
            engine.get(id).await.unwrap().state,
            ExpiringState::Cancelled
        );
    }
}

/// A timer job's round of one due timer dropped at every await point it reaches, on a
/// pool of one connection (a connection handed back dirty is certainly the next
/// caller's), for a timer the job fires inside its batch transaction (an edge that is
/// only writes) and for one it fires on its own (an edge with an effect). After each
/// drop the timer's event is in the history at most once, a timer recorded `FIRED` is in
/// it, and the pool serves the next call; then (its lease made to run out) a sound job
/// fires what is left: every timer `FIRED` once, its event in the history once.
/// Evidence that drops fell where it matters: for the batch, a drop after its commit was
/// sent (the timer found fired with its event, the dropped round counting nothing); for
/// the firing on its own, a drop between the firing's commit and its record (the timer
/// left `PENDING` with its event in the history).
pub async fn a_timer_job_dropped_at_every_await_point_fires_each_once<B: Backend>(b: &B) {
    let batched = timed_engine(b).await;
    let small: TEng<B> = Engine::with_config(
        b.small_store(1).await,
        EngineConfig::default().read_first(B::POLICY),
    )
    .unwrap();
    let (drops, landed, _) = dropped_at_every_await(b, &batched, &small, 0, |s| s.1).await;
    assert!(
        landed > 0,
        "no drop fell after a batch's commit was sent ({drops} drops)"
    );
    let rules = || orderly::RulesOf(super::timers::HangOn::none());
    let alone: Engine<Expiring, B::S> = Engine::new(b.store(Duration::from_secs(10)).await)
        .unwrap()
        .with_rules(rules());
    let small: Engine<Expiring, B::S> = Engine::new(b.small_store(1).await)
        .unwrap()
        .with_rules(rules());
    let (drops, _, unrecorded) = dropped_at_every_await(b, &alone, &small, 100_000, |s| s.2).await;
    assert!(
        unrecorded > 0,
        "no drop fell between a firing's commit and its record ({drops} drops)"
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_timers WHERE status <> 'FIRED'")
            .await,
        0
    );
}

/// The drops of [`a_timer_job_dropped_at_every_await_point_fires_each_once`] for one
/// machine, whose entities are numbered from `base` + 1 and whose state's timer moves
/// them to a terminal state: how many rounds were dropped, after how many of them the
/// timer was fired by the dropped round, and after how many it was found `PENDING` with
/// its event in the history; `evidence` picks the count to go round for.
async fn dropped_at_every_await<M: orderly::StateMachine, B: Backend>(
    b: &B,
    engine: &Engine<M, B::S>,
    small: &Engine<M, B::S>,
    base: i64,
    evidence: fn(&(usize, usize, usize)) -> usize,
) -> (usize, usize, usize) {
    let sound = Timers::new(engine.store().clone()).fire(engine.clone());
    let dropped = Timers::new(small.store().clone())
        .with_config(TimersConfig::default().lease(Duration::from_secs(1)))
        .unwrap()
        .fire(small.clone());
    let mut id = base;
    // Drops, and after how many of them the timer was fired by the dropped round, or
    // left `PENDING` with its event in the history.
    let mut seen = (0, 0, 0);
    for pass in 0..20 {
        for k in 0.. {
            id += 1;
            engine.create(id).await.unwrap();
            make_due(b, id).await;
            let done = poll_at_most(dropped.fire_once(), k).await;
            // The timer first: a batch's commit in flight when its round was dropped may
            // land between the two reads, and a timer found fired is then in the history.
            let t = timers_of(engine, id).await.remove(0);
            let history = engine.history(id).await.unwrap().len();
            assert!(history <= 1, "pass {pass}, {k} polls: {history} moves");
            match t.status.as_str() {
                "FIRED" => assert_eq!(history, 1, "pass {pass}, {k} polls: {t:?}"),
                "PENDING" => {}
                other => panic!("pass {pass}, {k} polls: {other}: {t:?}"),
            }
            // The pool of one serves the next call.
            small.get(id).await.unwrap();
            if let Some(round) = done {
                assert_eq!(round.unwrap().applied, 1, "pass {pass}, {k} polls");
                break;
            }
            seen.0 += 1;
            if t.status == "PENDING" && history == 1 {
                seen.2 += 1;
            }
            // The lease run out: a sound job fires it (or replays it). A statement of the
            // dropped round may still be running on a connection the pool let go (its
            // row locked, or its claim landing late): the job goes round until it is
            // fired.
            b.exec(&format!(
                "UPDATE orderly_timers SET lease_until = 0 WHERE entity_id = {id}"
            ))
            .await;
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut fired_by_sound = 0;
            while timers_of(engine, id).await[0].status != "FIRED" {
                assert!(
                    Instant::now() < deadline,
                    "pass {pass}, {k} polls: never fired"
                );
                let round = sound.fire_once().await.unwrap();
                assert_eq!(
                    round.dead + round.moot + round.retried,
                    0,
                    "pass {pass}, {k} polls: {round:?}"
                );
                fired_by_sound += round.applied + round.replayed;
                if round.claimed == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // Fired, and not by the sound job: the dropped round's commit was sent, and
            // landed after its drop (on the server as the socket closed, or on SQLite's
            // worker).
            if fired_by_sound == 0 {
                seen.1 += 1;
            }
            let t = timers_of(engine, id).await.remove(0);
            assert_eq!(t.status, "FIRED", "pass {pass}, {k} polls: {t:?}");
            assert_eq!(engine.history(id).await.unwrap().len(), 1);
            assert!(M::is_terminal(engine.get(id).await.unwrap().state));
        }
        // A reply already in the socket lets a round pass its await points in fewer
        // polls, and a commit dropped as it was sent may not have left: go round again
        // until a drop fell where it matters.
        if evidence(&seen) > 0 {
            break;
        }
    }
    assert!(seen.0 > 0, "no round was dropped");
    assert_eq!(
        b.scalar(&format!(
            "SELECT COUNT(*) FROM orderly_transitions WHERE order_id > {base} AND order_id <= {id}"
        ))
        .await,
        id - base,
        "every order's event in the history once"
    );
    seen
}

/// What the child of [`a_timer_job_killed_by_sigkill_inside_its_batch_undoes_it_whole`]
/// is told.
pub const BATCH_CHILD: &str = "timer-batch|";

/// The timers of the killed batch; the test holds the last one's entity locked.
const BATCH: i64 = 10;

/// A timer job in a process of its own, killed with SIGKILL inside its batch
/// transaction: the test holds the row of the batch's last entity (due last) locked, so
/// the child claims the ten timers, fires nine inside its transaction and waits on the
/// tenth; the test sees it wait, then kills it. Nothing of the batch holds: no move in
/// the history, every timer `PENDING` and unclaimed at once (no lease to wait out).
/// Then a job here fires all ten, each `Applied` once. (Not on SQLite: a test there
/// cannot hold one entity's row while the child's transaction runs, one writer at a
/// time.)
pub async fn a_timer_job_killed_by_sigkill_inside_its_batch_undoes_it_whole<B: Networked>(b: &B) {
    let name = "a_timer_job_killed_by_sigkill_inside_its_batch_undoes_it_whole";
    let engine = timed_engine(b).await;
    let held = batch_due_and_last_held(b, &engine).await;
    let thread = std::thread::current();
    let test = thread.name().filter(|n| n.ends_with(name)).unwrap_or(name);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(super::CHILD, format!("{BATCH_CHILD}{}", b.child_handle()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The child waits on the held row: inside its batch, past the claim and nine firings.
    let deadline = Instant::now() + Duration::from_secs(60);
    while b.lock_waits().await == 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child exited early"
        );
        assert!(
            Instant::now() < deadline,
            "the child never waited on the row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
    }
    B::rollback(held).await;
    // The server undoes the killed session's transaction once it sees the socket closed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.lock_waits().await + b.open_transactions().await > 0 {
        assert!(Instant::now() < deadline, "the killed session stayed");
        tokio::time::sleep(super::outbox::cancel::POLL).await;
    }
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_transitions WHERE event = 'Cancel'")
            .await,
        0,
        "a move of the killed batch held"
    );
    assert_eq!(
        b.scalar(
            "SELECT COUNT(*) FROM orderly_timers \
             WHERE status = 'PENDING' AND owner_token IS NULL AND attempts = 0"
        )
        .await,
        BATCH,
        "every timer pending and unclaimed"
    );
    let round = job::<B>(&engine).fire_once().await.unwrap();
    assert_eq!(
        (round.claimed, round.applied),
        (BATCH as usize, BATCH as usize),
        "{round:?}"
    );
    for id in 1..=BATCH {
        assert_eq!(engine.history(id).await.unwrap().len(), 1, "order {id}");
        assert_eq!(engine.get(id).await.unwrap().state, UnpaidState::Cancelled);
    }
}

/// The child: a job whose batch waits on the row the test holds.
pub(crate) async fn batch_child<B: Backend>(handle: &str) {
    let engine: TEng<B> = Engine::with_config(
        B::child_store(handle).await,
        // The wait must outlast the kill, however late it comes.
        EngineConfig::default().deadline(Duration::from_secs(600)),
    )
    .unwrap();
    job::<B>(&engine).fire_once().await.unwrap();
    panic!("the child's round ended: it was to wait");
}

/// A batch that meets a row the application holds past the engine's deadline: its lock
/// wait ends within the deadline, the batch is undone whole (its session waits on
/// nothing, and holds none of its timers), and the round fires
/// the batch one by one instead: the nine free entities applied, the held one tried
/// again later; once the row is let go, it fires too.
pub async fn a_batch_held_up_by_the_applications_lock_is_undone_in_time<B: Networked>(b: &B) {
    let engine: TEng<B> = Engine::with_config(
        b.store(Duration::from_secs(30)).await,
        EngineConfig::default()
            .read_first(B::POLICY)
            .deadline(Duration::from_secs(1)),
    )
    .unwrap();
    let held = batch_due_and_last_held(b, &engine).await;
    let job = Timers::new(engine.store().clone())
        .with_config(TimersConfig::default().min_backoff(Duration::from_millis(100)))
        .unwrap()
        .fire(engine.clone());
    let round = job.fire_once().await.unwrap();
    assert_eq!(
        (round.applied, round.retried),
        (BATCH as usize - 1, 1),
        "{round:?}"
    );
    // The held entity's firing one by one may still wait in the server, its caller gone
    // (as every firing past its deadline); the batch's own wait ended with its lock
    // timeout.
    assert!(
        b.lock_waits().await <= 1,
        "the batch's session still waits on the held row"
    );
    B::rollback(held).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.history(BATCH).await.unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the held entity's timer never fired"
        );
        job.fire_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in 1..=BATCH {
        assert_eq!(engine.history(id).await.unwrap().len(), 1, "order {id}");
    }
}

/// The batch's entities created, their timers due in order of their ids (the last one
/// last), and the last entity's row held in a transaction of the test's own.
async fn batch_due_and_last_held<B: Backend>(b: &B, engine: &TEng<B>) -> B::Tx {
    for id in 1..=BATCH {
        engine.create(id).await.unwrap();
        b.exec(&format!(
            "UPDATE orderly_timers SET due_at = {id}, next_at = 0 WHERE entity_id = {id}"
        ))
        .await;
    }
    let mut held = b.begin().await;
    B::exec_in(
        &mut held,
        &format!("UPDATE orders SET version = version WHERE id = {BATCH}"),
    )
    .await;
    held
}
