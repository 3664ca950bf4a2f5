//! `idem-bench-consumer`: a consumer with its inbox and commit measured
//! against a bare consumer that only acks, side by side in one run, on the
//! same broker: RabbitMQ (`idem_rabbitmq::RabbitSource`), NATS
//! JetStream (`idem_nats::JetStreamSource`) and Kafka
//! (`idem_kafka::KafkaSource`, `--broker kafka` or `all`: a topic of four
//! partitions, a consumer group of the run's own).
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-consumer -- --broker both --messages 2000 --concurrency 1,4,16 --batch 1,10,100
//! ```
//!
//! For each broker, `--messages` messages of 100 aggregates are published
//! to a queue (a stream) of the run's own, then drained:
//!
//! - **bare**: each delivery acked, one at a time, nothing else;
//! - **floor**: the least any consumer with an inbox does, per batch of
//!   100 deliveries: one transaction inserting their inbox rows and their
//!   domain rows, committed, then the acks together
//!   (`Delivery::ack_all`, as the consumer acks: what one commit per batch
//!   could reach);
//! - **inbox**: every delivery through `idem_consumer::Consumer::run` with
//!   each `--concurrency` (batches handled at once, never two deliveries
//!   of one aggregate) and each `--batch` (deliveries per batch, gathered
//!   for up to 5 ms) over a Postgres inbox (`PostgresStore`, a fresh
//!   table): per batch one transaction (`PostgresStore::begin`) holding
//!   one claim of its messages that writes each inbox row once, complete
//!   (`Transaction::claim_completed_all`), the handler's one insert of
//!   their rows (`Handler::handle_batch`), one commit, then the acks
//!   together (RabbitMQ: `multiple`; JetStream: pipelined).
//!
//! `--pairs N` measures the floor and then the inbox N times, taking
//! turns, each inbox row printed beside the floor of its own turn (so a
//! machine's drift shows in both).
//!
//! `--expiring-floor` measures in each turn, after the floor, the floor
//! with an inbox that expires: each inbox row carries its expiry time,
//! indexed so that a purge can find the expired rows (as the records
//! table's is). The floor's inbox only grows; any inbox that is purged
//! pays for finding what to purge, and this says how much.
//!
//! RabbitMQ's prefetch is 2000 in every run (the most deliveries the
//! largest figures hold at once: 16 batches of 100).
//!
//! Prints a markdown table: messages a second, the ratio to the bare
//! consumer and to the floor, CPU per message split by process (this
//! one, the broker's server, Postgres's server and backends; read from
//! `/proc`, so other work on those processes counts too), and with `--count-commits` Postgres transactions per message
//! (the database's `xact_commit` over the run: each batch's commit; the
//! pool has no release check, its transactions opening whole) and WAL
//! flushes to disk per message
//! (`pg_stat_wal.wal_sync`: commits flushed together count once). Other
//! sessions on the server add to both.
//! Everything it creates has a random name and is removed at the end.
//! Nothing is judged: there is no assertion on any timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use clap::{Parser, ValueEnum};
use idem_bench::cpu::{self, CpuPerUnit, CpuSample};
use idem_consumer::{Consumer, ConsumerOptions, Delivery, Handled, Handler, Source, async_trait};
use idem_core::store::{
    InboundMessage, LogPosition, MessageParts, MessageState, NewMessage, OutboxMessage, Timestamp,
};
use idem_core::{HandlerError, StoreError};
use idem_kafka::rdkafka::ClientConfig;
use idem_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem_kafka::rdkafka::client::DefaultClientContext;
use idem_kafka::{KafkaOptions, KafkaPublisher, KafkaSource};
use idem_memory::MemoryParking;
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::Publisher;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PgTransaction, PostgresOptions, PostgresStore};
use idem_rabbitmq::{RabbitOptions, RabbitPublisher, RabbitSource, RabbitSourceOptions};
use lapin::options::{ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Broker {
    Rabbitmq,
    Nats,
    Kafka,
    /// RabbitMQ and NATS.
    Both,
    /// All three.
    All,
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
    /// The consumer's concurrencies (batches at once) to measure,
    /// comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
    /// The consumer's batch sizes to measure at each concurrency,
    /// comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    batch: Vec<usize>,
    /// Count Postgres commits per message: the database's `xact_commit`
    /// before and after each run, read once every session has published
    /// its counts (an idle session does within 10 s, so each run waits
    /// 11 s).
    #[arg(long)]
    count_commits: bool,
    /// Times the floor and then the inbox at every concurrency and batch
    /// are measured, taking turns: each inbox figure beside the floor of
    /// its own turn.
    #[arg(long, default_value_t = 1)]
    pairs: usize,
    /// Measure, in each turn after the floor, the floor with an inbox
    /// whose rows carry an indexed expiry time.
    #[arg(long)]
    expiring_floor: bool,
}

type Fail = Box<dyn std::error::Error>;

/// Writes one row per message beside its inbox record.
struct Orders {
    inbox: PostgresStore,
    table: String,
    /// Messages written, and the count at which `done` is notified.
    written: Arc<AtomicUsize>,
    target: usize,
    done: Arc<Notify>,
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
        self.count(1);
        Ok((tx, Handled::Applied))
    }

    /// The batch's rows in one statement.
    async fn handle_batch(
        &self,
        messages: &[&InboundMessage],
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Vec<Handled>), HandlerError> {
        let ids: Vec<&str> = messages.iter().map(|m| m.id().as_str()).collect();
        let bodies: Vec<&[u8]> = messages.iter().map(|m| m.payload()).collect();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, body) SELECT * FROM unnest($1::text[], $2::bytea[])",
            self.table
        )))
        .bind(ids)
        .bind(bodies)
        .execute(&mut *tx)
        .await?;
        self.count(messages.len());
        Ok((tx, vec![Handled::Applied; messages.len()]))
    }
}

