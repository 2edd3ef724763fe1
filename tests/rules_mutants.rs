//! The rules kit's mutation suite: the README's shop (a payment must be the amount due,
//! read from the payload as the README's guard reads it; a shipment takes stock) on
//! SQLite, checked by `testing::check_rules` over random sequences whose payments carry
//! amounts (`steps_with`), against an oracle. The correct rules pass; rules written
//! wrong, each a mistake real guard code makes, are rejected with an answer naming the
//! request and the rule. A replay runs neither guard nor effect, so an effect counting
//! its own runs is a control: it matches the oracle's count of applied shipments.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use orderly::testing::{Oracle, Step, check_rules, no_payload, payload, steps_with};
use orderly::{Engine, Halt, Judged, RulesOf, SqliteStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use sqlx::SqliteConnection;

orderly::state_machine! {
    pub Shop {
        states: ShopState { Open, Paid, Shipped }
        events: ShopEvent { Pay, Ship }
        initial: Open;
        terminal: [Shipped];
        rules: ShopRules {
            guards: [amount_matches, in_stock]
            effects: [take_stock]
        }
        transitions: {
            Open + Pay [amount_matches] => Paid,
            Paid + Ship [in_stock] => Shipped / take_stock,
        }
    }
}

const DUE: i64 = 500;
const STOCK: i64 = 2;

/// How the rules differ from the correct ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mistake {
    None,
    /// `in_stock` reads the stock once and keeps it.
    StaleStock,
    /// `amount_matches` takes a payment with no amount as paid in full.
    DefaultedPayload,
    /// `amount_matches` sends the customer a notice, outside the unit, before it refuses.
    RefusalThatWrites,
}

/// What the rules do outside the database: notices sent, effects run.
#[derive(Default)]
struct Outside {
    notices: AtomicU32,
    effects: AtomicU32,
}

struct Rules {
    mistake: Mistake,
    kept_stock: Mutex<Option<i64>>,
    outside: Arc<Outside>,
}

