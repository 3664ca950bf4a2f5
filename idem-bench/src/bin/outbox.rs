//! `idem-bench-outbox`: the transactional outbox's relay measured against
//! the raw broker client, side by side in one run, for RabbitMQ
//! (`idem-rabbitmq` over lapin), NATS JetStream (`idem-nats` over
//! async-nats) and, with `--broker kafka` or `all`, Kafka (`idem-kafka`
//! over rdkafka: a topic of four partitions; the raw baseline is an
//! rdkafka producer configured as `KafkaPublisher`'s, awaiting every
//! delivery report of a batch before the next).
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-outbox -- --broker both --messages 20000 --duration 5 --in-flight 4
//! ```
//!
//! For each broker:
//!
//! 1. **Throughput.** A Postgres outbox of 1 or 2 partitions on a fresh
//!    table, pre-filled with `--messages` (`--batch-one-messages` at batch 1) over `--aggregates`, drained by
//!    one relay holding every partition (one publisher, one broker
//!    connection: a first batch of each partition by `Relay::relay_once`,
//!    then `Relay::drain` until every message is published) at batch 1 and
//!    batch 100, each with 1 batch in flight per partition (read, publish,
//!    advance, one after another) and with `--in-flight` batches
//!    (`RelayOptions::with_in_flight`: the next batch is read and the
//!    cursor moved past earlier ones while the broker confirms one; the
//!    broker still gets a partition's batches one at a time). Each batch
//!    costs the store one read and one write (its advance: the cursor's
//!    row), counted; and the message table's dead rows after the drain
//!    are read from the server's statistics. Against the raw baseline, measured in the
//!    same run: the same client publishing as many messages of the same
//!    shape to the same broker in batches of the same size, awaiting every
//!    confirm of a batch before the next (lapin in confirm mode, persistent
//!    and mandatory; async-nats awaiting each PubAck). The ratio relay/raw
//!    (messages per second, relay over raw) is what the outbox costs.
//!    Each stage's time (read, publish, advance) is added up over the drain
//!    and reported per batch; with batches in flight the stages overlap, so
//!    they add up to more than a batch takes. A last measurement at batch
//!    100 spreads the messages over `--wide-aggregates` (1,000).
//!    Each batch-100 measurement is drained once more with Postgres
//!    `--pg-delay-ms` away (1 ms each way, through a proxy that holds every
//!    byte that long): round trips that cost time but no CPU, as across a
//!    network, where overlapping them with the broker's confirms pays.
//!    Before the relay, the raw publish runs again with, beside each
//!    batch (sent as it starts), the least Postgres work any relay does
//!    for it (`Floor`: one committed statement reading the batch's rows
//!    and writing one row): floor/raw bounds relay/raw on this machine,
//!    whatever the store's design. Raw and floor run 5 times each,
//!    alternating, and each reports its median run.
//! 2. **Postgres statements per relay batch**: the store's calls in the
//!    timed drain (its reads of the log and the retry lane, and its
//!    advances, each carrying the next read once the window is full), one
//!    statement each on Postgres; and round trips per batch, counted on the
//!    wire by idem-postgres's counting proxy
//!    (`idem-postgres/tests/common/proxy.rs`, compiled in from there) in
//!    front of the relay's pool (four connections), on a second drain of up
//!    to 1,000 messages: the proxy leaves Nagle's algorithm on, so the timed
//!    drain goes straight to the server (through it, the relay waits on its
//!    reads, its window is seldom full, and a read seldom goes with a
//!    settlement). The first batch, run alone, is reported apart. Round trips that only prepare a statement (sqlx's, at
//!    its first use on each of the pool's connections) are not counted, and
//!    sqlx's pings of a connection returning to the pool (a Sync alone, off
//!    the relay's path) are counted apart.
//! 3. **Commit-to-broker latency.** Messages enqueued, one committed
//!    transaction each, at `--rate` for `--duration` seconds, relayed by
//!    `Relay::run` (default options, batch 100) woken by
//!    `PostgresOutbox::listen`; a consumer on the
//!    broker stamps each arrival. Latency is the arrival less the moment the
//!    commit returned, both on this process's monotonic clock (an arrival
//!    before the commit returned counts as zero).
//!
//! With `--store dynamo` (or `both`, after the Postgres measurements), for
//! each broker: a DynamoDB outbox (`idem_dynamo::DynamoOutbox`) on the
//! emulator at `IDEM_DYNAMO_ENDPOINT`, of 1 or 2 partitions, pre-filled with
//! `--dynamo-messages` (one `enqueue` each, from one writer) and drained
//! by one relay at batch 100 with 1 or `--in-flight` batches in flight,
//! beside the raw publish of as many messages (the median of 5 runs) and
//! the same drain through a publisher that confirms at once. The client
//! counts its requests: per relay batch and per enqueued message, the
//! figures that carry over from moto (one request at a time, in Python) to
//! DynamoDB, whose throughput moto's says little about.
//!
//! Writes `<out>/outbox.jsonl` (one JSON line per measurement) and
//! `<out>/outbox.md`, and prints the markdown. Everything it creates has a
//! random name and is removed at the end: a Postgres schema of its own, a
//! RabbitMQ exchange and queue, a JetStream stream (the queue and the
//! stream also expire by themselves should the run die). Nothing is judged:
//! there is no assertion on any timing.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, Context};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use idem_bench::cpu::{self, CpuPerUnit, CpuSample};
use idem_bench::percentile;
use idem_core::StoreError;
use idem_core::store::{
    Advance, AdvancedRead, Capabilities, LogBatch, LogPosition, MessageId, NewMessage,
    OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PageAfter, PartitionLease,
};
use idem_dynamo::aws_sdk_dynamodb;
use idem_dynamo::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use idem_dynamo::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use idem_dynamo::{DynamoOutbox, DynamoOutboxOptions};
use idem_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem_kafka::rdkafka::client::DefaultClientContext;
use idem_kafka::rdkafka::consumer::{Consumer as _, StreamConsumer};
use idem_kafka::rdkafka::error::KafkaError;
use idem_kafka::rdkafka::message::{
    Header as KafkaHeader, Headers as _, Message as _, OwnedHeaders,
};
use idem_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem_kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use idem_kafka::{KafkaOptions, KafkaPublisher};
use idem_nats::{JetStreamOptions, JetStreamPublisher};
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions, async_trait};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PostgresOutbox, PostgresOutboxOptions};
use idem_rabbitmq::{RabbitOptions, RabbitPublisher};
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// The counting proxy of idem-postgres's round-trip tests, compiled in from
/// there rather than copied.
#[path = "../../../idem-postgres/tests/common/proxy.rs"]
mod proxy;

use proxy::CountingProxy;

type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// The relay batch sizes measured, and the raw baseline's.
const BATCHES: [usize; 2] = [1, 100];

/// The partition counts each relay measurement runs with: one relay
/// drains every partition at once.
const PARTITIONS: [u32; 2] = [1, 2];

/// The batch of the measurement over `--wide-aggregates`, and of the
/// drains with Postgres `--pg-delay-ms` away.
const WIDE_BATCH: usize = 100;

/// Every message's kind: the RabbitMQ routing key, the NATS subject's tail.
const KIND: &str = "order.placed";

/// Raw runs, and floor runs, per throughput measurement, alternating; the
/// median of each is reported. A raw JetStream run of 5,000 messages lasts
/// under 100 ms, so a single one is mostly the machine's noise.
const RAW_ROUNDS: usize = 5;

/// Messages (at most) of the drain through the counting proxy.
const COUNTED_MESSAGES: usize = 1000;

/// The relay's pool in the throughput measurement: a read and an advance run
/// at once with batches in flight, and sqlx pings every connection as it
/// returns to the pool; with spare connections the next statement need not
/// wait for that ping.
const RELAY_CONNECTIONS: u32 = 4;

/// The relay's batch in the latency measurement.
const LATENCY_BATCH: usize = 100;

/// Enqueueing tasks that pre-fill an outbox, each with aggregates of its own.
const FILL_TASKS: usize = 4;

/// How long a drain, a raw run or the wait for the last arrival may take
/// before the run gives up (a stuck broker, not a slow one).
const PATIENCE: Duration = Duration::from_secs(300);

/// How long the latency phase waits for stragglers once arrivals stop.
const SETTLE: Duration = Duration::from_secs(10);

/// Messages enqueued and relayed before the latency phase counts, so the
/// first statements' preparation is not measured.
const WARM_UP: usize = 20;