impl Orders {
    /// Counts `written` messages before their commit: `done` fires at the
    /// last, and the run then waits for its commit and ack at shutdown.
    fn count(&self, written: usize) {
        let before = self.written.fetch_add(written, Ordering::SeqCst);
        if before < self.target && before + written >= self.target {
            self.done.notify_one();
        }
    }
}

/// CPU per message as `consumer / broker / Postgres`.
fn split(cpu: &CpuPerUnit) -> String {
    format!(
        "{:.0} / {:.0} / {:.0}",
        cpu.own_us, cpu.broker_us, cpu.postgres_us
    )
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
            partition: 0,
            position: LogPosition::new(n as u64 + 1, 0),
            state: MessageState::Pending,
            attempts: 0,
            last_error: None,
            enqueued_at: Timestamp::from_unix_millis(0),
            available_at: Timestamp::from_unix_millis(0),
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

/// Drains `count` deliveries, acking each, one at a time; messages a
/// second.
async fn drain_bare<S: Source>(source: &mut S, count: usize) -> Result<f64, Fail> {
    let started = Instant::now();
    for _ in 0..count {
        let next = tokio::time::timeout(Duration::from_secs(60), source.next()).await??;
        next.ok_or("the source closed")?.ack().await?;
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// The floor's batch: as many messages per transaction as the consumer's
/// batches would hold.
const FLOOR_BATCH: usize = 100;

/// The least any consumer with an inbox does, per batch of
/// [`FLOOR_BATCH`] deliveries: one transaction inserting the batch's
/// inbox rows and its domain rows, committed, then each delivery acked;
/// messages a second. With `expiring`, each inbox row also carries its
/// expiry time, indexed for a purge.
async fn drain_floor<S: Source>(
    pool: &PgPool,
    source: &mut S,
    count: usize,
    run: &str,
    expiring: bool,
) -> Result<f64, Fail> {
    let (inbox, orders) = (format!("bench_inbox_{run}"), format!("bench_orders_{run}"));
    let mut ddl = vec![
        format!("CREATE TABLE {inbox} (id text PRIMARY KEY)"),
        format!("CREATE TABLE {orders} (id text PRIMARY KEY, body bytea NOT NULL)"),
    ];
    let mut insert = format!("INSERT INTO {inbox} (id) SELECT * FROM unnest($1::text[])");
    if expiring {
        ddl[0] =
            format!("CREATE TABLE {inbox} (id text PRIMARY KEY, expires_at timestamptz NOT NULL)");
        ddl.push(format!("CREATE INDEX ON {inbox} (expires_at)"));
        insert = format!(
            "INSERT INTO {inbox} (id, expires_at) \
             SELECT id, now() + interval '1 day' FROM unnest($1::text[]) AS id"
        );
    }
    for ddl in ddl {
        sqlx::query(AssertSqlSafe(ddl)).execute(pool).await?;
    }
    let started = Instant::now();
    let mut done = 0;
    while done < count {
        let mut batch = Vec::with_capacity(FLOOR_BATCH);
        while batch.len() < FLOOR_BATCH.min(count - done) {
            let next = tokio::time::timeout(Duration::from_secs(60), source.next()).await??;
            batch.push(next.ok_or("the source closed")?);
        }
        let ids: Vec<String> = batch
            .iter()
            .map(|d| d.message().id().as_str().to_string())
            .collect();
        let bodies: Vec<Vec<u8>> = batch
            .iter()
            .map(|d| d.message().payload().to_vec())
            .collect();
        let mut tx = idem_postgres::begin(pool).await?;
        sqlx::query(AssertSqlSafe(insert.clone()))
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {orders} (id, body) SELECT * FROM unnest($1::text[], $2::bytea[])"
        )))
        .bind(&ids)
        .bind(&bodies)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let acked: Vec<&S::Delivery> = batch.iter().collect();
        Delivery::ack_all(&acked).await?;
        done += batch.len();
    }
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

/// What is measured on a queue (a stream) of its own.
#[derive(Debug, Clone, Copy)]
enum Run {
    Bare,
    Floor,
    /// The floor with an inbox that expires.
    ExpiringFloor,
    /// At a concurrency and a batch size.
    Inbox(usize, usize),
}

/// The bare consumer, then `pairs` times the floor (and the expiring
/// floor, with `expiring`) followed by the inbox at each concurrency and
/// batch size.
fn runs(levels: &[usize], batches: &[usize], pairs: usize, expiring: bool) -> Vec<Run> {
    let floors = std::iter::once(Run::Floor).chain(expiring.then_some(Run::ExpiringFloor));
    let turn = floors.chain(
        levels
            .iter()
            .flat_map(|level| batches.iter().map(|batch| Run::Inbox(*level, *batch))),
    );
    let turns: Vec<Run> = turn.collect();
    std::iter::once(Run::Bare)
        .chain((0..pairs.max(1)).flat_map(|_| turns.iter().copied()))
        .collect()
}

/// What one run with the inbox measured.
struct Measured {
    /// The floor measured in the same turn, and its CPU per message.
    floor: (f64, CpuPerUnit),
    /// The expiring floor of the same turn, if measured.
    expiring: Option<(f64, CpuPerUnit)>,
    rate: f64,
    /// CPU per message, by process.
    cpu: CpuPerUnit,
    /// Transactions committed, and WAL flushes to disk, per message.
    per_message: Option<(f64, f64)>,
}

/// Drains `count` deliveries through `consumer`'s `run`; its rate and
/// the database's commits per message.
async fn drain_inbox<S: Source>(
    pool: &PgPool,
    source: &mut S,
    count: usize,
    consumer: &Consumer<Orders>,
    done: &Notify,
    count_commits: bool,
    processes: &[&str],
) -> Result<Measured, Fail> {
    let before = match count_commits {
        true => Some(commits(pool).await?),
        false => None,
    };
    let cpu_before = CpuSample::now(processes);
    let started = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(300),
        consumer.run(source, done.notified()),
    )
    .await??;
    let rate = count as f64 / started.elapsed().as_secs_f64();
    let cpu = CpuSample::now(processes).per_unit_since(&cpu_before, count);
    let mut per_message = None;
    if let Some((commits_before, syncs_before)) = before {
        // An idle session publishes its counts within 10 s.
        tokio::time::sleep(Duration::from_secs(11)).await;
        let (commits_after, syncs_after) = commits(pool).await?;
        let per = |n: i64| n as f64 / count as f64;
        per_message = Some((
            per(commits_after - commits_before),
            per(syncs_after - syncs_before),
        ));
    }
    Ok(Measured {
        floor: (0.0, CpuPerUnit::default()),
        expiring: None,
        rate,
        cpu,
        per_message,
    })
}

