//! A property-testing kit for your own graphs (cargo feature `testing`).
//!
//! - [`steps`]: a proptest strategy for random event sequences over a few entities,
//!   with references and payloads drawn from small pools so that duplicates, and
//!   duplicates with another payload, are the rule.
//! - [`Model`]: a pure reference model of the outcome table, with no database.
//! - [`check_engine`]: runs a sequence through an [`Engine`] and the model side by side
//!   and checks the invariants listed on [`check_entities`], which does the same over
//!   entities you created yourself (a table with business columns), with ids from
//!   [`unique_ids`] that no other test or run uses.
//!
//! ```no_run
//! # orderly::state_machine! {
//! #     OrderMachine {
//! #         states: OrderState { Created, Paid }
//! #         events: OrderEvent { Pay }
//! #         initial: Created;
//! #         terminal: [Paid];
//! #         transitions: { Created + Pay => Paid }
//! #     }
//! # }
//! use orderly::testing::{check_engine, steps};
//! use proptest::prelude::*;
//!
//! # async fn engine() -> orderly::Engine<OrderMachine, orderly::SqliteStore> { unimplemented!() }
//! proptest! {
//!     #[test]
//!     fn engine_agrees_with_model(seq in steps::<OrderMachine>(4, 3, 1..60)) {
//!         let rt = tokio::runtime::Runtime::new().unwrap();
//!         rt.block_on(async {
//!             let engine = engine().await;
//!             check_engine(&engine, 1, 4, &seq).await
//!         }).map_err(TestCaseError::fail)?;
//!     }
//! }
//! ```

use std::collections::HashMap;
use std::ops::Range;

use proptest::prelude::*;
use strum::IntoEnumIterator;

use crate::store::Store;
use crate::{Engine, Error, Outcome, StateMachine};

/// One request of a generated sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<E> {
    /// Index of the entity, `0..orders`; the index `orders` names one never created.
    pub order: i64,
    /// The event.
    pub event: E,
    /// The reference, from a small pool (`r0`, `r1`, …).
    pub ref_id: String,
    /// The payload, if any: one of two strings (`"a"`, `"b"`), sent as a JSON string.
    pub payload: Option<String>,
}

/// Random sequences of `len` steps over `orders` entities (plus one that does not exist)
/// with references drawn from `refs` values, so the same `(order, event, ref)` recurs,
/// mostly without a payload and now and then with one of two.
pub fn steps<M: StateMachine>(
    orders: i64,
    refs: usize,
    len: Range<usize>,
) -> impl Strategy<Value = Vec<Step<M::Event>>> {
    let events: Vec<M::Event> = M::Event::iter().collect();
    let step = (
        // Mostly existing entities; now and then the missing one.
        prop_oneof![9 => 0..orders.max(1), 1 => Just(orders)],
        proptest::sample::select(events),
        0..refs.max(1),
        prop_oneof![6 => Just(None), 1 => Just(Some("a")), 1 => Just(Some("b"))],
    )
        .prop_map(|(order, event, r, payload)| Step {
            order,
            event,
            ref_id: format!("r{r}"),
            payload: payload.map(str::to_string),
        });
    proptest::collection::vec(step, len)
}

/// What the outcome table says a request must produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected<S> {
    /// `Ok(Applied)`.
    Applied {
        /// State before.
        from: S,
        /// State after.
        to: S,
        /// Version after.
        version: i64,
    },
    /// `Ok(Replayed)` with what the first application reported.
    Replayed {
        /// State before the first application.
        from: S,
        /// State after the first application.
        to: S,
        /// Version after the first application.
        version: i64,
    },
    /// `Err(RefConflict)` naming this reference.
    RefConflict {
        /// The winning reference.
        existing_ref: String,
    },
    /// `Err(PayloadMismatch)`: the reference was recorded with another payload.
    PayloadMismatch,
    /// `Err(InvalidTransition)`.
    InvalidTransition,
    /// `Err(NotFound)`.
    NotFound,
}

impl<S: Copy + PartialEq> Expected<S> {
    /// Whether the engine's answer is the one expected.
    pub fn matches(&self, actual: &Result<Outcome<S>, Error>) -> bool {
        match (self, actual) {
            (
                Expected::Applied { from, to, version },
                Ok(Outcome::Applied {
                    from: f,
                    to: t,
                    version: v,
                }),
            )
            | (
                Expected::Replayed { from, to, version },
                Ok(Outcome::Replayed {
                    from: f,
                    to: t,
                    version: v,
                }),
            ) => from == f && to == t && version == v,
            (
                Expected::RefConflict { existing_ref },
                Err(Error::RefConflict {
                    existing_ref: r, ..
                }),
            ) => existing_ref == r,
            (Expected::PayloadMismatch, Err(Error::PayloadMismatch { .. }))
            | (Expected::InvalidTransition, Err(Error::InvalidTransition { .. }))
            | (Expected::NotFound, Err(Error::NotFound { .. })) => true,
            _ => false,
        }
    }
}