/// Broker queues and streams expire after this long unused, should the
/// run die before it removes them.
const EXPIRES: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreChoice {
    Postgres,
    Dynamo,
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BrokerChoice {
    Rabbitmq,
    Nats,
    Kafka,
    /// RabbitMQ and NATS.
    Both,
    /// All three.
    All,
}

/// The outbox relay against the raw broker client.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// The brokers to measure.
    #[arg(long, value_enum, default_value = "both")]
    broker: BrokerChoice,
    /// The outbox stores to measure: Postgres (every measurement), DynamoDB
    /// on the emulator at `IDEM_DYNAMO_ENDPOINT` (relay throughput at batch
    /// 100 and requests per batch, beside the raw publish), or both.
    #[arg(long, value_enum, default_value = "postgres")]
    store: StoreChoice,
    /// Messages per DynamoDB throughput measurement: moto serves one
    /// request at a time, far slower than DynamoDB.
    #[arg(long, default_value_t = 1000)]
    dynamo_messages: usize,
    /// Messages per throughput measurement (relay and raw alike) at batch
    /// 100: enough that what a drain pays once (its first pass, each
    /// connection preparing its statements) is not what it measures.
    #[arg(long, default_value_t = 20000)]
    messages: usize,
    /// Messages per throughput measurement at batch 1, where each costs a
    /// round trip to the broker and one to Postgres (its settlement with the next read).
    #[arg(long, default_value_t = 5000)]
    batch_one_messages: usize,
    /// Aggregates the messages are spread over (pre-filled in rounds of one
    /// message of each: a relay batch holds at most one message of each
    /// while its partition holds a batch's worth of aggregates).
    #[arg(long, default_value_t = 100)]
    aggregates: usize,
    /// Aggregates of a last throughput measurement at batch 100 (skipped
    /// unless more than `--aggregates`): more aggregates due than one batch
    /// holds, so the next batch takes other aggregates' heads rather than
    /// the next messages of those at the broker.
    #[arg(long, default_value_t = 1000)]
    wide_aggregates: usize,
    /// Batches the relay keeps in flight in the second measurement of each
    /// batch size (the first is 1: read, publish, advance one after another).
    #[arg(long, default_value_t = 4)]
    in_flight: usize,
    /// Milliseconds each way between the relay and Postgres in one more
    /// drain of each batch-100 measurement (through a proxy that holds every
    /// byte that long), as a database across a network would be; 0 skips
    /// it. Round trips then cost time but no CPU, which is where batches in
    /// flight (the next read while the broker confirms the last) pay.
    #[arg(long, default_value_t = 1)]
    pg_delay_ms: u64,
    /// Seconds of enqueueing in the latency measurement.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Messages per second enqueued in the latency measurement.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// Where outbox.jsonl and outbox.md are written.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

/// One throughput measurement: one broker, one batch size, relay and raw.
#[derive(Debug, Clone, Serialize)]
struct Throughput {
    broker: &'static str,
    batch: usize,
    /// Batches the relay keeps in flight per partition
    /// (`RelayOptions::with_in_flight`): 1 is read, publish, advance, one
    /// after another.
    in_flight: usize,
    /// The outbox's partitions, all drained by the one relay at once.
    partitions: u32,
    messages: usize,
    aggregates: usize,
    /// Messages per second through the relay, from its first read to its
    /// last advance.
    relay_msgs_per_s: f64,
    /// Messages per second through the client alone, confirms awaited
    /// (the median of [`RAW_ROUNDS`] runs).
    raw_msgs_per_s: f64,
    /// relay / raw.
    ratio: f64,
    relay_seconds: f64,
    /// The time spent in the publisher (the broker's confirms awaited),
    /// added up over batches. With batches in flight the three parts
    /// overlap, so they add up to more than `relay_seconds`.
    relay_publish_seconds: f64,
    /// The publisher's calls per batch: the waves a batch went out in
    /// (never two messages of one aggregate at the broker at once).
    relay_waves_per_batch: f64,
    /// The time spent in the store's reads, added up.
    relay_read_seconds: f64,
    /// The time spent in the store's advances, added up.
    relay_advance_seconds: f64,
    /// The store's writes (advances) per batch of the timed drain.
    pg_writes_per_batch: f64,
    /// The store's calls (reads of the log and the lane, advances alone or
    /// with a read) per batch of the timed drain: on Postgres, one
    /// statement each.
    pg_calls_per_batch: f64,
    /// Dead rows of the message table after the timed drain, and of its
    /// partition table (the one row an advance rewrites).
    dead_rows_messages: i64,
    dead_rows_partitions: i64,
    raw_seconds: f64,
    /// Reads that found something.
    batches: u64,
    /// Messages of the second drain, through the counting proxy, that the
    /// round trips below come from.
    counted_messages: usize,
    /// Its reads that found something.
    counted_batches: u64,
    /// Statement round trips of the first batch.
    pg_round_trips_first_batch: u64,
    /// Mean statement round trips of every later batch: its read, its
    /// share of the advances (batches confirmed together are settled in
    /// one), the retry lane's reads and the drain's last read that found
    /// nothing.
    pg_round_trips_per_batch: f64,
    /// Syncs with no statement (sqlx's pings), over the whole counted drain.
    pg_pings: u64,
    /// Every round trip of the drain on the wire (each ReadyForQuery:
    /// statements, pings).
    pg_round_trips_total: u64,
    /// Publishes the relay counted failed or parked.
    relay_failed: u64,
    /// Publishes of the raw baseline not acknowledged, over its rounds.
    raw_failed: u64,
    /// Messages per second through the same relay and store with a
    /// publisher that confirms at once: the store's and the relay's own
    /// ceiling, with no broker.
    store_alone_msgs_per_s: f64,
    /// Messages per second of the raw publish with the [`Floor`]'s
    /// statement beside each batch (the median of [`RAW_ROUNDS`] runs,
    /// alternating with raw's): the ceiling of any relay over Postgres on
    /// this machine (the same for every `in_flight`).
    floor_msgs_per_s: f64,
    /// CPU per message of that run, by process.
    floor_cpu: CpuPerUnit,
    /// CPU per message of the relay's drain, by process (this one, the
    /// broker, Postgres).
    relay_cpu: CpuPerUnit,
    /// CPU per message of the raw baseline, by process.
    raw_cpu: CpuPerUnit,
    /// CPU per message of the drain with no broker, by process.
    store_alone_cpu: CpuPerUnit,
    /// Milliseconds each way to Postgres of the remote drain (none measured
    /// when absent).
    remote_delay_ms: Option<u64>,
    /// Messages per second of the same drain with Postgres that far away.
    remote_msgs_per_s: Option<f64>,
}

/// One latency measurement.
#[derive(Debug, Clone, Serialize)]
struct Latency {
    broker: &'static str,
    /// The rate asked for.
    rate: u32,
    /// The rate achieved.
    enqueued_per_s: f64,
    enqueued: usize,
    arrived: usize,
    relay_batch: usize,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
}

/// One throughput measurement of a DynamoDB outbox (on moto): one broker,
/// the relay and the raw publish at batch 100.
#[derive(Debug, Clone, Serialize)]
struct DynamoThroughput {
    broker: &'static str,
    batch: usize,
    in_flight: usize,
    partitions: u32,
    messages: usize,
    aggregates: usize,
    /// Messages per second through the relay, from its first read to its
    /// last advance.
    relay_msgs_per_s: f64,
    /// Messages per second through the client alone (the median of
    /// [`RAW_ROUNDS`] runs).
    raw_msgs_per_s: f64,
    /// relay / raw.
    ratio: f64,
    relay_seconds: f64,
    /// Messages per second of the same drain through a publisher that
    /// confirms at once: the store's and the relay's own ceiling (here,
    /// the emulator's).
    store_alone_msgs_per_s: f64,
    /// Requests to DynamoDB per batch of the drain (reads of the logs and
    /// lanes, advances, acquires and the last reads that found nothing):
    /// the figure that carries over from the emulator to DynamoDB.
    requests_per_batch: f64,
    /// Requests to DynamoDB per message of the fill (`enqueue`, each in a
    /// transaction of its own).
    enqueue_requests_per_message: f64,
    batches: u64,
    relay_failed: u64,
}

/// One JSON line.
#[derive(Debug, Serialize)]
#[serde(tag = "bench", rename_all = "snake_case")]
enum Line {
    Throughput(Box<Throughput>),
    Latency(Latency),
    Dynamo(Box<DynamoThroughput>),
}

/// The payload of the `i`-th message.
fn payload(i: usize) -> Vec<u8> {
    format!(r#"{{"order":{i},"status":"placed","total":42}}"#).into_bytes()
}

/// The aggregate of the `i`-th message.
fn aggregate(i: usize, aggregates: usize) -> String {
    format!("order-{}", i % aggregates)
}

/// Postgres: the server, and a schema of the run's own that holds every
/// outbox table it creates.
struct Pg {
    options: PgConnectOptions,
    upstream: String,
    schema: String,
    admin: PgPool,
}

impl Pg {
    async fn connect(id: &str) -> Result<Self, BenchError> {
        let url = env("IDEM_POSTGRES_URL")?;
        let options = PgConnectOptions::from_str(&url)?;
        let upstream = format!("{}:{}", options.get_host(), options.get_port());
        let admin = pool(options.clone(), 2).await?;
        let schema = format!("idem_bench_outbox_{id}");
        // A validated identifier: lowercase letters, digits and underscores.
        sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&admin)
            .await?;
        Ok(Self {
            options,
            upstream,
            schema,
            admin,
        })
    }

    /// A pool of `max` connections straight to the server.
    async fn pool(&self, max: u32) -> Result<PgPool, BenchError> {
        pool(self.options.clone(), max).await
    }

    /// An outbox of `partitions` on the table `name` of the run's schema,
    /// over `pool`.
    fn outbox(
        &self,
        pool: PgPool,
        name: &str,
        partitions: u32,
    ) -> Result<PostgresOutbox, BenchError> {
        let table = format!("{}.{name}", self.schema);
        Ok(PostgresOutbox::with_options(
            pool,
            PostgresOutboxOptions::default()
                .table(&table)
                .partitions(partitions),
        )?)
    }

    /// A migrated outbox of `partitions` on a new table `name`, over a pool
    /// of its own.
    async fn fresh_outbox(
        &self,
        name: &str,
        max: u32,
        partitions: u32,
    ) -> Result<PostgresOutbox, BenchError> {
        let outbox = self.outbox(self.pool(max).await?, name, partitions)?;
        outbox.migrate().await?;
        Ok(outbox)
    }

    async fn drop_schema(&self) -> Result<(), BenchError> {
        sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema
        )))
        .execute(&self.admin)
        .await?;
        self.admin.close().await;
        Ok(())
    }
}

/// A pool of `max` connections that does not ping before each use, so one
/// store operation is one round trip, with every connection open: as a
/// running service's pool is, so no measurement counts connecting (tens of
/// milliseconds of both processes' CPU each).
async fn pool(options: PgConnectOptions, max: u32) -> Result<PgPool, BenchError> {
    let pool = idem_postgres::guarded(PgPoolOptions::new())
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?;
    let mut open = Vec::new();
    for _ in 0..max {
        open.push(pool.acquire());
    }
    for connection in futures_util::future::join_all(open).await {
        connection?;
    }
    Ok(pool)
}

/// The value of an environment variable that scripts/services.sh sets.
fn env(name: &str) -> Result<String, BenchError> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set (scripts/services.sh's ensure_* functions set it)").into()
    })
}

