//! Guards and effects: user code an edge names (`Created + Pay [amount_matches] => Paid /
//! record_payment`), run inside the transition's own unit, after the entity is locked at
//! the judged state and version, on the unit's connection.
//!
//! The order of judgement: input, then replay (a request already recorded is
//! [`Replayed`](crate::Outcome::Replayed) and runs neither guard nor effect), then the
//! graph (`InvalidTransition`, `RefConflict`), then the guard, then the effect, then the
//! update, the history row and the outbox row, one commit.

use std::future::Future;
use std::pin::Pin;

use crate::machine::StateMachine;

/// What a guard or an effect is shown: the request being applied, judged allowed by the
/// graph, with the entity locked at `from` and `version` until the unit ends.
#[derive(Debug, Clone, Copy)]
pub struct Judged<'a, M: StateMachine> {
    /// The entity.
    pub order_id: i64,
    /// Its state, locked.
    pub from: M::State,
    /// The state the move leads to.
    pub to: M::State,
    /// Its version, locked (the move makes `version + 1`).
    pub version: i64,
    /// The event.
    pub event: M::Event,
    /// The request's reference.
    pub ref_id: &'a str,
    /// The request's payload, as the JSON text it was given in, if any.
    pub payload: Option<&'a str>,
}

impl<M: StateMachine> Judged<'_, M> {
    /// The request's payload read as `T`; `None` without one.
    pub fn payload<T: serde::de::DeserializeOwned>(&self) -> Result<Option<T>, Halt> {
        self.payload
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| Halt::Failed(format!("the payload does not read: {e}")))
    }
}

/// Why a guard or an effect stopped the move. Whatever it is, nothing of the unit is
/// written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Halt {
    /// The business does not allow the move now: answered
    /// [`Error::Refused`](crate::Error::Refused).
    #[error("refused: {code}: {message}")]
    Refuse {
        /// A code for programs (`amount_mismatch`).
        code: String,
        /// A message for people.
        message: String,
    },
    /// A database error on the unit's connection: the library's own, judged as any
    /// other (a deadlock or a serialization failure judges the request again, guard
    /// included; a lost connection is read back by the write id). `?` on a sqlx error
    /// gives this for errors of the database or the connection; an error of the rule's
    /// own reading (no row, a value that does not decode) is [`Halt::Failed`].
    #[error(transparent)]
    Database(sqlx::Error),
    /// The rule failed: answered [`Error::RuleFailed`](crate::Error::RuleFailed).
    #[error("{0}")]
    Failed(String),
}

impl From<sqlx::Error> for Halt {
    fn from(error: sqlx::Error) -> Self {
        match error {
            sqlx::Error::RowNotFound
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnIndexOutOfBounds { .. }
            | sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::Encode(_)
            | sqlx::Error::TypeNotFound { .. } => Halt::Failed(error.to_string()),
            error => Halt::Database(error),
        }
    }
}

impl Halt {
    /// A refusal with a code and a message.
    pub fn refuse(code: impl Into<String>, message: impl Into<String>) -> Self {
        Halt::Refuse {
            code: code.into(),
            message: message.into(),
        }
    }

    /// A failure, from any error.
    pub fn failed(error: impl std::fmt::Display) -> Self {
        Halt::Failed(error.to_string())
    }

    /// A rule the machine names that the rules handed to the engine do not run.
    #[doc(hidden)]
    pub fn unknown(name: &str) -> Self {
        Halt::Failed(format!("no rule named {name}"))
    }
}

/// A boxed rule's future.
pub type RuleFuture<'a> = Pin<Box<dyn Future<Output = Result<(), Halt>> + Send + 'a>>;

/// The guards and effects of a machine, run on connections `C` (the store's connection:
/// `PgConnection`, `MySqlConnection`, `SqliteConnection`). [`state_machine!`] writes
/// this for [`RulesOf`] over the machine's own rules trait (`rules: OrderRules { .. }`),
/// whose methods are the names the edges use.
///
/// [`state_machine!`]: crate::state_machine
pub trait Rules<M: StateMachine, C>: Send + Sync + 'static {
    /// Runs the guard or effect `name` for `judged` on `conn`.
    fn run<'a>(
        &'a self,
        name: &'static str,
        conn: &'a mut C,
        judged: &'a Judged<'a, M>,
    ) -> RuleFuture<'a>;
}

/// A machine's rules, as the engine takes them: `Engine::with_rules(RulesOf(my_rules))`,
/// where `my_rules` implements the machine's rules trait.
#[derive(Debug, Clone, Copy, Default)]
pub struct RulesOf<R>(pub R);
