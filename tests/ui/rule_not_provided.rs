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
            Open + Pay [amount_matches] => Paid / record_payment,
        }
    }
}

struct Mine;

impl ShopRules<()> for Mine {
    async fn amount_matches(
        &self,
        _conn: &mut (),
        _judged: &orderly::Judged<'_, Shop>,
    ) -> Result<(), orderly::Halt> {
        Ok(())
    }
}

fn main() {}