/// Enqueues `messages` over `aggregates`, message `i` to aggregate
/// `i % aggregates`, in rounds of one message of each aggregate: the
/// [`FILL_TASKS`] tasks each enqueue a round's messages of their own
/// aggregates in one transaction, and a round starts once the last one
/// committed. So each log holds the messages in the raw publish's order,
/// by rounds, and a relay batch holds at most one message of each
/// aggregate, as the raw publish's batches do, while its partition holds a
/// batch's worth of aggregates (100 aggregates over 2 partitions put two
/// messages of some in each batch of 100).
async fn fill(
    outbox: &PostgresOutbox,
    messages: usize,
    aggregates: usize,
) -> Result<(), BenchError> {
    for first in (0..messages).step_by(aggregates) {
        let round = first..(first + aggregates).min(messages);
        let tasks: Vec<JoinHandle<Result<(), BenchError>>> = (0..FILL_TASKS)
            .map(|task| {
                let outbox = outbox.clone();
                let mine: Vec<usize> = round
                    .clone()
                    .filter(|i| (i % aggregates) % FILL_TASKS == task)
                    .collect();
                tokio::spawn(async move {
                    if mine.is_empty() {
                        return Ok(());
                    }
                    let mut tx = outbox.pool().begin().await?;
                    for i in mine {
                        let message = NewMessage::new(&aggregate(i, aggregates), KIND, payload(i))?;
                        outbox.enqueue_in(&mut tx, &message).await?;
                    }
                    tx.commit().await?;
                    Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
    }
    Ok(())
}

/// A publisher that adds up the time its batches take, so a relay pass
/// splits into publishing and the rest (the store's round trips), and
/// counts them: a relay batch holding several messages of one aggregate
/// goes to the broker in as many waves, each awaiting the last's confirms.
struct Timed {
    inner: Arc<dyn Publisher>,
    nanos: AtomicU64,
    calls: AtomicU64,
}

#[async_trait]
impl Publisher for Timed {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let started = Instant::now();
        let results = self.inner.publish(batch).await;
        add_elapsed(&self.nanos, started);
        self.calls.fetch_add(1, Ordering::SeqCst);
        results
    }
}

/// A publisher that confirms every message at once: a drain through it
/// costs the store and the relay alone.
struct ConfirmsAtOnce;

#[async_trait]
impl Publisher for ConfirmsAtOnce {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        batch.iter().map(|_| Ok(Published::stored())).collect()
    }
}

/// Nanoseconds added up, for [`Timed`] and [`TimedStore`].
fn add_elapsed(total: &AtomicU64, started: Instant) {
    let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    total.fetch_add(nanos, Ordering::SeqCst);
}

/// An outbox store that adds up the time of its reads (of the logs and the
/// retry lanes) and of its advances (with the read an advance carries), and
/// counts its advances (the one write of a batch), so a relay pass splits
/// into its parts.
#[derive(Debug)]
struct TimedStore {
    inner: PostgresOutbox,
    reading: AtomicU64,
    advancing: AtomicU64,
    advances: AtomicU64,
    /// Reads of the logs and the lanes (a read an advance carried is not
    /// one).
    reads: AtomicU64,
}

#[async_trait]
impl OutboxStore for TimedStore {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        self.inner.enqueue(message).await
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        self.inner.acquire(owner, lease).await
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        let started = Instant::now();
        let read = self.inner.read(partition, after, limit).await;
        add_elapsed(&self.reading, started);
        self.reads.fetch_add(1, Ordering::SeqCst);
        read
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        let started = Instant::now();
        let advanced = self.inner.advance(lease, advance).await;
        add_elapsed(&self.advancing, started);
        self.advances.fetch_add(1, Ordering::SeqCst);
        advanced
    }

    async fn advance_and_read(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
        after: LogPosition,
        limit: usize,
    ) -> Result<AdvancedRead, StoreError> {
        let started = Instant::now();
        let advanced = self
            .inner
            .advance_and_read(lease, advance, after, limit)
            .await;
        add_elapsed(&self.advancing, started);
        self.advances.fetch_add(1, Ordering::SeqCst);
        advanced
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let started = Instant::now();
        let due = self.inner.due(partition, limit).await;
        add_elapsed(&self.reading, started);
        self.reads.fetch_add(1, Ordering::SeqCst);
        due
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        self.inner.release(lease).await
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        self.inner.parked(after, limit).await
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        self.inner.retry(id).await
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        self.inner.drop_message(id, reason).await
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        self.inner.message(id).await
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_sent(older_than, limit).await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.inner.stats().await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// What the relay's drain measured.
struct Drain {
    elapsed: Duration,
    /// Of which in the publisher, to the broker's last confirm.
    publishing: Duration,
    /// The publisher's calls: waves sent to the broker.
    publishes: u64,
    /// Of which in the store's reads (logs and retry lanes).
    reading: Duration,
    /// Of which in the store's advances (cursor moves and failures).
    advancing: Duration,
    /// The store's advances: its writes.
    writes: u64,
    /// The store's calls: its reads and advances.
    calls: u64,
    batches: u64,
    first_batch: u64,
    /// Batches after the first, and their statement round trips.
    later_batches: u64,
    later_round_trips: u64,
    pings: u64,
    round_trips: u64,
    failed: u64,
    /// CPU per message over the drain (from its first read to its last
    /// advance), by process.
    cpu: CpuPerUnit,
}

/// What a drain relays, and how.
#[derive(Debug, Clone, Copy)]
struct Shape {
    batch: usize,
    in_flight: usize,
    partitions: u32,
    messages: usize,
    aggregates: usize,
}

/// How the relay's pool reaches Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Straight to the server, for the timing.
    Direct,
    /// Through the counting proxy, which counts every round trip (it
    /// leaves Nagle's algorithm on, which delays a large reply's last
    /// segment by tens of milliseconds: not for timing).
    Counted,
    /// Through the proxy holding every byte this long each way.
    Away(Duration),
}

/// What a relay's passes did, added up.
#[derive(Debug, Default)]
struct Passes {
    /// Reads that found something.
    batches: u64,
    /// Of those, after the first pass.
    later_batches: u64,
    /// Publishes failed or parked.
    failed: u64,
}

/// Passes of `relay` until `messages` are published: a first pass alone
/// (`Relay::relay_once`, after which `first` runs), then `Relay::drain`
/// with the batches in flight its options say.
async fn relay_all<S: OutboxStore + ?Sized, P: Publisher + ?Sized + 'static>(
    relay: &Relay<S, P>,
    messages: usize,
    started: Instant,
    first: impl FnOnce(),
) -> Result<Passes, BenchError> {
    let once = relay.relay_once().await?;
    first();
    let mut passes = Passes {
        batches: once.batches as u64,
        later_batches: 0,
        failed: (once.failed + once.parked) as u64,
    };
    let mut published = once.published;
    while published < messages as u64 {
        if started.elapsed() > PATIENCE {
            return Err(format!("the relay published {published} of {messages} in time").into());
        }
        let pass = relay.drain().await?;
        if pass.read == 0 {
            // Only failed messages are left, waiting out their back-off.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        passes.batches += pass.batches as u64;
        passes.later_batches += pass.batches as u64;
        published += pass.published;
        passes.failed += (pass.failed + pass.parked) as u64;
    }
    Ok(passes)
}

/// Drains an outbox pre-filled as `shape` says through `publisher`, with
/// its batches in flight (`Relay::drain`) after a first batch alone
/// (`Relay::relay_once`), its pool reaching Postgres by `route`.
async fn relay_drain(
    pg: &Pg,
    publisher: Arc<dyn Publisher>,
    name: &str,
    shape: Shape,
    route: Route,
    broker: &[&str],
) -> Result<Drain, BenchError> {
    let Shape {
        batch,
        in_flight,
        partitions,
        messages,
        aggregates,
    } = shape;
    let filler = pg.fresh_outbox(name, FILL_TASKS as u32, partitions).await?;
    fill(&filler, messages, aggregates).await?;
    filler.pool().close().await;

    let proxy = match route {
        Route::Direct => None,
        Route::Counted => Some(CountingProxy::start(pg.upstream.clone()).await),
        Route::Away(delay) => Some(CountingProxy::start_delayed(pg.upstream.clone(), delay).await),
    };
    let options = match &proxy {
        Some(proxy) => pg
            .options
            .clone()
            .host("127.0.0.1")
            .port(proxy.port)
            .ssl_mode(PgSslMode::Disable),
        None => pg.options.clone(),
    };
    let relay_pool = pool(options, RELAY_CONNECTIONS).await?;
    let outbox = pg.outbox(relay_pool.clone(), name, partitions)?;
    let timed = Arc::new(Timed {
        inner: publisher,
        nanos: AtomicU64::new(0),
        calls: AtomicU64::new(0),
    });
    let store = Arc::new(TimedStore {
        inner: outbox,
        reading: AtomicU64::new(0),
        advancing: AtomicU64::new(0),
        advances: AtomicU64::new(0),
        reads: AtomicU64::new(0),
    });
    let relay = Relay::new(
        Arc::clone(&store),
        Arc::clone(&timed),
        RelayOptions::default()
            .with_batch(batch)?
            .with_in_flight(in_flight)?,
    );

    let statements = || proxy.as_ref().map_or(0, CountingProxy::statements);
    let pings = || {
        proxy
            .as_ref()
            .map_or(0, |p| p.counts.pings.load(Ordering::SeqCst))
    };
    let ready = || proxy.as_ref().map_or(0, CountingProxy::ready);
    let (pings_before, ready_before) = (pings(), ready());
    let cpu_before = CpuSample::now(broker);
    let started = Instant::now();
    let mut drain = Drain {
        elapsed: Duration::ZERO,
        publishing: Duration::ZERO,
        publishes: 0,
        reading: Duration::ZERO,
        advancing: Duration::ZERO,
        writes: 0,
        calls: 0,
        batches: 0,
        first_batch: 0,
        later_batches: 0,
        later_round_trips: 0,
        pings: 0,
        round_trips: 0,
        failed: 0,
        cpu: CpuPerUnit::default(),
    };
    // The first batch alone, then drains with
    // the batches in flight asked for.
    let passes = relay_all(&relay, messages, started, || {
        drain.first_batch = statements()
    })
    .await?;
    drain.batches = passes.batches;
    drain.later_batches = passes.later_batches;
    drain.failed = passes.failed;
    drain.later_round_trips = statements() - drain.first_batch;
    drain.elapsed = started.elapsed();
    drain.cpu = CpuSample::now(broker).per_unit_since(&cpu_before, messages);
    drain.publishing = Duration::from_nanos(timed.nanos.load(Ordering::SeqCst));
    drain.publishes = timed.calls.load(Ordering::SeqCst);
    drain.reading = Duration::from_nanos(store.reading.load(Ordering::SeqCst));
    drain.advancing = Duration::from_nanos(store.advancing.load(Ordering::SeqCst));
    drain.writes = store.advances.load(Ordering::SeqCst);
    drain.calls = drain.writes + store.reads.load(Ordering::SeqCst);
    drain.pings = pings() - pings_before;
    // Every ReadyForQuery answers a statement or a ping.
    drain.round_trips = ready() - ready_before;
    relay_pool.close().await;
    Ok(drain)
}

/// Dead rows of the outbox `name`'s message table and partition table, by
/// the server's statistics, once the backends' counts reached them (each
/// reports at most once a second).
async fn dead_rows(pg: &Pg, name: &str) -> Result<(i64, i64), BenchError> {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let dead = |table: String| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname = $2",
        )
        .bind(&pg.schema)
        .bind(table)
        .fetch_optional(&pg.admin)
        .await
        .map(Option::unwrap_or_default)
    };
    Ok((
        dead(name.to_string()).await?,
        dead(format!("{name}_partitions")).await?,
    ))
}

