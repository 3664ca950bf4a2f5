//! The brokers the end-to-end scenario runs on: JetStream on a private
//! `nats-server` it kills and starts again, RabbitMQ behind a proxy that
//! cuts it off, Kafka on a private tansu it kills and starts again.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::PullConsumer;
use idem_conformance::faults::FaultProxy;
use idem_conformance::kafka::{PrivateTansu, member_config};
use idem_conformance::relays::wait_until;
use idem_consumer::{Source, async_trait};
use idem_kafka::rdkafka::ClientConfig;
use idem_kafka::rdkafka::error::KafkaError;
use idem_kafka::rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use idem_kafka::{KafkaOptions, KafkaPublisher, KafkaSource};
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::Publisher;
use idem_rabbitmq::{RabbitOptions, RabbitPublisher, RabbitSource, RabbitSourceOptions};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio::time::Instant;

use super::rabbit::{self, Topology};
use super::{CONSUMER, PATIENCE, PUBLISH_TIMEOUT, env};

/// JetStream's ack wait: the killed consumer's delivery comes again after
/// it; long enough that a loaded machine acks what it handled in time.
const ACK_WAIT: Duration = Duration::from_secs(3);
/// JetStream's duplicate window (its default): the killed relay's batch,
/// published again after the lease, falls inside it.
const WINDOW: Duration = Duration::from_secs(120);

/// A broker the scenario runs on: publishers and sources on connections of
/// their own, the fault it suffers mid-run, and what it holds.
#[async_trait]
pub(crate) trait Broker: Send + Sync + 'static {
    type Source: Source + 'static;

    /// Its name in what the test prints.
    const NAME: &'static str;

    /// A publisher to where the shipping consumer reads.
    async fn publisher(&self) -> Arc<dyn Publisher>;

    /// Its publishers' time limit for a batch, which a relay's lease must
    /// outlast.
    fn publish_timeout(&self) -> Duration {
        PUBLISH_TIMEOUT
    }

    /// A source of the shipping consumer.
    async fn source(&self) -> Self::Source;

    /// Ends `source` as a killed process would: its unsettled deliveries go
    /// back to the broker.
    async fn kill(&self, source: Self::Source);

    /// A source of the shipping consumer for a process of its own, with
    /// `prefetch` deliveries unsettled at once where the broker takes
    /// one, and the proxy its connection goes through where the process's
    /// death must be made (dropped, it cuts the connection).
    async fn process_source(&self, prefetch: u16) -> (Self::Source, Option<FaultProxy>);

    /// Takes the broker away from every client.
    async fn go_down(&self);

    /// How long after the faults every member that died without leaving
    /// is expired, where a consumer joining after that is needed to share
    /// out what those held (Kafka on tansu); `None` elsewhere.
    fn member_expiry(&self) -> Option<Duration> {
        None
    }

    /// Brings it back.
    async fn come_back(&self);

    /// Whether a group whose leader left while it formed stays without a
    /// leader until the broker restarts (Kafka on tansu), so that the
    /// scenario takes it away once more after the last kill; `false`
    /// elsewhere.
    fn loses_a_forming_leader(&self) -> bool {
        false
    }

    /// The messages the broker still has for the consumer: not delivered
    /// yet, or delivered and not acknowledged.
    async fn outstanding(&self) -> u64;

    /// The messages it stored, where it keeps them once acknowledged.
    async fn stored(&self) -> Option<u64>;

    /// Whether it drops a second publish of a message (within a window).
    fn deduplicates(&self) -> bool;

    async fn delete(&self);
}

