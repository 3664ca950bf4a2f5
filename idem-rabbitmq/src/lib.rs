//! # idem-rabbitmq
//!
//! RabbitMQ for idem's outbox: a [`RabbitPublisher`] implements
//! [`idem_outbox::Publisher`] with [lapin](https://docs.rs/lapin), so an
//! [`idem_outbox::Relay`] publishes every committed outbox message to an
//! exchange, and counts it published only once RabbitMQ confirmed it.
//!
//! - One channel in **confirm mode**; a batch is published whole, then every
//!   confirm is awaited. A message is `Ok` only on its `basic.ack`; a
//!   `basic.nack` is an `Err`.
//! - Every message is **persistent** (`delivery_mode` 2) and **mandatory**:
//!   one that no queue is bound for comes back as a `basic.return` and is an
//!   `Err`, never a silent drop.
//! - AMQP properties: `message_id` is the outbox message id (so a consumer
//!   recognises a copy the relay published twice), `type` is the message's
//!   kind, `headers` are the message's headers plus [`AGGREGATE_HEADER`]
//!   and [`SEQUENCE_HEADER`].
//! - The routing key is the kind behind an optional prefix
//!   ([`RabbitOptions::routing_key`]): with a topic exchange, bind
//!   `order.*` to receive `order.placed` and `order.paid`.
//! - A batch has a time limit ([`RabbitOptions::with_timeout`], 10 s by
//!   default): what is unconfirmed by then is an `Err`, and the relay
//!   retries it.
//!
//! The consuming side: a [`RabbitSource`] consumes a queue with manual
//! acknowledgements and a prefetch as an `idem_consumer::Source`, so an
//! `idem_consumer::Consumer` applies each message once (its inbox),
//! requeues a failure after a delay and parks it at its last delivery; it
//! reconnects when its connection is lost. [`declare`] declares the
//! exchange and a queue taking every message of it, in one call
//! ([`bound_queue`]: the queue alone, on an exchange of one's own); this
//! crate re-exports [`lapin`], so a service needs no dependency of its own
//! on it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_memory::MemoryOutbox;
//! use idem_outbox::{Relay, RelayOptions};
//! use idem_rabbitmq::{RabbitOptions, RabbitPublisher};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let options = RabbitOptions::new("events")?.with_routing_key_prefix("shop.")?;
//! let publisher = RabbitPublisher::connect("amqp://guest:guest@127.0.0.1:5672/%2f", options).await?;
//! let relay = Relay::new(Arc::new(MemoryOutbox::new()), Arc::new(publisher), RelayOptions::default());
//! relay.run(std::future::pending()).await;
//! # Ok(())
//! # }
//! ```

mod consumer;

pub use consumer::{RabbitDelivery, RabbitSource, RabbitSourceOptions};
/// The AMQP client this crate is built on, at the version it uses: its
/// connections, channels and field tables are what [`declare`] and
/// [`RabbitPublisher::new`] take.
pub use lapin;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use idem_core::InvalidInput;
use idem_core::store::OutboxMessage;
use idem_outbox::{PublishError, Published, Publisher, async_trait};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    PublisherConfirm,
};
use tokio::sync::Mutex;
use tokio::time::{Instant, timeout_at};

/// The broker's name in a [`PublishError`].
pub const BROKER: &str = "rabbitmq";

/// The AMQP header holding the message's aggregate (a long string).
pub const AGGREGATE_HEADER: &str = "idem-aggregate";

/// The AMQP header holding the message's sequence in its aggregate (a
/// signed 64-bit integer: 1, 2, 3...).
pub const SEQUENCE_HEADER: &str = "idem-sequence";

/// A batch's time limit unless [`RabbitOptions::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest exchange name, routing key or header name AMQP carries.
const MAX_SHORT_STRING: usize = 255;

/// `delivery_mode` of a message RabbitMQ writes to disk.
const PERSISTENT: u8 = 2;

