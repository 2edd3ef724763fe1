//! The service's HTTP handlers: create, pay, the gateway's callback, ship, hold, and
//! the reads.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use orderly::flow::{Ctx, Definition, FlowOutcome, Flows, Listing, Resume, StepError};
use orderly::http::IdempotentRequest;
use orderly::outbox::Outbox;
use orderly::{Engine, Error, Outcome};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::pay::{PayOrder, PayStep, Payment, short_hash};
use crate::problem::{failed, invalid, no_key, paid_by_another, problem};
use crate::shop::*;
use crate::*;

#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct NewOrder {
    sku: String,
    qty: i64,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct OrderToCreate {
    id: i64,
    sku: String,
    qty: i64,
}

pub(crate) struct App<S: Shop> {
    pub(crate) store: S,
    pub(crate) engine: Engine<OrderMachine, S>,
    pub(crate) flows: Flows<S>,
}

pub(crate) type Shared<S> = Arc<App<S>>;

pub(crate) fn create_order<S: Shop>(
    engine: &Engine<OrderMachine, S>,
) -> Definition<S, OrderToCreate> {
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
pub(crate) fn order_id(key: &str) -> i64 {
    let digest = Sha256::digest(key.as_bytes());
    i64::from_be_bytes(digest[..8].try_into().unwrap()) & i64::MAX
}

/// A JSON answer.
pub(crate) fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}

/// The request's key: the layer's, or without the layer (`--no-idempotency-layer`, to
/// measure its cost) the header itself.
pub(crate) fn key_of<S: Shop>(
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

pub(crate) async fn create<S: Shop>(
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

pub(crate) async fn pay<S: Shop>(
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
pub(crate) struct Callback {
    order_id: i64,
    payment_id: String,
}

pub(crate) async fn callback<S: Shop>(
    State(app): State<Shared<S>>,
    Json(c): Json<Callback>,
) -> Response {
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

pub(crate) async fn ship<S: Shop>(
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

pub(crate) async fn hold<S: Shop>(
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

pub(crate) async fn read<S: Shop>(State(app): State<Shared<S>>, Path(id): Path<i64>) -> Response {
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

pub(crate) async fn parked<S: Shop>(State(app): State<Shared<S>>) -> Response {
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

pub(crate) async fn resume<S: Shop>(
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

pub(crate) async fn stock<S: Shop>(
    State(app): State<Shared<S>>,
    Path(sku): Path<String>,
) -> Response {
    match app.store.available(&sku).await {
        Ok(n) => answer(StatusCode::OK, json!({ "sku": sku, "available": n })),
        Err(e) => failed(e.into()),
    }
}

pub(crate) async fn outbox<S: Shop>(State(app): State<Shared<S>>) -> Response {
    match Outbox::new(app.store.clone()).stats().await {
        Ok(s) => answer(
            StatusCode::OK,
            json!({ "pending": s.pending, "dead": s.dead, "oldest_pending_ms": s.oldest_pending.as_millis() as u64 }),
        ),
        Err(e) => failed(e),
    }
}

pub(crate) async fn graph() -> String {
    orderly::machine::mermaid::<OrderMachine>()
}
