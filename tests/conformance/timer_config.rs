//! Timer delays from the engine's configuration, on every backend: armed with the
//! configured delay, drawn with it, and refused when they name no timer of the machine.

use std::time::Duration;

use orderly::{Engine, EngineConfig, Error};

use super::Backend;
use super::timers::{TEng, Unpaid, UnpaidEvent, timers_of};

/// An engine whose config sets the delay of `Created after 30 min => Cancel` to 90 s
/// arms that timer 90 s after the create (by the database's clock) and draws it so;
/// the machine's other timer keeps its declared 7 days. A delay that names no timer of
/// the machine, or that is 0 or past 366 days, is refused with every problem named.
pub async fn timer_delays_from_the_config_arm_and_draw<B: Backend>(b: &B) {
    let config = EngineConfig::default().read_first(B::POLICY).timer_delay(
        "Created",
        "Cancel",
        Duration::from_secs(90),
    );
    let engine: TEng<B> =
        Engine::with_config(b.store(Duration::from_secs(10)).await, config).unwrap();
    engine.create(1).await.unwrap();
    let created = timers_of(&engine, 1).await.remove(0);
    assert_eq!(created.event, "Cancel");
    // Due 90 s after it was armed, a moment ago: its lateness is about -90 s.
    assert!(
        (-90_000..=-80_000).contains(&created.late_ms),
        "armed with the configured delay: {created:?}"
    );
    engine
        .transition(1, UnpaidEvent::Pay, "pay-1")
        .await
        .unwrap();
    let paid = timers_of(&engine, 1)
        .await
        .into_iter()
        .find(|t| t.event == "Ship")
        .unwrap();
    let week = 7 * 24 * 3600 * 1000;
    assert!(
        (-week..=-week + 10_000).contains(&paid.late_ms),
        "the other timer keeps its declared delay: {paid:?}"
    );
    assert!(
        engine.mermaid().contains("Cancel (after 90 s)"),
        "{}",
        engine.mermaid()
    );
    assert!(engine.mermaid().contains("Ship (after 7 days)"));
    assert!(engine.dot().contains("Cancel (after 90 s)"));
    assert!(engine.svg().contains("Cancel (after 90 s)"));
    assert!(orderly::machine::mermaid::<Unpaid>().contains("Cancel (after 30 min)"));
    let declared = engine.state_timers();
    assert_eq!(declared.len(), 2);
    assert_eq!(declared[0].after_ms, 90_000);

    let bad = EngineConfig::default()
        .timer_delay("Paid", "Cancel", Duration::from_secs(1))
        .timer_delay("Nowhere", "Cancel", Duration::from_secs(1))
        .timer_delay("Created", "Cancel", Duration::ZERO)
        .timer_delay("Paid", "Ship", Duration::from_secs(367 * 24 * 3600));
    match Engine::<Unpaid, B::S>::with_config(engine.store().clone(), bad) {
        Err(Error::InvalidInput(message)) => {
            for named in [
                "entering \"Paid\" arms to fire \"Cancel\"",
                "\"Nowhere\"",
                "timer of \"Created\" on \"Cancel\" must be 1 ms to 366 days",
                "timer of \"Paid\" on \"Ship\" must be 1 ms to 366 days",
            ] {
                assert!(message.contains(named), "{named} in {message}");
            }
        }
        other => panic!("{other:?}"),
    }
}

/// An idle job sleeps until the next timer falls due, not its whole `idle` pause: with a
/// pause of 30 s, a timer scheduled 300 ms ahead (none due before it) fires within 10 s.
pub async fn an_idle_job_wakes_for_the_next_timer<B: Backend>(b: &B) {
    let engine = super::timers::timed_engine(b).await;
    engine.create(1).await.unwrap();
    assert!(
        engine
            .schedule(1, UnpaidEvent::Pay, "soon", Duration::from_millis(300))
            .await
            .unwrap()
    );
    let job = orderly::Timers::new(engine.store().clone())
        .with_config(orderly::TimersConfig::default().idle(Duration::from_secs(30)))
        .unwrap()
        .fire(engine.clone());
    let watched = engine.clone();
    let paid = async move {
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while watched.get(1).await.unwrap().state != super::timers::UnpaidState::Paid {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    };
    let total = tokio::time::timeout(Duration::from_secs(60), job.run(paid))
        .await
        .expect("run returned")
        .unwrap();
    assert_eq!(
        engine.get(1).await.unwrap().state,
        super::timers::UnpaidState::Paid,
        "the timer due in 300 ms did not fire within 10 s: {total:?}"
    );
    assert_eq!(total.applied, 1, "{total:?}");
}
