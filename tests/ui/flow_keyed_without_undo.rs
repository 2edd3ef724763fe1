orderly::flow! {
    /// A coupon used before the pivot with no way to give it back.
    pub CreateOrder {
        kind: "create_order";
        version: 1;
        steps: CreateOrderStep {
            Insert:    local + undo,
            UseCoupon: keyed,
            Ship:      keyed,
        }
        pivot: Ship;
    }
}

fn main() {}
