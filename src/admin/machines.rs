//! A machine as the page shows it, its type erased: its graph, and the store its
//! entities and their history are in.

use crate::engine::Engine;
use crate::machine::StateMachine;
use crate::store::Store;

pub(super) trait MachineView<S>: Send + Sync {
    /// The graph, as Mermaid text.
    fn graph(&self) -> String;
    /// The graph, drawn as SVG.
    fn picture(&self) -> String;
    /// The store of the machine's entities and history (its own table names).
    fn store(&self) -> &S;
}

impl<M: StateMachine, S: Store> MachineView<S> for Engine<M, S> {
    fn graph(&self) -> String {
        self.mermaid()
    }

    fn picture(&self) -> String {
        Engine::svg(self)
    }

    fn store(&self) -> &S {
        Engine::store(self)
    }
}
