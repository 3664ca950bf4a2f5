//! The consuming side: a queue consumed with manual acks and a prefetch as
//! an `idem_consumer::Source`, each delivery an `idem_consumer::Delivery`.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use idem_consumer::{BrokerError, Delivery, RawMessage, RedeliveryHorizon, Source, async_trait};
use idem_core::InvalidInput;
use idem_core::store::{InboundMessage, Timestamp};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, Consumer};

use crate::{AGGREGATE_HEADER, BROKER, SEQUENCE_HEADER};

/// The header a quorum queue counts a message's earlier deliveries in.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// How long one exchange with the broker (a connection, a channel and its
/// consume, an ack, a requeue, a close) may take: a broker or a network
/// that accepts and then says nothing is given up on, with a retryable
/// error, rather than waited for forever.
const TIMEOUT: Duration = Duration::from_secs(10);

/// `work`, given up on after [`TIMEOUT`].
async fn bounded<T>(
    operation: &'static str,
    work: impl Future<Output = Result<T, BrokerError>>,
) -> Result<T, BrokerError> {
    idem_consumer::bounded(BROKER, operation, TIMEOUT, work).await
}

/// One lapin call, [`bounded`], its error named `operation`.
async fn call<T>(
    operation: &'static str,
    work: impl Future<Output = Result<T, lapin::Error>>,
) -> Result<T, BrokerError> {
    bounded(operation, async { work.await.map_err(failed(operation)) }).await
}

/// How a [`RabbitSource`] consumes; each setter checks its value.
///
/// ```
/// use std::time::Duration;
/// use idem_rabbitmq::RabbitSourceOptions;
///
/// let options = RabbitSourceOptions::new("billing.orders")?
///     .with_prefetch(32)?
///     .with_ack_timeout(Duration::from_secs(1800));
/// assert_eq!(options.queue(), "billing.orders");
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitSourceOptions {
    queue: String,
    prefetch: u16,
    ack_timeout: Duration,
}

impl RabbitSourceOptions {
    /// RabbitMQ's default delivery acknowledgement timeout
    /// (`consumer_timeout`): 30 minutes.
    pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30 * 60);

    /// Consumes `queue`, 16 unacknowledged deliveries at once. The queue
    /// must deliver without limit: a quorum queue's `x-delivery-limit`
    /// (RabbitMQ 4 sets 20 unless the queue is declared with -1) drops or
    /// dead-letters a message counting deliveries no consumer settled, so
    /// declare it `-1` on RabbitMQ 4 and leave it unset before; the
    /// consumer parks a failing message at its own count. (The limit is
    /// not readable over AMQP, so it is not checked at start.)
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for an empty queue name or one over 255 bytes.
    pub fn new(queue: &str) -> Result<Self, InvalidInput> {
        if queue.is_empty() {
            return Err(InvalidInput::Empty { field: "queue" });
        }
        if queue.len() > crate::MAX_SHORT_STRING {
            return Err(InvalidInput::TooLong {
                field: "queue",
                len: queue.len(),
                max: crate::MAX_SHORT_STRING,
            });
        }
        Ok(Self {
            queue: queue.to_string(),
            prefetch: 16,
            ack_timeout: Self::DEFAULT_ACK_TIMEOUT,
        })
    }

    /// The most unacknowledged deliveries at once (`basic.qos`, 1 or more).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for 0.
    pub fn with_prefetch(mut self, prefetch: u16) -> Result<Self, InvalidInput> {
        if prefetch == 0 {
            return Err(InvalidInput::OutOfRange {
                field: "prefetch",
                reason: "must be at least 1",
            });
        }
        self.prefetch = prefetch;
        Ok(self)
    }

    /// The broker's delivery acknowledgement timeout, if set otherwise
    /// than RabbitMQ's default (its `consumer_timeout`): how long a
    /// delivery may stay unsettled, part of the redelivery horizon.
    #[must_use]
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// The queue.
    pub fn queue(&self) -> &str {
        &self.queue
    }
}

