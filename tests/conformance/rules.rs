//! Guards and effects: judged and run inside the transition's own unit, after the
//! entity is locked; replays run neither; a refusal, a failure or a panic writes nothing.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use orderly::store::Store;
use orderly::{Engine, EngineConfig, Error, Halt, Judged, Outcome, RulesOf};

use super::Backend;
use super::faults::Networked;
use crate::server::Cut;

orderly::state_machine! {
    /// A shop order whose payment must match what is due and whose shipping takes stock.
    pub Shop {
        states: ShopState { Open, Paid, Shipped, Cancelled }
        events: ShopEvent { Pay, Ship, Cancel }
        initial: Open;
        terminal: [Shipped, Cancelled];
        rules: ShopRules {
            guards: [amount_matches, in_stock]
            effects: [take_stock]
        }
        transitions: {
            Open + Pay [amount_matches] => Paid,
            Paid + Ship [in_stock] => Shipped / take_stock emits ShopShipped,
            Open + Cancel => Cancelled,
        }
    }
}

use ShopEvent::{Cancel, Pay, Ship};
use ShopState::{Cancelled, Open, Paid, Shipped};

/// The order whose effect fails after its write, and the one whose guard panics.
const FAILING: i64 = 99;
const PANICKING: i64 = 98;

/// Counts what ran; reads and writes the test's business tables on the unit's
/// connection.
struct Counted<B> {
    guards: Arc<AtomicUsize>,
    effects: Arc<AtomicUsize>,
    _b: PhantomData<fn() -> B>,
}

impl<B: Backend> ShopRules<<B::S as Store>::Conn> for Counted<B> {
    async fn amount_matches(
        &self,
        conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        self.guards.fetch_add(1, SeqCst);
        if judged.order_id == PANICKING {
            panic!("the guard's own bug");
        }
        let paid: i64 = judged.payload::<i64>()?.unwrap_or(0);
        let due = B::scalar_conn(
            conn,
            format!("SELECT due FROM shop_due WHERE id = {}", judged.order_id),
        )
        .await?;
        if paid != due {
            return Err(Halt::refuse(
                "amount_mismatch",
                format!("paid {paid}, due {due}"),
            ));
        }
        Ok(())
    }

    async fn in_stock(
        &self,
        conn: &mut <B::S as Store>::Conn,
        _judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        self.guards.fetch_add(1, SeqCst);
        // SQLite's unit holds the only write lock; elsewhere the guard locks the row.
        let lock = if <B::S as Store>::BACKEND == "sqlite" {
            ""
        } else {
            " FOR UPDATE"
        };
        let left = B::scalar_conn(
            conn,
            format!("SELECT qty FROM shop_stock WHERE sku = 1{lock}"),
        )
        .await?;
        if left <= 0 {
            return Err(Halt::refuse("out_of_stock", "none left"));
        }
        Ok(())
    }

