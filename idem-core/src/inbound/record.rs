//! The record kept per scope, and the values that travel in and out of it.

use crate::inbound::fingerprint::Fingerprint;
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::InvalidInput;
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::scope::{Scope, check_name};
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::time::Duration;

/// Proof that a claim holds a scope: what every fenced operation names.
///
/// Handlers receive one from a claim and never build one. Store
/// implementations mint it with [`Lease::issued`] from what the claim wrote.
///
/// ```
/// use idem_core::{Fingerprint, Scope};
/// use idem_core::store::{decide, ClaimOutcome, ClaimRequest, Timestamp};
///
/// let request = ClaimRequest::new(Scope::parse("acme", "order-1")?, Fingerprint::of_bytes(b"body"));
/// let now = Timestamp::from_unix_millis(1_000);
/// let ClaimOutcome::Claimed { lease, .. } = decide(None, &request, now).outcome
/// else {
///     unreachable!("an absent record is claimed");
/// };
/// assert_eq!(lease.attempt(), 1);
/// assert_eq!(lease.expires_at(), now + request.lease());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    scope: Scope,
    owner: OwnerToken,
    attempt: u32,
    expires_at: Timestamp,
    retention: Duration,
}

impl Lease {
    /// For store implementations: the lease a claim (or renewal) just wrote.
    ///
    /// `retention` is the claim's retention, which completion applies again
    /// from the moment of completion.
    pub fn issued(
        scope: Scope,
        owner: OwnerToken,
        attempt: u32,
        expires_at: Timestamp,
        retention: Duration,
    ) -> Self {
        Self {
            scope,
            owner,
            attempt,
            expires_at,
            retention,
        }
    }

    /// The scope held.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The fencing token.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// 1 for the first claim, +1 for every takeover.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Until when the lease holds, by the store's clock.
    pub fn expires_at(&self) -> Timestamp {
        self.expires_at
    }

    /// How long the completed record is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The same lease with another expiry, as a store returns it from `renew`.
    pub fn renewed(&self, expires_at: Timestamp) -> Self {
        Self {
            expires_at,
            ..self.clone()
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("scope", &self.scope)
            .field("owner", &self.owner)
            .field("attempt", &self.attempt)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// The response kept for replay: status, headers and body, byte for byte.
///
/// ```
/// use idem_core::StoredResponse;
///
/// let response = StoredResponse::new(201, b"{\"id\":7}".to_vec())
///     .with_header("content-type", "application/json");
/// assert_eq!(response.status(), 201);
/// assert_eq!(response.header("Content-Type"), Some(&b"application/json"[..]));
/// assert_eq!(response.size(), 8 + "content-type".len() + "application/json".len());
/// ```
///
/// It serialises with serde (for an admin route) as `status`, `headers` as
/// `[name, value]` pairs in their order and `body`, every value and the body
/// as standard base64, since they are bytes:
///
/// ```
/// use idem_core::StoredResponse;
///
/// let response = StoredResponse::new(201, "placed").with_header("content-type", "text/plain");
/// assert_eq!(
///     serde_json::to_string(&response)?,
///     r#"{"status":201,"headers":[["content-type","dGV4dC9wbGFpbg=="]],"body":"cGxhY2Vk"}"#
/// );
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, Vec<u8>)>,
    pub(crate) body: Vec<u8>,
}

impl StoredResponse {
    /// A response with a status code and body and no headers.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a header; names and order are kept as given, values are bytes.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The headers in their original order.
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }

    /// The first header named `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// Takes the body out.
    pub fn into_body(self) -> Vec<u8> {
        self.body
    }

    /// Takes the headers out, in their order, leaving none: with
    /// [`into_body`](Self::into_body), the response taken apart without a copy.
    ///
    /// ```
    /// use idem_core::StoredResponse;
    ///
    /// let mut response = StoredResponse::new(201, "placed").with_header("content-type", "text/plain");
    /// let headers = response.take_headers();
    /// assert_eq!(headers, [("content-type".to_string(), b"text/plain".to_vec())]);
    /// assert!(response.headers().is_empty());
    /// assert_eq!(response.into_body(), b"placed");
    /// ```
    pub fn take_headers(&mut self) -> Vec<(String, Vec<u8>)> {
        std::mem::take(&mut self.headers)
    }

