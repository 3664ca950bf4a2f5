//! A parking store of one's own, written against [`idem_core::store`]
//! alone, with the realistic bugs the public parking suite must catch.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    Capabilities, Clock, ClockSource, Durability, NewParked, ParkedMessage, ParkedQuery,
    ParkedState, ParkingStore, Resolution, SystemClock, TransactionSharing, validate_parking_batch,
};
use idem_core::{ConsumerName, IdempotencyKey, StoreError, async_trait};

/// A deliberate bug of a parking store, for proving that the parking suite
/// catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParkingDefect {
    /// No bug: the store keeps the whole contract.
    None,
    /// Adds a second entry when a message is parked again.
    ParksTwice,
    /// Keeps the first reason when a message is parked again.
    KeepsTheFirstReason,
    /// Leaves a resolved entry resolved when it is parked again.
    ResolvedStaysResolved,
    /// Lists every consumer's entries.
    ListsOtherConsumers,
    /// Lists resolved entries as if parked.
    ListsResolved,
    /// Lists an aggregate by time, not by version.
    IgnoresVersions,
    /// Lists newest first.
    NewestFirst,
    /// Returns every entry, whatever the limit.
    IgnoresLimit,
    /// Resolves a resolved entry again and says it did.
    ResolvesTwice,
    /// Forgets the reason an entry was dropped for.
    ForgetsDropReason,
    /// Purges parked entries too.
    PurgesParked,
    /// Ignores `older_than` when purging.
    PurgeIgnoresAge,
    /// Counts resolved entries too.
    CountsResolved,
    /// Accepts any limit.
    LimitUnchecked,
    /// Keeps the first `parked_at` when a message is parked again.
    ReparkKeepsParkedAt,
    /// Keeps one entry per id, whatever the consumer.
    IgnoresConsumerInKey,
    /// Parks again in two writes, deleting the entry and then writing the
    /// new one, so a call dropped between them leaves none.
    ReparkDeletesThenInserts,
    /// Lists a consumer's entries by version too, not by age alone.
    ListsByVersion,
    /// Purges one entry more than its limit.
    PurgesPastItsLimit,
}

/// The parking store: a list under one lock, on the system clock.
pub struct OwnParking {
    entries: Mutex<Vec<ParkedMessage>>,
    clock: SystemClock,
    defect: ParkingDefect,
}

impl std::fmt::Debug for OwnParking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnParking")
            .field("defect", &self.defect)
            .finish_non_exhaustive()
    }
}

impl Default for OwnParking {
    fn default() -> Self {
        Self::with_defect(ParkingDefect::None)
    }
}

impl OwnParking {
    /// A correct store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `defect`.
    pub fn with_defect(defect: ParkingDefect) -> Self {
        Self {
            entries: Mutex::default(),
            clock: SystemClock,
            defect,
        }
    }

    fn locked(&self) -> MutexGuard<'_, Vec<ParkedMessage>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is(&self, defect: ParkingDefect) -> bool {
        self.defect == defect
    }

    fn matches(&self, entry: &ParkedMessage, consumer: &ConsumerName, id: &IdempotencyKey) -> bool {
        entry.parked.message.id() == id
            && (&entry.parked.consumer == consumer || self.is(ParkingDefect::IgnoresConsumerInKey))
    }

    fn checked(&self, limit: usize) -> Result<usize, StoreError> {
        if self.is(ParkingDefect::LimitUnchecked) {
            return Ok(limit.max(1));
        }
        Ok(validate_parking_batch(limit)?)
    }
}

