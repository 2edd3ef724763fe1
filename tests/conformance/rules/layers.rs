//! Guarded transitions beside the other layers: sharing a coalescing engine with plain
//! requests, inside idempotency records and flows, and behind another request's lock.

#[allow(unused_imports)]
use super::*;

/// Guarded requests (allowed and refused) and plain ones at once through one engine
/// that coalesces writes: the plain ones go in shared units, the guarded ones alone, and
/// no answer is another's: each applied request is recorded, each refused one wrote
/// nothing.
pub async fn guarded_and_plain_requests_share_a_coalescing_engine<B: Backend>(b: &B) {
    let (e, _, _) = shop(b, 0).await;
    let mut round = 0;
    loop {
        round += 1;
        let base = 10_000 * round;
        let ids: Vec<i64> = (base..base + 96).collect();
        let values: Vec<String> = ids.iter().map(|id| format!("({id}, 5)")).collect();
        b.exec(&format!(
            "INSERT INTO shop_due (id, due) VALUES {}",
            values.join(", ")
        ))
        .await;
        for &id in &ids {
            e.create(id).await.unwrap();
        }
        let gate = Arc::new(tokio::sync::Barrier::new(ids.len()));
        let tasks: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (e, gate) = (e.clone(), gate.clone());
                tokio::spawn(async move {
                    gate.wait().await;
                    let answer = match id % 3 {
                        0 => e.transition(id, Pay, "pay").payload(&4).await,
                        1 => e.transition(id, Pay, "pay").payload(&5).await,
                        _ => e.transition(id, Cancel, "cancel").await,
                    };
                    (id, answer)
                })
            })
            .collect();
        for task in tasks {
            let (id, answer) = task.await.unwrap();
            let history = e.history(id).await.unwrap();
            match (id % 3, answer) {
                (
                    0,
                    Err(Error::Refused {
                        guard: "amount_matches",
                        ..
                    }),
                ) => {
                    assert!(history.is_empty(), "order {id}: refused, yet {history:?}");
                }
                (1, Ok(Outcome::Applied { to: Paid, .. }))
                | (2, Ok(Outcome::Applied { to: Cancelled, .. })) => {
                    assert_eq!(history.len(), 1, "order {id}: applied, yet {history:?}");
                }
                (_, other) => panic!("order {id}: {other:?}"),
            }
        }
        if e.coalesced_writes().units > 0 || !e.store().batches_writes() || round == 20 {
            break;
        }
    }
    if e.store().batches_writes() {
        let coalesced = e.coalesced_writes();
        assert!(
            coalesced.units > 0,
            "no unit carried several plain requests in {round} rounds: the test shows nothing"
        );
        assert_eq!(coalesced.failed, 0, "{coalesced:?}");
    }
}

orderly::flow! {
    /// Shipping an order from a flow: one local step, the guarded transition.
    pub Dispatch {
        kind: "dispatch";
        version: 1;
        steps: DispatchStep {
            Ship: local,
        }
    }
}

