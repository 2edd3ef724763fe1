//! The deadline storm: client timeouts over new orders.

use super::*;

/// Client timeouts: twice as many callers as the pool has connections, every
/// transition awaited under a deadline of `--deadline-ms` (a client that gives up), over
/// new orders, for `--seconds`. A call the caller stops waiting for is finished off its
/// task, so its connection goes back to the pool warm. Then every request told
/// `Applied` must be recorded (a connection handed on inside a transaction nobody began
/// would lose it), and every request re-sent is answered as the history says. Returns
/// the `deadline …` line: the share of calls answered in time.
pub(crate) async fn deadline_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<OrderMachine, B::S>,
    records: &Records<B::S>,
    flows: &Flows<B::S>,
    args: &Args,
) -> Result<String, BoxError> {
    db.reset().await?;
    let pool = *args.concurrency.iter().max().unwrap_or(&1);
    let callers = 2 * pool;
    let limit = Duration::from_millis(args.deadline_ms);
    let run_for = Duration::from_secs_f64(args.seconds);
    let next = Arc::new(AtomicI64::new(1));
    let start = Instant::now();
    let workers: Vec<_> = (0..callers)
        .map(|_| {
            let (e, next, orders) = (engine.clone(), next.clone(), args.orders);
            tokio::spawn(async move {
                // (order, told Applied in time)
                let mut calls = Vec::new();
                while start.elapsed() < run_for {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id > orders {
                        break;
                    }
                    let r = bench_ref(id);
                    let call = e.transition(id, OrderEvent::Pay, &r).into_future();
                    let applied = match tokio::time::timeout(limit, call).await {
                        Ok(Ok(out)) => Some(out.is_applied()),
                        Ok(Err(e)) if e.is_retryable() => Some(false),
                        Ok(Err(e)) => return Err(BoxError::from(format!("order {id}: {e}"))),
                        Err(_) => None,
                    };
                    calls.push((id, applied));
                }
                Ok(calls)
            })
        })
        .collect();
    let mut calls = Vec::new();
    for w in workers {
        calls.extend(w.await??);
    }
    let in_time = calls.iter().filter(|(_, a)| a.is_some()).count();
    let applied = calls.iter().filter(|(_, a)| *a == Some(true)).count();
    // The calls given up on finish off their callers' tasks; then the history decides.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (id, told) in &calls {
        let again = engine
            .transition(*id, OrderEvent::Pay, &bench_ref(*id))
            .await?;
        if *told == Some(true) {
            ensure(
                matches!(again, Outcome::Replayed { .. }),
                "an acknowledged write lost",
                *id,
            )?;
        }
        ensure(
            engine.get(*id).await?.version == 1,
            "a request applied twice",
            *id,
        )?;
    }
    let (records_calls, records_in_time) = records_storm(records, callers, args).await?;
    db.reset().await?;
    let (flow_calls, flow_in_time) = flows_storm(flows, callers, args).await?;
    println!(
        "#    deadline storm, flows: {callers} callers, {} ms deadlines: {flow_calls} starts, {flow_in_time} answered in time ({:.1} %)",
        args.deadline_ms,
        100.0 * flow_in_time as f64 / flow_calls.max(1) as f64,
    );
    let share = |n: usize| n as f64 / calls.len().max(1) as f64;
    println!(
        "#    deadline storm, records: {callers} callers, {} ms deadlines: {records_calls} runs, {records_in_time} answered in time ({:.1} %)",
        args.deadline_ms,
        100.0 * records_in_time as f64 / records_calls.max(1) as f64,
    );
    println!(
        "#    deadline storm: {callers} callers, pool {pool}, {} ms deadlines: {} calls, {} answered in time ({:.1} %), {} of them Applied",
        args.deadline_ms,
        calls.len(),
        in_time,
        100.0 * share(in_time),
        applied
    );
    Ok(format!(
        "deadline backend={} callers={callers} pool={pool} deadline_ms={} calls={} in_time={:.3} applied_in_time={:.3} records_calls={records_calls} records_in_time={:.3} flow_calls={flow_calls} flow_in_time={:.3}",
        args.backend,
        args.deadline_ms,
        calls.len(),
        share(in_time),
        share(applied),
        records_in_time as f64 / records_calls.max(1) as f64,
        flow_in_time as f64 / flow_calls.max(1) as f64,
    ))
}