/// `(order, event, ref)`: the identity of a request.
type RequestKey<M> = (i64, <M as StateMachine>::Event, String);

/// What a request recorded: from, to, version after, and its payload.
type Applied<S> = (S, S, i64, Option<String>);

/// The outcome table over in-memory maps: the reference the engine is checked against.
#[derive(Debug, Clone)]
pub struct Model<M: StateMachine> {
    orders: HashMap<i64, (M::State, i64)>,
    applied: HashMap<RequestKey<M>, Applied<M::State>>,
    latest_ref: HashMap<(i64, M::Event), String>,
}

impl<M: StateMachine> Model<M> {
    /// A model in which `ids` exist at the initial state.
    pub fn new(ids: impl IntoIterator<Item = i64>) -> Self {
        Model {
            orders: ids.into_iter().map(|id| (id, (M::INITIAL, 0))).collect(),
            applied: HashMap::new(),
            latest_ref: HashMap::new(),
        }
    }

    /// Applies one request without a payload and says what the engine must answer.
    pub fn apply(&mut self, id: i64, event: M::Event, ref_id: &str) -> Expected<M::State> {
        self.apply_with_payload(id, event, ref_id, None)
    }

    /// Applies one request with `payload` (any text that stands for the payload's
    /// identity) and says what the engine must answer.
    pub fn apply_with_payload(
        &mut self,
        id: i64,
        event: M::Event,
        ref_id: &str,
        payload: Option<&str>,
    ) -> Expected<M::State> {
        let key = (id, event, ref_id.to_string());
        if let Some((from, to, version, recorded)) = self.applied.get(&key) {
            if recorded.as_deref() != payload {
                return Expected::PayloadMismatch;
            }
            return Expected::Replayed {
                from: *from,
                to: *to,
                version: *version,
            };
        }
        let Some((state, version)) = self.orders.get_mut(&id) else {
            return Expected::NotFound;
        };
        match M::next(*state, event) {
            Some(to) => {
                let from = *state;
                *state = to;
                *version += 1;
                let version = *version;
                self.applied
                    .insert(key, (from, to, version, payload.map(str::to_string)));
                self.latest_ref.insert((id, event), ref_id.to_string());
                Expected::Applied { from, to, version }
            }
            None => match self.latest_ref.get(&(id, event)) {
                Some(existing_ref) => Expected::RefConflict {
                    existing_ref: existing_ref.clone(),
                },
                None => Expected::InvalidTransition,
            },
        }
    }

    /// The model's state and version of `id`.
    pub fn order(&self, id: i64) -> Option<(M::State, i64)> {
        self.orders.get(&id).copied()
    }

    /// How many requests were applied to `id`.
    pub fn applied_count(&self, id: i64) -> usize {
        self.applied.keys().filter(|(o, _, _)| *o == id).count()
    }
}

/// Runs `steps` through `engine` (entity index `i` is id `first_id + i`, index `orders`
/// the id `first_id + orders`, never created) and through a [`Model`], creating the
/// entities first; see [`check_entities`] for what it checks. For an entity table with
/// business columns, or a database other tests share, create the entities yourself and
/// call [`check_entities`] with ids from [`unique_ids`].
pub async fn check_engine<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    first_id: i64,
    orders: i64,
    steps: &[Step<M::Event>],
) -> Result<(), String> {
    let ids: Vec<i64> = (0..orders).map(|i| first_id + i).collect();
    for &id in &ids {
        engine
            .create(id)
            .await
            .map_err(|e| format!("create {id}: {e}"))?;
    }
    check_entities(engine, &ids, first_id + orders, steps).await
}

