//! The flow test kit (`orderly::testing::flows`): the service example's payment flow run
//! with every fault at every point it records (and random plans of several), and flows
//! written wrong on purpose, each caught with a readable report.

use std::sync::Arc;
use std::time::Instant;

use orderly::SqliteStore;
use orderly::flow::{Ctx, Definition, StepError};
use orderly::testing::flows::{Doubles, Fault, Kit, Plan, Point, Record, Report, When, plans};
use proptest::prelude::*;

#[path = "../examples/service/pay.rs"]
#[allow(dead_code)]
mod pay;

use pay::{Gateway, PayOrder, Payment, pay_order};

/// The kit's keyed double as the payment flow's gateway.
struct Fake(orderly::testing::flows::KeyedFake);

impl Gateway for Fake {
    async fn call(
        &self,
        key: &str,
        answer: impl FnOnce() -> Result<String, String> + Send,
    ) -> Result<String, StepError> {
        self.0.call(key, answer).await.map_err(StepError::from)
    }
}

fn payment_kit(card: &str) -> Kit<SqliteStore, PayOrder, Payment> {
    let payment = Payment {
        order_id: 7,
        card: card.to_string(),
    };
    Kit::sqlite(PayOrder, payment, |doubles: &Doubles| {
        pay_order(&Arc::new(Fake(doubles.keyed("gateway"))))
    })
}

