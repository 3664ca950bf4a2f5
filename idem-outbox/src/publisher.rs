//! What a broker is to the relay: a place that confirms what it stored.

use std::time::Duration;

use idem_core::store::OutboxMessage;
use idem_core::{InvalidInput, async_trait};

/// The longest time limit of a publish that [`validate_publish_timeout`]
/// takes: an hour.
pub const MAX_PUBLISH_TIMEOUT: Duration = Duration::from_secs(3600);

/// Checks a publisher's time limit for a batch's confirms: more than zero,
/// at most [`MAX_PUBLISH_TIMEOUT`]. For publishers' options.
///
/// ```
/// use std::time::Duration;
/// use idem_outbox::validate_publish_timeout;
///
/// assert!(validate_publish_timeout(Duration::from_secs(5)).is_ok());
/// assert!(validate_publish_timeout(Duration::ZERO).is_err());
/// ```
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside that range.
pub fn validate_publish_timeout(timeout: Duration) -> Result<Duration, InvalidInput> {
    if timeout.is_zero() || timeout > MAX_PUBLISH_TIMEOUT {
        return Err(InvalidInput::OutOfRange {
            field: "publish timeout",
            reason: "more than zero and at most an hour",
        });
    }
    Ok(timeout)
}

/// What the broker said of one published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Published {
    /// The broker recognised the message id and kept no second copy
    /// (JetStream within its duplicate window); `false` where the broker
    /// cannot tell.
    pub duplicate: bool,
}

impl Published {
    /// Stored, as a first copy or where the broker cannot tell.
    pub fn stored() -> Self {
        Self { duplicate: false }
    }

    /// Recognised as a duplicate and not stored again.
    pub fn duplicate() -> Self {
        Self { duplicate: true }
    }
}

/// Why a publish failed: the message is retried with back-off, then parked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{broker}: {message}")]
#[non_exhaustive]
pub struct PublishError {
    /// The broker's name (`rabbitmq`, `nats`).
    pub broker: &'static str,
    /// What went wrong, kept on the message as its last error.
    pub message: String,
}

impl PublishError {
    /// A failure at `broker`.
    pub fn new(broker: &'static str, message: impl Into<String>) -> Self {
        Self {
            broker,
            message: message.into(),
        }
    }
}

/// A broker the relay publishes to. Implement it for a broker idem does not
/// ship; `idem-rabbitmq` and `idem-nats` implement it for RabbitMQ and NATS
/// JetStream.
///
/// # Contract
///
/// - `publish` answers one result per message, in order.
/// - `Ok` only once the broker has confirmed the message durably (a
///   publisher confirm, a PubAck): the relay then moves past it, and never
///   publishes it again unless it crashed before its cursor moved.
/// - The message's id ([`OutboxMessage::id`]) travels as the broker's
///   message id, so a broker or a consumer recognises a second publish.
/// - A message the broker cannot route or store is an `Err`, never a
///   silent `Ok`.
/// - A publish has a time limit of the publisher's own and ends in `Err`
///   past it.
///
/// ```
/// use idem_core::store::OutboxMessage;
/// use idem_outbox::{async_trait, PublishError, Published, Publisher};
///
/// struct Log;
///
/// #[async_trait]
/// impl Publisher for Log {
///     async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
///         batch.iter().map(|m| {
///             println!("{} {} {}", m.id(), m.message().aggregate(), m.message().kind());
///             Ok(Published::stored())
///         }).collect()
///     }
/// }
/// ```
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Publishes `batch` (messages of distinct aggregates), waiting for the
    /// broker's confirmations; one result per message, in order.
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>>;
}
