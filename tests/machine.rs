//! The pure core: the macro beside a hand-written machine, diagrams, and compile-time
//! rejection of unsound graphs.

use orderly::machine::{GraphError, dot, mermaid, validate};
use orderly::{StateMachine, Transition};
use strum::IntoEnumIterator;

orderly::state_machine! {
    /// The order graph, by macro.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Delivered, Cancelled, Refunded }
        events: OrderEvent { Pay, Ship, Deliver, Cancel, Refund }
        initial: Created;
        terminal: [Delivered, Cancelled, Refunded];
        transitions: {
            Created + Pay     => Paid      emits OrderPaid,
            Created + Cancel  => Cancelled,
            Paid    + Ship    => Shipped   emits OrderShipped,
            Paid    + Refund  => Refunded  emits OrderRefunded,
            Shipped + Deliver => Delivered,
        }
    }
}

/// The same graph, by hand: what the macro is sugar for.
mod by_hand {
    use orderly::{StateMachine, Transition};
    use serde::{Deserialize, Serialize};
    use strum::{AsRefStr, Display, EnumIter, EnumString, IntoStaticStr};

    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        Eq,
        Hash,
        Display,
        EnumString,
        AsRefStr,
        IntoStaticStr,
        EnumIter,
        Serialize,
        Deserialize,
    )]
    pub enum State {
        Created,
        Paid,
        Shipped,
        Delivered,
        Cancelled,
        Refunded,
    }

    #[derive(
        Debug,
        Clone,
        Copy,
        PartialEq,
        Eq,
        Hash,
        Display,
        EnumString,
        AsRefStr,
        IntoStaticStr,
        EnumIter,
        Serialize,
        Deserialize,
    )]
    pub enum Event {
        Pay,
        Ship,
        Deliver,
        Cancel,
        Refund,
    }

    pub struct HandMachine;

    impl StateMachine for HandMachine {
        type State = State;
        type Event = Event;
        const NAME: &'static str = "HandMachine";
        const INITIAL: State = State::Created;
        const TERMINAL: &'static [State] = &[State::Delivered, State::Cancelled, State::Refunded];
        const TRANSITIONS: &'static [Transition<State, Event>] = &[
            Transition {
                from: State::Created,
                event: Event::Pay,
                to: State::Paid,
                emits: Some("OrderPaid"),
                guard: None,
                effect: None,
            },
            Transition {
                from: State::Created,
                event: Event::Cancel,
                to: State::Cancelled,
                emits: None,
                guard: None,
                effect: None,
            },
            Transition {
                from: State::Paid,
                event: Event::Ship,
                to: State::Shipped,
                emits: Some("OrderShipped"),
                guard: None,
                effect: None,
            },
            Transition {
                from: State::Paid,
                event: Event::Refund,
                to: State::Refunded,
                emits: Some("OrderRefunded"),
                guard: None,
                effect: None,
            },
            Transition {
                from: State::Shipped,
                event: Event::Deliver,
                to: State::Delivered,
                emits: None,
                guard: None,
                effect: None,
            },
        ];
    }

    /// A hand-written graph with a defect the macro would have refused to compile.
    pub struct Unsound;

    impl StateMachine for Unsound {
        type State = State;
        type Event = Event;
        const NAME: &'static str = "Unsound";
        const INITIAL: State = State::Created;
        const TERMINAL: &'static [State] = &[State::Paid];
        const TRANSITIONS: &'static [Transition<State, Event>] = &[
            Transition {
                from: State::Created,
                event: Event::Pay,
                to: State::Paid,
                emits: None,
                guard: None,
                effect: None,
            },
            Transition {
                from: State::Paid,
                event: Event::Refund,
                to: State::Refunded,
                emits: None,
                guard: None,
                effect: None,
            },
        ];
    }
}

use by_hand::HandMachine;

#[test]
fn macro_and_hand_written_machines_agree() {
    fn names<S: std::fmt::Display, E: std::fmt::Display>(
        t: &Transition<S, E>,
    ) -> (String, String, String, Option<&'static str>) {
        (
            t.from.to_string(),
            t.event.to_string(),
            t.to.to_string(),
            t.emits,
        )
    }
    let by_macro: Vec<_> = OrderMachine::TRANSITIONS.iter().map(names).collect();
    let by_hand: Vec<_> = HandMachine::TRANSITIONS.iter().map(names).collect();
    assert_eq!(by_macro, by_hand);
    assert_eq!(
        OrderMachine::INITIAL.as_ref(),
        HandMachine::INITIAL.as_ref()
    );
    for (s, hs) in OrderState::iter().zip(by_hand::State::iter()) {
        assert_eq!(s.as_ref(), hs.as_ref());
        assert_eq!(OrderMachine::is_terminal(s), HandMachine::is_terminal(hs));
        for (e, he) in OrderEvent::iter().zip(by_hand::Event::iter()) {
            let a = OrderMachine::next(s, e).map(|s| s.to_string());
            let b = HandMachine::next(hs, he).map(|s| s.to_string());
            assert_eq!(a, b, "{s} + {e}");
            assert_eq!(
                OrderMachine::emits(s, e),
                HandMachine::emits(hs, he),
                "{s} + {e}"
            );
        }
    }
    assert_eq!(validate::<OrderMachine>(), Ok(()));
    assert_eq!(validate::<HandMachine>(), Ok(()));
    assert_eq!(
        mermaid::<OrderMachine>(),
        mermaid::<HandMachine>(),
        "same graph, same diagram"
    );
}

