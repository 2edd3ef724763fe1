orderly::flow! {
    /// A wait declared with a compensation: it has no effect to undo.
    pub Sleepy {
        kind: "sleepy";
        version: 1;
        steps: SleepyStep {
            Insert: local,
            Cool: wait + undo,
        }
    }
}

fn main() {}
