//! A shipping service consuming order events from NATS JetStream into
//! Postgres, each event once: the inbox record, the version check and the
//! shipment row commit together, and only then is the delivery acked. A
//! consumer that dies between its commit and its ack, an event that fails
//! once and lets the next one arrive first (a version gap), and an event no
//! handler can apply (parked, then dropped by an operator).
//!
//! Needs Postgres and NATS with JetStream (`./scripts/test` starts both):
//!
//! ```sh
//! cargo run -p idem-examples --example shipments
//! ```
//!
//! `IDEM_POSTGRES_URL` and `IDEM_NATS_URL` choose the servers (default:
//! `postgres://postgres@127.0.0.1:5432/test`, `nats://127.0.0.1:4222`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use idem_consumer::{
    BrokerError, Consumer, ConsumerOptions, Delivery, Handled, Handler, Settled, Source,
    async_trait,
};
use idem_core::store::{
    InboundMessage, NewMessage, OutboxStore, Timestamp, VersionCheck, VersionStore,
};
use idem_core::{HandlerError, StoreError};
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::{Relay, RelayOptions};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{
    PgTransaction, PostgresOptions, PostgresOutbox, PostgresOutboxOptions, PostgresParking,
    PostgresParkingOptions, PostgresStore, VersionedTable,
};

/// Writes each order event as the order's shipment row, at its version.
struct Shipping {
    inbox: PostgresStore,
    shipments: String,
    versions: VersionedTable,
    /// Events that fail once (a payment service that timed out).
    flaky: Mutex<HashSet<String>>,
}

#[async_trait]
impl Handler for Shipping {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
        let (Some(order), Some(version)) = (message.aggregate(), message.version()) else {
            return Err(HandlerError::from(
                "an order event without its order and version",
            ));
        };
        let status = std::str::from_utf8(message.payload())?;
        if status == "lost" {
            return Err(HandlerError::from("no carrier ships a lost order"));
        }
        if self
            .flaky
            .lock()
            .is_ok_and(|mut f| f.remove(message.id().as_str()))
        {
            return Err(HandlerError::from("the carrier timed out"));
        }
        let check = self.versions.advance(tx.conn(), order, version).await?;
        if check == VersionCheck::Apply {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (id, version, status) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status",
                self.shipments
            )))
            .bind(order)
            .bind(i64::try_from(version)?)
            .bind(status)
            .execute(tx.conn())
            .await?;
        }
        Ok((tx, check.into()))
    }
}

/// A delivery whose consumer dies after its commit, before its ack.
struct DiesBeforeAck<'a>(&'a dyn Delivery);

#[async_trait]
impl Delivery for DiesBeforeAck<'_> {
    fn message(&self) -> &InboundMessage {
        self.0.message()
    }
    fn deliveries(&self) -> u32 {
        self.0.deliveries()
    }
    fn published_at(&self) -> Option<Timestamp> {
        self.0.published_at()
    }
    async fn ack(&self) -> Result<(), BrokerError> {
        Err(BrokerError::unavailable(
            "example",
            "ack",
            "the consumer died",
        ))
    }
    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        self.0.retry(delay).await
    }
}

