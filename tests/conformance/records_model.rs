//! Random sequences of claims, completions, failures, releases, lease and retention
//! expiries and recovery rounds, checked against a reference model of the records table.

use std::time::Duration;

use orderly::{Claim, Claimed, Error, Failure, Reconciled, Records, ScopeConfig, Stored, Stuck};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::Backend;

const KEYS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// Claim key `k` with payload `p` (one of two).
    Claim {
        k: usize,
        p: u8,
    },
    /// The holder `h` (an index into every claim handed out for `k`, latest first)
    /// completes, fails or releases.
    Complete {
        k: usize,
        h: usize,
    },
    Fail {
        k: usize,
        h: usize,
        terminal: bool,
    },
    Release {
        k: usize,
        h: usize,
    },
    /// The record's lease runs out (the database's clock moved on).
    ExpireLease {
        k: usize,
    },
    /// The record's retention runs out.
    ExpireRetention {
        k: usize,
    },
    /// One recovery round: key 0 reconciled as succeeded, 1 as failed terminally, 2
    /// unknown (released).
    Recover,
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    prop_oneof![
        4 => (k.clone(), 0..2u8).prop_map(|(k, p)| Op::Claim { k, p }),
        2 => (k.clone(), 0..3usize).prop_map(|(k, h)| Op::Complete { k, h }),
        1 => (k.clone(), 0..3usize, any::<bool>()).prop_map(|(k, h, terminal)| Op::Fail { k, h, terminal }),
        1 => (k.clone(), 0..3usize).prop_map(|(k, h)| Op::Release { k, h }),
        2 => k.clone().prop_map(|k| Op::ExpireLease { k }),
        1 => k.prop_map(|k| Op::ExpireRetention { k }),
        1 => Just(Op::Recover),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum Status {
    Processing {
        live: bool,
    },
    Succeeded(String),
    Failed {
        result: Option<String>,
        terminal: bool,
    },
}

/// One row of the model table.
#[derive(Debug, Clone)]
struct Row {
    payload: u8,
    status: Status,
    /// Which claim handed out for this key holds the row (`None`: the recovery job).
    owner: Option<usize>,
    attempt: i32,
    expired: bool,
}

/// The model's answer to a claim.
#[derive(Debug, PartialEq)]
enum Said {
    Claimed(i32),
    Replayed(Stored),
    InFlight,
    Mismatch,
}

fn said(answer: Result<Claim, Error>) -> Result<(Said, Option<Claimed>), String> {
    match answer {
        Ok(Claim::Claimed(held)) => Ok((Said::Claimed(held.attempt()), Some(held))),
        Ok(Claim::Replayed(stored)) => Ok((Said::Replayed(stored), None)),
        Err(Error::InFlight { .. }) => Ok((Said::InFlight, None)),
        Err(Error::PayloadMismatch { .. }) => Ok((Said::Mismatch, None)),
        Err(e) => Err(format!("unexpected error {e:?}")),
    }
}

/// Runs `ops` on scope `scope` and on the model; the first disagreement.
async fn check<B: Backend>(
    b: &B,
    r: &Records<B::S>,
    scope: &str,
    ops: &[Op],
) -> Result<(), String> {
    let mut rows: Vec<Option<Row>> = vec![None; KEYS];
    let mut holders: Vec<Vec<Claimed>> = vec![Vec::new(); KEYS];
    let key = |k: usize| format!("m-{k}");
    for (i, op) in ops.iter().enumerate() {
        let at = |what: String| format!("op {i} {op:?}: {what}");
        match *op {
            Op::Claim { k, p } => {
                let (got, held) = said(r.claim(scope, &key(k), &p).await).map_err(at)?;
                let row = &mut rows[k];
                let want = match row.as_mut().filter(|r| !r.expired) {
                    None => {
                        *row = Some(Row {
                            payload: p,
                            status: Status::Processing { live: true },
                            owner: Some(holders[k].len()),
                            attempt: 1,
                            expired: false,
                        });
                        Said::Claimed(1)
                    }
                    Some(r) if r.payload != p => Said::Mismatch,
                    Some(r) => match &r.status {
                        Status::Processing { live: true } => Said::InFlight,
                        Status::Succeeded(result) => {
                            Said::Replayed(Stored::Succeeded(result.clone()))
                        }
                        Status::Failed {
                            result,
                            terminal: true,
                        } => Said::Replayed(Stored::Failed(result.clone())),
                        Status::Processing { live: false } | Status::Failed { .. } => {
                            r.attempt += 1;
                            r.status = Status::Processing { live: true };
                            r.owner = Some(holders[k].len());
                            Said::Claimed(r.attempt)
                        }
                    },
                };
                if got != want {
                    return Err(at(format!("got {got:?}, the model says {want:?}")));
                }
                holders[k].extend(held);
            }
            Op::Complete { k, h } | Op::Fail { k, h, .. } | Op::Release { k, h } => {
                let Some(index) = holders[k].len().checked_sub(1 + h) else {
                    continue;
                };
                let held = &holders[k][index];
                let result = format!("\"r{i}\"");
                let got = match *op {
                    Op::Complete { .. } => r.complete(held, &format!("r{i}")).await,
                    Op::Fail { terminal, .. } => {
                        let kind = if terminal {
                            Failure::Terminal
                        } else {
                            Failure::Retryable
                        };
                        r.fail(held, &format!("r{i}"), kind).await
                    }
                    _ => r.release(held).await,
                };
                let row = rows[k].as_mut().expect("a holder implies a row");
                let target = match *op {
                    Op::Complete { .. } => Status::Succeeded(result),
                    Op::Fail { terminal, .. } => Status::Failed {
                        result: Some(result),
                        terminal,
                    },
                    _ => Status::Failed {
                        result: None,
                        terminal: false,
                    },
                };
                let holds =
                    row.owner == Some(index) && matches!(row.status, Status::Processing { .. });
                // The same write by the same holder, landed before: answered as landed.
                let landed = row.owner == Some(index) && row.status == target;
                let mine = holds || landed;
                match (got, mine) {
                    // Written now (a write landed before changes nothing).
                    (Ok(()), true) if holds => {
                        row.expired = false;
                        row.status = target;
                    }
                    (Ok(()), true) => {}
                    (Err(Error::LeaseLost { .. }), false) => {}
                    (got, _) => {
                        return Err(at(format!(
                            "got {got:?}; the model says the holder {} it",
                            if mine { "holds" } else { "lost" }
                        )));
                    }
                }
            }
            Op::ExpireLease { k } | Op::ExpireRetention { k } => {
                let Some(row) = rows[k].as_mut() else {
                    continue;
                };
                let column = if matches!(op, Op::ExpireLease { .. }) {
                    if let Status::Processing { live } = &mut row.status {
                        *live = false;
                    }
                    "lease_until"
                } else {
                    row.expired = true;
                    "expires_at"
                };
                b.exec(&format!(
                    "UPDATE orderly_idempotency_records SET {column} = {column} - 7200000 \
                     WHERE scope = '{scope}' AND idem_key = '{}'",
                    key(k)
                ))
                .await;
            }
            Op::Recover => {
                let reconciler = |stuck: Stuck| async move {
                    match stuck.held.key() {
                        "m-0" => Reconciled::Succeeded(serde_json::json!("recovered")),
                        "m-1" => Reconciled::Failed(serde_json::json!("lost"), Failure::Terminal),
                        _ => Reconciled::Unknown,
                    }
                };
                let round = r
                    .recover(scope, 10, &reconciler)
                    .await
                    .map_err(|e| at(format!("{e:?}")))?;
                let mut want = 0;
                for (k, row) in rows.iter_mut().enumerate() {
                    let Some(row) = row.as_mut().filter(|r| !r.expired) else {
                        continue;
                    };
                    if row.status != (Status::Processing { live: false }) {
                        continue;
                    }
                    want += 1;
                    row.attempt += 1;
                    row.owner = None;
                    row.status = match k {
                        0 => Status::Succeeded("\"recovered\"".into()),
                        1 => Status::Failed {
                            result: Some("\"lost\"".into()),
                            terminal: true,
                        },
                        _ => Status::Failed {
                            result: None,
                            terminal: false,
                        },
                    };
                }
                if (round.found, round.taken) != (want, want) {
                    return Err(at(format!("recovered {round:?}, the model says {want}")));
                }
            }
        }
    }
    Ok(())
}

/// Invariant: for any sequence of claims, holders' writes (by the current holder or by
/// one fenced out), lease and retention expiries and recovery rounds, every answer is
/// the one the model of the table gives.
pub async fn records_agree_with_the_table_model<B: Backend>(b: &B) {
    let store = b.store(Duration::from_secs(10)).await;
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicUsize::new(0);
    let handle = tokio::runtime::Handle::current();
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        // Each case (and each shrink) has a scope of its own in the same database.
        let scope = format!(
            "model-{}",
            case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let r = Records::new(store.clone())
            .read_first(B::POLICY)
            .scope(
                &scope,
                ScopeConfig::new(Duration::from_secs(600), Duration::from_secs(3600)),
            )
            .unwrap();
        tokio::task::block_in_place(|| handle.block_on(check(b, &r, &scope, &ops)))
            .map_err(TestCaseError::fail)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
}