/// Guarded transitions inside `Records::run`'s transaction and a flow's local step: the
/// guard and the effect run once per move, never on a replayed record or flow; an
/// effect's failure undoes its own writes and leaves the caller's transaction usable
/// (the work's own write commits without them); a refusal is a stored failure of the
/// record (replayed without judging again) and a failed step of the flow (compensated,
/// the order not moved).
pub async fn guarded_transitions_in_records_and_flows<B: Backend>(b: &B) {
    use orderly::flow::{Ctx, Definition, FlowConfig, FlowOutcome, Flows};
    let (e, guards, effects) = shop(b, 3).await;
    paid_orders(b, &e, &[1, 2, 3, 4, FAILING]).await;
    let ran = (guards.load(SeqCst), effects.load(SeqCst));
    let count = |g: usize, f: usize| (ran.0 + g, ran.1 + f);
    let stock = || b.scalar("SELECT qty FROM shop_stock WHERE sku = 1");
    let records = crate::conformance::idempotency::records(b, Duration::from_secs(30)).await;
    let ship = |id: i64| ship_work::<B>(e.clone(), id);

    let first = records.run("payments", "r-1", &1, ship(1)).await.unwrap();
    assert_eq!((first.outcome, first.replayed), (Ok(2), false));
    let again = records.run("payments", "r-1", &1, ship(1)).await.unwrap();
    assert_eq!((again.outcome, again.replayed), (Ok(2), true));
    assert_eq!((guards.load(SeqCst), effects.load(SeqCst)), count(1, 1));
    assert_eq!(stock().await, 2);

    // The effect took the stock, then failed: its writes undone, the work's own kept.
    let failed = records
        .run("payments", "r-99", &99, ship(FAILING))
        .await
        .unwrap();
    assert_eq!(failed.outcome, Ok(-1));
    assert_eq!(stock().await, 2, "the failed effect's write was kept");
    assert_eq!(version(b, FAILING).await, 1);
    assert_eq!(
        b.scalar(&format!(
            "SELECT COUNT(*) FROM shop_due WHERE id = {}",
            1000 + FAILING
        ))
        .await,
        1,
        "the caller's own write was lost"
    );

    let definition = {
        let e = e.clone();
        Definition::new(Dispatch).local(DispatchStep::Ship, move |conn, ctx: &Ctx<i64>| {
            let e = e.clone();
            Box::pin(async move {
                let id = *ctx.input();
                let moved = e
                    .transition(id, Ship, &format!("ship-{id}"))
                    .within(conn)
                    .await?;
                Ok(moved.version())
            })
        })
    };
    let flows = Flows::new(
        b.store(Duration::from_secs(30)).await,
        FlowConfig::default(),
    )
    .unwrap()
    .register(definition)
    .unwrap();
    for id in [2, 3] {
        for replayed in [false, true] {
            let started = flows
                .start(Dispatch, &format!("f-{id}"), &id)
                .await
                .unwrap();
            assert_eq!(started.replayed, replayed, "order {id}");
            match started.outcome {
                FlowOutcome::Completed(out) => {
                    assert_eq!(out.get::<i64>(DispatchStep::Ship).unwrap(), 2)
                }
                other => panic!("order {id}: {other:?}"),
            }
        }
    }
    assert_eq!((guards.load(SeqCst), effects.load(SeqCst)), count(4, 3));
    assert_eq!(stock().await, 0);

    // None left: refused, in a record (stored, replayed unjudged) and in a flow.
    for replayed in [false, true] {
        let refused = records.run("payments", "r-4", &4, ship(4)).await.unwrap();
        assert_eq!(
            (refused.outcome, refused.replayed),
            (Err("out_of_stock".to_string()), replayed)
        );
    }
    let started = flows.start(Dispatch, "f-4", &4).await.unwrap();
    assert!(
        matches!(&started.outcome, FlowOutcome::Compensated { error, .. } if error.contains("none left")),
        "{:?}",
        started.outcome
    );
    assert_eq!((guards.load(SeqCst), effects.load(SeqCst)), count(6, 3));
    assert_eq!(version(b, 4).await, 1);
    assert_eq!(stock().await, 0);
}

/// What [`ship_work`] answers.
pub(crate) type Shipped_ = Result<orderly::Done<i64, String>, Error>;

/// `Records::run`'s work that ships order `id`: its refusal is the record's terminal
/// failure; an effect's failure is answered by the work, with a write of its own;
/// anything else releases the record.
pub(crate) fn ship_work<B: Backend>(
    e: Shop_<B>,
    id: i64,
) -> impl for<'c> FnOnce(&'c mut <B::S as Store>::Conn) -> orderly::idempotency::Work<'c, Shipped_>
{
    use orderly::{Done, Failure};
    move |conn| {
        Box::pin(async move {
            match e
                .transition(id, Ship, &format!("ship-{id}"))
                .within(&mut *conn)
                .await
            {
                Ok(moved) => Ok(Done::Succeeded(moved.version())),
                Err(Error::Refused { code, .. }) => Ok(Done::Failed(code, Failure::Terminal)),
                Err(Error::RuleFailed { .. }) => {
                    let own = format!("INSERT INTO shop_due (id, due) VALUES ({}, 0)", 1000 + id);
                    B::exec_conn(conn, own)
                        .await
                        .map_err(|source| Error::Database {
                            source,
                            retryable: true,
                        })?;
                    Ok(Done::Succeeded(-1))
                }
                Err(other) => Err(other),
            }
        })
    }
}

orderly::state_machine! {
    /// A tab charged again and again: `Charge` is allowed again once the tab is settled.
    pub Tab {
        states: TabState { Idle, Charging }
        events: TabEvent { Charge, Settle }
        initial: Idle;
        terminal: [];
        rules: TabRules {
            guards: [funds]
            effects: [debit]
        }
        transitions: {
            Idle + Charge [funds] => Charging / debit,
            Charging + Settle => Idle,
        }
    }
}

/// Counts the tab's rules, which read and write nothing.
pub(crate) struct TabCounted(Arc<AtomicUsize>);

impl<C: Send> TabRules<C> for TabCounted {
    async fn funds(&self, _conn: &mut C, _judged: &Judged<'_, Tab>) -> Result<(), Halt> {
        self.0.fetch_add(1, SeqCst);
        Ok(())
    }