async fn create(pool: &PgPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(pool)
        .await
        .map(drop)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pg_url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nats_url =
        std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let pool = idem_postgres::guarded(sqlx::postgres::PgPoolOptions::new())
        .max_connections(4)
        .connect(&pg_url)
        .await?;

    // The order service's side: its outbox, and a stream for its events.
    let outbox = Arc::new(PostgresOutbox::with_options(
        pool.clone(),
        PostgresOutboxOptions::default().table(&format!("example_outbox_{run}")),
    )?);
    outbox.migrate().await?;
    let context = jetstream::new(async_nats::connect(&nats_url).await?);
    let stream = format!("EXAMPLE_SHIPPING_{run}");
    let prefix = format!("example-shipping-{run}");
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await?;
    for (order, status) in [
        ("order-1", "placed"),
        ("order-1", "paid"),
        ("order-1", "shipped"),
        ("order-2", "lost"),
    ] {
        let event = NewMessage::new(order, "order.changed", status.as_bytes().to_vec())?;
        outbox.enqueue(&event).await?;
    }
    let publisher = JetStreamPublisher::connect(&nats_url, JetStreamOptions::new(&prefix)?).await?;
    let relay = Relay::new(outbox.clone(), Arc::new(publisher), RelayOptions::default());
    while outbox.stats().await?.pending > 0 {
        relay.relay_once().await?;
    }
    println!(
        "published: order-1 placed, paid, shipped (versions 1 to 3); order-2 lost (version 1)"
    );

    // The shipping service's side: its inbox, parking and shipments table.
    let inbox = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&format!("example_inbox_{run}")),
    )?;
    inbox.migrate().await?;
    let parking = PostgresParking::with_options(
        pool.clone(),
        PostgresParkingOptions::default().table(&format!("example_parked_{run}")),
    )?;
    parking.migrate().await?;
    let shipments = format!("example_shipments_{run}");
    create(&pool, format!("CREATE TABLE {shipments} (id text PRIMARY KEY, version bigint NOT NULL, status text NOT NULL)")).await?;
    let paid_id = outbox_id(&pool, &run, "paid").await?.to_string();
    let handler = Shipping {
        inbox: inbox.clone(),
        versions: VersionedTable::new(&shipments, "id", "version")?,
        shipments: shipments.clone(),
        flaky: Mutex::new(HashSet::from([paid_id])),
    };
    let max_deliveries = 3;
    let consumer = Consumer::with_options(
        "shipping",
        Arc::new(inbox.clone()),
        Arc::new(parking.clone()),
        handler,
        ConsumerOptions::default()
            .max_deliveries(max_deliveries)
            .backoff(Duration::from_millis(200), Duration::from_secs(1)),
    )?;
    let config = JetStreamSource::durable("shipping", Duration::from_secs(2));
    let mut source = JetStreamSource::attach(&context, &stream, config).await?;
    consumer.check(&source.horizon())?;
    println!("inbox retention checked against the stream's redelivery horizon");

    let mut died = false;
    let mut redelivered = false;
    let mut settled = 0;
    // Until order-1 is shipped, order-2 parked, and the delivery whose
    // consumer died has come back.
    while settled < 2 || !redelivered {
        let next = tokio::time::timeout(Duration::from_secs(30), source.next()).await;
        let Ok(Ok(Some(delivery))) = next else {
            return Err("the stream stopped delivering".into());
        };
        let message = delivery.message();
        let label = format!(
            "{} v{} {} (delivery {})",
            message.aggregate().unwrap_or("?"),
            message.version().unwrap_or(0),
            String::from_utf8_lossy(message.payload()),
            delivery.deliveries()
        );
        if !died && message.aggregate() == Some("order-1") {
            died = true;
            let outcome = consumer.consume(&DiesBeforeAck(&delivery)).await;
            println!(
                "{label}: committed, then {}",
                outcome.err().map_or_else(String::new, |e| e.to_string())
            );
            continue;
        }
        let outcome = consumer.consume(&delivery).await?;
        println!("{label}: {}", describe(&outcome));
        redelivered |= outcome == Settled::Duplicate;
        let shipped: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT version FROM {shipments} WHERE id = 'order-1'"
        )))
        .fetch_optional(&pool)
        .await?;
        settled = usize::from(shipped == Some(3)) + consumer.parked(None, 10).await?.len();
    }

    for entry in consumer.parked(None, 10).await? {
        let message = &entry.parked.message;
        println!(
            "parked: {} v{} after {} deliveries: {}",
            message.aggregate().unwrap_or("?"),
            message.version().unwrap_or(0),
            entry.parked.deliveries,
            entry.parked.reason
        );
        consumer
            .drop_parked(message.id(), "refunded by the operator")
            .await?;
        println!("dropped by the operator: refunded");
    }
    let rows: Vec<(String, i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, version, status FROM {shipments} ORDER BY id"
    )))
    .fetch_all(&pool)
    .await?;
    for (id, version, status) in &rows {
        println!("shipment {id}: version {version}, {status}");
    }
    assert_eq!(rows, [("order-1".to_string(), 3, "shipped".to_string())]);
    println!("parked: {}", consumer.parked(None, 10).await?.len());

    context.delete_stream(&stream).await?;
    // Nothing of the run left behind: each store's tables and functions,
    // and the shipments.
    outbox.uninstall().await?;
    inbox.uninstall().await?;
    parking.uninstall().await?;
    create(&pool, format!("DROP TABLE IF EXISTS {shipments}")).await?;
    Ok(())
}

/// The id of the outbox message of `status`.
async fn outbox_id(pool: &PgPool, run: &str, status: &str) -> Result<uuid::Uuid, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM example_outbox_{run} WHERE payload = $1"
    )))
    .bind(status.as_bytes())
    .fetch_one(pool)
    .await
}

fn describe(outcome: &Settled) -> String {
    match outcome {
        Settled::Applied => "applied".into(),
        Settled::Duplicate => "a duplicate: acked, no second effect".into(),
        Settled::Stale => "stale: acked, no effect".into(),
        Settled::Retried { after, reason } => format!("{reason}; again in {after:?}"),
        Settled::InProgress { after } => format!("held by another delivery; again in {after:?}"),
        Settled::Parked { reason } => format!("parked: {reason}"),
        other => format!("{other:?}"),
    }
}
