//! The parking store: the deliveries a consumer could not apply, kept
//! with their reason for an operator to list, replay or drop.

use crate::parking::message::InboundMessage;
use crate::plumbing::capabilities::Capabilities;
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::{InvalidInput, Operation, StoreError};
use crate::plumbing::layer::Layered;
use crate::plumbing::scope::{ConsumerName, IdempotencyKey};
use async_trait::async_trait;
use std::fmt;
use std::time::Duration;

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
    pub consumer: ConsumerName,
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
///   reason and deliveries, whatever its state, stamped with the store's
///   time anew (the listing by age puts it after the entries parked in
///   between): there is one entry per message.
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
        consumer: &ConsumerName,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError>;

    /// The parked entries `query` asks for.
    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError>;

    /// Resolves a consumer's parked entry; whether it was parked.
    async fn resolve(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
        resolution: &Resolution,
    ) -> Result<bool, StoreError>;

    /// Deletes up to `limit` entries resolved before `older_than` ago.
    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError>;

    /// How many entries a consumer has parked.
    async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError>;

    /// What the store is.
    fn capabilities(&self) -> Capabilities;
}

/// Checks a listing or purge limit of a parking store: 1 to
/// [`MAX_OUTBOX_BATCH`](crate::store::MAX_OUTBOX_BATCH).
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside it.
pub fn validate_parking_batch(limit: usize) -> Result<usize, InvalidInput> {
    crate::plumbing::limits::validate_outbox_batch(limit)
}

/// What [`ParkingStore::parked`] looks for: a consumer's parked entries,
/// of one aggregate if given, at most `limit`.
///
/// ```
/// use idem_core::ConsumerName;
/// use idem_core::store::ParkedQuery;
///
/// # fn example() -> Result<(), idem_core::InvalidInput> {
/// let waiting = ParkedQuery::new(ConsumerName::new("shipping")?).of_aggregate("order-7").limit(10);
/// assert_eq!(waiting.aggregate.as_deref(), Some("order-7"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedQuery {
    /// The consumer whose entries are listed.
    pub consumer: ConsumerName,
    /// Only this aggregate's entries, by version, if given.
    pub aggregate: Option<String>,
    /// At most this many (1 to [`MAX_OUTBOX_BATCH`](crate::store::MAX_OUTBOX_BATCH):
    /// the store refuses others).
    pub limit: usize,
}

impl ParkedQuery {
    /// Every parked entry of `consumer`, oldest first, at most 100.
    pub fn new(consumer: ConsumerName) -> Self {
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
        consumer: &ConsumerName,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError> {
        let read = self.get_ref().get(consumer, id);
        self.layer().call(Operation::Get, None, read).await
    }

    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
        let listed = self.get_ref().parked(query);
        self.layer().call(Operation::List, None, listed).await
    }

    async fn resolve(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let done = self.get_ref().resolve(consumer, id, resolution);
        self.layer().call(Operation::Resolve, None, done).await
    }

    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let purged = self.get_ref().purge_resolved(older_than, limit);
        self.layer().call(Operation::Purge, None, purged).await
    }

    async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError> {
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
            async fn get(&self, consumer: &ConsumerName, id: &IdempotencyKey) -> Result<Option<ParkedMessage>, StoreError> {
                (**self).get(consumer, id).await
            }
            async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
                (**self).parked(query).await
            }
            async fn resolve(&self, consumer: &ConsumerName, id: &IdempotencyKey, resolution: &Resolution) -> Result<bool, StoreError> {
                (**self).resolve(consumer, id, resolution).await
            }
            async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
                (**self).purge_resolved(older_than, limit).await
            }
            async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError> {
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
                consumer: &$crate::ConsumerName,
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
                consumer: &$crate::ConsumerName,
                id: &$crate::IdempotencyKey,
                resolution: &$crate::store::Resolution,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.resolve(consumer, id, resolution).await
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
                consumer: &$crate::ConsumerName,
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.count(consumer).await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
}
