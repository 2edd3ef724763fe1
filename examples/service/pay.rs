//! The service's payment flow: an authorization at the gateway, then its capture, each
//! by the step's idempotency key; a declined capture voids the authorization. Written
//! over [`Gateway`], so that the flow test kit runs it over its keyed double
//! (`tests/flow_kit.rs`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orderly::flow::{Ctx, Definition, FlowStore, StepError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

orderly::flow! {
    /// Paying an order at the gateway: an authorization, then its capture.
    pub PayOrder {
        kind: "pay_order";
        version: 1;
        steps: PayStep { Authorize: keyed + undo, Capture: keyed + undo, }
    }
}

/// What the flow is started with.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Payment {
    pub order_id: i64,
    pub card: String,
}

/// A payment gateway that takes the caller's idempotency key.
pub trait Gateway: Send + Sync + 'static {
    /// Calls it with `key`: a new key takes `answer`'s decision (its `Err` a refusal,
    /// which fails the step), a repeated one answers what the first did. A call that
    /// could not be made, or whose answer was lost, is [`StepError::Retry`].
    fn call(
        &self,
        key: &str,
        answer: impl FnOnce() -> Result<String, String> + Send,
    ) -> impl Future<Output = Result<String, StepError>> + Send;
}

/// The fake gateway the service runs with: authorizations and captures by the caller's
/// key, in memory.
#[derive(Default)]
pub struct InMemoryGateway {
    answers: Mutex<HashMap<String, Result<String, String>>>,
}

impl Gateway for InMemoryGateway {
    async fn call(
        &self,
        key: &str,
        answer: impl FnOnce() -> Result<String, String> + Send,
    ) -> Result<String, StepError> {
        let answered = self
            .answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key.to_string())
            .or_insert_with(answer)
            .clone();
        answered.map_err(StepError::fail)
    }
}

/// The flow's definition over `gateway`.
pub fn pay_order<S: FlowStore, G: Gateway>(gateway: &Arc<G>) -> Definition<S, Payment> {
    let (authorize, void, capture, refund) = (
        gateway.clone(),
        gateway.clone(),
        gateway.clone(),
        gateway.clone(),
    );
    Definition::new(PayOrder)
        .call(PayStep::Authorize, move |ctx: &Ctx<Payment>| {
            let gateway = authorize.clone();
            Box::pin(async move {
                let id = format!("auth_{}", short_hash(ctx.key()));
                gateway.call(ctx.key(), || Ok(id)).await
            })
        })
        .undo_call(PayStep::Authorize, move |ctx: &Ctx<Payment>| {
            let gateway = void.clone();
            Box::pin(async move { gateway.call(ctx.key(), || Ok("voided".into())).await })
        })
        .undo_call(PayStep::Capture, move |ctx: &Ctx<Payment>| {
            let gateway = refund.clone();
            Box::pin(async move { gateway.call(ctx.key(), || Ok("refunded".into())).await })
        })
        .call(PayStep::Capture, move |ctx: &Ctx<Payment>| {
            let gateway = capture.clone();
            Box::pin(async move {
                if ctx.input().card.contains("slow") {
                    tokio::time::sleep(Duration::from_millis(800)).await;
                }
                let declined = ctx.input().card.contains("decline");
                let id = format!("pay_{}", short_hash(ctx.key()));
                gateway
                    .call(ctx.key(), || {
                        if declined {
                            Err("card declined".into())
                        } else {
                            Ok(id)
                        }
                    })
                    .await
            })
        })
}

/// The first 8 bytes of a text's SHA-256, in hex.
pub fn short_hash(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}
