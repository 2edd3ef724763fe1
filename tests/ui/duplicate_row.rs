orderly::state_machine! {
    pub Broken {
        states: BrokenState { Created, Paid, Cancelled }
        events: BrokenEvent { Pay, Cancel }
        initial: Created;
        terminal: [Cancelled];
        transitions: {
            Created + Pay => Paid,
            Created + Pay => Cancelled,
            Paid + Cancel => Cancelled,
        }
    }
}

fn main() {}
