//! A flow of steps with compensations, on embedded SQLite with no setup:
//! `cargo run --example order_flow`.
//!
//! Creating an order inserts it, reserves its stock (both local writes), uses the
//! customer's coupon (a call to a coupon service that takes our idempotency key) and
//! books the shipment (another keyed call, the pivot: never undone). Order 1 completes.
//! Order 2's coupon was already spent: the stock is released and the order cancelled,
//! in reverse order. Order 3's runner dies in the middle of the coupon call: the
//! recovery job calls again with the same key, and the coupon is used once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orderly::SqliteStore;
use orderly::flow::{Ctx, Definition, FlowConfig, FlowOutcome, Flows, StepError};
use serde::{Deserialize, Serialize};

orderly::flow! {
    /// Creating an order.
    pub CreateOrder {
        kind: "create_order";
        version: 1;
        steps: Step {
            Insert:    local + undo,
            Reserve:   local + undo,
            UseCoupon: keyed + undo,
            Ship:      keyed,
        }
        pivot: Ship;
    }
}

/// The flow's input.
#[derive(Serialize, Deserialize, Debug)]
struct NewOrder {
    id: i64,
    sku: String,
    qty: i64,
    coupon: String,
}

/// A coupon service that remembers the answer it gave each idempotency key, as a
/// service taking our keys must. `hang` makes its next call hang (a runner dying in it).
#[derive(Default)]
struct Coupons {
    spent: Mutex<HashMap<String, String>>,
    answers: Mutex<HashMap<String, Result<String, String>>>,
    calls: Mutex<Vec<String>>,
    hang: Mutex<bool>,
}

