//! `idem-bench-consumer`: a consumer with its inbox and commit measured
//! against a bare consumer that only acks, side by side in one run, on the
//! same broker: RabbitMQ (`idem_rabbitmq::RabbitSource`) and NATS
//! JetStream (`idem_nats::JetStreamSource`).
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-consumer -- --broker both --messages 2000
//! ```
//!
//! For each broker, `--messages` messages are published to a queue (a
//! stream) of the run's own, then drained one delivery at a time:
//!
//! - **bare**: each delivery acked, nothing else;
//! - **inbox**: each delivery through `idem_consumer::Consumer` over a
//!   Postgres inbox (`PostgresStore`, a fresh table): the claim (its own
//!   commit), the handler's one-row insert and the completion in one
//!   transaction (`PostgresStore::begin`), then the ack.
//!
//! Prints a markdown table (messages a second, and the ratio). Everything
//! it creates has a random name and is removed at the end. Nothing is
//! judged: there is no assertion on any timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use clap::{Parser, ValueEnum};
use idem_consumer::{Consumed, Consumer, Delivery, Handled, Handler, Source, async_trait};
use idem_core::store::{
    InboundMessage, MessageParts, MessageState, NewMessage, OutboxMessage, Timestamp,
};
use idem_core::{HandlerError, StoreError};
use idem_memory::MemoryParking;
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::Publisher;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PgTransaction, PostgresOptions, PostgresStore};
use idem_rabbitmq::{RabbitOptions, RabbitPublisher, RabbitSource, RabbitSourceOptions};
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Broker {
    Rabbitmq,
    Nats,
    Both,
}

/// Consumer throughput with the inbox against a bare consumer.
#[derive(Debug, Parser)]
struct Args {
    /// Which broker.
    #[arg(long, value_enum, default_value = "both")]
    broker: Broker,
    /// Messages per measurement.
    #[arg(long, default_value_t = 2000)]
    messages: usize,
}

type Fail = Box<dyn std::error::Error>;

/// Writes one row per message beside its inbox record.
struct Orders {
    inbox: PostgresStore,
    table: String,
}

#[async_trait]
impl Handler for Orders {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, body) VALUES ($1, $2)",
            self.table
        )))
        .bind(message.id().as_str())
        .bind(message.payload())
        .execute(&mut *tx)
        .await?;
        Ok((tx, Handled::Applied))
    }
}

/// `count` messages as the outbox would publish them.
fn messages(count: usize) -> Result<Vec<OutboxMessage>, Fail> {
    let mut batch = Vec::with_capacity(count);
    for n in 0..count {
        let aggregate = format!("order-{}", n % 100);
        let message = NewMessage::new(
            &aggregate,
            "order.placed",
            format!("{{\"n\":{n}}}").into_bytes(),
        )?;
        let parts = MessageParts {
            sequence: (n / 100 + 1) as u64,
            state: MessageState::Pending,
            attempts: 0,
            last_error: None,
            enqueued_at: Timestamp::from_unix_millis(0),
            available_at: Timestamp::from_unix_millis(0),
            lease_owner: None,
            lease_until: None,
            sent_at: None,
        };
        batch.push(OutboxMessage::new(message, parts));
    }
    Ok(batch)
}

async fn publish(publisher: &dyn Publisher, batch: &[OutboxMessage]) -> Result<(), Fail> {
    for chunk in batch.chunks(100) {
        for result in publisher.publish(chunk).await {
            result?;
        }
    }
    Ok(())
}

/// Drains `count` deliveries: acked bare, or through `consumer`; messages
/// a second.
async fn drain<S: Source>(
    source: &mut S,
    count: usize,
    consumer: Option<&Consumer<Orders>>,
) -> Result<f64, Fail> {
    let started = Instant::now();
    let mut done = 0;
    while done < count {
        let next = tokio::time::timeout(Duration::from_secs(60), source.next()).await??;
        let delivery = next.ok_or("the source closed")?;
        match consumer {
            None => delivery.ack().await?,
            Some(consumer) => {
                let outcome = consumer.consume(&delivery).await?;
                if outcome != Consumed::Applied {
                    return Err(format!("a delivery was {outcome:?}").into());
                }
            }
        }
        done += 1;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// A consumer over a fresh Postgres inbox and orders table.
async fn inbox_consumer(pool: &PgPool, run: &str) -> Result<Consumer<Orders>, Fail> {
    let inbox = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&format!("bench_inbox_{run}")),
    )?;
    inbox.migrate().await?;
    let table = format!("bench_orders_{run}");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, body bytea NOT NULL)"
    )))
    .execute(pool)
    .await?;
    let handler = Orders {
        inbox: inbox.clone(),
        table,
    };
    let parking = MemoryParking::new();
    Ok(Consumer::new(
        "bench",
        Arc::new(inbox),
        Arc::new(parking),
        handler,
    )?)
}

