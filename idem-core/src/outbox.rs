//! The transactional outbox's store: messages written with the business
//! change that causes them, and the operations a relay uses to publish them
//! in order, once per aggregate at a time.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::Capabilities;
use crate::clock::Timestamp;
use crate::error::{InvalidInput, StoreError};
use crate::record::OwnerToken;
use crate::scope::check_name;

/// The most messages one claim or listing returns.
pub const MAX_OUTBOX_BATCH: usize = 1_000;

/// A message's type and payload as every store keeps them: a valid name, at
/// most [`MAX_PAYLOAD_BYTES`].
pub(crate) fn typed_payload(kind: &str, payload: &[u8]) -> Result<(), InvalidInput> {
    check_name("message type", kind)?;
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(InvalidInput::TooLong {
            field: "payload",
            len: payload.len(),
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// A message header as every store keeps it: a valid name, a value
/// without control characters.
pub(crate) fn header(name: &str, value: &str) -> Result<(String, String), InvalidInput> {
    check_name("header name", name)?;
    if let Some((position, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidInput::ControlCharacter {
            field: "header value",
            position,
        });
    }
    Ok((name.to_string(), value.to_string()))
}

/// The largest payload a message carries, in bytes: brokers' defaults sit
/// near 1 MiB (NATS) to 128 MiB (RabbitMQ); a larger event belongs in a
/// store, referenced.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// A message's unique id, minted when it is enqueued: the broker message id
/// (`message_id` on RabbitMQ, `Nats-Msg-Id` on JetStream), so a consumer or
/// a broker deduplicates a message the relay published twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(uuid::Uuid);

impl MessageId {
    /// A fresh random id.
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// The id as a UUID.
    pub fn as_uuid(&self) -> uuid::Uuid {
        self.0
    }

    /// The id from a UUID a store kept.
    pub fn from_uuid(id: uuid::Uuid) -> Self {
        Self(id)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A message to enqueue with a business change.
///
/// ```
/// use idem_core::store::NewMessage;
///
/// let placed = NewMessage::new("order-42", "order.placed", br#"{"total":5990}"#.to_vec())?
///     .with_header("content-type", "application/json")?;
/// assert_eq!(placed.aggregate(), "order-42");
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    id: MessageId,
    aggregate: String,
    kind: String,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
}

impl NewMessage {
    /// A message of `kind` (its type, the routing key or subject suffix) about
    /// `aggregate` (the entity whose changes it reports, in order), with a
    /// fresh id. Aggregate and kind follow idem's name rules (1 to 255
    /// bytes, no control characters).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad aggregate or kind, or a payload over
    /// [`MAX_PAYLOAD_BYTES`].
    pub fn new(aggregate: &str, kind: &str, payload: Vec<u8>) -> Result<Self, InvalidInput> {
        check_name("aggregate", aggregate)?;
        typed_payload(kind, &payload)?;
        Ok(Self {
            id: MessageId::generate(),
            aggregate: aggregate.to_string(),
            kind: kind.to_string(),
            headers: Vec::new(),
            payload,
        })
    }

    /// The same with a header (name: 1 to 255 bytes without control
    /// characters; value without control characters).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad name or value.
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, InvalidInput> {
        self.headers.push(header(name, value)?);
        Ok(self)
    }

    /// The message as a store read it back.
    pub fn from_stored(
        id: MessageId,
        aggregate: String,
        kind: String,
        headers: Vec<(String, String)>,
        payload: Vec<u8>,
    ) -> Self {
        Self {
            id,
            aggregate,
            kind,
            headers,
            payload,
        }
    }

    /// Its id.
    pub fn id(&self) -> MessageId {
        self.id
    }

    /// The aggregate whose changes it reports.
    pub fn aggregate(&self) -> &str {
        &self.aggregate
    }

    /// Its type.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Its headers, in order.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageState {
    /// Waiting to be published (or retried after a failure).
    Pending,
    /// Published: the broker confirmed it.
    Sent,
    /// Failed too many times: it waits for an operator, and so does every
    /// later message of its aggregate.
    Parked,
    /// Dropped by an operator, with the reason; its aggregate flows again.
    Dropped,
}

impl MessageState {
    /// The state's name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Parked => "parked",
            Self::Dropped => "dropped",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Pending, Self::Sent, Self::Parked, Self::Dropped]
            .into_iter()
            .find(|state| state.as_str() == name)
    }
}

/// What changes in a stored message, apart from what was enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageParts {
    /// Its place in its aggregate: 1, 2, 3... in commit order.
    pub sequence: u64,
    /// Where it stands.
    pub state: MessageState,
    /// How many publishes failed.
    pub attempts: u32,
    /// The last failure, or an operator's reason to drop it.
    pub last_error: Option<String>,
    /// When it was enqueued, by the store's clock.
    pub enqueued_at: Timestamp,
    /// Not published before this (a retry's back-off).
    pub available_at: Timestamp,
    /// The relay holding it, while one does.
    pub lease_owner: Option<OwnerToken>,
    /// Until when that relay holds it.
    pub lease_until: Option<Timestamp>,
    /// When the broker confirmed it.
    pub sent_at: Option<Timestamp>,
}

/// A message as an outbox store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    message: NewMessage,
    parts: MessageParts,
}

