//! Flow definitions: versions side by side in a rolling deploy, definitions refused at
//! registration, a step of another flow.

use super::*;

orderly::flow! {
    /// `Shop`'s next version: a runner that knows only it leaves version 1 alone.
    pub ShopV2 {
        kind: "shop";
        version: 2;
        steps: ShopV2Step {
            Insert: local,
        }
    }
}

/// A rolling deploy: a runner that knows only version 2 neither recovers nor starts a
/// version 1 flow, and lists it as unknown; a runner that knows version 1 completes it.
pub async fn flow_unknown_version_is_left_alone<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let lease = Duration::from_millis(300);
    let old = flows(b, &world, lease).await;
    world.panic_at("Reserve:before");
    let o = old.clone();
    assert!(
        tokio::spawn(async move { o.start(Shop, "v1", &order(12)).await })
            .await
            .is_err()
    );
    let w = world.clone();
    let new = Flows::new(b.store(Duration::from_secs(10)).await, config(lease))
        .unwrap()
        .register(
            Definition::new(ShopV2).local(ShopV2Step::Insert, local_action::<B>(&w, "Insert")),
        )
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    assert_eq!(new.recover(10).await.unwrap().taken, 0);
    let listed = new.list(Listing::Stuck, None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].known);
    assert_eq!(listed[0].flow.version, 1);
    assert!(matches!(
        new.start(ShopV2, "v1", &order(12)).await,
        Err(Error::FlowVersion { version: 1, .. })
    ));
    let round = old.recover(10).await.unwrap();
    assert_eq!((round.taken, round.completed), (1, 1));
    assert!(old.list(Listing::Finished, None, 10).await.unwrap()[0].known);
    assert_eq!(effects(b, "v1", "Insert").await, 1);
}

/// Bad definitions and bad input are typed errors before anything is written.
pub async fn flow_bad_definitions_are_rejected<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let store = b.store(Duration::from_secs(10)).await;
    let incomplete = Definition::<B::S, Order>::new(Legacy)
        .local(LegacyStep::Prepare, local_action::<B>(&world, "Prepare"));
    let err = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(incomplete)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("Post has no action") && m.contains("Prepare declares `+ undo`")),
        "{err}"
    );
    let wrong_class =
        legacy::<B>(&world).local(LegacyStep::Post, local_action::<B>(&world, "Post"));
    let err = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(wrong_class)
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("attached with call")),
        "{err}"
    );
    let foreign = legacy::<B>(&world).local(ShopStep::Insert, local_action::<B>(&world, "Insert"));
    assert!(
        Flows::new(store.clone(), FlowConfig::default())
            .unwrap()
            .register(foreign)
            .is_err()
    );
    let twice = Flows::new(store.clone(), FlowConfig::default())
        .unwrap()
        .register(legacy::<B>(&world))
        .unwrap()
        .register(legacy::<B>(&world));
    assert!(matches!(twice, Err(Error::InvalidInput(m)) if m.contains("twice")));
    let zero = FlowConfig::default().attempts(0);
    assert!(Flows::new(store.clone(), zero).is_err());

    let f = flows(b, &world, Duration::from_secs(30)).await;
    for key in ["", " padded", &"k".repeat(300)] {
        assert!(matches!(
            f.start(Shop, key, &order(1)).await,
            Err(Error::InvalidInput(_))
        ));
    }
    assert!(matches!(
        f.start(Shop, "bad-input", &"not an order").await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        f.start(ShopV2, "unregistered", &order(1)).await,
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        f.resume("shop", "nothing", Resume::Retry).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(b.scalar("SELECT COUNT(*) FROM orderly_flows").await, 0);
}

orderly::flow! {
    /// A flow whose first step has the name, position and class of `Shop`'s first: a step
    /// of one is still not a step of the other.
    pub Returns {
        kind: "returns";
        version: 1;
        steps: ReturnsStep {
            Insert: local + undo,
            Refund: local,
        }
    }
}

/// Registration refuses a step of another flow even when it has the name, the position
/// and the class of one of this flow's steps (for an action and for a compensation),
/// naming the problem; the same actions on the flow's own steps register.
pub async fn flow_step_of_another_flow_is_refused<B: Backend>(b: &B) {
    let world = Arc::new(World::default());
    let store = b.store(Duration::from_secs(10)).await;
    let returns = || {
        Definition::<B::S, Order>::new(Returns)
            .local(ReturnsStep::Refund, local_action::<B>(&world, "Refund"))
    };
    let foreign_action = returns()
        .local(ShopStep::Insert, local_action::<B>(&world, "Insert"))
        .undo_local(
            ReturnsStep::Insert,
            local_action::<B>(&world, "Insert:undo"),
        );
    let foreign_undo = returns()
        .local(ReturnsStep::Insert, local_action::<B>(&world, "Insert"))
        .undo_local(ShopStep::Insert, local_action::<B>(&world, "Insert:undo"));
    for (what, def) in [("action", foreign_action), ("compensation", foreign_undo)] {
        let refused = Flows::new(store.clone(), FlowConfig::default())
            .unwrap()
            .register(def);
        assert!(
            matches!(&refused, Err(Error::InvalidInput(m))
                if m.contains("step Insert") && m.contains("another flow") && m.contains("ShopStep")),
            "{what}: {:?}",
            refused.map(drop)
        );
    }
    let own = returns()
        .local(ReturnsStep::Insert, local_action::<B>(&world, "Insert"))
        .undo_local(
            ReturnsStep::Insert,
            local_action::<B>(&world, "Insert:undo"),
        );
    Flows::new(store, FlowConfig::default())
        .unwrap()
        .register(own)
        .unwrap();
    assert_eq!(b.scalar("SELECT COUNT(*) FROM orderly_flows").await, 0);
}
