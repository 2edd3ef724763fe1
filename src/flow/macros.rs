//! [`flow!`](crate::flow!): the declaration users write.

/// Declares a flow: a unit struct implementing [`Flow`](crate::flow::Flow) and an enum
/// of its steps, with the declaration checked at compile time.
///
/// Each step is `Name: class` with `class` one of `local`, `keyed`, `unsafe`, `wait`
/// ([`StepClass`](crate::flow::StepClass)), and `+ undo` if it has a compensation, or
/// `+ nothing_to_undo` if it has no effect to undo (a `wait` takes neither). A keyed or unsafe step before the
/// pivot needs one of the two. The optional `pivot` names the first step that is never
/// compensated: it and the steps after it are only retried forward.
///
/// ```
/// orderly::flow! {
///     /// Creating an order: insert it, reserve its stock, use a coupon, then ship.
///     pub CreateOrder {
///         kind: "create_order";
///         version: 1;
///         steps: CreateOrderStep {
///             Insert:    local + undo,
///             Reserve:   local + undo,
///             UseCoupon: keyed + undo,
///             Ship:      keyed,
///         }
///         pivot: Ship;
///     }
/// }
/// use orderly::flow::{Flow, StepClass};
/// assert_eq!(CreateOrder::STEPS.len(), 4);
/// assert_eq!(CreateOrder::STEPS[2].class, StepClass::Keyed);
/// assert_eq!(CreateOrder::PIVOT, Some(CreateOrderStep::Ship.index()));
/// assert_eq!(CreateOrderStep::UseCoupon.name(), "UseCoupon");
/// ```
///
/// A keyed step before the pivot without a compensation does not compile, and the error
/// names it:
///
/// ```text
/// error[E0080]: evaluation panicked: flow!: step `UseCoupon` is keyed or unsafe before the pivot: declare `+ undo`, or `+ nothing_to_undo` if it has no effect to undo
/// ```
#[macro_export]
macro_rules! flow {
    (
        $(#[$meta:meta])*
        $vis:vis $flow:ident {
            kind: $kind:literal;
            version: $version:literal;
            steps: $steps:ident { $(,)? }
            $(pivot: $pivot:ident;)?
        }
    ) => {
        compile_error!("flow!: a flow has at least one step");
    };
    (
        $(#[$meta:meta])*
        $vis:vis $flow:ident {
            kind: $kind:literal;
            version: $version:literal;
            steps: $steps:ident {
                $( $step:ident : $class:ident $(+ $modifier:ident)* ),+ $(,)?
            }
            $(pivot: $pivot:ident;)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        $vis struct $flow;

        #[doc = concat!("The steps of [`", stringify!($flow), "`], in order.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $steps {
            $(
                #[doc = concat!("Step `", stringify!($step), "`.")]
                $step,
            )+
        }

        impl $steps {
            /// Every step, in order.
            pub const ALL: &'static [$steps] = &[$($steps::$step),+];

            /// The step's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $($steps::$step => stringify!($step),)+
                }
            }

            /// The step's position in the flow, from 0.
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        impl $crate::flow::FlowStep for $steps {
            fn name(self) -> &'static str {
                $steps::name(self)
            }
            fn index(self) -> usize {
                $steps::index(self)
            }
        }

        impl $crate::flow::Flow for $flow {
            type Step = $steps;
            const KIND: &'static str = $kind;
            const VERSION: u32 = $version;
            const STEPS: &'static [$crate::flow::StepSpec] = &[
                $($crate::flow::StepSpec::declared(
                    stringify!($step),
                    stringify!($class),
                    &[$(stringify!($modifier)),*],
                ),)+
            ];
            const PIVOT: ::core::option::Option<usize> = $crate::flow::__check::flow(
                $kind,
                $version,
                <Self as $crate::flow::Flow>::STEPS,
                {
                    let pivot: ::core::option::Option<&'static str> = ::core::option::Option::None;
                    $(let pivot = ::core::option::Option::Some(stringify!($pivot));)?
                    pivot
                },
            );
        }

        // The checks run when the crate compiles, not when the flow is first used.
        const _: () = {
            $(let _ = $steps::$pivot;)?
            let pivot = <$flow as $crate::flow::Flow>::PIVOT;
            let steps = <$flow as $crate::flow::Flow>::STEPS;
            $(
                $crate::flow::__check::compensable(
                    steps,
                    $steps::$step as usize,
                    pivot,
                    concat!(
                        "flow!: step `", stringify!($step),
                        "` is keyed or unsafe before the pivot: declare `+ undo`, or `+ nothing_to_undo` if it has no effect to undo"
                    ),
                );
            )+
        };
    };
}
