//! `MemoryStore`: the records in a moka cache, each decision one
//! `and_compute_with` on the record's key; a transaction's commit writes
//! several keys at once behind the store's gate.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Clock, ExpireAfter, IdempotencyStore, Layered, Lease,
    Record, RecordState, Timestamp, TransactionSharing, check_response_size, decide, forward_store,
    validate_lease,
};
use idem_core::{
    Checkpoint, InvalidInput, Operation, Scope, StoreError, StoredResponse, async_trait,
};
use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;

use crate::options::MemoryOptions;
use crate::part::{STORE, capabilities, layered};

/// The in-process store. Cloning is cheap and shares the records.
///
/// Every operation goes through the store's
/// `OperationLayer` (its span and
/// metrics; no time limit, since nothing here waits).
#[derive(Clone)]
pub struct MemoryStore {
    records: Layered<Records>,
}

forward_store!(MemoryStore => records);

/// The records and the rules on them, inside the store's layer.
#[derive(Clone)]
pub(crate) struct Records {
    records: Cache<Key, Arc<Record>, KeyHash>,
    /// Every write of one record passes it shared; a transaction's commit,
    /// which writes several, alone: so no write lands between the commit's
    /// checks and its writes.
    gate: Arc<RwLock<()>>,
    /// Seeds the one SipHash of each operation's scope.
    hashing: RandomState,
    clock: Arc<dyn Clock>,
    max_response_bytes: usize,
}

/// A scope with its hash, computed once per operation: moka hashes the key
/// it is given more than once, and a scope is two strings.
#[derive(Clone)]
struct Key {
    hash: u64,
    scope: Scope,
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.scope == other.scope
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Hands moka the hash a [`Key`] carries (a randomly seeded SipHash, so
/// no client can choose colliding keys).
#[derive(Clone, Default)]
struct KeyHash;

impl BuildHasher for KeyHash {
    type Hasher = KeyHasher;

    fn build_hasher(&self) -> KeyHasher {
        KeyHasher(0)
    }
}

#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only a Key is hashed here, through write_u64; anything else still
        // gets a hash of all its bytes.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.records.fmt(f)
    }
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.records.entry_count())
            .field("clock", &self.clock)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl MemoryStore {
    /// A store on the system clock with the default limit.
    pub fn new() -> Self {
        Self::build(MemoryOptions::default())
    }

    /// A store built from `options`, as every store is.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] if the response limit is zero (use
    /// `usize::MAX` for none).
    pub fn with_options(options: MemoryOptions) -> Result<Self, StoreError> {
        if options.max_response_bytes == 0 {
            return Err(StoreError::InvalidInput(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "must be at least 1",
            }));
        }
        Ok(Self::build(options))
    }

    fn build(options: MemoryOptions) -> Self {
        let MemoryOptions {
            clock,
            max_response_bytes,
        } = options;
        let store_clock = Arc::clone(&clock);
        let records = Cache::builder()
            .expire_after(ExpireAfter::new(move |record: &Arc<Record>| {
                record
                    .retained_until()
                    .saturating_duration_since(store_clock.now())
            }))
            .build_with_hasher(KeyHash);
        let records = Records {
            records,
            gate: Arc::default(),
            hashing: RandomState::new(),
            clock,
            max_response_bytes,
        };
        Self {
            records: layered(records),
        }
    }
}

impl MemoryStore {
    /// The records, for a transaction on them.
    pub(crate) fn records(&self) -> &Records {
        self.records.get_ref()
    }
}

impl Records {
    fn key(&self, scope: &Scope) -> Key {
        Key {
            hash: self.hashing.hash_one(scope),
            scope: scope.clone(),
        }
    }

    /// Runs `change` on the record only while `lease` holds it, atomically
    /// with respect to every other operation on the scope. Where the lease no
    /// longer holds, `done_before` says whether the record shows this very
    /// operation already done (a second delivery), which answers `Ok`.
    fn fenced(
        &self,
        lease: &Lease,
        change: impl FnOnce(&Record, Timestamp) -> Op<Arc<Record>>,
        done_before: impl FnOnce(Option<&Record>, Timestamp) -> bool,
    ) -> Result<(), StoreError> {
        let now = self.clock.now();
        let mut answered = false;
        let _writing = self.writing();
        self.records
            .entry(self.key(lease.scope()))
            .and_compute_with(|entry| match entry {
                Some(entry) if entry.value().is_held_by(lease, now) => {
                    answered = true;
                    change(entry.value(), now)
                }
                entry => {
                    answered = done_before(entry.as_ref().map(|e| e.value().as_ref()), now);
                    Op::Nop
                }
            });
        if answered {
            Ok(())
        } else {
            Err(StoreError::LostLease)
        }
    }

