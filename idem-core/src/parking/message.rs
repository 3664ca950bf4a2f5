//! A message as a consumer receives it: its id, kind, payload, headers,
//! and its aggregate's version when it carries one.

use crate::plumbing::error::InvalidInput;
use crate::plumbing::scope::{IdempotencyKey, check_name};
use std::fmt;

/// A message as a consumer received it from a broker: its id (the broker
/// message id, the inbox's key), its type, the aggregate it reports on and
/// that aggregate's version if it carries them, its headers and payload.
///
/// ```
/// use idem_core::store::InboundMessage;
///
/// let message = InboundMessage::new("5f0c1c9e", "order.placed", br#"{"total":5990}"#.to_vec())?
///     .with_aggregate("order-42", Some(3))?;
/// assert_eq!(message.version(), Some(3));
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct InboundMessage {
    id: IdempotencyKey,
    kind: String,
    aggregate: Option<String>,
    version: Option<u64>,
    headers: Vec<(String, String)>,
    payload: Vec<u8>,
}

impl InboundMessage {
    /// A message with id `id` (1 to 255 bytes, no control characters) of
    /// type `kind` (the same rules), with no aggregate.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad id or kind, or a payload over
    /// [`MAX_PAYLOAD_BYTES`](crate::store::MAX_PAYLOAD_BYTES).
    pub fn new(id: &str, kind: &str, payload: Vec<u8>) -> Result<Self, InvalidInput> {
        let id = IdempotencyKey::new(id).map_err(|e| rename(e, "message id"))?;
        crate::plumbing::limits::typed_payload(kind, &payload)?;
        Ok(Self {
            id,
            kind: kind.to_string(),
            aggregate: None,
            version: None,
            headers: Vec::new(),
            payload,
        })
    }

    /// The message a consumer parks for a broker message that could not be
    /// read at all: id `malformed:<digest>` (the digest of what identifies
    /// it, so every delivery of it is one message), type `idem.malformed`,
    /// no payload. `idem_consumer::RawMessage` falls back to it.
    ///
    /// ```
    /// use idem_core::Fingerprint;
    /// use idem_core::store::InboundMessage;
    ///
    /// let message = InboundMessage::unreadable(&Fingerprint::of_bytes(b"abc"));
    /// assert!(message.id().as_str().starts_with("malformed:ba7816bf"));
    /// assert_eq!(message.kind(), "idem.malformed");
    /// ```
    pub fn unreadable(digest: &crate::Fingerprint) -> Self {
        Self {
            id: IdempotencyKey::derived("malformed:", digest),
            kind: "idem.malformed".to_string(),
            aggregate: None,
            version: None,
            headers: Vec::new(),
            payload: Vec::new(),
        }
    }

    /// The same about `aggregate`, at `version` (1 for its first event) if
    /// the event carries one.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad aggregate name or a version 0.
    pub fn with_aggregate(
        mut self,
        aggregate: &str,
        version: Option<u64>,
    ) -> Result<Self, InvalidInput> {
        check_name("aggregate", aggregate)?;
        if version == Some(0) {
            return Err(InvalidInput::OutOfRange {
                field: "version",
                reason: "versions start at 1",
            });
        }
        self.aggregate = Some(aggregate.to_string());
        self.version = version;
        Ok(self)
    }

    /// The same with a header (name: 1 to 255 bytes without control
    /// characters; value without control characters).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad name or value.
    pub fn with_header(mut self, name: &str, value: &str) -> Result<Self, InvalidInput> {
        self.headers
            .push(crate::plumbing::limits::header(name, value)?);
        Ok(self)
    }

    /// Its id.
    pub fn id(&self) -> &IdempotencyKey {
        &self.id
    }

    /// Its type.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The aggregate it reports on, if any.
    pub fn aggregate(&self) -> Option<&str> {
        self.aggregate.as_deref()
    }

    /// The aggregate's version it carries, if any.
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// Its headers, in order.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// Its payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Its payload read as JSON into a `T`: the typed event a publisher
    /// wrote with [`NewMessage::json`](crate::store::NewMessage::json).
    /// A payload that is not a `T` will never be one: a handler answers
    /// it as permanent, and the consumer parks it at once.
    ///
    /// ```
    /// use idem_core::store::{InboundMessage, NewMessage};
    ///
    /// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    /// struct OrderPlaced { order: String, total_cents: u64 }
    ///
    /// let event = OrderPlaced { order: "order-7".into(), total_cents: 1250 };
    /// let sent = NewMessage::json("order-7", "order.placed", &event)?;
    /// let got = InboundMessage::new("m-1", "order.placed", sent.payload().to_vec())?;
    /// assert_eq!(got.json::<OrderPlaced>()?, event);
    /// assert!(got.json::<Vec<u8>>().is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] when the payload is not JSON of a `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, InvalidInput> {
        serde_json::from_slice(&self.payload).map_err(|e| InvalidInput::Malformed {
            field: "payload",
            reason: format!("not the JSON of a {}: {e}", std::any::type_name::<T>()),
        })
    }

    /// Its payload as the event `E`, when it is of `E`'s kind
    /// ([`Event::KIND`](crate::Event::KIND)); `None` for a message of
    /// another kind, so a handler of many event types tries each.
    ///
    /// ```
    /// use idem_core::Event;
    /// use idem_core::store::{InboundMessage, NewMessage};
    ///
    /// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    /// struct OrderPlaced { order: String }
    /// impl Event for OrderPlaced { const KIND: &'static str = "order.placed"; }
    ///
    /// let sent = NewMessage::event("order-7", &OrderPlaced { order: "order-7".into() })?;
    /// let got = InboundMessage::new("m-1", sent.kind(), sent.payload().to_vec())?;
    /// assert_eq!(got.event::<OrderPlaced>()?, Some(OrderPlaced { order: "order-7".into() }));
    /// let other = InboundMessage::new("m-2", "order.paid", b"{}".to_vec())?;
    /// assert_eq!(other.event::<OrderPlaced>()?, None);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] when it is of `E`'s kind and its
    /// payload is not JSON of an `E`: it never will be (a handler answers
    /// it as permanent, and the consumer parks it at once).
    pub fn event<E: crate::Event + serde::de::DeserializeOwned>(
        &self,
    ) -> Result<Option<E>, InvalidInput> {
        if self.kind() != E::KIND {
            return Ok(None);
        }
        self.json().map(Some)
    }
}

impl fmt::Debug for InboundMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The id goes through the key's own redacting Debug.
        f.debug_struct("InboundMessage")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("aggregate", &self.aggregate)
            .field("version", &self.version)
            .field("payload_bytes", &self.payload.len())
            .finish_non_exhaustive()
    }
}

fn rename(error: InvalidInput, field: &'static str) -> InvalidInput {
    match error {
        InvalidInput::Empty { .. } => InvalidInput::Empty { field },
        InvalidInput::TooLong { len, max, .. } => InvalidInput::TooLong { field, len, max },
        InvalidInput::ControlCharacter { position, .. } => {
            InvalidInput::ControlCharacter { field, position }
        }
        other => other,
    }
}