    async fn take_stock(
        &self,
        conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        B::exec_conn(
            conn,
            "UPDATE shop_stock SET qty = qty - 1 WHERE sku = 1".into(),
        )
        .await?;
        if judged.order_id == FAILING {
            return Err(Halt::failed("the warehouse is down"));
        }
        self.effects.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// Makes the business tables: what each order must pay (none yet) and a stock of one
/// product.
async fn shop_tables<B: Backend>(b: &B, stock: i64) {
    b.exec("DROP TABLE IF EXISTS shop_due").await;
    b.exec("CREATE TABLE shop_due (id BIGINT PRIMARY KEY, due BIGINT NOT NULL)")
        .await;
    b.exec("DROP TABLE IF EXISTS shop_stock").await;
    b.exec("CREATE TABLE shop_stock (sku BIGINT PRIMARY KEY, qty BIGINT NOT NULL)")
        .await;
    b.exec(&format!(
        "INSERT INTO shop_stock (sku, qty) VALUES (1, {stock})"
    ))
    .await;
}

type Shop_<B> = Engine<Shop, <B as Backend>::S>;

/// An engine over `store` with the counted rules.
fn shop_engine<B: Backend>(store: B::S) -> (Shop_<B>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (guards, effects) = (Arc::default(), Arc::default());
    let config = EngineConfig::default()
        .read_first(B::POLICY)
        .deadline(Duration::from_secs(60));
    let engine = Engine::with_config(store, config)
        .unwrap()
        .with_rules(RulesOf(Counted::<B> {
            guards: Arc::clone(&guards),
            effects: Arc::clone(&effects),
            _b: PhantomData,
        }));
    (engine, guards, effects)
}

async fn shop<B: Backend>(b: &B, stock: i64) -> (Shop_<B>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    shop_tables(b, stock).await;
    shop_engine::<B>(b.store(Duration::from_secs(30)).await)
}

/// Creates `ids`, each due 5, and pays each.
async fn paid_orders<B: Backend>(b: &B, e: &Shop_<B>, ids: &[i64]) {
    let values: Vec<String> = ids.iter().map(|id| format!("({id}, 5)")).collect();
    b.exec(&format!(
        "INSERT INTO shop_due (id, due) VALUES {}",
        values.join(", ")
    ))
    .await;
    for &id in ids {
        e.create(id).await.unwrap();
        e.transition(id, Pay, &format!("pay-{id}"))
            .payload(&5)
            .await
            .unwrap();
    }
}

/// What the database holds of the shipments: the stock went down once for each order
/// that moved to Shipped, and each re-sent shipment is answered as the history says
/// (Replayed where it moved, Applied where it did not), after which the same holds.
async fn shipments_agree<B: Backend>(b: &B, e: &Shop_<B>, ids: &[i64], stock: i64) {
    let shipped = b
        .scalar("SELECT COUNT(*) FROM orders WHERE status = 'Shipped'")
        .await;
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        stock - shipped,
        "the stock went down once per shipment"
    );
    for &id in ids {
        let history = e.history(id).await.unwrap();
        let order = e.get(id).await.unwrap();
        assert_eq!(order.version as usize, history.len(), "order {id}");
        let again = e.transition(id, Ship, &format!("ship-{id}")).await.unwrap();
        match history.len() {
            2 => assert!(
                matches!(again, Outcome::Replayed { .. }),
                "order {id}: {again:?}"
            ),
            1 => assert!(
                matches!(again, Outcome::Applied { .. }),
                "order {id}: {again:?}"
            ),
            n => panic!("order {id} has {n} history rows"),
        }
    }
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        stock - ids.len() as i64,
        "every order shipped once, and the stock with it"
    );
}

/// A guarded call dropped at each of its await points, on the engine's connection and
/// inside a caller's transaction: nothing half-written (the stock went down exactly with
/// the moves), the pool clean, and each re-send answered as the history says.
pub async fn guarded_calls_dropped_at_every_await_point<B: Backend>(b: &B) {
    let stock = 1_000;
    shop_tables(b, stock).await;
    let store = b.small_store(1).await;
    let (e, _, _) = shop_engine::<B>(store.clone());
    // Clear of the orders whose rules fail on purpose (98, 99).
    let ids: Vec<i64> = (1000..1240).collect();
    paid_orders(b, &e, &ids).await;
    let mut next = ids.iter().copied();
    let mut dropped = [0usize; 2];
    for (kind, within) in [("own", false), ("in_tx", true)] {
        let (mut k, mut restarts) = (0, 0);
        while k < 60 {
            let Some(id) = next.next() else { break };
            let reference = format!("ship-{id}");
            let done = if within {
                let mut conn = store.acquire().await.unwrap();
                let mut tx = B::begin_on(&mut conn).await;
                let request = e.transition(id, Ship, &reference).within(&mut tx);
                let done = super::faults::poll_at_most(request.into_future(), k).await;
                match done {
                    Some(answer) => {
                        answer.unwrap();
                        B::commit_on(tx).await;
                        Some(())
                    }
                    None => {
                        drop(tx);
                        <B::S as Store>::discard(conn);
                        None
                    }
                }
            } else {
                let request = e.transition(id, Ship, &reference);
                super::faults::poll_at_most(request.into_future(), k)
                    .await
                    .map(|answer| {
                        answer.unwrap();
                    })
            };
            if done.is_some() {
                // Loopback can answer a whole call within one poll now and then; sweep
                // again until this kind was dropped at least once.
                if dropped[usize::from(within)] == 0 && restarts < 20 {
                    (k, restarts) = (0, restarts + 1);
                    continue;
                }
                break;
            }
            dropped[usize::from(within)] += 1;
            k += 1;
        }
        assert!(
            dropped[usize::from(within)] > 0,
            "{kind}: never dropped, so the test shows nothing"
        );
    }
    super::faults::assert_pool_clean(b, &store).await;
    shipments_agree(b, &e, &ids, stock).await;
}

