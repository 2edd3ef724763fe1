//! An order and payment service, the shape of what orderly's users build: axum, the
//! Idempotency-Key layer, flows, transitions and metrics, on embedded SQLite by default
//! (PostgreSQL or MariaDB by URL). Its parts: the shop's tables and the order graph's
//! rules (`shop.rs`), the HTTP handlers (`handlers.rs`), the payment flow (`pay.rs`),
//! every error answer as problem+json (`problem.rs`); here, the graphs, the arguments
//! and the server.
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

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::MatchedPath;
use axum::http::Method;
use axum::routing::{get, post};
use orderly::admin::{Admin, Viewer};
use orderly::flow::{FlowConfig, Flows};
use orderly::http::IdempotencyLayer;
use orderly::outbox::{Message, Relay, Sink, SinkError};
use orderly::{Engine, Reconciled, Records, RulesOf, ScopeConfig, SqliteStore};
use tokio::sync::watch;

mod handlers;
mod pay;
mod problem;
mod shop;

use handlers::*;
use pay::{InMemoryGateway, pay_order};
use shop::*;

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

struct Args {
    listen: SocketAddr,
    db: String,
    /// How long a request or a flow is held before another may take it over.
    lease: Duration,
    /// Serve without the Idempotency-Key layer (to measure what it costs).
    no_layer: bool,
}

const USAGE: &str =
    "usage: service [--listen ADDR] [--db URL] [--lease-ms N] [--no-idempotency-layer]";

/// The command line: `--help` prints the usage and ends the process; a word it does not
/// know, or a value that does not read, is an error naming it.
fn args() -> Result<Args, String> {
    let mut listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 3000));
    let mut db = format!(
        "sqlite://{}",
        std::env::temp_dir().join("orderly-service.db").display()
    );
    let mut lease = Duration::from_secs(30);
    let mut no_layer = false;
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--no-idempotency-layer" => no_layer = true,
            "--listen" | "--db" | "--lease-ms" => {
                let value = argv.next().ok_or(format!("{arg} needs a value\n{USAGE}"))?;
                match arg.as_str() {
                    "--listen" => {
                        listen = value.parse().map_err(|_| {
                            format!("--listen {value}: an address such as 127.0.0.1:3000")
                        })?
                    }
                    "--db" => db = value,
                    _ => {
                        let ms: u64 = value
                            .parse()
                            .map_err(|_| format!("--lease-ms {value}: milliseconds"))?;
                        lease = Duration::from_millis(ms);
                    }
                }
            }
            other => return Err(format!("{other}: not an option\n{USAGE}")),
        }
    }
    Ok(Args {
        listen,
        db,
        lease,
        no_layer,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match args() {
        Ok(args) => args,
        Err(why) => {
            eprintln!("service: {why}");
            std::process::exit(2);
        }
    };
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
    let router = router.merge(admin.router_at("/admin"));

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