#[async_trait]
impl ParkingStore for OwnParking {
    async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError> {
        if self.is(ParkingDefect::ReparkDeletesThenInserts) {
            self.locked()
                .retain(|e| !self.matches(e, &parked.consumer, parked.message.id()));
            // The second write's round trip.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let now = self.clock.now();
        let mut entries = self.locked();
        let existing = entries
            .iter_mut()
            .find(|e| self.matches(e, &parked.consumer, parked.message.id()));
        match existing {
            Some(entry) if !self.is(ParkingDefect::ParksTwice) => {
                if !self.is(ParkingDefect::KeepsTheFirstReason) {
                    entry.parked = parked.clone();
                }
                if !self.is(ParkingDefect::ResolvedStaysResolved) {
                    entry.state = ParkedState::Parked;
                    entry.resolved_at = None;
                    entry.resolution = None;
                }
                if !self.is(ParkingDefect::ReparkKeepsParkedAt) {
                    entry.parked_at = now;
                }
                Ok(entry.clone())
            }
            _ => {
                let entry = ParkedMessage {
                    parked: parked.clone(),
                    state: ParkedState::Parked,
                    parked_at: now,
                    resolved_at: None,
                    resolution: None,
                };
                entries.push(entry.clone());
                Ok(entry)
            }
        }
    }

    async fn get(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError> {
        let entries = self.locked();
        Ok(entries
            .iter()
            .find(|e| self.matches(e, consumer, id))
            .cloned())
    }

    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
        let (consumer, aggregate, limit) =
            (&query.consumer, query.aggregate.as_deref(), query.limit);
        let limit = self.checked(limit)?;
        let mut found: Vec<ParkedMessage> = self
            .locked()
            .iter()
            .filter(|e| {
                &e.parked.consumer == consumer || self.is(ParkingDefect::ListsOtherConsumers)
            })
            .filter(|e| e.state == ParkedState::Parked || self.is(ParkingDefect::ListsResolved))
            .filter(|e| aggregate.is_none() || e.parked.message.aggregate() == aggregate)
            .cloned()
            .collect();
        let by_version = (aggregate.is_some() || self.is(ParkingDefect::ListsByVersion))
            && !self.is(ParkingDefect::IgnoresVersions);
        found.sort_by_key(|e| {
            let version = by_version.then(|| e.parked.message.version().unwrap_or(u64::MAX));
            (version, e.parked_at)
        });
        if self.is(ParkingDefect::NewestFirst) {
            found.reverse();
        }
        if !self.is(ParkingDefect::IgnoresLimit) {
            found.truncate(limit);
        }
        Ok(found)
    }

    async fn resolve(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut entries = self.locked();
        let Some(entry) = entries.iter_mut().find(|e| self.matches(e, consumer, id)) else {
            return Ok(false);
        };
        if entry.state != ParkedState::Parked && !self.is(ParkingDefect::ResolvesTwice) {
            return Ok(false);
        }
        entry.state = resolution.state();
        entry.resolution = resolution
            .reason()
            .filter(|_| !self.is(ParkingDefect::ForgetsDropReason))
            .map(str::to_string);
        entry.resolved_at = Some(now);
        Ok(true)
    }

    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = self.checked(limit)?;
        let now = self.clock.now();
        let mut entries = self.locked();
        let mut purged = 0;
        entries.retain(|e| {
            let old = match e.resolved_at {
                Some(at) => {
                    now.saturating_duration_since(at) >= older_than
                        || self.is(ParkingDefect::PurgeIgnoresAge)
                }
                None => self.is(ParkingDefect::PurgesParked),
            };
            let room = limit + usize::from(self.is(ParkingDefect::PurgesPastItsLimit));
            if old && purged < room {
                purged += 1;
                return false;
            }
            true
        });
        Ok(purged as u64)
    }

    async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError> {
        let entries = self.locked();
        let counted = entries.iter().filter(|e| {
            &e.parked.consumer == consumer
                && (e.state == ParkedState::Parked || self.is(ParkingDefect::CountsResolved))
        });
        Ok(counted.count() as u64)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            "ownparking",
            TransactionSharing::None,
            Durability::Volatile,
            ClockSource::Caller,
            usize::MAX,
        )
    }
}