/// A guarded call inside a caller's transaction, dropped after each of its polls in
/// turn (before its savepoint, while it is opened, at the lock, the guard's read, the
/// effect's write, the history insert, the release): the caller wrote a row before the
/// call and writes one after it. The caller's connection answers within 2 s; a commit
/// that succeeds holds both of the caller's rows and the unit whole (shipped with the
/// stock taken) or not at all; a commit that fails holds nothing. Never a commit that
/// lost the first row.
pub async fn a_dropped_guarded_call_keeps_the_callers_writes<B: Backend>(b: &B) {
    let stock = 1_000;
    let (e, ids) = caller_rows_and_orders(b, stock, 2000..2060).await;
    let mut tally = Tally::default();
    for (k, &id) in ids.iter().enumerate() {
        tally.add(cut_call(b, &e, id, DropAt::Polls(k)).await.0);
    }
    assert!(
        tally.dropped > 3,
        "dropped {} times: the test shows nothing",
        tally.dropped
    );
    println!("{tally:?}");
    shipments_agree(b, &e, &ids, stock).await;
}

/// 200 guarded calls inside the caller's transaction, each under a deadline drawn at
/// random up to a call's own time, so that drops land wherever the call happens
/// to be (opening the savepoint, in the guard, in a write, releasing); each checked as
/// in [`a_dropped_guarded_call_keeps_the_callers_writes`].
pub async fn random_deadlines_keep_the_callers_writes<B: Backend>(b: &B) {
    let stock = 1_000;
    let (e, ids) = caller_rows_and_orders(b, stock, 3000..3210).await;
    // A call's own time: the median of the last ten answered (the first ten not cut),
    // so that the deadlines follow the calls as connections warm up.
    let mut times = std::collections::VecDeque::new();
    for &id in &ids[..10] {
        let (answer, took) = cut_call(b, &e, id, DropAt::Never).await;
        times.push_back(took);
        assert_eq!(answer, Became::Answered, "order {id}");
    }
    let mut tally = Tally::default();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut longest = Duration::ZERO;
    for &id in &ids[10..] {
        let mut sorted: Vec<Duration> = times.iter().copied().collect();
        sorted.sort();
        let span = sorted[sorted.len() / 2].as_micros().max(50) as u64;
        // xorshift64: a fixed sequence of fractions of the span.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let deadline = Duration::from_micros(seed % span);
        longest = longest.max(deadline);
        let (became, took) = cut_call(b, &e, id, DropAt::After(deadline)).await;
        if became == Became::Answered {
            times.pop_front();
            times.push_back(took);
        }
        tally.add(became);
    }
    println!("{tally:?} (deadlines up to {longest:?})");
    assert!(
        tally.dropped >= 20 && tally.answered >= 20,
        "{tally:?}: the deadlines cut too few calls, or too many, to show anything"
    );
    shipments_agree(b, &e, &ids, stock).await;
}