/// The same storm over `Records::run` (a claim, empty work, the completion in the
/// work's transaction), new keys, for `--seconds`: how many runs, and how many were
/// answered in time. A run its caller stops waiting for finishes off the caller's task
/// (or is released), so afterwards no record is left held, and every run told it
/// succeeded replays.
async fn records_storm<S: FlowStore>(
    records: &Records<S>,
    callers: usize,
    args: &Args,
) -> Result<(usize, usize), BoxError> {
    let limit = Duration::from_millis(args.deadline_ms);
    let run_for = Duration::from_secs_f64(args.seconds);
    let next = Arc::new(AtomicI64::new(1));
    let start = Instant::now();
    let workers: Vec<_> = (0..callers)
        .map(|_| {
            let (r, next) = (records.clone(), next.clone());
            tokio::spawn(async move {
                // (key, told it succeeded in time)
                let mut calls = Vec::new();
                while start.elapsed() < run_for {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let key = format!("storm-{n}");
                    let run = r.run(SCOPE, &key, &n, |_| {
                        Box::pin(
                            async move { Ok::<_, orderly::Error>(Done::<i64, ()>::Succeeded(n)) },
                        )
                    });
                    let told = match tokio::time::timeout(limit, run).await {
                        Ok(Ok(ran)) => Some(ran.outcome.is_ok()),
                        Ok(Err(e)) if e.is_retryable() => Some(false),
                        Ok(Err(e)) => return Err(BoxError::from(format!("run {key}: {e}"))),
                        Err(_) => None,
                    };
                    calls.push((key, n, told));
                }
                Ok(calls)
            })
        })
        .collect();
    let mut calls = Vec::new();
    for w in workers {
        calls.extend(w.await??);
    }
    let in_time = calls.iter().filter(|c| c.2.is_some()).count();
    // The runs given up on finish (or are released) off their callers' tasks.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut held = 0;
    for (key, n, told) in &calls {
        match records.claim(SCOPE, key, n).await {
            Ok(orderly::Claim::Replayed(_)) => {}
            Ok(orderly::Claim::Claimed(again)) => {
                ensure(*told != Some(true), "a run told it succeeded was lost", *n)?;
                records.release(&again).await?;
            }
            // Left held by a run its caller gave up on (its release failed): counted.
            Err(orderly::Error::InFlight { .. }) => held += 1,
            Err(e) => return Err(e.into()),
        }
    }
    println!(
        "#    records left held by a run given up on: {held} of {}",
        calls.len()
    );
    Ok((calls.len(), in_time))
}

/// The same storm over `Flows::start` of the bench's flow (two local steps, each a
/// transition), over new orders, for `--seconds`: how many starts, and how many were
/// answered in time. A start its caller stops waiting for runs on to its end, so
/// afterwards every flow started is completed (replayed), none left running.
async fn flows_storm<S: FlowStore>(
    flows: &Flows<S>,
    callers: usize,
    args: &Args,
) -> Result<(usize, usize), BoxError> {
    let limit = Duration::from_millis(args.deadline_ms);
    let run_for = Duration::from_secs_f64(args.seconds);
    let next = Arc::new(AtomicI64::new(1));
    let start = Instant::now();
    let orders = args.orders;
    let workers: Vec<_> = (0..callers)
        .map(|_| {
            let (f, next) = (flows.clone(), next.clone());
            tokio::spawn(async move {
                let mut calls = Vec::new();
                while start.elapsed() < run_for {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    if id > orders {
                        break;
                    }
                    let key = format!("flow-{id}");
                    let started = f.start(PayShip, &key, &id);
                    let in_time = match tokio::time::timeout(limit, started).await {
                        Ok(Ok(_)) => true,
                        Ok(Err(e)) if e.is_retryable() => true,
                        Ok(Err(e)) => return Err(BoxError::from(format!("flow {id}: {e}"))),
                        Err(_) => false,
                    };
                    calls.push((id, in_time));
                }
                Ok::<_, BoxError>(calls)
            })
        })
        .collect();
    let mut calls = Vec::new();
    for w in workers {
        calls.extend(w.await??);
    }
    let in_time = calls.iter().filter(|c| c.1).count();
    // The starts given up on run to their ends off their callers' tasks. Under a storm
    // that outruns the pool they queue for its connections, all at once, so the backlog
    // can take far longer to drain than the storm took (a bench that stopped waiting
    // and exited would kill them mid-flow, leaving them RUNNING until their lease ran
    // out and recovery took them over): wait for it, up to two minutes, and say how
    // long it took.
    let drain = Instant::now();
    let settle = drain + Duration::from_secs(120);
    for (id, _) in &calls {
        loop {
            match flows.start(PayShip, &format!("flow-{id}"), id).await {
                Err(e) if e.is_retryable() && Instant::now() < settle => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(started) if matches!(started.outcome, FlowOutcome::Completed(_)) => break,
                other => {
                    return Err(format!("flow {id} after the storm: {other:?}").into());
                }
            }
        }
    }
    println!(
        "#    flows given up on: all completed {:.1} s after the storm",
        drain.elapsed().as_secs_f64()
    );
    Ok((calls.len(), in_time))
}
