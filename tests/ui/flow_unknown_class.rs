orderly::flow! {
    /// A step of no known class.
    pub Odd {
        kind: "odd";
        version: 1;
        steps: OddStep {
            Insert: remote + undo,
        }
    }
}

fn main() {}
