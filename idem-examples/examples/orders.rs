//! An order and its event committed together in Postgres; the relay
//! publishes it to NATS JetStream; a relay that stops between the broker's
//! confirmation and moving its partition's cursor; JetStream keeps one copy.
//!
//! Needs Postgres and NATS with JetStream (`./scripts/test` starts both):
//!
//! ```sh
//! cargo run -p idem-examples --example orders
//! ```
//!
//! `IDEM_POSTGRES_URL` and `IDEM_NATS_URL` choose the servers (default:
//! `postgres://postgres@127.0.0.1:5432/test`, `nats://127.0.0.1:4222`).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use idem_core::store::{NewMessage, OutboxMessage, OutboxStore};
use idem_nats::{JetStreamOptions, JetStreamPublisher};
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions, async_trait};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PostgresOutbox, PostgresOutboxOptions};

/// A relay's broker answers, then the relay stalls past its lease (a pause,
/// a crash before it could move its partition's cursor).
struct StallsAfterConfirm(JetStreamPublisher);

#[async_trait]
impl Publisher for StallsAfterConfirm {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let confirmed = self.0.publish(batch).await;
        tokio::time::sleep(Duration::from_millis(800)).await;
        confirmed
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pg_url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nats_url =
        std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg_url)
        .await?;
    let orders = format!("example_orders_{run}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id text PRIMARY KEY, total bigint NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    let outbox = Arc::new(PostgresOutbox::with_options(
        pool.clone(),
        PostgresOutboxOptions::default().table(&format!("example_outbox_{run}")),
    )?);
    outbox.migrate().await?;

    // A stream that keeps what the relay publishes, with a duplicate window.
    let context = jetstream::new(async_nats::connect(&nats_url).await?);
    let stream = format!("EXAMPLE_ORDERS_{run}");
    let prefix = format!("example-orders-{run}");
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    let publisher = JetStreamPublisher::new(context.clone(), JetStreamOptions::new(&prefix)?);

    // The order and its event commit together, or not at all.
    for (order, commit) in [("order-1", true), ("order-2", false), ("order-3", true)] {
        let mut tx = pool.begin().await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {orders} VALUES ($1, 5990)"
        )))
        .bind(order)
        .execute(&mut *tx)
        .await?;
        let event = NewMessage::new(
            order,
            "order.placed",
            format!(r#"{{"order":"{order}"}}"#).into_bytes(),
        )?
        .with_header("content-type", "application/json")?;
        outbox.enqueue_in(&mut tx, &event).await?;
        if commit {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        println!(
            "{order}: {}",
            if commit {
                "committed with its event"
            } else {
                "rolled back: no event"
            }
        );
    }

    // One relay publishes order-1's event; order-3's goes to a relay that
    // stalls after the broker confirmed it, past its lease.
    let relay = Relay::new(
        outbox.clone(),
        Arc::new(publisher.clone()),
        RelayOptions::default().with_batch(1)?,
    );
    let first = relay.relay_once().await?;
    println!("relay: published {} (order-1)", first.published);
    // It gives its partition back, for the stalling relay to take.
    relay.release().await;

    let stalling = Relay::new(
        outbox.clone(),
        Arc::new(StallsAfterConfirm(publisher.clone())),
        RelayOptions::default().with_lease(Duration::from_millis(200))?,
    );
    let stalled = tokio::spawn(async move { stalling.relay_once().await });
    // Once the stream holds order-3 (the stalled relay's publish)...
    while context
        .get_stream(&stream)
        .await?
        .info()
        .await?
        .state
        .messages
        < 2
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...and its lease lapsed, the first relay takes the partition over
    // and publishes order-3 again from the partition's cursor.
    let second = loop {
        let pass = relay.relay_once().await?;
        if pass.published > 0 {
            break pass;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "relay after a stalled one: published {}, of which the stream had already stored {}",
        second.published, second.duplicates
    );
    let stale = stalled.await??;
    println!(
        "the stalled relay: settled {}, {} confirmed after its partition was taken over",
        stale.published, stale.lost
    );

    let mut info = context.get_stream(&stream).await?;
    let stored = info.info().await?.state.messages;
    println!("messages in the stream: {stored} (order-1 and order-3, each once)");
    println!("outbox: {} pending", outbox.stats().await?.pending);

    context.delete_stream(&stream).await?;
    // Nothing of the run left behind: the outbox's tables and functions,
    // and the orders.
    outbox.uninstall().await?;
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {orders}")))
        .execute(&pool)
        .await?;
    Ok(())
}
