//! Kafka as a [`ConsumerBroker`] (the `kafka` feature): a topic of the
//! test's own with several partitions and one consumer group on it, for the
//! consumer scenarios on any backend (`idem-kafka` runs them on the memory
//! stores).

use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{Delivery, async_trait};
use idem_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem_kafka::rdkafka::client::DefaultClientContext;
use idem_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use idem_kafka::rdkafka::error::KafkaError;
use idem_kafka::rdkafka::message::{Header, OwnedHeaders};
use idem_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem_kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};
use idem_kafka::{KafkaOptions, KafkaPublisher, KafkaSource};
use idem_outbox::Publisher;

use crate::consumers::ConsumerBroker;

/// The partitions of a test's topic: more than one, so that order is
/// shown to hold per aggregate, not by a single partition.
pub const PARTITIONS: i32 = 4;

/// The broker `IDEM_KAFKA_BROKERS` names (scripts/test ensures one), or the
/// local default: a broker that is not there fails the tests.
pub fn brokers() -> String {
    std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_string())
}

/// A member's configuration for the tests: a short session and poll
/// interval, so that a member that died without leaving holds no
/// rebalance up for long (a rebalance waits up to the poll interval for
/// every member to join again).
pub fn member_config(brokers: &str, group: &str) -> ClientConfig {
    let mut config = KafkaSource::config(brokers, group);
    config
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.poll.interval.ms", "10000");
    config
}

/// Each of `topic`'s partitions `0..partitions`: group `group`'s committed
/// offset on `brokers` (0 where it has none) and the partition's end. It
/// blocks: call it on a blocking thread (`block_in_place`).
///
/// # Errors
///
/// The client's, when the broker does not answer within 5 s.
pub fn positions(
    brokers: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<(i64, i64)>, KafkaError> {
    let consumer: BaseConsumer = member_config(brokers, group).create()?;
    let mut asked = TopicPartitionList::new();
    for partition in 0..partitions {
        asked.add_partition(topic, partition);
    }
    let committed = consumer.committed_offsets(asked, Duration::from_secs(5))?;
    let mut positions = Vec::new();
    for element in committed.elements() {
        let (_, end) =
            consumer.fetch_watermarks(topic, element.partition(), Duration::from_secs(5))?;
        let at = match element.offset() {
            Offset::Offset(at) => at,
            _ => 0,
        };
        positions.push((at, end));
    }
    Ok(positions)
}

/// Creates `topic` with `partitions` on `brokers`.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    for result in created {
        result.unwrap();
    }
}

/// Deletes `topic` on `brokers`, if it can.
pub async fn delete_topic(brokers: &str, topic: &str) {
    let admin: Result<AdminClient<DefaultClientContext>, _> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create();
    if let Ok(admin) = admin {
        let _ = admin.delete_topics(&[topic], &AdminOptions::new()).await;
    }
}

/// A topic of the test's own (random name) and one consumer group on it.
pub struct Kafka {
    brokers: String,
    /// The topic.
    pub topic: String,
    group: String,
    publisher: Arc<KafkaPublisher>,
    raw: FutureProducer,
}

impl Kafka {
    /// Creates the topic.
    pub async fn new() -> Self {
        Self::on(&brokers()).await
    }

    /// Creates the topic on `brokers`.
    pub async fn on(brokers: &str) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let topic = format!("idem-consumer-{id}");
        create_topic(brokers, &topic, PARTITIONS).await;
        let publisher = KafkaPublisher::new(brokers, KafkaOptions::new(&topic).unwrap()).unwrap();
        let raw = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .unwrap();
        Self {
            brokers: brokers.to_string(),
            topic,
            group: format!("consumer-{id}"),
            publisher: Arc::new(publisher),
            raw,
        }
    }

    /// A member of another group of the test's own on the topic.
    pub fn other_group(&self) -> KafkaSource {
        let group = format!("other-{}", uuid::Uuid::new_v4().simple());
        KafkaSource::subscribe(&member_config(&self.brokers, &group), &[&self.topic]).unwrap()
    }

    /// Deletes the topic, once this broker's own clients are gone (tansu
    /// 0.6.0 answers a client's metadata refresh after a deletion in a way
    /// that crashes librdkafka 2.12): a test deletes it last, after its
    /// sources are closed and its publishers dropped.
    pub async fn delete(self) {
        let Self {
            brokers,
            topic,
            publisher,
            raw,
            ..
        } = self;
        drop((publisher, raw));
        delete_topic(&brokers, &topic).await;
    }
}

#[async_trait]
impl ConsumerBroker for Kafka {
    type Source = KafkaSource;

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    async fn source(&self) -> KafkaSource {
        KafkaSource::subscribe(&member_config(&self.brokers, &self.group), &[&self.topic]).unwrap()
    }

    /// Closes the member and waits until it has left its group.
    async fn kill(&self, source: KafkaSource) {
        source.close().await;
    }

