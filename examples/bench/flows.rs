//! The flows' modes: `flow`, `flow-hand`, `replay-f`.

use super::*;

/// A dialect's statements for the hand-written flow of two local steps.
pub(crate) struct FlowSql {
    /// Inserts the flow record: `(key, input hash, input, token)`.
    pub(crate) claim: &'static str,
    /// The transition: `(to, id, from, version)`.
    pub(crate) update: &'static str,
    /// Its history row: `(id, seq, from, to, event, ref)`.
    pub(crate) insert: &'static str,
    /// The step row: `(key, index, name, token, output)`.
    pub(crate) step: &'static str,
    /// The fenced update of the flow record: `(next step, status, output, key, token)`.
    pub(crate) touch: &'static str,
}

/// The hand-written flow on `$pool`, each step's transaction begun by `$begin`.
macro_rules! flow_hand {
    ($pool:expr, $begin:expr, $id:expr, $sql:expr) => {{
        use sha2::Digest;
        let (id, sql): (i64, &FlowSql) = ($id, $sql);
        let key = format!("flow-{id}");
        let token = uuid::Uuid::new_v4().simple().to_string();
        let input = id.to_string();
        let hash = hex::encode(sha2::Sha256::digest(&input));
        let n = sqlx::query(sql.claim)
            .bind(&key)
            .bind(&hash)
            .bind(&input)
            .bind(&token)
            .execute($pool)
            .await?
            .rows_affected();
        ensure(n == 1, "flow by hand: claim", id)?;
        let steps = [
            ("Pay", "Created", "Paid", "pay"),
            ("Ship", "Paid", "Shipped", "ship"),
        ];
        for (i, (name, from, to, event)) in steps.into_iter().enumerate() {
            let version = i as i64;
            let mut tx = $begin.await?;
            let n = sqlx::query(sql.update)
                .bind(to)
                .bind(id)
                .bind(from)
                .bind(version)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            ensure(n == 1, "flow by hand: update", id)?;
            sqlx::query(sql.insert)
                .bind(id)
                .bind(version + 1)
                .bind(from)
                .bind(to)
                .bind(if i == 0 { "Pay" } else { "Ship" })
                .bind(format!("{event}-{id}"))
                .execute(&mut *tx)
                .await?;
            let output = (version + 1).to_string();
            sqlx::query(sql.step)
                .bind(&key)
                .bind(i as i32)
                .bind(name)
                .bind(&token)
                .bind(&output)
                .execute(&mut *tx)
                .await?;
            let last = i == 1;
            let n = sqlx::query(sql.touch)
                .bind(i as i32 + 1)
                .bind(if last { "COMPLETED" } else { "RUNNING" })
                .bind(last.then(|| format!("{{\"Pay\":1,\"Ship\":{output}}}")))
                .bind(&key)
                .bind(&token)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            ensure(n == 1, "flow by hand: touch", id)?;
            tx.commit().await?;
        }
        Ok(())
    }};
}

orderly::flow! {
    /// The bench's flow: two local steps.
    pub PayShip {
        kind: "bench";
        version: 1;
        steps: PayShipStep {
            Pay:  local,
            Ship: local,
        }
    }
}

/// The flows of the bench: `PayShip`, each step a transition inside its checkpoint
/// transaction.
pub(crate) fn bench_flows<S: FlowStore>(engine: &Engine<OrderMachine, S>) -> Flows<S> {
    let (pay, ship) = (engine.clone(), engine.clone());
    let def = Definition::<S, i64>::new(PayShip)
        .local(PayShipStep::Pay, move |conn, ctx| {
            let e = pay.clone();
            Box::pin(async move {
                let id = *ctx.input();
                let out = e
                    .transition(id, OrderEvent::Pay, &bench_ref(id))
                    .within(conn)
                    .await?;
                Ok(out.version())
            })
        })
        .local(PayShipStep::Ship, move |conn, ctx| {
            let e = ship.clone();
            Box::pin(async move {
                let id = *ctx.input();
                let out = e
                    .transition(id, OrderEvent::Ship, &format!("ship-{id}"))
                    .within(conn)
                    .await?;
                Ok(out.version())
            })
        });
    Flows::new(engine.store().clone(), FlowConfig::default())
        .and_then(|f| f.register(def))
        .expect("a valid flow")
}

/// `Flows::start` of order `id`'s flow; whether it was replayed. A retryable error is
/// re-sent, as a client would.
pub(crate) async fn flow_run<S: FlowStore>(flows: &Flows<S>, id: i64) -> Result<bool, BoxError> {
    let mut tries = 0;
    let started = loop {
        match flows.start(PayShip, &format!("flow-{id}"), &id).await {
            Err(e) if e.is_retryable() && tries < 20 => tries += 1,
            other => break other?,
        }
    };
    let FlowOutcome::Completed(out) = &started.outcome else {
        return Err(format!("flow of order {id}: {:?}", started.outcome).into());
    };
    ensure(out.get::<i64>(PayShipStep::Ship)? == 2, "flow", id)?;
    Ok(started.replayed)
}

/// Flows at `c` callers: `Flows::start` of a flow of two local steps (`flow`), the same
/// writes by hand (`flow-hand`), and replays of the flows the first completed
/// (`replay-f`).
pub(crate) async fn flows_pass<B: BenchDb>(
    db: &Arc<B>,
    flows: &Flows<B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    // Each lane its own adaptive window, as for the records above.
    let run = |replayed: bool| {
        let f = flows.clone().read_first(ReadFirst::Adaptive);
        move |id| {
            let f = f.clone();
            async move { ensure(flow_run(&f, id).await? == replayed, "flow", id) }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.flow_hand(id).await }
    };
    let names = ["flow", "flow-hand", "replay-f"];
    let ratios = ["flow_vs_hand", "replay_vs_flow"];
    let before = flows.coalesced_starts().claims;
    let line = layer_pass(
        db,
        c,
        args,
        "flows",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await?;
    // How many of the pass's starts went in statements of two or more.
    let coalesced = flows.coalesced_starts().claims - before;
    Ok(format!("{line} starts_coalesced={coalesced}"))
}
