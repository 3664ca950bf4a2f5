//! # idem-kafka
//!
//! Kafka for idem, on [rdkafka](https://docs.rs/rdkafka) (librdkafka, built
//! from its bundled sources).
//!
//! The publishing side: a [`KafkaPublisher`] implements
//! [`idem_outbox::Publisher`], so an [`idem_outbox::Relay`] publishes every
//! committed outbox message to a topic, and counts it published only once
//! Kafka's delivery report says the record is stored.
//!
//! - The record's key is the message's aggregate, so every message of one
//!   aggregate goes to one partition and keeps its order there. The
//!   message id, type, aggregate and sequence travel as headers
//!   ([`ID_HEADER`], [`TYPE_HEADER`], [`AGGREGATE_HEADER`],
//!   [`SEQUENCE_HEADER`]), beside the message's own headers.
//! - The producer is idempotent (`enable.idempotence`, `acks=all`): a
//!   record librdkafka sends again after a lost reply, within one producer
//!   session, is stored once and in order. Kafka drops nothing else: a
//!   record published again by a relay that stopped between the delivery
//!   report and its mark, or by a second producer, is a second record, so
//!   the consumer's inbox ([`KafkaSource`] with `idem_consumer::Consumer`)
//!   is what makes its second delivery a duplicate. [`Published::duplicate`]
//!   is therefore never reported.
//! - A batch is handed to the producer whole, then every delivery report
//!   awaited, all within the time limit ([`KafkaOptions::with_timeout`],
//!   10 s by default, which is also the producer's `message.timeout.ms`):
//!   a record the broker refused, a topic that does not exist, or no report
//!   in time is an `Err`, which the relay retries and, at its count, parks.
//!
//! The consuming side: a [`KafkaSource`] is a consumer group member with
//! automatic offset commits off. An offset is committed only once every
//! message before it in its partition was settled (applied, a duplicate,
//! or parked), so a consumer that dies loses nothing: the next owner of the
//! partition reads again from the first unsettled message. Kafka has no
//! per-message negative acknowledgement: a retry is held in the process
//! and delivered again after its delay (see [`KafkaSource`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_kafka::{KafkaOptions, KafkaPublisher};
//! use idem_memory::MemoryOutbox;
//! use idem_outbox::{Relay, RelayOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let publisher = KafkaPublisher::new("127.0.0.1:9092", KafkaOptions::new("orders")?)?;
//! let relay = Relay::new(Arc::new(MemoryOutbox::new()), Arc::new(publisher), RelayOptions::default());
//! relay.run(std::future::pending()).await;
//! # Ok(())
//! # }
//! ```
#![doc = include_str!("../GUIDE.md")]

mod consumer;

pub use consumer::{KafkaDelivery, KafkaSource};
pub use rdkafka;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::InvalidInput;
use idem_core::store::OutboxMessage;
use idem_outbox::{PublishError, Published, Publisher, async_trait};
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use tokio::time::{Instant, timeout_at};

/// The broker's name in a [`PublishError`] or an
/// [`idem_consumer::BrokerError`].
pub const BROKER: &str = "kafka";

/// The Kafka header holding the outbox message's id: the consumer's
/// message id.
pub const ID_HEADER: &str = "Idem-Id";

/// The Kafka header holding the message's type.
pub const TYPE_HEADER: &str = "Idem-Type";

/// The Kafka header holding the message's aggregate (also the record's
/// key).
pub const AGGREGATE_HEADER: &str = "Idem-Aggregate";

/// The Kafka header holding the message's sequence in its aggregate, in
/// decimal (1, 2, 3...).
pub const SEQUENCE_HEADER: &str = "Idem-Sequence";

/// A batch's time limit unless [`KafkaOptions::with_timeout`] says
/// otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest topic name Kafka takes.
const MAX_TOPIC_LEN: usize = 249;