    /// A write of one record may proceed (no commit is writing).
    fn writing(&self) -> RwLockReadGuard<'_, ()> {
        // The gate guards no data: a panic while it was held leaves
        // nothing half done to refuse.
        self.gate
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub(crate) fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// The live record of `scope`, as stored.
    pub(crate) fn read(&self, scope: &Scope) -> Option<Arc<Record>> {
        let now = self.clock.now();
        self.records
            .get(&self.key(scope))
            .filter(|record| record.is_live(now))
    }

    /// Writes each record over the one read before (`None`: no live
    /// record), and runs `effects` between the checks and the writes, all
    /// while no other write can land; or, if any record changed since it
    /// was read, writes nothing and answers its place among `writes`. A
    /// fenced write (of a lease claimed outside the transaction) asks only
    /// that its owner still holds the record: the owner's own renewal or
    /// checkpoint since is no change, and a record it leaves in flight
    /// keeps the lease as renewed.
    pub(crate) fn commit(
        &self,
        writes: Vec<(Option<Arc<Record>>, Record, bool)>,
        effects: impl FnOnce(),
    ) -> Result<(), usize> {
        let _alone = self
            .gate
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut landing = Vec::with_capacity(writes.len());
        for (at, (read, record, fenced)) in writes.into_iter().enumerate() {
            let current = self.read(record.scope());
            let record = match (read, current) {
                (Some(_), Some(current)) if fenced => {
                    if !current.is_in_flight() || current.owner() != record.owner() {
                        return Err(at);
                    }
                    match record.is_in_flight() {
                        true => record
                            .with_state(current.state().clone())
                            .with_retained_until(current.retained_until()),
                        false => record,
                    }
                }
                (Some(read), Some(current)) if Arc::ptr_eq(&read, &current) => record,
                (None, None) => record,
                _ => return Err(at),
            };
            landing.push(record);
        }
        effects();
        for record in landing {
            let key = self.key(record.scope());
            self.records.insert(key, Arc::new(record));
        }
        Ok(())
    }

    fn updated(record: &Record, edit: impl FnOnce(Record) -> Record) -> Op<Arc<Record>> {
        Op::Put(Arc::new(edit(record.clone())))
    }
}

