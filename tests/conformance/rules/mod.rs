//! Guards and effects: judged and run inside the transition's own unit, after the
//! entity is locked; replays run neither; a refusal, a failure or a panic writes nothing.

mod dropped;
mod kit;
mod layers;
mod once;

// Each suite runs the bodies it lists; the others stay unused in its binary.
#[allow(unused_imports)]
pub use self::{dropped::*, kit::*, layers::*, once::*};

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use orderly::store::Store;
use orderly::{Engine, EngineConfig, Error, Halt, Judged, Outcome, RulesOf};

use super::Backend;
use super::faults::Networked;
use crate::server::Cut;

orderly::state_machine! {
    /// A shop order whose payment must match what is due and whose shipping takes stock.
    pub Shop {
        states: ShopState { Open, Paid, Shipped, Cancelled }
        events: ShopEvent { Pay, Ship, Cancel }
        initial: Open;
        terminal: [Shipped, Cancelled];
        rules: ShopRules {
            guards: [amount_matches, in_stock]
            effects: [take_stock]
        }
        transitions: {
            Open + Pay [amount_matches] => Paid,
            Paid + Ship [in_stock] => Shipped / take_stock emits ShopShipped,
            Open + Cancel => Cancelled,
        }
    }
}

use ShopEvent::{Cancel, Pay, Ship};
use ShopState::{Cancelled, Open, Paid, Shipped};

/// The order whose effect fails after its write, and the one whose guard panics.
const FAILING: i64 = 99;

const PANICKING: i64 = 98;

/// Counts what ran; reads and writes the test's business tables on the unit's
/// connection.
struct Counted<B> {
    guards: Arc<AtomicUsize>,
    effects: Arc<AtomicUsize>,
    _b: PhantomData<fn() -> B>,
}

impl<B: Backend> ShopRules<<B::S as Store>::Conn> for Counted<B> {
    async fn amount_matches(
        &self,
        conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        self.guards.fetch_add(1, SeqCst);
        if judged.order_id == PANICKING {
            panic!("the guard's own bug");
        }
        let paid: i64 = judged.payload::<i64>()?.unwrap_or(0);
        let due = B::scalar_conn(
            conn,
            format!("SELECT due FROM shop_due WHERE id = {}", judged.order_id),
        )
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
        conn: &mut <B::S as Store>::Conn,
        _judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        self.guards.fetch_add(1, SeqCst);
        // SQLite's unit holds the only write lock; elsewhere the guard locks the row.
        let lock = if <B::S as Store>::BACKEND == "sqlite" {
            ""
        } else {
            " FOR UPDATE"
        };
        let left = B::scalar_conn(
            conn,
            format!("SELECT qty FROM shop_stock WHERE sku = 1{lock}"),
        )
        .await?;
        if left <= 0 {
            return Err(Halt::refuse("out_of_stock", "none left"));
        }
        Ok(())
    }