/// Retries `call` until it answers, as a client would while its server
/// comes back.
pub(crate) async fn answered<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    mut call: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(error) => assert!(Instant::now() < deadline, "{what}: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `nats-server` of the test's own with JetStream on a store directory
/// of its own, on a free port; killed and removed when dropped.
struct PrivateNats {
    port: u16,
    dir: PathBuf,
    child: Mutex<Option<tokio::process::Child>>,
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateNats {
    async fn start() -> Self {
        let port = idem_conformance::faults::free_port();
        let dir = idem_conformance::faults::private_dir(&format!("idem-e2e-nats-{port}"));
        let server = Self {
            port,
            dir,
            child: Mutex::new(None),
        };
        server.spawn().await;
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server on the port and the store directory, and waits
    /// until it greets a client.
    async fn spawn(&self) {
        let binary = env("IDEM_NATS_SERVER", "nats-server");
        let child = tokio::process::Command::new(&binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {binary} (on PATH, or IDEM_NATS_SERVER): {e}"));
        *self.child.lock().unwrap() = Some(child);
        wait_until("the private nats-server greets a client", || async {
            if let Some(Ok(Some(status))) =
                self.child.lock().unwrap().as_mut().map(|c| c.try_wait())
            {
                panic!("the private nats-server exited: {status}");
            }
            greets(self.port).await
        })
        .await;
    }

    /// Kills the server (SIGKILL: no shutdown) and waits for it to be gone.
    async fn kill(&self) {
        let child = self.child.lock().unwrap().take();
        if let Some(mut child) = child {
            child.kill().await.unwrap();
        }
    }
}

/// Whether a NATS server on `port` sends its `INFO` to a new connection.
async fn greets(port: u16) -> bool {
    use tokio::io::AsyncReadExt;
    let greeting = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let mut info = [0u8; 4];
        stream.read_exact(&mut info).await?;
        Ok::<_, std::io::Error>(&info == b"INFO")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), greeting).await,
        Ok(Ok(true))
    )
}

/// JetStream on a private server: a stream on file storage (it outlives a
/// restart of the server) with the default duplicate window, and the
/// shipping consumer's durable pull consumer on it.
pub(crate) struct Nats {
    server: PrivateNats,
    context: jetstream::Context,
    stream: String,
    prefix: String,
}

impl Nats {
    pub(crate) async fn new(run: &str) -> Self {
        let server = PrivateNats::start().await;
        let context = jetstream::new(async_nats::connect(server.url()).await.unwrap());
        let (stream, prefix) = (format!("E2E_{run}"), format!("e2e-{run}"));
        context
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{prefix}.>")],
                storage: jetstream::stream::StorageType::File,
                duplicate_window: WINDOW,
                ..Default::default()
            })
            .await
            .unwrap();
        Self {
            server,
            context,
            stream,
            prefix,
        }
    }

    /// A source of the shipping consumer on a connection of its own (so
    /// that killing it leaves the others be); the durable consumer, made by
    /// the first, holds at most `pending` deliveries unacknowledged where
    /// given.
    async fn attach(&self, pending: Option<i64>) -> JetStreamSource {
        let client = async_nats::connect(self.server.url()).await.unwrap();
        let mut config = JetStreamSource::durable(CONSUMER, ACK_WAIT);
        if let Some(pending) = pending {
            config.max_ack_pending = pending;
        }
        JetStreamSource::attach(&jetstream::new(client), &self.stream, config)
            .await
            .unwrap()
    }
}

#[async_trait]
impl Broker for Nats {
    type Source = JetStreamSource;

    const NAME: &'static str = "nats";

    async fn publisher(&self) -> Arc<dyn Publisher> {
        let options = JetStreamOptions::new(&self.prefix)
            .unwrap()
            .with_timeout(PUBLISH_TIMEOUT)
            .unwrap();
        Arc::new(
            JetStreamPublisher::connect(&self.server.url(), options)
                .await
                .unwrap(),
        )
    }

    /// The scenario's consumer takes one delivery at a time, so the server
    /// hands it one at a time (`max_ack_pending` 1). With the default, the
    /// client held a pull of up to 200 while each one's ack wait ran: on
    /// moto under load (a consume took about 0.7 s) every delivery not yet
    /// handled came again each ack wait, and each copy cost another inbox
    /// read, 306 copies of 36 events, until the patience ran out.
    async fn source(&self) -> JetStreamSource {
        self.attach(Some(1)).await
    }

    async fn kill(&self, source: JetStreamSource) {
        drop(source);
    }

    /// The pull consumer's own batches: JetStream redelivers what a dead
    /// process held after the ack wait, whatever its connection does.
    async fn process_source(&self, _prefetch: u16) -> (JetStreamSource, Option<FaultProxy>) {
        (self.attach(None).await, None)
    }

    async fn go_down(&self) {
        self.server.kill().await;
    }

    async fn come_back(&self) {
        self.server.spawn().await;
    }

    async fn outstanding(&self) -> u64 {
        answered("the consumer's info", || async {
            let stream = self.context.get_stream(&self.stream).await?;
            let mut consumer: PullConsumer = stream.get_consumer(CONSUMER).await?;
            let info = consumer.info().await?;
            Ok::<_, async_nats::Error>(info.num_pending + info.num_ack_pending as u64)
        })
        .await
    }

    async fn stored(&self) -> Option<u64> {
        let messages = answered("the stream's info", || async {
            let mut stream = self.context.get_stream(&self.stream).await?;
            Ok::<_, async_nats::Error>(stream.info().await?.state.messages)
        })
        .await;
        Some(messages)
    }

    fn deduplicates(&self) -> bool {
        true
    }

    async fn delete(&self) {
        let _ = self.context.delete_stream(&self.stream).await;
        self.server.kill().await;
    }
}