/// A shop of `stock` and paid orders `ids`, and the table of the caller's own rows.
async fn caller_rows_and_orders<B: Backend>(
    b: &B,
    stock: i64,
    ids: std::ops::Range<i64>,
) -> (Shop_<B>, Vec<i64>) {
    shop_tables(b, stock).await;
    b.exec("DROP TABLE IF EXISTS caller_rows").await;
    b.exec("CREATE TABLE caller_rows (k BIGINT NOT NULL, what VARCHAR(10) NOT NULL)")
        .await;
    let (e, _, _) = shop_engine::<B>(b.store(Duration::from_secs(10)).await);
    let ids: Vec<i64> = ids.collect();
    paid_orders(b, &e, &ids).await;
    (e, ids)
}

/// Where a call inside the caller's transaction is cut.
#[derive(Clone, Copy, Debug)]
enum DropAt {
    /// Dropped after its k-th poll that did not finish it.
    Polls(usize),
    /// Dropped when the deadline passes.
    After(Duration),
    /// Not cut.
    Never,
}

/// What became of a cut call.
#[derive(Debug, PartialEq)]
enum Became {
    Answered,
    Dropped,
    /// Dropped, and the caller's commit then failed (nothing of the transaction stayed).
    DroppedCommitFailed,
}

#[derive(Debug, Default)]
struct Tally {
    answered: usize,
    dropped: usize,
    commits_failed: usize,
}

impl Tally {
    fn add(&mut self, cut: Became) {
        match cut {
            Became::Answered => self.answered += 1,
            Became::Dropped => self.dropped += 1,
            Became::DroppedCommitFailed => {
                self.dropped += 1;
                self.commits_failed += 1;
            }
        }
    }
}

/// The caller begins, writes a row, makes the guarded call (`Ship`, whose effect takes
/// stock) cut as `cut` says, writes a second row and commits. Checked: the connection
/// answers within 2 s; a commit that succeeds kept both of the caller's rows; one that
/// fails kept nothing, the unit's writes included; an answered call's move committed.
/// Returns what became of the call, and how long it ran.
async fn cut_call<B: Backend>(b: &B, e: &Shop_<B>, id: i64, cut: DropAt) -> (Became, Duration) {
    let insert = |what: &str| format!("INSERT INTO caller_rows (k, what) VALUES ({id}, '{what}')");
    let mut tx = b.begin().await;
    B::exec_in(&mut tx, &insert("before")).await;
    let reference = format!("ship-{id}");
    let call = e
        .transition(id, Ship, &reference)
        .within(&mut tx)
        .into_future();
    let started = std::time::Instant::now();
    let answer = match cut {
        DropAt::Polls(k) => super::faults::poll_at_most(call, k).await,
        DropAt::After(deadline) => tokio::time::timeout(deadline, call).await.ok(),
        DropAt::Never => Some(call.await),
    };
    let took = started.elapsed();
    match &answer {
        None | Some(Ok(Outcome::Applied { .. })) => {}
        Some(other) => panic!("order {id}: {other:?}"),
    }
    let after = tokio::time::timeout(
        Duration::from_secs(2),
        B::exec_conn(&mut tx, insert("after")),
    )
    .await
    .unwrap_or_else(|_| panic!("order {id}, cut {cut:?}: the caller's connection hung"));
    let committed = match after {
        Ok(()) => tokio::time::timeout(Duration::from_secs(2), B::try_commit(tx))
            .await
            .unwrap_or_else(|_| panic!("order {id}, cut {cut:?}: the caller's commit hung")),
        Err(_) => {
            B::rollback(tx).await;
            false
        }
    };
    let rows = b
        .scalar(&format!("SELECT count(*) FROM caller_rows WHERE k = {id}"))
        .await;
    let shipped = e.history(id).await.unwrap().len() == 2;
    if committed {
        assert_eq!(rows, 2, "order {id}, cut {cut:?}: the caller's rows");
    } else {
        assert_eq!((rows, shipped), (0, false), "order {id}: a failed commit");
    }
    let became = match answer {
        Some(_) => {
            assert!(committed && shipped, "order {id}: answered Applied");
            Became::Answered
        }
        None if committed => Became::Dropped,
        None => Became::DroppedCommitFailed,
    };
    (became, took)
}

