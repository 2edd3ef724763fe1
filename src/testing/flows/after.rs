//! A check of the user's own, made after every run of the kit: what it is given.

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;

use super::check::End;
use super::doubles::Call;

pub(super) type After<S> =
    Arc<dyn for<'a> Fn(Finished<'a, S>) -> LocalBoxFuture<'a, Vec<String>> + Send + Sync>;

/// What a run left, for a check of your own ([`Kit::after_run`](super::Kit::after_run)).
#[derive(Debug)]
#[non_exhaustive]
pub struct Finished<'a, S> {
    /// The run's store.
    pub store: &'a S,
    /// The run's flow key.
    pub key: &'a str,
    /// Where the flow ended.
    pub end: &'a End,
    /// Every call the run's doubles took, in order, with the step that made it.
    pub calls: &'a [Call],
}

/// `check` as the kit keeps it (the closure given the signature the kit calls it by).
pub(super) fn after_fn<S, F>(check: F) -> After<S>
where
    F: for<'a> Fn(Finished<'a, S>) -> LocalBoxFuture<'a, Vec<String>> + Send + Sync + 'static,
{
    Arc::new(check)
}
