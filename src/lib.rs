//! placeholder
#![warn(missing_docs)]
#![forbid(unsafe_code)]

extern crate self as orderly;

pub mod engine;
pub mod error;
pub mod machine;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use engine::{Engine, EngineConfig, Order, Outcome, Record};
pub use error::{Error, Result};
pub use machine::{StateMachine, Transition};
#[cfg(feature = "mysql")]
pub use store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PgStore;
#[cfg(feature = "sqlite")]
pub use store::sqlite::SqliteStore;
pub use store::{Store, Tables};

#[doc(hidden)]
pub mod __private {
    pub use serde;
    pub use strum;
}