async fn version<B: Backend>(b: &B, id: i64) -> i64 {
    b.scalar(&format!("SELECT version FROM orders WHERE id = {id}"))
        .await
}

/// A guard refuses with nothing written and the refusal named; an allowed move runs its
/// guard once and a replay runs none; an effect's failure and a guard's panic undo the
/// whole unit and leave the connection clean; inside a caller's transaction the effect
/// commits or rolls back with it.
pub async fn guards_and_effects_run_once_inside_the_unit<B: Backend>(b: &B) {
    let (e, guards, effects) = shop(b, 100).await;
    b.exec("INSERT INTO shop_due (id, due) VALUES (1, 500), (2, 700), (98, 1), (99, 1)")
        .await;
    for id in [1, 2, 98, 99] {
        e.create(id).await.unwrap();
    }

    // Refused: the wrong amount. Nothing written; a re-send is judged afresh.
    let refused = e.transition(1, Pay, "pay-1").payload(&499).await;
    match refused {
        Err(Error::Refused {
            guard,
            code,
            message,
        }) => {
            assert_eq!(
                (guard, code.as_str()),
                ("amount_matches", "amount_mismatch")
            );
            assert_eq!(message, "paid 499, due 500");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        !Error::Refused {
            guard: "g",
            code: "c".into(),
            message: "m".into()
        }
        .is_retryable()
    );
    assert_eq!(version(b, 1).await, 0, "a refusal writes nothing");
    assert!(e.history(1).await.unwrap().is_empty());
    assert_eq!(guards.load(SeqCst), 1);

    let paid = e.transition(1, Pay, "pay-1").payload(&500).await.unwrap();
    assert_eq!(
        paid,
        Outcome::Applied {
            from: Open,
            to: Paid,
            version: 1
        }
    );
    assert_eq!(guards.load(SeqCst), 2);
    let again = e.transition(1, Pay, "pay-1").payload(&500).await.unwrap();
    assert!(matches!(again, Outcome::Replayed { .. }), "{again:?}");
    assert_eq!(guards.load(SeqCst), 2, "a replay runs no guard");

    // The effect runs once with the move, and never on a replay.
    let shipped = e.transition(1, Ship, "ship-1").await.unwrap();
    assert_eq!(
        shipped,
        Outcome::Applied {
            from: Paid,
            to: Shipped,
            version: 2
        }
    );
    assert_eq!(effects.load(SeqCst), 1);
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99
    );
    let again = e.transition(1, Ship, "ship-1").await.unwrap();
    assert!(matches!(again, Outcome::Replayed { .. }), "{again:?}");
    assert_eq!(effects.load(SeqCst), 1, "a replay runs no effect");
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99
    );
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM outbox WHERE entity_id = 1")
            .await,
        1,
        "the emitted event is written with the effect"
    );

    // An effect that fails after its write: the whole unit is undone.
    e.transition(FAILING, Pay, "pay-99")
        .payload(&1)
        .await
        .unwrap();
    match e.transition(FAILING, Ship, "ship-99").await {
        Err(Error::RuleFailed { rule, reason }) => {
            assert_eq!(
                (rule, reason.as_str()),
                ("take_stock", "the warehouse is down")
            );
        }
        other => panic!("expected the effect's failure, got {other:?}"),
    }
    assert_eq!(version(b, FAILING).await, 1, "the entity did not move");
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99,
        "the effect's own write is undone"
    );
    assert_eq!(
        b.scalar(&format!(
            "SELECT COUNT(*) FROM outbox WHERE entity_id = {FAILING}"
        ))
        .await,
        0
    );

    // A guard that panics: caught, the unit undone, the engine's connections clean.
    match e.transition(PANICKING, Pay, "pay-98").payload(&1).await {
        Err(Error::RuleFailed { rule, reason }) => {
            assert_eq!(rule, "amount_matches");
            assert!(reason.contains("the guard's own bug"), "{reason}");
        }
        other => panic!("expected the panic as a failure, got {other:?}"),
    }
    assert_eq!(version(b, PANICKING).await, 0);
    assert_eq!(b.open_transactions().await, 0, "no unit left open");
    let paid = e.transition(2, Pay, "pay-2").payload(&700).await.unwrap();
    assert_eq!(
        paid,
        Outcome::Applied {
            from: Open,
            to: Paid,
            version: 1
        }
    );

    // Inside the caller's transaction: rolled back with it, then committed with it.
    let mut tx = b.begin().await;
    let shipped = e
        .transition(2, Ship, "ship-2")
        .within(&mut tx)
        .await
        .unwrap();
    assert_eq!(
        shipped,
        Outcome::Applied {
            from: Paid,
            to: Shipped,
            version: 2
        }
    );
    B::rollback(tx).await;
    assert_eq!(version(b, 2).await, 1);
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        99
    );
    let mut tx = b.begin().await;
    // A refusal inside the caller's transaction leaves it usable.
    let refused = e
        .transition(2, Pay, "pay-2b")
        .payload(&1)
        .within(&mut tx)
        .await;
    assert!(
        matches!(refused, Err(Error::RefConflict { .. })),
        "{refused:?}"
    );
    e.transition(2, Ship, "ship-2")
        .within(&mut tx)
        .await
        .unwrap();
    B::commit(tx).await;
    assert_eq!(version(b, 2).await, 2);
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        98
    );
    assert_eq!(
        effects.load(SeqCst),
        3,
        "the effect ran in both caller transactions"
    );
}

