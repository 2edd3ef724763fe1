//! Orders that expire, on embedded SQLite with no setup:
//! `cargo run --example expiring_order`.
//!
//! An order not paid within its time is cancelled by its state's timer; one paid in time
//! is not (its timer ends moot); the timer fires exactly once however many jobs run, and
//! a payment that comes after the cancellation is refused.

use std::time::Duration;

use orderly::{Engine, Error, SqliteStore, Timers, machine::mermaid};

orderly::state_machine! {
    /// An order that must be paid within its time (short here, so the example runs in a
    /// moment; a shop would say `after 30 min`).
    pub ExpiringOrder {
        states: OrderState { Created, Paid, Shipped, Cancelled }
        events: OrderEvent { Pay, Ship, Cancel }
        initial: Created;
        terminal: [Shipped, Cancelled];
        transitions: {
            Created + Pay    => Paid,
            Created + Cancel => Cancelled,
            Paid    + Ship   => Shipped,
        }
        timers: {
            Created after 300 ms => Cancel,
        }
    }
}

use OrderEvent::{Cancel, Pay};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("orderly-expiring-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("orders.db").display());
    let engine: Engine<ExpiringOrder, SqliteStore> = Engine::new(SqliteStore::demo(&url).await?)?;
    println!("{}", mermaid::<ExpiringOrder>());

    // Two orders; each create arms its Created timer in the same unit.
    for id in [1, 2] {
        engine.create(id).await?;
        for timer in engine.timers(id).await? {
            let t = timer?;
            println!(
                "order {id}: timer {} {} due in {} ms",
                t.event, t.ref_id, -t.late_ms
            );
        }
    }
    let paid = engine.transition(2, Pay, "pay_2").await?;
    println!("order 2 paid in time: applied: {}", paid.is_applied());

    // Two jobs, as two nodes would run them, once the timers are due.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let job = || Timers::new(engine.store().clone()).fire(engine.clone());
    let (a, b) = (job(), job());
    let (ra, rb) = tokio::join!(a.fire_once(), b.fire_once());
    let (ra, rb) = (ra?, rb?);
    println!(
        "timer rounds of two jobs: applied {}, moot {}, replayed {}",
        ra.applied + rb.applied,
        ra.moot + rb.moot,
        ra.replayed + rb.replayed
    );

    for id in [1, 2] {
        let order = engine.get(id).await?;
        let timer = engine.timers(id).await?.remove(0)?;
        println!(
            "order {id} is {} at version {}; its timer: {} ({})",
            order.state,
            order.version,
            timer.outcome.as_deref().unwrap_or("pending"),
            timer.last_error.as_deref().unwrap_or("-")
        );
    }
    let cancel = engine.history(1).await?.remove(0);
    println!(
        "order 1's cancellation: {} by {} (ref {})",
        cancel.event,
        cancel.actor.as_deref().unwrap_or("?"),
        cancel.ref_id
    );
    assert_eq!(cancel.event, Cancel);

    // The payment gateway's late callback for the cancelled order.
    match engine.transition(1, Pay, "pay_1").await {
        Err(e @ Error::InvalidTransition { .. }) => println!("late payment of order 1: {e}"),
        other => println!("late payment of order 1: {other:?}"),
    }
    let stats = Timers::new(engine.store().clone()).stats().await?;
    println!(
        "timers pending {}, due {}, dead {}",
        stats.pending, stats.due, stats.dead
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