    async fn take_stock(
        &self,
        conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        B::exec_conn(
            conn,
            "UPDATE shop_stock SET qty = qty - 1 WHERE sku = 1".into(),
        )
        .await?;
        if judged.order_id == FAILING {
            return Err(Halt::failed("the warehouse is down"));
        }
        self.effects.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// Makes the business tables: what each order must pay (none yet) and a stock of one
/// product.
async fn shop_tables<B: Backend>(b: &B, stock: i64) {
    b.exec("DROP TABLE IF EXISTS shop_due").await;
    b.exec("CREATE TABLE shop_due (id BIGINT PRIMARY KEY, due BIGINT NOT NULL)")
        .await;
    b.exec("DROP TABLE IF EXISTS shop_stock").await;
    b.exec("CREATE TABLE shop_stock (sku BIGINT PRIMARY KEY, qty BIGINT NOT NULL)")
        .await;
    b.exec(&format!(
        "INSERT INTO shop_stock (sku, qty) VALUES (1, {stock})"
    ))
    .await;
}

type Shop_<B> = Engine<Shop, <B as Backend>::S>;

/// An engine over `store` with the counted rules.
fn shop_engine<B: Backend>(store: B::S) -> (Shop_<B>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (guards, effects) = (Arc::default(), Arc::default());
    let config = EngineConfig::default()
        .read_first(B::POLICY)
        .deadline(Duration::from_secs(60));
    let engine = Engine::with_config(store, config)
        .unwrap()
        .with_rules(RulesOf(Counted::<B> {
            guards: Arc::clone(&guards),
            effects: Arc::clone(&effects),
            _b: PhantomData,
        }));
    (engine, guards, effects)
}

async fn shop<B: Backend>(b: &B, stock: i64) -> (Shop_<B>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    shop_tables(b, stock).await;
    shop_engine::<B>(b.store(Duration::from_secs(30)).await)
}

/// Creates `ids`, each due 5, and pays each.
async fn paid_orders<B: Backend>(b: &B, e: &Shop_<B>, ids: &[i64]) {
    let values: Vec<String> = ids.iter().map(|id| format!("({id}, 5)")).collect();
    b.exec(&format!(
        "INSERT INTO shop_due (id, due) VALUES {}",
        values.join(", ")
    ))
    .await;
    for &id in ids {
        e.create(id).await.unwrap();
        e.transition(id, Pay, &format!("pay-{id}"))
            .payload(&5)
            .await
            .unwrap();
    }
}

/// What the database holds of the shipments: the stock went down once for each order
/// that moved to Shipped, and each re-sent shipment is answered as the history says
/// (Replayed where it moved, Applied where it did not), after which the same holds.
async fn shipments_agree<B: Backend>(b: &B, e: &Shop_<B>, ids: &[i64], stock: i64) {
    let shipped = b
        .scalar("SELECT COUNT(*) FROM orders WHERE status = 'Shipped'")
        .await;
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        stock - shipped,
        "the stock went down once per shipment"
    );
    for &id in ids {
        let history = e.history(id).await.unwrap();
        let order = e.get(id).await.unwrap();
        assert_eq!(order.version as usize, history.len(), "order {id}");
        let again = e.transition(id, Ship, &format!("ship-{id}")).await.unwrap();
        match history.len() {
            2 => assert!(
                matches!(again, Outcome::Replayed { .. }),
                "order {id}: {again:?}"
            ),
            1 => assert!(
                matches!(again, Outcome::Applied { .. }),
                "order {id}: {again:?}"
            ),
            n => panic!("order {id} has {n} history rows"),
        }
    }
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        stock - ids.len() as i64,
        "every order shipped once, and the stock with it"
    );
}

async fn version<B: Backend>(b: &B, id: i64) -> i64 {
    b.scalar(&format!("SELECT version FROM orders WHERE id = {id}"))
        .await
}

