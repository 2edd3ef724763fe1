orderly::state_machine! {
    pub Broken {
        states: BrokenState { Created, Paid, Refunded }
        events: BrokenEvent { Pay, Refund }
        initial: Created;
        terminal: [Paid, Refunded];
        transitions: {
            Created + Pay => Paid,
            Paid + Refund => Refunded,
        }
    }
}

fn main() {}