#[async_trait]
impl IdempotencyStore for Records {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now();
        let key = self.key(request.scope());
        // A decision that writes nothing (a replay, a mismatch, a duplicate
        // in flight) holds at the instant the record is read: it needs no
        // lock on the entry. One that writes decides again under it.
        if let Some(existing) = self.records.get(&key) {
            let decision = decide(Some(&existing), request, now);
            if decision.write.is_none() {
                return Ok(decision.outcome);
            }
        }
        let mut outcome = None;
        let _writing = self.writing();
        self.records.entry(key).and_compute_with(|entry| {
            let existing = entry.map(|e| e.into_value());
            let decision = decide(existing.as_deref(), request, now);
            outcome = Some(decision.outcome);
            match decision.write {
                Some(record) => Op::Put(Arc::new(record)),
                None => Op::Nop,
            }
        });
        outcome.ok_or_else(|| {
            StoreError::backend(STORE, Operation::Claim, "moka did not run the claim")
        })
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        check_response_size(response, self.max_response_bytes)?;
        self.fenced(
            lease,
            |record, now| {
                Self::updated(record, |r| {
                    r.completed(response.clone(), now + lease.retention())
                })
            },
            |record, now| {
                record.is_some_and(|r| r.is_live(now) && r.is_completed_by(lease, response))
            },
        )
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = validate_lease(extend)?;
        let mut renewed = None;
        self.fenced(
            lease,
            |record, now| {
                let until = now + extend;
                renewed = Some(lease.renewed(until));
                Self::updated(record, |r| {
                    let retained_until = r.retained_until().max(until);
                    r.with_state(RecordState::InFlight {
                        lease_expires_at: until,
                    })
                    .with_retained_until(retained_until)
                })
            },
            |_, _| false,
        )?;
        renewed.ok_or(StoreError::LostLease)
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        // A record nobody holds (released already, or past retention) is
        // what a release leaves: answer as the first delivery did.
        self.fenced(
            lease,
            |_, _| Op::Remove,
            |record, now| record.is_none_or(|r| !r.is_live(now)),
        )
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.fenced(
            lease,
            |record, _| Self::updated(record, |r| r.with_checkpoint(Some(checkpoint.clone()))),
            |_, _| false,
        )
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let now = self.clock.now();
        Ok(self
            .records
            .get(&self.key(scope))
            .filter(|r| r.is_live(now))
            .map(|r| (*r).clone()))
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let expired: Vec<Arc<Key>> = self
            .records
            .iter()
            .filter(|(_, record)| !record.is_live(now))
            .map(|(key, _)| key)
            .collect();
        let mut removed = 0;
        let _writing = self.writing();
        for key in expired {
            let result =
                self.records
                    .entry(Key::clone(&key))
                    .and_compute_with(|entry| match entry {
                        Some(e) if !e.value().is_live(now) => Op::Remove,
                        _ => Op::Nop,
                    });
            if matches!(result, CompResult::Removed(_)) {
                removed += 1;
            }
        }
        self.records.run_pending_tasks();
        Ok(removed)
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let _writing = self.writing();
        Ok(self
            .records
            .remove(&self.key(scope))
            .is_some_and(|r| r.is_live(now)))
    }

    async fn now(&self, _scope: &Scope) -> Result<Timestamp, StoreError> {
        Ok(self.clock.now())
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = capabilities(self.max_response_bytes);
        // Its records commit with the caller's writes (MemoryStore::begin).
        capabilities.transactions = TransactionSharing::InProcess;
        capabilities
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::Fingerprint;
    use idem_core::ManualClock;
    use idem_core::store::{ClockSource, Durability, TransactionSharing};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    fn request(key: &str, retention: Duration) -> ClaimRequest {
        ClaimRequest::new(Scope::parse("t", key).unwrap(), Fingerprint::of_bytes(b"x"))
            .with_lease(Duration::from_secs(10))
            .unwrap()
            .with_retention(retention)
            .unwrap()
    }

    #[test]
    fn manual_clock_drives_takeover_without_waiting() {
        runtime().block_on(async {
            let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000));
            let store =
                MemoryStore::with_options(MemoryOptions::default().clock(clock.clone())).unwrap();
            let req = request("k", Duration::from_secs(3600));
            assert!(matches!(
                store.claim(&req).await.unwrap(),
                ClaimOutcome::Claimed { .. }
            ));
            let retry = req.clone().with_new_owner();
            assert!(matches!(
                store.claim(&retry).await.unwrap(),
                ClaimOutcome::InProgress { .. }
            ));
            clock.advance(Duration::from_secs(10));
            let ClaimOutcome::Claimed { lease, .. } = store.claim(&retry).await.unwrap() else {
                panic!("expected takeover");
            };
            assert_eq!(lease.attempt(), 2);
        });
    }

    #[test]
    fn purge_counts_exactly_the_records_past_retention() {
        runtime().block_on(async {
            let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000));
            let store =
                MemoryStore::with_options(MemoryOptions::default().clock(clock.clone())).unwrap();
            for key in ["a", "b", "c"] {
                store
                    .claim(&request(key, Duration::from_secs(60)))
                    .await
                    .unwrap();
            }
            store
                .claim(&request("live", Duration::from_secs(3600)))
                .await
                .unwrap();
            clock.advance(Duration::from_secs(61));
            assert_eq!(store.purge_expired().await.unwrap(), 3);
            assert_eq!(store.purge_expired().await.unwrap(), 0);
            assert!(
                store
                    .get(&Scope::parse("t", "live").unwrap())
                    .await
                    .unwrap()
                    .is_some()
            );
            assert_eq!(store.records.get_ref().records.iter().count(), 1);
        });
    }

    #[test]
    fn response_limit_is_configurable_and_advertised() {
        let store =
            MemoryStore::with_options(MemoryOptions::default().max_response_bytes(10)).unwrap();
        assert_eq!(store.capabilities().max_response_bytes, 10);
        assert_eq!(store.capabilities().clock, ClockSource::Caller);
        assert_eq!(store.capabilities().durability, Durability::Volatile);
        assert_eq!(
            store.capabilities().transactions,
            TransactionSharing::InProcess
        );
    }
}
