//! Who asked for a transition and why: stored with its history row on every write path,
//! read back by `history`, never part of the request's identity, and checked as input.

use std::sync::Arc;

use orderly::{Error, Outcome, Store};

use super::{Backend, OrderEvent::*, OrderState::*, applied, assert_order, engine, replayed};

/// `(actor, reason)` of every history row of `id`, in order.
async fn audit_of<S: orderly::Store>(
    e: &orderly::Engine<super::OrderMachine, S>,
    id: i64,
) -> Vec<(Option<String>, Option<String>)> {
    e.history(id)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.actor, r.reason))
        .collect()
}

fn said(actor: &str, reason: &str) -> (Option<String>, Option<String>) {
    (Some(actor.to_string()), Some(reason.to_string()))
}

/// On the engine's own connection, inside the caller's transaction, and in units
/// coalesced from concurrent callers: each history row carries its own call's actor and
/// reason; a replay by someone else keeps the first call's; a request that says nothing
/// stores NULLs; bad input is refused before any write.
pub async fn who_and_why_are_stored_with_the_history_row<B: Backend>(b: &B) {
    let e = engine(b).await;

    e.create(1).await.unwrap();
    let paid = e
        .transition(1, Pay, "p-1")
        .actor("agent:7")
        .reason("customer called: paid by phone")
        .await
        .unwrap();
    assert_eq!(paid, applied(Created, Paid, 1));
    let again = e
        .transition(1, Pay, "p-1")
        .actor("agent:9")
        .reason("retried")
        .await
        .unwrap();
    assert_eq!(
        again,
        replayed(Created, Paid, 1),
        "not part of the identity"
    );
    e.transition(1, Ship, "s-1").await.unwrap();
    assert_eq!(
        audit_of(&e, 1).await,
        vec![
            said("agent:7", "customer called: paid by phone"),
            (None, None)
        ]
    );

    e.create(2).await.unwrap();
    let mut tx = b.begin().await;
    let paid = e
        .transition(2, Pay, "p-2")
        .actor("svc:checkout")
        .reason("line one\nline two")
        .within(&mut tx)
        .await
        .unwrap();
    assert_eq!(paid, applied(Created, Paid, 1));
    B::commit(tx).await;
    assert_eq!(
        audit_of(&e, 2).await,
        vec![said("svc:checkout", "line one\nline two")]
    );

    // Concurrent callers, whose writes the engine coalesces into shared units where the
    // store batches writes (rounds until at least one unit carried several requests, at
    // most five).
    let e = Arc::new(e);
    let mut next = 100;
    for round in 1..=5 {
        let ids: Vec<i64> = (next..next + 16).collect();
        next += 16;
        for &id in &ids {
            e.create(id).await.unwrap();
        }
        let calls: Vec<_> = ids
            .iter()
            .map(|&id| {
                let e = e.clone();
                tokio::spawn(async move {
                    let (actor, reason) = (format!("user:{id}"), format!("order {id} paid"));
                    e.transition(id, Pay, &format!("p-{id}"))
                        .actor(&actor)
                        .reason(&reason)
                        .await
                })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().unwrap().is_applied());
        }
        for &id in &ids {
            assert_eq!(
                audit_of(&e, id).await,
                vec![said(&format!("user:{id}"), &format!("order {id} paid"))]
            );
        }
        if !e.store().batches_writes() {
            // A store that does not batch writes (a Galera node): each request wrote
            // alone, which the rows above show too.
            assert_eq!(e.coalesced_writes().units, 0);
            break;
        }
        if e.coalesced_writes().units > 0 {
            break;
        }
        assert!(round < 5, "no unit carried several requests in five rounds");
    }

    e.create(3).await.unwrap();
    let long_actor = "a".repeat(256);
    let long_reason = "r".repeat(1001);
    let bad: [(&str, Option<&str>); 6] = [
        ("", None),
        (" agent", None),
        (&long_actor, None),
        ("agent:7", Some("")),
        ("agent:7", Some("nul \0 inside")),
        ("agent:7", Some(&long_reason)),
    ];
    for (actor, reason) in bad {
        let request = e.transition(3, Pay, "p-3").actor(actor);
        let refused = match reason {
            Some(reason) => request.reason(reason).await,
            None => request.await,
        };
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{actor:?} {reason:?}: {refused:?}"
        );
    }
    assert_order(&e, 3, Created, 0, 0).await;
    let at_limit = e
        .transition(3, Pay, "p-3")
        .actor(&long_actor[1..])
        .reason(&long_reason[1..])
        .await
        .unwrap();
    assert!(matches!(at_limit, Outcome::Applied { .. }));
    assert_eq!(
        audit_of(&e, 3).await,
        vec![said(&long_actor[1..], &long_reason[1..])]
    );
}
