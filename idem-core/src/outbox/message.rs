//! An outbox message: written with the business change that causes it,
//! its aggregate's sequence, and its state on the way to the broker.

use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::InvalidInput;
use crate::plumbing::limits::header;
use crate::plumbing::limits::typed_payload;
use crate::plumbing::scope::check_name;
use sha2::{Digest, Sha256};
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

    /// A message whose payload is `event` written as JSON, with the header
    /// `content-type: application/json`: a typed event, read back on the
    /// consuming side with
    /// [`InboundMessage::json`](crate::store::InboundMessage::json).
    ///
    /// ```
    /// use idem_core::store::NewMessage;
    ///
    /// #[derive(serde::Serialize)]
    /// struct OrderPlaced { order: String, total_cents: u64 }
    ///
    /// let event = OrderPlaced { order: "order-7".into(), total_cents: 1250 };
    /// let message = NewMessage::json("order-7", "order.placed", &event)?;
    /// assert_eq!(message.payload(), br#"{"order":"order-7","total_cents":1250}"#);
    /// assert_eq!(message.headers()[0], ("content-type".to_string(), "application/json".to_string()));
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`InvalidInput::Malformed`] for a value
    /// `serde_json` cannot write (a map with keys that are not strings).
    pub fn json<T: serde::Serialize + ?Sized>(
        aggregate: &str,
        kind: &str,
        event: &T,
    ) -> Result<Self, InvalidInput> {
        let payload = serde_json::to_vec(event).map_err(|e| InvalidInput::Malformed {
            field: "payload",
            reason: format!("not writable as JSON: {e}"),
        })?;
        Self::new(aggregate, kind, payload)?.with_header("content-type", "application/json")
    }

    /// A message of the event `event`, of its type's kind
    /// ([`Event::KIND`]), its payload `event` as JSON
    /// ([`json`](Self::json)): the type names the event on the wire, and
    /// [`InboundMessage::event`](crate::store::InboundMessage::event)
    /// reads it back as that type.
    ///
    /// ```
    /// use idem_core::Event;
    /// use idem_core::store::NewMessage;
    ///
    /// #[derive(serde::Serialize)]
    /// struct OrderPlaced { order: String }
    ///
    /// impl Event for OrderPlaced {
    ///     const KIND: &'static str = "order.placed";
    /// }
    ///
    /// let message = NewMessage::event("order-7", &OrderPlaced { order: "order-7".into() })?;
    /// assert_eq!(message.kind(), "order.placed");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`json`](Self::json).
    pub fn event<E: Event + serde::Serialize>(
        aggregate: &str,
        event: &E,
    ) -> Result<Self, InvalidInput> {
        Self::json(aggregate, E::KIND, event)
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
    /// In its partition's log, past the cursor: the relay publishes it in
    /// its turn.
    Pending,
    /// Out of the log, in its partition's retry lane: it failed and is due
    /// again at `available_at`, or it waits behind an earlier message of
    /// its aggregate that did.
    Waiting,
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
            Self::Waiting => "waiting",
            Self::Sent => "sent",
            Self::Parked => "parked",
            Self::Dropped => "dropped",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Pending,
            Self::Waiting,
            Self::Sent,
            Self::Parked,
            Self::Dropped,
        ]
        .into_iter()
        .find(|state| state.as_str() == name)
    }

    /// Whether the message has left the backlog for good (sent or dropped).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Sent | Self::Dropped)
    }
}

/// A place in a partition's log, in the store's order of what committed:
/// a relay reads after one, and moves its partition's cursor to one. Two
/// numbers, compared in turn, whose meaning is the store's (Postgres: the
/// enqueuing transaction's id, then the row's; memory: a counter); a relay
/// only hands back what the store gave it.
///
/// ```
/// use idem_core::store::LogPosition;
///
/// assert!(LogPosition::START < LogPosition::new(1, 0));
/// assert!(LogPosition::new(1, 9) < LogPosition::new(2, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogPosition {
    major: u64,
    minor: u64,
}

impl LogPosition {
    /// Before every message: a new partition's cursor.
    pub const START: Self = Self { major: 0, minor: 0 };

    /// The position `(major, minor)`.
    pub const fn new(major: u64, minor: u64) -> Self {
        Self { major, minor }
    }

    /// Its first number.
    pub const fn major(self) -> u64 {
        self.major
    }

    /// Its second number.
    pub const fn minor(self) -> u64 {
        self.minor
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The hash that places an aggregate in a partition: the first eight bytes
/// of the SHA-256 of its name, as a number below 2^63 (so a database's
/// signed 64-bit integer holds it). Stable across processes, versions and
/// languages: a store may compute the partition itself as this modulo its
/// count.
///
/// ```
/// use idem_core::store::{partition_hash, partition_of};
///
/// let hash = partition_hash("order-42");
/// assert!(hash < 1 << 63);
/// assert_eq!(u64::from(partition_of("order-42", 16)), hash % 16);
/// ```
pub fn partition_hash(aggregate: &str) -> u64 {
    let digest = Sha256::digest(aggregate.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first) >> 1
}

/// The partition of `aggregate` among `partitions` (0 counts as 1): its
/// [`partition_hash`] modulo the count. Every message of an aggregate lands
/// in one partition, so one relay publishes them, in order.
///
/// ```
/// use idem_core::store::partition_of;
///
/// assert_eq!(partition_of("order-42", 1), 0);
/// assert!(partition_of("order-42", 8) < 8);
/// assert_eq!(partition_of("order-42", 8), partition_of("order-42", 8));
/// ```
pub fn partition_of(aggregate: &str, partitions: u32) -> u32 {
    let count = u64::from(partitions.max(1));
    u32::try_from(partition_hash(aggregate) % count).unwrap_or(0)
}

/// What changes in a stored message, apart from what was enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageParts {
    /// Its place in its aggregate: 1, 2, 3... in commit order.
    pub sequence: u64,
    /// Its partition: [`partition_of`] its aggregate.
    pub partition: u32,
    /// Its place in its partition's log.
    pub position: LogPosition,
    /// Where it stands.
    pub state: MessageState,
    /// How many publishes failed.
    pub attempts: u32,
    /// The last failure, or an operator's reason to drop it.
    pub last_error: Option<String>,
    /// When it was enqueued, by the store's clock.
    pub enqueued_at: Timestamp,
    /// While [`Waiting`](MessageState::Waiting): not published before this
    /// (a retry's back-off); otherwise its enqueue.
    pub available_at: Timestamp,
    /// When it left the retry lane, by the store's clock: the broker
    /// confirmed it there, or an operator dropped it. `None` for a message
    /// sent from the log (the cursor passed it; its send is not recorded
    /// per message).
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
}

/// A type of event, with the name it travels under: the kind of each
/// message made of it ([`NewMessage::event`]), by which a consumer knows
/// it ([`InboundMessage::event`](crate::store::InboundMessage::event)).
/// The name is written once, by the type; keep it stable, as messages of
/// the old name are still in brokers and outboxes after a rename.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct OrderPaid { order: String, cents: u64 }
///
/// impl idem_core::Event for OrderPaid {
///     const KIND: &'static str = "order.paid";
/// }
/// ```
pub trait Event {
    /// The event's name: a message's kind (1 to 255 bytes, no control
    /// characters), the suffix of its routing key or subject.
    const KIND: &'static str;
}
