orderly::state_machine! {
    pub Shop {
        states: ShopState { Open, Paid }
        events: ShopEvent { Pay }
        initial: Open;
        terminal: [Paid];
        rules: ShopRules {
            guards: [amount_matches]
            effects: [record_payment]
        }
        transitions: {
            Open + Pay [amount_matchs] => Paid / record_payment,
        }
    }
}

fn main() {}
