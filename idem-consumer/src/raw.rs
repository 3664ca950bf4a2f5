//! A broker message as an adapter read it, before it is an
//! [`InboundMessage`]: read whole when it can be one, else salvaged for
//! parking with the reason it cannot be, so that a broker never drops it.

use idem_core::Fingerprint;
use idem_core::store::{InboundMessage, MAX_PAYLOAD_BYTES};

/// The type a salvaged message carries when its own cannot be kept.
pub const MALFORMED_KIND: &str = "idem.malformed";

/// A broker message's parts as an adapter found them (an id, a type, an
/// aggregate and its version, headers, the payload), made into an
/// [`InboundMessage`] by [`read`](Self::read).
///
/// A message that cannot be one (no id, an id or type over 255 bytes, a
/// version that is not a positive number, a header with control
/// characters, a payload over the limit) is not the broker's to drop:
/// [`read`](Self::read) salvages what can be kept, and the consumer parks
/// it at once with the reason ([`Delivery::malformed`](crate::Delivery::malformed)),
/// where an operator sees it.
///
/// ```
/// use idem_consumer::RawMessage;
///
/// let good = RawMessage::new(Some("m-1"), "order.placed", b"{}".to_vec())
///     .with_aggregate("order-42", Some("3"))
///     .read()?;
/// assert_eq!(good.version(), Some(3));
///
/// let bad = RawMessage::new(Some("m-2"), "order.placed", b"{}".to_vec())
///     .with_aggregate("order-42", Some("three"))
///     .read()
///     .unwrap_err();
/// assert_eq!(bad.reason, r#"the aggregate's version "three" is not a positive number"#);
/// // Kept, without an aggregate (it is never replayed behind one), with
/// // what it said as headers.
/// assert_eq!(bad.message.id().as_str(), "m-2");
/// assert_eq!(bad.message.aggregate(), None);
/// assert!(bad.message.headers().contains(&("aggregate".into(), "order-42".into())));
/// # Ok::<(), idem_consumer::Malformed>(())
/// ```
#[derive(Debug, Clone)]
pub struct RawMessage {
    id: Option<String>,
    kind: String,
    payload: Vec<u8>,
    aggregate: Option<(String, Option<String>)>,
    headers: Vec<(String, String)>,
}

/// A broker message that cannot be an [`InboundMessage`]: why, and what of
/// it can be kept, to park.
#[derive(Debug, Clone, thiserror::Error)]
#[error("a malformed message: {reason}")]
#[non_exhaustive]
pub struct Malformed {
    /// Why it cannot be applied.
    pub reason: String,
    /// What could be kept: its id (or, without a usable one, one derived
    /// from the id it had, or from its type and payload when it had none,
    /// so two such messages alike in both are parked as one), its type (or [`MALFORMED_KIND`]), its headers
    /// that are valid, its aggregate and version as the headers
    /// `aggregate` and `version` (never as its aggregate: it is never
    /// replayed behind one), its payload (cut to the limit).
    pub message: Box<InboundMessage>,
}

impl RawMessage {
    /// A message with `id` (`None` when the broker gave it none), of type
    /// `kind`, carrying `payload`.
    pub fn new(id: Option<&str>, kind: &str, payload: Vec<u8>) -> Self {
        Self {
            id: id.map(str::to_string),
            kind: kind.to_string(),
            payload,
            aggregate: None,
            headers: Vec::new(),
        }
    }

    /// The same about `aggregate`, at `version` as the broker carried it
    /// (text, read as a number), if it carries one.
    #[must_use]
    pub fn with_aggregate(mut self, aggregate: &str, version: Option<&str>) -> Self {
        self.aggregate = Some((aggregate.to_string(), version.map(str::to_string)));
        self
    }

    /// The same with a header.
    #[must_use]
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The inbound message.
    ///
    /// # Errors
    ///
    /// [`Malformed`] when it cannot be one: why, and its salvage.
    pub fn read(self) -> Result<InboundMessage, Malformed> {
        match self.whole() {
            Ok(message) => Ok(message),
            Err(reason) => Err(Malformed {
                message: Box::new(self.salvage()),
                reason,
            }),
        }
    }

    /// The inbound message and, when it could not be read whole, why:
    /// [`read`](Self::read)'s answer as a source's delivery keeps it (what
    /// [`Delivery::malformed`](crate::Delivery::malformed) then says).
    ///
    /// ```
    /// let (message, why) = idem_consumer::RawMessage::new(None, "t", Vec::new()).read_or_salvage();
    /// assert_eq!(why.as_deref(), Some("it has no message id"));
    /// assert!(message.id().as_str().starts_with("malformed:"));
    /// ```
    pub fn read_or_salvage(self) -> (InboundMessage, Option<String>) {
        match self.read() {
            Ok(message) => (message, None),
            Err(Malformed { message, reason }) => (*message, Some(reason)),
        }
    }