/// One broker: what the run created on it, a relay publisher, the raw
/// baseline and a consumer.
enum Broker {
    Rabbit(Rabbit),
    Nats(Nats),
    Kafka(Kafka),
}

struct Rabbit {
    url: String,
    connection: Connection,
    exchange: String,
    queue: String,
}

struct Nats {
    url: String,
    context: Context,
    stream: String,
    prefix: String,
}

struct Kafka {
    brokers: String,
    topic: String,
    admin: AdminClient<DefaultClientContext>,
}

/// What a raw baseline measured.
struct RawRun {
    elapsed: Duration,
    failed: u64,
}

/// Each arrival on the broker: the message id and when it came.
type Arrivals = mpsc::UnboundedReceiver<(String, Instant)>;

impl Broker {
    fn name(&self) -> &'static str {
        match self {
            Self::Rabbit(_) => idem_rabbitmq::BROKER,
            Self::Nats(_) => idem_nats::BROKER,
            Self::Kafka(_) => idem_kafka::BROKER,
        }
    }

    /// The command names of the broker's server processes, whose CPU is
    /// counted as the broker's.
    fn processes(&self) -> &'static [&'static str] {
        match self {
            Self::Rabbit(_) => cpu::RABBITMQ,
            Self::Nats(_) => cpu::NATS,
            Self::Kafka(_) => cpu::KAFKA,
        }
    }

    /// A topic exchange and a durable queue bound to every routing key.
    async fn rabbit(id: &str) -> Result<Self, BenchError> {
        let url = env("IDEM_AMQP_URL")?;
        let connection = Connection::connect(
            &url,
            ConnectionProperties::default().with_connection_name("idem-bench-outbox".into()),
        )
        .await?;
        let channel = connection.create_channel().await?;
        let exchange = format!("idem-bench-outbox-{id}");
        let queue = format!("idem-bench-outbox-{id}");
        // The exchange goes with its last binding, the queue after
        // EXPIRES unused: nothing stays should the run die.
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    auto_delete: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-expires".into(),
            AMQPValue::LongLongInt(i64::try_from(EXPIRES.as_millis())?),
        );
        idem_rabbitmq::bound_queue(&channel, &exchange, &queue, arguments).await?;
        channel.close(200, "set up".into()).await?;
        Ok(Self::Rabbit(Rabbit {
            url,
            connection,
            exchange,
            queue,
        }))
    }

    /// A file-backed stream on `<prefix>.>`.
    async fn nats(id: &str) -> Result<Self, BenchError> {
        let url = env("IDEM_NATS_URL")?;
        let context = jetstream::new(async_nats::connect(url.as_str()).await?);
        let stream = format!("IDEM_BENCH_OUTBOX_{id}");
        let prefix = format!("idem-bench-outbox-{id}");
        context
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{prefix}.>")],
                storage: jetstream::stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                max_age: EXPIRES,
                ..Default::default()
            })
            .await?;
        Ok(Self::Nats(Nats {
            url,
            context,
            stream,
            prefix,
        }))
    }

    /// A topic of four partitions (the aggregates spread over them).
    async fn kafka(id: &str) -> Result<Self, BenchError> {
        let brokers = env("IDEM_KAFKA_BROKERS")?;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()?;
        let topic = format!("idem-bench-outbox-{id}");
        for created in admin
            .create_topics(
                &[NewTopic::new(&topic, 4, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await?
        {
            created.map_err(|(topic, code)| format!("topic {topic}: {code}"))?;
        }
        Ok(Self::Kafka(Kafka {
            brokers,
            topic,
            admin,
        }))
    }

    /// A relay's publisher, on a connection of its own.
    async fn publisher(&self) -> Result<Arc<dyn Publisher>, BenchError> {
        Ok(match self {
            Self::Rabbit(r) => {
                Arc::new(RabbitPublisher::connect(&r.url, RabbitOptions::new(&r.exchange)?).await?)
            }
            Self::Nats(n) => Arc::new(
                JetStreamPublisher::connect(&n.url, JetStreamOptions::new(&n.prefix)?).await?,
            ),
            Self::Kafka(k) => Arc::new(KafkaPublisher::new(
                &k.brokers,
                KafkaOptions::new(&k.topic)?,
            )?),
        })
    }

    /// Removes every message the broker holds for the run.
    async fn purge(&self) -> Result<(), BenchError> {
        match self {
            Self::Rabbit(r) => {
                let channel = r.connection.create_channel().await?;
                channel
                    .queue_purge(r.queue.as_str().into(), QueuePurgeOptions::default())
                    .await?;
                channel.close(200, "purged".into()).await?;
            }
            Self::Nats(n) => {
                n.context.get_stream(&n.stream).await?.purge().await?;
            }
            // Nothing: each consumer reads from the partitions' ends as it
            // starts, and the topic goes at the end of the run.
            Self::Kafka(_) => {}
        }
        Ok(())
    }

    /// The raw baseline: `messages` published as the relay's publisher
    /// would, in batches of `batch`, every confirm of a batch awaited
    /// before the next, on a connection of its own; with `floor`, its
    /// statement runs beside each batch.
    async fn raw(
        &self,
        messages: usize,
        aggregates: usize,
        batch: usize,
        floor: Option<&mut Floor>,
    ) -> Result<RawRun, BenchError> {
        match self {
            Self::Rabbit(r) => r.raw(messages, aggregates, batch, floor).await,
            Self::Nats(n) => n.raw(messages, aggregates, batch, floor).await,
            Self::Kafka(k) => k.raw(messages, aggregates, batch, floor).await,
        }
    }

    /// A consumer stamping each arrival, from now on.
    async fn consume(&self) -> Result<(JoinHandle<()>, Arrivals), BenchError> {
        let (sender, arrivals) = mpsc::unbounded_channel();
        let task = match self {
            Self::Rabbit(r) => {
                let channel = r.connection.create_channel().await?;
                let mut consumer = channel
                    .basic_consume(
                        r.queue.as_str().into(),
                        "".into(),
                        BasicConsumeOptions {
                            no_ack: true,
                            ..BasicConsumeOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                tokio::spawn(async move {
                    let _channel = channel;
                    while let Some(Ok(delivery)) = consumer.next().await {
                        let at = Instant::now();
                        if let Some(id) = delivery.properties.message_id() {
                            let _ = sender.send((id.to_string(), at));
                        }
                    }
                })
            }
            Self::Kafka(k) => k.consume(sender).await?,
            Self::Nats(n) => {
                let mut messages = n
                    .context
                    .get_stream(&n.stream)
                    .await?
                    .create_consumer(pull::Config {
                        deliver_policy: DeliverPolicy::New,
                        ack_policy: AckPolicy::None,
                        inactive_threshold: Duration::from_secs(60),
                        ..Default::default()
                    })
                    .await?
                    .messages()
                    .await?;
                tokio::spawn(async move {
                    while let Some(Ok(message)) = messages.next().await {
                        let at = Instant::now();
                        let id = message
                            .headers
                            .as_ref()
                            .and_then(|headers| headers.get("Nats-Msg-Id"));
                        if let Some(id) = id {
                            let _ = sender.send((id.as_str().to_string(), at));
                        }
                    }
                })
            }
        };
        Ok((task, arrivals))
    }

    /// Removes what the run created on the broker.
    async fn delete(self) -> Result<(), BenchError> {
        match self {
            Self::Rabbit(r) => {
                // The exchange first: deleting the queue would take the
                // auto-deleting exchange with its last binding.
                let channel = r.connection.create_channel().await?;
                channel
                    .exchange_delete(r.exchange.as_str().into(), ExchangeDeleteOptions::default())
                    .await?;
                channel
                    .queue_delete(r.queue.as_str().into(), QueueDeleteOptions::default())
                    .await?;
                r.connection.close(200, "done".into()).await?;
            }
            Self::Nats(n) => {
                n.context.delete_stream(&n.stream).await?;
            }
            Self::Kafka(k) => {
                k.admin
                    .delete_topics(&[&k.topic], &AdminOptions::new())
                    .await?;
            }
        }
        Ok(())
    }
}

impl Rabbit {
    /// The `i`-th message's properties, as `RabbitPublisher` sets them.
    fn properties(i: usize, aggregates: usize) -> Result<BasicProperties, BenchError> {
        let sequence = i64::try_from(i / aggregates + 1)?;
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from(idem_rabbitmq::AGGREGATE_HEADER),
            AMQPValue::LongString(LongString::from(aggregate(i, aggregates).as_bytes())),
        );
        headers.insert(
            ShortString::from(idem_rabbitmq::SEQUENCE_HEADER),
            AMQPValue::LongLongInt(sequence),
        );
        Ok(BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(MessageId::generate().to_string().as_str().into())
            .with_type(KIND.into())
            .with_headers(headers))
    }

    async fn raw(
        &self,
        messages: usize,
        aggregates: usize,
        batch: usize,
        mut floor: Option<&mut Floor>,
    ) -> Result<RawRun, BenchError> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let mut confirms = Vec::with_capacity(batch);
        let mut failed = 0;
        let started = Instant::now();
        for first in (0..messages).step_by(batch) {
            let publish = async {
                for i in first..(first + batch).min(messages) {
                    let confirm = channel
                        .basic_publish(
                            self.exchange.as_str().into(),
                            KIND.into(),
                            BasicPublishOptions {
                                mandatory: true,
                                immediate: false,
                            },
                            &payload(i),
                            Self::properties(i, aggregates)?,
                        )
                        .await?;
                    confirms.push(confirm);
                }
                for confirm in confirms.drain(..) {
                    if !matches!(confirm.await?, Confirmation::Ack(None)) {
                        failed += 1;
                    }
                }
                Ok::<_, BenchError>(())
            };
            beside(publish, floor.as_deref_mut()).await?;
            if started.elapsed() > PATIENCE {
                return Err("the raw RabbitMQ baseline ran out of time".into());
            }
        }
        let elapsed = started.elapsed();
        connection.close(200, "done".into()).await?;
        Ok(RawRun { elapsed, failed })
    }
}

impl Nats {
    async fn raw(
        &self,
        messages: usize,
        aggregates: usize,
        batch: usize,
        mut floor: Option<&mut Floor>,
    ) -> Result<RawRun, BenchError> {
        let context = jetstream::new(async_nats::connect(self.url.as_str()).await?);
        let subject = JetStreamOptions::new(&self.prefix)?.subject(KIND)?;
        let mut acks = Vec::with_capacity(batch);
        let mut failed = 0;
        let started = Instant::now();
        for first in (0..messages).step_by(batch) {
            let publish = async {
                for i in first..(first + batch).min(messages) {
                    // The headers `JetStreamPublisher` sets.
                    let mut headers = HeaderMap::new();
                    headers.insert(
                        idem_nats::AGGREGATE_HEADER,
                        aggregate(i, aggregates).as_str(),
                    );
                    headers.insert(
                        idem_nats::SEQUENCE_HEADER,
                        (i / aggregates + 1).to_string().as_str(),
                    );
                    let message = PublishMessage::build()
                        .payload(Bytes::from(payload(i)))
                        .headers(headers)
                        .message_id(MessageId::generate().to_string());
                    acks.push(context.send_publish(subject.clone(), message).await?);
                }
                for ack in acks.drain(..) {
                    match ack.await {
                        Ok(ack) if !ack.duplicate => {}
                        _ => failed += 1,
                    }
                }
                Ok::<_, BenchError>(())
            };
            beside(publish, floor.as_deref_mut()).await?;
            if started.elapsed() > PATIENCE {
                return Err("the raw JetStream baseline ran out of time".into());
            }
        }
        Ok(RawRun {
            elapsed: started.elapsed(),
            failed,
        })
    }
}

impl Kafka {
    /// As `KafkaPublisher` publishes: one producer configured as its own,
    /// records keyed by aggregate with its headers, each batch handed over
    /// whole and every delivery report awaited.
    async fn raw(
        &self,
        messages: usize,
        aggregates: usize,
        batch: usize,
        mut floor: Option<&mut Floor>,
    ) -> Result<RawRun, BenchError> {
        let options = KafkaOptions::new(&self.topic)?;
        let producer: FutureProducer = options.producer_config(&self.brokers).create()?;
        // Connected, with its producer id and the topic's metadata, before
        // the clock starts, as the relay's publisher is once its first
        // batch went out (the first batch, run alone, is not timed).
        producer
            .send(
                FutureRecord::to(&self.topic).key("warm-up").payload("{}"),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(error, _)| error.to_string())?;
        let mut reports = Vec::with_capacity(batch);
        let mut failed = 0;
        let started = Instant::now();
        for first in (0..messages).step_by(batch) {
            let publish = async {
                for i in first..(first + batch).min(messages) {
                    let (aggregate, payload) = (aggregate(i, aggregates), payload(i));
                    let (id, sequence) = (
                        MessageId::generate().to_string(),
                        (i / aggregates + 1).to_string(),
                    );
                    let mut headers = OwnedHeaders::new_with_capacity(4);
                    for (key, value) in [
                        (idem_kafka::ID_HEADER, id.as_str()),
                        (idem_kafka::TYPE_HEADER, KIND),
                        (idem_kafka::AGGREGATE_HEADER, aggregate.as_str()),
                        (idem_kafka::SEQUENCE_HEADER, sequence.as_str()),
                    ] {
                        headers = headers.insert(KafkaHeader {
                            key,
                            value: Some(value),
                        });
                    }
                    let record = FutureRecord::to(&self.topic)
                        .key(&aggregate)
                        .payload(&payload)
                        .headers(headers);
                    reports.push(
                        producer
                            .send_result(record)
                            .map_err(|(error, _)| error.to_string())?,
                    );
                }
                for report in reports.drain(..) {
                    if !matches!(report.await, Ok(Ok(_))) {
                        failed += 1;
                    }
                }
                Ok::<_, BenchError>(())
            };
            beside(publish, floor.as_deref_mut()).await?;
            if started.elapsed() > PATIENCE {
                return Err("the raw Kafka baseline ran out of time".into());
            }
        }
        Ok(RawRun {
            elapsed: started.elapsed(),
            failed,
        })
    }

    /// A reader of every partition from its end now (assigned, with no
    /// group, at the offsets the broker gives as the ends), stamping each
    /// arrival.
    async fn consume(
        &self,
        sender: mpsc::UnboundedSender<(String, Instant)>,
    ) -> Result<JoinHandle<()>, BenchError> {
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", "idem-bench-arrivals")
            .set("enable.auto.commit", "false")
            .create()?;
        let topic = self.topic.clone();
        let consumer = tokio::task::spawn_blocking(move || {
            let mut ends = TopicPartitionList::new();
            for partition in 0..4 {
                let (_, end) =
                    consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10))?;
                ends.add_partition_offset(&topic, partition, Offset::Offset(end))?;
            }
            consumer.assign(&ends)?;
            Ok::<_, KafkaError>(consumer)
        })
        .await??;
        Ok(tokio::spawn(async move {
            while let Ok(message) = consumer.recv().await {
                let at = Instant::now();
                let id = message.headers().and_then(|headers| {
                    headers
                        .iter()
                        .find(|header| header.key == idem_kafka::ID_HEADER)
                        .and_then(|header| header.value)
                        .map(|value| String::from_utf8_lossy(value).into_owned())
                });
                if let Some(id) = id {
                    let _ = sender.send((id, at));
                }
            }
        }))
    }
}

