//! What each round checks: the outage the loads saw, and every answer against what the\n//! promoted primary holds.

use super::*;

/// The outage of one round: from the kill to the first transition applied after it.
pub(super) struct Outage {
    pub(super) what: &'static str,
    pub(super) kill: Kill,
    pub(super) back: Instant,
}

/// What one load's calls met.
#[derive(Debug)]
pub(super) struct Judged {
    pub(super) calls: usize,
    /// Answered with a (retryable) error.
    pub(super) errors: usize,
    /// In flight at some moment of the outage (asked before its end, answered after the
    /// kill had been sent).
    pub(super) spanning: usize,
    /// Of those, failed or held up half a second or more.
    pub(super) met: usize,
    /// Answered, asked after the outage.
    pub(super) after: usize,
    /// Answered within their deadline.
    pub(super) within: usize,
}

impl Outage {
    /// Every error retryable, every call within `bound`; what the calls met, printed.
    pub(super) fn judge<K, T>(&self, layer: &str, calls: &[Call<K, T>], bound: Duration) -> Judged {
        let what = self.what;
        for c in calls {
            if let Err(e) = &c.answer {
                assert!(e.is_retryable(), "{what}: {layer}: {e:?}");
            }
        }
        let spanning: Vec<_> = calls
            .iter()
            .filter(|c| c.asked < self.back && c.answered() > self.kill.returned)
            .collect();
        let judged = Judged {
            calls: calls.len(),
            errors: calls.iter().filter(|c| c.answer.is_err()).count(),
            spanning: spanning.len(),
            met: spanning
                .iter()
                .filter(|c| c.answer.is_err() || c.took >= Duration::from_millis(500))
                .count(),
            after: calls
                .iter()
                .filter(|c| c.asked >= self.back && c.answer.is_ok())
                .count(),
            within: calls.iter().filter(|c| c.took <= bound).count(),
        };
        println!(
            "failover ({what} killed): {layer}: {} calls, {} answered with a retryable error, \
             {} in flight during the outage ({} of them failed or held up), {} answered after \
             it, {} of {} within {bound:?}",
            judged.calls,
            judged.errors,
            judged.spanning,
            judged.met,
            judged.after,
            judged.within,
            judged.calls
        );
        assert_eq!(
            judged.within, judged.calls,
            "{what}: {layer}: calls waited past {bound:?}"
        );
        judged
    }
}

/// Keys whose first call is answered `first_replayed`, and keys whose call was re-sent
/// after an error and answered `resent_replayed` (a write that had landed, answered
/// from the record).
pub(super) fn replays<K: Clone + Eq + std::hash::Hash, T>(
    calls: &[Call<K, T>],
    replayed: impl Fn(&T) -> bool,
) -> (Vec<K>, usize) {
    let mut firsts = Vec::new();
    let mut seen: HashMap<K, bool> = HashMap::new();
    let mut in_doubt = 0;
    for c in calls {
        let failed_before = seen.get(&c.key).copied();
        if let Ok(t) = &c.answer {
            match failed_before {
                None if replayed(t) => firsts.push(c.key.clone()),
                Some(true) if replayed(t) => in_doubt += 1,
                _ => {}
            }
        }
        let failed = failed_before.unwrap_or(false) || c.answer.is_err();
        seen.insert(c.key.clone(), failed);
    }
    (firsts, in_doubt)
}

