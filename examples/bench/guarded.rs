//! The guarded modes: `guarded`, `guard-hand`, `replay-g`.

use std::marker::PhantomData;

use orderly::{Halt, Judged, RulesOf};

use super::*;

/// What every bench order is due; the guard refuses any other amount.
pub(crate) const DUE: i64 = 100;

orderly::state_machine! {
    /// The bench graph's payment, judged by a guard that reads the amount due (one
    /// business row) and followed by an effect that writes a ledger row (one more).
    pub GuardMachine {
        states: GuardState { Created, Paid }
        events: GuardEvent { Pay }
        initial: Created;
        terminal: [Paid];
        rules: GuardRules {
            guards: [amount_due]
            effects: [ledger]
        }
        transitions: {
            Created + Pay [amount_due] => Paid / ledger,
        }
    }
}

/// The bench's rules, on any backend's connection through [`BenchDb`].
pub(crate) struct BenchRules<B>(PhantomData<fn() -> B>);

impl<B: BenchDb> GuardRules<<B::S as Store>::Conn> for BenchRules<B> {
    async fn amount_due(
        &self,
        conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, GuardMachine>,
    ) -> Result<(), Halt> {
        let due = B::due(conn, judged.order_id).await?;
        if due != DUE {
            return Err(Halt::refuse("amount_mismatch", format!("due {due}")));
        }
        Ok(())
    }

    async fn ledger(
        &self,
        conn: &mut <B::S as Store>::Conn,
        judged: &Judged<'_, GuardMachine>,
    ) -> Result<(), Halt> {
        B::ledger(conn, judged.order_id).await?;
        Ok(())
    }
}

/// The guarded engine over `store`.
pub(crate) fn guarded_engine<B: BenchDb>(
    store: B::S,
) -> Result<Engine<GuardMachine, B::S>, BoxError> {
    Ok(Engine::new(store)?.with_rules(RulesOf(BenchRules::<B>(PhantomData))))
}

/// The business tables: every order due [`DUE`], the ledger empty.
pub(crate) async fn guarded_tables<B: BenchDb>(db: &B, orders: i64) -> Result<(), BoxError> {
    db.exec("DROP TABLE IF EXISTS bench_due".into()).await?;
    db.exec("CREATE TABLE bench_due (id BIGINT PRIMARY KEY, due BIGINT NOT NULL)".into())
        .await?;
    db.exec("DROP TABLE IF EXISTS bench_ledger".into()).await?;
    db.exec(
        "CREATE TABLE bench_ledger (order_id BIGINT PRIMARY KEY, amount BIGINT NOT NULL)".into(),
    )
    .await?;
    for chunk in (1..=orders).collect::<Vec<_>>().chunks(1000) {
        let values: Vec<String> = chunk.iter().map(|id| format!("({id}, {DUE})")).collect();
        db.exec(format!(
            "INSERT INTO bench_due (id, due) VALUES {}",
            values.join(", ")
        ))
        .await?;
    }
    Ok(())
}

/// Guarded transitions at `c` callers: `Engine::transition` along an edge with a guard
/// and an effect (`guarded`: a unit of its own, the entity locked, the guard's read, the
/// effect's write), the same work by hand (`guard-hand`: `BEGIN`, `SELECT … FOR
/// UPDATE`, the guard's `SELECT`, the update, the history row, the ledger row,
/// `COMMIT`), and replays of the requests the first applied (`replay-g`: no rule runs).
pub(crate) async fn guarded_pass<B: BenchDb>(
    db: &Arc<B>,
    engine: &Engine<GuardMachine, B::S>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    db.exec("DELETE FROM bench_ledger".into()).await?;
    let run = |replayed: bool| {
        let e = engine.clone();
        move |id| {
            let e = e.clone();
            async move {
                let out = e.transition(id, GuardEvent::Pay, &bench_ref(id)).await?;
                ensure(out.is_applied() != replayed, "guarded", id)
            }
        }
    };
    let d = db.clone();
    let hand = move |id| {
        let d = d.clone();
        async move { d.guarded_hand(id).await }
    };
    let names = ["guarded", "guard-hand", "replay-g"];
    let ratios = ["guarded_vs_hand", "replay_vs_guarded"];
    layer_pass(
        db,
        c,
        args,
        "guarded",
        names,
        ratios,
        (run(false), hand, run(true)),
    )
    .await
}
