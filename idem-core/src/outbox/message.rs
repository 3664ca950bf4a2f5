//! An outbox message: written with the business change that causes it,
//! its aggregate's sequence, and its state on the way to the broker.

use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::InvalidInput;
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::limits::header;
use crate::plumbing::limits::typed_payload;
use crate::plumbing::scope::check_name;
use std::fmt;

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
    /// [`MAX_PAYLOAD_BYTES`](crate::store::MAX_PAYLOAD_BYTES).
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
    /// When it left the backlog, by the store's clock: the broker
    /// confirmed it, or an operator dropped it.
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
}