    async fn debit(&self, _conn: &mut C, _judged: &Judged<'_, Tab>) -> Result<(), Halt> {
        self.0.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// Holds entity `id`'s row lock in a transaction of the test's own while `request` is
/// sent, then writes `rows` (the holder's unit, by hand) and commits: the request waited
/// on the lock (it had not finished when the holder committed) and is answered after.
pub(crate) async fn behind_the_lock<B: Backend, T: Send + 'static>(
    b: &B,
    id: i64,
    request: impl std::future::Future<Output = T> + Send + 'static,
    rows: &[String],
) -> T {
    let mut holder = b.begin().await;
    B::exec_in(
        &mut holder,
        &format!("UPDATE orders SET version = version WHERE id = {id}"),
    )
    .await;
    let waiting = tokio::spawn(request);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the request did not wait on the lock"
    );
    for row in rows {
        B::exec_in(&mut holder, row).await;
    }
    B::commit(holder).await;
    waiting.await.unwrap()
}

/// A guarded request that waits on the entity's lock while the holder records that very
/// request is judged on what the holder committed: a replay, its rules never run. Along
/// a one-way edge the locked state tells (the order is Shipped); along a repeatable one
/// only the history does: the holder charges the tab and settles it, so the tab is back
/// at Idle, from which the same Charge would be allowed again, and a request judged on a
/// history read older than the lock would run its guard there.
pub async fn guarded_request_behind_the_lock_sees_what_the_holder_recorded<B: Backend>(b: &B) {
    let (e, guards, effects) = shop(b, 10).await;
    paid_orders(b, &e, &[1, 2]).await;
    let ran = (guards.load(SeqCst), effects.load(SeqCst));
    let request = {
        let e = e.clone();
        async move { e.transition(1, Ship, "ship-1").await }
    };
    let history = "INSERT INTO orderly_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES";
    let shipped = behind_the_lock(
        b,
        1,
        request,
        &[
            format!("{history} (1, 2, 'Paid', 'Shipped', 'Ship', 'ship-1')"),
            "UPDATE orders SET status = 'Shipped', version = 2 WHERE id = 1".into(),
        ],
    )
    .await;
    assert_eq!(
        shipped.unwrap(),
        Outcome::Replayed {
            from: Paid,
            to: Shipped,
            version: 2
        }
    );
    assert_eq!(
        (guards.load(SeqCst), effects.load(SeqCst)),
        ran,
        "a rule ran"
    );
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        10
    );

    // An order whose history went where the graph no longer goes (shipped, then taken
    // back to Paid by an edge a later release removed): Ship cannot repeat in the graph,
    // so the unit judges the request unrecorded from the order's state, runs its rules
    // once, loses its write on the history's key, and the attempt after reads the
    // history: a replay, the effect's write undone. (Reading first, the replay is
    // answered before any unit.)
    b.exec(&format!(
        "{history} (2, 2, 'Paid', 'Shipped', 'Ship', 'ship-2'), (2, 3, 'Shipped', 'Paid', 'Return', 'return-2')"
    ))
    .await;
    b.exec("UPDATE orders SET version = 3 WHERE id = 2").await;
    assert_eq!(
        e.transition(2, Ship, "ship-2").await.unwrap(),
        Outcome::Replayed {
            from: Paid,
            to: Shipped,
            version: 2
        }
    );
    let again = (guards.load(SeqCst) - ran.0, effects.load(SeqCst) - ran.1);
    assert!(
        again == (1, 1) || again == (0, 0),
        "the rules ran {again:?} times"
    );
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        10
    );

    let rules = Arc::new(AtomicUsize::new(0));
    let tab = Engine::<Tab, B::S>::new(b.store(Duration::from_secs(30)).await)
        .unwrap()
        .with_rules(RulesOf(TabCounted(Arc::clone(&rules))));
    tab.create(50).await.unwrap();
    let request = {
        let tab = tab.clone();
        async move { tab.transition(50, TabEvent::Charge, "charge-1").await }
    };
    let charged = behind_the_lock(
        b,
        50,
        request,
        &[
            format!(
                "{history} (50, 1, 'Idle', 'Charging', 'Charge', 'charge-1'), (50, 2, 'Charging', 'Idle', 'Settle', 'settle-1')"
            ),
            "UPDATE orders SET version = 2 WHERE id = 50".into(),
        ],
    )
    .await;
    assert_eq!(
        charged.unwrap(),
        Outcome::Replayed {
            from: TabState::Idle,
            to: TabState::Charging,
            version: 1
        }
    );
    assert_eq!(rules.load(SeqCst), 0, "a rule ran");
    // A new charge of the settled tab runs both.
    assert!(
        tab.transition(50, TabEvent::Charge, "charge-2")
            .await
            .unwrap()
            .is_applied()
    );
    assert_eq!(rules.load(SeqCst), 2);
}