/// Where and how a [`RabbitPublisher`] publishes; each setter checks its
/// value, so a publisher never starts with a bad one.
///
/// ```
/// use std::time::Duration;
/// use idem_rabbitmq::RabbitOptions;
///
/// let options = RabbitOptions::new("events")?
///     .with_routing_key_prefix("shop.")?
///     .with_timeout(Duration::from_secs(5))?;
/// assert_eq!(options.routing_key("order.placed")?, "shop.order.placed");
/// assert!(RabbitOptions::new("no spaces").is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitOptions {
    exchange: ShortString,
    routing_key_prefix: String,
    timeout: Duration,
}

impl RabbitOptions {
    /// Publishes to `exchange` (it must exist: [`RabbitPublisher::new`]
    /// checks; `""` is the default exchange, which routes to the queue named
    /// by the routing key), with no routing key prefix and a 10 s limit.
    /// Names are AMQP's: up to 255 bytes of letters, digits, `-`, `_`, `.`
    /// and `:`.
    ///
    /// ```
    /// use idem_rabbitmq::RabbitOptions;
    ///
    /// assert_eq!(RabbitOptions::new("amq.topic")?.exchange(), "amq.topic");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a name AMQP does not allow.
    pub fn new(exchange: &str) -> Result<Self, InvalidInput> {
        if exchange.len() > MAX_SHORT_STRING {
            return Err(InvalidInput::TooLong {
                field: "exchange",
                len: exchange.len(),
                max: MAX_SHORT_STRING,
            });
        }
        if !exchange
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err(InvalidInput::Malformed {
                field: "exchange",
                reason: "only letters, digits, '-', '_', '.' and ':'".into(),
            });
        }
        let exchange = ShortString::try_new(exchange).map_err(|_| InvalidInput::TooLong {
            field: "exchange",
            len: exchange.len(),
            max: MAX_SHORT_STRING,
        })?;
        Ok(Self {
            exchange,
            routing_key_prefix: String::new(),
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same with `prefix` before every routing key (at most 255 bytes,
    /// no control characters; empty for none).
    ///
    /// ```
    /// use idem_rabbitmq::RabbitOptions;
    ///
    /// let options = RabbitOptions::new("events")?.with_routing_key_prefix("billing.")?;
    /// assert_eq!(options.routing_key_prefix(), "billing.");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a longer prefix or a control character.
    pub fn with_routing_key_prefix(mut self, prefix: &str) -> Result<Self, InvalidInput> {
        if prefix.len() > MAX_SHORT_STRING {
            return Err(InvalidInput::TooLong {
                field: "routing key prefix",
                len: prefix.len(),
                max: MAX_SHORT_STRING,
            });
        }
        if let Some((position, _)) = prefix.char_indices().find(|(_, c)| c.is_control()) {
            return Err(InvalidInput::ControlCharacter {
                field: "routing key prefix",
                position,
            });
        }
        self.routing_key_prefix = prefix.to_string();
        Ok(self)
    }

    /// The same with a time limit on each batch, from its first publish to
    /// its last confirm (more than zero, at most
    /// [`MAX_PUBLISH_TIMEOUT`](idem_outbox::MAX_PUBLISH_TIMEOUT)): what is
    /// not confirmed by then is an `Err`. Keep it under the relay's lease.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_rabbitmq::RabbitOptions;
    ///
    /// let options = RabbitOptions::new("events")?.with_timeout(Duration::from_secs(3))?;
    /// assert_eq!(options.timeout(), Duration::from_secs(3));
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

    /// The exchange.
    ///
    /// ```
    /// # use idem_rabbitmq::RabbitOptions;
    /// assert_eq!(RabbitOptions::new("events")?.exchange(), "events");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn exchange(&self) -> &str {
        self.exchange.as_str()
    }

    /// The routing key prefix (empty for none).
    ///
    /// ```
    /// # use idem_rabbitmq::RabbitOptions;
    /// assert_eq!(RabbitOptions::new("events")?.routing_key_prefix(), "");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn routing_key_prefix(&self) -> &str {
        &self.routing_key_prefix
    }

    /// The time limit on a batch.
    ///
    /// ```
    /// # use idem_rabbitmq::{RabbitOptions, DEFAULT_TIMEOUT};
    /// assert_eq!(RabbitOptions::new("events")?.timeout(), DEFAULT_TIMEOUT);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The routing key of a message of `kind`: the prefix, then the kind
    /// as it is (`order.placed` with prefix `shop.` is `shop.order.placed`).
    ///
    /// ```
    /// # use idem_rabbitmq::RabbitOptions;
    /// let options = RabbitOptions::new("events")?;
    /// assert_eq!(options.routing_key("order.placed")?, "order.placed");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::TooLong`] when the two exceed AMQP's 255 bytes.
    pub fn routing_key(&self, kind: &str) -> Result<String, InvalidInput> {
        let key = format!("{}{kind}", self.routing_key_prefix);
        if key.len() > MAX_SHORT_STRING {
            return Err(InvalidInput::TooLong {
                field: "routing key",
                len: key.len(),
                max: MAX_SHORT_STRING,
            });
        }
        Ok(key)
    }
}

/// Why a [`RabbitPublisher`] could not be made.
///
/// ```
/// use idem_rabbitmq::RabbitError;
///
/// let error = RabbitError::TimedOut;
/// assert_eq!(error.to_string(), "rabbitmq: no answer within the publish timeout");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitError {
    /// The connection failed (a bad URL, a refused or failed login).
    #[error("rabbitmq: cannot connect: {0}")]
    Connect(#[source] lapin::Error),
    /// A channel could not be opened or put in confirm mode.
    #[error("rabbitmq: cannot open a confirming channel: {0}")]
    Channel(#[source] lapin::Error),
    /// The exchange does not exist (or may not be used).
    #[error("rabbitmq: exchange {exchange:?} is not usable: {source}")]
    Exchange {
        /// The exchange.
        exchange: String,
        /// What RabbitMQ said.
        #[source]
        source: lapin::Error,
    },
    /// RabbitMQ did not answer within the options' time limit.
    #[error("rabbitmq: no answer within the publish timeout")]
    TimedOut,
}

/// What became of one message of a batch on its way out.
enum Sent {
    /// Sent: its confirm is awaited.
    Confirm(PublisherConfirm),
    /// Not sent: RabbitMQ cannot carry it (a routing key too long...).
    Invalid(String),
    /// Not sent: the channel failed.
    Unsent(String),
}

/// The connection and the confirming channel in use.
struct Link {
    connection: Connection,
    channel: Option<Channel>,
}

/// Publishes outbox messages to a RabbitMQ exchange through a channel in
/// confirm mode (see the [crate] documentation for what each message
/// carries).
///
/// Any number of relays may share one publisher: batches are sent one at a
/// time on its channel (a confirm is matched to its message by the order of
/// sending) and their confirms awaited together. A channel that failed or
/// timed out is replaced by a new one on the next batch; a publisher made
/// by [`connect`](Self::connect) also opens a new connection when its own
/// closed, while one made by [`new`](Self::new) keeps the caller's (which
/// may recover by itself with lapin's `enable_auto_recover`).
///
/// ```no_run
/// use idem_rabbitmq::{RabbitOptions, RabbitPublisher};
/// use lapin::{Connection, ConnectionProperties};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
/// let publisher = RabbitPublisher::new(connection, RabbitOptions::new("events")?).await?;
/// # Ok(())
/// # }
/// ```
pub struct RabbitPublisher {
    link: Mutex<Link>,
    /// Set when the publisher opened the connection, and may open another.
    url: Option<String>,
    options: RabbitOptions,
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("options", &self.options)
            .field("reconnects", &self.url.is_some())
            .finish_non_exhaustive()
    }
}

impl RabbitPublisher {
    /// A publisher on `connection`: opens a channel in confirm mode and
    /// checks that the exchange exists (a passive declare), within the
    /// options' time limit.
    ///
    /// ```no_run
    /// use idem_rabbitmq::{RabbitOptions, RabbitPublisher};
    /// use lapin::{Connection, ConnectionProperties};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
    /// let publisher = RabbitPublisher::new(connection, RabbitOptions::new("amq.topic")?).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`RabbitError::Channel`], [`RabbitError::Exchange`] (the exchange is
    /// missing), [`RabbitError::TimedOut`].
    pub async fn new(connection: Connection, options: RabbitOptions) -> Result<Self, RabbitError> {
        Self::start(connection, None, options).await
    }