/// The database's committed transactions (read-only ones and the pool's
/// release checks too) and the server's WAL flushes to disk, so far.
async fn commits(pool: &PgPool) -> Result<(i64, i64), Fail> {
    let counts: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                (SELECT wal_sync FROM pg_stat_wal)",
    )
    .fetch_one(pool)
    .await?;
    Ok(counts)
}

/// A consumer over a fresh Postgres inbox and orders table, handling
/// `concurrency` batches of up to `batch` deliveries at once; its notice
/// once `count` are written.
async fn inbox_consumer(
    pool: &PgPool,
    run: &str,
    count: usize,
    (concurrency, batch): (usize, usize),
) -> Result<(Consumer<Orders>, Arc<Notify>), Fail> {
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
    let done = Arc::new(Notify::new());
    let handler = Orders {
        inbox: inbox.clone(),
        table,
        written: Arc::default(),
        target: count,
        done: done.clone(),
    };
    let parking = MemoryParking::new();
    let consumer = Consumer::with_options(
        "bench",
        Arc::new(inbox),
        Arc::new(parking),
        handler,
        ConsumerOptions::default()
            .concurrency(concurrency)
            .batch(batch, BATCH_WAIT),
    )?;
    Ok((consumer, done))
}

/// A Kafka run's topic's partitions: the 100 aggregates spread over them.
const KAFKA_PARTITIONS: i32 = 4;

