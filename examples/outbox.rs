//! The outbox end to end, on embedded SQLite: an order's payment emits `OrderPaid` in the
//! same commit as the state change; a relay publishes it (to an in-process channel, or
//! to NATS JetStream with `--nats nats://127.0.0.1:4222`, built with `--features nats`);
//! the warehouse, another engine on its own database, applies each message as a
//! transition with `ref_id` = the message id, so a redelivery is `Replayed`.
//!
//! `cargo run --example outbox` (or `cargo run --features nats --example outbox --
//! --nats nats://127.0.0.1:4222`).

use orderly::outbox::{ChannelSink, Message, Outbox, Relay};
use orderly::{Engine, Outcome, SqliteStore};

orderly::state_machine! {
    /// The life of an order: paying and shipping emit events.
    pub OrderMachine {
        states: OrderState { Created, Paid, Shipped, Cancelled }
        events: OrderEvent { Pay, Ship, Cancel }
        initial: Created;
        terminal: [Shipped, Cancelled];
        transitions: {
            Created + Pay    => Paid     emits OrderPaid,
            Created + Cancel => Cancelled,
            Paid    + Ship   => Shipped  emits OrderShipped,
        }
    }
}

orderly::state_machine! {
    /// The warehouse's side of an order.
    pub PickMachine {
        states: PickState { Waiting, Picking, Sent }
        events: PickEvent { Pick, Send }
        initial: Waiting;
        terminal: [Sent];
        transitions: {
            Waiting + Pick => Picking,
            Picking + Send => Sent,
        }
    }
}

/// What the warehouse does with an event: one transition, its reference the message id.
async fn consume(
    warehouse: &Engine<PickMachine, SqliteStore>,
    message: &Message,
    delivery: &str,
) -> Result<(), orderly::Error> {
    let event = match message.event.as_str() {
        "OrderPaid" => PickEvent::Pick,
        "OrderShipped" => PickEvent::Send,
        _ => return Ok(()),
    };
    let answer = match warehouse
        .transition(message.entity_id, event, &message.id)
        .await?
    {
        Outcome::Applied { from, to, .. } => format!("Applied  {from} -> {to}"),
        Outcome::Replayed { from, to, .. } => {
            format!("Replayed {from} -> {to}, nothing done twice")
        }
    };
    println!(
        "  warehouse, {delivery:<11} {} ({}) -> {answer}",
        message.id, message.event
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nats = std::env::args().skip_while(|a| a != "--nats").nth(1);
    let dir = std::env::temp_dir().join(format!("orderly-outbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let shop = SqliteStore::demo(&format!("sqlite://{}", dir.join("shop.db").display())).await?;
    let orders: Engine<OrderMachine, SqliteStore> = Engine::new(shop.clone())?;
    let depot = SqliteStore::demo(&format!("sqlite://{}", dir.join("depot.db").display())).await?;
    let warehouse: Engine<PickMachine, SqliteStore> = Engine::new(depot)?;

    println!("The shop: a payment callback delivered twice, then the order ships");
    orders.create(1).await?;
    warehouse.create(1).await?;
    for attempt in 1..=2 {
        let outcome = orders.transition(1, OrderEvent::Pay, "pay_123").await?;
        println!(
            "  callback #{attempt}: Pay pay_123 -> applied: {}",
            outcome.is_applied()
        );
    }
    orders.transition(1, OrderEvent::Ship, "ship_9").await?;
    let outbox = Outbox::new(shop.clone());
    let waiting: Vec<String> = outbox
        .pending(10)
        .await?
        .iter()
        .map(|e| format!("{}@v{}", e.event, e.version))
        .collect();
    println!(
        "  outbox rows, written with the transitions: {}",
        waiting.join(", ")
    );

    match nats {
        None => {
            println!("\nThe relay, to an in-process channel");
            let (sink, mut received) = ChannelSink::new();
            let relay = Relay::new(shop.clone(), sink);
            // Round by round: an order's second event is claimed once its first is out.
            let mut published = 0;
            loop {
                let round = relay.relay_once().await?;
                if round.claimed == 0 {
                    break;
                }
                published += round.published;
            }
            println!("  published {published}");
            let mut messages = Vec::new();
            while let Ok(message) = received.try_recv() {
                messages.push(message);
            }
            deliver(&warehouse, &messages).await?;
        }
        Some(url) => run_nats(&shop, &warehouse, &url).await?,
    }

    let stats = outbox.stats().await?;
    println!("\noutbox: pending {}, dead {}", stats.pending, stats.dead);
    let pick = warehouse.get(1).await?;
    println!(
        "warehouse order 1: {} (version {})",
        pick.state, pick.version
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

/// Delivers each message, then the first one again (a broker's redelivery).
async fn deliver(
    warehouse: &Engine<PickMachine, SqliteStore>,
    messages: &[Message],
) -> Result<(), orderly::Error> {
    println!("\nThe warehouse consumes, in version order");
    for message in messages {
        consume(warehouse, message, "delivery").await?;
    }
    if let Some(first) = messages.first() {
        consume(warehouse, first, "redelivery").await?;
    }
    Ok(())
}

#[cfg(feature = "nats")]
async fn run_nats(
    shop: &SqliteStore,
    warehouse: &Engine<PickMachine, SqliteStore>,
    url: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use async_nats::jetstream::{self, stream};
    use orderly::outbox::NatsSink;
    println!("\nThe relay, to NATS JetStream at {url}");
    let prefix = format!("orderly_example_{}", std::process::id());
    let js = jetstream::new(async_nats::connect(url).await?);
    let mut stream = js
        .get_or_create_stream(stream::Config {
            name: prefix.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await?;
    let relay = Relay::new(shop.clone(), NatsSink::connect(url, &prefix).await?);
    let mut published = 0;
    loop {
        let round = relay.relay_once().await?;
        if round.claimed == 0 {
            break;
        }
        published += round.published;
    }
    println!("  published {published}");
    let mut messages = Vec::new();
    let count = stream.info().await?.state.messages;
    for seq in 1..=count {
        let stored = stream.get_raw_message(seq).await?;
        let header = |name: &str| {
            stored
                .headers
                .get(name)
                .map(|v| v.as_str().to_string())
                .unwrap_or_default()
        };
        messages.push(Message {
            id: header("Nats-Msg-Id"),
            machine: header("Orderly-Machine"),
            event: header("Orderly-Event"),
            transition: header("Orderly-Transition"),
            entity_id: header("Orderly-Entity").parse()?,
            version: header("Orderly-Version").parse()?,
            from: header("Orderly-From"),
            to: header("Orderly-To"),
            ref_id: header("Orderly-Ref"),
            body: String::from_utf8(stored.payload.to_vec())?,
            // The request's trace context, if it had one: the consumer's work joins it.
            trace: orderly::TraceContext::from_values(
                Some(&header("traceparent")),
                Some(&header("tracestate")),
            ),
        });
    }
    deliver(warehouse, &messages).await?;
    js.delete_stream(&prefix).await?;
    Ok(())
}

#[cfg(not(feature = "nats"))]
async fn run_nats(
    _: &SqliteStore,
    _: &Engine<PickMachine, SqliteStore>,
    _: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    Err("--nats needs the example built with --features nats".into())
}
