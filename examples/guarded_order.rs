//! Guards and effects on the edge, on embedded SQLite with no setup:
//! `cargo run --example guarded_order`.
//!
//! A payment of the wrong amount is refused by the `amount_matches` guard, inside the
//! transition's own unit, with nothing written; shipping takes stock through the
//! `take_stock` effect, exactly once however often the shipment is sent; the last unit
//! in stock goes to one order and the next is refused.

use orderly::{Engine, Error, Halt, Judged, Outcome, RulesOf, SqliteStore, machine::mermaid};
use sqlx::SqliteConnection;

orderly::state_machine! {
    /// An order that must be paid in full, and whose shipping takes stock.
    pub ShopOrder {
        states: ShopState { Created, Paid, Shipped }
        events: ShopEvent { Pay, Ship }
        initial: Created;
        terminal: [Shipped];
        rules: ShopRules {
            guards: [amount_matches, in_stock]
            effects: [take_stock]
        }
        transitions: {
            Created + Pay [amount_matches] => Paid,
            Paid + Ship [in_stock] => Shipped / take_stock emits OrderShipped,
        }
    }
}

/// The shop's rules, on SQLite's connection: each runs inside the transition's unit,
/// which holds the database's write lock.
struct Rules;

impl ShopRules<SqliteConnection> for Rules {
    async fn amount_matches(
        &self,
        conn: &mut SqliteConnection,
        order: &Judged<'_, ShopOrder>,
    ) -> Result<(), Halt> {
        let paid: i64 = order.payload()?.unwrap_or(0);
        let due: i64 = sqlx::query_scalar("SELECT due FROM order_amounts WHERE id = ?1")
            .bind(order.order_id)
            .fetch_one(&mut *conn)
            .await?;
        if paid != due {
            return Err(Halt::refuse(
                "amount_mismatch",
                format!("paid {paid}, due {due}"),
            ));
        }
        Ok(())
    }

    async fn in_stock(
        &self,
        conn: &mut SqliteConnection,
        _order: &Judged<'_, ShopOrder>,
    ) -> Result<(), Halt> {
        let left: i64 = sqlx::query_scalar("SELECT qty FROM stock WHERE sku = 'lamp'")
            .fetch_one(&mut *conn)
            .await?;
        if left < 1 {
            return Err(Halt::refuse("out_of_stock", "no lamp left"));
        }
        Ok(())
    }

    async fn take_stock(
        &self,
        conn: &mut SqliteConnection,
        _order: &Judged<'_, ShopOrder>,
    ) -> Result<(), Halt> {
        sqlx::query("UPDATE stock SET qty = qty - 1 WHERE sku = 'lamp'")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

fn show(what: &str, result: &Result<Outcome<ShopState>, Error>) {
    let answer = match result {
        Ok(Outcome::Applied { from, to, version }) => {
            format!("Applied   {from} -> {to} (v{version})")
        }
        Ok(Outcome::Replayed { from, to, version }) => {
            format!("Replayed  {from} -> {to} (v{version}), no guard or effect ran")
        }
        Err(e) => format!("Refused   {e}"),
    };
    println!("  {what:<36} {answer}");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("orderly-guarded-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("shop.db").display());
    let store = SqliteStore::demo(&url).await?;
    for sql in [
        "CREATE TABLE order_amounts (id INTEGER PRIMARY KEY, due INTEGER NOT NULL)",
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)",
        "INSERT INTO order_amounts (id, due) VALUES (1, 4900), (2, 4900)",
        "INSERT INTO stock (sku, qty) VALUES ('lamp', 1)",
    ] {
        sqlx::query(sql).execute(store.pool()).await?;
    }
    let engine = Engine::<ShopOrder, _>::new(store.clone())?.with_rules(RulesOf(Rules));
    let left = || async {
        sqlx::query_scalar::<_, i64>("SELECT qty FROM stock WHERE sku = 'lamp'")
            .fetch_one(store.pool())
            .await
    };

    println!("The graph:\n{}", mermaid::<ShopOrder>());
    println!("Order 1: due 4900");
    engine.create(1).await?;
    let wrong = engine
        .transition(1, ShopEvent::Pay, "pay_1")
        .payload(&4000)
        .await;
    show("Pay pay_1 of 4000", &wrong);
    for attempt in 1..=2 {
        let paid = engine
            .transition(1, ShopEvent::Pay, "pay_1")
            .payload(&4900)
            .await;
        show(&format!("Pay pay_1 of 4900, callback #{attempt}"), &paid);
    }
    for attempt in 1..=3 {
        let shipped = engine.transition(1, ShopEvent::Ship, "ship_1").await;
        show(&format!("Ship ship_1, message #{attempt}"), &shipped);
    }
    println!("  lamps left: {}", left().await?);

    println!("\nOrder 2: paid, but the last lamp is gone");
    engine.create(2).await?;
    let paid = engine
        .transition(2, ShopEvent::Pay, "pay_2")
        .payload(&4900)
        .await;
    show("Pay pay_2 of 4900", &paid);
    let shipped = engine.transition(2, ShopEvent::Ship, "ship_2").await;
    show("Ship ship_2", &shipped);
    println!("  lamps left: {}", left().await?);
    Ok(())
}