/// Every acknowledged transition in the promoted primary's history once, as answered;
/// none applied twice; none answered Replayed on its first send.
pub(super) async fn check_transitions(lab: &Lab, what: &str, calls: &[Transition]) {
    // Each key's answer (a call is re-sent only after an error, so one per key), as
    // `(from, to, version)`.
    let mut answered: HashMap<(i64, FailoverEvent), (FailoverState, FailoverState, i64)> =
        HashMap::new();
    let mut applied = 0;
    for c in calls {
        let answer = match c.answer {
            Ok(Outcome::Applied { from, to, version }) => {
                applied += 1;
                (from, to, version)
            }
            Ok(Outcome::Replayed { from, to, version }) => (from, to, version),
            Err(_) => continue,
        };
        assert!(
            answered.insert(c.key, answer).is_none(),
            "{what}: {:?} answered twice",
            c.key
        );
    }
    let reached: HashSet<_> = calls.iter().map(|c| c.key).collect();
    assert_eq!(
        reached.len(),
        answered.len(),
        "{what}: transitions never answered"
    );
    for (&(id, event), answer) in &answered {
        let history = lab.engine.history(id).await.unwrap();
        let rows: Vec<_> = history.iter().filter(|r| r.event == event).collect();
        assert_eq!(
            rows.len(),
            1,
            "{what}: order {id} {event:?}: {} history rows",
            rows.len()
        );
        assert_eq!(
            *answer,
            (rows[0].from, rows[0].to, rows[0].seq),
            "{what}: order {id} {event:?} answered otherwise than recorded"
        );
    }
    let (firsts, in_doubt) = replays(calls, |o| matches!(o, Outcome::Replayed { .. }));
    assert!(
        firsts.is_empty(),
        "{what}: sent once, answered Replayed: {firsts:?}"
    );
    println!(
        "failover ({what} killed): transitions: {} acknowledged, {applied} applied; \
         {in_doubt} re-sent after an error had landed and were answered Replayed",
        answered.len()
    );
}