    /// A publisher on a connection of its own to `url`
    /// (`amqp://user:password@host:5672/%2f`, or `amqps://` for TLS), which
    /// it opens again whenever it closed; otherwise as [`new`](Self::new).
    ///
    /// ```no_run
    /// use idem_rabbitmq::{RabbitOptions, RabbitPublisher};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let publisher = RabbitPublisher::connect(
    ///     "amqp://guest:guest@127.0.0.1:5672/%2f",
    ///     RabbitOptions::new("events")?,
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`RabbitError::Connect`], and those of [`new`](Self::new).
    pub async fn connect(url: &str, options: RabbitOptions) -> Result<Self, RabbitError> {
        let deadline = Instant::now() + options.timeout;
        let connection = timeout_at(deadline, open_connection(url))
            .await
            .map_err(|_| RabbitError::TimedOut)?
            .map_err(RabbitError::Connect)?;
        Self::start(connection, Some(url.to_string()), options).await
    }

    async fn start(
        connection: Connection,
        url: Option<String>,
        options: RabbitOptions,
    ) -> Result<Self, RabbitError> {
        let deadline = Instant::now() + options.timeout;
        let channel = timeout_at(deadline, async {
            let channel = open_channel(&connection)
                .await
                .map_err(RabbitError::Channel)?;
            if !options.exchange.as_str().is_empty() {
                channel
                    .exchange_declare(
                        options.exchange.clone(),
                        ExchangeKind::Topic,
                        ExchangeDeclareOptions {
                            passive: true,
                            ..ExchangeDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|source| RabbitError::Exchange {
                        exchange: options.exchange.to_string(),
                        source,
                    })?;
            }
            Ok(channel)
        })
        .await
        .map_err(|_| RabbitError::TimedOut)??;
        Ok(Self {
            link: Mutex::new(Link {
                connection,
                channel: Some(channel),
            }),
            url,
            options,
        })
    }

    /// The options.
    ///
    /// ```no_run
    /// # use idem_rabbitmq::{RabbitOptions, RabbitPublisher};
    /// # async fn run(publisher: RabbitPublisher) {
    /// println!("publishing to {}", publisher.options().exchange());
    /// # }
    /// ```
    pub fn options(&self) -> &RabbitOptions {
        &self.options
    }

    /// The channel to publish on: the current one while it is open, else a
    /// new one (on a new connection, where the publisher owns it and it
    /// closed).
    async fn channel(&self, link: &mut Link) -> Result<Channel, String> {
        if let Some(channel) = &link.channel
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        link.channel = None;
        if !link.connection.status().connected() {
            let Some(url) = &self.url else {
                return Err("the connection is closed (or still recovering)".to_string());
            };
            link.connection = open_connection(url)
                .await
                .map_err(|e| format!("cannot reconnect: {e}"))?;
        }
        let channel = open_channel(&link.connection)
            .await
            .map_err(|e| format!("cannot open a confirming channel: {e}"))?;
        link.channel = Some(channel.clone());
        Ok(channel)
    }

    /// Forgets `channel` (it failed or timed out), so the next batch opens
    /// another; it closes once no batch holds it.
    async fn discard(&self, channel: &Channel) {
        let mut link = self.link.lock().await;
        if link
            .channel
            .as_ref()
            .is_some_and(|c| c.id() == channel.id())
        {
            link.channel = None;
        }
    }

    /// Sends every message of `batch`, in order, on one channel, holding the
    /// link so that no other batch's messages interleave: one answer per
    /// message, the confirm to await or why it was not sent.
    async fn send(&self, batch: &[OutboxMessage]) -> Result<(Channel, Vec<Sent>), String> {
        let mut link = self.link.lock().await;
        let channel = self.channel(&mut link).await?;
        let mut sent = Vec::with_capacity(batch.len());
        for message in batch {
            let (routing_key, properties) = match self.envelope(message) {
                Ok(envelope) => envelope,
                Err(error) => {
                    sent.push(Sent::Invalid(error));
                    continue;
                }
            };
            let publish = channel
                .basic_publish(
                    self.options.exchange.clone(),
                    routing_key,
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    message.message().payload(),
                    properties,
                )
                .await;
            match publish {
                Ok(confirm) => sent.push(Sent::Confirm(confirm)),
                Err(error) => {
                    // The channel is gone: nothing after this is sent.
                    let error = format!("publish failed: {error}");
                    sent.resize_with(batch.len(), || Sent::Unsent(error.clone()));
                    break;
                }
            }
        }
        Ok((channel, sent))
    }

    /// The routing key and the properties of `message`.
    fn envelope(&self, message: &OutboxMessage) -> Result<(ShortString, BasicProperties), String> {
        let new = message.message();
        let routing_key = self
            .options
            .routing_key(new.kind())
            .map_err(|e| e.to_string())?;
        let mut headers: BTreeMap<ShortString, AMQPValue> = BTreeMap::new();
        for (name, value) in new.headers() {
            let name = short(name)?;
            let value = AMQPValue::LongString(LongString::from(value.as_bytes()));
            // A name given twice keeps every value, as an array, in order.
            match headers.remove(&name) {
                None => headers.insert(name, value),
                Some(AMQPValue::FieldArray(mut values)) => {
                    values.push(value);
                    headers.insert(name, AMQPValue::FieldArray(values))
                }
                Some(first) => headers.insert(
                    name,
                    AMQPValue::FieldArray(FieldArray::from(vec![first, value])),
                ),
            };
        }
        let sequence = i64::try_from(message.parts().sequence)
            .map_err(|_| "the sequence exceeds an AMQP long-long integer".to_string())?;
        headers.insert(
            short(AGGREGATE_HEADER)?,
            AMQPValue::LongString(LongString::from(new.aggregate().as_bytes())),
        );
        headers.insert(short(SEQUENCE_HEADER)?, AMQPValue::LongLongInt(sequence));
        let properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_message_id(short(&message.id().to_string())?)
            .with_type(short(new.kind())?)
            .with_headers(FieldTable::from(headers));
        Ok((short(&routing_key)?, properties))
    }
}

#[async_trait]
impl Publisher for RabbitPublisher {
    /// Publishes the whole batch, then awaits every confirm, all within the
    /// time limit: `Ok` on an ack; `Err` on a nack, a return (unroutable),
    /// a failed channel or the time limit.
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let deadline = Instant::now() + self.options.timeout;
        let failed = |error: &str| PublishError::new(BROKER, error);
        let (channel, sent) = match timeout_at(deadline, self.send(batch)).await {
            Ok(Ok(sent)) => sent,
            Ok(Err(error)) => return batch.iter().map(|_| Err(failed(&error))).collect(),
            Err(_) => {
                let mut link = self.link.lock().await;
                // A channel that could not take the batch in time is not
                // trusted with the next one.
                link.channel = None;
                return batch
                    .iter()
                    .map(|_| Err(failed("not sent within the publish timeout")))
                    .collect();
            }
        };
        let mut results = Vec::with_capacity(batch.len());
        let mut broken = false;
        for confirm in sent {
            let result = match confirm {
                Sent::Invalid(error) => Err(failed(&error)),
                Sent::Unsent(error) => {
                    broken = true;
                    Err(failed(&error))
                }
                Sent::Confirm(confirm) => match timeout_at(deadline, confirm).await {
                    Ok(Ok(Confirmation::Ack(None))) => Ok(Published::stored()),
                    Ok(Ok(Confirmation::Ack(Some(returned)))) => Err(failed(&format!(
                        "returned unroutable by exchange {:?} for routing key {:?}: {} {}",
                        self.options.exchange,
                        returned.delivery.routing_key.as_str(),
                        returned.reply_code,
                        returned.reply_text.as_str(),
                    ))),
                    Ok(Ok(Confirmation::Nack(_))) => {
                        Err(failed("nacked: the broker could not store it"))
                    }
                    Ok(Ok(Confirmation::NotRequested)) => {
                        broken = true;
                        Err(failed("not confirmed: the channel is not in confirm mode"))
                    }
                    Ok(Err(error)) => {
                        broken = true;
                        Err(failed(&format!("no confirm: {error}")))
                    }
                    Err(_) => {
                        broken = true;
                        Err(failed("not confirmed within the publish timeout"))
                    }
                },
            };
            results.push(result);
        }
        if broken {
            self.discard(&channel).await;
        }
        results
    }
}