async fn drop_tables(pool: &PgPool, run: &str) -> Result<(), Fail> {
    for table in [format!("bench_inbox_{run}"), format!("bench_orders_{run}")] {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
            .execute(pool)
            .await?;
    }
    Ok(())
}

async fn nats(url: &str, pool: &PgPool, count: usize) -> Result<(f64, f64), Fail> {
    let context = jetstream::new(async_nats::connect(url).await?);
    let mut rates = Vec::new();
    for with_inbox in [false, true] {
        let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let stream = format!("BENCH_CONSUMER_{run}");
        let prefix = format!("bench-consumer-{run}");
        context
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{prefix}.>")],
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await?;
        let publisher = JetStreamPublisher::connect(url, JetStreamOptions::new(&prefix)?).await?;
        publish(&publisher, &messages(count)?).await?;
        let config = JetStreamSource::durable("bench", 5, Duration::from_secs(30));
        let mut source = JetStreamSource::attach(&context, &stream, config).await?;
        let consumer = match with_inbox {
            true => Some(inbox_consumer(pool, &run).await?),
            false => None,
        };
        rates.push(drain(&mut source, count, consumer.as_ref()).await?);
        context.delete_stream(&stream).await?;
        drop_tables(pool, &run).await?;
    }
    Ok((rates[0], rates[1]))
}

async fn rabbitmq(url: &str, pool: &PgPool, count: usize) -> Result<(f64, f64), Fail> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let mut rates = Vec::new();
    for with_inbox in [false, true] {
        let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let (exchange, queue) = (
            format!("bench-consumer-{run}"),
            format!("bench-consumer-{run}"),
        );
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        idem_rabbitmq::bound_queue(&channel, &exchange, &queue, FieldTable::default()).await?;
        let publisher = RabbitPublisher::connect(url, RabbitOptions::new(&exchange)?).await?;
        publish(&publisher, &messages(count)?).await?;
        let mut source = RabbitSource::connect(url, RabbitSourceOptions::new(&queue, 5)?).await?;
        let consumer = match with_inbox {
            true => Some(inbox_consumer(pool, &run).await?),
            false => None,
        };
        rates.push(drain(&mut source, count, consumer.as_ref()).await?);
        source.close().await?;
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await?;
        drop_tables(pool, &run).await?;
    }
    Ok((rates[0], rates[1]))
}

#[tokio::main]
async fn main() -> Result<(), Fail> {
    let args = Args::parse();
    let pg_url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nats_url =
        std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let amqp_url = std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let pool = idem_postgres::guarded(sqlx::postgres::PgPoolOptions::new())
        .max_connections(4)
        .connect(&pg_url)
        .await?;
    println!(
        "| broker | bare consumer (acks only), msg/s | consumer with Postgres inbox and commit, msg/s | inbox / bare |"
    );
    println!("|---|---|---|---|");
    let brokers: &[Broker] = match args.broker {
        Broker::Both => &[Broker::Rabbitmq, Broker::Nats],
        one => std::slice::from_ref(match one {
            Broker::Rabbitmq => &Broker::Rabbitmq,
            _ => &Broker::Nats,
        }),
    };
    for broker in brokers {
        let (name, (bare, inbox)) = match broker {
            Broker::Rabbitmq => ("rabbitmq", rabbitmq(&amqp_url, &pool, args.messages).await?),
            _ => ("nats", nats(&nats_url, &pool, args.messages).await?),
        };
        println!("| {name} | {bare:.0} | {inbox:.0} | {:.2} |", inbox / bare);
    }
    Ok(())
}
