orderly::flow! {
    /// No steps.
    pub Nothing {
        kind: "nothing";
        version: 1;
        steps: NothingStep {}
    }
}

fn main() {}
