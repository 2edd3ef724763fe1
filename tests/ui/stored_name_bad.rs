orderly::state_machine! {
    pub Broken {
        states: BrokenState { New = "new", Paid = "paid:now", Cancelled = "cancelled" }
        events: BrokenEvent { Pay, Cancel }
        initial: New;
        terminal: [Cancelled];
        transitions: {
            New + Pay => Paid,
            New + Cancel => Cancelled,
        }
    }
}

fn main() {}
