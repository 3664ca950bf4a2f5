//! `MemoryParking`: a consumer's parked messages in process, on the
//! caller's clock.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    Capabilities, Clock, ClockSource, Durability, Layered, NewParked, OperationLayer,
    ParkedMessage, ParkedQuery, ParkedState, ParkingStore, Resolution, SystemClock,
    TransactionSharing, forward_parking_store, validate_parking_batch,
};
use idem_core::{ConsumerName, IdempotencyKey, StoreError, async_trait};

use crate::part::STORE;

/// An in-process parking store: tests, examples and single-process
/// consumers. The caller's [`Clock`] stamps entries. Every operation holds
/// one lock, so each is atomic. Cloning is cheap and shares the entries.
///
/// ```
/// use idem_core::ConsumerName;
/// use idem_core::store::{InboundMessage, NewParked, ParkingStore};
/// use idem_memory::MemoryParking;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let parking = MemoryParking::new();
/// let consumer = ConsumerName::new("billing")?;
/// let message = InboundMessage::new("m-1", "order.placed", b"{}".to_vec())?;
/// parking
///     .park(&NewParked { consumer: consumer.clone(), message, reason: "bad total".into(), deliveries: 5 })
///     .await?;
/// assert_eq!(parking.count(&consumer).await?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct MemoryParking {
    entries: Layered<Entries>,
}

forward_parking_store!(MemoryParking => entries);

/// Entries by consumer and message id.
type Map = BTreeMap<(ConsumerName, IdempotencyKey), ParkedMessage>;

#[derive(Clone)]
struct Entries {
    map: Arc<Mutex<Map>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Entries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryParking")
            .field("entries", &self.locked().len())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Default for MemoryParking {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryParking {
    /// An empty parking store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// An empty parking store on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        let entries = Entries {
            map: Arc::default(),
            clock: Arc::new(clock),
        };
        Self {
            entries: Layered::with_layer(entries, OperationLayer::unlimited(STORE)),
        }
    }
}

impl Entries {
    fn locked(&self) -> MutexGuard<'_, Map> {
        // A panic elsewhere cannot leave an entry half-written: keep using it.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl ParkingStore for Entries {
    async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError> {
        let entry = ParkedMessage {
            parked: parked.clone(),
            state: ParkedState::Parked,
            parked_at: self.clock.now(),
            resolved_at: None,
            resolution: None,
        };
        let key = (parked.consumer.clone(), parked.message.id().clone());
        self.locked().insert(key, entry.clone());
        Ok(entry)
    }

    async fn get(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError> {
        Ok(self.locked().get(&(consumer.clone(), id.clone())).cloned())
    }

    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
        let (consumer, aggregate, limit) =
            (&query.consumer, query.aggregate.as_deref(), query.limit);
        let limit = validate_parking_batch(limit)?;
        let mut found: Vec<ParkedMessage> = self
            .locked()
            .values()
            .filter(|e| &e.parked.consumer == consumer && e.state == ParkedState::Parked)
            .filter(|e| aggregate.is_none() || e.parked.message.aggregate() == aggregate)
            .cloned()
            .collect();
        found.sort_by_key(|e| {
            let version = aggregate.map(|_| e.parked.message.version().unwrap_or(u64::MAX));
            (version, e.parked_at, e.parked.message.id().clone())
        });
        found.truncate(limit);
        Ok(found)
    }

    async fn resolve(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut map = self.locked();
        let Some(entry) = map
            .get_mut(&(consumer.clone(), id.clone()))
            .filter(|e| e.state == ParkedState::Parked)
        else {
            return Ok(false);
        };
        entry.state = resolution.state();
        entry.resolution = resolution.reason().map(str::to_string);
        entry.resolved_at = Some(now);
        Ok(true)
    }

    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = validate_parking_batch(limit)?;
        let now = self.clock.now();
        let mut map = self.locked();
        let due: Vec<_> = map
            .iter()
            .filter(|(_, e)| {
                e.resolved_at
                    .is_some_and(|at| now.saturating_duration_since(at) >= older_than)
            })
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect();
        for key in &due {
            map.remove(key);
        }
        Ok(due.len() as u64)
    }

    async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError> {
        let map = self.locked();
        let parked = map
            .values()
            .filter(|e| &e.parked.consumer == consumer && e.state == ParkedState::Parked);
        Ok(parked.count() as u64)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            STORE,
            TransactionSharing::None,
            Durability::Volatile,
            ClockSource::Caller,
            usize::MAX,
        )
    }
}
