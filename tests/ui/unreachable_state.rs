orderly::state_machine! {
    pub Broken {
        states: BrokenState { Created, Paid, Refunded }
        events: BrokenEvent { Pay, Refund }
        initial: Created;
        terminal: [Paid];
        transitions: {
            Created + Pay => Paid,
            Refunded + Refund => Created,
        }
    }
}

fn main() {}