/// RabbitMQ's prefetch in every run: room for every delivery the consumer
/// holds at the largest figures measured (16 batches of 100).
const PREFETCH: u16 = 2000;

/// How long a batch waits to fill.
const BATCH_WAIT: Duration = Duration::from_millis(5);

/// One broker's figures.
struct Row {
    broker: &'static str,
    /// The broker server's command names, for its CPU.
    processes: &'static [&'static str],
    bare: f64,
    floor: f64,
    floor_cpu: CpuPerUnit,
    expiring: Option<(f64, CpuPerUnit)>,
    /// By concurrency and batch size.
    inbox: Vec<((usize, usize), Measured)>,
}

impl Row {
    fn new(broker: &'static str, processes: &'static [&'static str]) -> Self {
        Self {
            broker,
            processes,
            bare: 0.0,
            floor: 0.0,
            floor_cpu: CpuPerUnit::default(),
            expiring: None,
            inbox: Vec::new(),
        }
    }

    /// Runs `kind` over `source`, holding `count` messages, on tables
    /// named after `run`, and keeps what it measured.
    async fn measure<S: Source>(
        &mut self,
        kind: Run,
        pool: &PgPool,
        source: &mut S,
        count: usize,
        run: &str,
        count_commits: bool,
    ) -> Result<(), Fail> {
        match kind {
            Run::Bare => self.bare = drain_bare(source, count).await?,
            Run::Floor => {
                let before = CpuSample::now(self.processes);
                self.floor = drain_floor(pool, source, count, run, false).await?;
                self.floor_cpu = CpuSample::now(self.processes).per_unit_since(&before, count);
            }
            Run::ExpiringFloor => {
                let before = CpuSample::now(self.processes);
                let rate = drain_floor(pool, source, count, run, true).await?;
                let cpu = CpuSample::now(self.processes).per_unit_since(&before, count);
                self.expiring = Some((rate, cpu));
            }
            Run::Inbox(level, batch) => {
                let figures = (level, batch);
                let (consumer, done) = inbox_consumer(pool, run, count, figures).await?;
                let measured = drain_inbox(
                    pool,
                    source,
                    count,
                    &consumer,
                    &done,
                    count_commits,
                    self.processes,
                )
                .await?;
                let floor = (self.floor, self.floor_cpu);
                let expiring = self.expiring;
                self.inbox.push((
                    figures,
                    Measured {
                        floor,
                        expiring,
                        ..measured
                    },
                ));
            }
        }
        Ok(())
    }
}

async fn drop_tables(pool: &PgPool, run: &str) -> Result<(), Fail> {
    for table in [format!("bench_inbox_{run}"), format!("bench_orders_{run}")] {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
            .execute(pool)
            .await?;
    }
    Ok(())
}

async fn nats(
    url: &str,
    pool: &PgPool,
    count: usize,
    figures: &[Run],
    count_commits: bool,
) -> Result<Row, Fail> {
    let context = jetstream::new(async_nats::connect(url).await?);
    let mut row = Row::new("nats", cpu::NATS);
    for kind in figures.iter().copied() {
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
        let config = JetStreamSource::durable("bench", Duration::from_secs(30));
        let mut source = JetStreamSource::attach(&context, &stream, config).await?;
        row.measure(kind, pool, &mut source, count, &run, count_commits)
            .await?;
        context.delete_stream(&stream).await?;
        drop_tables(pool, &run).await?;
    }
    Ok(row)
}

async fn rabbitmq(
    url: &str,
    pool: &PgPool,
    count: usize,
    figures: &[Run],
    count_commits: bool,
) -> Result<Row, Fail> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let mut row = Row::new("rabbitmq", cpu::RABBITMQ);
    for kind in figures.iter().copied() {
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
        let options = RabbitSourceOptions::new(&queue)?.with_prefetch(PREFETCH)?;
        let mut source = RabbitSource::connect(url, options).await?;
        row.measure(kind, pool, &mut source, count, &run, count_commits)
            .await?;
        source.close().await?;
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await?;
        drop_tables(pool, &run).await?;
    }
    Ok(row)
}

