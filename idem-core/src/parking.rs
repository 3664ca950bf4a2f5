//! A message consumer's parking place: the deliveries it could not apply,
//! kept with their reason for an operator to list, replay or drop; and the
//! one rule of version checks.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::Capabilities;
use crate::clock::Timestamp;
use crate::error::{InvalidInput, Operation, StoreError};
use crate::layer::Layered;
use crate::scope::{IdempotencyKey, Scope, Tenant, check_name};

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
        crate::outbox::typed_payload(kind, &payload)?;
        Ok(Self {
            id,
            kind: kind.to_string(),
            aggregate: None,
            version: None,
            headers: Vec::new(),
            payload,
        })
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
        self.headers.push(crate::outbox::header(name, value)?);
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

/// Where a parked message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParkedState {
    /// Waiting for an operator (or for the gap before it to fill).
    Parked,
    /// Applied since, by a replay.
    Replayed,
    /// Dropped by an operator, with the reason.
    Dropped,
}

impl ParkedState {
    /// The state's name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parked => "parked",
            Self::Replayed => "replayed",
            Self::Dropped => "dropped",
        }
    }

    /// The state named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Parked, Self::Replayed, Self::Dropped]
            .into_iter()
            .find(|state| state.as_str() == name)
    }
}

/// A message to park: whose consumer, what, why, after how many deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewParked {
    /// The consumer that could not apply it.
    pub consumer: Tenant,
    /// The message.
    pub message: InboundMessage,
    /// Why (the handler's last error, a version gap, ...).
    pub reason: String,
    /// How many times the broker delivered it.
    pub deliveries: u32,
}

/// A parked message as a parking store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedMessage {
    /// The consumer, the message, the reason and the deliveries.
    pub parked: NewParked,
    /// Where it stands.
    pub state: ParkedState,
    /// When it was (last) parked, by the store's clock.
    pub parked_at: Timestamp,
    /// When it was replayed or dropped.
    pub resolved_at: Option<Timestamp>,
    /// An operator's reason to drop it.
    pub resolution: Option<String>,
}

/// How an operator (or a replay) settles a parked message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// It was applied.
    Replayed,
    /// It is given up, for this reason.
    Dropped(String),
}

impl Resolution {
    /// The state it leaves an entry in.
    ///
    /// ```
    /// use idem_core::store::{ParkedState, Resolution};
    ///
    /// assert_eq!(Resolution::Replayed.state(), ParkedState::Replayed);
    /// assert_eq!(Resolution::Dropped("refunded".into()).reason(), Some("refunded"));
    /// ```
    pub fn state(&self) -> ParkedState {
        match self {
            Self::Replayed => ParkedState::Replayed,
            Self::Dropped(_) => ParkedState::Dropped,
        }
    }

    /// The operator's reason, for a drop.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Replayed => None,
            Self::Dropped(reason) => Some(reason),
        }
    }
}

/// The storage of a consumer's parked messages (`idem-consumer`).
///
/// # Contract
///
/// Each sentence is a case of the public parking suite in `idem-conformance`.
///
/// - **Park.** [`park`](Self::park) keeps a message of a consumer parked,
///   with its reason and deliveries, at the store's time. Parking a message
///   (consumer and id) that is there already parks it again with the new
///   reason and deliveries, whatever its state: there is one entry per
///   message.
/// - **Get.** [`get`](Self::get) reads one entry, in any state.
/// - **List.** [`parked`](Self::parked) lists a consumer's parked entries
///   (never another consumer's, never a resolved one), at most `limit`:
///   oldest first, or, for one aggregate, by version (versionless last, then
///   oldest first), the order a replay applies them in.
/// - **Resolve.** [`resolve`](Self::resolve) marks a parked entry replayed,
///   or dropped with the reason, at the store's time; it answers whether it
///   was parked (a resolved or absent entry changes nothing).
/// - **Purge.** [`purge_resolved`](Self::purge_resolved) deletes up to
///   `limit` resolved entries resolved longer than `older_than` ago, never a
///   parked one.
/// - **Count.** [`count`](Self::count) counts a consumer's parked entries.
///
/// # Cancellation
///
/// Each operation is one write that lands whole or not at all: a dropped
/// call leaves the entry as it was or as the call made it, and parking
/// again (as a redelivery does) is safe whichever it was.
#[async_trait]
pub trait ParkingStore: Send + Sync + fmt::Debug + 'static {
    /// Parks a message (again).
    async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError>;

    /// One entry.
    async fn get(
        &self,
        consumer: &Tenant,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError>;

    /// The parked entries `query` asks for.
    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError>;

    /// Resolves a parked entry; whether it was parked.
    async fn resolve(&self, entry: &Scope, resolution: &Resolution) -> Result<bool, StoreError>;

    /// Deletes up to `limit` entries resolved before `older_than` ago.
    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError>;

    /// How many entries a consumer has parked.
    async fn count(&self, consumer: &Tenant) -> Result<u64, StoreError>;

    /// What the store is.
    fn capabilities(&self) -> Capabilities;
}

