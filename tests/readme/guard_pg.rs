use orderly::{Engine, Halt, Judged, PgStore, RulesOf};
use sqlx::PgConnection;

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
            Paid + Ship [in_stock] => Shipped / take_stock emits ShopShipped,
        }
    }
}

pub struct Mine;

impl ShopRules<PgConnection> for Mine {
    async fn amount_matches(&self, conn: &mut PgConnection, j: &Judged<'_, Shop>) -> Result<(), Halt> {
        let paid: i64 = j.payload()?.unwrap_or(0);
        let due: i64 = sqlx::query_scalar("SELECT due FROM shop_due WHERE id = $1")
            .bind(j.order_id)
            .fetch_one(&mut *conn)
            .await?;
        if paid != due {
            return Err(Halt::refuse("amount_mismatch", format!("paid {paid}, due {due}")));
        }
        Ok(())
    }

    async fn in_stock(&self, conn: &mut PgConnection, _j: &Judged<'_, Shop>) -> Result<(), Halt> {
        // A plain read of a row every shipment shares: safe in the unit (see below).
        let left: i64 = sqlx::query_scalar("SELECT qty FROM shop_stock WHERE sku = 'lamp'")
            .fetch_one(&mut *conn)
            .await?;
        if left <= 0 {
            return Err(Halt::refuse("out_of_stock", "no lamp left"));
        }
        Ok(())
    }

    async fn take_stock(&self, conn: &mut PgConnection, _j: &Judged<'_, Shop>) -> Result<(), Halt> {
        sqlx::query("UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'lamp'")
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

pub fn shop(store: PgStore) -> Result<Engine<Shop, PgStore>, orderly::Error> {
    Ok(Engine::new(store)?.with_rules(RulesOf(Mine)))
}