    /// The size stores compare with their limit: body bytes plus the bytes of
    /// every header name and value.
    pub fn size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .iter()
                .map(|(n, v)| n.len() + v.len())
                .sum::<usize>()
    }
}

/// The largest checkpoint data accepted, in bytes of JSON.
pub const MAX_CHECKPOINT_BYTES: usize = 16 * 1024;

/// A recovery point an owner records, handed to whoever takes the key over.
///
/// ```
/// use idem_core::Checkpoint;
///
/// let point = Checkpoint::new("charged", &serde_json::json!({"charge_id": "ch_1"}))?;
/// assert_eq!(point.name(), "charged");
/// assert_eq!(point.data()["charge_id"], "ch_1");
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub(crate) name: String,
    pub(crate) data: Value,
}

impl Checkpoint {
    /// A named point with small JSON data.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] if the name breaks the key rules (1 to 255 bytes, no
    /// control characters), the data does not serialise to JSON, or it is
    /// over [`MAX_CHECKPOINT_BYTES`].
    pub fn new(name: impl Into<String>, data: &impl Serialize) -> Result<Self, InvalidInput> {
        let name = name.into();
        check_name("checkpoint name", &name)?;
        let data = serde_json::to_value(data).map_err(|e| InvalidInput::Malformed {
            field: "checkpoint data",
            reason: e.to_string(),
        })?;
        let len = serde_json::to_string(&data).map(|s| s.len()).unwrap_or(0);
        if len > MAX_CHECKPOINT_BYTES {
            return Err(InvalidInput::TooLong {
                field: "checkpoint data",
                len,
                max: MAX_CHECKPOINT_BYTES,
            });
        }
        Ok(Self { name, data })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The data.
    pub fn data(&self) -> &Value {
        &self.data
    }
}

/// Whether a record is being worked on or done.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RecordState {
    /// An owner holds the key.
    InFlight {
        /// Until when the owner's lease holds.
        lease_expires_at: Timestamp,
    },
    /// The response is stored for replay.
    Completed {
        /// The stored response.
        response: StoredResponse,
    },
}

/// Everything a store keeps for one scope: see the [`store`](crate::store)
/// module for what each part means.
///
/// Two deadlines, two names: a lease *expires* (`lease_expires_at`, in
/// flight only), a record is *retained until* [`retained_until`](Self::retained_until),
/// after which it counts as absent.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Fingerprint, Scope, StoredResponse};
/// use idem_core::store::{OwnerToken, Record, Timestamp};
///
/// let now = Timestamp::from_unix_millis(0);
/// let record = Record::in_flight(
///     Scope::parse("acme", "k")?,
///     Fingerprint::of_bytes(b"req"),
///     OwnerToken::generate(),
///     1,
///     now + Duration::from_secs(30),
///     now + Duration::from_secs(3600),
/// );
/// assert!(record.is_in_flight());
/// assert!(record.is_live(now));
/// let done = record.completed(StoredResponse::new(200, "ok"), now + Duration::from_secs(60));
/// assert_eq!(done.response().map(|r| r.status()), Some(200));
/// assert_eq!(done.retained_until(), now + Duration::from_secs(60));
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
///
/// It serialises with serde, so a service can show a record on an admin
/// route (what [`IdempotencyStore::get`](crate::store::IdempotencyStore::get)
/// read): `tenant`, `key` (the key itself: an admin route is for
/// operators, unlike logs and traces, which get only its hash), `fingerprint`
/// (hex), `owner` (UUID), `attempt`, `state` (`in_flight` or `completed`),
/// `lease_expires_at` and `retained_until` (Unix milliseconds, the lease's
/// `null` once completed), `checkpoint` (`{name, data}` or `null`) and
/// `response` (a [`StoredResponse`], bytes as base64, or `null` in flight):
///
/// ```
/// use idem_core::{Fingerprint, Scope, StoredResponse};
/// use idem_core::store::{OwnerToken, Record, Timestamp};
///
/// let at = Timestamp::from_unix_millis(1_700_000_000_000);
/// let record = Record::in_flight(Scope::parse("acme", "k")?, Fingerprint::of_bytes(b"req"), OwnerToken::generate(), 1, at, at)
///     .completed(StoredResponse::new(200, "ok"), at);
/// let json = serde_json::to_value(&record)?;
/// assert_eq!(json["state"], "completed");
/// assert_eq!(json["retained_until"], 1_700_000_000_000i64);
/// assert_eq!(json["response"]["body"], "b2s=");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Record {
    scope: Scope,
    fingerprint: Fingerprint,
    owner: OwnerToken,
    attempt: u32,
    state: RecordState,
    checkpoint: Option<Checkpoint>,
    retained_until: Timestamp,
}