/// 64 shippers of 64 paid orders against a stock of 10, all at once: exactly 10 move,
/// the rest are refused by the guard reading the locked stock, the stock never goes
/// below zero, and the effect ran once per move.
pub async fn guards_judge_what_the_locked_data_says<B: Backend>(b: &B) {
    let (e, _guards, effects) = shop(b, 10).await;
    let ids: Vec<i64> = (1..=64).collect();
    let values: Vec<String> = ids.iter().map(|id| format!("({id}, 5)")).collect();
    b.exec(&format!(
        "INSERT INTO shop_due (id, due) VALUES {}",
        values.join(", ")
    ))
    .await;
    for &id in &ids {
        e.create(id).await.unwrap();
        e.transition(id, Pay, &format!("pay-{id}"))
            .payload(&5)
            .await
            .unwrap();
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let overlapped = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Barrier::new(ids.len()));
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (e, gate, in_flight, overlapped) = (
                e.clone(),
                gate.clone(),
                in_flight.clone(),
                overlapped.clone(),
            );
            tokio::spawn(async move {
                gate.wait().await;
                if in_flight.fetch_add(1, SeqCst) > 0 {
                    overlapped.fetch_add(1, SeqCst);
                }
                let answer = e.transition(id, Ship, &format!("ship-{id}")).await;
                in_flight.fetch_sub(1, SeqCst);
                answer
            })
        })
        .collect();
    let (mut applied, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(Outcome::Applied { .. }) => applied += 1,
            Err(Error::Refused {
                guard: "in_stock", ..
            }) => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(overlapped.load(SeqCst) > 0, "the shippers never overlapped");
    assert_eq!((applied, refused), (10, 54));
    assert_eq!(
        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await,
        0
    );
    assert_eq!(effects.load(SeqCst), 10);
    assert_eq!(
        b.scalar("SELECT COUNT(*) FROM orders WHERE status = 'Shipped'")
            .await,
        10
    );
}