    /// Every part as it is, or why one cannot be.
    fn whole(&self) -> Result<InboundMessage, String> {
        let id = self.id.as_deref().ok_or("it has no message id")?;
        let mut message =
            InboundMessage::new(id, &self.kind, self.payload.clone()).map_err(|e| e.to_string())?;
        if let Some((aggregate, version)) = &self.aggregate {
            let version = version.as_deref().map(number).transpose()?;
            message = message
                .with_aggregate(aggregate, version)
                .map_err(|e| e.to_string())?;
        }
        for (name, value) in &self.headers {
            message = message
                .with_header(name, value)
                .map_err(|e| e.to_string())?;
        }
        Ok(message)
    }

    /// What can be kept of a message that cannot be read whole.
    fn salvage(&self) -> InboundMessage {
        let mut payload = self.payload.clone();
        payload.truncate(MAX_PAYLOAD_BYTES);
        let kind = match InboundMessage::new("k", &self.kind, Vec::new()) {
            Ok(_) => self.kind.as_str(),
            Err(_) => MALFORMED_KIND,
        };
        let unreadable = InboundMessage::unreadable(&self.fingerprint());
        // Its own id where it is usable; else one derived from it, the
        // same for every delivery, so parking it twice keeps one record.
        let own = self
            .id
            .as_deref()
            .and_then(|id| InboundMessage::new(id, kind, payload.clone()).ok());
        let derived = InboundMessage::new(unreadable.id().as_str(), kind, payload);
        let mut message = own.or(derived.ok()).unwrap_or(unreadable);
        let aggregate = self.aggregate.iter().flat_map(|(aggregate, version)| {
            let version = version.iter().map(|v| ("version", v.as_str()));
            std::iter::once(("aggregate", aggregate.as_str())).chain(version)
        });
        let headers = self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        for (name, value) in aggregate.chain(headers) {
            if let Ok(with) = message.clone().with_header(name, value) {
                message = with;
            }
        }
        message
    }

    /// The SHA-256 of the id (if any), else of the type and payload: the
    /// same for every delivery of one message.
    fn fingerprint(&self) -> Fingerprint {
        match &self.id {
            Some(id) => Fingerprint::of_bytes(id.as_bytes()),
            None => {
                let mut bytes = self.kind.as_bytes().to_vec();
                bytes.push(0);
                bytes.extend_from_slice(&self.payload);
                Fingerprint::of_bytes(bytes)
            }
        }
    }
}

/// A version as a broker carried it.
fn number(version: &str) -> Result<u64, String> {
    version
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("the aggregate's version {version:?} is not a positive number"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn a_message_without_an_id_is_kept_under_one_derived_from_its_contents() {
        let raw = || RawMessage::new(None, "order.placed", b"{\"n\":1}".to_vec());
        let first = raw().read().unwrap_err();
        assert_eq!(first.reason, "it has no message id");
        assert!(first.message.id().as_str().starts_with("malformed:"));
        assert_eq!(first.message.id(), raw().read().unwrap_err().message.id());
        let other = RawMessage::new(None, "order.placed", b"{\"n\":2}".to_vec());
        assert_ne!(first.message.id(), other.read().unwrap_err().message.id());
        assert_eq!(first.message.payload(), b"{\"n\":1}");
    }

    #[test]
    fn an_id_too_long_is_kept_as_its_digest_and_the_rest_as_it_was() {
        let long = "x".repeat(300);
        let salvaged = RawMessage::new(Some(&long), "order.placed", b"{}".to_vec())
            .with_header("tenant", "acme")
            .read()
            .unwrap_err();
        assert!(
            salvaged.reason.contains("message id"),
            "{}",
            salvaged.reason
        );
        assert!(salvaged.message.id().as_str().starts_with("malformed:"));
        assert_eq!(salvaged.message.kind(), "order.placed");
        assert_eq!(
            salvaged.message.headers(),
            [("tenant".into(), "acme".into())]
        );
    }

    #[test]
    fn what_cannot_be_kept_is_left_out_of_the_salvage() {
        let payload = vec![b'a'; MAX_PAYLOAD_BYTES + 10];
        let salvaged = RawMessage::new(Some("m-1"), "bad\ttype", payload)
            .with_header("bad\nname", "v")
            .with_header("good", "v")
            .read()
            .unwrap_err();
        assert_eq!(salvaged.message.id().as_str(), "m-1");
        assert_eq!(salvaged.message.kind(), MALFORMED_KIND);
        assert_eq!(salvaged.message.payload().len(), MAX_PAYLOAD_BYTES);
        assert_eq!(salvaged.message.headers(), [("good".into(), "v".into())]);
    }

    #[test]
    fn a_version_zero_is_no_version() {
        let read = RawMessage::new(Some("m-1"), "t", Vec::new())
            .with_aggregate("a", Some("0"))
            .read();
        assert!(read.is_err());
        let whole = RawMessage::new(Some("m-1"), "t", Vec::new())
            .with_aggregate("a", None)
            .with_header("h", "v")
            .read()
            .unwrap();
        assert_eq!((whole.aggregate(), whole.version()), (Some("a"), None));
    }
}
