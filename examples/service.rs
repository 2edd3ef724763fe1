//! An order and payment service, the shape of what orderly's users build: axum, the
//! Idempotency-Key layer, flows, transitions and metrics, on embedded SQLite by default
//! (PostgreSQL or MariaDB by URL).
//!
//! ```sh
//! cargo run --example service --features http,metrics,admin      # 127.0.0.1:3000, SQLite
//! cargo run --example service --features http,metrics,admin,postgres -- --db postgres://127.0.0.1/test
//! ```
//!
//! | route | what |
//! |---|---|
//! | `POST /orders` `{"sku": "sku-1", "qty": 1}` | creates an order, reserving its stock (a flow); `Idempotency-Key` required. `sku-slow` holds the reservation's transaction open for 0.8 s, to watch a client hang up mid-transaction |
//! | `POST /orders/{id}/pay` `{"card": "4242"}` | charges the order through the fake gateway (a flow: authorize, capture; a declined capture voids the authorization); `Idempotency-Key` required |
//! | `POST /webhooks/gateway` `{"order_id": 1, "payment_id": "pay_…"}` | the gateway's callback: the order becomes Paid once; a repeat is 200, a second payment 409 naming the winner |
//! | `POST /orders/{id}/ship` | ships a paid order, unless it is on hold (the edge's guard: 422 `on_hold`), recording its shipment (the edge's effect, once); `Idempotency-Key` required |
//! | `PUT /orders/{id}/hold`, `DELETE /orders/{id}/hold` | puts an order on hold, or releases it |
//! | `GET /orders/{id}` | the order and its history |
//! | `GET /stock/{sku}` | what is left of a sku |
//! | `GET /flows/parked`, `POST /flows/{kind}/{key}/resume` `{"how": "retry"}` | parked flows, and an operator's resumption |
//! | `GET /outbox` | the outbox's pending and dead events (the relay prints each event it publishes) |
//! | `GET /graph` | the order's state graph (Mermaid) |
//! | `GET /metrics` | Prometheus text |
//!
//! Every error answer is `application/problem+json` (RFC 9457), one `type` per cause,
//! with `Retry-After` where a retry is the answer (the table is in `service/problem.rs`).
//!
//! On SIGINT or SIGTERM it stops taking connections, finishes the requests in hand (also
//! those whose clients hung up), and stops its recovery jobs and its outbox relay (which
//! finishes the batch in hand).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, MatchedPath, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orderly::admin::{Admin, Viewer};
use orderly::flow::{Ctx, Definition, FlowConfig, FlowOutcome, Flows, Listing, Resume, StepError};
use orderly::http::{IdempotencyLayer, IdempotentRequest};
use orderly::idempotency::{RecordStore, Work};
use orderly::outbox::{Message, Outbox, Relay, Sink, SinkError};
use orderly::{
    Engine, Error, Halt, Judged, Outcome, Reconciled, Records, RulesOf, ScopeConfig, SqliteStore,
    Store,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

#[path = "service/pay.rs"]
mod pay;
#[path = "service/problem.rs"]
mod problem;
use pay::{InMemoryGateway, PayOrder, PayStep, Payment, pay_order, short_hash};
use problem::{failed, invalid, no_key, paid_by_another, problem};

orderly::state_machine! {
    /// An order.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Cancelled }
        events: OrderEvent { Pay, Ship, Cancel }
        initial: Created;
        terminal: [Shipped, Cancelled];
        rules: OrderRules {
            guards: [not_on_hold]
            effects: [record_shipment]
        }
        transitions: {
            Created + Pay    => Paid     emits OrderPaid,
            Created + Cancel => Cancelled,
            Paid    + Ship [not_on_hold] => Shipped / record_shipment emits OrderShipped,
        }
    }
}

orderly::flow! {
    /// Creating an order: its row, then its stock.
    pub CreateOrder {
        kind: "create_order";
        version: 1;
        steps: CreateStep { Insert: local + undo, Reserve: local + undo, }
    }
}

/// What a backend gives the service beyond orderly: its shop tables and their SQL.
trait Shop:
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
struct Rules<S>(std::marker::PhantomData<fn() -> S>);

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