impl ShopRules<SqliteConnection> for Rules {
    async fn amount_matches(
        &self,
        conn: &mut SqliteConnection,
        j: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        // As the README's guard reads it.
        let paid: i64 = match self.mistake {
            Mistake::DefaultedPayload => j.payload()?.unwrap_or(DUE),
            _ => j.payload()?.unwrap_or(0),
        };
        let due: i64 = sqlx::query_scalar("SELECT due FROM shop_due WHERE id = ?")
            .bind(j.order_id)
            .fetch_one(&mut *conn)
            .await?;
        if paid != due {
            if self.mistake == Mistake::RefusalThatWrites {
                self.outside.notices.fetch_add(1, SeqCst);
            }
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
        _j: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        let read = sqlx::query_scalar("SELECT qty FROM shop_stock WHERE sku = 'lamp'");
        let left: i64 = if self.mistake == Mistake::StaleStock {
            let kept = *self.kept_stock.lock().unwrap();
            match kept {
                Some(left) => left,
                None => {
                    let left = read.fetch_one(&mut *conn).await?;
                    *self.kept_stock.lock().unwrap() = Some(left);
                    left
                }
            }
        } else {
            read.fetch_one(&mut *conn).await?
        };
        if left <= 0 {
            return Err(Halt::refuse("out_of_stock", "no lamp left"));
        }
        Ok(())
    }

    async fn take_stock(
        &self,
        conn: &mut SqliteConnection,
        _j: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        sqlx::query("UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'lamp'")
            .execute(&mut *conn)
            .await?;
        self.outside.effects.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// The model: the stock left, the shipments taken, no notice ever.
#[derive(Clone)]
struct ShopOracle {
    left: i64,
    shipped: u32,
}

impl Oracle<Shop> for ShopOracle {
    fn guard(&mut self, guard: &'static str, judged: &Judged<'_, Shop>) -> Result<(), String> {
        match guard {
            "amount_matches" => match judged.payload::<i64>() {
                Ok(Some(DUE)) => Ok(()),
                _ => Err("amount_mismatch".into()),
            },
            _ if self.left > 0 => Ok(()),
            _ => Err("out_of_stock".into()),
        }
    }

    fn effect(&mut self, _effect: &'static str, _judged: &Judged<'_, Shop>) {
        self.left -= 1;
        self.shipped += 1;
    }

    fn business(&self) -> String {
        format!("{} left, {} shipped, 0 notices", self.left, self.shipped)
    }
}

/// Payments of the amount due, short, or with none; shipments with no payload.
fn sequences() -> impl Strategy<Value = Vec<Step<ShopEvent>>> {
    steps_with::<Shop>(4, 3, 1..40, |event| match event {
        ShopEvent::Pay => prop_oneof![
            4 => payload(Just(DUE)),
            1 => payload(Just(DUE - 100)),
            1 => no_payload(),
        ]
        .boxed(),
        ShopEvent::Ship => no_payload(),
    })
}

/// `check_rules` over 48 random sequences with rules that make `mistake`: `Ok` if every
/// one passed, else the failure of the smallest failing sequence.
async fn check(mistake: Mistake) -> Result<(), String> {
    let name = uuid::Uuid::new_v4().simple().to_string();
    let store = SqliteStore::demo(&format!(
        "sqlite:file:rules-{name}?mode=memory&cache=shared"
    ))
    .await
    .unwrap();
    for sql in [
        "CREATE TABLE shop_due (id INTEGER PRIMARY KEY, due INTEGER NOT NULL)",
        "CREATE TABLE shop_stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL)",
        "INSERT INTO shop_stock VALUES ('lamp', 0)",
    ] {
        sqlx::query(sql).execute(store.pool()).await.unwrap();
    }
    let outside = Arc::new(Outside::default());
    let rules = Rules {
        mistake,
        kept_stock: Mutex::new(None),
        outside: Arc::clone(&outside),
    };
    let engine = Engine::<Shop, _>::new(store.clone())
        .unwrap()
        .with_rules(RulesOf(rules));
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = AtomicI64::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&sequences(), |seq| {
        let first = 1000 * (1 + case.fetch_add(1, SeqCst));
        let ids: Vec<i64> = (first..first + 4).collect();
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                let pool = store.pool();
                sqlx::query("UPDATE shop_stock SET qty = ?")
                    .bind(STOCK)
                    .execute(pool)
                    .await
                    .unwrap();
                outside.notices.store(0, SeqCst);
                outside.effects.store(0, SeqCst);
                for &id in &ids {
                    engine.create(id).await.unwrap();
                    sqlx::query("INSERT INTO shop_due VALUES (?, ?)")
                        .bind(id)
                        .bind(DUE)
                        .execute(pool)
                        .await
                        .unwrap();
                }
                let mut oracle = ShopOracle {
                    left: STOCK,
                    shipped: 0,
                };
                check_rules(&engine, &ids, first + 4, &seq, &mut oracle, || async {
                    let left: i64 =
                        sqlx::query_scalar("SELECT qty FROM shop_stock WHERE sku = 'lamp'")
                            .fetch_one(pool)
                            .await
                            .map_err(|e| e.to_string())?;
                    Ok(format!(
                        "{left} left, {} shipped, {} notices",
                        outside.effects.load(SeqCst),
                        outside.notices.load(SeqCst)
                    ))
                })
                .await
            })
        })
        .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(why, seq)) => Err(format!("{why}\nsequence: {seq:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_rules_pass() {
    check(Mistake::None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_reading_a_stale_stock_is_caught() {
    let why = check(Mistake::StaleStock).await.unwrap_err();
    assert!(why.contains("Ship"), "{why}");
    assert!(
        why.contains("expected Refused { guard: \"in_stock\", code: \"out_of_stock\" }"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_taking_a_missing_amount_as_paid_is_caught() {
    let why = check(Mistake::DefaultedPayload).await.unwrap_err();
    assert!(why.contains("Pay"), "{why}");
    assert!(
        why.contains("expected Refused { guard: \"amount_matches\", code: \"amount_mismatch\" }"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_writes_outside_the_unit_is_caught() {
    let why = check(Mistake::RefusalThatWrites).await.unwrap_err();
    assert!(why.contains("Pay"), "{why}");
    assert!(why.contains("Refused"), "{why}");
    assert!(why.contains("1 notices, the oracle says"), "{why}");
}