#[test]
fn generated_enums_round_trip_names_and_serde() {
    assert_eq!("Paid".parse::<OrderState>().unwrap(), OrderState::Paid);
    assert!("paid".parse::<OrderState>().is_err());
    let name: &'static str = OrderEvent::Refund.into();
    assert_eq!(name, "Refund");
    assert_eq!(
        serde_json::to_string(&OrderState::Shipped).unwrap(),
        "\"Shipped\""
    );
    assert_eq!(
        serde_json::from_str::<OrderEvent>("\"Ship\"").unwrap(),
        OrderEvent::Ship
    );
    assert_eq!(OrderState::iter().count(), 6);
    assert_eq!(OrderEvent::iter().count(), 5);
}

#[tokio::test]
async fn unsound_hand_written_graph_is_refused() {
    assert_eq!(
        validate::<by_hand::Unsound>(),
        Err(GraphError::EdgeOutOfTerminal {
            state: "Paid",
            event: "Refund"
        })
    );
    // A lazy pool never connects: the engine refuses the machine before any I/O.
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
    let err = orderly::Engine::<by_hand::Unsound, _>::new(orderly::SqliteStore::new(
        pool,
        orderly::Tables::new("orders").unwrap(),
    ))
    .unwrap_err();
    assert!(matches!(err, orderly::Error::InvalidMachine(_)), "{err:?}");
}

#[test]
fn diagrams_render_every_edge() {
    let m = mermaid::<OrderMachine>();
    assert!(
        m.starts_with("stateDiagram-v2\n    [*] --> Created\n"),
        "{m}"
    );
    assert!(
        m.contains("    Created --> Paid : Pay / OrderPaid\n"),
        "{m}"
    );
    assert!(m.contains("    Created --> Cancelled : Cancel\n"), "{m}");
    assert!(m.contains("    Shipped --> Delivered : Deliver\n"));
    assert!(m.contains("    Refunded --> [*]\n"));
    assert_eq!(m.lines().count(), 1 + 1 + 5 + 3);
    let d = dot::<OrderMachine>();
    assert!(d.starts_with("digraph OrderMachine {"));
    assert!(d.contains("\"Paid\" -> \"Shipped\" [label=\"Ship / OrderShipped\"];"));
    assert!(d.contains("\"Shipped\" -> \"Delivered\" [label=\"Deliver\"];"));
}

#[test]
fn edges_name_the_events_they_emit() {
    use OrderEvent::*;
    use OrderState::*;
    assert_eq!(OrderMachine::emits(Created, Pay), Some("OrderPaid"));
    assert_eq!(OrderMachine::emits(Paid, Refund), Some("OrderRefunded"));
    // An edge that declares none, and a move the graph does not allow.
    assert_eq!(OrderMachine::emits(Created, Cancel), None);
    assert_eq!(OrderMachine::emits(Paid, Pay), None);
}

orderly::state_machine! {
    /// A machine whose edges name a guard and an effect.
    pub Guarded {
        states: GuardedState { Open, Paid }
        events: GuardedEvent { Pay }
        initial: Open;
        terminal: [Paid];
        rules: GuardedRules {
            guards: [amount_matches]
            effects: [record_payment]
        }
        transitions: {
            Open + Pay [amount_matches] => Paid / record_payment emits Paid,
        }
    }
}

#[test]
fn guards_and_effects_are_on_the_edge_and_in_the_pictures() {
    let edge = Guarded::edge(GuardedState::Open, GuardedEvent::Pay).unwrap();
    assert_eq!(
        (edge.guard, edge.effect, edge.emits),
        (Some("amount_matches"), Some("record_payment"), Some("Paid"))
    );
    assert!(Guarded::has_rules(GuardedEvent::Pay));
    assert!(!OrderMachine::has_rules(OrderEvent::Pay));
    assert!(
        orderly::machine::mermaid::<Guarded>()
            .contains("Open --> Paid : Pay [amount_matches] / record_payment, Paid"),
        "{}",
        orderly::machine::mermaid::<Guarded>()
    );
    assert!(
        orderly::machine::dot::<Guarded>()
            .contains("[label=\"Pay [amount_matches] / record_payment, Paid\"]"),
        "{}",
        orderly::machine::dot::<Guarded>()
    );
}

/// trybuild builds each case against orderly with this run's features, in a target
/// directory of its own, so from scratch. With the `kafka` feature that build takes in
/// librdkafka's C sources and every other optional dependency (about six minutes on two
/// cores), for cases that only the macro answers: the cases run under `cargo test`
/// (default features), and here with `--include-ignored`.
#[test]
#[cfg_attr(
    feature = "kafka",
    ignore = "run by `cargo test` (default features); the macro's answers do not depend on features"
)]
fn macro_rejects_unsound_graphs_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}

