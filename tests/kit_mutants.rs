//! The flow kit's mutation suite: one correct three-step flow, written as docs/flows.md
//! shows (Reserve: local + undo; Charge: keyed + undo through a bank; Ship: keyed, the
//! last step, with nothing to undo), run by the kit for a payment that completes, a card declined and a parcel
//! the carrier refuses; then the mistakes real saga code makes, each a mutant the kit
//! must reject with a problem naming the step and the mistake. A key of the user's own,
//! the same on every attempt, is a control the kit must accept.

use orderly::SqliteStore;
use orderly::flow::{Ctx, Definition, Flow, StepError, Undo};
use orderly::testing::flows::{Doubles, End, Finished, Kit, Phase, Report};

orderly::flow! {
    pub Shop {
        kind: "kit_shop";
        version: 1;
        steps: ShopStep { Reserve: local + undo, Charge: keyed + undo, Ship: keyed + nothing_to_undo, }
    }
}

// A mistake in the declaration: the charge says it has nothing to undo.
orderly::flow! {
    pub ShopKept {
        kind: "kit_shop_kept";
        version: 1;
        steps: KeptStep { Reserve: local + undo, Charge: keyed + nothing_to_undo, Ship: keyed + nothing_to_undo, }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug)]
struct Order {
    id: i64,
    card_ok: bool,
    deliverable: bool,
}

const COMPLETES: Order = Order {
    id: 7,
    card_ok: true,
    deliverable: true,
};
const DECLINED: Order = Order {
    id: 7,
    card_ok: false,
    deliverable: true,
};
const UNDELIVERABLE: Order = Order {
    id: 7,
    card_ok: true,
    deliverable: false,
};

/// How the flow's code differs from the correct one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutant {
    /// The correct flow.
    Correct,
    /// Correct, with keys of the user's own: `order-7-charge`, `order-7-refund`.
    StableKey,
    /// Charge turns the bank's error into success.
    SwallowedError,
    /// Charge adds the attempt to its key.
    FreshKey,
    /// Charge calls the bank with no key.
    EmptyKey,
    /// The refund goes through an API that takes no key.
    UnkeyedRefund,
    /// The refund does nothing.
    NoOpRefund,
    /// The refund is sent off on a task of its own, landing after the stock's release.
    LateRefund,
    /// The refund reuses the charge's key.
    RefundWithChargeKey,
    /// Charge fails on every error, a lost answer too.
    LostAnswerFails,
    /// Charge writes a `payments` row through the application's own pool, outside the
    /// step's record.
    PaymentRowOutside,
}

/// The application's own database, beside the kit's: a `payments` table.
async fn app() -> &'static sqlx::SqlitePool {
    static APP: tokio::sync::OnceCell<sqlx::SqlitePool> = tokio::sync::OnceCell::const_new();
    APP.get_or_init(|| async {
        let pool =
            sqlx::SqlitePool::connect("sqlite:file:kit-mutants-app?mode=memory&cache=shared")
                .await
                .unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS payments (flow TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        pool
    })
    .await
}

