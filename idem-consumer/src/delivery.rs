//! What a broker adapter implements: a delivery to acknowledge or
//! redeliver, a source of deliveries, and the figures of its redelivery.

use std::time::Duration;

use idem_core::async_trait;
use idem_core::store::{InboundMessage, Timestamp};

/// A broker operation that failed: the adapter's name, the operation, and
/// whether trying again may help.
///
/// ```
/// use idem_consumer::BrokerError;
///
/// let err = BrokerError::unavailable("nats", "ack", "connection closed");
/// assert!(err.is_retryable());
/// assert_eq!(err.to_string(), "nats ack: connection closed");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{broker} {operation}: {message}")]
#[non_exhaustive]
pub struct BrokerError {
    /// The broker (`"rabbitmq"`, `"nats"`, ...).
    pub broker: &'static str,
    /// What was asked of it (`"ack"`, `"retry"`, `"receive"`, ...).
    pub operation: &'static str,
    /// What happened.
    pub message: String,
    /// Whether the same call may succeed later.
    pub retryable: bool,
    /// The driver's error, where there is one.
    #[source]
    pub source: Option<idem_core::BoxError>,
}

impl BrokerError {
    /// A retryable failure (a lost connection, a timeout).
    pub fn unavailable(
        broker: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            broker,
            operation,
            message: message.into(),
            retryable: true,
            source: None,
        }
    }

    /// A failure retrying will not fix (a malformed delivery, a refusal).
    pub fn rejected(
        broker: &'static str,
        operation: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            retryable: false,
            ..Self::unavailable(broker, operation, message)
        }
    }

    /// The same with the driver's error as its source.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<idem_core::BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The same failure for another delivery of one batch (its source,
    /// which is not cloneable, stays with the first).
    pub(crate) fn copied(&self) -> Self {
        Self {
            broker: self.broker,
            operation: self.operation,
            message: self.message.clone(),
            retryable: self.retryable,
            source: None,
        }
    }
}

/// `work`, or a retryable [`BrokerError`] of `broker` naming `operation`
/// if it has not ended within `limit`: how an adapter keeps each call to
/// its broker from waiting forever on a network that accepts and then says
/// nothing. A call given up on may still have reached the broker (an ack
/// among them); the inbox makes its redelivery a duplicate.
///
/// ```
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let never = std::future::pending::<Result<(), idem_consumer::BrokerError>>();
/// let error = idem_consumer::bounded("nats", "ack", Duration::from_millis(10), never)
///     .await
///     .unwrap_err();
/// assert!(error.is_retryable());
/// assert_eq!(error.to_string(), "nats ack: no answer within 10ms");
/// # });
/// ```
pub async fn bounded<T>(
    broker: &'static str,
    operation: &'static str,
    limit: Duration,
    work: impl Future<Output = Result<T, BrokerError>>,
) -> Result<T, BrokerError> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(BrokerError::unavailable(
            broker,
            operation,
            format!("no answer within {limit:?}"),
        ))
    })
}

/// One delivery of a message by a broker, to settle exactly once: an
/// acknowledgement (the broker forgets it) or a redelivery after a delay.
/// A delivery never settled (the consumer died) is redelivered by the
/// broker on its own: after its ack wait, or when the connection closes.
/// Each call ends on its own, over a stalled network too: [`bounded`]
/// gives a broker call its time limit.
#[async_trait]
pub trait Delivery: Send + Sync {
    /// The message.
    fn message(&self) -> &InboundMessage;

    /// How many times the broker has delivered it, this one included (1 for
    /// the first), as far as the broker counts.
    fn deliveries(&self) -> u32;

    /// When the message entered the broker, where it says: the consumer's
    /// lag is measured from it.
    fn published_at(&self) -> Option<Timestamp>;

    /// Acknowledges it: the broker deletes it.
    async fn ack(&self) -> Result<(), BrokerError>;

    /// Asks for it again after `delay` (RabbitMQ: a requeue after the
    /// delay; JetStream: a NAK with that delay).
    async fn retry(&self, delay: Duration) -> Result<(), BrokerError>;

    /// Why the broker's message cannot be applied, when it could not be
    /// read as an inbound message ([`RawMessage::read`](crate::RawMessage::read)):
    /// [`message`](Self::message) is then what could be kept of it, and
    /// the consumer parks it at once with this reason, never calling a
    /// handler. `None` (the default) for a message read whole.
    fn malformed(&self) -> Option<&str> {
        None
    }

