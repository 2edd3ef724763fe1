//! What a backend gives the service beyond orderly (its shop tables and their SQL), and
//! the order graph's rules over them.

use std::future::Future;

use orderly::idempotency::{RecordStore, Work};
use orderly::{Error, Halt, Judged, SqliteStore, Store};

use crate::*;

/// What a backend gives the service beyond orderly: its shop tables and their SQL.
pub(crate) trait Shop:
    Store
    + RecordStore
    + orderly::flow::FlowStore
    + orderly::outbox::OutboxStore
    + orderly::store::audit::AuditStore
    + orderly::admin::lookup::LookupStore
    + Sized
{
    /// Connects, migrates, creates the stock table and seeds `sku-1`, `sku-2` and
    /// `sku-slow`.
    async fn open(url: &str) -> Result<Self, Error>;
    /// Takes `qty` of `sku` if there is that much.
    fn reserve<'c>(
        conn: &'c mut Self::Conn,
        sku: &'c str,
        qty: i64,
    ) -> Work<'c, Result<bool, sqlx::Error>>;
    /// What is left of `sku`.
    fn available(&self, sku: &str) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
    /// Gives `qty` of `sku` back.
    fn unreserve<'c>(
        conn: &'c mut Self::Conn,
        sku: &'c str,
        qty: i64,
    ) -> Work<'c, Result<(), sqlx::Error>>;
    /// Whether order `id` is on hold (the guard of shipping).
    fn on_hold(conn: &mut Self::Conn, id: i64) -> Work<'_, Result<bool, sqlx::Error>>;
    /// Records order `id`'s shipment under `reference` (the effect of shipping).
    fn record_shipment<'c>(
        conn: &'c mut Self::Conn,
        id: i64,
        reference: &'c str,
    ) -> Work<'c, Result<(), sqlx::Error>>;
    /// Puts order `id` on hold (`true`) or releases it.
    fn hold(&self, id: i64, on: bool) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// How many shipments order `id` has (at most one).
    fn shipments(&self, id: i64) -> impl Future<Output = Result<i64, sqlx::Error>> + Send;
}

/// The order graph's rules, on any backend: shipping is refused while the order is on
/// hold, and records the shipment in the same unit as the move.
pub(crate) struct Rules<S>(pub(crate) std::marker::PhantomData<fn() -> S>);

impl<S: Shop> OrderRules<S::Conn> for Rules<S> {
    async fn not_on_hold(
        &self,
        conn: &mut S::Conn,
        order: &Judged<'_, OrderMachine>,
    ) -> Result<(), Halt> {
        if S::on_hold(conn, order.order_id).await? {
            return Err(Halt::refuse("on_hold", "the order is on hold"));
        }
        Ok(())
    }

    async fn record_shipment(
        &self,
        conn: &mut S::Conn,
        order: &Judged<'_, OrderMachine>,
    ) -> Result<(), Halt> {
        S::record_shipment(conn, order.order_id, order.ref_id).await?;
        Ok(())
    }
}

/// The shop's SQL on a backend: its own tables (its orders, which orderly moves, stock,
/// holds, shipments) and stock seed, and the three statements (the
/// reservation binds quantity, sku, quantity).
macro_rules! shop {
    ($store:ty, table: $table:literal, seed: $seed:literal, reserve: $reserve:literal,
     unreserve: $unreserve:literal, available: $available:literal, on_hold: $on_hold:literal,
     ship: $ship:literal, hold: $hold:literal, unhold: $unhold:literal,
     shipments: $shipments:literal) => {
        impl Shop for $store {
            async fn open(url: &str) -> Result<Self, Error> {
                let store = <$store>::connect(url, orderly::Tables::new("orders")?).await?;
                sqlx::raw_sql($table).execute(store.pool()).await?;
                sqlx::raw_sql($seed).execute(store.pool()).await?;
                Ok(store)
            }

            async fn available(&self, sku: &str) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar($available)
                    .bind(sku)
                    .fetch_one(self.pool())
                    .await
            }

            fn reserve<'c>(
                conn: &'c mut Self::Conn,
                sku: &'c str,
                qty: i64,
            ) -> Work<'c, Result<bool, sqlx::Error>> {
                Box::pin(async move {
                    let done = sqlx::query($reserve)
                        .bind(qty)
                        .bind(sku)
                        .bind(qty)
                        .execute(conn)
                        .await?;
                    Ok(done.rows_affected() == 1)
                })
            }

            fn unreserve<'c>(
                conn: &'c mut Self::Conn,
                sku: &'c str,
                qty: i64,
            ) -> Work<'c, Result<(), sqlx::Error>> {
                Box::pin(async move {
                    sqlx::query($unreserve)
                        .bind(qty)
                        .bind(sku)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            }

            fn on_hold(conn: &mut Self::Conn, id: i64) -> Work<'_, Result<bool, sqlx::Error>> {
                Box::pin(async move {
                    let held: i64 = sqlx::query_scalar($on_hold)
                        .bind(id)
                        .fetch_one(conn)
                        .await?;
                    Ok(held > 0)
                })
            }

            fn record_shipment<'c>(
                conn: &'c mut Self::Conn,
                id: i64,
                reference: &'c str,
            ) -> Work<'c, Result<(), sqlx::Error>> {
                Box::pin(async move {
                    sqlx::query($ship)
                        .bind(id)
                        .bind(reference)
                        .execute(conn)
                        .await
                        .map(drop)
                })
            }

            async fn hold(&self, id: i64, on: bool) -> Result<(), sqlx::Error> {
                let sql = if on { $hold } else { $unhold };
                sqlx::query(sql)
                    .bind(id)
                    .execute(self.pool())
                    .await
                    .map(drop)
            }

            async fn shipments(&self, id: i64) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar($shipments)
                    .bind(id)
                    .fetch_one(self.pool())
                    .await
            }
        }
    };
}

