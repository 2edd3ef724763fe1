//! Setters for the public configuration structs. Those are `#[non_exhaustive]`, so that
//! a field added later does not break a user's code: outside this crate they are built
//! from `Default` and these setters (`EngineConfig::default().max_attempts(5)`), or by
//! assigning their public fields.

/// Writes, for each `field: Type` listed, a method `field(self, value) -> Self` that sets
/// the field and returns the config.
macro_rules! setters {
    ($config:ty { $($field:ident: $ty:ty),* $(,)? }) => {
        impl $config {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;