fn reached(report: &Report, text: &str) -> bool {
    report.points.iter().any(|r| r.point.to_string() == text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payment_flow_survives_every_fault_at_every_point() {
    for (card, end) in [("4242", "completed"), ("4000-decline", "compensated")] {
        let began = Instant::now();
        let report = payment_kit(card).exhaustive().await;
        println!(
            "payment flow, card {card}: {} runs over {} points in {:.1?}",
            report.runs,
            report.points.len(),
            began.elapsed()
        );
        report.assert_ok();
        assert_eq!(report.baseline.end.to_string(), end);
        // The points are the runner's records and the gateway's calls.
        assert!(reached(&report, "after claim"), "{report}");
        assert!(reached(&report, "after start of Authorize"), "{report}");
        assert!(reached(&report, "at call of Capture"), "{report}");
        if end == "compensated" {
            assert!(reached(&report, "before failed of Capture"), "{report}");
            assert!(reached(&report, "at call of Authorize (undo)"), "{report}");
            assert!(reached(&report, "after compensated"), "{report}");
        } else {
            // The capture's result completes the flow, in one commit.
            assert!(reached(&report, "after result of Capture"), "{report}");
        }
        // Every fault that fits each point was run: three at a record, four at a call.
        let calls = report
            .points
            .iter()
            .filter(|r| r.point.record == Record::Call)
            .count();
        assert_eq!(report.runs, 1 + 3 * report.points.len() + calls);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_a_call_is_recovered_with_the_same_key() {
    let kit = payment_kit("4242");
    let plan: Plan = "crash at call of Capture #1".parse().unwrap();
    let run = kit.run(&plan).await;
    assert!(run.ok(), "{run}");
    assert_eq!(run.fired, ["crash at call of Capture #1"], "{run}");
    // The capture was called twice with its one key, and took one effect.
    let captures: Vec<_> = run
        .calls
        .iter()
        .filter(|c| c.key.ends_with(":Capture"))
        .collect();
    assert_eq!(captures.len(), 2, "{run}");
    assert_eq!(captures.iter().filter(|c| c.effect).count(), 1, "{run}");
    assert_eq!(captures[0].key, captures[1].key);
    // The second call was the recovery job's: a claim came between them.
    let claims = run
        .trace
        .iter()
        .filter(|r| r.point.record == Record::Claim)
        .count();
    assert_eq!(claims, 2, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_past_the_lease_is_taken_over() {
    let kit = payment_kit("4242");
    let run = kit
        .run(&"hang before result of Authorize #1".parse().unwrap())
        .await;
    assert!(run.ok(), "{run}");
    // The held-up runner's write was refused after the recovery job claimed the flow:
    // the point was reached twice, once by each runner.
    let n = run
        .trace
        .iter()
        .filter(|r| r.point.to_string() == "before result of Authorize")
        .count();
    assert_eq!(n, 2, "{run}");
    // The held-up runner's own answer: its lease was lost.
    assert!(run.answer.contains("lease"), "{run}");
}

#[test]
fn a_plan_reads_back_from_its_text() {
    let text = "crash after start of Capture #1; lost answer at call of Authorize (undo) #2; \
                hang before complete #1; error after claim #3";
    let plan: Plan = text.parse().unwrap();
    assert_eq!(plan.faults.len(), 4);
    assert_eq!(plan.to_string(), text);
    assert_eq!(plan.faults[1].1, Fault::LostAnswer);
    assert_eq!(plan.faults[2].0.point.when, When::Before);
    assert_eq!("none".parse::<Plan>().unwrap(), Plan::none());
    for bad in [
        "crash",
        "explode after claim #1",
        "crash after claim",
        "crash after claim #0",
        "lost answer after start of A #1",
        "crash sideways claim #1",
        "crash after start of  #1",
    ] {
        assert!(bad.parse::<Plan>().is_err(), "{bad}");
    }
}

fn points() -> Vec<Point> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(payment_kit("4242").points())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random plans of up to three faults: proptest shrinks a failing one to its
    /// fewest faults, and its text replays it.
    #[test]
    fn the_payment_flow_survives_random_plans(plan in plans(points(), 3)) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let run = rt.block_on(payment_kit("4242").run(&plan));
        prop_assert!(run.ok(), "{}", run);
    }
}

// Flows written wrong on purpose: the kit must catch each, saying what is wrong.

orderly::flow! {
    pub Order {
        kind: "kit_order";
        version: 1;
        steps: OrderStep { Reserve: keyed + undo, Charge: keyed + undo, }
    }
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Input {
    refuse_charge: bool,
}

/// A flow whose steps call the doubles as `reserve`, `release` and `charge` do.
fn order_kit<F>(refuse_charge: bool, define: F) -> Kit<SqliteStore, Order, Input>
where
    F: Fn(&Doubles) -> Definition<SqliteStore, Input> + Send + Sync + 'static,
{
    Kit::sqlite(Order, Input { refuse_charge }, define)
}

fn charge(
    doubles: &Doubles,
) -> impl for<'c> Fn(&'c Ctx<Input>) -> orderly::idempotency::Work<'c, Result<String, StepError>>
+ Send
+ Sync
+ 'static {
    let bank = doubles.keyed("bank");
    move |ctx: &Ctx<Input>| {
        let bank = bank.clone();
        Box::pin(async move {
            let refuse = ctx.input().refuse_charge;
            bank.call(ctx.key(), || {
                if refuse {
                    Err("declined".into())
                } else {
                    Ok("charged".into())
                }
            })
            .await
            .map_err(StepError::from)
        })
    }
}

fn problems_of(report: &Report) -> String {
    report
        .failures
        .iter()
        .flat_map(|r| r.problems.iter().cloned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_that_is_not_idempotent_is_caught() {
    let kit = order_kit(true, |d: &Doubles| {
        let (stock, release) = (d.keyed("stock"), d.unsafe_fake("release"));
        Definition::new(Order)
            .call(OrderStep::Reserve, move |ctx: &Ctx<Input>| {
                let stock = stock.clone();
                Box::pin(async move {
                    stock
                        .call(ctx.key(), || Ok("held".into()))
                        .await
                        .map_err(StepError::from)
                })
            })
            // Wrong: the release takes no key, so a repeat releases twice.
            .undo_call(OrderStep::Reserve, move |ctx: &Ctx<Input>| {
                let release = release.clone();
                Box::pin(async move {
                    release
                        .call(ctx.key(), || Ok("released".into()))
                        .await
                        .map_err(StepError::from)
                })
            })
            .call(OrderStep::Charge, charge(d))
            .undo_call(OrderStep::Charge, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("refunded") })
            })
    });
    let report = kit.exhaustive().await;
    println!("{report}");
    assert!(!report.ok());
    let problems = problems_of(&report);
    assert!(
        problems.contains("the compensation of step Reserve took its effect 2 times"),
        "{problems}"
    );
    // The report names the plan that shows it, and the plan replays it.
    let failing = report
        .failures
        .iter()
        .find(|r| r.plan.to_string() == "crash at call of Reserve (undo) #1")
        .expect("a crash at the release's call repeats it");
    assert!(!kit.run(&failing.plan).await.ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_changes_per_attempt_is_caught() {
    let kit = order_kit(false, |d: &Doubles| {
        let stock = d.keyed("stock");
        Definition::new(Order)
            .call(OrderStep::Reserve, move |ctx: &Ctx<Input>| {
                let stock = stock.clone();
                Box::pin(async move {
                    // Wrong: a new key each attempt.
                    let key = format!("{}:{}", ctx.key(), ctx.attempt());
                    stock
                        .call(&key, || Ok("held".into()))
                        .await
                        .map_err(StepError::from)
                })
            })
            .undo_call(OrderStep::Reserve, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("released") })
            })
            .call(OrderStep::Charge, charge(d))
            .undo_call(OrderStep::Charge, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("refunded") })
            })
    });
    let report = kit.exhaustive().await;
    let problems = problems_of(&report);
    assert!(
        problems.contains("step Reserve called the keyed double stock with key"),
        "{problems}"
    );
    assert!(
        problems.contains("a key that changes between attempts"),
        "{problems}"
    );
    assert!(
        problems.contains("step Reserve took its effect 2 times"),
        "{problems}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_step_declared_keyed_is_caught() {
    let kit = order_kit(false, |d: &Doubles| {
        let sms = d.unsafe_fake("sms");
        Definition::new(Order)
            // Wrong: declared keyed, but the downstream takes no key.
            .call(OrderStep::Reserve, move |ctx: &Ctx<Input>| {
                let sms = sms.clone();
                Box::pin(async move {
                    sms.call(ctx.key(), || Ok("sent".into()))
                        .await
                        .map_err(StepError::from)
                })
            })
            .undo_call(OrderStep::Reserve, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("nothing") })
            })
            .call(OrderStep::Charge, charge(d))
            .undo_call(OrderStep::Charge, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("refunded") })
            })
    });
    let report = kit.exhaustive().await;
    assert!(!report.ok());
    let problems = problems_of(&report);
    assert!(
        problems.contains("step Reserve is declared keyed, but calls sms"),
        "{problems}"
    );
    assert!(
        problems.contains("step Reserve took its effect 2 times"),
        "{problems}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_treated_as_a_refusal_is_caught() {
    let kit = order_kit(false, |d: &Doubles| {
        let stock = d.keyed("stock");
        Definition::new(Order)
            .call(OrderStep::Reserve, move |ctx: &Ctx<Input>| {
                let stock = stock.clone();
                Box::pin(async move {
                    // Wrong: every error fails the step, also one whose effect was taken.
                    stock
                        .call(ctx.key(), || Ok("held".into()))
                        .await
                        .map_err(StepError::fail)
                })
            })
            .undo_call(OrderStep::Reserve, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("released") })
            })
            .call(OrderStep::Charge, charge(d))
            .undo_call(OrderStep::Charge, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("refunded") })
            })
    });
    let report = kit.exhaustive().await;
    let problems = problems_of(&report);
    assert!(
        problems.contains("the flow ended compensated, where this plan allows completed"),
        "{problems}"
    );
    let run = report
        .failures
        .iter()
        .find(|r| r.plan.to_string() == "lost answer at call of Reserve #1")
        .expect("a lost answer at the reservation");
    assert!(
        run.problems
            .iter()
            .any(|p| p.contains("step Reserve took its effect and was not compensated")),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_step_declared_unsafe_passes_parked_for_reconciliation() {
    orderly::flow! {
        pub Notify {
            kind: "kit_notify";
            version: 1;
            steps: NotifyStep { Mark: local, Send: unsafe + nothing_to_undo, }
        }
    }
    let kit = Kit::sqlite(
        Notify,
        Input {
            refuse_charge: false,
        },
        |d: &Doubles| {
            let sms = d.unsafe_fake("sms");
            Definition::new(Notify)
                .local(NotifyStep::Mark, |_conn, _ctx: &Ctx<Input>| {
                    Box::pin(async { Ok(1) })
                })
                .call(NotifyStep::Send, move |ctx: &Ctx<Input>| {
                    let sms = sms.clone();
                    Box::pin(async move {
                        sms.call(ctx.key(), || Ok("sent".into()))
                            .await
                            .map_err(StepError::from)
                    })
                })
        },
    );
    let report = kit.exhaustive().await;
    report.assert_ok();
    // A crash at the call parks the flow: nobody knows whether the message went.
    let run = kit.run(&"crash at call of Send #1".parse().unwrap()).await;
    assert!(run.ok(), "{run}");
    assert_eq!(run.end.to_string(), "parked (NeedsReconciliation)");
    // The local step committed once, whatever the fault.
    assert!(reached(&report, "after commit of Mark"), "{report}");
}

// Definition versions: flows recorded by one release, checked against the next.

mod ship {
    orderly::flow! {
        pub Ship {
            kind: "kit_ship";
            version: 1;
            steps: ShipStep { Pack: local, Send: keyed + undo, }
        }
    }
}

mod ship_edited {
    // Version 1 edited in place: a step renamed without a new version.
    orderly::flow! {
        pub Ship {
            kind: "kit_ship";
            version: 1;
            steps: ShipStep { Pack: local, Post: keyed + undo, }
        }
    }
}

mod ship_next {
    orderly::flow! {
        pub Ship {
            kind: "kit_ship";
            version: 2;
            steps: ShipStep { Pack: local, Label: local, Send: keyed + undo, }
        }
    }
}

/// A definition whose keyed step is always down: its flows wait for a retry.
macro_rules! waiting_definition {
    ($flow:path, $step:ident, $($local:ident),+) => {{
        use $flow as flow;
        let mut def = Definition::<SqliteStore, i64>::new(flow::Ship);
        $(def = def.local(flow::ShipStep::$local, |_conn, _ctx: &Ctx<i64>| Box::pin(async { Ok(1) }));)+
        def.call(flow::ShipStep::$step, |_ctx: &Ctx<i64>| {
            Box::pin(async { Err::<String, _>(StepError::retry("the carrier is down")) })
        })
        .undo_call(flow::ShipStep::$step, |_ctx: &Ctx<i64>| Box::pin(async { Ok("void") }))
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_flows_are_checked_against_the_next_release() {
    use orderly::flow::{FlowConfig, FlowOutcome, Flows};
    use orderly::testing::flows::versions::{Saved, save, unfinishable};
    use std::time::Duration;

    let name = uuid::Uuid::new_v4().simple().to_string();
    let store = SqliteStore::demo(&format!(
        "sqlite:file:versions-{name}?mode=memory&cache=shared"
    ))
    .await
    .unwrap();
    let config = FlowConfig::default()
        .backoff(Duration::from_secs(60))
        .max_backoff(Duration::from_secs(60));
    let flows = |defs: Vec<Definition<SqliteStore, i64>>| {
        defs.into_iter()
            .try_fold(Flows::new(store.clone(), config).unwrap(), Flows::register)
            .unwrap()
    };
    let v1 = flows(vec![waiting_definition!(ship, Send, Pack)]);
    for i in 0..3 {
        let started = v1
            .start(ship::Ship, &format!("ship-{i}"), &i)
            .await
            .unwrap();
        assert!(
            matches!(started.outcome, FlowOutcome::Waiting { .. }),
            "{started:?}"
        );
    }
    let saved = save(&v1).await.unwrap();
    assert_eq!(saved.len(), 3);
    assert!(
        saved
            .iter()
            .all(|s| s.steps.len() == 2 && s.declared.is_some())
    );
    // Kept beside a test as JSON, and read back.
    let json = serde_json::to_string(&saved).unwrap();
    let saved: Vec<Saved> = serde_json::from_str(&json).unwrap();

    assert_eq!(unfinishable(&v1, &saved), Vec::<String>::new());

    let edited = flows(vec![waiting_definition!(ship_edited, Post, Pack)]);
    let problems = unfinishable(&edited, &saved).join("\n");
    assert!(
        problems.contains("flow kit_ship ship-0 (version 1) recorded step Send at #1, which version 1 now names Post"),
        "{problems}"
    );

    let next = flows(vec![waiting_definition!(ship_next, Send, Pack, Label)]);
    let problems = unfinishable(&next, &saved).join("\n");
    assert!(
        problems.contains("is not registered in this release"),
        "{problems}"
    );

    let both = flows(vec![
        waiting_definition!(ship, Send, Pack),
        waiting_definition!(ship_next, Send, Pack, Label),
    ]);
    assert_eq!(unfinishable(&both, &saved), Vec::<String>::new());
}

// A request's work (`Records::run`), with the same faults and doubles.

mod work {
    use orderly::idempotency::{Done, Failure, Work};
    use orderly::testing::flows::{Doubles, WorkKit};
    use orderly::{Error, SqliteStore};
    use sqlx::SqliteConnection;

    type Kit = WorkKit<SqliteStore, serde_json::Value, String, String>;

    fn db(e: sqlx::Error) -> Error {
        Error::InvalidInput(e.to_string())
    }

    /// A refund: its row (a local effect, committed with the record) and the bank's
    /// refund, by a key made from the request's.
    fn refund(
        d: Doubles,
        conn: &mut SqliteConnection,
    ) -> Work<'_, orderly::Result<Done<String, String>>> {
        Box::pin(async move {
            sqlx::query("CREATE TABLE IF NOT EXISTS refunds (request TEXT PRIMARY KEY)")
                .execute(&mut *conn)
                .await
                .map_err(db)?;
            sqlx::query("INSERT INTO refunds (request) VALUES (?)")
                .bind(d.key())
                .execute(&mut *conn)
                .await
                .map_err(db)?;
            let id = d
                .keyed("bank")
                .call(&format!("refund:{}", d.key()), || Ok("rf_1".into()))
                .await
                .map_err(|e| Error::InvalidInput(e.to_string()))?;
            Ok(Done::Succeeded(id))
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_s_work_survives_every_fault_at_every_point() {
        let kit: Kit = WorkKit::sqlite(serde_json::json!({"amount": 500}), refund);
        let report = kit.exhaustive().await;
        println!(
            "refund work: {} runs over {} points in {:.1?}",
            report.runs,
            report.points.len(),
            report.took
        );
        report.assert_ok();
        let points: Vec<String> = report.points.iter().map(ToString::to_string).collect();
        assert_eq!(
            points,
            [
                "after claim #1",
                "at call of bank #1",
                "before commit #1",
                "after commit #1"
            ]
        );
        // A crash before the commit: the work ran twice, committed once, and the bank
        // refunded once.
        let run = kit.run(&"crash before commit #1".parse().unwrap()).await;
        assert!(run.ok(), "{run}");
        assert_eq!(run.works, 2, "{run}");
        assert_eq!(run.calls.iter().filter(|c| c.effect).count(), 1, "{run}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stored_retryable_failure_runs_again() {
        let kit: Kit = WorkKit::sqlite(
            serde_json::json!({}),
            |_d: Doubles, _conn: &mut SqliteConnection| {
                Box::pin(async {
                    Ok(Done::Failed(
                        "the bank is busy".to_string(),
                        Failure::Retryable,
                    ))
                })
            },
        );
        let report = kit.exhaustive().await;
        report.assert_ok();
        // The repeat after the run ran the work again, as a retryable failure asks.
        assert!(report.baseline.works >= 2, "{}", report.baseline);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stored_refusal_is_replayed() {
        let kit: Kit = WorkKit::sqlite(
            serde_json::json!({"amount": 0}),
            |_d: Doubles, _conn: &mut SqliteConnection| {
                Box::pin(async {
                    Ok(Done::Failed(
                        "nothing to refund".to_string(),
                        Failure::Terminal,
                    ))
                })
            },
        );
        let report = kit.exhaustive().await;
        report.assert_ok();
        assert_eq!(
            report.baseline.outcome.as_deref(),
            Some(r#"{"Err":"nothing to refund"}"#)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unsafe_call_in_a_request_s_work_is_caught() {
        let kit: Kit = WorkKit::sqlite(
            serde_json::json!({}),
            |d: Doubles, _conn: &mut SqliteConnection| {
                Box::pin(async move {
                    // Wrong: the mailer takes no key, and the work runs again after a crash.
                    let sent = d
                        .unsafe_fake("mailer")
                        .call(d.key(), || Ok("sent".into()))
                        .await
                        .map_err(|e| Error::InvalidInput(e.to_string()))?;
                    Ok(Done::Succeeded(sent))
                })
            },
        );
        let report = kit.exhaustive().await;
        assert!(!report.ok());
        let run = report
            .failures
            .iter()
            .find(|r| r.plan.to_string() == "crash before commit #1")
            .expect("a crash before the commit runs the work again");
        assert!(
            run.problems
                .iter()
                .any(|p| p.contains("the work's calls to the unsafe double mailer took 2 effects")),
            "{run}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_made_anew_in_a_request_s_work_is_caught() {
        let kit: Kit = WorkKit::sqlite(
            serde_json::json!({}),
            |d: Doubles, _conn: &mut SqliteConnection| {
                Box::pin(async move {
                    // Wrong: a new key on every run of the work.
                    let key = uuid::Uuid::new_v4().to_string();
                    let id = d
                        .keyed("bank")
                        .call(&key, || Ok("rf".into()))
                        .await
                        .map_err(|e| Error::InvalidInput(e.to_string()))?;
                    Ok(Done::Succeeded(id))
                })
            },
        );
        let report = kit.exhaustive().await;
        let problems: Vec<String> = report
            .failures
            .iter()
            .flat_map(|r| r.problems.clone())
            .collect();
        assert!(
            problems
                .iter()
                .any(|p| p.contains("called the keyed double bank with 2 keys")),
            "{report}"
        );
    }
}

/// proptest shrinks a failing plan to its fewest faults, and the plan's text replays it.
#[test]
fn a_failing_plan_shrinks_to_one_fault_and_replays() {
    use proptest::test_runner::{Config, TestError, TestRunner};

    let kit = order_kit(false, |d: &Doubles| {
        let stock = d.keyed("stock");
        Definition::new(Order)
            .call(OrderStep::Reserve, move |ctx: &Ctx<Input>| {
                let stock = stock.clone();
                Box::pin(async move {
                    // Wrong: a lost answer fails the step, though its effect was taken.
                    stock
                        .call(ctx.key(), || Ok("held".into()))
                        .await
                        .map_err(StepError::fail)
                })
            })
            .undo_call(OrderStep::Reserve, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("released") })
            })
            .call(OrderStep::Charge, charge(d))
            .undo_call(OrderStep::Charge, |_ctx: &Ctx<Input>| {
                Box::pin(async { Ok("refunded") })
            })
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Plans at the two calls: an error or a lost answer at the reservation's first call
    // fails this flow, one fault in eight; 64 plans of one to three all missing it is a
    // chance under one in a million.
    let points: Vec<Point> = rt
        .block_on(kit.points())
        .into_iter()
        .filter(|p| p.record == Record::Call)
        .collect();
    assert_eq!(points.len(), 2);
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&plans(points, 3), |plan| {
        let run = rt.block_on(kit.run(&plan));
        prop_assert!(run.ok(), "{}", run);
        Ok(())
    });
    let Err(TestError::Fail(_, minimal)) = result else {
        panic!("no plan of 64 failed: {result:?}");
    };
    assert!(minimal.faults.len() <= 3, "shrunk to {minimal}");
    // proptest deletes each fault once before it shrinks the others, so its plan may
    // still hold one that is not needed: the kit takes those out, and no single fault
    // of what is left can be dropped.
    let minimal = rt.block_on(kit.minimize(&minimal));
    for i in 0..minimal.faults.len() {
        if minimal.faults.len() == 1 {
            break;
        }
        let mut fewer = minimal.clone();
        fewer.faults.remove(i);
        assert!(
            rt.block_on(kit.run(&fewer)).ok(),
            "{minimal} less its fault {i} still fails"
        );
    }
    let text = minimal.to_string();
    let replayed: Plan = text.parse().unwrap();
    let run = rt.block_on(kit.run(&replayed));
    assert!(!run.ok(), "{run}");
    // An error or a lost answer at the reservation: either way the flow was
    // compensated where it should have completed.
    assert!(
        run.problems
            .iter()
            .any(|p| p.contains("the flow ended compensated, where this plan allows completed")),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_held_up_in_a_recovery_is_taken_over_by_the_next() {
    let kit = payment_kit("4242");
    let plan: Plan = "crash after start of Capture #1; hang after claim #2"
        .parse()
        .unwrap();
    let run = kit.run(&plan).await;
    assert!(run.ok(), "{run}");
    assert_eq!(run.fired.len(), 2, "{run}");
    // The first recovery's runner was held up; a later round claimed the flow.
    let claims = run
        .trace
        .iter()
        .filter(|r| r.point.record == Record::Claim)
        .count();
    assert!(claims >= 3, "{run}");
}

orderly::flow! {
    pub Hold {
        kind: "kit_hold";
        version: 1;
        steps: HoldStep { Reserve: local + undo, Pay: keyed + undo, }
    }
}

/// Local steps writing the application's own rows, checked by a check of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_steps_rows_are_checked_by_the_application_s_check() {
    use orderly::testing::flows::End;

    for refuse in [false, true] {
        let kit = Kit::sqlite(
            Hold,
            Input {
                refuse_charge: refuse,
            },
            |d: &Doubles| {
                let bank = d.keyed("bank");
                Definition::new(Hold)
                    .local(HoldStep::Reserve, |conn, ctx: &Ctx<Input>| {
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
                    .undo_local(HoldStep::Reserve, |conn, ctx: &Ctx<Input>| {
                        Box::pin(async move {
                            sqlx::query("DELETE FROM holds WHERE flow = ?")
                                .bind(ctx.flow_key())
                                .execute(&mut *conn)
                                .await?;
                            Ok(())
                        })
                    })
                    .call(HoldStep::Pay, move |ctx: &Ctx<Input>| {
                        let bank = bank.clone();
                        Box::pin(async move {
                            let refuse = ctx.input().refuse_charge;
                            bank.call(ctx.key(), || {
                                if refuse {
                                    Err("declined".into())
                                } else {
                                    Ok("paid".into())
                                }
                            })
                            .await
                            .map_err(StepError::from)
                        })
                    })
                    .undo_call(HoldStep::Pay, |_ctx: &Ctx<Input>| {
                        Box::pin(async { Ok("refunded") })
                    })
            },
        )
        .after(|store: &SqliteStore, key: &str, end: &End| {
            Box::pin(async move {
                let rows: Result<i64, _> =
                    sqlx::query_scalar("SELECT COUNT(*) FROM holds WHERE flow = ?")
                        .bind(key)
                        .fetch_one(store.pool())
                        .await;
                let want = match end {
                    End::Completed => 1,
                    End::Compensated => 0,
                    _ => return Vec::new(),
                };
                match rows {
                    Ok(n) if n == want => Vec::new(),
                    Ok(n) => vec![format!("the flow ended {end} with {n} holds, not {want}")],
                    Err(e) => vec![format!("the holds could not be counted: {e}")],
                }
            })
        });
        let report = kit.exhaustive().await;
        report.assert_ok();
        let want = if refuse { "compensated" } else { "completed" };
        assert_eq!(report.baseline.end.to_string(), want);
        assert!(reached(&report, "before commit of Reserve"), "{report}");
        assert!(reached(&report, "after commit of Reserve"), "{report}");
        if refuse {
            assert!(
                reached(&report, "after commit of Reserve (undo)"),
                "{report}"
            );
        }
    }
}
