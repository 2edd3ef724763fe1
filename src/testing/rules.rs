//! The kit for machines with guards and effects: an [`Oracle`] models what the rules do
//! to the business data, and [`check_rules`] compares that data with the model after
//! every step.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use super::{Model, RequestKey, Step};
use crate::engine::Engine;
use crate::engine::Judged;
use crate::engine::Outcome;
use crate::error::Error;
use crate::machine::StateMachine;
use crate::store::Store;

/// A pure model of a machine's guards and effects over your business data: what each
/// guard allows and what each effect changes, kept in memory.
pub trait Oracle<M: StateMachine> {
    /// Whether `guard` allows `judged` now; `Err(code)` is the refusal's code.
    fn guard(&mut self, guard: &'static str, judged: &Judged<'_, M>) -> Result<(), String>;
    /// What `effect` does to the business data when `judged` is applied.
    fn effect(&mut self, effect: &'static str, judged: &Judged<'_, M>);
    /// The business data as the model has it, written as `business` in
    /// [`check_rules`] writes the real data. It must show all of the oracle's state:
    /// [`check_rules_concurrent`] goes on from the first order of a round whose answers
    /// and business data match, and two orders that leave the same business data must
    /// leave the same oracle.
    fn business(&self) -> String;
}

/// What reads the real business data, for [`check_rules`].
type Business<'b> = dyn FnMut() -> Pin<Box<dyn Future<Output = Result<String, String>> + 'b>> + 'b;

/// [`check_entities`](super::check_entities) for a machine with guards and effects:
/// each step is judged by `oracle` too (a refusal by a guard must be the engine's
/// `Refused` with the same code, and is not recorded), and after every step the real
/// business data, as `business` reads it, must be what `oracle` says: an effect ran
/// exactly once for each `Applied`, never for a `Replayed` or a refusal. Each step's
/// payload reaches the guards as its JSON (give your guards the payloads they read
/// with [`steps_with`](super::steps_with)).
pub async fn check_rules<'b, M, S, O, F, Fut>(
    engine: &Engine<M, S>,
    ids: &[i64],
    missing: i64,
    steps: &[Step<M::Event>],
    oracle: &mut O,
    mut business: F,
) -> Result<(), String>
where
    M: StateMachine,
    S: Store,
    O: Oracle<M>,
    F: FnMut() -> Fut + 'b,
    Fut: Future<Output = Result<String, String>> + 'b,
{
    let mut read = move || -> Pin<Box<dyn Future<Output = Result<String, String>> + 'b>> {
        Box::pin(business())
    };
    run(engine, ids, missing, steps, Some((oracle, &mut read))).await
}

/// [`check_rules`] with the steps sent `width` at a time, all of a round at once, so that
/// they race one another (`width` from 1 to 5). A round's answers must be those of some
/// order of its requests through the model and `oracle`, and the business data after the
/// round what that order leaves: every order is tried, and the round goes on from the
/// first that explains it. Answers no order explains are an error naming the round.
/// After the last round each entity's state, version and history must be the model's.
/// Returns how many rounds only an order other than the one they were sent in explains:
/// evidence that requests overtook one another.
pub async fn check_rules_concurrent<'b, M, S, O, F, Fut>(
    engine: &Engine<M, S>,
    ids: &[i64],
    missing: i64,
    steps: &[Step<M::Event>],
    width: usize,
    oracle: &mut O,
    mut business: F,
) -> Result<usize, String>
where
    M: StateMachine,
    S: Store,
    O: Oracle<M> + Clone,
    F: FnMut() -> Fut + 'b,
    Fut: Future<Output = Result<String, String>> + 'b,
{
    if !(1..=5).contains(&width) {
        return Err(format!("width {width}: from 1 to 5 requests race at once"));
    }
    fresh(engine, ids, missing).await?;
    let id_of = id_of(ids, missing);
    let mut model = Model::<M>::new(ids.iter().copied());
    let mut applied_by_order: HashMap<i64, i64> = HashMap::new();
    let mut reordered = 0;
    for (n, round) in steps.chunks(width).enumerate() {
        let mut requests = Vec::with_capacity(round.len());
        for step in round {
            requests.push((id_of(step.order)?, step, payload_json(step)));
        }
        let answers = futures_util::future::join_all(requests.iter().map(|(id, step, _)| {
            let request = engine.transition(*id, step.event, &step.ref_id);
            async move {
                match &step.payload {
                    Some(payload) => request.payload(payload).await,
                    None => request.await,
                }
            }
        }))
        .await;
        let real = business().await?;
        let explained = orders(requests.len()).into_iter().find_map(|order| {
            let (mut m, mut o) = (model.clone(), oracle.clone());
            let fits = order.iter().all(|&i| {
                let (id, step, json) = &requests[i];
                m.apply_with_rules(*id, step.event, &step.ref_id, json.as_deref(), &mut o)
                    .matches(&answers[i])
            });
            (fits && o.business() == real).then_some((order, m, o))
        });
        let Some((order, m, o)) = explained else {
            let sent: Vec<String> = requests
                .iter()
                .map(|(id, step, _)| format!("({id}, {}, {})", step.event, step.ref_id))
                .collect();
            return Err(format!(
                "round {n}: no order of {} explains the answers {answers:?} with the business data {real}",
                sent.join(", ")
            ));
        };
        if order.windows(2).any(|w| w[0] > w[1]) {
            reordered += 1;
        }
        for ((id, _, _), answer) in requests.iter().zip(&answers) {
            if matches!(answer, Ok(Outcome::Applied { .. })) {
                *applied_by_order.entry(*id).or_default() += 1;
            }
        }
        (model, *oracle) = (m, o);
    }
    settled(engine, ids, &model, &applied_by_order).await?;
    Ok(reordered)
}