/// RabbitMQ (the shared broker) behind a proxy every client connects
/// through: a topic exchange and a quorum queue bound to it, of the test's
/// own; the test looks at the queue directly.
pub(crate) struct Rabbit {
    topology: Topology,
    proxy: FaultProxy,
    via_proxy: String,
}

impl Rabbit {
    /// On a quorum queue, which counts deliveries, so they survive the
    /// consumer.
    pub(crate) async fn new() -> Self {
        let topology = Topology::durable(true).await;
        let proxy = FaultProxy::start(rabbit::address()).await;
        let via_proxy = rabbit::url_via(&proxy.address());
        Self {
            topology,
            proxy,
            via_proxy,
        }
    }
}

#[async_trait]
impl Broker for Rabbit {
    type Source = RabbitSource;

    const NAME: &'static str = "rabbitmq";

    async fn publisher(&self) -> Arc<dyn Publisher> {
        let options = RabbitOptions::new(&self.topology.exchange)
            .unwrap()
            .with_timeout(PUBLISH_TIMEOUT)
            .unwrap();
        Arc::new(
            RabbitPublisher::connect(&self.via_proxy, options)
                .await
                .unwrap(),
        )
    }

    async fn source(&self) -> RabbitSource {
        // One unacknowledged delivery at a time: a queue with none ready
        // then has nothing left for the consumer.
        let options = RabbitSourceOptions::new(self.topology.queue())
            .unwrap()
            .with_prefetch(1)
            .unwrap();
        RabbitSource::connect(&self.via_proxy, options)
            .await
            .unwrap()
    }

    async fn kill(&self, source: RabbitSource) {
        let _ = source.close().await;
    }

    /// Through a proxy of the process's own: RabbitMQ requeues what the
    /// process held once its connection is cut.
    async fn process_source(&self, prefetch: u16) -> (RabbitSource, Option<FaultProxy>) {
        let proxy = FaultProxy::start(rabbit::address()).await;
        let options = RabbitSourceOptions::new(self.topology.queue())
            .unwrap()
            .with_prefetch(prefetch)
            .unwrap();
        let source = RabbitSource::connect(&rabbit::url_via(&proxy.address()), options)
            .await
            .unwrap();
        (source, Some(proxy))
    }

    async fn go_down(&self) {
        self.proxy.stall();
        self.proxy.cut_all();
    }

    async fn come_back(&self) {
        self.proxy.resume();
    }

    async fn outstanding(&self) -> u64 {
        let queue = self
            .topology
            .channel
            .queue_declare(
                self.topology.queue().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        u64::from(queue.message_count())
    }

    async fn stored(&self) -> Option<u64> {
        None
    }

    fn deduplicates(&self) -> bool {
        false
    }

    async fn delete(&self) {
        self.topology.delete().await;
    }
}

/// A batch's time limit on the private tansu, fitted to its measured
/// latency: at least [`PUBLISH_TIMEOUT`], and twenty times the slowest of
/// three produces (after one that connects and gets the producer its id).
/// tansu keeps every batch in S3 on moto (one request at a time, in one
/// Python process): on a loaded machine the soak's first produce outlasted
/// a second every time it was tried.
async fn fitted_publish_timeout(brokers: &str, topic: &str) -> Duration {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", PATIENCE.as_millis().to_string())
        .create()
        .unwrap();
    let mut slowest = Duration::ZERO;
    for probe in 0..4 {
        let started = Instant::now();
        let record = FutureRecord::to(topic).key("probe").payload("{}");
        producer
            .send(record, PATIENCE)
            .await
            .map_err(|(error, _)| error)
            .unwrap();
        if probe > 0 {
            slowest = slowest.max(started.elapsed());
        }
    }
    PUBLISH_TIMEOUT.max(slowest * 20)
}

/// Kafka on a private tansu keeping its data in S3 (moto), which the
/// scenario kills and starts again on that data: a topic of four
/// partitions and the shipping consumer's group; every source a member of
/// its own (a rebalance each time one joins or leaves).
pub(crate) struct Kafka {
    server: PrivateTansu,
    topic: String,
    /// Where publishers send a record before their first batch.
    warm_up: String,
    publish_timeout: Duration,
}

impl Kafka {
    pub(crate) async fn new(run: &str) -> Self {
        let server = PrivateTansu::start().await;
        let (topic, warm_up) = (format!("e2e-{run}"), format!("e2e-{run}-warm-up"));
        idem_conformance::kafka::create_topic(&server.brokers(), &topic, 4).await;
        idem_conformance::kafka::create_topic(&server.brokers(), &warm_up, 1).await;
        let publish_timeout = fitted_publish_timeout(&server.brokers(), &warm_up).await;
        Self {
            server,
            topic,
            warm_up,
            publish_timeout,
        }
    }