/// Where and how a [`KafkaPublisher`] publishes; each setter checks its
/// value, so a publisher never starts with a bad one.
///
/// ```
/// use std::time::Duration;
/// use idem_kafka::KafkaOptions;
///
/// let options = KafkaOptions::new("orders")?.with_timeout(Duration::from_secs(5))?;
/// assert_eq!(options.topic(), "orders");
/// assert!(KafkaOptions::new("orders/eu").is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaOptions {
    topic: String,
    timeout: Duration,
}

impl KafkaOptions {
    /// Publishes every message to `topic` (a Kafka topic name: 1 to 249
    /// of `a-z`, `A-Z`, `0-9`, `.`, `_`, `-`, neither `.` nor `..`), with
    /// a 10 s limit.
    ///
    /// ```
    /// use idem_kafka::KafkaOptions;
    ///
    /// assert_eq!(KafkaOptions::new("shop.orders")?.topic(), "shop.orders");
    /// assert!(KafkaOptions::new("").is_err());
    /// assert!(KafkaOptions::new("..").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a name that is not such a topic.
    pub fn new(topic: &str) -> Result<Self, InvalidInput> {
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if topic.is_empty()
            || topic.len() > MAX_TOPIC_LEN
            || topic == "."
            || topic == ".."
            || !topic.chars().all(legal)
        {
            return Err(InvalidInput::Malformed {
                field: "topic",
                reason: format!(
                    "{topic:?} is not a Kafka topic name (1 to {MAX_TOPIC_LEN} of a-z, A-Z, 0-9, '.', '_', '-')"
                ),
            });
        }
        Ok(Self {
            topic: topic.to_string(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same with a time limit on each batch, from its first record
    /// handed to the producer to its last delivery report (more than zero,
    /// at most [`MAX_PUBLISH_TIMEOUT`](idem_outbox::MAX_PUBLISH_TIMEOUT)):
    /// what is not reported stored by then is an `Err`. Keep it under the
    /// relay's lease.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_kafka::KafkaOptions;
    ///
    /// let options = KafkaOptions::new("orders")?.with_timeout(Duration::from_secs(3))?;
    /// assert_eq!(options.timeout(), Duration::from_secs(3));
    /// assert!(KafkaOptions::new("orders")?.with_timeout(Duration::ZERO).is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside that range.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, InvalidInput> {
        self.timeout = idem_outbox::validate_publish_timeout(timeout)?;
        Ok(self)
    }

    /// The topic.
    ///
    /// ```
    /// # use idem_kafka::KafkaOptions;
    /// assert_eq!(KafkaOptions::new("orders")?.topic(), "orders");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The time limit on a batch.
    ///
    /// ```
    /// # use idem_kafka::{KafkaOptions, DEFAULT_TIMEOUT};
    /// assert_eq!(KafkaOptions::new("orders")?.timeout(), DEFAULT_TIMEOUT);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The producer's configuration for `brokers` (a comma-separated
    /// `host:port` list): idempotent, `acks=all`, `message.timeout.ms` the
    /// options' limit. Set more on it (TLS, SASL, `linger.ms`) and give it
    /// to [`KafkaPublisher::from_config`]; leave idempotence and acks be.
    ///
    /// ```
    /// use idem_kafka::KafkaOptions;
    ///
    /// let config = KafkaOptions::new("orders")?.producer_config("127.0.0.1:9092");
    /// assert_eq!(config.get("enable.idempotence"), Some("true"));
    /// assert_eq!(config.get("acks"), Some("all"));
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn producer_config(&self, brokers: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", millis(self.timeout))
            // A topic the broker lacks is an error, never made on the fly
            // with the broker's defaults.
            .set("allow.auto.create.topics", "false")
            // A broker that is not there is said so within seconds.
            .set("socket.connection.setup.timeout.ms", "5000");
        config
    }
}

fn millis(duration: Duration) -> String {
    duration.as_millis().max(1).to_string()
}

/// Why a [`KafkaPublisher`] or a [`KafkaSource`] could not be made.
///
/// ```
/// use idem_kafka::KafkaSetupError;
///
/// let error = KafkaSetupError::Refused { setting: "enable.auto.commit", reason: "must be false".into() };
/// assert_eq!(error.to_string(), "kafka: enable.auto.commit must be false");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaSetupError {
    /// librdkafka refused the configuration (an unknown property, a bad
    /// value).
    #[error("kafka: bad configuration: {0}")]
    Config(#[source] KafkaError),
    /// A setting that would let a message be lost or dropped.
    #[error("kafka: {setting} {reason}")]
    Refused {
        /// The setting.
        setting: &'static str,
        /// What it must be.
        reason: String,
    },
}

/// Publishes outbox messages to a Kafka topic (see the [crate]
/// documentation for the key and the headers). Cloning is cheap and shares
/// the producer; any number of relays may share one.
///
/// The topic must exist (the publisher creates nothing): a record for a
/// topic the broker does not have fails at the time limit.
///
/// ```no_run
/// use idem_kafka::{KafkaOptions, KafkaPublisher};
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = KafkaPublisher::new("127.0.0.1:9092", KafkaOptions::new("orders")?)?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    options: KafkaOptions,
    /// The producer now, and how many were replaced before it.
    producer: Mutex<(u64, FutureProducer)>,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// A publisher with a producer of its own on `brokers` (a
    /// comma-separated `host:port` list), configured by
    /// [`KafkaOptions::producer_config`]. librdkafka connects in the
    /// background and reconnects by itself.
    ///
    /// ```no_run
    /// use idem_kafka::{KafkaOptions, KafkaPublisher};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let publisher = KafkaPublisher::new("kafka-1:9092,kafka-2:9092", KafkaOptions::new("orders")?)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`KafkaSetupError::Config`] when librdkafka refuses the
    /// configuration.
    pub fn new(brokers: &str, options: KafkaOptions) -> Result<Self, KafkaSetupError> {
        let config = options.producer_config(brokers);
        Self::from_config(&config, options)
    }

    /// A publisher with a producer made from `config` (start from
    /// [`KafkaOptions::producer_config`]).
    ///
    /// ```no_run
    /// use idem_kafka::{KafkaOptions, KafkaPublisher};
    ///
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let options = KafkaOptions::new("orders")?;
    /// let mut config = options.producer_config("127.0.0.1:9092");
    /// config.set("linger.ms", "20");
    /// let publisher = KafkaPublisher::from_config(&config, options)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`KafkaSetupError::Config`] when librdkafka refuses it;
    /// [`KafkaSetupError::Refused`] when it turns idempotence off or asks
    /// for fewer acks than all (a record could then be stored twice out of
    /// order, or lost with a leader).
    pub fn from_config(
        config: &ClientConfig,
        options: KafkaOptions,
    ) -> Result<Self, KafkaSetupError> {
        if config.get("enable.idempotence") != Some("true") {
            return Err(KafkaSetupError::Refused {
                setting: "enable.idempotence",
                reason: "must be true".to_string(),
            });
        }
        if !matches!(config.get("acks"), Some("all" | "-1")) {
            return Err(KafkaSetupError::Refused {
                setting: "acks",
                reason: "must be all".to_string(),
            });
        }
        let producer = config.create().map_err(KafkaSetupError::Config)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config: config.clone(),
                options,
                producer: Mutex::new((0, producer)),
            }),
        })
    }

    /// The options.
    ///
    /// ```no_run
    /// # use idem_kafka::KafkaPublisher;
    /// # fn show(publisher: &KafkaPublisher) {
    /// println!("publishing to {}", publisher.options().topic());
    /// # }
    /// ```
    pub fn options(&self) -> &KafkaOptions {
        &self.inner.options
    }

    /// The producer it publishes through now (a producer whose session
    /// the broker ended is replaced by a new one: see [`Publisher::publish`]).
    ///
    /// ```no_run
    /// use idem_kafka::rdkafka::producer::Producer;
    /// # use idem_kafka::KafkaPublisher;
    /// # fn show(publisher: &KafkaPublisher) {
    /// println!("{} records in flight", publisher.producer().in_flight_count());
    /// # }
    /// ```
    pub fn producer(&self) -> FutureProducer {
        self.current().1
    }

    fn current(&self) -> (u64, FutureProducer) {
        let current = self
            .inner
            .producer
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        (current.0, current.1.clone())
    }

    /// Replaces producer `generation` with a new one, unless another call
    /// did already (or a new one cannot be made: the next batch tries
    /// again).
    fn replace(&self, generation: u64) {
        let mut current = self
            .inner
            .producer
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if current.0 != generation {
            return;
        }
        match self.inner.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::warn!(
                    broker = BROKER,
                    "the broker ended the producer's session; publishing through a new producer"
                );
                *current = (generation + 1, fresh);
            }
            Err(error) => {
                tracing::warn!(broker = BROKER, %error, "cannot make a new producer");
            }
        }
    }

    /// Hands `message` to `producer`, waiting while its queue is full,
    /// until `deadline`.
    async fn send(
        &self,
        producer: &FutureProducer,
        message: &OutboxMessage,
        deadline: Instant,
    ) -> Result<DeliveryFuture, String> {
        let new = message.message();
        let id = message.id().to_string();
        let sequence = message.parts().sequence.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(new.headers().len() + 4);
        for (name, value) in new.headers() {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        // Last, so that a reader taking the last of a name finds these.
        for (key, value) in [
            (ID_HEADER, id.as_str()),
            (TYPE_HEADER, new.kind()),
            (AGGREGATE_HEADER, new.aggregate()),
            (SEQUENCE_HEADER, sequence.as_str()),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_bytes()),
            });
        }
        let mut record = FutureRecord::to(&self.inner.options.topic)
            .key(new.aggregate())
            .payload(new.payload())
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(delivery) => return Ok(delivery),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    if Instant::now() >= deadline {
                        return Err(
                            "the producer's queue stayed full until the time limit".to_string()
                        );
                    }
                    record = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err((error, _)) => return Err(format!("not sent: {error}")),
            }
        }
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    /// Hands the whole batch to the producer, in order, then awaits every
    /// delivery report, all within the time limit: `Ok` on a report of the
    /// record stored, `Err` otherwise.
    ///
    /// A producer whose session the broker ended (fenced, its epoch or
    /// sequence refused, a fatal error) would refuse every record from then
    /// on: after such a batch, whose refused records are errors the relay
    /// publishes again, the publisher goes on with a new producer.
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let deadline = Instant::now() + self.inner.options.timeout;
        let (generation, producer) = self.current();
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            pending.push(self.send(&producer, message, deadline).await);
        }
        let mut ended = producer.client().fatal_error().is_some();
        let mut results = Vec::with_capacity(batch.len());
        for sent in pending {
            let result = match sent {
                Err(error) => Err(error),
                Ok(report) => match timeout_at(deadline, report).await {
                    Ok(Ok(Ok(_))) => Ok(Published::stored()),
                    Ok(Ok(Err((error, _)))) => {
                        ended |= ends_the_session(&error);
                        Err(format!("not stored: {error}"))
                    }
                    Ok(Err(_)) => Err("the producer closed before its report".to_string()),
                    Err(_) => Err("no delivery report within the publish timeout".to_string()),
                },
            };
            results.push(result.map_err(|error| PublishError::new(BROKER, error)));
        }
        if ended || producer.client().fatal_error().is_some() {
            self.replace(generation);
        }
        results
    }
}

/// Whether `error` means the producer's idempotent session is over: the
/// broker will refuse every later record of it.
fn ends_the_session(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::OutOfOrderSequenceNumber
                | RDKafkaErrorCode::UnknownProducerId
                | RDKafkaErrorCode::InvalidProducerIdMapping
                | RDKafkaErrorCode::Fatal
        )
    )
}
