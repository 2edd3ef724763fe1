//! The shop's rules written once, over orderly's `RuleConn` (no sqlx bound, no backend
//! named), and driven on every backend.

use orderly::RuleConn;
use orderly::engine::Arg;

use super::*;

/// The shop's rules, for any connection orderly has.
pub(crate) struct Portable;

impl<C: RuleConn> ShopRules<C> for Portable {
    async fn amount_matches(&self, conn: &mut C, judged: &Judged<'_, Shop>) -> Result<(), Halt> {
        let paid: i64 = judged.payload::<i64>()?.unwrap_or(0);
        let due = conn
            .fetch_i64(
                "SELECT due FROM shop_due WHERE id = ?",
                &[judged.order_id.into()],
            )
            .await?
            .unwrap_or(-1);
        if paid != due {
            return Err(Halt::refuse(
                "amount_mismatch",
                format!("paid {paid}, due {due}"),
            ));
        }
        Ok(())
    }

    async fn in_stock(&self, conn: &mut C, _judged: &Judged<'_, Shop>) -> Result<(), Halt> {
        let select = C::for_update("SELECT qty FROM shop_stock WHERE sku = ?");
        let left = conn.fetch_i64(&select, &[Arg::Int(1)]).await?.unwrap_or(0);
        if left <= 0 {
            return Err(Halt::refuse("out_of_stock", "no stock left"));
        }
        Ok(())
    }

    async fn take_stock(&self, conn: &mut C, _judged: &Judged<'_, Shop>) -> Result<(), Halt> {
        let taken = conn
            .execute(
                "UPDATE shop_stock SET qty = qty - ? WHERE sku = ? AND qty > 0",
                &[Arg::Int(1), Arg::Int(1)],
            )
            .await?;
        if taken != 1 {
            return Err(Halt::Failed("no stock to take".into()));
        }
        Ok(())
    }
}

/// One rules implementation on every backend: a payment of the wrong amount refused, the
/// right one applied; six shipments racing for four in stock, each on a task of its own:
/// four shipped, two refused `out_of_stock`, the stock at 0, and a text read by
/// `fetch_text` with a `?` inside quotes left alone.
pub async fn rules_written_once_run_on_every_backend<B: Backend>(b: &B)
where
    <B::S as Store>::Conn: RuleConn,
{
    shop_tables(b, 4).await;
    let engine: Shop_<B> = Engine::with_config(
        b.store(Duration::from_secs(30)).await,
        EngineConfig::default().read_first(B::POLICY),
    )
    .unwrap()
    .with_rules(RulesOf(Portable));
    let ids: Vec<i64> = (201..=206).collect();
    for &id in &ids {
        b.exec(&format!(
            "INSERT INTO shop_due (id, due) VALUES ({id}, 500)"
        ))
        .await;
        engine.create(id).await.unwrap();
    }
    let wrong = engine
        .transition(ids[0], Pay, "pay-wrong")
        .payload(&499)
        .await;
    assert!(
        matches!(&wrong, Err(Error::Refused { code, .. }) if code == "amount_mismatch"),
        "{wrong:?}"
    );
    for &id in &ids {
        let paid = engine
            .transition(id, Pay, "pay")
            .payload(&500)
            .await
            .unwrap();
        assert!(paid.is_applied(), "order {id}: {paid:?}");
    }
    let ships: Vec<_> = ids
        .iter()
        .map(|&id| {
            let e = engine.clone();
            tokio::spawn(async move { e.transition(id, Ship, "ship").await })
        })
        .collect();
    let (mut shipped, mut refused) = (0, 0);
    for ship in ships {
        match ship.await.unwrap() {
            Ok(Outcome::Applied { .. }) => shipped += 1,
            Err(Error::Refused { code, .. }) if code == "out_of_stock" => refused += 1,
            other => panic!("a shipment answered {other:?}"),
        }
    }
    assert_eq!((shipped, refused), (4, 2));
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        0
    );
    let mut conn = engine.store().acquire().await.unwrap();
    let text = (*conn)
        .fetch_text("SELECT 'a?b' WHERE 1 = ?", &[Arg::Int(1)])
        .await
        .unwrap();
    assert_eq!(text.as_deref(), Some("a?b"));
    // An integer literal (PostgreSQL's INTEGER, not BIGINT) reads as an integer too.
    assert_eq!((*conn).fetch_i64("SELECT 7", &[]).await.unwrap(), Some(7));
}