    async fn publish_raw(&self, id: &str, aggregate: &str, version: &str) {
        let mut headers = OwnedHeaders::new();
        for (key, value) in [
            (idem_kafka::ID_HEADER, id),
            (idem_kafka::TYPE_HEADER, "order.placed"),
            (idem_kafka::AGGREGATE_HEADER, aggregate),
            (idem_kafka::SEQUENCE_HEADER, version),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let record = FutureRecord::to(&self.topic)
            .key(aggregate)
            .payload("{}")
            .headers(headers);
        self.raw
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    fn duplicate_window(&self) -> Duration {
        Duration::ZERO
    }

    fn counts_redeliveries(&self) -> bool {
        false
    }
}

impl Kafka {
    /// Reads the topic from its start with a member of a group of its own:
    /// `count` records, then whatever more comes within `settle` (copies),
    /// as `(message id, aggregate, sequence, payload)` in the order
    /// delivered.
    pub async fn read(
        &self,
        count: usize,
        settle: Duration,
    ) -> Vec<(String, String, u64, Vec<u8>)> {
        // A member of a fresh group each attempt: tansu 0.6.0 can leave a
        // group's partitions to no one (a member expired without a new
        // generation), and a reader that hears nothing for 30 s starts
        // over from the topic's start in another group.
        let deadline = tokio::time::Instant::now() + crate::relays::PATIENCE;
        let (mut source, mut read) = loop {
            let mut source = self.other_group();
            let mut read = Vec::new();
            while read.len() < count {
                match tokio::time::timeout(
                    Duration::from_secs(30),
                    idem_consumer::Source::next(&mut source),
                )
                .await
                {
                    Ok(Ok(Some(delivery))) => read.push(summary(delivery.message())),
                    Ok(Ok(None)) => panic!("the source closed"),
                    // A broker's passing error, as a consumer sees them:
                    // asked again after a pause, within the patience.
                    Ok(Err(error)) => {
                        assert!(
                            tokio::time::Instant::now() < deadline,
                            "the broker kept failing: {error}"
                        );
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(_) => break,
                }
            }
            if read.len() == count {
                break (source, read);
            }
            source.close().await;
            assert!(
                tokio::time::Instant::now() < deadline,
                "read {} of {count} records within the patience",
                read.len()
            );
        };
        while let Ok(next) =
            tokio::time::timeout(settle, idem_consumer::Source::next(&mut source)).await
        {
            let delivery = next.unwrap().unwrap();
            read.push(summary(delivery.message()));
        }
        source.close().await;
        read
    }
}

/// A message as [`crate::relays::check_order`] takes it.
pub fn summary(message: &idem_core::store::InboundMessage) -> (String, String, u64, Vec<u8>) {
    (
        message.id().as_str().to_string(),
        message.aggregate().unwrap_or_default().to_string(),
        message.version().unwrap_or_default(),
        message.payload().to_vec(),
    )
}

/// A tansu broker of the test's own, on a port of its own, keeping its
/// data in an S3 bucket of its own on the DynamoDB emulator (moto, at
/// [`dynamo_endpoint`](crate::support::dynamo_endpoint), which serves S3 too), so that it can be killed
/// and started again on its data. The binary is `IDEM_TANSU`
/// (scripts/test sets it), or `tansu` on the path. Killed when dropped.
pub struct PrivateTansu {
    port: u16,
    advertised: String,
    bucket: String,
    child: std::sync::Mutex<Option<tokio::process::Child>>,
}

impl Drop for PrivateTansu {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

fn moto() -> String {
    crate::support::dynamo_endpoint().unwrap_or_else(|| "http://127.0.0.1:8765".to_string())
}

/// One HTTP/1.1 request without a body to `endpoint` (`http://host:port`);
/// its status code.
async fn http_status(endpoint: &str, method: &str, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = crate::faults::authority(endpoint).to_string();
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status from {endpoint}: {answer}"))
}

impl PrivateTansu {
    /// Starts one on a free port, advertising itself.
    pub async fn start() -> Self {
        let port = crate::faults::free_port();
        Self::start_on(port, format!("127.0.0.1:{port}")).await
    }

    /// Starts one listening on `port` and advertising `advertised`
    /// (`host:port`: a proxy in front of it, for a fault test).
    pub async fn start_on(port: u16, advertised: String) -> Self {
        let bucket = format!("idem-tansu-{}", uuid::Uuid::new_v4().simple());
        let status = http_status(&moto(), "PUT", &format!("/{bucket}")).await;
        assert_eq!(status, 200, "moto made no bucket {bucket}");
        let broker = Self {
            port,
            advertised,
            bucket,
            child: std::sync::Mutex::new(None),
        };
        broker.spawn().await;
        broker
    }

    /// `host:port` clients bootstrap from (the advertised address).
    pub fn brokers(&self) -> String {
        self.advertised.clone()
    }

    /// Starts the broker on its port and bucket, and waits until it
    /// answers a Kafka request.
    pub async fn spawn(&self) {
        let binary = std::env::var("IDEM_TANSU").unwrap_or_else(|_| "tansu".to_string());
        let endpoint = moto();
        let child = tokio::process::Command::new(&binary)
            .args(["broker", "--listener-url"])
            .arg(format!("tcp://127.0.0.1:{}", self.port))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://{}", self.advertised))
            .arg("--storage-engine")
            .arg(format!("s3://{}/", self.bucket))
            .env("AWS_ENDPOINT", &endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_REGION", "us-east-1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {binary} (IDEM_TANSU, or tansu on the path): {e}")
            });
        *self.child.lock().unwrap() = Some(child);
        crate::relays::wait_until("the private tansu answers", || async {
            if let Some(Ok(Some(status))) =
                self.child.lock().unwrap().as_mut().map(|c| c.try_wait())
            {
                panic!("the private tansu exited: {status}");
            }
            answers(self.port).await
        })
        .await;
    }

    /// Kills the broker (SIGKILL: no shutdown) and waits for it to be gone.
    pub async fn kill(&self) {
        let child = self.child.lock().unwrap().take();
        if let Some(mut child) = child {
            child.kill().await.unwrap();
        }
    }
}

/// Whether a Kafka broker on `port` answers an ApiVersions request.
pub async fn answers(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let asked = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        // Size 10; ApiVersions (18) version 0; correlation id 1; no client id.
        stream
            .write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff])
            .await?;
        let mut head = [0u8; 8];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head[4..] == [0, 0, 0, 1])
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), asked).await,
        Ok(Ok(true))
    )
}