/// The delivery tags of one channel not settled yet: a `multiple` ack
/// settles every one up to its tag, so it is sent only when all those
/// below are the batch's own.
type Unsettled = Arc<Mutex<BTreeSet<u64>>>;

/// A RabbitMQ queue consumed with manual acknowledgements and a prefetch,
/// as a source of deliveries for an `idem_consumer::Consumer`.
///
/// - The message id is the AMQP `message_id` (the outbox message id when
///   `idem-outbox` published it); the type is the AMQP `type`, else the
///   routing key; the aggregate and its version are [`AGGREGATE_HEADER`]
///   and [`SEQUENCE_HEADER`]; string headers travel as headers.
/// - An ack is `basic.ack`; a retry is a `basic.nack` with requeue after
///   the delay (the delivery keeps its prefetch slot meanwhile; should the
///   process die, the broker delivers it again at once).
/// - The delivery count is a quorum queue's `x-delivery-count` plus one;
///   on a classic queue, which counts nothing, 2 for a redelivery. It is
///   for traces only: the consumer parks a failing message at its own
///   count.
/// - The horizon is the options' acknowledgement timeout, with no limit
///   on deliveries (see [`RabbitSourceOptions::new`]).
/// - A delivery without a `message_id`, or that cannot be an inbound
///   message, is handed to the consumer as what could be kept of it, with
///   the reason (`idem_consumer::Delivery::malformed`): the consumer parks
///   it at once (without a `message_id`, under an id derived from its type
///   and payload), and the broker never drops it.
/// - A source made by [`connect`](Self::connect) survives a lost
///   connection: the [`next`](Source::next) after the loss opens a new one
///   (a new channel where only the channel was lost) and consumes again;
///   while the broker cannot be reached, each call makes one attempt (of
///   at most 10 s) and answers a retryable [`BrokerError`], so the caller's
///   back-off paces the attempts ([`Consumer::run`](idem_consumer::Consumer::run)
///   asks again after its own). The broker delivers the lost connection's
///   unsettled messages again (their acks fail: the inbox makes the copies
///   duplicates). One made by [`new`](Self::new) on the caller's
///   connection answers the loss with an error.
/// - No exchange with the broker waits forever: connecting, an ack, a
///   requeue and the close each have 10 s, then answer a
///   retryable [`BrokerError`] (an ack that timed out may have reached
///   the broker or not: a redelivery is a duplicate to the inbox).
///
/// ```no_run
/// use idem_rabbitmq::{RabbitSource, RabbitSourceOptions};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let options = RabbitSourceOptions::new("billing.orders")?;
/// let source = RabbitSource::connect("amqp://guest:guest@127.0.0.1:5672/%2f", options).await?;
/// println!("{:?}", idem_consumer::Source::horizon(&source));
/// # Ok(()) }
/// ```
pub struct RabbitSource {
    connection: Connection,
    link: Link,
    /// Set when the source opened the connection, and may open another.
    url: Option<String>,
    /// The link was lost: the next receive consumes again first.
    lost: bool,
    options: RabbitSourceOptions,
}

/// The channel and the consumer in use.
struct Link {
    channel: Channel,
    consumer: Consumer,
    unsettled: Unsettled,
}

impl Link {
    /// Consumes `options`' queue on a new channel of `connection`, with the
    /// prefetch.
    async fn open(
        connection: &Connection,
        options: &RabbitSourceOptions,
    ) -> Result<Self, BrokerError> {
        let setup = failed("setup");
        let channel = connection.create_channel().await.map_err(&setup)?;
        channel
            .basic_qos(options.prefetch, BasicQosOptions::default())
            .await
            .map_err(&setup)?;
        let consumer = channel
            .basic_consume(
                options.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(&setup)?;
        Ok(Self {
            channel,
            consumer,
            unsettled: Unsettled::default(),
        })
    }
}

impl fmt::Debug for RabbitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSource")
            .field("options", &self.options)
            .field("reconnects", &self.url.is_some())
            .finish_non_exhaustive()
    }
}

