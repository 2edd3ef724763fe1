//! SQLite's clock, as docs/timers.md ("The clock") says it is: SQLite has no server, so
//! `now` in a statement is the clock of the process that runs it. A timer armed due in
//! 30 minutes is not due for a job on this process's clock; a job in a process whose
//! clock runs three hours ahead (libfaketime, Debian's `faketime`) fires it.
//!
//! Opt-in (it needs libfaketime): `cargo test --test sqlite_clock -- --include-ignored`,
//! as `.ci/run` runs it.

use std::time::Duration;

use orderly::{Engine, SqliteStore, Timers};

orderly::state_machine! {
    /// An order cancelled when it is not paid within 30 minutes.
    pub Unpaid {
        states: UnpaidState { Created, Paid, Cancelled }
        events: UnpaidEvent { Pay, Cancel }
        initial: Created;
        terminal: [Paid, Cancelled];
        transitions: {
            Created + Pay    => Paid,
            Created + Cancel => Cancelled,
        }
        timers: {
            Created after 30 min => Cancel,
        }
    }
}

/// Where the child, a job in a process of its own, finds the database.
const CHILD: &str = "ORDERLY_SQLITE_CLOCK_CHILD";

/// libfaketime as Debian's `faketime` installs it.
fn libfaketime() -> String {
    let arch = std::env::consts::ARCH;
    format!("/usr/lib/{arch}-linux-gnu/faketime/libfaketimeMT.so.1")
}

async fn engine(url: &str) -> Engine<Unpaid, SqliteStore> {
    Engine::new(SqliteStore::demo(url).await.unwrap()).unwrap()
}

#[tokio::test]
#[ignore = "needs libfaketime (Debian's faketime); .ci/run runs it"]
async fn a_job_on_sqlite_fires_by_the_clock_of_its_own_process() {
    let job = |e: &Engine<Unpaid, SqliteStore>| Timers::new(e.store().clone()).fire(e.clone());
    if let Ok(url) = std::env::var(CHILD) {
        let round = job(&engine(&url).await).fire_once().await.unwrap();
        println!(
            "child round: claimed={} applied={}",
            round.claimed, round.applied
        );
        return;
    }
    let lib = libfaketime();
    assert!(
        std::path::Path::new(&lib).exists(),
        "{lib} is missing: install Debian's faketime (.ci/run does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("clock.db").display());
    let engine = engine(&url).await;
    engine.create(1).await.unwrap();
    // On this process's clock the timer is 30 minutes off: nothing to fire.
    let round = job(&engine).fire_once().await.unwrap();
    assert_eq!((round.claimed, round.applied), (0, 0), "{round:?}");
    let timer = engine.timers(1).await.unwrap().remove(0).unwrap();
    assert!(timer.late_ms < -29 * 60_000, "due in 30 minutes: {timer:?}");
    // A job whose process's clock runs three hours ahead (monotonic time left real).
    let test = "a_job_on_sqlite_fires_by_the_clock_of_its_own_process";
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--include-ignored", "--nocapture"])
            .env(CHILD, &url)
            .env("LD_PRELOAD", lib)
            .env("FAKETIME", "+3h")
            .env("DONT_FAKE_MONOTONIC", "1")
            .output()
            .unwrap()
    });
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the child never ended")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {stdout}{stderr}");
    assert!(
        stdout.contains("child round: claimed=1 applied=1"),
        "the child's job did not fire the timer: {stdout}{stderr}"
    );
    let order = engine.get(1).await.unwrap();
    assert_eq!(order.state, UnpaidState::Cancelled);
    // Recorded by the child's clock: fired about two and a half hours after it was due.
    let timer = engine.timers(1).await.unwrap().remove(0).unwrap();
    assert_eq!(timer.status, "FIRED");
    let late: i64 = sqlx::query_scalar("SELECT fired_at - due_at FROM orderly_timers")
        .fetch_one(engine.store().pool())
        .await
        .unwrap();
    assert!(
        (2 * 3_600_000..3 * 3_600_000).contains(&late),
        "fired {late} ms after its due time, by the child's clock"
    );
}