/// The least Postgres work of any relay over Postgres, per batch: one
/// statement, committed, that reads the batch's rows (payloads and
/// headers, from an outbox filled as the relay's, in its log's index
/// order) and writes one row (a cursor). No relay does less: it reads each
/// message once and must record, durably, that the batch went out. So the
/// raw publish with this statement beside each batch (sent as the batch
/// starts, as a perfect pipeline would) bounds relay/raw on this machine
/// whatever the store's design.
struct Floor {
    pool: PgPool,
    statement: String,
    batch: i64,
    /// The last row read: its place in the log.
    after: (i64, i64),
}

impl Floor {
    /// On `table`, an outbox already filled; creates its cursor table.
    async fn new(pg: &Pg, table: &str, batch: usize) -> Result<Self, BenchError> {
        let pool = pg.pool(1).await?;
        let cursor = format!("{table}_floor_cursor");
        // Validated identifiers (the run's schema, the bench's own names).
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {cursor} (id int PRIMARY KEY, position bigint NOT NULL)"
        )))
        .execute(&pool)
        .await?;
        sqlx::query(AssertSqlSafe(format!("INSERT INTO {cursor} VALUES (1, 0)")))
            .execute(&pool)
            .await?;
        // The cheapest plan: statistics of the filled table.
        sqlx::query(AssertSqlSafe(format!("ANALYZE {table}")))
            .execute(&pool)
            .await?;
        let statement = format!(
            "WITH batch AS (SELECT * FROM {table} \
                 WHERE part = 0 AND state IS NULL AND (part, okey, pos) > (0, $1, $2) \
                 ORDER BY okey, pos LIMIT $3), \
             moved AS (UPDATE {cursor} SET position = position + 1 WHERE id = 1 \
                 RETURNING position) \
             SELECT batch.*, moved.position FROM batch CROSS JOIN moved"
        );
        Ok(Self {
            pool,
            statement,
            batch: i64::try_from(batch)?,
            after: (0, 0),
        })
    }

    /// Reads from the first row again.
    fn rewind(&mut self) {
        self.after = (0, 0);
    }

    /// The next batch's statement.
    async fn step(&mut self) -> Result<(), BenchError> {
        use sqlx::Row as _;
        let rows = sqlx::query(AssertSqlSafe(self.statement.as_str()))
            .bind(self.after.0)
            .bind(self.after.1)
            .bind(self.batch)
            .fetch_all(&self.pool)
            .await?;
        if let Some(last) = rows.last() {
            self.after = (last.try_get("okey")?, last.try_get("pos")?);
        }
        for row in &rows {
            let payload: &[u8] = row.try_get("payload")?;
            std::hint::black_box(payload);
        }
        Ok(())
    }
}