/// A guarded unit's connection cut at each of its statements, before the server sees it
/// and after the server answered it (its lock, the guard's read, the effect's write, the
/// history insert, the commit): the answer is what the database then holds (Applied
/// only if the shipment is recorded, told by the write id after a cut commit), the
/// stock went down once per shipment, and a re-send is answered as the history says.
pub async fn guarded_unit_cut_at_each_statement<B: Networked>(b: &B) {
    let stock = 100;
    shop_tables(b, stock).await;
    let (direct, _, _) = shop_engine::<B>(b.store(Duration::from_secs(30)).await);
    let commit: &'static [u8] = if <B::S as Store>::BACKEND == "postgres" {
        b"COMMIT"
    } else {
        b"\x03COMMIT"
    };
    let points: [&'static [u8]; 5] = [
        b"FOR UPDATE",
        b"FROM shop_stock",
        b"SET qty",
        b"INSERT INTO",
        commit,
    ];
    let mut ids = Vec::new();
    let mut id = 0;
    for point in points {
        for cut in [Cut::Request(point), Cut::ReplyTo(point)] {
            id += 1;
            ids.push(id);
            paid_orders(b, &direct, &[id]).await;
            let proxy = crate::server::Proxy::start(b.server(), cut).await;
            let (e, _, _) = shop_engine::<B>(b.store_at(proxy.port, 2).await);
            let answer = e.transition(id, Ship, &format!("ship-{id}")).await;
            assert_eq!(
                proxy.cuts(),
                1,
                "{cut:?}: the proxy never cut, so the test shows nothing"
            );
            let recorded = direct.history(id).await.unwrap().len() == 2;
            match answer {
                Ok(Outcome::Applied { .. }) => assert!(recorded, "{cut:?}: Applied, not recorded"),
                Err(e) if e.is_retryable() => {}
                other => panic!("{cut:?}: {other:?} (recorded: {recorded})"),
            }
        }
    }
    shipments_agree(b, &direct, &ids, stock).await;
}

/// The kit's rules for [`rules_agree_with_the_oracle`]: a payment must carry the code
/// `"a"`, shipping needs stock and takes one.
struct KitRules<B>(PhantomData<fn() -> B>);

impl<B: Backend> ShopRules<<B::S as Store>::Conn> for KitRules<B> {
    async fn amount_matches(
        &self,
        _conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        match judged.payload::<String>()?.as_deref() {
            Some("a") => Ok(()),
            _ => Err(Halt::refuse("amount_mismatch", "not the amount due")),
        }
    }

    async fn in_stock(
        &self,
        conn: &mut <B::S as Store>::Conn,
        _judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        // SQLite's unit holds the only write lock; elsewhere the guard locks the row, or
        // two shipments of different orders could both see the last one.
        let lock = if <B::S as Store>::BACKEND == "sqlite" {
            ""
        } else {
            " FOR UPDATE"
        };
        let left = B::scalar_conn(
            conn,
            format!("SELECT qty FROM shop_stock WHERE sku = 1{lock}"),
        )
        .await?;
        if left <= 0 {
            return Err(Halt::refuse("out_of_stock", "none left"));
        }
        Ok(())
    }

    async fn take_stock(
        &self,
        conn: &mut <B::S as Store>::Conn,
        _judged: &Judged<'_, Shop>,
    ) -> Result<(), Halt> {
        B::exec_conn(
            conn,
            "UPDATE shop_stock SET qty = qty - 1 WHERE sku = 1".into(),
        )
        .await?;
        Ok(())
    }
}

/// The model of [`KitRules`]: the stock left.
#[derive(Clone)]
struct StockOracle {
    left: i64,
}

impl orderly::testing::Oracle<Shop> for StockOracle {
    fn guard(&mut self, guard: &'static str, judged: &Judged<'_, Shop>) -> Result<(), String> {
        match guard {
            "amount_matches" if judged.payload == Some("\"a\"") => Ok(()),
            "amount_matches" => Err("amount_mismatch".into()),
            _ if self.left > 0 => Ok(()),
            _ => Err("out_of_stock".into()),
        }
    }

    fn effect(&mut self, _effect: &'static str, _judged: &Judged<'_, Shop>) {
        self.left -= 1;
    }

    fn business(&self) -> String {
        format!("{} left", self.left)
    }
}