/// What a version check found: the stored version of an aggregate against
/// the version an event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VersionCheck {
    /// The stored version is the event's predecessor: apply it.
    Apply,
    /// The stored version is at or past the event's: a duplicate or a stale
    /// event; acknowledge it and change nothing.
    Stale {
        /// The stored version (0 for none).
        current: u64,
    },
    /// The stored version is below the event's predecessor: an event before
    /// it is missing. Retry, then park; later versions wait behind it.
    Gap {
        /// The stored version (0 for none).
        current: u64,
    },
}

impl VersionCheck {
    /// The check of an event at `event` (1 or more) against the stored
    /// version `current` (0 when the aggregate has none yet).
    ///
    /// ```
    /// use idem_core::store::VersionCheck;
    ///
    /// assert_eq!(VersionCheck::of(3, 2), VersionCheck::Apply);
    /// assert_eq!(VersionCheck::of(3, 3), VersionCheck::Stale { current: 3 });
    /// assert_eq!(VersionCheck::of(3, 1), VersionCheck::Gap { current: 1 });
    /// ```
    pub fn of(event: u64, current: u64) -> Self {
        if current >= event {
            Self::Stale { current }
        } else if current + 1 == event {
            Self::Apply
        } else {
            Self::Gap { current }
        }
    }
}

/// A store's version check: moves an aggregate's stored version to an
/// event's when it holds the event's predecessor, inside the transaction
/// `Tx` that holds the handler's writes (so the move and the effect commit
/// together, and the conditional write serialises racing handlers of one
/// aggregate); otherwise reads the stored version and tells a stale event
/// from a gap ([`VersionCheck::of`]).
///
/// `idem_postgres::VersionedTable` and `idem_dynamo::VersionedItems` are
/// two, over a table of yours.
///
/// # Contract
///
/// - An aggregate with no stored version is at version 0: its event 1 is
///   [`VersionCheck::Apply`] (and the handler writes its first version).
/// - [`VersionCheck::Apply`] means the stored version is now the event's,
///   inside `tx`; the others change nothing. The version read after a
///   refused move is the latest committed one, never an older snapshot's.
#[async_trait]
pub trait VersionStore<Tx: Send + ?Sized>: Send + Sync + fmt::Debug + 'static {
    /// Moves `aggregate` to `version` if it holds `version - 1`.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for version 0; the store's failures.
    async fn advance(
        &self,
        tx: &mut Tx,
        aggregate: &str,
        version: u64,
    ) -> Result<VersionCheck, StoreError>;
}

/// Checks a listing or purge limit of a parking store: 1 to
/// [`MAX_OUTBOX_BATCH`](crate::store::MAX_OUTBOX_BATCH).
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside it.
pub fn validate_parking_batch(limit: usize) -> Result<usize, InvalidInput> {
    crate::outbox::validate_outbox_batch(limit)
}

/// What [`ParkingStore::parked`] looks for: a consumer's parked entries,
/// of one aggregate if given, at most `limit`.
///
/// ```
/// use idem_core::Tenant;
/// use idem_core::store::ParkedQuery;
///
/// # fn example() -> Result<(), idem_core::InvalidInput> {
/// let waiting = ParkedQuery::new(Tenant::new("shipping")?).of_aggregate("order-7").limit(10);
/// assert_eq!(waiting.aggregate.as_deref(), Some("order-7"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedQuery {
    /// The consumer whose entries are listed.
    pub consumer: Tenant,
    /// Only this aggregate's entries, by version, if given.
    pub aggregate: Option<String>,
    /// At most this many (1 to [`MAX_OUTBOX_BATCH`](crate::store::MAX_OUTBOX_BATCH):
    /// the store refuses others).
    pub limit: usize,
}