/// One batch's `publish`, with `floor`'s statement for it at the same
/// time (sent as the batch starts): the most a relay with one batch at the
/// broker could overlap.
async fn beside(
    publish: impl Future<Output = Result<(), BenchError>>,
    floor: Option<&mut Floor>,
) -> Result<(), BenchError> {
    match floor {
        Some(floor) => {
            let (published, stepped) = tokio::join!(publish, floor.step());
            published.and(stepped)
        }
        None => publish.await,
    }
}

/// One raw run (with `floor`'s statement beside each batch, if any), its
/// CPU per message, the broker purged after.
async fn raw_round(
    broker: &Broker,
    messages: usize,
    aggregates: usize,
    batch: usize,
    floor: Option<&mut Floor>,
) -> Result<(RawRun, CpuPerUnit), BenchError> {
    let processes = broker.processes();
    let before = CpuSample::now(processes);
    let run = broker.raw(messages, aggregates, batch, floor).await?;
    let cpu = CpuSample::now(processes).per_unit_since(&before, messages);
    broker.purge().await?;
    Ok((run, cpu))
}

/// The round of median time, with every round's failures.
fn median(mut rounds: Vec<(RawRun, CpuPerUnit)>) -> Result<(RawRun, CpuPerUnit), BenchError> {
    let failed = rounds.iter().map(|(run, _)| run.failed).sum();
    rounds.sort_by_key(|(run, _)| run.elapsed);
    let middle = rounds.len() / 2;
    let (run, cpu) = rounds.into_iter().nth(middle).ok_or("no raw round ran")?;
    Ok((
        RawRun {
            elapsed: run.elapsed,
            failed,
        },
        cpu,
    ))
}

