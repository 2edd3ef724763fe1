//! The idempotency layer's modes: `records`, `rec-hand`, `replay-r`, and the storms of
//! identical claims (on the database alone and behind the Redis front).

use super::*;

/// A dialect's statements for the hand-written idempotent request.
pub(crate) struct HandSql {
    /// Inserts the record for `(key, payload hash, token)`, as PROCESSING.
    pub(crate) claim: &'static str,
    /// The transition: `(to, id, from, version)`.
    pub(crate) update: &'static str,
    /// Its history row: `(id, seq, from, to, event, ref)`.
    pub(crate) insert: &'static str,
    /// Completes the record: `(result, key, token)`, fenced by the token.
    pub(crate) complete: &'static str,
}

/// The hand-written idempotent request on `$pool`, its transaction begun by `$begin`.
macro_rules! records_hand {
    ($pool:expr, $begin:expr, $id:expr, $sql:expr) => {{
        use sha2::Digest;
        let (id, sql): (i64, &HandSql) = ($id, $sql);
        let key = format!("key-{id}");
        let token = uuid::Uuid::new_v4().simple().to_string();
        let hash = hex::encode(sha2::Sha256::digest(id.to_string()));
        let n = sqlx::query(sql.claim)
            .bind(&key)
            .bind(&hash)
            .bind(&token)
            .execute($pool)
            .await?
            .rows_affected();
        ensure(n == 1, "records by hand: claim", id)?;
        let mut tx = $begin.await?;
        let n = sqlx::query(sql.update)
            .bind("Paid")
            .bind(id)
            .bind("Created")
            .bind(0_i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        ensure(n == 1, "records by hand: update", id)?;
        sqlx::query(sql.insert)
            .bind(id)
            .bind(1_i64)
            .bind("Created")
            .bind("Paid")
            .bind("Pay")
            .bind(bench_ref(id))
            .execute(&mut *tx)
            .await?;
        let n = sqlx::query(sql.complete)
            .bind(id.to_string())
            .bind(&key)
            .bind(&token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        ensure(n == 1, "records by hand: complete", id)?;
        tx.commit().await?;
        Ok(())
    }};
}

/// The scope of the engine's idempotent requests in the bench.
pub(crate) const SCOPE: &str = "bench";

pub(crate) fn bench_records<S: FlowStore>(store: S) -> Records<S> {
    Records::new(store)
        .scope(
            SCOPE,
            ScopeConfig::new(Duration::from_secs(30), Duration::from_secs(24 * 3600)),
        )
        .expect("a valid scope")
}

/// `Records::run` with the transition of order `id` inside; whether it was replayed.
/// A retryable error (a deadlock between the locking reads of concurrent callers'
/// transactions on MariaDB) is re-sent, as a client would.
pub(crate) async fn records_run<S: FlowStore>(
    records: &Records<S>,
    engine: &Engine<OrderMachine, S>,
    id: i64,
) -> Result<bool, BoxError> {
    let mut tries = 0;
    let ran = loop {
        let e = engine.clone();
        let ran = records
            .run(SCOPE, &format!("key-{id}"), &id, move |tx| {
                Box::pin(async move {
                    let out = e
                        .transition(id, OrderEvent::Pay, &bench_ref(id))
                        .within(tx)
                        .await?;
                    Ok::<_, orderly::Error>(Done::<i64, ()>::Succeeded(out.version()))
                })
            })
            .await;
        match ran {
            Err(e) if e.is_retryable() && tries < 20 => tries += 1,
            other => break other?,
        }
    };
    ensure(ran.outcome == Ok(1), "records", id)?;
    Ok(ran.replayed)
}

/// The idempotency layer at `c` callers: `Records::run` with a transition inside
/// (`records`), the same writes by hand (`rec-hand`), and replays of the requests the
/// first applied (`replay-r`).
pub(crate) async fn records_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<OrderMachine, B::S>,
    records: &Records<B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    // Each lane its own adaptive window (`read_first`), as a service whose traffic is
    // all new requests, or all repeats, would have: each lane measures its own path.
    let run = |replayed: bool| {
        let (r, e) = (
            records.clone().read_first(ReadFirst::Adaptive),
            engine.clone(),
        );
        move |id| {
            let (r, e) = (r.clone(), e.clone());
            async move { ensure(records_run(&r, &e, id).await? == replayed, "records", id) }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.records_hand(id).await }
    };
    let names = ["records", "rec-hand", "replay-r"];
    let ratios = ["records_vs_hand", "replay_vs_records"];
    let before = records.coalesced_claims().claims;
    let line = layer_pass(
        db,
        c,
        args,
        "records",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await?;
    // How many of the pass's claims went in statements of two or more.
    let coalesced = records.coalesced_claims().claims - before;
    Ok(format!("{line} claims_coalesced={coalesced}"))
}

/// Storms of identical claims (as a double-click or a retrying gateway makes), one storm
/// after another for `--seconds`: a request claims, 63 identical ones arrive at once
/// while it runs and are answered in flight, then it completes. Once on the database
/// alone (`storm`), once behind the Redis front (`storm-r`), whose held marker answers
/// the 63. The `vs floor` column is
/// against `storm`; `other us` shows what the database server spent per answer.
pub(crate) async fn storm_pass<S: RecordStore>(
    records: &Records<S>,
    url: &str,
    args: &Args,
    ratios: &mut Vec<String>,
) -> Result<(), BoxError> {
    #[cfg(feature = "redis")]
    {
        let front = records.clone().front(orderly::RedisFront::new(
            url,
            orderly::FrontConfig::default(),
        )?);
        let plain = storms(records, "db", args.seconds).await?;
        let fronted = storms(&front, "redis", args.seconds).await?;
        println!("     (storms of 64 identical claims: the `vs floor` column is against storm)");
        for (mode, s) in [("storm", &plain), ("storm-r", &fronted)] {
            let (client, other) = s.cpu_per_op();
            println!(
                " 64  {mode:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
                s.ops,
                s.throughput(),
                s.percentile(0.5),
                s.percentile(0.99),
                s.throughput() / plain.throughput()
            );
        }
        ratios.push(format!(
            "front backend={} storm_redis_vs_db={:.2} other_cpu_redis_vs_db={:.2}",
            args.backend,
            fronted.throughput() / plain.throughput(),
            fronted.cpu_per_op().1 / plain.cpu_per_op().1.max(1.0)
        ));
        Ok(())
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = (records, url, args, ratios);
        Err("--redis needs the redis feature (use --all-features)".into())
    }
}

/// Storms on `records` for `seconds`: the first claim must be granted, the 63 others
/// answered in flight.
#[cfg(feature = "redis")]
pub(crate) async fn storms<S: RecordStore>(
    records: &Records<S>,
    tag: &str,
    seconds: f64,
) -> Result<Stats, BoxError> {
    let (client0, machine0) = (process_cpu_micros(), machine_cpu_micros());
    let start = Instant::now();
    let mut stats = Stats::default();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < seconds {
        n += 1;
        let key = format!("storm-{tag}-{}-{n}", std::process::id());
        let t = Instant::now();
        let first = records.claim(SCOPE, &key, &"storm").await?;
        stats
            .micros
            .push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        let orderly::Claim::Claimed(held) = first else {
            return Err(format!("storm {key}: the first claim was not granted").into());
        };
        let barrier = Arc::new(tokio::sync::Barrier::new(63));
        let claims: Vec<_> = (0..63)
            .map(|_| {
                let (r, key, barrier) = (records.clone(), key.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let t = Instant::now();
                    let answer = r.claim(SCOPE, &key, &"storm").await;
                    (answer, t.elapsed())
                })
            })
            .collect();
        for claim in claims {
            let (answer, took) = claim.await?;
            stats
                .micros
                .push(took.as_micros().min(u32::MAX as u128) as u32);
            match answer {
                Err(orderly::Error::InFlight { .. }) => {}
                other => return Err(format!("storm: unexpected {other:?}").into()),
            }
        }
        records.complete(&held, &"done").await?;
    }
    stats.secs = start.elapsed().as_secs_f64();
    stats.ops = stats.micros.len() as u64;
    stats.client_cpu = process_cpu_micros() - client0;
    stats.machine_cpu = machine_cpu_micros() - machine0;
    Ok(stats.finish())
}