/// The business tables, with no stock yet, and an engine with the kit's rules.
async fn kit_engine<B: Backend>(b: &B) -> Shop_<B> {
    shop_tables(b, 0).await;
    Engine::<Shop, _>::with_config(
        b.store(Duration::from_secs(30)).await,
        EngineConfig::default().read_first(B::POLICY),
    )
    .unwrap()
    .with_rules(RulesOf(KitRules::<B>(PhantomData)))
}

/// The kit's `check_rules` over random sequences full of duplicates: every answer is
/// the oracle's (refusals with their codes), and the stock after every step is what the
/// oracle says, so the effect ran once per `Applied` and never on a replay or refusal.
pub async fn rules_agree_with_the_oracle<B: Backend>(b: &B) {
    use proptest::test_runner::{Config, TestRunner};
    let e = kit_engine(b).await;
    let mut runner = TestRunner::new(Config {
        cases: 16,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&orderly::testing::steps::<Shop>(4, 3, 1..40), |seq| {
        let first = 1000 * (1 + case.fetch_add(1, SeqCst));
        let ids: Vec<i64> = (first..first + 4).collect();
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                b.exec("UPDATE shop_stock SET qty = 2 WHERE sku = 1").await;
                for &id in &ids {
                    e.create(id).await.unwrap();
                }
                let mut oracle = StockOracle { left: 2 };
                orderly::testing::check_rules(&e, &ids, first + 4, &seq, &mut oracle, || async {
                    Ok(format!(
                        "{} left",
                        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await
                    ))
                })
                .await
            })
        })
        .map_err(proptest::test_runner::TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}

/// The kit's `check_rules_concurrent` over random sequences on two entities, four
/// requests racing at a time (duplicates among them): every round's answers and the
/// stock after it are those of some order of its requests through the oracle. Some
/// rounds are explained only by an order other than the one they were sent in.
pub async fn rules_agree_with_the_oracle_in_races<B: Backend>(b: &B) {
    use proptest::test_runner::{Config, TestRunner};
    let e = kit_engine(b).await;
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicI64::new(0);
    let reordered = AtomicUsize::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&orderly::testing::steps::<Shop>(2, 2, 4..40), |seq| {
        let first = 1000 * (1 + case.fetch_add(1, SeqCst));
        let ids: Vec<i64> = (first..first + 2).collect();
        tokio::task::block_in_place(|| {
            handle.block_on(async {
                b.exec("UPDATE shop_stock SET qty = 1 WHERE sku = 1").await;
                for &id in &ids {
                    e.create(id).await.unwrap();
                }
                let mut oracle = StockOracle { left: 1 };
                let stock = || async {
                    Ok(format!(
                        "{} left",
                        b.scalar("SELECT qty FROM shop_stock WHERE sku = 1").await
                    ))
                };
                let rounds = orderly::testing::check_rules_concurrent(
                    &e,
                    &ids,
                    first + 2,
                    &seq,
                    4,
                    &mut oracle,
                    stock,
                )
                .await?;
                reordered.fetch_add(rounds, SeqCst);
                Ok::<(), String>(())
            })
        })
        .map_err(proptest::test_runner::TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    eprintln!("{} rounds reordered", reordered.load(SeqCst));
    assert!(
        reordered.load(SeqCst) > 0,
        "no requests overtook one another"
    );
}

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
    let records = super::idempotency::records(b, Duration::from_secs(30)).await;
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
type Shipped_ = Result<orderly::Done<i64, String>, Error>;

/// `Records::run`'s work that ships order `id`: its refusal is the record's terminal
/// failure; an effect's failure is answered by the work, with a write of its own;
/// anything else releases the record.
fn ship_work<B: Backend>(
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
struct TabCounted(Arc<AtomicUsize>);

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
async fn behind_the_lock<B: Backend, T: Send + 'static>(
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
    let history = "INSERT INTO order_transitions (order_id, seq, from_status, to_status, event, ref_id) VALUES";
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
