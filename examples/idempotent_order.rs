//! A whole request exactly once, on embedded SQLite with no setup:
//! `cargo run --example idempotent_order`.
//!
//! "Create order 42 and reserve its stock" runs under one idempotency key: the order,
//! the stock reservation and the idempotency record commit in one transaction. A
//! duplicate is replayed without touching the stock; a request that crashed half way is
//! found by the recovery job, and its retry then runs.

use std::time::Duration;

use orderly::{Done, Engine, Error, Failure, Reconciled, Records, ScopeConfig, SqliteStore, Stuck};
use serde::{Deserialize, Serialize};

orderly::state_machine! {
    /// The life of an order.
    pub OrderMachine {
        states: OrderState { Created, Paid, Cancelled }
        events: OrderEvent { Pay, Cancel }
        initial: Created;
        terminal: [Cancelled];
        transitions: {
            Created + Pay    => Paid,
            Created + Cancel => Cancelled,
        }
    }
}

/// The request's body: its fingerprint is what a retry must match.
#[derive(Serialize)]
struct CreateOrder {
    order_id: i64,
    sku: &'static str,
    qty: i64,
}

/// The answer, stored and replayed byte for byte.
#[derive(Serialize, Deserialize, Debug)]
struct Created {
    order_id: i64,
    stock_left: i64,
}

type Orders = Engine<OrderMachine, SqliteStore>;

/// Creates the order and reserves its stock, inside the request's transaction; `stall`
/// holds the request there (to let it crash half way).
async fn create_order(
    records: &Records<SqliteStore>,
    engine: &Orders,
    key: &str,
    req: &CreateOrder,
    stall: Duration,
) -> Result<orderly::Ran<Created, String>, Error> {
    let (engine, order_id, sku, qty) = (engine.clone(), req.order_id, req.sku, req.qty);
    records
        .run("create-order", key, req, move |tx| {
            Box::pin(async move {
                engine.create(order_id).within(&mut *tx).await?;
                // `?` turns the work's own sqlx errors into orderly's `Error`, classified as
                // the stores classify theirs (a deadlock or a lost connection is retryable).
                let left: Option<i64> = sqlx::query_scalar(
                    "UPDATE stock SET available = available - ?1 \
                     WHERE sku = ?2 AND available >= ?1 RETURNING available",
                )
                .bind(qty)
                .bind(sku)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(stock_left) = left else {
                    return Ok(Done::Failed(
                        format!("{sku}: out of stock"),
                        Failure::Terminal,
                    ));
                };
                sqlx::query("INSERT INTO reservations (order_id, sku, qty) VALUES (?1, ?2, ?3)")
                    .bind(order_id)
                    .bind(sku)
                    .bind(qty)
                    .execute(&mut *tx)
                    .await?;
                tokio::time::sleep(stall).await;
                Ok(Done::Succeeded(Created {
                    order_id,
                    stock_left,
                }))
            })
        })
        .await
}

fn show(what: &str, answer: &Result<orderly::Ran<Created, String>, Error>) {
    let text = match answer {
        Ok(ran) => {
            let how = if ran.replayed { "replayed" } else { "ran     " };
            match &ran.outcome {
                Ok(created) => format!("{how} -> {created:?}"),
                Err(failure) => format!("{how} -> failed: {failure}"),
            }
        }
        Err(e) => format!("refused  -> {e}"),
    };
    println!("  {what:<46} {text}");
}

/// The environment variable that makes this example the server that dies: it runs
/// request `req-44` on the database at its value, and is killed half way.
const DYING: &str = "ORDERLY_EXAMPLE_DYING_SERVER";

fn records_of(store: &SqliteStore) -> Result<Records<SqliteStore>, Error> {
    Records::new(store.clone()).scope(
        "create-order",
        ScopeConfig::new(
            Duration::from_millis(500),
            Duration::from_secs(3 * 24 * 3600),
        ),
    )
}

