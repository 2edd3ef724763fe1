//! The operators' page: an axum [`Router`](axum::Router) to mount in the service
//! (feature `admin`), over the stores it already has, that shows what is stuck and acts
//! on it through the library's own fenced calls, each action recorded in an audit trail.
//!
//! ```rust,no_run
//! # use axum::Router;
//! # use orderly::admin::{Admin, Viewer};
//! # use orderly::{Engine, Flows, SqliteStore};
//! # orderly::state_machine! { pub OrderMachine { states: OrderState { Created, Paid } events: OrderEvent { Pay } initial: Created; terminal: [Paid]; transitions: { Created + Pay => Paid, } } }
//! # struct User { name: String, admin: bool }
//! # impl User { fn is_admin(&self) -> bool { self.admin } }
//! # fn user_of(_parts: &http::request::Parts) -> Option<User> { None }
//! # fn mount(store: SqliteStore, flows: Flows<SqliteStore>, engine: Engine<OrderMachine, SqliteStore>) -> Router {
//! let admin = Admin::new(store.clone())
//!     .flows(flows.clone())
//!     .machine(engine.clone())
//!     .access(|parts: &http::request::Parts| match user_of(parts) {
//!         Some(u) if u.is_admin() => Viewer::full(u.name),
//!         Some(u) => Viewer::read_only(u.name),
//!         None => Viewer::none(),
//!     });
//! let app = Router::new().nest("/admin", admin.router());
//! # app
//! # }
//! ```
//!
//! Every page renders as HTML on the server (escaped: whatever the database holds is
//! text on the page), and as JSON with `?format=json`. Actions are POSTs carrying a CSRF
//! token bound to the viewer; a viewer without full access sees no action buttons and
//! has a POST refused 403. The pages are described in `docs/admin.md`.

mod actions;
mod app;
pub mod lookup;
mod machines;
pub(crate) mod ops;
mod page;
mod pages;
pub(crate) mod panel;
mod seen;
mod trend;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use panel::Admin;

use self::lookup::LookupStore;
use crate::engine::Engine;
use crate::flow::{FlowStore, Flows};
use crate::idempotency::Records;
use crate::machine::StateMachine;
use crate::outbox::OutboxStore;
use crate::store::audit::AuditStore;

/// What a viewer may do on the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Nothing: every page answers 403.
    None,
    /// Every page, no action.
    ReadOnly,
    /// Every page and every action.
    Full,
}

/// Who is looking, and what they may do: what the application's resolver answers for a
/// request ([`Admin::access`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    /// Their name, as the audit trail records it.
    pub who: String,
    /// What they may do.
    pub access: Access,
}

impl Viewer {
    /// No access.
    pub fn none() -> Self {
        Viewer {
            who: String::new(),
            access: Access::None,
        }
    }

    /// `who` may read every page.
    pub fn read_only(who: impl Into<String>) -> Self {
        Viewer {
            who: who.into(),
            access: Access::ReadOnly,
        }
    }

    /// `who` may read every page and act.
    pub fn full(who: impl Into<String>) -> Self {
        Viewer {
            who: who.into(),
            access: Access::Full,
        }
    }
}

/// What the page needs of a store: flows (and with them records and timers), the outbox,
/// the audit trail and the operators' lookups. Every backend of orderly is one.
pub trait AdminStore: FlowStore + OutboxStore + AuditStore + LookupStore {}

impl<S: FlowStore + OutboxStore + AuditStore + LookupStore> AdminStore for S {}

/// The application's resolver.
type Resolver = Arc<dyn Fn(&http::request::Parts) -> Viewer + Send + Sync>;

/// The machines the page shows, by name.
type Machines<S> = BTreeMap<&'static str, Arc<dyn machines::MachineView<S>>>;

impl<S: AdminStore> Admin<S> {
    /// The same page resuming parked flows through `flows` (its registered definitions).
    pub fn flows(mut self, flows: Flows<S>) -> Self {
        self.flows = Some(flows);
        self
    }

    /// The same page releasing stuck idempotency records through `records` (its
    /// registered scopes, whose leases and retentions a release keeps).
    pub fn records(mut self, records: Records<S>) -> Self {
        self.records = Some(records);
        self
    }

    /// The same page showing machine `M`: its graph, and its entities' timelines.
    pub fn machine<M: StateMachine>(mut self, engine: Engine<M, S>) -> Self {
        self.machines.insert(M::NAME, Arc::new(engine));
        self
    }

    /// The same page with `resolve` deciding who each request is and what they may do
    /// (the application's own authentication). Without one, every request is refused.
    pub fn access(
        mut self,
        resolve: impl Fn(&http::request::Parts) -> Viewer + Send + Sync + 'static,
    ) -> Self {
        self.resolver = Arc::new(resolve);
        self
    }
}
