//! The declaration of flows: what `flow!` generates, and the checks it runs (at compile
//! time for the macro, in `tests/ui/flow_*.rs`; here the same checks called directly, as
//! a hand-written `Flow` would be checked).

use orderly::flow::{__check, Flow, StepClass, StepSpec, Undo};

orderly::flow! {
    /// The payment callback: mark the payment, move the order, create the shipping task.
    pub PaymentCallback {
        kind: "payment_callback";
        version: 2;
        steps: PaymentStep {
            MarkPayment:  local,
            MoveOrder:    local + undo,
            NotifyLedger: keyed + nothing_to_undo,
            ShippingTask: unsafe + undo,
        }
    }
}

#[test]
fn the_macro_declares_the_steps_in_order() {
    assert_eq!(PaymentCallback::KIND, "payment_callback");
    assert_eq!(PaymentCallback::VERSION, 2);
    assert_eq!(PaymentCallback::PIVOT, None);
    let steps = PaymentCallback::STEPS;
    assert_eq!(
        steps
            .iter()
            .map(|s| (s.name, s.class, s.undo))
            .collect::<Vec<_>>(),
        [
            ("MarkPayment", StepClass::Local, Undo::None),
            ("MoveOrder", StepClass::Local, Undo::Compensated),
            ("NotifyLedger", StepClass::Keyed, Undo::NothingToUndo),
            ("ShippingTask", StepClass::Unsafe, Undo::Compensated),
        ]
    );
    assert_eq!(PaymentStep::ALL.len(), 4);
    for (i, step) in PaymentStep::ALL.iter().enumerate() {
        assert_eq!(step.index(), i);
        assert_eq!(step.name(), steps[i].name);
    }
}

const fn steps(names: &[&'static str]) -> [StepSpec; 2] {
    [
        StepSpec::declared(names[0], "local", &["undo"]),
        StepSpec::declared(names[1], "keyed", &[]),
    ]
}

#[test]
fn a_pivot_names_the_first_step_only_retried() {
    let s = steps(&["Reserve", "Ship"]);
    assert_eq!(__check::flow("k", 1, &s, Some("Ship")), Some(1));
    // The keyed step is the pivot: it needs no compensation.
    __check::compensable(&s, 1, Some(1), "not reached");
}

#[test]
#[should_panic(expected = "keyed step without undo")]
fn a_keyed_step_before_the_pivot_needs_a_compensation() {
    let s = steps(&["Reserve", "Charge"]);
    __check::compensable(&s, 1, None, "keyed step without undo");
}

#[test]
#[should_panic(expected = "two steps have one name")]
fn step_names_are_unique() {
    __check::flow("k", 1, &steps(&["Same", "Same"]), None);
}

#[test]
#[should_panic(expected = "at least one step")]
fn a_flow_has_steps() {
    __check::flow("k", 1, &[], None);
}

#[test]
#[should_panic(expected = "the pivot names no step")]
fn the_pivot_is_a_step() {
    __check::flow("k", 1, &steps(&["A", "B"]), Some("C"));
}

#[test]
#[should_panic(expected = "versions start at 1")]
fn versions_start_at_one() {
    __check::flow("k", 0, &steps(&["A", "B"]), None);
}

#[test]
#[should_panic(expected = "the kind must be of")]
fn the_kind_is_a_plain_name() {
    __check::flow("create order", 1, &steps(&["A", "B"]), None);
}

#[test]
#[should_panic(expected = "once")]
fn undo_is_declared_once() {
    StepSpec::declared("A", "keyed", &["undo", "nothing_to_undo"]);
}