async fn kafka(
    brokers: &str,
    pool: &PgPool,
    count: usize,
    figures: &[Run],
    count_commits: bool,
) -> Result<Row, Fail> {
    let mut row = Row::new("kafka", cpu::KAFKA);
    for kind in figures.iter().copied() {
        // A client of its own per topic, gone before the next: tansu
        // 0.6.0 answers a metadata refresh after a topic's deletion in a
        // way that crashes librdkafka 2.12 (a null topic name).
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()?;
        let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let topic = format!("bench-consumer-{run}");
        for created in admin
            .create_topics(
                &[NewTopic::new(
                    &topic,
                    KAFKA_PARTITIONS,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new(),
            )
            .await?
        {
            created.map_err(|(topic, code)| format!("topic {topic}: {code}"))?;
        }
        let publisher = KafkaPublisher::new(brokers, KafkaOptions::new(&topic)?)?;
        // The member joins its group before the clock starts (tansu
        // forms a new group in about half its session timeout, hence the
        // short one): it takes one message published first, then the
        // measured ones are published.
        let mut config = KafkaSource::config(brokers, &run);
        config.set("session.timeout.ms", "6000");
        let mut source = KafkaSource::subscribe(&config, &[&topic])?;
        publish(&publisher, &messages(1)?).await?;
        let first = tokio::time::timeout(Duration::from_secs(60), source.next()).await??;
        first.ok_or("the source closed")?.ack().await?;
        publish(&publisher, &messages(count)?).await?;
        row.measure(kind, pool, &mut source, count, &run, count_commits)
            .await?;
        source.close().await;
        drop(publisher);
        admin.delete_topics(&[&topic], &AdminOptions::new()).await?;
        drop_tables(pool, &run).await?;
    }
    Ok(row)
}

#[tokio::main]
async fn main() -> Result<(), Fail> {
    let args = Args::parse();
    let pg_url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nats_url =
        std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let kafka_brokers =
        std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let amqp_url = std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let most = args.concurrency.iter().copied().max().unwrap_or(1);
    let figures = runs(
        &args.concurrency,
        &args.batch,
        args.pairs,
        args.expiring_floor,
    );
    // Every transaction opens whole (the store's, and the floor's through
    // `idem_postgres::begin`): the pool needs no release check.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(u32::try_from(most + 2)?)
        .connect(&pg_url)
        .await?;
    println!(
        "| broker | bare consumer (acks only), msg/s | concurrency | batch | consumer with Postgres inbox and commit, msg/s | inbox / bare | floor: one commit per 100, msg/s | inbox / floor | inbox CPU µs/msg: consumer / broker / Postgres | floor CPU µs/msg: consumer / broker / Postgres | Postgres transactions per message | WAL flushes per message | expiring floor, msg/s | inbox / expiring floor | expiring floor CPU µs/msg: consumer / broker / Postgres |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let brokers: &[Broker] = match args.broker {
        Broker::Both => &[Broker::Rabbitmq, Broker::Nats],
        Broker::All => &[Broker::Rabbitmq, Broker::Nats, Broker::Kafka],
        Broker::Rabbitmq => &[Broker::Rabbitmq],
        Broker::Nats => &[Broker::Nats],
        Broker::Kafka => &[Broker::Kafka],
    };
    for broker in brokers {
        let row = match broker {
            Broker::Rabbitmq => {
                rabbitmq(
                    &amqp_url,
                    &pool,
                    args.messages,
                    &figures,
                    args.count_commits,
                )
                .await?
            }
            Broker::Kafka => {
                kafka(
                    &kafka_brokers,
                    &pool,
                    args.messages,
                    &figures,
                    args.count_commits,
                )
                .await?
            }
            _ => {
                nats(
                    &nats_url,
                    &pool,
                    args.messages,
                    &figures,
                    args.count_commits,
                )
                .await?
            }
        };
        for ((level, batch), measured) in &row.inbox {
            let commits = measured.per_message.map_or_else(
                || "not counted | not counted".to_string(),
                |(commits, syncs)| format!("{commits:.2} | {syncs:.2}"),
            );
            let (floor, floor_cpu) = measured.floor;
            let expiring = measured.expiring.map_or_else(
                || "not measured | not measured | not measured".to_string(),
                |(rate, cpu)| format!("{rate:.0} | {:.2} | {}", measured.rate / rate, split(&cpu)),
            );
            println!(
                "| {} | {:.0} | {level} | {batch} | {:.0} | {:.2} | {:.0} | {:.2} | {} | {} | {commits} | {expiring} |",
                row.broker,
                row.bare,
                measured.rate,
                measured.rate / row.bare,
                floor,
                measured.rate / floor,
                split(&measured.cpu),
                split(&floor_cpu),
            );
        }
    }
    Ok(())
}
