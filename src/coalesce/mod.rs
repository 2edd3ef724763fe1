//! Coalescing: while one statement of a kind is in flight, the calls of that kind that
//! arrive queue, and the next statement carries them all. Nothing waits on purpose: a
//! call that finds no statement in flight goes at once, alone, exactly as without
//! coalescing, and a queue forms only behind a statement already on its way
//! (docs/design.md, "Why coalesce writes, and why without a timer?").
//!
//! The words, one meaning each:
//!
//! - a **turn** is the right to send the next statement of a kind; one caller holds it
//!   at a time, and hands it on when its statement is answered (`queue.rs`);
//! - a **batch** is the calls one statement carries: the queued callers the holder of a
//!   turn takes with it (at most a bound per kind);
//! - a **write unit** is a store's atomic unit of writes, one transaction and one
//!   commit ([`Store::apply_first`](crate::Store::apply_first)); a batch of
//!   transitions' writes goes in one unit, each request answered for itself.
//!
//! | file | what it coalesces |
//! |---|---|
//! | `queue.rs` | nothing itself: the turn and the queue every kind below shares |
//! | `reads.rs` | the engine's read-first reads of requests' history rows |
//! | `claims.rs` | idempotency claims and flow starts (new records inserted together), and holders' finishes of records |
//! | `writes.rs` | transitions' apply-first writes: a batch of requests in one write unit |
//!
//! A write unit answers each request in store terms (applied from one state to another,
//! not applied, not tried); the engine turns that answer into the transition's outcome
//! (`engine/writes.rs`).

pub(crate) mod claims;
pub(crate) mod queue;
pub(crate) mod reads;
pub(crate) mod writes;