/// The shop's definition over the run's doubles, as `mutant` writes it.
fn shop<D: Flow + Copy>(
    flow: D,
    steps: [D::Step; 3],
    d: &Doubles,
    m: Mutant,
) -> Definition<SqliteStore, Order> {
    let [reserve, charge, ship] = steps;
    let (bank, refunds, carrier) = (
        d.keyed("bank"),
        d.unsafe_fake("refunds"),
        d.keyed("carrier"),
    );
    let bank_back = bank.clone();
    let def = Definition::new(flow)
        .local(reserve, |conn, ctx: &Ctx<Order>| {
            Box::pin(async move {
                sqlx::query("CREATE TABLE IF NOT EXISTS holds (flow TEXT NOT NULL)")
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("INSERT INTO holds (flow) VALUES (?)")
                    .bind(ctx.flow_key())
                    .execute(&mut *conn)
                    .await?;
                Ok(1)
            })
        })
        .undo_local(reserve, |conn, ctx: &Ctx<Order>| {
            Box::pin(async move {
                sqlx::query("DELETE FROM holds WHERE flow = ?")
                    .bind(ctx.flow_key())
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
        .call(charge, move |ctx: &Ctx<Order>| {
            let bank = bank.clone();
            Box::pin(async move {
                let card_ok = ctx.input().card_ok;
                let key = match m {
                    Mutant::StableKey | Mutant::RefundWithChargeKey => {
                        format!("order-{}-charge", ctx.input().id)
                    }
                    Mutant::FreshKey => format!("{}:{}", ctx.key(), ctx.attempt()),
                    Mutant::EmptyKey => String::new(),
                    _ => ctx.key().to_string(),
                };
                let answer = bank
                    .call(&key, || {
                        if card_ok {
                            Ok("ch_1".into())
                        } else {
                            Err("declined".into())
                        }
                    })
                    .await;
                if m == Mutant::PaymentRowOutside && answer.is_ok() {
                    sqlx::query("INSERT INTO payments (flow) VALUES (?)")
                        .bind(ctx.flow_key())
                        .execute(app().await)
                        .await
                        .map_err(StepError::retry)?;
                }
                match m {
                    Mutant::SwallowedError => Ok(answer.unwrap_or_else(|_| "ch_?".into())),
                    Mutant::LostAnswerFails => answer.map_err(StepError::fail),
                    _ => answer.map_err(StepError::from),
                }
            })
        });
    // A charge declared with nothing to undo takes no compensation.
    let def = if D::STEPS[1].undo != Undo::Compensated {
        def
    } else {
        def.undo_call(charge, move |ctx: &Ctx<Order>| {
            let (bank, refunds) = (bank_back.clone(), refunds.clone());
            Box::pin(async move {
                let refund = || Ok("rf_1".to_string());
                match m {
                    Mutant::NoOpRefund => Ok("refunded".to_string()),
                    Mutant::UnkeyedRefund => refunds
                        .call(ctx.key(), refund)
                        .await
                        .map_err(StepError::from),
                    Mutant::LateRefund => {
                        let key = ctx.key().to_string();
                        tokio::spawn(async move {
                            // Long after the stock's release (which follows at once).
                            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                            let _ = bank.call(&key, refund).await;
                        });
                        Ok("refund sent".to_string())
                    }
                    Mutant::StableKey => {
                        let key = format!("order-{}-refund", ctx.input().id);
                        bank.call(&key, refund).await.map_err(StepError::from)
                    }
                    Mutant::RefundWithChargeKey => {
                        let key = format!("order-{}-charge", ctx.input().id);
                        bank.call(&key, refund).await.map_err(StepError::from)
                    }
                    _ => bank.call(ctx.key(), refund).await.map_err(StepError::from),
                }
            })
        })
    };
    def.call(ship, move |ctx: &Ctx<Order>| {
        let carrier = carrier.clone();
        Box::pin(async move {
            let deliverable = ctx.input().deliverable;
            let key = match m {
                Mutant::StableKey => format!("order-{}-ship", ctx.input().id),
                _ => ctx.key().to_string(),
            };
            carrier
                .call(&key, || {
                    if deliverable {
                        Ok("parcel_1".into())
                    } else {
                        Err("no such address".into())
                    }
                })
                .await
                .map_err(StepError::from)
        })
    })
}

/// The end each input must reach.
fn end_of(order: Order) -> End {
    if order.card_ok && order.deliverable {
        End::Completed
    } else {
        End::Compensated
    }
}

/// The kit over the shop, told the end of `order`, checking the holds a run left.
fn kit(order: Order, m: Mutant) -> Kit<SqliteStore, Shop, Order> {
    let steps = [ShopStep::Reserve, ShopStep::Charge, ShopStep::Ship];
    Kit::sqlite(Shop, order, move |d: &Doubles| shop(Shop, steps, d, m))
        .expect(end_of(order))
        .after(|store: &SqliteStore, key: &str, end: &End| {
            Box::pin(async move {
                let want = match end {
                    End::Completed => 1,
                    End::Compensated => 0,
                    _ => return Vec::new(),
                };
                let n: Result<i64, _> =
                    sqlx::query_scalar("SELECT COUNT(*) FROM holds WHERE flow = ?")
                        .bind(key)
                        .fetch_one(store.pool())
                        .await;
                match n {
                    Ok(n) if n == want => Vec::new(),
                    Ok(n) => vec![format!("the flow ended {end} with {n} holds, not {want}")],
                    Err(e) => vec![format!("the holds could not be counted: {e}")],
                }
            })
        })
}

/// Every problem of every failing run.
fn problems_of(report: &Report) -> String {
    let all: Vec<&str> = report
        .failures
        .iter()
        .flat_map(|r| r.problems.iter().map(String::as_str))
        .collect();
    all.join("\n")
}

/// The kit rejects `m` with `order`, with a problem holding every one of `words`.
async fn rejected(order: Order, m: Mutant, words: &[&str]) -> Report {
    let report = kit(order, m).exhaustive().await;
    assert!(!report.ok(), "{m:?} with {order:?} passed:\n{report}");
    let problems = problems_of(&report);
    assert!(
        problems
            .lines()
            .any(|p| words.iter().all(|w| p.contains(w))),
        "{m:?} with {order:?}: no problem says {words:?}:\n{problems}"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_flow_passes_every_input() {
    for order in [COMPLETES, DECLINED, UNDELIVERABLE] {
        let report = kit(order, Mutant::Correct).exhaustive().await;
        report.assert_ok();
        assert_eq!(report.baseline.end, end_of(order), "{report}");
        assert!(report.runs > 10, "{report}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stable_key_of_the_user_s_own_passes() {
    for order in [COMPLETES, DECLINED, UNDELIVERABLE] {
        let report = kit(order, Mutant::StableKey).exhaustive().await;
        report.assert_ok();
        // The calls carried the user's keys, and were the steps' own.
        let calls = &report.baseline.calls;
        assert!(
            calls
                .iter()
                .any(|c| c.key == "order-7-charge" && c.step.as_deref() == Some("Charge")),
            "{report}"
        );
    }
    // A fault at the call is planned by the step's name, whatever the key.
    let run = kit(COMPLETES, Mutant::StableKey)
        .run(&"lost answer at call of Charge #1".parse().unwrap())
        .await;
    assert!(run.ok(), "{run}");
    assert_eq!(run.fired.len(), 1, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_with_nothing_to_undo_is_caught() {
    let steps = [KeptStep::Reserve, KeptStep::Charge, KeptStep::Ship];
    let kit = Kit::sqlite(ShopKept, UNDELIVERABLE, move |d: &Doubles| {
        shop(ShopKept, steps, d, Mutant::Correct)
    })
    .expect(End::Compensated);
    let report = kit.exhaustive().await;
    let problems = problems_of(&report);
    assert!(
        problems
            .contains("step Charge took its effect (a call to bank) and declares nothing to undo"),
        "{report}"
    );
    // Told the effect may stay, the kit accepts it.
    kit.may_stay(KeptStep::Charge)
        .exhaustive()
        .await
        .assert_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_swallowed_as_success_is_caught() {
    // With the card declined, the run with no fault already ships unpaid.
    let report = rejected(
        DECLINED,
        Mutant::SwallowedError,
        &["none of step Charge's calls (bank) took its effect"],
    )
    .await;
    assert!(!report.baseline.ok(), "{report}");
    assert!(
        report.baseline.problems[0].contains("ended completed, where the kit expects compensated"),
        "{report}"
    );
    // With a good card, a fault at the bank's call does.
    rejected(
        COMPLETES,
        Mutant::SwallowedError,
        &["step Charge", "turns an error into success"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_changes_per_attempt_is_caught() {
    rejected(
        COMPLETES,
        Mutant::FreshKey,
        &["step Charge", "changes between attempts"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_key_is_caught() {
    rejected(
        COMPLETES,
        Mutant::EmptyKey,
        &["step Charge", "with an empty key"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_without_a_key_is_caught() {
    rejected(
        UNDELIVERABLE,
        Mutant::UnkeyedRefund,
        &["step Charge is declared keyed, but its compensation calls refunds"],
    )
    .await;
    rejected(
        UNDELIVERABLE,
        Mutant::UnkeyedRefund,
        &["the compensation of step Charge took its effect 2 times"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_does_nothing_is_caught() {
    rejected(
        UNDELIVERABLE,
        Mutant::NoOpRefund,
        &["step Charge took its effect and was not compensated"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_landing_after_the_release_is_caught() {
    let report = kit(UNDELIVERABLE, Mutant::LateRefund).exhaustive().await;
    assert!(!report.ok(), "{report}");
    let problems = problems_of(&report);
    assert!(
        problems.contains("the compensations ran in the order Reserve, Charge")
            || problems.contains("step Charge took its effect and was not compensated"),
        "{problems}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_with_the_charge_s_key_is_caught() {
    rejected(
        UNDELIVERABLE,
        Mutant::RefundWithChargeKey,
        &["step Charge and the compensation of step Charge called the keyed double bank with the same key"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_treated_as_a_refusal_is_caught() {
    rejected(
        COMPLETES,
        Mutant::LostAnswerFails,
        &["step Charge took its effect and was not compensated"],
    )
    .await;
}

/// A failing report lists each problem once, first found first, with the runs' own flow
/// keys written `kit-…` so that the same mistake in many runs is one line, and then each
/// run that first showed a problem, in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_report_groups_its_problems() {
    let report = kit(COMPLETES, Mutant::FreshKey).exhaustive().await;
    let text = report.to_string();
    let (grouped, runs) = text.split_once("\nplan:").expect("a run in full");
    let listed: Vec<&str> = grouped
        .lines()
        .filter(|l| {
            l.split_once(". ")
                .is_some_and(|(n, _)| n.parse::<usize>().is_ok())
        })
        .collect();
    let mut unique = listed.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), listed.len(), "{grouped}");
    let changed = listed
        .iter()
        .position(|l| l.contains("changes between attempts"))
        .expect("the changing key, listed");
    assert!(
        listed[changed].contains("kit_shop:kit-…:Charge:1"),
        "{grouped}"
    );
    let times: usize = grouped
        .lines()
        .nth(grouped.lines().position(|l| l == listed[changed]).unwrap() + 1)
        .and_then(|l| l.trim().strip_prefix("in "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("how many runs show it");
    assert!(times > 1, "{grouped}");
    assert!(runs.contains("replay: kit.run("), "{runs}");
    let in_full: usize = report
        .failures
        .iter()
        .map(|r| r.to_string().lines().count())
        .sum();
    assert!(
        text.lines().count() < in_full,
        "{} lines, {in_full} for every run in full",
        text.lines().count()
    );
}

/// A `payments` row written through the application's pool inside Charge is outside
/// the kit's sight; a check of the user's own given the run's calls (`Kit::after_run`)
/// holds the rows against the charges the bank kept, and catches the row written again
/// when Charge is run again, and the row left behind when the flow is compensated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_row_written_outside_the_step_s_record_is_caught_by_an_after_run_check() {
    let checked = |order: Order| {
        kit(order, Mutant::PaymentRowOutside).after_run(|run: Finished<'_, SqliteStore>| {
            Box::pin(async move {
                let kept = |phase: Phase| {
                    run.calls
                        .iter()
                        .filter(|c| c.effect && c.double == "bank" && c.step.as_deref() == Some("Charge") && c.phase == phase)
                        .count() as i64
                };
                let charges = kept(Phase::Forward) - kept(Phase::Undo);
                let rows: Result<i64, _> = sqlx::query_scalar("SELECT COUNT(*) FROM payments WHERE flow = ?")
                    .bind(run.key)
                    .fetch_one(app().await)
                    .await;
                match rows {
                    Ok(rows) if rows == charges => Vec::new(),
                    Ok(rows) => vec![format!(
                        "step Charge left {rows} payments rows where the bank keeps {charges} charges"
                    )],
                    Err(e) => vec![format!("the payments could not be counted: {e}")],
                }
            })
        })
    };
    // With no fault the payment completes with its one row; a fault that runs Charge
    // again writes a second.
    let report = checked(COMPLETES).exhaustive().await;
    assert!(report.baseline.ok(), "{report}");
    let problems = problems_of(&report);
    assert!(
        problems.contains("step Charge left 2 payments rows where the bank keeps 1 charges"),
        "{report}"
    );
    // Refunded, the row stays.
    let report = checked(UNDELIVERABLE).exhaustive().await;
    assert!(
        report
            .baseline
            .problems
            .iter()
            .any(|p| p.contains("step Charge left 1 payments rows where the bank keeps 0 charges")),
        "{report}"
    );
}
