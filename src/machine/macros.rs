//! [`state_machine!`](crate::state_machine): the declaration users write; the
//! compile-time checks it runs are in `check.rs`.

/// Declares a state machine: the state and event enums, the `const` transition table and
/// the [`StateMachine`](crate::StateMachine) impl, with the graph checked at compile time.
///
/// ```
/// orderly::state_machine! {
///     /// The life of an order.
///     pub OrderMachine {
///         states: OrderState { Created, Paid, Shipped, Delivered, Cancelled, Refunded }
///         events: OrderEvent { Pay, Ship, Deliver, Cancel, Refund }
///         initial: Created;
///         terminal: [Delivered, Cancelled, Refunded];
///         transitions: {
///             Created + Pay     => Paid     emits OrderPaid,
///             Created + Cancel  => Cancelled,
///             Paid    + Ship    => Shipped  emits OrderShipped,
///             Paid    + Refund  => Refunded,
///             Shipped + Deliver => Delivered,
///         }
///     }
/// }
/// use orderly::StateMachine;
/// assert_eq!(OrderMachine::next(OrderState::Created, OrderEvent::Pay), Some(OrderState::Paid));
/// assert_eq!(OrderMachine::next(OrderState::Paid, OrderEvent::Pay), None);
/// assert_eq!(OrderMachine::emits(OrderState::Created, OrderEvent::Pay), Some("OrderPaid"));
/// ```
///
/// An edge may name the domain event it emits (`Paid + Ship => Shipped emits
/// OrderShipped`): an identifier, read back with
/// [`StateMachine::emits`](crate::StateMachine::emits) and shown on the edge in the
/// Mermaid and DOT pictures; anything else after `=> State` does not compile.
///
/// An edge may name a guard in brackets and an effect after a slash (`Created + Pay
/// [amount_matches] => Paid / record_payment emits OrderPaid`), from the names the
/// machine declares in `rules: OrderRules { guards: [amount_matches] effects:
/// [record_payment] }` (before `transitions`). The macro then writes the trait
/// `OrderRules<C>`, one method per name, each run on the unit's connection `C`; hand an
/// implementation to the engine with [`Engine::with_rules`](crate::Engine::with_rules)
/// and [`RulesOf`](crate::RulesOf). An edge naming an undeclared rule does not compile
/// (no variant of `Guards` or `Effects` by that name), nor does an implementation that
/// lacks one.
///
/// States may carry timers, in a `timers` block after `transitions`: `Created after 30 min
/// => Cancel` schedules the event `Cancel` for 30 minutes after the entity enters
/// `Created` (by the create, or by any move into it), written in the same unit as that
/// move; the timer job ([`Timers`](crate::Timers)) fires it once through the engine, and
/// it is moot if the entity has left the state by then. A delay is a positive integer and
/// a unit (`ms`, `s`, `min`, `h`, `days`; also `sec`, `secs`, `seconds`, `mins`,
/// `minutes`, `hour`, `hours`, `day`), at most 366 days.
///
/// ```
/// orderly::state_machine! {
///     pub Checkout {
///         states: CheckoutState { Created, Paid, Cancelled }
///         events: CheckoutEvent { Pay, Cancel }
///         initial: Created;
///         terminal: [Paid, Cancelled];
///         transitions: {
///             Created + Pay    => Paid,
///             Created + Cancel => Cancelled,
///         }
///         timers: {
///             Created after 30 min => Cancel,
///         }
///     }
/// }
/// use orderly::StateMachine;
/// assert_eq!(Checkout::TIMERS[0].after_ms, 30 * 60 * 1000);
/// assert!(orderly::machine::mermaid::<Checkout>().contains("Cancel (after 30 min)"));
/// ```
///
/// A state is stored (in the entity table's `status`, the history, timers' references,
/// the graph's pictures and the operators' page) under its variant's name, or under the
/// name it declares, for a table whose rows already say something else:
///
/// ```
/// orderly::state_machine! {
///     pub Refund {
///         states: RefundState { New = "new", Paid = "paid", Rejected = "rejected" }
///         events: RefundEvent { Pay, Reject }
///         initial: New;
///         terminal: [Paid, Rejected];
///         transitions: {
///             New + Pay    => Paid,
///             New + Reject => Rejected,
///         }
///     }
/// }
/// assert_eq!(RefundState::Paid.as_ref(), "paid");
/// assert_eq!("new".parse::<RefundState>().unwrap(), RefundState::New);
/// assert!("New".parse::<RefundState>().is_err()); // no longer a stored name
/// ```
///
/// Rejected at compile time, with a message naming the problem:
/// - two states stored under one name, or a declared stored name that is not 1 to 64
///   ASCII letters, digits, `_`, `-` or `.`,
/// - a duplicate `(state, event)` row,
/// - a state unreachable from the initial state,
/// - an edge out of a terminal state,
/// - a timer whose event has no edge from its state, two timers of one state on one
///   event, a delay that is not positive, longer than 366 days, or in an unknown unit.
///
/// The generated enums derive strum's `Display`, `EnumString`, `AsRefStr`,
/// `IntoStaticStr`, `EnumIter` and serde's `Serialize`/`Deserialize` through orderly's
/// own re-exports, so the calling crate needs no extra dependencies, but it must name this
/// crate `orderly` (no renaming in `Cargo.toml`).
#[macro_export]
macro_rules! state_machine {
    (
        $(#[$meta:meta])*
        $vis:vis $machine:ident {
            states: $state_ty:ident { $($state:ident $(= $stored:literal)?),+ $(,)? }
            events: $event_ty:ident { $($event:ident),+ $(,)? }
            initial: $initial:ident;
            terminal: [ $($terminal:ident),* $(,)? ];
            $(rules: $rules_ty:ident {
                guards: [ $($guard_name:ident),* $(,)? ]
                effects: [ $($effect_name:ident),* $(,)? ]
            })?
            transitions: { $(
                $from:ident + $ev:ident $([$guard:ident])? => $to:ident
                $(/ $effect:ident)? $(emits $emitted:ident)?
            ),+ $(,)? }
            $(timers: { $(
                $tstate:ident after $n:literal $unit:ident => $tevent:ident
            ),+ $(,)? })?
        }
    ) => {
        #[doc = concat!("States of [`", stringify!($machine), "`].")]
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            $crate::__private::strum::Display,
            $crate::__private::strum::EnumString,
            $crate::__private::strum::AsRefStr,
            $crate::__private::strum::IntoStaticStr,
            $crate::__private::strum::EnumIter,
            $crate::__private::serde::Serialize,
            $crate::__private::serde::Deserialize,
        )]
        #[strum(crate = "::orderly::__private::strum")]
        #[serde(crate = "::orderly::__private::serde")]
        $vis enum $state_ty {
            $(
                #[allow(missing_docs)]
                $(#[strum(to_string = $stored)] #[serde(rename = $stored)])?
                $state
            ),+
        }

        #[doc = concat!("Events of [`", stringify!($machine), "`].")]
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            $crate::__private::strum::Display,
            $crate::__private::strum::EnumString,
            $crate::__private::strum::AsRefStr,
            $crate::__private::strum::IntoStaticStr,
            $crate::__private::strum::EnumIter,
            $crate::__private::serde::Serialize,
            $crate::__private::serde::Deserialize,
        )]
        #[strum(crate = "::orderly::__private::strum")]
        #[serde(crate = "::orderly::__private::serde")]
        $vis enum $event_ty {
            $(
                #[allow(missing_docs)]
                $event
            ),+
        }

        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        $vis struct $machine;

        impl $crate::StateMachine for $machine {
            type State = $state_ty;
            type Event = $event_ty;
            const NAME: &'static str = stringify!($machine);
            const INITIAL: $state_ty = $state_ty::$initial;
            const TERMINAL: &'static [$state_ty] = &[$($state_ty::$terminal),*];
            const TRANSITIONS: &'static [$crate::Transition<$state_ty, $event_ty>] = &[
                $( $crate::Transition {
                    from: $state_ty::$from,
                    event: $event_ty::$ev,
                    to: $state_ty::$to,
                    emits: $crate::__emits!($($emitted)?),
                    guard: $crate::__emits!($($guard)?),
                    effect: $crate::__emits!($($effect)?),
                } ),+
            ];
            const TIMERS: &'static [$crate::machine::StateTimer<$state_ty, $event_ty>] = &[
                $($( $crate::machine::StateTimer {
                    state: $state_ty::$tstate,
                    event: $event_ty::$tevent,
                    after_ms: $crate::machine::__check::timer_ms($n, stringify!($unit)),
                } ),+)?
            ];
        }

        $(
            #[doc = concat!(
                "The guards and effects of [`", stringify!($machine), "`]'s edges: each runs ",
                "inside the transition's unit, on its connection `C`, after the entity is ",
                "locked at the judged state and version (see [`orderly::Rules`]). Hand an ",
                "implementation to the engine as `orderly::RulesOf(rules)`."
            )]
            $vis trait $rules_ty<C: Send>: Send + Sync + 'static {
                $(
                    #[doc = concat!("The guard `", stringify!($guard_name), "`: `Ok(())` allows the move, `Err(Halt::refuse(..))` refuses it.")]
                    fn $guard_name(
                        &self,
                        conn: &mut C,
                        judged: &$crate::Judged<'_, $machine>,
                    ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::Halt>> + Send;
                )*
                $(
                    #[doc = concat!("The effect `", stringify!($effect_name), "`: the business write of the move; an error undoes the whole unit.")]
                    fn $effect_name(
                        &self,
                        conn: &mut C,
                        judged: &$crate::Judged<'_, $machine>,
                    ) -> impl ::core::future::Future<Output = ::core::result::Result<(), $crate::Halt>> + Send;
                )*
            }

            impl<__OrderlyConn: Send, __OrderlyRules: $rules_ty<__OrderlyConn>>
                $crate::Rules<$machine, __OrderlyConn> for $crate::RulesOf<__OrderlyRules>
            {
                fn run<'a>(
                    &'a self,
                    name: &'static str,
                    conn: &'a mut __OrderlyConn,
                    judged: &'a $crate::Judged<'a, $machine>,
                ) -> $crate::RuleFuture<'a> {
                    $( if name == stringify!($guard_name) {
                        return ::std::boxed::Box::pin(
                            <__OrderlyRules as $rules_ty<__OrderlyConn>>::$guard_name(&self.0, conn, judged),
                        );
                    } )*
                    $( if name == stringify!($effect_name) {
                        return ::std::boxed::Box::pin(
                            <__OrderlyRules as $rules_ty<__OrderlyConn>>::$effect_name(&self.0, conn, judged),
                        );
                    } )*
                    ::std::boxed::Box::pin(::core::future::ready(::core::result::Result::Err(
                        $crate::Halt::unknown(name),
                    )))
                }
            }
        )?

        // Each guard and effect an edge names is one the rules declare: a name that is
        // not is a compile error naming it (no variant `name` in `Guards` / `Effects`).
        const _: () = {
            #[allow(non_camel_case_types, dead_code)]
            enum Guards { $($($guard_name,)*)? }
            #[allow(non_camel_case_types, dead_code)]
            enum Effects { $($($effect_name,)*)? }
            $($( let _ = Guards::$guard; )?)+
            $($( let _ = Effects::$effect; )?)+
        };

        const _: () = {
            $crate::machine::__check::stored_names(
                &[$( $crate::__stored!($state $(, $stored)?) ),+],
                &[$($( $stored, )?)+],
                concat!(
                    "state_machine!: the stored names of `", stringify!($state_ty),
                    "` must differ from each other, and a declared one be 1 to 64 ASCII letters, digits, `_`, `-` or `.`"
                ),
            );
            const ROWS: &[(usize, usize, usize)] = &[
                $( ($state_ty::$from as usize, $event_ty::$ev as usize, $state_ty::$to as usize) ),+
            ];
            $(
                $crate::machine::__check::unique_row(
                    ROWS,
                    $state_ty::$from as usize,
                    $event_ty::$ev as usize,
                    concat!(
                        "state_machine!: duplicate transition `", stringify!($from), " + ",
                        stringify!($ev), "`: each (state, event) pair may appear once"
                    ),
                );
            )+
            $(
                $crate::machine::__check::reachable(
                    ROWS,
                    $state_ty::$initial as usize,
                    $state_ty::$state as usize,
                    concat!(
                        "state_machine!: state `", stringify!($state),
                        "` is unreachable from the initial state `", stringify!($initial), "`"
                    ),
                );
            )+
            $(
                $crate::machine::__check::no_edge_out_of(
                    ROWS,
                    $state_ty::$terminal as usize,
                    concat!(
                        "state_machine!: terminal state `", stringify!($terminal),
                        "` has an outgoing transition"
                    ),
                );
            )*
            #[allow(dead_code)]
            const TIMER_ROWS: &[(usize, usize)] = &[
                $($( ($state_ty::$tstate as usize, $event_ty::$tevent as usize) ),+)?
            ];
            $($(
                // The delay, checked here too: an associated constant nobody reads is not
                // always evaluated.
                let _ = $crate::machine::__check::timer_ms($n, stringify!($unit));
                $crate::machine::__check::has_row(
                    ROWS,
                    $state_ty::$tstate as usize,
                    $event_ty::$tevent as usize,
                    concat!(
                        "state_machine!: timer `", stringify!($tstate), " after ",
                        stringify!($n), " ", stringify!($unit), " => ", stringify!($tevent),
                        "`: the graph has no edge `", stringify!($tstate), " + ",
                        stringify!($tevent), "`"
                    ),
                );
                $crate::machine::__check::unique_timer(
                    TIMER_ROWS,
                    $state_ty::$tstate as usize,
                    $event_ty::$tevent as usize,
                    concat!(
                        "state_machine!: two timers `", stringify!($tstate), " => ",
                        stringify!($tevent), "`: a state may carry one timer per event"
                    ),
                );
            )+)?
        };
    };
}

/// The `emits` of one row of [`state_machine!`](crate::state_machine): `None`, or the
/// declared name.
#[doc(hidden)]
#[macro_export]
macro_rules! __emits {
    () => {
        ::core::option::Option::None
    };
    ($emitted:ident) => {
        ::core::option::Option::Some(stringify!($emitted))
    };
}

/// The stored name of one state of [`state_machine!`](crate::state_machine): the one
/// declared (`Paid = "paid"`), or the variant's own.
#[doc(hidden)]
#[macro_export]
macro_rules! __stored {
    ($state:ident) => {
        stringify!($state)
    };
    ($state:ident, $stored:literal) => {
        $stored
    };
}