impl OutboxMessage {
    /// The stored message of `message` with `parts`.
    pub fn new(message: NewMessage, parts: MessageParts) -> Self {
        Self { message, parts }
    }

    /// What was enqueued.
    pub fn message(&self) -> &NewMessage {
        &self.message
    }

    /// Its id (the broker message id).
    pub fn id(&self) -> MessageId {
        self.message.id
    }

    /// What changes.
    pub fn parts(&self) -> &MessageParts {
        &self.parts
    }

    /// Where it stands.
    pub fn state(&self) -> MessageState {
        self.parts.state
    }

    /// The same message with its parts edited.
    #[must_use]
    pub fn edited(&self, edit: impl FnOnce(&mut MessageParts)) -> Self {
        let mut parts = self.parts.clone();
        edit(&mut parts);
        Self::new(self.message.clone(), parts)
    }

    /// Whether `owner` holds it at the store's time `now`.
    pub fn is_held_by(&self, owner: OwnerToken, now: Timestamp) -> bool {
        self.parts.lease_owner == Some(owner) && self.parts.lease_until.is_some_and(|u| u > now)
    }

    /// The message after `failure` at the store's time `now`: one more
    /// attempt, the error kept, the lease freed, available again after the
    /// back-off, parked at the last attempt.
    #[must_use]
    pub fn failed(&self, failure: &PublishFailure, now: Timestamp) -> Self {
        self.edited(|parts| {
            parts.attempts = parts.attempts.saturating_add(1);
            parts.last_error = Some(failure.error.clone());
            parts.lease_until = None;
            parts.available_at = now + failure.retry_after;
            if parts.attempts >= failure.max_attempts {
                parts.state = MessageState::Parked;
            }
        })
    }
}

/// The age of the backlog, for gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting to be published.
    pub pending: u64,
    /// Messages parked.
    pub parked: u64,
    /// How long the oldest unsent message has waited, by the store's clock.
    pub oldest_pending_age: Option<Duration>,
}

impl OutboxStats {
    /// Stats from each figure.
    pub fn new(pending: u64, parked: u64, oldest_pending_age: Option<Duration>) -> Self {
        Self {
            pending,
            parked,
            oldest_pending_age,
        }
    }
}

/// What a relay asks of [`OutboxStore::claim`]: up to `limit` messages,
/// leased to `owner` for `lease`.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{BatchClaim, OwnerToken};
///
/// let batch = BatchClaim::new(OwnerToken::generate(), Duration::from_secs(30), 100);
/// assert_eq!(batch.limit, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchClaim {
    /// Who leases the messages.
    pub owner: OwnerToken,
    /// For how long, by the store's clock (1 ms to 7 days: the store
    /// refuses others).
    pub lease: Duration,
    /// At most this many (1 to [`MAX_OUTBOX_BATCH`]: the store refuses
    /// others).
    pub limit: usize,
}

impl BatchClaim {
    /// Up to `limit` messages for `owner`, for `lease`.
    pub fn new(owner: OwnerToken, lease: Duration, limit: usize) -> Self {
        Self {
            owner,
            lease,
            limit,
        }
    }
}

/// A failed publish, as [`OutboxStore::mark_failed`] counts it: the message,
/// the owner whose lease it is under, the broker's error, and what the
/// failure leads to.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{MessageId, OwnerToken, PublishFailure};
///
/// let failure = PublishFailure::new(OwnerToken::generate(), MessageId::generate(), "nacked")
///     .retry_after(Duration::from_secs(2))
///     .max_attempts(5);
/// assert_eq!(failure.max_attempts, 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishFailure {
    /// Whose lease the message is under.
    pub owner: OwnerToken,
    /// The message.
    pub id: MessageId,
    /// Why it failed, kept with the message.
    pub error: String,
    /// How long until the message is available again.
    pub retry_after: Duration,
    /// The failures at which the message is parked instead (at least 1).
    pub max_attempts: u32,
}

impl PublishFailure {
    /// A failure of `id` under `owner`'s lease: available again at once,
    /// parked at its tenth failure.
    pub fn new(owner: OwnerToken, id: MessageId, error: impl Into<String>) -> Self {
        Self {
            owner,
            id,
            error: error.into(),
            retry_after: Duration::ZERO,
            max_attempts: 10,
        }
    }