const ORDER_44: CreateOrder = CreateOrder {
    order_id: 44,
    sku: "sku-1",
    qty: 1,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var(DYING) {
        // The server that dies: its claim commits, its work writes and stalls.
        let store = SqliteStore::demo(&url).await?;
        let engine: Orders = Engine::new(store.clone())?;
        let records = records_of(&store)?;
        let _ = create_order(
            &records,
            &engine,
            "req-44",
            &ORDER_44,
            Duration::from_secs(60),
        )
        .await;
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("orderly-idempotent-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("shop.db").display());
    let store = SqliteStore::demo(&url).await?;
    sqlx::raw_sql(
        "CREATE TABLE stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL); \
         CREATE TABLE reservations (order_id INTEGER NOT NULL, sku TEXT NOT NULL, qty INTEGER NOT NULL); \
         INSERT INTO stock VALUES ('sku-1', 5);",
    )
    .execute(store.pool())
    .await?;
    let engine: Orders = Engine::new(store.clone())?;
    let records = records_of(&store)?;
    let stock = || async {
        sqlx::query_scalar::<_, i64>("SELECT available FROM stock WHERE sku = 'sku-1'")
            .fetch_one(store.pool())
            .await
    };

    println!("Create order 42 (2 of sku-1), the client retrying with one key");
    let req = CreateOrder {
        order_id: 42,
        sku: "sku-1",
        qty: 2,
    };
    for attempt in 1..=3 {
        let answer = create_order(&records, &engine, "req-42", &req, Duration::ZERO).await;
        show(&format!("attempt #{attempt}, key req-42"), &answer);
    }
    let changed = CreateOrder { qty: 3, ..req };
    let answer = create_order(&records, &engine, "req-42", &changed, Duration::ZERO).await;
    show("key req-42 reused with qty 3", &answer);
    println!("  stock of sku-1: {} (reserved once)", stock().await?);

    println!("\nOrder 43 wants more than is left: a terminal failure, replayed");
    let big = CreateOrder {
        order_id: 43,
        sku: "sku-1",
        qty: 9,
    };
    for attempt in 1..=2 {
        let answer = create_order(&records, &engine, "req-43", &big, Duration::ZERO).await;
        show(&format!("attempt #{attempt}, key req-43"), &answer);
    }

    println!("\nOrder 44: the server dies half way through the request");
    let crash = ORDER_44;
    // The server is a process of its own (this example again), killed with SIGKILL: its
    // claim commits first, its work then writes and stalls, and it dies a moment after
    // the claim is seen (well inside the 500 ms lease). (A request whose client merely
    // goes away is released at once: see docs/idempotency.md.)
    let mut dying = std::process::Command::new(std::env::current_exe()?)
        .env(DYING, &url)
        .spawn()?;
    let claimed = "SELECT COUNT(*) FROM orderly_idempotency_records WHERE idem_key = 'req-44'";
    let waited = std::time::Instant::now();
    while sqlx::query_scalar::<_, i64>(claimed)
        .fetch_one(store.pool())
        .await?
        == 0
    {
        if waited.elapsed() > Duration::from_secs(5) {
            let _ = dying.kill();
            return Err("req-44 was never claimed".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    dying.kill()?; // SIGKILL mid-request: its transaction rolls back, its record stays held
    dying.wait()?;
    println!("  req-44 claimed, order created and stock reserved, then the server died");
    println!(
        "  stock of sku-1: {} (the reservation rolled back)",
        stock().await?
    );
    let answer = create_order(&records, &engine, "req-44", &crash, Duration::ZERO).await;
    show("the client retries at once", &answer);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The recovery job asks what happened downstream: no reservation for order 44, so
    // nothing happened, and the record is released for the retry to run.
    let pool = store.pool().clone();
    let reconciler = move |stuck: Stuck| {
        let pool = pool.clone();
        async move {
            let reserved: Option<i64> =
                sqlx::query_scalar("SELECT qty FROM reservations WHERE order_id = 44")
                    .fetch_optional(&pool)
                    .await
                    .unwrap_or(None);
            println!(
                "  recovery: {} stuck (attempt {}), reservation found: {reserved:?}",
                stuck.held.key(),
                stuck.held.attempt()
            );
            match reserved {
                // Work that outlived its record (not possible here: they commit together).
                Some(_) => Reconciled::Later,
                // Nothing happened: let the retry run the request.
                None => Reconciled::Unknown,
            }
        }
    };
    let round = records.recover("create-order", 100, &reconciler).await?;
    println!(
        "  recovery round: found {}, released {}",
        round.found, round.released
    );
    let answer = create_order(&records, &engine, "req-44", &crash, Duration::ZERO).await;
    show("the client retries after recovery", &answer);
    let answer = create_order(&records, &engine, "req-44", &crash, Duration::ZERO).await;
    show("and once more", &answer);
    println!("  stock of sku-1: {}", stock().await?);
    for id in [42, 43, 44] {
        match engine.get(id).await {
            Ok(order) => println!("  order {id}: {}", order.state),
            Err(e) => println!("  order {id}: {e}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
