//! The rules against the testing kit's oracle, alone and in races.

#[allow(unused_imports)]
use super::*;

/// The kit's rules for [`rules_agree_with_the_oracle`]: a payment must carry the code
/// `"a"`, shipping needs stock and takes one.
pub(crate) struct KitRules<B>(PhantomData<fn() -> B>);

impl<B: Backend> ShopRules<<B::S as Store>::Conn> for KitRules<B> {
    async fn amount_matches(
        &self,
        _conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        match judged.payload::<String>()?.as_deref() {
            Some("a") => Ok(()),
            _ => Err(Halt::refuse("amount_mismatch", "not the amount due")),
        }
    }

    async fn in_stock(
        &self,
        conn: &mut <B::S as Store>::Conn,
        _judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        // SQLite's unit holds the only write lock; elsewhere the guard locks the row, or
        // two shipments of different orders could both see the last one.
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
        _judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        B::exec_conn(
            conn,
            "UPDATE shop_stock SET qty = qty - 1 WHERE sku = 1".into(),
        )
        .await?;
        Ok(())
    }
}

/// The model of [`KitRules`]: the stock left.
#[derive(Clone)]
pub(crate) struct StockOracle {
    left: i64,
}

impl orderly::testing::Oracle<Shop> for StockOracle {
    fn guard(&mut self, guard: &'static str, judged: &Judged<'_, Shop>) -> Result<(), String> {
        match guard {
            "amount_matches" if judged.payload == Some("\"a\"") => Ok(()),
            "amount_matches" => Err("amount_mismatch".into()),
            _ if self.left > 0 => Ok(()),
            _ => Err("out_of_stock".into()),
        }
    }

    fn effect(&mut self, _effect: &'static str, _judged: &Judged<'_, Shop>) {
        self.left -= 1;
    }

    fn business(&self) -> String {
        format!("{} left", self.left)
    }
}

/// The business tables, with no stock yet, and an engine with the kit's rules.
pub(crate) async fn kit_engine<B: Backend>(b: &B) -> Shop_<B> {
    shop_tables(b, 0).await;
    Engine::<Shop, _>::with_config(
        b.store(Duration::from_secs(30)).await,
        EngineConfig::default().read_first(B::POLICY),
    )
    .unwrap()
    .with_rules(RulesOf(KitRules::<B>(PhantomData)))
}

/// The kit's `check_rules` over random sequences full of duplicates: every answer is
/// the oracle's (refusals with their codes), and the stock after every step is what the
/// oracle says, so the effect ran once per `Applied` and never on a replay or refusal.
pub async fn rules_agree_with_the_oracle<B: Backend>(b: &B) {
    use proptest::test_runner::{Config, TestRunner};
    let e = kit_engine(b).await;
    let mut runner = TestRunner::new(Config {
        cases: 16,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&orderly::testing::steps::<Shop>(4, 3, 1..40), |seq| {
        let first = 1000 * (1 + case.fetch_add(1, SeqCst));
        let ids: Vec<i64> = (first..first + 4).collect();
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                b.exec("UPDATE shop_stock SET qty = 2 WHERE sku = 1").await;
                for &id in &ids {
                    e.create(id).await.unwrap();
                }
                let mut oracle = StockOracle { left: 2 };
                orderly::testing::check_rules(&e, &ids, first + 4, &seq, &mut oracle, || async {
                    Ok(format!(
                        "{} left",
                        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await
                    ))
                })
                .await
            })
        })
        .map_err(proptest::test_runner::TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

/// The kit's `check_rules_concurrent` over random sequences on two entities, four
/// requests racing at a time (duplicates among them): every round's answers and the
/// stock after it are those of some order of its requests through the oracle. Some
/// rounds are explained only by an order other than the one they were sent in.
pub async fn rules_agree_with_the_oracle_in_races<B: Backend>(b: &B) {
    use proptest::test_runner::{Config, TestRunner};
    let e = kit_engine(b).await;
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let reordered = AtomicUsize::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&orderly::testing::steps::<Shop>(2, 2, 4..40), |seq| {
        let first = 1000 * (1 + case.fetch_add(1, SeqCst));
        let ids: Vec<i64> = (first..first + 2).collect();
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                b.exec("UPDATE shop_stock SET qty = 1 WHERE sku = 1").await;
                for &id in &ids {
                    e.create(id).await.unwrap();
                }
                let mut oracle = StockOracle { left: 1 };
                let stock = || async {
                    Ok(format!(
                        "{} left",
                        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await
                    ))
                };
                let rounds = orderly::testing::check_rules_concurrent(
                    &e,
                    &ids,
                    first + 2,
                    &seq,
                    4,
                    &mut oracle,
                    stock,
                )
                .await?;
                reordered.fetch_add(rounds, SeqCst);
                Ok::<(), String>(())
            })
        })
        .map_err(proptest::test_runner::TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    eprintln!("{} rounds reordered", reordered.load(SeqCst));
    assert!(
        reordered.load(SeqCst) > 0,
        "no requests overtook one another"
    );
}