    /// Available again only after `retry_after`.
    #[must_use]
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Parked at its `max_attempts`-th failure (0 counts as 1).
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }
}

/// The storage of a transactional outbox (`idem-outbox`).
///
/// # Contract
///
/// Each sentence is a case of the public outbox suite in `idem-conformance`.
///
/// - **Enqueue.** [`enqueue`](Self::enqueue) stores a message pending, with
///   the next sequence of its aggregate (1 for the first); a second enqueue
///   of one id stores nothing more and returns the first. Backends that
///   share the caller's transaction enqueue inside it, so a message exists
///   exactly when the business change committed, and sequences follow the
///   commit order within an aggregate.
/// - **Claim.** [`claim`](Self::claim) leases to the batch's `owner`, for
///   its `lease` by the store's clock, up to its `limit` messages: for each
///   aggregate, its lowest pending message that nobody holds, if it is
///   available (`available_at` passed) and every open (pending or parked)
///   message of the aggregate below it is held by that owner. So a claim
///   takes each aggregate's head, never two messages of one aggregate, and
///   nothing above a parked message or one another owner holds. It never
///   skips a message: one that commits late is claimed when it is the head
///   of its aggregate. A lease that lapsed counts as none.
/// - **Claim ahead.** The message after those its owner holds is claimed
///   too, under the earliest of their leases, so an aggregate's leases
///   lapse together: a relay claims an aggregate's next message while the
///   broker confirms the last, and publishes it once that one is confirmed.
/// - **Sent.** [`mark_sent`](Self::mark_sent) marks the given messages sent,
///   in one operation, only those `owner` still holds; it answers how many.
///   Delivered twice, the second marks nothing more and fails nothing.
/// - **Release.** [`release`](Self::release) frees the given messages that
///   `owner` holds, unpublished: no attempt counted, no error kept,
///   available at once; it answers how many. Delivered twice, the second
///   frees nothing.
/// - **Failed.** [`mark_failed`](Self::mark_failed) counts a failed publish
///   under its owner's lease, keeps the error, frees the message, and makes
///   it available again after `retry_after`; at `max_attempts` failures it is
///   parked instead, and so, in effect, its aggregate. Without the lease:
///   [`StoreError::LostLease`], nothing written.
/// - **Operator.** [`parked`](Self::parked) lists parked messages, oldest
///   first; [`retry`](Self::retry) makes a parked message pending again with
///   its attempts reset; [`drop_message`](Self::drop_message) drops a parked
///   or pending message, keeping the reason, so its aggregate flows again.
///   Each answers whether it changed anything.
/// - **Purge.** [`purge_sent`](Self::purge_sent) deletes up to `limit` sent
///   (or dropped) messages older than `older_than`, never an unsent one.
/// - **Stats.** [`stats`](Self::stats) counts pending and parked messages
///   and the age of the oldest pending one.
/// - **Time.** Leases, back-off and ages are the store's clock's.
#[async_trait]
pub trait OutboxStore: Send + Sync + fmt::Debug + 'static {
    /// Stores `message` pending with its aggregate's next sequence.
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError>;

    /// Leases the available heads of up to `batch.limit` aggregates to
    /// `batch.owner`, and the next message of each aggregate it holds.
    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError>;

    /// Marks `ids` sent where `owner` holds them; how many it marked.
    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError>;

    /// Frees `ids` where `owner` holds them, counting no attempt; how many
    /// it freed.
    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError>;

    /// Counts `failure` under its owner's lease; the state it leaves
    /// (pending again, or parked).
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] unless the owner holds it.
    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError>;

    /// Parked messages, oldest first, at most `limit`.
    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError>;

    /// Makes a parked message pending again; whether it was parked.
    async fn retry(&self, id: MessageId) -> Result<bool, StoreError>;

    /// Drops a pending or parked message with `reason`; whether it did.
    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError>;

    /// Deletes up to `limit` sent or dropped messages older than
    /// `older_than`; how many.
    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError>;

    /// The backlog.
    async fn stats(&self) -> Result<OutboxStats, StoreError>;

    /// What the store is.
    fn capabilities(&self) -> Capabilities;
}

/// Checks a claim, listing or purge limit: 1 to [`MAX_OUTBOX_BATCH`].
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside it.
pub fn validate_outbox_batch(limit: usize) -> Result<usize, InvalidInput> {
    if (1..=MAX_OUTBOX_BATCH).contains(&limit) {
        Ok(limit)
    } else {
        Err(InvalidInput::OutOfRange {
            field: "batch",
            reason: "must be 1 to 1000",
        })
    }
}
