//! orderly in one page, on embedded SQLite with no setup:
//! `cargo run --example quickstart`.

use orderly::{Engine, Error, Outcome, SqliteStore, StateMachine, machine::mermaid};

orderly::state_machine! {
    /// The life of an order.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Delivered, Cancelled, Refunded }
        events: OrderEvent { Pay, Ship, Deliver, Cancel, Refund }
        initial: Created;
        terminal: [Delivered, Cancelled, Refunded];
        transitions: {
            Created + Pay     => Paid,
            Created + Cancel  => Cancelled,
            Paid    + Ship    => Shipped,
            Paid    + Refund  => Refunded,
            Shipped + Deliver => Delivered,
        }
    }
}

fn show(what: &str, result: &Result<Outcome<OrderState>, Error>) {
    let answer = match result {
        Ok(Outcome::Applied { from, to, version }) => {
            format!("Applied   {from} -> {to} (v{version})")
        }
        Ok(Outcome::Replayed { from, to, version }) => {
            format!("Replayed  {from} -> {to} (v{version}), nothing written")
        }
        Err(e) => format!("Refused   {e}"),
    };
    println!("  {what:<44} {answer}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A fresh database file; `SqliteStore::connect` turns on WAL and runs the migrations.
    let dir = std::env::temp_dir().join(format!("orderly-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("orders.db").display());
    let engine: Engine<OrderMachine, SqliteStore> = Engine::new(SqliteStore::demo(&url).await?)?;

    println!("Order 1: a payment callback delivered three times");
    engine.create(1).await?;
    for attempt in 1..=3 {
        let result = engine.transition(1, OrderEvent::Pay, "pay_123").await;
        show(&format!("callback #{attempt}: Pay pay_123"), &result);
    }

    println!("\nOrder 2: two different payments race for the same order");
    engine.create(2).await?;
    let racers: Vec<_> = ["pay_A", "pay_B"]
        .into_iter()
        .map(|reference| {
            let engine = engine.clone();
            tokio::spawn(async move {
                (
                    reference,
                    engine.transition(2, OrderEvent::Pay, reference).await,
                )
            })
        })
        .collect();
    for racer in racers {
        let (reference, result) = racer.await.expect("task");
        show(&format!("Pay {reference}"), &result);
        if let Err(Error::RefConflict { existing_ref, .. }) = &result {
            println!(
                "  {:<44} -> refund {reference}: the order was paid by {existing_ref}",
                ""
            );
        }
    }

    println!("\nOrder 1 moves on; late duplicates and bad requests");
    show(
        "Ship ship_9",
        &engine.transition(1, OrderEvent::Ship, "ship_9").await,
    );
    show(
        "Pay pay_123 again (redelivered after ship)",
        &engine.transition(1, OrderEvent::Pay, "pay_123").await,
    );
    show(
        "Pay pay_456 (another payment)",
        &engine.transition(1, OrderEvent::Pay, "pay_456").await,
    );
    show(
        "Cancel cancel_1 (not allowed when shipped)",
        &engine.transition(1, OrderEvent::Cancel, "cancel_1").await,
    );
    show(
        "Pay on order 404",
        &engine.transition(404, OrderEvent::Pay, "pay_1").await,
    );
    show(
        "Pay with an empty reference",
        &engine.transition(1, OrderEvent::Pay, "").await,
    );

    println!("\nHistory of order 1");
    for r in engine.history(1).await? {
        println!(
            "  v{} {:<8} -> {:<8} by {:<8} ref {:<10} at {}",
            r.seq, r.from, r.to, r.event, r.ref_id, r.created_at
        );
    }
    let order = engine.get(1).await?;
    println!("  now: {} at version {}", order.state, order.version);

    println!(
        "\nThe graph ({}), as Mermaid:\n{}",
        OrderMachine::NAME,
        mermaid::<OrderMachine>()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