impl ParkedQuery {
    /// Every parked entry of `consumer`, oldest first, at most 100.
    pub fn new(consumer: Tenant) -> Self {
        Self {
            consumer,
            aggregate: None,
            limit: 100,
        }
    }

    /// Only `aggregate`'s entries, by version.
    #[must_use]
    pub fn of_aggregate(mut self, aggregate: &str) -> Self {
        self.aggregate = Some(aggregate.to_string());
        self
    }

    /// At most `limit`.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

#[async_trait]
impl<S: ParkingStore> ParkingStore for Layered<S> {
    async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError> {
        let done = self.get_ref().park(parked);
        self.layer().call(Operation::Park, None, done).await
    }

    async fn get(
        &self,
        consumer: &Tenant,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError> {
        let read = self.get_ref().get(consumer, id);
        self.layer().call(Operation::Get, None, read).await
    }

    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
        let listed = self.get_ref().parked(query);
        self.layer().call(Operation::List, None, listed).await
    }

    async fn resolve(&self, entry: &Scope, resolution: &Resolution) -> Result<bool, StoreError> {
        let done = self.get_ref().resolve(entry, resolution);
        self.layer().call(Operation::Resolve, None, done).await
    }

    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let purged = self.get_ref().purge_resolved(older_than, limit);
        self.layer().call(Operation::Purge, None, purged).await
    }

    async fn count(&self, consumer: &Tenant) -> Result<u64, StoreError> {
        let counted = self.get_ref().count(consumer);
        self.layer().call(Operation::Stats, None, counted).await
    }

    fn capabilities(&self) -> Capabilities {
        self.get_ref().capabilities()
    }
}

macro_rules! forward_parking {
    ($($ptr:ident),*) => {$(
        #[async_trait]
        impl<T: ParkingStore + ?Sized> ParkingStore for std::sync::$ptr<T> {
            async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError> {
                (**self).park(parked).await
            }
            async fn get(&self, consumer: &Tenant, id: &IdempotencyKey) -> Result<Option<ParkedMessage>, StoreError> {
                (**self).get(consumer, id).await
            }
            async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
                (**self).parked(query).await
            }
            async fn resolve(&self, entry: &Scope, resolution: &Resolution) -> Result<bool, StoreError> {
                (**self).resolve(entry, resolution).await
            }
            async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
                (**self).purge_resolved(older_than, limit).await
            }
            async fn count(&self, consumer: &Tenant) -> Result<u64, StoreError> {
                (**self).count(consumer).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
        }
    )*};
}

forward_parking!(Arc);

/// Implements [`ParkingStore`] for a type by forwarding every operation to
/// a field that is a parking store: `forward_parking_store!(MyParking =>
/// field)`, as [`forward_store!`](crate::store::forward_store) does for
/// [`IdempotencyStore`](crate::store::IdempotencyStore).
#[macro_export]
#[doc(hidden)]
macro_rules! __forward_parking_store {
    ($ty:ty => $field:ident) => {
        #[$crate::async_trait]
        impl $crate::store::ParkingStore for $ty {
            async fn park(
                &self,
                parked: &$crate::store::NewParked,
            ) -> ::core::result::Result<$crate::store::ParkedMessage, $crate::StoreError> {
                self.$field.park(parked).await
            }
            async fn get(
                &self,
                consumer: &$crate::Tenant,
                id: &$crate::IdempotencyKey,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::store::ParkedMessage>,
                $crate::StoreError,
            > {
                self.$field.get(consumer, id).await
            }
            async fn parked(
                &self,
                query: &$crate::store::ParkedQuery,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::ParkedMessage>,
                $crate::StoreError,
            > {
                self.$field.parked(query).await
            }
            async fn resolve(
                &self,
                entry: &$crate::Scope,
                resolution: &$crate::store::Resolution,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.resolve(entry, resolution).await
            }
            async fn purge_resolved(
                &self,
                older_than: ::core::time::Duration,
                limit: usize,
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.purge_resolved(older_than, limit).await
            }
            async fn count(
                &self,
                consumer: &$crate::Tenant,
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.count(consumer).await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
}