impl Coupons {
    async fn redeem(&self, key: &str, coupon: &str) -> Result<String, String> {
        self.calls.lock().unwrap().push(key.to_string());
        if std::mem::take(&mut *self.hang.lock().unwrap()) {
            // Applied here, and then the caller never hears back.
            let _ = self.apply(key, coupon);
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        self.apply(key, coupon)
    }

    fn apply(&self, key: &str, coupon: &str) -> Result<String, String> {
        let mut answers = self.answers.lock().unwrap();
        if let Some(answer) = answers.get(key) {
            return answer.clone();
        }
        let mut spent = self.spent.lock().unwrap();
        let answer = match spent.get(coupon) {
            Some(by) => Err(format!("coupon {coupon} already used by {by}")),
            None => {
                spent.insert(coupon.to_string(), key.to_string());
                Ok(format!("{coupon}: -10%"))
            }
        };
        answers.insert(key.to_string(), answer.clone());
        answer
    }

    fn give_back(&self, coupon: &str) {
        self.spent.lock().unwrap().remove(coupon);
    }
}

fn definition(coupons: &Arc<Coupons>) -> Definition<SqliteStore, NewOrder> {
    let (redeem, give_back) = (coupons.clone(), coupons.clone());
    Definition::new(CreateOrder)
        .local(Step::Insert, |conn, ctx: &Ctx<NewOrder>| {
            Box::pin(async move {
                sqlx::query("INSERT INTO shop_orders (id, status) VALUES (?1, 'NEW')")
                    .bind(ctx.input().id)
                    .execute(conn)
                    .await?;
                Ok(ctx.input().id)
            })
        })
        .undo_local(Step::Insert, |conn, ctx: &Ctx<NewOrder>| {
            Box::pin(async move {
                sqlx::query("UPDATE shop_orders SET status = 'CANCELLED' WHERE id = ?1")
                    .bind(ctx.input().id)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .local(Step::Reserve, |conn, ctx: &Ctx<NewOrder>| {
            Box::pin(async move {
                let order = ctx.input();
                let taken: sqlx::sqlite::SqliteQueryResult = sqlx::query(
                    "UPDATE stock SET available = available - ?1 WHERE sku = ?2 AND available >= ?1",
                )
                .bind(order.qty)
                .bind(&order.sku)
                .execute(conn)
                .await?;
                if taken.rows_affected() == 0 {
                    return Err(StepError::fail(format!("{}: out of stock", ctx.input().sku)));
                }
                Ok(ctx.input().qty)
            })
        })
        .undo_local(Step::Reserve, |conn, ctx: &Ctx<NewOrder>| {
            Box::pin(async move {
                let qty: i64 = ctx.output(Step::Reserve)?;
                sqlx::query("UPDATE stock SET available = available + ?1 WHERE sku = ?2")
                    .bind(qty)
                    .bind(&ctx.input().sku)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .call(Step::UseCoupon, move |ctx: &Ctx<NewOrder>| {
            let coupons = redeem.clone();
            Box::pin(async move {
                coupons
                    .redeem(ctx.key(), &ctx.input().coupon)
                    .await
                    .map_err(StepError::fail)
            })
        })
        .undo_call(Step::UseCoupon, move |ctx: &Ctx<NewOrder>| {
            let coupons = give_back.clone();
            Box::pin(async move {
                coupons.give_back(&ctx.input().coupon);
                Ok(())
            })
        })
        .call(Step::Ship, |ctx: &Ctx<NewOrder>| {
            Box::pin(async move { Ok(format!("shipment booked under {}", ctx.key())) })
        })
}

async fn show(flows: &Flows<SqliteStore>, key: &str) -> Result<(), orderly::Error> {
    let view = flows.get("create_order", key).await?.expect("recorded");
    let park = view.flow.park_reason.as_deref().unwrap_or("-");
    println!("  {key}: {} (parked: {park})", view.flow.status);
    for s in &view.steps {
        let phase = if s.phase == "F" { "step" } else { "undo" };
        println!(
            "    {phase} {:<10} {:<9} attempts {}  key {:<22} {}",
            s.name,
            s.status,
            s.attempt,
            s.downstream_key.as_deref().unwrap_or("-"),
            s.output.as_deref().or(s.error.as_deref()).unwrap_or("")
        );
    }
    Ok(())
}

fn order(id: i64, coupon: &str) -> NewOrder {
    NewOrder {
        id,
        sku: "sku-1".into(),
        qty: 2,
        coupon: coupon.into(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("orderly-flow-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("shop.db").display());
    let store = SqliteStore::demo(&url).await?;
    sqlx::raw_sql(
        "CREATE TABLE shop_orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL); \
         CREATE TABLE stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL); \
         INSERT INTO stock VALUES ('sku-1', 10);",
    )
    .execute(store.pool())
    .await?;
    let coupons = Arc::new(Coupons::default());
    let config = FlowConfig::default().lease(Duration::from_millis(500));
    let flows = Flows::new(store.clone(), config)?.register(definition(&coupons))?;
    let stock = || async {
        sqlx::query_scalar::<_, i64>("SELECT available FROM stock WHERE sku = 'sku-1'")
            .fetch_one(store.pool())
            .await
    };

    println!("Order 1 with coupon WELCOME, delivered twice");
    for _ in 0..2 {
        let started = flows
            .start(CreateOrder, "order-1", &order(1, "WELCOME"))
            .await?;
        match &started.outcome {
            FlowOutcome::Completed(out) => println!(
                "  completed (replayed: {}), coupon {}",
                started.replayed,
                out.get::<String>(Step::UseCoupon)?
            ),
            other => println!("  {other:?}"),
        }
    }
    show(&flows, "order-1").await?;

    println!("\nOrder 2 with coupon WELCOME again: refused, and the steps before undone");
    let started = flows
        .start(CreateOrder, "order-2", &order(2, "WELCOME"))
        .await?;
    if let FlowOutcome::Compensated { step, error } = &started.outcome {
        println!("  compensated: {step} failed ({error})");
    }
    show(&flows, "order-2").await?;
    let status: String = sqlx::query_scalar("SELECT status FROM shop_orders WHERE id = 2")
        .fetch_one(store.pool())
        .await?;
    println!(
        "  order 2 is {status}; stock of sku-1: {} (order 1's 2 reserved, order 2's given back)",
        stock().await?
    );

    println!("\nOrder 3 with coupon SPRING: the runner dies inside the coupon call");
    *coupons.hang.lock().unwrap() = true;
    let dying = {
        let flows = flows.clone();
        tokio::spawn(async move {
            flows
                .start(CreateOrder, "order-3", &order(3, "SPRING"))
                .await
        })
    };
    // The coupon service takes its `hang` flag when the call reaches it.
    let reached = std::time::Instant::now();
    while *coupons.hang.lock().unwrap() {
        if reached.elapsed() > Duration::from_secs(10) {
            return Err("the runner never reached the coupon call".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    dying.abort();
    let _ = dying.await;
    show(&flows, "order-3").await?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let round = flows.recover(10).await?;
    println!(
        "  recovery round: taken {}, completed {}",
        round.taken, round.completed
    );
    show(&flows, "order-3").await?;
    let calls = coupons.calls.lock().unwrap().clone();
    let same_key = calls
        .iter()
        .filter(|k| *k == "create_order:order-3:UseCoupon")
        .count();
    println!(
        "  coupon calls with key create_order:order-3:UseCoupon: {same_key}, coupon SPRING used by {}",
        coupons.spent.lock().unwrap()["SPRING"]
    );
    println!("  stock of sku-1: {}", stock().await?);
    Ok(())
}