/// The shop's SQL on a backend: its stock table and seed, and the three statements (the
/// reservation binds quantity, sku, quantity).
macro_rules! shop {
    ($store:ty, table: $table:literal, seed: $seed:literal, reserve: $reserve:literal,
     unreserve: $unreserve:literal, available: $available:literal, on_hold: $on_hold:literal,
     ship: $ship:literal, hold: $hold:literal, unhold: $unhold:literal,
     shipments: $shipments:literal) => {
        impl Shop for $store {
            async fn open(url: &str) -> Result<Self, Error> {
                let store = <$store>::connect(url).await?;
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
    table: "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL); \
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
    table: "CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available BIGINT NOT NULL); \
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
    table: "CREATE TABLE IF NOT EXISTS stock (sku VARCHAR(64) PRIMARY KEY, available BIGINT NOT NULL); \
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

/// Where the outbox relay publishes: the service's log (a broker in production: the
/// `nats` and `rabbitmq` features have sinks).
struct LogSink;

impl Sink for LogSink {
    async fn publish(&self, m: &Message) -> Result<(), SinkError> {
        println!(
            "event {} {} of order {} (v{})",
            m.id, m.event, m.entity_id, m.version
        );
        Ok(())
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct NewOrder {
    sku: String,
    qty: i64,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct OrderToCreate {
    id: i64,
    sku: String,
    qty: i64,
}

struct App<S: Shop> {
    store: S,
    engine: Engine<OrderMachine, S>,
    flows: Flows<S>,
}

type Shared<S> = Arc<App<S>>;

fn create_order<S: Shop>(engine: &Engine<OrderMachine, S>) -> Definition<S, OrderToCreate> {
    let (insert, cancel) = (engine.clone(), engine.clone());
    Definition::new(CreateOrder)
        .local(CreateStep::Insert, move |conn, ctx: &Ctx<OrderToCreate>| {
            let engine = insert.clone();
            Box::pin(async move {
                // A retryable error (a deadlock, a lost connection) retries the step;
                // anything else fails it, and the flow compensates.
                engine.create(ctx.input().id).within(conn).await?;
                Ok(ctx.input().id)
            })
        })
        .undo_local(CreateStep::Insert, move |conn, ctx: &Ctx<OrderToCreate>| {
            let engine = cancel.clone();
            Box::pin(async move {
                let reference = format!("{}:cancel", ctx.key());
                engine
                    .transition(ctx.input().id, OrderEvent::Cancel, &reference)
                    .within(conn)
                    .await?;
                Ok(())
            })
        })
        .local(CreateStep::Reserve, |conn, ctx: &Ctx<OrderToCreate>| {
            Box::pin(async move {
                let order = ctx.input();
                if !S::reserve(conn, &order.sku, order.qty).await? {
                    return Err(StepError::fail(format!("{}: out of stock", order.sku)));
                }
                if order.sku == "sku-slow" {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                }
                Ok(order.qty)
            })
        })
        .undo_local(CreateStep::Reserve, |conn, ctx: &Ctx<OrderToCreate>| {
            Box::pin(async move {
                S::unreserve(conn, &ctx.input().sku, ctx.input().qty).await?;
                Ok(())
            })
        })
}

/// An order id for an idempotency key: the same key, the same order.
fn order_id(key: &str) -> i64 {
    let digest = Sha256::digest(key.as_bytes());
    i64::from_be_bytes(digest[..8].try_into().unwrap()) & i64::MAX
}

/// A JSON answer.
fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}

/// The request's key: the layer's, or without the layer (`--no-idempotency-layer`, to
/// measure its cost) the header itself.
fn key_of<S: Shop>(
    layer: Option<&Extension<IdempotentRequest<S>>>,
    headers: &HeaderMap,
) -> Option<String> {
    match layer {
        Some(Extension(key)) => Some(key.key().to_string()),
        None => headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    }
}

async fn create<S: Shop>(
    State(app): State<Shared<S>>,
    key: Option<Extension<IdempotentRequest<S>>>,
    headers: HeaderMap,
    Json(body): Json<NewOrder>,
) -> Response {
    let Some(key) = key_of(key.as_ref(), &headers) else {
        return no_key();
    };
    if body.qty <= 0 || body.qty > 1000 {
        return invalid("qty must be 1 to 1000");
    }
    let id = order_id(&key);
    let input = OrderToCreate {
        id,
        sku: body.sku,
        qty: body.qty,
    };
    match app
        .flows
        .start(CreateOrder, &format!("order-{id}"), &input)
        .await
    {
        Ok(started) => match started.outcome {
            FlowOutcome::Completed(_) => {
                answer(StatusCode::CREATED, json!({ "id": id, "state": "Created" }))
            }
            FlowOutcome::Compensated { error, .. } => problem(
                StatusCode::CONFLICT,
                "order-not-created",
                "Order not created",
                format!("the order's creation was undone: {error}"),
            )
            .with("id", id)
            .with("error", error)
            .into_response(),
            other => answer(
                StatusCode::ACCEPTED,
                json!({ "id": id, "flow": format!("{other:?}") }),
            ),
        },
        Err(e) => failed(e),
    }
}

async fn pay<S: Shop>(
    State(app): State<Shared<S>>,
    Path(id): Path<i64>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let card = body
        .get("card")
        .and_then(|c| c.as_str())
        .unwrap_or("4242")
        .to_string();
    match app.engine.get(id).await {
        Ok(order) if order.state == OrderState::Created => {}
        Ok(order) => {
            return problem(
                StatusCode::CONFLICT,
                "invalid-transition",
                "Not allowed in the order's state",
                format!("the order is {}", order.state),
            )
            .with("state", order.state.to_string())
            .with("event", "Pay")
            .into_response();
        }
        Err(e) => return failed(e),
    }
    // One payment per order and card: a retry under a new Idempotency-Key is the same
    // payment; another card is another payment, which the callback refuses if the first
    // one won (naming it, so the gateway refunds the loser).
    let flow_key = format!("pay-{id}-{}", short_hash(&card));
    match app
        .flows
        .start(PayOrder, &flow_key, &Payment { order_id: id, card })
        .await
    {
        Ok(started) => match started.outcome {
            FlowOutcome::Completed(outputs) => {
                let payment: String = outputs.get(PayStep::Capture).unwrap_or_default();
                answer(
                    StatusCode::ACCEPTED,
                    json!({ "order_id": id, "payment_id": payment }),
                )
            }
            FlowOutcome::Compensated { error, .. } => problem(
                StatusCode::PAYMENT_REQUIRED,
                "payment-declined",
                "Payment declined",
                format!("the payment was declined and its authorization voided: {error}"),
            )
            .with("order_id", id)
            .with("error", error)
            .with("voided", true)
            .into_response(),
            other => answer(
                StatusCode::ACCEPTED,
                json!({ "order_id": id, "flow": format!("{other:?}") }),
            ),
        },
        Err(e) => failed(e),
    }
}

#[derive(Deserialize)]
struct Callback {
    order_id: i64,
    payment_id: String,
}

async fn callback<S: Shop>(State(app): State<Shared<S>>, Json(c): Json<Callback>) -> Response {
    match app
        .engine
        .transition(c.order_id, OrderEvent::Pay, &c.payment_id)
        .await
    {
        Ok(Outcome::Applied { to, .. }) => {
            answer(StatusCode::OK, json!({ "state": to, "replayed": false }))
        }
        Ok(Outcome::Replayed { to, .. }) => {
            answer(StatusCode::OK, json!({ "state": to, "replayed": true }))
        }
        Err(Error::RefConflict { existing_ref, .. }) => {
            paid_by_another(existing_ref).into_response()
        }
        Err(e) => failed(e),
    }
}

async fn ship<S: Shop>(
    State(app): State<Shared<S>>,
    Path(id): Path<i64>,
    key: Option<Extension<IdempotentRequest<S>>>,
    headers: HeaderMap,
) -> Response {
    let Some(key) = key_of(key.as_ref(), &headers) else {
        return no_key();
    };
    match app.engine.transition(id, OrderEvent::Ship, &key).await {
        Ok(outcome) => answer(StatusCode::OK, json!({ "state": outcome.state() })),
        // The guard refused (422 `refused` with its code): an answer about the order,
        // which the layer keeps for the key.
        Err(e) => failed(e),
    }
}

async fn hold<S: Shop>(
    State(app): State<Shared<S>>,
    Path(id): Path<i64>,
    method: Method,
) -> Response {
    match app.store.hold(id, method == Method::PUT).await {
        Ok(()) => answer(
            StatusCode::OK,
            json!({ "id": id, "on_hold": method == Method::PUT }),
        ),
        Err(e) => failed(e.into()),
    }
}

async fn read<S: Shop>(State(app): State<Shared<S>>, Path(id): Path<i64>) -> Response {
    let order = match app.engine.get(id).await {
        Ok(order) => order,
        Err(e) => return failed(e),
    };
    let history = match app.engine.history(id).await {
        Ok(h) => h,
        Err(e) => return failed(e),
    };
    let history: Vec<_> = history
        .iter()
        .map(|r| json!({ "seq": r.seq, "from": r.from, "to": r.to, "event": r.event.to_string(), "ref": r.ref_id }))
        .collect();
    let shipments = match app.store.shipments(id).await {
        Ok(n) => n,
        Err(e) => return failed(e.into()),
    };
    answer(
        StatusCode::OK,
        json!({ "id": id, "state": order.state, "version": order.version, "history": history, "shipments": shipments }),
    )
}

async fn parked<S: Shop>(State(app): State<Shared<S>>) -> Response {
    match app.flows.list(Listing::Parked, None, 100).await {
        Ok(list) => {
            let flows: Vec<_> = list
                .iter()
                .map(|l| json!({ "kind": l.flow.kind, "key": l.flow.flow_key, "reason": l.flow.park_reason }))
                .collect();
            answer(StatusCode::OK, json!({ "parked": flows }))
        }
        Err(e) => failed(e),
    }
}

async fn resume<S: Shop>(
    State(app): State<Shared<S>>,
    Path((kind, key)): Path<(String, String)>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let how = match body.get("how") {
        Some(serde_json::Value::String(s)) if s == "retry" => Resume::Retry,
        Some(serde_json::Value::String(s)) if s == "compensate" => Resume::Compensate,
        Some(serde_json::Value::Object(o)) if o.contains_key("applied") => {
            Resume::Applied(o["applied"].clone())
        }
        _ => return invalid("how: \"retry\", \"compensate\" or {\"applied\": …}"),
    };
    match app.flows.resume(&kind, &key, how).await {
        Ok(outcome) => answer(StatusCode::OK, json!({ "outcome": format!("{outcome:?}") })),
        Err(e) => failed(e),
    }
}

async fn stock<S: Shop>(State(app): State<Shared<S>>, Path(sku): Path<String>) -> Response {
    match app.store.available(&sku).await {
        Ok(n) => answer(StatusCode::OK, json!({ "sku": sku, "available": n })),
        Err(e) => failed(e.into()),
    }
}

async fn outbox<S: Shop>(State(app): State<Shared<S>>) -> Response {
    match Outbox::new(app.store.clone()).stats().await {
        Ok(s) => answer(
            StatusCode::OK,
            json!({ "pending": s.pending, "dead": s.dead, "oldest_pending_ms": s.oldest_pending.as_millis() as u64 }),
        ),
        Err(e) => failed(e),
    }
}

async fn graph() -> String {
    orderly::machine::mermaid::<OrderMachine>()
}

struct Args {
    listen: SocketAddr,
    db: String,
    /// How long a request or a flow is held before another may take it over.
    lease: Duration,
    /// Serve without the Idempotency-Key layer (to measure what it costs).
    no_layer: bool,
}

fn args() -> Args {
    let mut listen: SocketAddr = "127.0.0.1:3000".parse().unwrap();
    let mut db = format!(
        "sqlite://{}",
        std::env::temp_dir().join("orderly-service.db").display()
    );
    let mut lease = Duration::from_secs(30);
    let mut no_layer = false;
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        if arg == "--no-idempotency-layer" {
            no_layer = true;
            continue;
        }
        match (arg.as_str(), argv.next()) {
            ("--listen", Some(v)) => {
                listen = v.parse().expect("--listen ADDR (such as 127.0.0.1:3000)")
            }
            ("--db", Some(v)) => db = v,
            ("--lease-ms", Some(v)) => {
                lease = Duration::from_millis(v.parse().expect("--lease-ms N"))
            }
            _ => panic!(
                "usage: service [--listen ADDR] [--db URL] [--lease-ms N] [--no-idempotency-layer]"
            ),
        }
    }
    Args {
        listen,
        db,
        lease,
        no_layer,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args();
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    // Histograms are drained by this upkeep (or by a scrape).
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    if args.db.starts_with("sqlite:") {
        return serve(SqliteStore::open(&args.db).await?, &args, metrics).await;
    }
    #[cfg(feature = "postgres")]
    if args.db.starts_with("postgres:") || args.db.starts_with("postgresql:") {
        return serve(orderly::PgStore::open(&args.db).await?, &args, metrics).await;
    }
    #[cfg(feature = "mysql")]
    if args.db.starts_with("mysql:") || args.db.starts_with("mariadb:") {
        return serve(orderly::MySqlStore::open(&args.db).await?, &args, metrics).await;
    }
    Err(format!(
        "--db {}: a sqlite:, postgres: or mysql: URL (with its cargo feature)",
        args.db
    )
    .into())
}

async fn serve<S: Shop>(
    store: S,
    args: &Args,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> Result<(), Box<dyn std::error::Error>> {
    let engine: Engine<OrderMachine, S> =
        Engine::new(store.clone())?.with_rules(RulesOf(Rules::<S>(std::marker::PhantomData)));
    let gateway = Arc::new(InMemoryGateway::default());
    let flow_config = FlowConfig::default().lease(args.lease);
    let flows = Flows::new(store.clone(), flow_config)?
        .register(create_order(&engine))?
        .register(pay_order::<S, _>(&gateway))?;
    let records = Records::new(store).scope(
        "http",
        ScopeConfig::new(args.lease, Duration::from_secs(24 * 3600)),
    )?;
    let layer = IdempotencyLayer::new(records.clone(), "http")?
        .route_of(|parts| {
            parts
                .extensions
                .get::<MatchedPath>()
                .map(|m| m.as_str().to_string())
        })
        .route(Method::POST, "/webhooks/gateway", None)
        .route(Method::POST, "/flows/{kind}/{key}/resume", None);
    let app = Arc::new(App {
        store: records.store().clone(),
        engine,
        flows: flows.clone(),
    });
    let router = Router::new()
        .route("/orders", post(create::<S>))
        .route("/orders/{id}", get(read::<S>))
        .route("/stock/{sku}", get(stock::<S>))
        .route("/orders/{id}/pay", post(pay::<S>))
        .route("/orders/{id}/ship", post(ship::<S>))
        .route(
            "/orders/{id}/hold",
            axum::routing::put(hold::<S>).delete(hold::<S>),
        )
        .route("/webhooks/gateway", post(callback::<S>))
        .route("/flows/parked", get(parked::<S>))
        .route("/flows/{kind}/{key}/resume", post(resume::<S>));
    // Every error answer problem+json, the framework's own too (a body or path that does
    // not read, a method a route does not take, a route that does not exist).
    let router = router.fallback(problem::no_route);
    let router = if args.no_layer {
        router
    } else {
        router.route_layer(layer.clone())
    };
    let router = router
        .route("/graph", get(graph))
        .route("/outbox", get(outbox::<S>))
        .route(
            "/metrics",
            get(move || std::future::ready(metrics.render())),
        )
        .layer(axum::middleware::map_response(problem::as_problem))
        .with_state(app.clone());
    // The operators' page. Who is who is the service's own sign-in to decide; this demo
    // trusts a header: `x-user: operator` may act, `x-user: support` may only read.
    let admin = Admin::new(app.store.clone())
        .flows(app.flows.clone())
        .records(records.clone())
        .machine(app.engine.clone())
        .access(
            |parts| match parts.headers.get("x-user").and_then(|u| u.to_str().ok()) {
                Some("operator") => Viewer::full("operator"),
                Some("support") => Viewer::read_only("support"),
                _ => Viewer::none(),
            },
        );
    let router = router.nest("/admin", admin.router());

    // The recovery jobs: requests whose server died half way (a request here is a flow,
    // which its own job finishes, so the record is released to run again), and flows.
    let (stop, stopped) = watch::channel(false);
    let until = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let records_job = tokio::spawn({
        let stopped = until(stopped.clone());
        async move {
            records
                .recovery_loop(
                    "http",
                    100,
                    Duration::from_secs(1),
                    |_stuck| async { Reconciled::Unknown },
                    stopped,
                )
                .await
        }
    });
    // The outbox relay: the events the order's edges emit, published once each, in order.
    let relay = Relay::new(app.store.clone(), LogSink);
    let relay_job = tokio::spawn({
        let stopped = until(stopped.clone());
        async move { relay.run(stopped).await }
    });
    let flows_job = tokio::spawn({
        let stopped = until(stopped.clone());
        async move {
            flows
                .recovery_loop(100, Duration::from_secs(1), stopped)
                .await
        }
    });

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Handlers whose clients hung up run on after their connections closed: they finish
    // and keep their responses before the jobs stop.
    layer.handlers_finished().await;
    stop.send(true)?;
    let (records_done, flows_done) = (records_job.await??, flows_job.await??);
    let relayed = relay_job.await??;
    println!(
        "stopped: recovery took over {} requests and {} flows; the relay published {} events",
        records_done.taken, flows_done.taken, relayed.published
    );
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
