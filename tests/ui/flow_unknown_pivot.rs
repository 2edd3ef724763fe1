orderly::flow! {
    /// A pivot that is not a step.
    pub Lost {
        kind: "lost";
        version: 1;
        steps: LostStep {
            Insert: local + undo,
            Charge: keyed + undo,
        }
        pivot: Ship;
    }
}

fn main() {}
