//! orderly on PostgreSQL, with a ledger write of your own done exactly once:
//! `cargo run --example postgres_quickstart --no-default-features --features postgres -- URL`
//! (URL defaults to `$DATABASE_URL`, then `postgres://postgres@127.0.0.1:5432/postgres`).
//!
//! `PgStore::connect` runs orderly's migrations, recorded in `_orderly_migrations` beside
//! your own `_sqlx_migrations`. The order ids are new on every run, so the example runs
//! on a database that holds other data.

use orderly::{Engine, Error, Outcome, PgStore};
use sqlx::PgPool;

orderly::state_machine! {
    /// The life of an order.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Cancelled, Refunded }
        events: OrderEvent { Pay, Ship, Cancel, Refund }
        initial: Created;
        terminal: [Shipped, Cancelled, Refunded];
        transitions: {
            Created + Pay    => Paid,
            Created + Cancel => Cancelled,
            Paid    + Ship   => Shipped,
            Paid    + Refund => Refunded,
        }
    }
}

/// A payment callback, handled as a payment service should: the transition and the
/// ledger row in one transaction, and the ledger row only if this call applied the
/// transition. A repeat is `Replayed` and writes nothing; a rival payment is refused.
async fn on_payment(
    engine: &Engine<OrderMachine, PgStore>,
    pool: &PgPool,
    order_id: i64,
    payment_ref: &str,
    amount_cents: i64,
) -> Result<Outcome<OrderState>, Error> {
    let mut tx = pool.begin().await?;
    let outcome = engine
        .transition(order_id, OrderEvent::Pay, payment_ref)
        .within(&mut tx)
        .await?;
    if outcome.is_applied() {
        sqlx::query("INSERT INTO ledger (order_id, payment_ref, amount_cents) VALUES ($1, $2, $3)")
            .bind(order_id)
            .bind(payment_ref)
            .bind(amount_cents)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(outcome)
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
    println!("  {what:<36} {answer}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let store = PgStore::demo(&url).await?;
    let pool = store.pool().clone();
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS ledger (order_id BIGINT NOT NULL, \
         payment_ref TEXT NOT NULL PRIMARY KEY, amount_cents BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await?;
    let engine: Engine<OrderMachine, PgStore> = Engine::new(store)?;
    // New ids on every run: microseconds since the epoch.
    let first = chrono::Utc::now().timestamp_micros();
    let (order, rival) = (first, first + 1);

    println!("Order {order}: the gateway calls back three times for one payment");
    engine.create(order).await?;
    for attempt in 1..=3 {
        let result = on_payment(&engine, &pool, order, &format!("pay_{order}"), 4200).await;
        show(&format!("callback #{attempt}"), &result);
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE order_id = $1")
        .bind(order)
        .fetch_one(&pool)
        .await?;
    println!("  ledger rows for order {order}: {rows}");

    println!("\nOrder {rival}: two payments race for the same order");
    engine.create(rival).await?;
    let racers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|which| {
            let (engine, pool) = (engine.clone(), pool.clone());
            tokio::spawn(async move {
                let reference = format!("pay_{rival}_{which}");
                let result = on_payment(&engine, &pool, rival, &reference, 990).await;
                (reference, result)
            })
        })
        .collect();
    for racer in racers {
        let (reference, result) = racer.await?;
        show(&reference, &result);
        if let Err(Error::RefConflict { existing_ref, .. }) = &result {
            println!(
                "  {:<36} -> refund {reference}: the order was paid by {existing_ref}",
                ""
            );
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM ledger WHERE order_id = $1")
        .bind(rival)
        .fetch_one(&pool)
        .await?;
    println!("  ledger rows for order {rival}: {rows}");
    Ok(())
}