/// Messages per second.
fn per_second(messages: usize, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

/// Throughput at `batch`: the raw baseline, then the relay at each number
/// of batches in flight, the broker purged around each.
async fn throughput(
    pg: &Pg,
    broker: &Broker,
    batch: usize,
    aggregates: usize,
    args: &Args,
) -> Result<Vec<Throughput>, BenchError> {
    let messages = if batch == 1 {
        args.batch_one_messages
    } else {
        args.messages
    };
    let processes = broker.processes();
    broker.purge().await?;
    let floor_name = format!("floor_{}_b{batch}_a{aggregates}", broker.name());
    fill(
        &pg.fresh_outbox(&floor_name, 1, 1).await?,
        messages,
        aggregates,
    )
    .await?;
    let mut floor = Floor::new(pg, &format!("{}.{floor_name}", pg.schema), batch).await?;
    let (mut raws, mut floors) = (Vec::new(), Vec::new());
    for _ in 0..RAW_ROUNDS {
        raws.push(raw_round(broker, messages, aggregates, batch, None).await?);
        floor.rewind();
        floors.push(raw_round(broker, messages, aggregates, batch, Some(&mut floor)).await?);
    }
    floor.pool.close().await;
    let (raw, raw_cpu) = median(raws)?;
    let (floored, floor_cpu) = median(floors)?;
    broker.purge().await?;
    let mut windows = vec![1, args.in_flight];
    windows.dedup();
    let runs: Vec<(u32, usize)> = PARTITIONS
        .iter()
        .flat_map(|&p| windows.iter().map(move |&w| (p, w)))
        .collect();
    let mut measured = Vec::with_capacity(runs.len());
    for (partitions, in_flight) in runs {
        let name = format!(
            "relay_{}_b{batch}_a{aggregates}_f{in_flight}_p{partitions}",
            broker.name()
        );
        let shape = Shape {
            batch,
            in_flight,
            partitions,
            messages,
            aggregates,
        };
        let drain = relay_drain(
            pg,
            broker.publisher().await?,
            &name,
            shape,
            Route::Direct,
            processes,
        )
        .await?;
        // Only this drain's dead rows are reported: each count waits for
        // the server's statistics.
        let dead_rows = dead_rows(pg, &name).await?;
        // The same drain with nothing to wait for but the store: the
        // relay's ceiling on this machine, whatever the broker.
        let alone = relay_drain(
            pg,
            Arc::new(ConfirmsAtOnce),
            &format!("{name}_alone"),
            shape,
            Route::Direct,
            processes,
        )
        .await?;
        broker.purge().await?;
        let counted_messages = messages.min(COUNTED_MESSAGES);
        let counted = relay_drain(
            pg,
            broker.publisher().await?,
            &format!("{name}_counted"),
            Shape {
                messages: counted_messages,
                ..shape
            },
            Route::Counted,
            processes,
        )
        .await?;
        broker.purge().await?;
        // Round trips that cost time, not CPU: a database across a network.
        let remote_delay_ms =
            (batch == WIDE_BATCH && args.pg_delay_ms > 0).then_some(args.pg_delay_ms);
        let remote = match remote_delay_ms {
            Some(ms) => {
                let away = relay_drain(
                    pg,
                    broker.publisher().await?,
                    &format!("{name}_remote"),
                    shape,
                    Route::Away(Duration::from_millis(ms)),
                    processes,
                )
                .await?;
                broker.purge().await?;
                Some(per_second(messages, away.elapsed))
            }
            None => None,
        };
        let relay_msgs_per_s = per_second(messages, drain.elapsed);
        let raw_msgs_per_s = per_second(messages, raw.elapsed);
        measured.push(Throughput {
            broker: broker.name(),
            batch,
            in_flight,
            partitions,
            messages,
            aggregates,
            relay_msgs_per_s,
            raw_msgs_per_s,
            ratio: relay_msgs_per_s / raw_msgs_per_s,
            relay_seconds: drain.elapsed.as_secs_f64(),
            relay_publish_seconds: drain.publishing.as_secs_f64(),
            relay_waves_per_batch: drain.publishes as f64 / drain.batches.max(1) as f64,
            relay_read_seconds: drain.reading.as_secs_f64(),
            relay_advance_seconds: drain.advancing.as_secs_f64(),
            pg_writes_per_batch: drain.writes as f64 / drain.batches.max(1) as f64,
            pg_calls_per_batch: drain.calls as f64 / drain.batches.max(1) as f64,
            dead_rows_messages: dead_rows.0,
            dead_rows_partitions: dead_rows.1,
            raw_seconds: raw.elapsed.as_secs_f64(),
            batches: drain.batches,
            counted_messages,
            counted_batches: counted.batches,
            pg_round_trips_first_batch: counted.first_batch,
            pg_round_trips_per_batch: counted.later_round_trips as f64
                / counted.later_batches.max(1) as f64,
            pg_pings: counted.pings,
            pg_round_trips_total: counted.round_trips,
            relay_failed: drain.failed + counted.failed,
            raw_failed: raw.failed,
            store_alone_msgs_per_s: per_second(messages, alone.elapsed),
            floor_msgs_per_s: per_second(messages, floored.elapsed),
            floor_cpu,
            relay_cpu: drain.cpu,
            raw_cpu,
            store_alone_cpu: alone.cpu,
            remote_delay_ms,
            remote_msgs_per_s: remote,
        });
    }
    Ok(measured)
}

/// Counts the requests a client sends (the service clock's `ListTables`
/// aside): the emulator's own counter reads only a request's `TableName`,
/// which batch requests do not have.
#[derive(Debug, Clone, Default)]
struct Requests(Arc<AtomicU64>);

impl Requests {
    fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "requests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let target = context.request().headers().get("x-amz-target");
        if !target.is_some_and(|t| t.ends_with(".ListTables")) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// DynamoDB: a client of the emulator counting its requests, and the
/// tables of the run's own.
struct Dynamo {
    client: aws_sdk_dynamodb::Client,
    requests: Requests,
    id: String,
}

impl Dynamo {
    fn connect(id: &str) -> Result<Self, BenchError> {
        let requests = Requests::default();
        let config = idem_bench::dynamo_config(&env("IDEM_DYNAMO_ENDPOINT")?)
            .interceptor(requests.clone())
            .build();
        Ok(Self {
            client: aws_sdk_dynamodb::Client::from_conf(config),
            requests,
            id: id.to_string(),
        })
    }

    /// An outbox of `partitions` on a new table `name` of the run's.
    async fn outbox(&self, name: &str, partitions: u32) -> Result<DynamoOutbox, BenchError> {
        let options = DynamoOutboxOptions::default()
            .table(&format!("bench-{}-{name}", self.id))
            .partitions(partitions)
            .store_options(
                idem_core::StoreOptions::default().with_operation_timeout(Duration::from_secs(30)),
            );
        let outbox = DynamoOutbox::with_options(self.client.clone(), options)?;
        outbox.create_table().await?;
        Ok(outbox)
    }

    async fn delete(&self, outbox: &DynamoOutbox) -> Result<(), BenchError> {
        self.client
            .delete_table()
            .table_name(outbox.table())
            .send()
            .await?;
        Ok(())
    }
}

/// Enqueues `messages` over `aggregates` into a DynamoDB outbox, one
/// `enqueue` (one transaction) each, from one writer: writers racing on a
/// partition's counter lose rounds (idem-dynamo's tests race them), and
/// moto serves one request at a time, so a race only slows the fill.
async fn fill_dynamo(
    outbox: &DynamoOutbox,
    messages: usize,
    aggregates: usize,
) -> Result<(), BenchError> {
    for i in 0..messages {
        let message = NewMessage::new(&aggregate(i, aggregates), KIND, payload(i))?;
        outbox.enqueue(&message).await?;
    }
    Ok(())
}

/// A DynamoDB outbox filled as `shape` says and drained through
/// `publisher`: its time, its requests per batch, and the fill's requests
/// per message.
async fn dynamo_drain(
    dynamo: &Dynamo,
    publisher: Arc<dyn Publisher>,
    name: &str,
    shape: Shape,
) -> Result<(Duration, Passes, f64, f64), BenchError> {
    let outbox = dynamo.outbox(name, shape.partitions).await?;
    let before_fill = dynamo.requests.count();
    fill_dynamo(&outbox, shape.messages, shape.aggregates).await?;
    let enqueue_requests = dynamo.requests.count() - before_fill;
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        publisher,
        RelayOptions::default()
            .with_batch(shape.batch)?
            .with_in_flight(shape.in_flight)?,
    );
    let before = dynamo.requests.count();
    let started = Instant::now();
    let passes = relay_all(&relay, shape.messages, started, || {}).await?;
    let elapsed = started.elapsed();
    let requests = dynamo.requests.count() - before;
    dynamo.delete(&outbox).await?;
    Ok((
        elapsed,
        passes,
        requests as f64,
        enqueue_requests as f64 / shape.messages.max(1) as f64,
    ))
}

/// Relay throughput over a DynamoDB outbox at batch 100, beside the raw
/// publish of as many messages, at each partition count and batches in
/// flight.
async fn dynamo_throughput(
    dynamo: &Dynamo,
    broker: &Broker,
    args: &Args,
) -> Result<Vec<Line>, BenchError> {
    let (batch, aggregates, messages) = (WIDE_BATCH, args.aggregates, args.dynamo_messages);
    broker.purge().await?;
    let mut raws = Vec::new();
    for _ in 0..RAW_ROUNDS {
        raws.push(raw_round(broker, messages, aggregates, batch, None).await?);
    }
    let (raw, _) = median(raws)?;
    let mut windows = vec![1, args.in_flight];
    windows.dedup();
    let mut lines = Vec::new();
    for &partitions in &PARTITIONS {
        for &in_flight in &windows {
            eprintln!(
                "[outbox] {} on DynamoDB: {partitions} partitions, {in_flight} in flight",
                broker.name()
            );
            let shape = Shape {
                batch,
                in_flight,
                partitions,
                messages,
                aggregates,
            };
            let name = format!("{}-p{partitions}-f{in_flight}", broker.name());
            let (elapsed, passes, requests, enqueue) =
                dynamo_drain(dynamo, broker.publisher().await?, &name, shape).await?;
            broker.purge().await?;
            let alone = dynamo_drain(
                dynamo,
                Arc::new(ConfirmsAtOnce),
                &format!("{name}-alone"),
                shape,
            )
            .await?;
            let relay_msgs_per_s = per_second(messages, elapsed);
            let raw_msgs_per_s = per_second(messages, raw.elapsed);
            lines.push(Line::Dynamo(Box::new(DynamoThroughput {
                broker: broker.name(),
                batch,
                in_flight,
                partitions,
                messages,
                aggregates,
                relay_msgs_per_s,
                raw_msgs_per_s,
                ratio: relay_msgs_per_s / raw_msgs_per_s,
                relay_seconds: elapsed.as_secs_f64(),
                store_alone_msgs_per_s: per_second(messages, alone.0),
                requests_per_batch: requests / passes.batches.max(1) as f64,
                enqueue_requests_per_message: enqueue,
                batches: passes.batches,
                relay_failed: passes.failed,
            })));
        }
    }
    Ok(lines)
}

/// Commit-to-broker latency: enqueue at the rate asked, one committed
/// transaction a message, with `Relay::run` woken by the outbox's listener.
async fn latency(pg: &Pg, broker: &Broker, args: &Args) -> Result<Latency, BenchError> {
    let name = format!("latency_{}", broker.name());
    // The listener's connection, the relay's and the enqueuer's.
    let outbox = pg.fresh_outbox(&name, 4, 1).await?;
    broker.purge().await?;
    let (consumer, mut arrivals) = broker.consume().await?;
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        broker.publisher().await?,
        RelayOptions::default().with_batch(LATENCY_BATCH)?,
    );
    let listener = outbox.listen(relay.waker()).await?;
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        }
    });

    let rate = args.rate.max(1);
    let total = ((f64::from(rate) * args.duration).round() as usize).max(1);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut commits: HashMap<String, Instant> = HashMap::with_capacity(total);
    let mut started = Instant::now();
    for i in 0..WARM_UP + total {
        if i == WARM_UP {
            started = Instant::now();
        }
        ticker.tick().await;
        let message = NewMessage::new(&aggregate(i, args.aggregates), KIND, payload(i))?;
        let mut tx = outbox.pool().begin().await?;
        outbox.enqueue_in(&mut tx, &message).await?;
        tx.commit().await?;
        if i >= WARM_UP {
            commits.insert(message.id().to_string(), Instant::now());
        }
    }
    let enqueued_per_s = per_second(total, started.elapsed());

    let mut latencies: Vec<u32> = Vec::with_capacity(total);
    let deadline = Instant::now() + PATIENCE;
    while latencies.len() < total && Instant::now() < deadline {
        match tokio::time::timeout(SETTLE, arrivals.recv()).await {
            Ok(Some((id, at))) => {
                if let Some(committed) = commits.remove(&id) {
                    let us = at.saturating_duration_since(committed).as_micros();
                    latencies.push(u32::try_from(us).unwrap_or(u32::MAX));
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = stop.send(());
    running.await?;
    drop(listener);
    consumer.abort();
    outbox.pool().close().await;

    latencies.sort_unstable();
    Ok(Latency {
        broker: broker.name(),
        rate,
        enqueued_per_s,
        enqueued: total,
        arrived: latencies.len(),
        relay_batch: LATENCY_BATCH,
        p50_us: percentile(&latencies, 0.5),
        p99_us: percentile(&latencies, 0.99),
        max_us: latencies.last().map_or(0, |&us| u64::from(us)),
    })
}

/// Every measurement of one broker.
async fn measure(pg: &Pg, broker: &Broker, args: &Args) -> Result<Vec<Line>, BenchError> {
    let mut lines = Vec::new();
    let mut shapes: Vec<(usize, usize)> = BATCHES.iter().map(|&b| (b, args.aggregates)).collect();
    if args.wide_aggregates > args.aggregates {
        shapes.push((WIDE_BATCH, args.wide_aggregates));
    }
    for (batch, aggregates) in shapes {
        eprintln!(
            "[outbox] {} throughput, batch {batch}, {aggregates} aggregates: raw, then relay",
            broker.name()
        );
        lines.extend(
            throughput(pg, broker, batch, aggregates, args)
                .await?
                .into_iter()
                .map(|t| Line::Throughput(Box::new(t))),
        );
    }
    eprintln!(
        "[outbox] {} latency at {} msg/s for {} s",
        broker.name(),
        args.rate,
        args.duration
    );
    lines.push(Line::Latency(latency(pg, broker, args).await?));
    Ok(lines)
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The DynamoDB rows' section of the report, if any were measured.
fn dynamo_section(lines: &[Line], md: &mut String) {
    if lines.iter().any(|line| matches!(line, Line::Dynamo(_))) {
        let _ = writeln!(
            *md,
            "\n## Outbox relay throughput on DynamoDB (moto)\n\n\
             A DynamoDB outbox on the emulator (`IDEM_DYNAMO_ENDPOINT`, one request at a time), \
             pre-filled one `enqueue` a message by one writer, drained by one relay at batch {WIDE_BATCH} beside the \
             raw publish of as many messages. The emulator is far slower than DynamoDB: the \
             requests per batch and per enqueued message are what carry over.\n"
        );
        md.push_str(
            "| broker | batch | aggregates | partitions | in flight | relay msg/s | raw msg/s | relay/raw | no broker msg/s | requests/batch | requests/enqueue |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for line in lines {
            if let Line::Dynamo(d) = line {
                let _ = writeln!(
                    *md,
                    "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.3} | {:.0} | {:.2} | {:.2} |",
                    d.broker,
                    d.batch,
                    d.aggregates,
                    d.partitions,
                    d.in_flight,
                    d.relay_msgs_per_s,
                    d.raw_msgs_per_s,
                    d.ratio,
                    d.store_alone_msgs_per_s,
                    d.requests_per_batch,
                    d.enqueue_requests_per_message,
                );
            }
        }
    }
}

/// The markdown report: throughput, then latency.
fn markdown(lines: &[Line], args: &Args) -> String {
    if !lines.iter().any(|line| matches!(line, Line::Throughput(_))) {
        let mut md = String::new();
        dynamo_section(lines, &mut md);
        return md;
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## Outbox relay against the raw broker client\n\n\
         {} messages per measurement ({} at batch 1), over {} aggregates (and over {} at batch {} in the last \
         rows), message i to aggregate i mod aggregates, pre-filled in a fresh Postgres outbox \
         of 1 or 2 partitions and drained by one relay holding them all (one publisher, one \
         broker connection) with 1 or {} batches in flight per partition \
         (`RelayOptions::with_in_flight`: the next batch is read and the cursor moved past \
         earlier ones while the broker confirms one; the broker gets a partition's batches one \
         at a time either way); \
         raw, measured per batch size in the same run (the median of {} runs): the same client publishing as many \
         messages of the same shape to the same broker in batches of the same size, awaiting \
         every confirm (RabbitMQ) or PubAck (JetStream) of a batch before the next. relay/raw is \
         relay msg/s over raw msg/s, each from its first message to its last confirm (relay: \
         to its last advance). Broker waves per batch are the publisher's calls: a batch holding \
         several messages of one aggregate goes out in as many waves, each sent once the one \
         before it is confirmed, so a failure stops its aggregate there (the raw publish and the \
         floor send each batch at once). The read, publish and advance columns are each stage's time added \
         up over the drain and divided by its batches; with batches in flight they overlap, so \
         they add up to more than the time a batch takes. PG writes per batch are the store's \
         advances (each writes the partition's one row); PG statements per batch are the store's \
         calls in the timed drain (its reads, of the log and of the retry lane, and its \
         advances, each carrying the next read once the window is full: one statement each); \
         dead rows are the message table's and \
         the partition table's after the drain. Postgres round trips per relay batch \
         (its read and its share of the advances; the retry lane's check and the drain's last \
         empty read) are counted on the wire, on a \
         second drain of up to {} messages through a counting proxy (the timed drain goes \
         straight to the server); the first batch, run alone, in parentheses; round trips that \
         only prepare a statement (at its first use on each connection) left out, and sqlx's \
         pings of connections returning to the pool apart.\n",
        args.messages,
        args.batch_one_messages,
        args.aggregates,
        args.wide_aggregates,
        WIDE_BATCH,
        args.in_flight,
        RAW_ROUNDS,
        COUNTED_MESSAGES
    );
    md.push_str(
        "| broker | batch | aggregates | partitions | in flight | relay msg/s | raw msg/s | relay/raw | relay ms / batch: read + publish + advance | broker waves / batch | PG writes / batch | PG statements / batch | PG round trips / batch, counted | sqlx pings / batch | dead rows: messages, partitions | batches | failed relay/raw |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for line in lines {
        if let Line::Throughput(t) = line {
            let per_batch = |seconds: f64| seconds * 1000.0 / t.batches.max(1) as f64;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} + {:.2} + {:.2} | {:.2} | {:.2} | {:.2} | {:.2} ({}) | {:.2} | {}, {} | {} | {}/{} |",
                t.broker,
                t.batch,
                t.aggregates,
                t.partitions,
                t.in_flight,
                t.relay_msgs_per_s,
                t.raw_msgs_per_s,
                t.ratio,
                per_batch(t.relay_read_seconds),
                per_batch(t.relay_publish_seconds),
                per_batch(t.relay_advance_seconds),
                t.relay_waves_per_batch,
                t.pg_writes_per_batch,
                t.pg_calls_per_batch,
                t.pg_round_trips_per_batch,
                t.pg_round_trips_first_batch,
                t.pg_pings as f64 / t.counted_batches.max(1) as f64,
                t.dead_rows_messages,
                t.dead_rows_partitions,
                t.batches,
                t.relay_failed,
                t.raw_failed,
            );
        }
    }
    let _ = writeln!(
        md,
        "\n## Where the CPU goes\n\n\
         The same measurements' CPU time per message (microseconds on a CPU, from each \
         process's threads' scheduler statistics): this process (the raw client, or the relay \
         with its client), the broker's server and Postgres's. `store alone` is the same relay \
         drain through a publisher that confirms every message at once: the relay and its \
         store with no broker, the relay's ceiling on this machine. Client, broker and \
         Postgres share the machine's cores, so where they keep them busy the relay's rate \
         next to raw's is bounded by raw's CPU per message over the relay's.\n"
    );
    md.push_str(
        "| broker | batch | aggregates | partitions | in flight | store alone msg/s | store alone / raw | raw µs/msg: client + broker | relay µs/msg: relay + broker + PG | store alone µs/msg: relay + PG | raw CPU / relay CPU |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for line in lines {
        if let Line::Throughput(t) = line {
            let (raw, relay, alone) = (t.raw_cpu, t.relay_cpu, t.store_alone_cpu);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.1} + {:.1} | {:.1} + {:.1} + {:.1} | {:.1} + {:.1} | {:.2} |",
                t.broker,
                t.batch,
                t.aggregates,
                t.partitions,
                t.in_flight,
                t.store_alone_msgs_per_s,
                t.store_alone_msgs_per_s / t.raw_msgs_per_s.max(f64::EPSILON),
                raw.own_us,
                raw.broker_us,
                relay.own_us,
                relay.broker_us,
                relay.postgres_us,
                alone.own_us,
                alone.postgres_us,
                raw.total_us() / relay.total_us().max(f64::EPSILON),
            );
        }
    }
    let _ = writeln!(
        md,
        "\n## The floor of any relay over Postgres\n\n\
         The raw publish again, with, beside each batch (sent as it starts), the least Postgres \
         work any relay does for it: one committed statement that reads the batch's rows from \
         an outbox filled as the relay's (in its log's index order, payloads and headers) \
         and writes one row (a cursor). floor/raw bounds relay/raw on this machine, whatever \
         the store's design. Floor and raw are each the median of {} runs, alternating.\n",
        RAW_ROUNDS
    );
    md.push_str(
        "| broker | batch | aggregates | raw msg/s | floor msg/s | floor/raw | relay/raw, best | relay/floor, best | floor µs/msg: client + broker + PG |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for line in lines {
        if let Line::Throughput(t) = line
            && t.in_flight == 1
            && t.partitions == 1
        {
            let best = lines
                .iter()
                .filter_map(|l| match l {
                    Line::Throughput(o)
                        if o.broker == t.broker
                            && o.batch == t.batch
                            && o.aggregates == t.aggregates =>
                    {
                        Some(o.ratio)
                    }
                    _ => None,
                })
                .fold(0.0, f64::max);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} + {:.1} + {:.1} |",
                t.broker,
                t.batch,
                t.aggregates,
                t.raw_msgs_per_s,
                t.floor_msgs_per_s,
                t.floor_msgs_per_s / t.raw_msgs_per_s.max(f64::EPSILON),
                best,
                best * t.raw_msgs_per_s / t.floor_msgs_per_s.max(f64::EPSILON),
                t.floor_cpu.own_us,
                t.floor_cpu.broker_us,
                t.floor_cpu.postgres_us,
            );
        }
    }
    if args.pg_delay_ms > 0 {
        let _ = writeln!(
            md,
            "\n## With Postgres {} ms away\n\n\
             The batch-{} drains again, the relay's pool reaching Postgres through a proxy that \
             holds every byte {} ms each way, as a database across a network would be: round \
             trips that cost time but no CPU. relay/raw is against the same raw baseline.\n",
            args.pg_delay_ms, WIDE_BATCH, args.pg_delay_ms
        );
        md.push_str(
            "| broker | batch | aggregates | partitions | in flight | relay msg/s, Postgres away | raw msg/s | relay/raw |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for line in lines {
            if let Line::Throughput(t) = line
                && let Some(remote) = t.remote_msgs_per_s
            {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} |",
                    t.broker,
                    t.batch,
                    t.aggregates,
                    t.partitions,
                    t.in_flight,
                    remote,
                    t.raw_msgs_per_s,
                    remote / t.raw_msgs_per_s.max(f64::EPSILON),
                );
            }
        }
    }
    dynamo_section(lines, &mut md);
    let _ = writeln!(
        md,
        "\n## Outbox commit-to-broker latency\n\n\
         One committed transaction per message at a fixed rate, `Relay::run` woken by \
         `PostgresOutbox::listen` (batch 100, the default batches in flight), a consumer stamping each arrival; latency is \
         arrival less commit, on one clock.\n"
    );
    md.push_str(
        "| broker | rate msg/s | enqueued | arrived | p50 ms | p99 ms | max ms |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for line in lines {
        if let Line::Latency(l) = line {
            let _ = writeln!(
                md,
                "| {} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} |",
                l.broker,
                l.enqueued_per_s,
                l.enqueued,
                l.arrived,
                ms(l.p50_us),
                ms(l.p99_us),
                ms(l.max_us),
            );
        }
    }
    md
}

