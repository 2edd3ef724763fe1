orderly::state_machine! {
    M {
        states: S { A, B }
        events: E { Go }
        initial: A;
        terminal: [B];
        transitions: { A + Go => B emit Went }
    }
}

fn main() {}