fn failed(operation: &'static str) -> impl Fn(lapin::Error) -> BrokerError {
    move |error| BrokerError::unavailable(BROKER, operation, error.to_string()).with_source(error)
}

impl RabbitSource {
    /// Consumes on a connection of its own to `url`.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the broker cannot be reached or the queue
    /// cannot be consumed.
    pub async fn connect(url: &str, options: RabbitSourceOptions) -> Result<Self, BrokerError> {
        let (connection, link) = bounded("connect", async {
            let connection = open_connection(url).await?;
            let link = Link::open(&connection, &options).await?;
            Ok((connection, link))
        })
        .await?;
        Ok(Self {
            connection,
            link,
            url: Some(url.to_string()),
            lost: false,
            options,
        })
    }

    /// Consumes on `connection` (its own channel, with the prefetch).
    ///
    /// # Errors
    ///
    /// [`BrokerError`] when the queue cannot be consumed.
    pub async fn new(
        connection: Connection,
        options: RabbitSourceOptions,
    ) -> Result<Self, BrokerError> {
        let link = bounded("setup", Link::open(&connection, &options)).await?;
        Ok(Self {
            connection,
            link,
            url: None,
            lost: false,
            options,
        })
    }

    /// Closes the connection: unsettled deliveries go back to the queue.
    ///
    /// # Errors
    ///
    /// [`BrokerError`] from the close.
    pub async fn close(self) -> Result<(), BrokerError> {
        call("close", self.connection.close(200, "closed".into())).await
    }

    /// Consumes again on a new channel, and a new connection to `url` if
    /// the old one is gone: one attempt, bounded by [`TIMEOUT`].
    ///
    /// # Errors
    ///
    /// A retryable [`BrokerError`] while the broker cannot be reached; a
    /// rejection when it answers and refuses the queue.
    async fn reconnect(&mut self, url: &str) -> Result<(), BrokerError> {
        let reopen = async {
            match self.reopen(url).await {
                Ok(()) => Ok(()),
                Err(Reopen::Refused(mut error)) => {
                    // Not the network's doing: asking again will not help.
                    error.retryable = false;
                    Err(error)
                }
                Err(Reopen::Unreachable(error)) => Err(error),
            }
        };
        bounded("connect", reopen).await
    }

    /// [`reconnect`](Self::reconnect)'s attempt, without its time limit.
    async fn reopen(&mut self, url: &str) -> Result<(), Reopen> {
        if !self.connection.status().connected() {
            // Kept at once: an attempt cut short by its time limit leaves
            // the next one a connection to try a channel on.
            self.connection = open_connection(url).await.map_err(Reopen::Unreachable)?;
        }
        match Link::open(&self.connection, &self.options).await {
            Ok(link) => {
                let old = std::mem::replace(&mut self.link, link);
                // A channel that failed on a live connection is closed, so
                // its unsettled deliveries go back to the queue.
                if old.channel.status().connected() {
                    let _ = old.channel.close(200, "replaced".into()).await;
                }
                Ok(())
            }
            // Connected, and the queue cannot be consumed: not the
            // network's doing, so the caller hears of it.
            Err(error) if self.connection.status().connected() => Err(Reopen::Refused(error)),
            Err(error) => Err(Reopen::Unreachable(error)),
        }
    }
}

/// Why a reconnection failed.
enum Reopen {
    /// The broker is not reachable (yet): try again.
    Unreachable(BrokerError),
    /// The broker answered, and refused to consume the queue.
    Refused(BrokerError),
}

/// A connection to `url` named for the consumer.
async fn open_connection(url: &str) -> Result<Connection, BrokerError> {
    lapin::Connection::connect(
        url,
        lapin::ConnectionProperties::default().with_connection_name("idem-consumer".into()),
    )
    .await
    .map_err(failed("connect"))
}