orderly::state_machine! {
    /// A checkout whose states carry timers.
    pub Checkout {
        states: CheckoutState { Created, Authorized, Captured, Voided, Cancelled }
        events: CheckoutEvent { Authorize, Capture, Void, Cancel, Remind }
        initial: Created;
        terminal: [Captured, Voided, Cancelled];
        transitions: {
            Created    + Authorize => Authorized,
            Created    + Cancel    => Cancelled,
            Created    + Remind    => Created,
            Authorized + Capture   => Captured,
            Authorized + Void      => Voided,
        }
        timers: {
            Created after 30 min => Cancel,
            Created after 10 minutes => Remind,
            Authorized after 7 days => Void,
        }
    }
}

#[test]
fn timers_are_on_their_states_and_in_the_pictures() {
    use CheckoutEvent::*;
    use CheckoutState::*;
    let created: Vec<(CheckoutEvent, u64)> = Checkout::timers_of(Created)
        .map(|t| (t.event, t.after_ms))
        .collect();
    assert_eq!(created, [(Cancel, 30 * 60_000), (Remind, 10 * 60_000)]);
    assert_eq!(Checkout::timers_of(Captured).count(), 0);
    assert_eq!(Checkout::TIMERS[2].after_ms, 7 * 24 * 3_600_000);
    assert_eq!(OrderMachine::TIMERS, &[]);
    let m = mermaid::<Checkout>();
    assert!(
        m.contains("    Created --> Cancelled : Cancel (after 30 min)\n"),
        "{m}"
    );
    assert!(
        m.contains("    Created --> Created : Remind (after 10 min)\n"),
        "{m}"
    );
    assert!(
        m.contains("    Authorized --> Voided : Void (after 7 days)\n"),
        "{m}"
    );
    assert!(m.contains("    Authorized --> Captured : Capture\n"), "{m}");
    let d = dot::<Checkout>();
    assert!(
        d.contains("\"Authorized\" -> \"Voided\" [label=\"Void (after 7 days)\"];"),
        "{d}"
    );
    use orderly::machine::duration_text;
    assert_eq!(duration_text(1), "1 ms");
    assert_eq!(duration_text(1500), "1500 ms");
    assert_eq!(duration_text(60_000), "1 min");
    assert_eq!(duration_text(3_600_000), "1 h");
    assert_eq!(duration_text(90 * 60_000), "90 min");
    assert_eq!(duration_text(24 * 3_600_000), "1 day");
    assert_eq!(validate::<Checkout>(), Ok(()));
}

/// Checkout's graph with timers written by hand, each wrong in its own way.
mod bad_timers {
    use super::{Checkout, CheckoutEvent, CheckoutState};
    use orderly::{StateMachine, StateTimer, Transition};

    macro_rules! with_timers {
        ($name:ident, $timers:expr) => {
            pub struct $name;
            impl StateMachine for $name {
                type State = CheckoutState;
                type Event = CheckoutEvent;
                const NAME: &'static str = stringify!($name);
                const INITIAL: CheckoutState = Checkout::INITIAL;
                const TERMINAL: &'static [CheckoutState] = Checkout::TERMINAL;
                const TRANSITIONS: &'static [Transition<CheckoutState, CheckoutEvent>] =
                    Checkout::TRANSITIONS;
                const TIMERS: &'static [StateTimer<CheckoutState, CheckoutEvent>] = $timers;
            }
        };
    }

    const fn timer(
        state: CheckoutState,
        event: CheckoutEvent,
        after_ms: u64,
    ) -> StateTimer<CheckoutState, CheckoutEvent> {
        StateTimer {
            state,
            event,
            after_ms,
        }
    }

    with_timers!(
        NoEdge,
        &[timer(
            CheckoutState::Authorized,
            CheckoutEvent::Cancel,
            1000
        )]
    );
    with_timers!(
        Zero,
        &[timer(CheckoutState::Created, CheckoutEvent::Cancel, 0)]
    );
    with_timers!(
        Twice,
        &[
            timer(CheckoutState::Created, CheckoutEvent::Cancel, 1000),
            timer(CheckoutState::Created, CheckoutEvent::Cancel, 2000),
        ]
    );
    with_timers!(
        TooLong,
        &[timer(
            CheckoutState::Created,
            CheckoutEvent::Cancel,
            367 * 24 * 3_600_000
        )]
    );
}

#[test]
fn hand_written_timers_are_checked() {
    let problem = |r: Result<(), GraphError>| match r {
        Err(GraphError::BadTimer { problem, .. }) => problem,
        other => panic!("{other:?}"),
    };
    assert!(problem(validate::<bad_timers::NoEdge>()).contains("no edge"));
    assert!(problem(validate::<bad_timers::Zero>()).contains("1 ms to 366 days"));
    assert!(problem(validate::<bad_timers::TooLong>()).contains("1 ms to 366 days"));
    assert!(problem(validate::<bad_timers::Twice>()).contains("two timers"));
}
