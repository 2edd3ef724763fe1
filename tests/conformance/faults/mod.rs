//! Right answers under faults: cancelled calls, lost connections, in-doubt commits,
//! twins on a cycle, canonical payloads, corrupt rows. One body per behaviour, run on
//! every backend (the network faults on the server backends).

mod cancel;
mod hooked;
mod identity;
mod lost;

// Each suite runs the bodies it lists; the others stay unused in its binary.
#[allow(unused_imports)]
pub use self::{cancel::*, hooked::*, identity::*, lost::*};

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use orderly::store::{
    Apply, Entity, ErrorClass, FirstWrite, Key, Observed, OwnedKey, Prior, RawTransition, Request,
    Store, Txn, Unpooled, Written,
};
use orderly::{Engine, Error, Outcome, ReadFirst};
use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};

use super::{
    Backend, Eng, OrderEvent::*, OrderState::*, TicketEvent, TicketMachine, TicketState, applied,
    assert_order, config, engine, replayed, with_policy,
};
use crate::server::{Cut, eventually};

/// A server backend reached over TCP, so that its connections can be cut and killed.
#[allow(async_fn_in_trait)]
pub trait Networked: Backend {
    /// Where the server listens.
    fn server(&self) -> std::net::SocketAddr;
    /// Where a proxy cuts the connection right after the server committed a transition:
    /// the reply to the apply-first write.
    const CUT: Cut;
    /// Where a proxy cuts the connection right after the server committed a caller's
    /// transaction: the reply to its `COMMIT`.
    const COMMIT_CUT: Cut;
    /// Where a proxy cuts the connection under the apply-first write of a transition,
    /// whether or not it writes: the reply to the request that carries its statement.
    const WRITE_CUT: Cut;
    /// Bytes that only the request executing the apply-first write carries.
    const WRITE_PATTERN: &'static [u8];
    /// A store whose pool of `max` connections reaches this database through `port` on
    /// loopback.
    async fn store_at(&self, port: u16, max: u32) -> Self::S;
    /// Kills (from another connection) every other session on this database; returns how
    /// many.
    async fn kill_sessions(&self) -> usize;
}

/// Polls `fut` until it is ready or has been pending `k` times, then drops it: the drop
/// lands on the `k`-th await point that was not ready at once. `None` if dropped.
pub(crate) async fn poll_at_most<F: Future>(fut: F, k: usize) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut pending = 0;
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending if pending >= k => Poll::Ready(None),
        Poll::Pending => {
            pending += 1;
            Poll::Pending
        }
    })
    .await
}

/// The pool got every connection back (or replaced it), they are idle, and no session on
/// the server sits in a transaction.
pub(crate) async fn assert_pool_clean<B: Backend>(b: &B, store: &B::S) {
    assert!(
        eventually(Duration::from_secs(10), || async {
            let (size, idle) = B::pool_counts(store);
            size as usize == idle
        })
        .await,
        "connections never came back to the pool: {:?}",
        B::pool_counts(store)
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            b.open_transactions().await == 0
        })
        .await,
        "a session is left idle in a transaction"
    );
}