/// One RabbitMQ delivery.
pub struct RabbitDelivery {
    delivery: AmqpDelivery,
    inbound: InboundMessage,
    /// Why it cannot be applied, if it could not be read.
    malformed: Option<String>,
    deliveries: u32,
    unsettled: Unsettled,
}

impl fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("message", &self.inbound)
            .field("deliveries", &self.deliveries)
            .finish_non_exhaustive()
    }
}

fn locked<T>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn number(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u64::try_from(*n).ok(),
        AMQPValue::LongUInt(n) => Some(u64::from(*n)),
        AMQPValue::ShortInt(n) => u64::try_from(*n).ok(),
        AMQPValue::ShortUInt(n) => Some(u64::from(*n)),
        _ => text(value).and_then(|t| t.parse().ok()),
    }
}

/// A header's value as text, a number in decimal.
fn shown(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        other => text(other).unwrap_or_else(|| format!("{other:?}")),
    }
}

/// The delivery as the consumer reads it: whole, or why it cannot be and
/// what of it can be kept.
fn inbound(delivery: &AmqpDelivery) -> (InboundMessage, Option<String>) {
    let properties = &delivery.properties;
    let id = properties.message_id().as_ref().map(|id| id.as_str());
    let kind = match properties.kind() {
        Some(kind) => kind.as_str(),
        None => delivery.routing_key.as_str(),
    };
    let mut raw = RawMessage::new(id, kind, delivery.data.clone());
    let headers = properties.headers().as_ref().map(FieldTable::inner);
    let Some(headers) = headers else {
        return raw.read_or_salvage();
    };
    if let Some(aggregate) = headers.get(AGGREGATE_HEADER).and_then(text) {
        let version = headers.get(SEQUENCE_HEADER).map(shown);
        raw = raw.with_aggregate(&aggregate, version.as_deref());
    }
    for (name, value) in headers {
        let name = name.as_str();
        if [AGGREGATE_HEADER, SEQUENCE_HEADER, DELIVERY_COUNT_HEADER].contains(&name) {
            continue;
        }
        let values = match value {
            AMQPValue::FieldArray(values) => values.as_slice().iter().filter_map(text).collect(),
            other => text(other).into_iter().collect::<Vec<_>>(),
        };
        for value in values {
            raw = raw.with_header(name, &value);
        }
    }
    raw.read_or_salvage()
}