/// Declares all that a [`RabbitPublisher`] to `exchange` and a
/// [`RabbitSource`] on `queue` need, in one call: the durable topic
/// exchange `exchange`, then the durable queue `queue` bound to every
/// routing key of it ([`bound_queue`], with `arguments`). Declaring them
/// again as before changes nothing, so a service calls it at every start.
///
/// ```no_run
/// use idem_rabbitmq::lapin::types::FieldTable;
/// use idem_rabbitmq::lapin::{Connection, ConnectionProperties};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
/// let channel = connection.create_channel().await?;
/// idem_rabbitmq::declare(&channel, "events", "shipping.orders", FieldTable::default()).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// What the broker answers: an exchange declared before as another kind or
/// with other options, a queue declared before with other arguments.
pub async fn declare(
    channel: &Channel,
    exchange: &str,
    queue: &str,
    arguments: FieldTable,
) -> Result<(), lapin::Error> {
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    bound_queue(channel, exchange, queue, arguments).await
}

/// Declares the durable queue `queue` (with `arguments`: a quorum queue's
/// `x-queue-type`, an `x-expires`...) and binds it to every routing key of
/// the topic exchange `exchange`: where a [`RabbitPublisher`] to that
/// exchange delivers, for a [`RabbitSource`] to consume. Declaring it again
/// with the same arguments changes nothing.
///
/// ```no_run
/// use lapin::types::{AMQPValue, FieldTable};
/// use lapin::{Connection, ConnectionProperties};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
/// let channel = connection.create_channel().await?;
/// let mut quorum = FieldTable::default();
/// quorum.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
/// idem_rabbitmq::bound_queue(&channel, "events", "shipping.orders", quorum).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// What the broker answers: a queue declared before with other arguments,
/// a missing exchange.
pub async fn bound_queue(
    channel: &Channel,
    exchange: &str,
    queue: &str,
    arguments: FieldTable,
) -> Result<(), lapin::Error> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}

/// A connection to `url` on the ambient tokio runtime.
async fn open_connection(url: &str) -> Result<Connection, lapin::Error> {
    Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name("idem-outbox".into()),
    )
    .await
}

/// A new channel of `connection`, in confirm mode.
async fn open_channel(connection: &Connection) -> Result<Channel, lapin::Error> {
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}

/// `value` as an AMQP short string (at most 255 bytes).
fn short(value: &str) -> Result<ShortString, String> {
    ShortString::try_new(value).map_err(|e| e.to_string())
}