/// A guard refuses with nothing written and the refusal named; an allowed move runs its
/// guard once and a replay runs none; an effect's failure and a guard's panic undo the
/// whole unit and leave the connection clean; inside a caller's transaction the effect
/// commits or rolls back with it.
pub async fn guards_and_effects_run_once_inside_the_unit<B: Backend>(b: &B) {
    let (e, guards, effects) = shop(b, 100).await;
    b.exec("INSERT INTO shop_due (id, due) VALUES (1, 500), (2, 700), (98, 1), (99, 1)")
        .await;
    for id in [1, 2, 98, 99] {
        e.create(id).await.unwrap();
    }

    // Refused: the wrong amount. Nothing written; a re-send is judged afresh.
    let refused = e.transition(1, Pay, "pay-1").payload(&499).await;
    match refused {
        Err(Error::Refused {
            guard,
            code,
            message,
        }) => {
            assert_eq!(
                (guard, code.as_str()),
                ("amount_matches", "amount_mismatch")
            );
            assert_eq!(message, "paid 499, due 500");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        !Error::Refused {
            guard: "g",
            code: "c".into(),
            message: "m".into()
        }
        .is_retryable()
    );
    assert_eq!(version(b, 1).await, 0, "a refusal writes nothing");
    assert!(e.history(1).await.unwrap().is_empty());
    assert_eq!(guards.load(SeqCst), 1);

    let paid = e.transition(1, Pay, "pay-1").payload(&500).await.unwrap();
    assert_eq!(
        paid,
        Outcome::Applied {
            from: Open,
            to: Paid,
            version: 1
        }
    );
    assert_eq!(guards.load(SeqCst), 2);
    let again = e.transition(1, Pay, "pay-1").payload(&500).await.unwrap();
    assert!(matches!(again, Outcome::Replayed { .. }), "{again:?}");
    assert_eq!(guards.load(SeqCst), 2, "a replay runs no guard");

    // The effect runs once with the move, and never on a replay.
    let shipped = e.transition(1, Ship, "ship-1").await.unwrap();
    assert_eq!(
        shipped,
        Outcome::Applied {
            from: Paid,
            to: Shipped,
            version: 2
        }
    );
    assert_eq!(effects.load(SeqCst), 1);
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99
    );
    let again = e.transition(1, Ship, "ship-1").await.unwrap();
    assert!(matches!(again, Outcome::Replayed { .. }), "{again:?}");
    assert_eq!(effects.load(SeqCst), 1, "a replay runs no effect");
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = 1")
            .await,
        1,
        "the emitted event is written with the effect"
    );

    // An effect that fails after its write: the whole unit is undone.
    e.transition(FAILING, Pay, "pay-99")
        .payload(&1)
        .await
        .unwrap();
    match e.transition(FAILING, Ship, "ship-99").await {
        Err(Error::RuleFailed { rule, reason }) => {
            assert_eq!(
                (rule, reason.as_str()),
                ("take_stock", "the warehouse is down")
            );
        }
        other => panic!("expected the effect's failure, got {other:?}"),
    }
    assert_eq!(version(b, FAILING).await, 1, "the entity did not move");
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99,
        "the effect's own write is undone"
    );
    assert_eq!(
        b.scalar(&format!(
            "SELECT COUNT(*) FROM orderly_outbox WHERE entity_id = {FAILING}"
        ))
        .await,
        0
    );

    // A guard that panics: caught, the unit undone, the engine's connections clean.
    match e.transition(PANICKING, Pay, "pay-98").payload(&1).await {
        Err(Error::RuleFailed { rule, reason }) => {
            assert_eq!(rule, "amount_matches");
            assert!(reason.contains("the guard's own bug"), "{reason}");
        }
        other => panic!("expected the panic as a failure, got {other:?}"),
    }
    assert_eq!(version(b, PANICKING).await, 0);
    assert_eq!(b.open_transactions().await, 0, "no unit left open");
    let paid = e.transition(2, Pay, "pay-2").payload(&700).await.unwrap();
    assert_eq!(
        paid,
        Outcome::Applied {
            from: Open,
            to: Paid,
            version: 1
        }
    );

    // Inside the caller's transaction: rolled back with it, then committed with it.
    let mut tx = b.begin().await;
    let shipped = e
        .transition(2, Ship, "ship-2")
        .within(&mut tx)
        .await
        .unwrap();
    assert_eq!(
        shipped,
        Outcome::Applied {
            from: Paid,
            to: Shipped,
            version: 2
        }
    );
    B::rollback(tx).await;
    assert_eq!(version(b, 2).await, 1);
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99
    );
    let mut tx = b.begin().await;
    // A refusal inside the caller's transaction leaves it usable.
    let refused = e
        .transition(2, Pay, "pay-2b")
        .payload(&1)
        .within(&mut tx)
        .await;
    assert!(
        matches!(refused, Err(Error::RefConflict { .. })),
        "{refused:?}"
    );
    e.transition(2, Ship, "ship-2")
        .within(&mut tx)
        .await
        .unwrap();
    B::commit(tx).await;
    assert_eq!(version(b, 2).await, 2);
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        98
    );
    assert_eq!(
        effects.load(SeqCst),
        3,
        "the effect ran in both caller transactions"
    );
}

/// 64 shippers of 64 paid orders against a stock of 10, all at once: exactly 10 move,
/// the rest are refused by the guard reading the locked stock, the stock never goes
/// below zero, and the effect ran once per move.
pub async fn guards_judge_what_the_locked_data_says<B: Backend>(b: &B) {
    let (e, _guards, effects) = shop(b, 10).await;
    let ids: Vec<i64> = (1..=64).collect();
    let values: Vec<String> = ids.iter().map(|id| format!("({id}, 5)")).collect();
    b.exec(&format!(
        "INSERT INTO shop_due (id, due) VALUES {}",
        values.join(", ")
    ))
    .await;
    for &id in &ids {
        e.create(id).await.unwrap();
        e.transition(id, Pay, &format!("pay-{id}"))
            .payload(&5)
            .await
            .unwrap();
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Barrier::new(ids.len()));
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (e, gate, in_flight, overlapped) = (
                e.clone(),
                gate.clone(),
                in_flight.clone(),
                overlapped.clone(),
            );
            tokio::spawn(async move {
                gate.wait().await;
                if in_flight.fetch_add(1, SeqCst) > 0 {
                    overlapped.fetch_add(1, SeqCst);
                }
                let answer = e.transition(id, Ship, &format!("ship-{id}")).await;
                in_flight.fetch_sub(1, SeqCst);
                answer
            })
        })
        .collect();
    let (mut applied, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(Outcome::Applied { .. }) => applied += 1,
            Err(Error::Refused {
                guard: "in_stock", ..
            }) => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(overlapped.load(SeqCst) > 0, "the shippers never overlapped");
    assert_eq!((applied, refused), (10, 54));
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        0
    );
    assert_eq!(effects.load(SeqCst), 10);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orders WHERE status = 'Shipped'")
            .await,
        10
    );
}