impl RabbitDelivery {
    fn new(delivery: AmqpDelivery, unsettled: &Unsettled) -> Self {
        let (inbound, malformed) = inbound(&delivery);
        locked(unsettled).insert(delivery.delivery_tag);
        let counted = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(DELIVERY_COUNT_HEADER).and_then(number));
        let deliveries = match counted {
            Some(earlier) => u32::try_from(earlier).unwrap_or(u32::MAX).saturating_add(1),
            None if delivery.redelivered => 2,
            None => 1,
        };
        Self {
            delivery,
            inbound,
            malformed,
            deliveries,
            unsettled: unsettled.clone(),
        }
    }

    /// The delivery is settled: forgotten by the channel's unsettled tags.
    fn settled(&self) {
        locked(&self.unsettled).remove(&self.delivery.delivery_tag);
    }

    /// Acknowledges `batch`, deliveries of one channel: the run of them
    /// that holds that channel's lowest unsettled tags with one `multiple`
    /// ack, the others one by one.
    async fn ack_on_channel(mut batch: Vec<&Self>) -> Result<(), BrokerError> {
        batch.sort_by_key(|delivery| delivery.delivery.delivery_tag);
        let run = match batch.first() {
            Some(first) => {
                let mut unsettled = locked(&first.unsettled);
                let run = unsettled
                    .iter()
                    .zip(&batch)
                    .take_while(|(tag, delivery)| **tag == delivery.delivery.delivery_tag)
                    .count();
                if run >= 2 {
                    // Taken out now, so no other batch counts them below its own.
                    for delivery in &batch[..run] {
                        unsettled.remove(&delivery.delivery.delivery_tag);
                    }
                }
                run
            }
            None => 0,
        };
        let mut first_error = None;
        let singles = if run >= 2 {
            let last = &batch[run - 1];
            let multiple = BasicAckOptions { multiple: true };
            match call("ack", last.delivery.acker.ack(multiple)).await {
                Ok(_) => {
                    for delivery in &batch[..run] {
                        delivery.settled();
                    }
                }
                Err(error) => {
                    first_error = Some(error);
                }
            }
            &batch[run..]
        } else {
            &batch[..]
        };
        for delivery in singles {
            if let Err(error) = delivery.ack().await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[async_trait]
impl Delivery for RabbitDelivery {
    fn message(&self) -> &InboundMessage {
        &self.inbound
    }

    fn deliveries(&self) -> u32 {
        self.deliveries
    }

    fn malformed(&self) -> Option<&str> {
        self.malformed.as_deref()
    }

    fn published_at(&self) -> Option<Timestamp> {
        let seconds = (*self.delivery.properties.timestamp())?;
        let millis = i64::try_from(seconds).ok()?.checked_mul(1000)?;
        Some(Timestamp::from_unix_millis(millis))
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        call("ack", self.delivery.acker.ack(BasicAckOptions::default())).await?;
        self.settled();
        Ok(())
    }

    /// One `multiple` ack for the batch's deliveries that hold their
    /// channel's lowest unsettled tags (contiguous, none of another batch
    /// among or below them); the others one by one.
    async fn ack_all(batch: &[&Self]) -> Result<(), BrokerError> {
        let mut rest: Vec<&Self> = batch.to_vec();
        let mut first_error = None;
        // A batch may straddle a reconnect: tags count per channel.
        while let Some(first) = rest.first() {
            let channel = Arc::clone(&first.unsettled);
            let (ours, others): (Vec<&Self>, Vec<&Self>) = rest
                .into_iter()
                .partition(|delivery| Arc::ptr_eq(&delivery.unsettled, &channel));
            rest = others;
            if let Err(error) = Self::ack_on_channel(ours).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        let acker = self.delivery.acker.clone();
        let requeue = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        let (unsettled, tag) = (Arc::clone(&self.unsettled), self.delivery.delivery_tag);
        if delay.is_zero() {
            call("retry", acker.nack(requeue)).await?;
            locked(&unsettled).remove(&tag);
            return Ok(());
        }
        // RabbitMQ has no delayed requeue: hold the delivery (its tag
        // unsettled), then requeue.
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            match call("retry", acker.nack(requeue)).await {
                Ok(_) => {
                    locked(&unsettled).remove(&tag);
                }
                Err(error) => {
                    tracing::warn!(%error, "could not requeue a delivery; the broker redelivers it when the channel closes");
                }
            }
        });
        Ok(())
    }
}

#[async_trait]
impl Source for RabbitSource {
    type Delivery = RabbitDelivery;

    async fn next(&mut self) -> Result<Option<RabbitDelivery>, BrokerError> {
        loop {
            if self.lost
                && let Some(url) = self.url.clone()
            {
                self.reconnect(&url).await?;
                self.lost = false;
            }
            let next = self.link.consumer.next().await;
            // A consumer ends without an error when the broker cancels it
            // (its queue deleted); with its channel, when that is lost.
            let lost = match &next {
                Some(Err(_)) => true,
                None => !self.link.channel.status().connected(),
                Some(Ok(_)) => false,
            };
            if lost && self.url.is_some() {
                if let Some(Err(error)) = &next {
                    tracing::warn!(%error, "lost the RabbitMQ consumer; reconnecting");
                }
                self.lost = true;
                continue;
            }
            let Some(next) = next else {
                return Ok(None);
            };
            let delivery = next.map_err(failed("receive"))?;
            return Ok(Some(RabbitDelivery::new(delivery, &self.link.unsettled)));
        }
    }

    fn horizon(&self) -> RedeliveryHorizon {
        RedeliveryHorizon::new(BROKER, self.options.ack_timeout)
    }
}