    /// Tells the broker that the delivery is still held, unsettled, so its
    /// ack wait starts again and no copy of it is sent meanwhile
    /// (JetStream: `+WPI`). [`Consumer::run`](crate::Consumer::run) calls
    /// it every third of the source's ack wait for each delivery it holds
    /// before its settlement (waiting behind its aggregate, gathered, or
    /// being attempted). By default nothing is sent: a broker whose ack
    /// wait is long (RabbitMQ's 30 minutes) needs nothing.
    async fn in_progress(&self) -> Result<(), BrokerError> {
        Ok(())
    }

    /// Acknowledges every delivery of `batch` (of one source, in the order
    /// it delivered them), after their batch committed: by default one
    /// [`ack`](Self::ack) after another, every one tried. An adapter
    /// acknowledges them together where its broker can (RabbitMQ: one
    /// `multiple` ack per run of contiguous delivery tags; JetStream: the
    /// acks sent at once and their replies awaited together).
    ///
    /// # Errors
    ///
    /// The first failure; the broker delivers again what it never saw
    /// acknowledged, and the inbox makes that a duplicate.
    async fn ack_all(batch: &[&Self]) -> Result<(), BrokerError>
    where
        Self: Sized,
    {
        let mut first = None;
        for delivery in batch {
            if let Err(error) = delivery.ack().await {
                first.get_or_insert(error);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// A broker's deliveries for one consumer, in the order the broker gives
/// them, and the figures of its redelivery.
#[async_trait]
pub trait Source: Send {
    /// The delivery type.
    type Delivery: Delivery + 'static;

    /// The next delivery, waiting for one; `None` once the source is closed.
    async fn next(&mut self) -> Result<Option<Self::Delivery>, BrokerError>;

    /// How long after a message's first delivery the broker may deliver
    /// it again.
    fn horizon(&self) -> RedeliveryHorizon;
}

/// The figures that bound how long after its first delivery a broker may
/// deliver a message again, which the inbox's retention must outlast (a
/// record deleted earlier makes an old redelivery new again).
///
/// ```
/// use std::time::Duration;
/// use idem_consumer::RedeliveryHorizon;
///
/// let jetstream = RedeliveryHorizon::new("nats", Duration::from_secs(30))
///     .with_duplicate_window(Duration::from_secs(120));
/// assert_eq!(jetstream.max_deliveries, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedeliveryHorizon {
    /// The broker's name.
    pub broker: &'static str,
    /// How long the broker waits for a settlement before it delivers again
    /// (JetStream's `ack_wait`; RabbitMQ's delivery acknowledgement
    /// timeout, 30 minutes by default).
    pub ack_wait: Duration,
    /// The most deliveries of one message the broker makes (JetStream's
    /// `max_deliver`, a quorum queue's `x-delivery-limit`); `None` for no
    /// limit, the only figure a consumer accepts
    /// ([`Consumer::horizon`](crate::Consumer::horizon)): a broker counts
    /// copies no consumer settled and drops the message at its limit.
    pub max_deliveries: Option<u32>,
    /// The broker's own delays between deliveries (JetStream's `backoff`),
    /// the last repeated.
    pub backoff: Vec<Duration>,
    /// How long the broker drops a message published again with the same
    /// id (JetStream's `duplicate_window`); `None` if it never does.
    pub duplicate_window: Option<Duration>,
}

impl RedeliveryHorizon {
    /// A broker that redelivers after `ack_wait`, with no limit, no backoff
    /// and no duplicate window until set.
    pub fn new(broker: &'static str, ack_wait: Duration) -> Self {
        Self {
            broker,
            ack_wait,
            max_deliveries: None,
            backoff: Vec::new(),
            duplicate_window: None,
        }
    }

    /// The same with a limit on deliveries.
    #[must_use]
    pub fn with_max_deliveries(mut self, max: u32) -> Self {
        self.max_deliveries = Some(max);
        self
    }

    /// The same with the broker's own delays between deliveries.
    #[must_use]
    pub fn with_backoff(mut self, backoff: Vec<Duration>) -> Self {
        self.backoff = backoff;
        self
    }

    /// The same with a duplicate window.
    #[must_use]
    pub fn with_duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = Some(window);
        self
    }
}