/// Every answered request's effect once and its record succeeded; none replayed on its
/// first send; no request's effect twice.
pub(super) async fn check_requests(
    lab: &Lab,
    what: &str,
    prefix: &str,
    calls: &[Call<String, bool>],
) {
    let like = format!("{prefix}-%");
    let effects: HashMap<String, i64> = sqlx::query_as(
        "SELECT idem_key, COUNT(*) FROM failover_effects WHERE idem_key LIKE $1 GROUP BY idem_key",
    )
    .bind(&like)
    .fetch_all(lab.store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let status: HashMap<String, String> = sqlx::query_as(
        "SELECT idem_key, status FROM orderly.idempotency_records WHERE scope = 'payments' AND idem_key LIKE $1",
    )
    .bind(&like)
    .fetch_all(lab.store.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    let answered: HashSet<&String> = calls
        .iter()
        .filter(|c| c.answer.is_ok())
        .map(|c| &c.key)
        .collect();
    let reached: HashSet<&String> = calls.iter().map(|c| &c.key).collect();
    assert_eq!(
        reached.len(),
        answered.len(),
        "{what}: requests never answered"
    );
    for (key, n) in &effects {
        assert_eq!(*n, 1, "{what}: request {key}: its effect {n} times");
    }
    for key in &answered {
        assert_eq!(
            effects.get(*key),
            Some(&1),
            "{what}: request {key}: no effect"
        );
        assert_eq!(
            status.get(*key).map(String::as_str),
            Some("SUCCEEDED"),
            "{what}: request {key}"
        );
    }
    let (firsts, in_doubt) = replays(calls, |r| *r);
    assert!(firsts.is_empty(), "{what}: sent once, replayed: {firsts:?}");
    println!(
        "failover ({what} killed): requests: {} answered, {in_doubt} re-sent after an \
         error had landed and were replayed",
        answered.len()
    );
}

/// Recovery rounds until no flow runs or is due; how many flows they took.
pub(super) async fn settle(flows: &Flows<PgStore>, what: &str) -> usize {
    let since = Instant::now();
    let mut taken = 0;
    loop {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "{what}: the flows never settled"
        );
        if let Ok(round) = flows.recover(100).await {
            taken += round.taken;
        }
        let running = flows.list(Listing::Running, None, 1).await;
        let stuck = flows.list(Listing::Stuck, None, 1).await;
        if let (Ok(running), Ok(stuck)) = (running, stuck)
            && running.is_empty()
            && stuck.is_empty()
        {
            return taken;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every flow completed (the stranded ones too), its local effects once, its downstream calls made with their
/// own keys only; none replayed on its first start.
pub(super) async fn check_flows(
    lab: &Lab,
    what: &str,
    prefix: &str,
    calls: &[Call<String, Started>],
    stranded: &[String],
    world: &World,
) {
    let like = format!("{prefix}-%");
    let started: HashSet<&String> = calls.iter().map(|c| &c.key).collect();
    let answered: HashSet<&String> = calls
        .iter()
        .filter(|c| c.answer.is_ok())
        .map(|c| &c.key)
        .collect();
    assert_eq!(
        started.len(),
        answered.len(),
        "{what}: flow starts never answered"
    );
    let keys: HashSet<&String> = started.into_iter().chain(stranded).collect();
    let status: HashMap<String, String> =
        sqlx::query_as("SELECT flow_key, status FROM orderly.flows WHERE flow_key LIKE $1")
            .bind(&like)
            .fetch_all(lab.store.pool())
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(status.len(), keys.len(), "{what}: flows recorded");
    for (key, s) in &status {
        assert_eq!(s, "COMPLETED", "{what}: flow {key}");
    }
    let effects: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT flow_key, what, COUNT(*) FROM flow_effects WHERE flow_key LIKE $1 GROUP BY flow_key, what",
    )
    .bind(&like)
    .fetch_all(lab.store.pool())
    .await
    .unwrap();
    for (key, step, n) in &effects {
        assert_eq!(*n, 1, "{what}: flow {key}: {step} {n} times");
    }
    assert_eq!(effects.len(), 2 * keys.len(), "{what}: local effects");
    let made: HashSet<String> = world
        .calls()
        .into_keys()
        .filter(|k| k.starts_with(&format!("shop:{prefix}-")))
        .collect();
    let stable: HashSet<String> = keys
        .iter()
        .flat_map(|k| ["Reserve", "Charge", "Ship"].map(|s| format!("shop:{k}:{s}")))
        .collect();
    assert_eq!(
        made, stable,
        "{what}: downstream calls with other keys than their steps'"
    );
    let (firsts, in_doubt) = replays(calls, |s| s.replayed);
    assert!(
        firsts.is_empty(),
        "{what}: started once, replayed: {firsts:?}"
    );
    println!(
        "failover ({what} killed): flows: {} completed, {in_doubt} re-sent after an error \
         and answered from the record",
        keys.len()
    );
}

/// Every event of the round's orders published, in version order per order; again only
/// what the relay published but could not record; no two publishes of an order at once.
pub(super) async fn check_relay(
    lab: &Lab,
    what: &str,
    calls: &[Transition],
    rec: &Recorder,
    unrecorded: &Unrecorded,
) {
    let ids: HashSet<i64> = calls.iter().map(|c| c.key.0).collect();
    let mut firsts: HashMap<i64, Vec<i64>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut again = 0;
    let mut foreign = 0;
    for (entity, version, _) in rec.received() {
        // Left in the outbox by an earlier run that stopped part way.
        if !ids.contains(&entity) {
            foreign += 1;
            continue;
        }
        if seen.insert((entity, version)) {
            firsts.entry(entity).or_default().push(version);
        } else {
            again += 1;
            assert!(
                unrecorded.contains(&(entity, version)),
                "{what}: event {entity}:{version} published twice, recorded the first time"
            );
        }
    }
    for id in &ids {
        let version = lab.engine.get(*id).await.unwrap().version;
        let published = firsts.remove(id).unwrap_or_default();
        assert_eq!(
            published,
            (1..=version).collect::<Vec<_>>(),
            "{what}: order {id}"
        );
    }
    assert_eq!(rec.overlaps(), 0, "{what}: an order's publishes overlapped");
    println!(
        "failover ({what} killed): relays: {} events published, {again} again (published, \
         not recorded: {}); {foreign} events of earlier runs",
        seen.len(),
        unrecorded.len()
    );
}
