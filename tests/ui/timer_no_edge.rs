orderly::state_machine! {
    pub Broken {
        states: BrokenState { Created, Paid, Cancelled }
        events: BrokenEvent { Pay, Cancel }
        initial: Created;
        terminal: [Paid, Cancelled];
        transitions: {
            Created + Pay => Paid,
            Created + Cancel => Cancelled,
        }
        timers: {
            Paid after 1 h => Cancel,
        }
    }
}

fn main() {}