impl Record {
    /// A record just claimed.
    pub fn in_flight(
        scope: Scope,
        fingerprint: Fingerprint,
        owner: OwnerToken,
        attempt: u32,
        lease_expires_at: Timestamp,
        retained_until: Timestamp,
    ) -> Self {
        Self {
            scope,
            fingerprint,
            owner,
            attempt,
            state: RecordState::InFlight { lease_expires_at },
            checkpoint: None,
            retained_until,
        }
    }

    /// The same record with another state (a store decoding what it read).
    pub fn with_state(mut self, state: RecordState) -> Self {
        self.state = state;
        self
    }

    /// The same record with another recovery point.
    pub fn with_checkpoint(mut self, checkpoint: Option<Checkpoint>) -> Self {
        self.checkpoint = checkpoint;
        self
    }

    /// The same record retained until another moment.
    pub fn with_retained_until(mut self, retained_until: Timestamp) -> Self {
        self.retained_until = retained_until;
        self
    }

    /// The record completed with `response`, retained until `retained_until`;
    /// the checkpoint goes, as it belongs to in-flight work.
    pub fn completed(self, response: StoredResponse, retained_until: Timestamp) -> Self {
        Self {
            state: RecordState::Completed { response },
            checkpoint: None,
            retained_until,
            ..self
        }
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The fingerprint of the request that claimed the scope.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The owner that claimed it last.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// 1 on the first claim, +1 on every takeover.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// In flight or completed.
    pub fn state(&self) -> &RecordState {
        &self.state
    }

    /// The last recovery point the owners wrote (in flight only).
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Retention: from this moment the record counts as absent.
    pub fn retained_until(&self) -> Timestamp {
        self.retained_until
    }

    /// Until when the owner's lease holds, if in flight.
    pub fn lease_expires_at(&self) -> Option<Timestamp> {
        match self.state {
            RecordState::InFlight { lease_expires_at } => Some(lease_expires_at),
            RecordState::Completed { .. } => None,
        }
    }

    /// Whether the record still counts at `now` (it has not passed retention).
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.retained_until
    }

    /// Whether an owner holds it.
    pub fn is_in_flight(&self) -> bool {
        matches!(self.state, RecordState::InFlight { .. })
    }

    /// The stored response, if completed.
    pub fn response(&self) -> Option<&StoredResponse> {
        match &self.state {
            RecordState::Completed { response } => Some(response),
            RecordState::InFlight { .. } => None,
        }
    }

    /// Whether this record was completed by `lease`'s owner with exactly
    /// `response`: a completion delivered again, to be answered `Ok` as the
    /// first delivery was.
    pub fn is_completed_by(&self, lease: &Lease, response: &StoredResponse) -> bool {
        self.owner == lease.owner() && self.response() == Some(response)
    }

    /// Whether `lease` may perform a fenced write on this record at `now`:
    /// still live, in flight, same owner. An expired lease nobody has taken
    /// over still holds.
    pub fn is_held_by(&self, lease: &Lease, now: Timestamp) -> bool {
        self.is_live(now) && self.is_in_flight() && self.owner == lease.owner()
    }
}
