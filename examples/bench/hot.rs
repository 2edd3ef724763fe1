//! The hot-rows mode: many callers over a few entities of a cyclic graph (a popular
//! order, a SKU), the engine against the same work by hand.

use super::*;

orderly::state_machine! {
    /// An entity touched again and again: every request moves it along the same loop.
    pub HotMachine {
        states: HotState { Open }
        events: HotEvent { Touch }
        initial: Open;
        terminal: [];
        transitions: {
            Open + Touch => Open,
        }
    }
}

/// The hot entities' first id, above every id the other modes use (and pgbench's).
pub(crate) const HOT_FIRST: i64 = 3_000_000_000_000;

/// How many hot entities the callers share.
pub(crate) const HOT_ENTITIES: i64 = 10;

/// The hot entity of the `n`-th request.
fn hot_entity(n: i64) -> i64 {
    HOT_FIRST + n % HOT_ENTITIES
}

/// The hot entities, open at version 0, with no history.
async fn hot_rows<B: BenchDb>(db: &B) -> Result<(), BoxError> {
    let last = HOT_FIRST + HOT_ENTITIES - 1;
    db.exec(format!(
        "DELETE FROM orderly_transitions WHERE order_id BETWEEN {HOT_FIRST} AND {last}"
    ))
    .await?;
    db.exec(format!(
        "DELETE FROM orders WHERE id BETWEEN {HOT_FIRST} AND {last}"
    ))
    .await?;
    let values: Vec<String> = (HOT_FIRST..=last)
        .map(|id| format!("({id}, 'Open', 0)"))
        .collect();
    db.exec(format!(
        "INSERT INTO orders (id, status, version) VALUES {}",
        values.join(", ")
    ))
    .await
}

/// `c` callers over [`HOT_ENTITIES`] entities, each request a new reference: the engine
/// (`hot`: `Engine::transition` of `Touch`, a repeatable event, so each request is judged
/// against its history, at most one request per entity in a coalesced unit) against
/// the same work by hand (`hot-hand`: `BEGIN`, `SELECT … FOR UPDATE` (SQLite: under
/// `BEGIN IMMEDIATE`), the update, the history row whose unique key refuses a replay,
/// `COMMIT`), alternating in slices. Prints both rows and returns the `hot …` line.
pub(crate) async fn hot_pass<B: BenchDb>(
    db: &Arc<B>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    hot_rows(&**db).await?;
    let engine: Engine<HotMachine, B::S> = Engine::new(db.engine().store().clone())?;
    let slice = args.seconds / args.rounds as f64;
    let (mut run, mut by_hand) = (Lane::new(0), Lane::new(0));
    for _ in 0..args.rounds {
        let e = engine.clone();
        run.slice(c, slice, i64::MAX, false, move |n| {
            let e = e.clone();
            async move {
                let out = e
                    .transition(hot_entity(n), HotEvent::Touch, &format!("hot-{n}"))
                    .await?;
                ensure(out.is_applied(), "hot", hot_entity(n))
            }
        })
        .await?;
        let d = db.clone();
        by_hand
            .slice(c, slice, i64::MAX, false, move |n| {
                let d = d.clone();
                async move { d.hot_hand(hot_entity(n), &format!("hand-{n}")).await }
            })
            .await?;
    }
    let [run, by_hand] = [run, by_hand].map(|lane| lane.stats.finish());
    println!(
        "{c:>3}  (hot rows: {HOT_ENTITIES} entities of a cyclic graph; the `vs floor` column is against hot-hand)"
    );
    for (mode, s) in ["hot", "hot-hand"].iter().zip([&run, &by_hand]) {
        let (client, other) = s.cpu_per_op();
        println!(
            "{c:>3}  {mode:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
            s.ops,
            s.throughput(),
            s.percentile(0.5),
            s.percentile(0.99),
            s.throughput() / by_hand.throughput()
        );
    }
    // Every request recorded once: the history holds exactly what both modes applied.
    let applied = db
        .count(format!(
            "SELECT COUNT(*) FROM orderly_transitions WHERE order_id BETWEEN {HOT_FIRST} AND {}",
            HOT_FIRST + HOT_ENTITIES - 1
        ))
        .await?;
    if applied != (run.ops + by_hand.ops) as i64 {
        return Err(format!(
            "hot rows: {applied} history rows for {} requests applied",
            run.ops + by_hand.ops
        )
        .into());
    }
    hot_rows(&**db).await?;
    Ok(format!(
        "hot backend={} c={c} entities={HOT_ENTITIES} hot_vs_hand={:.2} hot_p99_ms={:.3} hand_p99_ms={:.3}",
        args.backend,
        run.throughput() / by_hand.throughput(),
        run.percentile(0.99),
        by_hand.percentile(0.99)
    ))
}