/// Every broker asked for, each removed after its measurements whatever
/// they gave; the schema last.
async fn run(args: &Args) -> Result<Vec<Line>, BenchError> {
    if args.messages == 0 || args.batch_one_messages == 0 || args.aggregates == 0 {
        return Err(
            "--messages, --batch-one-messages and --aggregates must be more than zero".into(),
        );
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let pg = Pg::connect(&id).await?;
    let dynamo = Dynamo::connect(&id[..12])?;
    let mut lines = Vec::new();
    let mut outcome = Ok(());
    let kinds: &[BrokerChoice] = match args.broker {
        BrokerChoice::Both => &[BrokerChoice::Rabbitmq, BrokerChoice::Nats],
        BrokerChoice::All => &[
            BrokerChoice::Rabbitmq,
            BrokerChoice::Nats,
            BrokerChoice::Kafka,
        ],
        BrokerChoice::Rabbitmq => &[BrokerChoice::Rabbitmq],
        BrokerChoice::Nats => &[BrokerChoice::Nats],
        BrokerChoice::Kafka => &[BrokerChoice::Kafka],
    };
    for kind in kinds {
        let broker = match kind {
            BrokerChoice::Nats => Broker::nats(&id).await,
            BrokerChoice::Kafka => Broker::kafka(&id).await,
            _ => Broker::rabbit(&id).await,
        };
        let broker = match broker {
            Ok(broker) => broker,
            Err(error) => {
                outcome = Err(error);
                break;
            }
        };
        let measured = match args.store {
            StoreChoice::Postgres => measure(&pg, &broker, args).await,
            StoreChoice::Dynamo => dynamo_throughput(&dynamo, &broker, args).await,
            StoreChoice::Both => match measure(&pg, &broker, args).await {
                Ok(mut lines) => dynamo_throughput(&dynamo, &broker, args).await.map(|more| {
                    lines.extend(more);
                    lines
                }),
                Err(error) => Err(error),
            },
        };
        let name = broker.name();
        if let Err(error) = broker.delete().await {
            eprintln!("[outbox] cannot remove what the run created on {name}: {error}");
        }
        match measured {
            Ok(more) => lines.extend(more),
            Err(error) => {
                outcome = Err(format!("{name}: {error}").into());
                break;
            }
        }
    }
    if let Err(error) = pg.drop_schema().await {
        eprintln!("[outbox] cannot drop schema {}: {error}", pg.schema);
    }
    outcome.map(|()| lines)
}

fn write(args: &Args, lines: &[Line], md: &str) -> Result<(), BenchError> {
    std::fs::create_dir_all(&args.out)?;
    let mut jsonl = String::new();
    for line in lines {
        jsonl.push_str(&serde_json::to_string(line)?);
        jsonl.push('\n');
    }
    std::fs::write(args.out.join("outbox.jsonl"), jsonl)?;
    std::fs::write(args.out.join("outbox.md"), md)?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let Some(ran) = idem_bench::on_runtime("idem-bench-outbox", run(&args)) else {
        return std::process::ExitCode::FAILURE;
    };
    let lines = match ran {
        Ok(lines) => lines,
        Err(error) => {
            eprintln!("idem-bench-outbox: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let md = markdown(&lines, &args);
    print!("{md}");
    if let Err(error) = write(&args, &lines, &md) {
        eprintln!("idem-bench-outbox: cannot write the results: {error}");
        return std::process::ExitCode::FAILURE;
    }
    eprintln!(
        "[outbox] wrote {} and {}",
        args.out.join("outbox.jsonl").display(),
        args.out.join("outbox.md").display()
    );
    std::process::ExitCode::SUCCESS
}