    /// The shipping group's committed offsets and the partitions' ends.
    fn positions(&self) -> Result<Vec<(i64, i64)>, KafkaError> {
        idem_conformance::kafka::positions(&self.server.brokers(), CONSUMER, &self.topic, 4)
    }
}

#[async_trait]
impl Broker for Kafka {
    type Source = KafkaSource;

    const NAME: &'static str = "kafka";

    /// A publisher whose producer is connected, has its producer id and
    /// knows the topic before the relay's first batch (a cold one spent the
    /// whole time limit on that under load: the first batch, which the
    /// scenario needs confirmed, failed whole).
    async fn publisher(&self) -> Arc<dyn Publisher> {
        let options = KafkaOptions::new(&self.topic)
            .unwrap()
            .with_timeout(self.publish_timeout)
            .unwrap();
        let publisher = KafkaPublisher::new(&self.server.brokers(), options).unwrap();
        let producer = publisher.producer();
        answered("a warm-up record", || {
            let record = FutureRecord::to(&self.warm_up).key("warm-up").payload("{}");
            let producer = producer.clone();
            async move {
                producer
                    .send(record, Duration::from_secs(10))
                    .await
                    .map_err(|(error, _)| error)
            }
        })
        .await;
        let topic = self.topic.clone();
        answered("the topic's metadata", || {
            let (producer, topic) = (producer.clone(), topic.clone());
            async move {
                tokio::task::spawn_blocking(move || {
                    producer
                        .client()
                        .fetch_metadata(Some(&topic), Duration::from_secs(5))
                        .map(|_| ())
                })
                .await
                .unwrap()
            }
        })
        .await;
        Arc::new(publisher)
    }

    fn publish_timeout(&self) -> Duration {
        self.publish_timeout
    }

    async fn source(&self) -> KafkaSource {
        KafkaSource::subscribe(
            &member_config(&self.server.brokers(), CONSUMER),
            &[&self.topic],
        )
        .unwrap()
    }

    /// Leaves the group: the next member reads from the last commit.
    async fn kill(&self, source: KafkaSource) {
        source.close().await;
    }

    /// A member of its own: an aborted process's member leaves the group
    /// as its source is dropped, and what it never settled is read again
    /// by the next owner of its partitions.
    async fn process_source(&self, _prefetch: u16) -> (KafkaSource, Option<FaultProxy>) {
        (self.source().await, None)
    }

    async fn go_down(&self) {
        self.server.kill().await;
    }

    /// tansu 0.6.0 expires a member whose heartbeats stopped (one whose
    /// last heartbeat before the broker's restart is older than the session
    /// timeout once it is back) without starting a new generation: the
    /// group is not rebalanced, the partitions assigned to that member stay
    /// its, and no member reads them. A member joining starts a new
    /// generation, in which the live members share every partition.
    /// (Later tansu starts one on the expiry itself; Apache Kafka always
    /// has.) The members' session timeout and two seconds more.
    fn member_expiry(&self) -> Option<Duration> {
        Some(Duration::from_secs(8))
    }

    async fn come_back(&self) {
        self.server.spawn().await;
    }

    /// tansu 0.6.0 keeps a forming group's leader when that member leaves
    /// (a killed process's source leaves the group as it is dropped): the
    /// live members wait for the departed leader's assignment, and the
    /// group can stay unformed for minutes (seen: generation 10 forming
    /// under a leader gone for three minutes, nothing consumed; another
    /// run stalled two and a half minutes). A restart reads the group back
    /// from its store without a leader that is not a member, and the next
    /// member to join leads. (A member that stops heartbeating loses its
    /// lead; Apache Kafka elects another leader in either case.)
    fn loses_a_forming_leader(&self) -> bool {
        true
    }

    /// What the group has not committed past.
    async fn outstanding(&self) -> u64 {
        let positions = answered("the group's offsets", || async {
            tokio::task::block_in_place(|| self.positions())
        })
        .await;
        positions
            .iter()
            .map(|(at, end)| u64::try_from(end - at).unwrap_or(0))
            .sum()
    }

    async fn stored(&self) -> Option<u64> {
        let positions = answered("the partitions' ends", || async {
            tokio::task::block_in_place(|| self.positions())
        })
        .await;
        Some(
            positions
                .iter()
                .map(|(_, end)| u64::try_from(*end).unwrap_or(0))
                .sum(),
        )
    }

    fn deduplicates(&self) -> bool {
        false
    }

    /// Kills the private broker, its topics with it. (A topic deleted
    /// while clients of it still run crashes librdkafka 2.12 on tansu
    /// 0.6.0's next metadata answer: SIGSEGV in the soak's teardown.)
    async fn delete(&self) {
        self.server.kill().await;
    }
}