/// Every order of `0..n`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all.sort();
    all
}

/// The entities exist at the initial state, `missing` does not.
async fn fresh<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    ids: &[i64],
    missing: i64,
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
        Err(Error::NotFound { .. }) => Ok(()),
        other => Err(format!("entity {missing} should not exist: {other:?}")),
    }
}

/// The id a step's entity index names: `ids[i]`, or `missing` just past them.
fn id_of(ids: &[i64], missing: i64) -> impl Fn(i64) -> Result<i64, String> + '_ {
    move |index| match usize::try_from(index) {
        Ok(i) if i < ids.len() => Ok(ids[i]),
        Ok(i) if i == ids.len() => Ok(missing),
        _ => Err(format!(
            "a step names entity index {index}, beyond the {} given",
            ids.len()
        )),
    }
}

/// The payload as the engine stores it and a guard is shown it: JSON text.
fn payload_json<E>(step: &Step<E>) -> Option<String> {
    step.payload.as_ref().map(serde_json::Value::to_string)
}

/// After the last step: each entity's state and version are the model's and count its
/// `Applied` answers, and its history holds each applied request once.
async fn settled<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    ids: &[i64],
    model: &Model<M>,
    applied_by_order: &HashMap<i64, i64>,
) -> Result<(), String> {
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

/// The checks of [`check_entities`](super::check_entities), with `rules` where the
/// machine has them.
pub(super) async fn run<M: StateMachine, S: Store>(
    engine: &Engine<M, S>,
    ids: &[i64],
    missing: i64,
    steps: &[Step<M::Event>],
    mut rules: Option<(&mut dyn Oracle<M>, &mut Business<'_>)>,
) -> Result<(), String> {
    fresh(engine, ids, missing).await?;
    let id_of = id_of(ids, missing);
    let mut model = Model::<M>::new(ids.iter().copied());
    let mut first_report: HashMap<RequestKey<M>, Outcome<M::State>> = HashMap::new();
    let mut applied_by_order: HashMap<i64, i64> = HashMap::new();
    for (n, step) in steps.iter().enumerate() {
        let id = id_of(step.order)?;
        let json = payload_json(step);
        let expected = match rules.as_mut() {
            Some((oracle, _)) => {
                model.apply_with_rules(id, step.event, &step.ref_id, json.as_deref(), &mut **oracle)
            }
            None => model.apply_with_payload(id, step.event, &step.ref_id, json.as_deref()),
        };
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
        if let Some((oracle, business)) = rules.as_mut() {
            let (real, modelled) = (business().await?, oracle.business());
            if real != modelled {
                return Err(format!(
                    "step {n} ({id}, {}, {}) answered {actual:?}: the business data is {real}, the oracle says {modelled}",
                    step.event, step.ref_id
                ));
            }
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
    settled(engine, ids, &model, &applied_by_order).await
}