/// `count` ids that other runs almost surely do not use: they start from the clock in
/// microseconds, times 1,000, plus the process id modulo 1,000, and are counted on in
/// steps of 1,000 within the process. An earlier run's ids are below them unless it
/// used more than 1,000 ids a microsecond; a run started in the same microsecond by a
/// process whose id is equal modulo 1,000 could meet them. For entities created on a
/// database that other tests or earlier runs share.
pub fn unique_ids(count: usize) -> Vec<i64> {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicI64, Ordering};
    static NEXT: OnceLock<AtomicI64> = OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        AtomicI64::new(micros * 1000 + i64::from(std::process::id() % 1000))
    });
    let count = count as i64;
    // Spaced by 1,000 so another process's ids (offset by its pid) never meet these.
    let first = next.fetch_add(1000 * count, Ordering::Relaxed);
    (0..count).map(|i| first + 1000 * i).collect()
}

/// Runs `steps` through `engine` and through a [`Model`]: entity index `i` is `ids[i]`,
/// which must exist at the initial state with version 0 (created by you, with your
/// business columns), and index `ids.len()` is `missing`, which must not exist. Checks,
/// returning the first violation:
/// - every answer is the one the model expects, `PayloadMismatch` included;
/// - every `Replayed` reports what the first application of that request reported;
/// - afterwards, for every entity: same final state as the model; version = number of
///   `Applied`; history rows = number of `Applied`; no `(order, event, ref)` twice in the
///   history.
pub async fn check_entities<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    ids: &[i64],
    missing: i64,
    steps: &[Step<M::Event>],
) -> Result<(), String> {
    for &id in ids {
        let order = engine.get(id).await.map_err(|e| format!("get {id}: {e}"))?;
        if order.state != M::INITIAL || order.version != 0 {
            return Err(format!(
                "entity {id} is at {:?}/v{}, not the initial state at version 0",
                order.state, order.version
            ));
        }
    }
    match engine.get(missing).await {
        Err(Error::NotFound { .. }) => {}
        other => return Err(format!("entity {missing} should not exist: {other:?}")),
    }
    let id_of = |index: i64| match usize::try_from(index) {
        Ok(i) if i < ids.len() => Ok(ids[i]),
        Ok(i) if i == ids.len() => Ok(missing),
        _ => Err(format!(
            "a step names entity index {index}, beyond the {} given",
            ids.len()
        )),
    };
    let mut model = Model::<M>::new(ids.iter().copied());
    let mut first_report: HashMap<RequestKey<M>, Outcome<M::State>> = HashMap::new();
    let mut applied_by_order: HashMap<i64, i64> = HashMap::new();
    for (n, step) in steps.iter().enumerate() {
        let id = id_of(step.order)?;
        let expected =
            model.apply_with_payload(id, step.event, &step.ref_id, step.payload.as_deref());
        let request = engine.transition(id, step.event, &step.ref_id);
        let actual = match &step.payload {
            Some(payload) => request.payload(payload).await,
            None => request.await,
        };
        if !expected.matches(&actual) {
            return Err(format!(
                "step {n} ({id}, {}, {}): expected {expected:?}, got {actual:?}",
                step.event, step.ref_id
            ));
        }
        let key = (id, step.event, step.ref_id.clone());
        match actual {
            Ok(Outcome::Applied { from, to, version }) => {
                *applied_by_order.entry(id).or_default() += 1;
                first_report.insert(key, Outcome::Replayed { from, to, version });
            }
            Ok(replayed @ Outcome::Replayed { .. }) => {
                if first_report.get(&key) != Some(&replayed) {
                    return Err(format!(
                        "step {n}: {replayed:?} differs from the first application {:?}",
                        first_report.get(&key)
                    ));
                }
            }
            Err(_) => {}
        }
    }
    for &id in ids {
        let order = engine.get(id).await.map_err(|e| format!("get {id}: {e}"))?;
        let applied = applied_by_order.get(&id).copied().unwrap_or(0);
        let (state, version) = model.order(id).ok_or("model lost an order")?;
        if order.state != state || order.version != version || order.version != applied {
            return Err(format!(
                "order {id}: engine {:?}/v{}, model {state:?}/v{version}, applied {applied}",
                order.state, order.version
            ));
        }
        let history = engine
            .history(id)
            .await
            .map_err(|e| format!("history {id}: {e}"))?;
        if history.len() as i64 != applied || history.len() != model.applied_count(id) {
            return Err(format!(
                "order {id}: {} history rows for {applied} applied",
                history.len()
            ));
        }
        let mut keys: Vec<_> = history
            .iter()
            .map(|r| (r.event, r.ref_id.clone()))
            .collect();
        keys.sort_by(|a, b| (a.0.as_ref(), &a.1).cmp(&(b.0.as_ref(), &b.1)));
        keys.dedup();
        if keys.len() != history.len() {
            return Err(format!("order {id}: a request was recorded twice"));
        }
    }
    Ok(())
}
