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
//! - [`check_rules`]: the same for a machine with guards and effects, against an
//!   [`Oracle`] you write: a pure model of what each guard allows and each effect does
//!   to your business data, compared with the data itself after every step.
//! - [`flows`]: a kit that runs your own flows with faults at every point their runner
//!   records, and checks every effect happened once.
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

use crate::engine::Engine;
use crate::engine::Judged;
use crate::engine::Outcome;
use crate::error::Error;
use crate::machine::StateMachine;
use crate::store::Store;

pub mod flows;
mod rules;

pub use rules::{Oracle, check_rules, check_rules_concurrent};

/// One request of a generated sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<E> {
    /// Index of the entity, `0..orders`; the index `orders` names one never created.
    pub order: i64,
    /// The event.
    pub event: E,
    /// The reference, from a small pool (`r0`, `r1`, …).
    pub ref_id: String,
    /// The payload, if any, as JSON: from [`steps`] one of two strings (`"a"`, `"b"`);
    /// from [`steps_with`] what your strategy for the event gave.
    pub payload: Option<serde_json::Value>,
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
            payload: payload.map(serde_json::Value::from),
        });
    proptest::collection::vec(step, len)
}

/// The payloads of one event's steps, for [`steps_with`]: [`payload`] or
/// [`no_payload`], or any strategy of optional JSON values.
pub type Payloads = BoxedStrategy<Option<serde_json::Value>>;

/// [`steps`] whose payloads your guards can read: `payloads(event)` gives the payloads
/// of that event's steps (an amount for a payment, none for a shipment). Draw them from
/// a few values, so that a reference sent again with another payload
/// (`PayloadMismatch`) and a payload your guard refuses both happen:
///
/// ```no_run
/// # orderly::state_machine! { pub Shop { states: ShopState { Open, Paid } events: ShopEvent { Pay } initial: Open; terminal: [Paid]; transitions: { Open + Pay => Paid } } }
/// use orderly::testing::{no_payload, payload, steps_with};
/// use proptest::prelude::*;
///
/// let seqs = steps_with::<Shop>(4, 3, 1..40, |event| match event {
///     // Mostly the amount due, now and then short, now and then none at all.
///     ShopEvent::Pay => prop_oneof![
///         4 => payload(Just(500_i64)),
///         1 => payload(Just(400_i64)),
///         1 => no_payload(),
///     ]
///     .boxed(),
/// });
/// ```
pub fn steps_with<M: StateMachine>(
    orders: i64,
    refs: usize,
    len: Range<usize>,
    payloads: impl Fn(M::Event) -> Payloads,
) -> impl Strategy<Value = Vec<Step<M::Event>>> {
    let events: Vec<(M::Event, Payloads)> = M::Event::iter().map(|e| (e, payloads(e))).collect();
    let event = proptest::strategy::Union::new(
        events
            .into_iter()
            .map(|(e, p)| (Just(e), p).boxed())
            .collect::<Vec<_>>(),
    );
    let step = (
        prop_oneof![9 => 0..orders.max(1), 1 => Just(orders)],
        event,
        0..refs.max(1),
    )
        .prop_map(|(order, (event, payload), r)| Step {
            order,
            event,
            ref_id: format!("r{r}"),
            payload,
        });
    proptest::collection::vec(step, len)
}

/// A payload drawn from `values`, sent as their JSON.
pub fn payload<T>(values: impl Strategy<Value = T> + 'static) -> Payloads
where
    T: serde::Serialize + std::fmt::Debug,
{
    values.prop_map(|v| serde_json::to_value(v).ok()).boxed()
}

/// No payload.
pub fn no_payload() -> Payloads {
    Just(None).boxed()
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
    /// `Err(Refused)` by this guard (or effect) with this code.
    Refused {
        /// The rule that refused.
        guard: &'static str,
        /// Its code.
        code: String,
    },
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
            (
                Expected::Refused { guard, code },
                Err(Error::Refused {
                    guard: g, code: c, ..
                }),
            ) => guard == g && code == c,
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
#[derive(Debug)]
pub struct Model<M: StateMachine> {
    orders: HashMap<i64, (M::State, i64)>,
    applied: HashMap<RequestKey<M>, Applied<M::State>>,
    latest_ref: HashMap<(i64, M::Event), String>,
}

impl<M: StateMachine> Clone for Model<M> {
    fn clone(&self) -> Self {
        Model {
            orders: self.orders.clone(),
            applied: self.applied.clone(),
            latest_ref: self.latest_ref.clone(),
        }
    }
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
        self.apply_judged(id, event, ref_id, payload, None)
    }

    /// [`apply_with_payload`](Self::apply_with_payload) on a machine with guards and
    /// effects: a move the graph allows is judged by `oracle`'s guard (a refusal is not
    /// recorded: a re-send is judged afresh), and applied with its effect. `payload` is
    /// the request's payload as JSON text, as a guard is shown it.
    pub fn apply_with_rules(
        &mut self,
        id: i64,
        event: M::Event,
        ref_id: &str,
        payload: Option<&str>,
        oracle: &mut dyn Oracle<M>,
    ) -> Expected<M::State> {
        self.apply_judged(id, event, ref_id, payload, Some(oracle))
    }

    fn apply_judged(
        &mut self,
        id: i64,
        event: M::Event,
        ref_id: &str,
        payload: Option<&str>,
        oracle: Option<&mut dyn Oracle<M>>,
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
                if let Some(oracle) = oracle {
                    let judged = Judged {
                        order_id: id,
                        from,
                        to,
                        version: *version,
                        event,
                        ref_id,
                        payload,
                    };
                    let edge = M::edge(from, event);
                    if let Some(guard) = edge.and_then(|e| e.guard)
                        && let Err(code) = oracle.guard(guard, &judged)
                    {
                        return Expected::Refused { guard, code };
                    }
                    if let Some(effect) = edge.and_then(|e| e.effect) {
                        oracle.effect(effect, &judged);
                    }
                }
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
    rules::run(engine, ids, missing, steps, None).await
}