shop!(
    SqliteStore,
    table: "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0); \
            CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL); \
            CREATE TABLE IF NOT EXISTS holds (order_id INTEGER PRIMARY KEY); \
            CREATE TABLE IF NOT EXISTS shipments (order_id INTEGER PRIMARY KEY, ref TEXT NOT NULL)",
    seed: "INSERT INTO stock (sku, available) VALUES ('sku-1', 10000000), ('sku-2', 5), ('sku-slow', 1000) \
           ON CONFLICT (sku) DO NOTHING",
    reserve: "UPDATE stock SET available = available - ?1 WHERE sku = ?2 AND available >= ?3",
    unreserve: "UPDATE stock SET available = available + ?1 WHERE sku = ?2",
    available: "SELECT available FROM stock WHERE sku = ?1",
    on_hold: "SELECT COUNT(*) FROM holds WHERE order_id = ?1",
    ship: "INSERT INTO shipments (order_id, ref) VALUES (?1, ?2)",
    hold: "INSERT INTO holds (order_id) VALUES (?1) ON CONFLICT (order_id) DO NOTHING",
    unhold: "DELETE FROM holds WHERE order_id = ?1",
    shipments: "SELECT COUNT(*) FROM shipments WHERE order_id = ?1"
);

#[cfg(feature = "postgres")]
shop!(
    orderly::PgStore,
    table: "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, version BIGINT NOT NULL DEFAULT 0); \
            CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available BIGINT NOT NULL); \
            CREATE TABLE IF NOT EXISTS holds (order_id BIGINT PRIMARY KEY); \
            CREATE TABLE IF NOT EXISTS shipments (order_id BIGINT PRIMARY KEY, ref TEXT NOT NULL)",
    seed: "INSERT INTO stock (sku, available) VALUES ('sku-1', 10000000), ('sku-2', 5), ('sku-slow', 1000) \
           ON CONFLICT (sku) DO NOTHING",
    reserve: "UPDATE stock SET available = available - $1 WHERE sku = $2 AND available >= $3",
    unreserve: "UPDATE stock SET available = available + $1 WHERE sku = $2",
    available: "SELECT available FROM stock WHERE sku = $1",
    on_hold: "SELECT COUNT(*) FROM holds WHERE order_id = $1",
    ship: "INSERT INTO shipments (order_id, ref) VALUES ($1, $2)",
    hold: "INSERT INTO holds (order_id) VALUES ($1) ON CONFLICT (order_id) DO NOTHING",
    unhold: "DELETE FROM holds WHERE order_id = $1",
    shipments: "SELECT COUNT(*) FROM shipments WHERE order_id = $1"
);

#[cfg(feature = "mysql")]
shop!(
    orderly::MySqlStore,
    table: "CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, status VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, version BIGINT NOT NULL DEFAULT 0); \
            CREATE TABLE IF NOT EXISTS stock (sku VARCHAR(64) PRIMARY KEY, available BIGINT NOT NULL); \
            CREATE TABLE IF NOT EXISTS holds (order_id BIGINT PRIMARY KEY); \
            CREATE TABLE IF NOT EXISTS shipments (order_id BIGINT PRIMARY KEY, ref VARCHAR(255) NOT NULL)",
    seed: "INSERT IGNORE INTO stock (sku, available) VALUES ('sku-1', 10000000), ('sku-2', 5), ('sku-slow', 1000)",
    reserve: "UPDATE stock SET available = available - ? WHERE sku = ? AND available >= ?",
    unreserve: "UPDATE stock SET available = available + ? WHERE sku = ?",
    available: "SELECT available FROM stock WHERE sku = ?",
    on_hold: "SELECT COUNT(*) FROM holds WHERE order_id = ?",
    ship: "INSERT INTO shipments (order_id, ref) VALUES (?, ?)",
    hold: "INSERT IGNORE INTO holds (order_id) VALUES (?)",
    unhold: "DELETE FROM holds WHERE order_id = ?",
    shipments: "SELECT COUNT(*) FROM shipments WHERE order_id = ?"
);
