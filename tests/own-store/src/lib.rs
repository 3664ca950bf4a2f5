//! # idem-own-store
//!
//! A store of one's own, written against [`idem_core::store`] alone (the
//! trait, the record, [`decide`] and the contract
//! in its documentation), the way a user writes one for a backend idem does
//! not ship. It passes the whole `idem-conformance` suite (see
//! `tests/conformance.rs`); each [`Defect`] is a realistic bug that the suite
//! must catch, which `idem-conformance`'s own tests prove.

mod journal;
mod outbox;
mod parking;
mod transaction;

pub use journal::{JournalDefect, OwnJournal};
pub use outbox::{OutboxDefect, OwnOutbox};
pub use parking::{OwnParking, ParkingDefect};
pub use transaction::{BatchDefect, OwnTransaction};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Clock, ClockSource, Durability, IdempotencyStore,
    Lease, Record, RecordState, SystemClock, Timestamp, TransactionSharing, decide, retry_after,
    validate_lease,
};
use idem_core::{Checkpoint, Scope, StoreError, StoredResponse, async_trait};

/// A deliberate bug, for proving that the conformance suite catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Defect {
    /// No bug: the store keeps the whole contract.
    None,
    /// Reads, yields, then writes: two racing claims both win.
    NonAtomicClaim,
    /// Completes whoever asks, owner or not.
    CompleteIgnoresOwner,
    /// Compares no fingerprints: a reused key replays someone else's response.
    FingerprintIgnored,
    /// Renews whoever asks.
    RenewIgnoresOwner,
    /// Keeps records past retention.
    IgnoresRetention,
    /// Drops the checkpoint on takeover.
    CheckpointNotCarried,
    /// Stores the response body as lossy UTF-8.
    TextOnlyBodies,
    /// Keeps the claim's retention at completion instead of counting it again.
    CompletionKeepsClaimRetention,
    /// Moves the lease on renewal but leaves retention where it was.
    RenewKeepsRetention,
    /// Renews from the old expiry instead of from now.
    RenewFromOldExpiry,
    /// Accepts any `extend`, however out of range.
    RenewUnchecked,
    /// Sweeps in-flight records whose lease expired, though within retention.
    PurgeExpiredLeases,
    /// Fences on owner and state alone: writes land on records past retention.
    FencedWritesIgnoreRetention,
    /// Takes checkpoints on completed records.
    CheckpointAfterCompletion,
    /// Tells duplicates to wait the whole lease, not what remains of it.
    RetryAfterFullLease,
    /// Reads and writes a claim under two acquisitions of the lock. (A hook
    /// holds each claim between the two until a rival has read as well, so
    /// the race happens whenever two claims meet, not now and then.)
    CheckThenInsert,
    /// Decides takeovers of an expired lease under one acquisition of the
    /// lock and writes them under another (fresh claims are atomic), held
    /// between the two by the same hook.
    TakeoverCheckThenInsert,
    /// Answers its own claim, delivered again, as another caller's: in progress.
    ClaimRedeliveryIsInProgress,
    /// Answers its own completion, delivered again, as a lost lease.
    CompleteRedeliveryIsLost,
    /// Answers a release of a record nobody holds as a lost lease.
    ReleaseRedeliveryIsLost,
    /// Deletes only in-flight records (a tool for stuck keys), leaving
    /// completed ones to replay.
    DeleteOnlyInFlight,
    /// Deletes by expiring the lease instead of removing the record: the
    /// next claim is a takeover, and the old owner can still complete.
    DeleteExpiresLease,
    /// Reports a record past retention, which counts as absent, as deleted.
    DeleteCountsExpired,
    /// Deletes the key in every tenant.
    DeleteIgnoresTenant,
    /// Answers `now` from a clock an hour behind the one that judges records.
    NowFromAnotherClock,
    /// Restarts the lease when its owner's claim is delivered again.
    ClaimRedeliveryRestartsLease,
    /// Takes its owner's claim, delivered again after the lease expired, as a
    /// takeover at the next attempt.
    ClaimRedeliveryAfterExpiryTakesOver,
    /// Lets only a valid lease renew, checkpoint or release: an expired lease
    /// nobody took over is refused (completion alone still goes through).
    FencingNeedsAValidLease,
    /// Answers a completion with the stored response as delivered again,
    /// whoever the owner: a stale owner's completion succeeds.
    CompleteRedeliveryIgnoresOwner,
    /// Fences renewals and checkpoints on the lease's expiry as well as its
    /// owner, so one delivered again after the expiry moved is refused.
    FencesOnLeaseExpiry,
    /// Retains a completed record for the later of the retention from
    /// completion and the claim's retention.
    CompletionKeepsTheLaterRetention,
    /// Keeps the retention of the claim a takeover took over (stretched to
    /// the new lease) instead of counting it from the takeover.
    TakeoverKeepsRetention,
    /// Keeps the checkpoint on a completed record.
    CompletionKeepsCheckpoint,
    /// Deletes every key of the tenant that begins with the key deleted.
    DeleteByKeyPrefix,
    /// Names itself by its Rust type, not by one short lowercase word.
    StoreNamedAfterItsType,
    /// Answers its owner's claim, delivered again, as the first claim was
    /// answered, not with the lease as it stands now.
    ClaimRedeliveryAnswersTheFirstClaim,
    /// Writes its owner's claim, delivered again after the lease expired,
    /// afresh: the checkpoint is lost.
    ClaimRedeliveryAfterExpiryDropsCheckpoint,
    /// Restarts the retention when a completion is delivered again.
    CompleteRedeliveryRestartsRetention,
    /// Retains a takeover for its retention alone, even when its lease is
    /// longer.
    TakeoverRetainsForTheRetentionAlone,
    /// Deletes every key of the tenant equal to the one deleted but for
    /// ASCII case.
    DeleteIgnoresCase,
    /// Decides claims of a record past retention (still stored) under one
    /// acquisition of the lock and writes them under another, held between
    /// the two by the racy defects' hook.
    ExpiredRecordCheckThenInsert,
    /// Names each instance apart: `own0`, `own1`, ...
    NameCountsInstances,
    /// Checks a completion's fence under one acquisition of the lock and
    /// writes it under another, a moment later.
    CompleteCheckThenWrite,
}

/// The names of [`Defect::NameCountsInstances`]'s instances.
const COUNTED_NAMES: [&str; 8] = [
    "own0", "own1", "own2", "own3", "own4", "own5", "own6", "own7",
];

/// Instances built so far, for [`Defect::NameCountsInstances`].
static INSTANCES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How long a claim of a racy defect waits between its read and its write
/// for a rival claim of the same scope to read as well.
const RIVAL_WAIT: Duration = Duration::from_millis(250);

/// The hook of the racy defects: operations on a key (a scope, a journal
/// operation, or `()` for a whole outbox) between their read and their
/// write.
#[derive(Debug)]
pub(crate) struct Rivals<K = Scope> {
    reading: Mutex<HashMap<K, usize>>,
    arrived: tokio::sync::Notify,
}

impl<K> Default for Rivals<K> {
    fn default() -> Self {
        Self {
            reading: Mutex::new(HashMap::new()),
            arrived: tokio::sync::Notify::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Rivals<K> {
    fn reading(&self) -> std::sync::MutexGuard<'_, HashMap<K, usize>> {
        self.reading.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks an operation on `scope` as read and waits, up to
    /// [`RIVAL_WAIT`], until another on it has read too; it counts as
    /// reading until the returned guard drops, after its write.
    pub(crate) async fn meet(&self, scope: &K) -> Reading<'_, K> {
        let deadline = tokio::time::Instant::now() + RIVAL_WAIT;
        *self.reading().entry(scope.clone()).or_default() += 1;
        self.arrived.notify_waiters();
        loop {
            let mut arrival = std::pin::pin!(self.arrived.notified());
            arrival.as_mut().enable();
            if self.reading().get(scope).is_some_and(|n| *n >= 2) {
                break;
            }
            if tokio::time::timeout_at(deadline, arrival).await.is_err() {
                break;
            }
        }
        Reading {
            rivals: self,
            scope: scope.clone(),
        }
    }
}

/// An operation between its read and its write, as [`Rivals::meet`] counts it.
pub(crate) struct Reading<'a, K: std::hash::Hash + Eq + Clone = Scope> {
    rivals: &'a Rivals<K>,
    scope: K,
}

impl<K: std::hash::Hash + Eq + Clone> Drop for Reading<'_, K> {
    fn drop(&mut self) {
        let mut reading = self.rivals.reading();
        if let Some(n) = reading.get_mut(&self.scope) {
            *n -= 1;
            if *n == 0 {
                reading.remove(&self.scope);
            }
        }
    }
}

/// Which fenced write [`OwnStore::fenced`] performs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fenced<'a> {
    Complete(&'a StoredResponse),
    Renew,
    Checkpoint,
}

/// A store of one's own: a `Mutex<HashMap>` written from the
/// [`idem_core::store`] documentation alone, as a user would write one.
#[derive(Debug)]
pub struct OwnStore {
    /// Shared with the store's transactions ([`OwnStore::begin`]).
    records: Arc<Mutex<HashMap<Scope, Record>>>,
    batch_defect: BatchDefect,
    rivals: Rivals,
    defect: Defect,
    max_response_bytes: usize,
    /// This instance's number among those built.
    instance: usize,
    /// The first answer of each claim, for
    /// [`Defect::ClaimRedeliveryAnswersTheFirstClaim`].
    first_answers: Mutex<HashMap<(Scope, idem_core::store::OwnerToken), ClaimOutcome>>,
}

impl Default for OwnStore {
    fn default() -> Self {
        Self::new()
    }
}

impl OwnStore {
    /// A correct store.
    pub fn new() -> Self {
        Self::with_defect(Defect::None)
    }

    /// A store with one deliberate bug.
    pub fn with_defect(defect: Defect) -> Self {
        Self {
            records: Arc::default(),
            batch_defect: BatchDefect::None,
            rivals: Rivals::default(),
            defect,
            max_response_bytes: 64 * 1024,
            instance: INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            first_answers: Mutex::new(HashMap::new()),
        }
    }

    /// The same store whose transactions have one deliberate bug.
    pub fn with_batch_defect(mut self, defect: BatchDefect) -> Self {
        self.batch_defect = defect;
        self
    }

    /// Opens a transaction that batches, on the same records.
    pub fn begin(&self) -> OwnTransaction {
        OwnTransaction::new(self.records.clone(), self.batch_defect)
    }

    /// The same store with another response limit (`usize::MAX`: none).
    pub fn with_max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
        self
    }

    fn now(&self) -> Timestamp {
        SystemClock.now()
    }

    fn live(&self, record: Option<&Record>, now: Timestamp) -> Option<Record> {
        let record = record?.clone();
        if self.defect == Defect::IgnoresRetention || record.is_live(now) {
            let retained_until = record.retained_until().max(now + Duration::from_millis(1));
            Some(record.with_retained_until(retained_until))
        } else {
            None
        }
    }

    /// Whether [`Defect::FencingNeedsAValidLease`] refuses an owner whose
    /// lease on `record` has expired.
    fn refuses_expired(&self, record: &Record, now: Timestamp) -> bool {
        self.defect == Defect::FencingNeedsAValidLease
            && record.lease_expires_at().is_some_and(|at| at <= now)
    }

    fn fenced(
        &self,
        lease: &Lease,
        write: Fenced<'_>,
        change: impl FnOnce(Record, Timestamp) -> Record,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let defect = self.defect;
        let Some(record) = records.get(lease.scope()) else {
            return Err(StoreError::LostLease);
        };
        let not_completing = !matches!(write, Fenced::Complete(_));
        let held = record.is_held_by(lease, now)
            && !(not_completing && self.refuses_expired(record, now))
            && !(not_completing
                && defect == Defect::FencesOnLeaseExpiry
                && record.lease_expires_at() != Some(lease.expires_at()));
        let ignore_owner = record.is_live(now)
            && match write {
                Fenced::Complete(_) => defect == Defect::CompleteIgnoresOwner,
                Fenced::Renew => defect == Defect::RenewIgnoresOwner,
                Fenced::Checkpoint => false,
            };
        let ignore_retention = defect == Defect::FencedWritesIgnoreRetention
            && record.is_in_flight()
            && record.owner() == lease.owner();
        if held || ignore_owner || ignore_retention {
            let changed = change(record.clone(), now);
            records.insert(lease.scope().clone(), changed);
            return Ok(());
        }
        if let Fenced::Complete(response) = write
            && record.is_live(now)
        {
            let again = match defect {
                Defect::CompleteRedeliveryIsLost => false,
                Defect::CompleteRedeliveryIgnoresOwner => record.response() == Some(response),
                _ => record.is_completed_by(lease, response),
            };
            if again {
                if defect == Defect::CompleteRedeliveryRestartsRetention {
                    let restarted = record.clone().with_retained_until(now + lease.retention());
                    records.insert(lease.scope().clone(), restarted);
                }
                return Ok(());
            }
        }
        Err(StoreError::LostLease)
    }
}

impl OwnStore {
    /// Whether `lease` holds its record now (under one acquisition of the
    /// lock, which [`Defect::CompleteCheckThenWrite`] then lets go).
    fn holds(&self, lease: &Lease) -> bool {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records
            .get(lease.scope())
            .is_some_and(|record| record.is_held_by(lease, self.now()))
    }

    /// [`Defect::CompleteCheckThenWrite`]'s write, once the fence was
    /// checked: the lock let go for a moment (a rival's write may land),
    /// then the completion written over whatever is there.
    async fn complete_after_a_moment(
        &self,
        lease: &Lease,
        response: StoredResponse,
    ) -> Result<(), StoreError> {
        drop(self.rivals.meet(lease.scope()).await);
        let now = self.now();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(record) = records.get(lease.scope()).cloned() {
            let completed = record.completed(response, now + lease.retention());
            records.insert(lease.scope().clone(), completed);
        }
        Ok(())
    }
}

/// Whether `request` would take over `record` at `now`: another owner's
/// claim of the same request on an expired lease.
fn is_takeover(record: &Record, request: &ClaimRequest, now: Timestamp) -> bool {
    record.owner() != request.owner()
        && record.fingerprint() == request.fingerprint()
        && record.lease_expires_at().is_some_and(|at| at <= now)
}

#[async_trait]
impl IdempotencyStore for OwnStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.now();
        let (read, stored) = {
            let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            let stored = records.contains_key(request.scope());
            (self.live(records.get(request.scope()), now), stored)
        };
        let racy = match self.defect {
            Defect::NonAtomicClaim => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                true
            }
            Defect::CheckThenInsert => true,
            Defect::TakeoverCheckThenInsert => read
                .as_ref()
                .is_some_and(|record| is_takeover(record, request, now)),
            Defect::ExpiredRecordCheckThenInsert => stored && read.is_none(),
            _ => false,
        };
        let _reading = if racy && self.defect != Defect::NonAtomicClaim {
            Some(self.rivals.meet(request.scope()).await)
        } else {
            None
        };
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let existing = if racy {
            read
        } else {
            self.live(records.get(request.scope()), now)
        };
        let request = match (&existing, self.defect) {
            (Some(record), Defect::FingerprintIgnored) => {
                ClaimRequest::new(request.scope().clone(), record.fingerprint())
                    .with_lease(request.lease())?
                    .with_retention(request.retention())?
            }
            _ => request.clone(),
        };
        if self.defect == Defect::ClaimRedeliveryIsInProgress
            && let Some(record) = existing.as_ref()
            && record.owner() == request.owner()
            && let Some(lease_expires_at) = record.lease_expires_at()
        {
            return Ok(ClaimOutcome::InProgress {
                retry_after: retry_after(lease_expires_at, now),
            });
        }
        if let Some(record) = existing.as_ref()
            && record.owner() == request.owner()
            && record.fingerprint() == request.fingerprint()
            && let Some(lease_expires_at) = record.lease_expires_at()
        {
            if self.defect == Defect::ClaimRedeliveryAfterExpiryDropsCheckpoint
                && lease_expires_at <= now
            {
                records.insert(
                    request.scope().clone(),
                    record.clone().with_checkpoint(None),
                );
                let lease = Lease::issued(
                    request.scope().clone(),
                    request.owner(),
                    record.attempt(),
                    lease_expires_at,
                    request.retention(),
                );
                return Ok(ClaimOutcome::Claimed {
                    lease,
                    checkpoint: None,
                });
            }
            let attempt = match self.defect {
                Defect::ClaimRedeliveryRestartsLease => Some(record.attempt()),
                Defect::ClaimRedeliveryAfterExpiryTakesOver if lease_expires_at <= now => {
                    Some(record.attempt() + 1)
                }
                _ => None,
            };
            if let Some(attempt) = attempt {
                let lease_expires_at = now + request.lease();
                let checkpoint = record.checkpoint().cloned();
                let written = Record::in_flight(
                    request.scope().clone(),
                    request.fingerprint(),
                    request.owner(),
                    attempt,
                    lease_expires_at,
                    record.retained_until().max(now + request.claim_retention()),
                )
                .with_checkpoint(checkpoint.clone());
                records.insert(request.scope().clone(), written);
                let lease = Lease::issued(
                    request.scope().clone(),
                    request.owner(),
                    attempt,
                    lease_expires_at,
                    request.retention(),
                );
                return Ok(ClaimOutcome::Claimed { lease, checkpoint });
            }
        }
        let mut decision = decide(existing.as_ref(), &request, now);
        if self.defect == Defect::TakeoverKeepsRetention
            && let Some(old) = existing.as_ref().filter(|r| is_takeover(r, &request, now))
            && let Some(written) = decision.write.take()
        {
            let retained_until = old.retained_until().max(now + request.lease());
            decision.write = Some(written.with_retained_until(retained_until));
        }
        if self.defect == Defect::TakeoverRetainsForTheRetentionAlone
            && existing
                .as_ref()
                .is_some_and(|r| is_takeover(r, &request, now))
            && let Some(written) = decision.write.take()
        {
            decision.write = Some(written.with_retained_until(now + request.retention()));
        }
        if self.defect == Defect::CheckpointNotCarried
            && let ClaimOutcome::Claimed { checkpoint, .. } = &mut decision.outcome
        {
            *checkpoint = None;
        }
        if self.defect == Defect::ClaimRedeliveryAnswersTheFirstClaim
            && matches!(decision.outcome, ClaimOutcome::Claimed { .. })
        {
            let mut first = self.first_answers.lock().unwrap_or_else(|e| e.into_inner());
            let asked = (request.scope().clone(), request.owner());
            if let Some(answer) = first.get(&asked) {
                return Ok(answer.clone());
            }
            first.insert(asked, decision.outcome.clone());
        }
        if self.defect == Defect::RetryAfterFullLease
            && let ClaimOutcome::InProgress { retry_after } = &mut decision.outcome
        {
            *retry_after = request.lease();
        }
        if let Some(record) = decision.write {
            records.insert(request.scope().clone(), record);
        }
        Ok(decision.outcome)
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let max = self.max_response_bytes;
        if response.size() > max {
            return Err(StoreError::TooLarge {
                size: response.size(),
                max,
            });
        }
        let mut response = response.clone();
        if self.defect == Defect::TextOnlyBodies {
            let text = String::from_utf8_lossy(response.body()).into_owned();
            let mut lossy = StoredResponse::new(response.status(), text);
            for (name, value) in response.headers() {
                lossy = lossy.with_header(name.clone(), value.clone());
            }
            response = lossy;
        }
        let defect = self.defect;
        if defect == Defect::CompleteCheckThenWrite && self.holds(lease) {
            return self.complete_after_a_moment(lease, response).await;
        }
        self.fenced(lease, Fenced::Complete(&response.clone()), |record, now| {
            let retained_until = match defect {
                Defect::CompletionKeepsClaimRetention => record.retained_until(),
                Defect::CompletionKeepsTheLaterRetention => {
                    record.retained_until().max(now + lease.retention())
                }
                _ => now + lease.retention(),
            };
            let checkpoint = record.checkpoint().cloned();
            let completed = record.completed(response, retained_until);
            if defect == Defect::CompletionKeepsCheckpoint {
                completed.with_checkpoint(checkpoint)
            } else {
                completed
            }
        })
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = if self.defect == Defect::RenewUnchecked {
            extend
        } else {
            validate_lease(extend)?
        };
        let until = if self.defect == Defect::RenewFromOldExpiry {
            lease.expires_at() + extend
        } else {
            self.now() + extend
        };
        let stretch = self.defect != Defect::RenewKeepsRetention;
        self.fenced(lease, Fenced::Renew, |record, _| {
            let retained_until = if stretch {
                record.retained_until().max(until)
            } else {
                record.retained_until()
            };
            record
                .with_state(RecordState::InFlight {
                    lease_expires_at: until,
                })
                .with_retained_until(retained_until)
        })?;
        Ok(lease.renewed(until))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let now = self.now();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        match records.get(lease.scope()) {
            Some(record) if record.is_held_by(lease, now) && !self.refuses_expired(record, now) => {
                records.remove(lease.scope());
                Ok(())
            }
            // Nobody holds it: what the first delivery of a release left.
            Some(record)
                if !record.is_live(now) && self.defect != Defect::ReleaseRedeliveryIsLost =>
            {
                Ok(())
            }
            None if self.defect != Defect::ReleaseRedeliveryIsLost => Ok(()),
            _ => Err(StoreError::LostLease),
        }
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        if self.defect == Defect::CheckpointAfterCompletion {
            let now = self.now();
            let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            return match records.get(lease.scope()) {
                Some(record) if record.is_live(now) && record.owner() == lease.owner() => {
                    let changed = record.clone().with_checkpoint(Some(checkpoint.clone()));
                    records.insert(lease.scope().clone(), changed);
                    Ok(())
                }
                _ => Err(StoreError::LostLease),
            };
        }
        self.fenced(lease, Fenced::Checkpoint, |record, _| {
            record.with_checkpoint(Some(checkpoint.clone()))
        })
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let now = self.now();
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        // Report the stored record, not the expiry `live` may have stretched.
        Ok(self
            .live(records.get(scope), now)
            .and(records.get(scope).cloned()))
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = self.now();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let before = records.len();
        match self.defect {
            Defect::IgnoresRetention => {}
            Defect::PurgeExpiredLeases => records.retain(|_, r| {
                r.is_live(now) && r.lease_expires_at().is_none_or(|lease| lease > now)
            }),
            _ => records.retain(|_, r| r.is_live(now)),
        }
        Ok((before - records.len()) as u64)
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let now = self.now();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let live = |record: &Record| record.is_live(now);
        match self.defect {
            Defect::DeleteIgnoresTenant => {
                let mut deleted = false;
                records.retain(|other, record| {
                    let hit = other.key() == scope.key();
                    deleted |= hit && live(record);
                    !hit
                });
                Ok(deleted)
            }
            Defect::DeleteByKeyPrefix => {
                let mut deleted = false;
                records.retain(|other, record| {
                    let hit = other.tenant() == scope.tenant()
                        && other.key().as_str().starts_with(scope.key().as_str());
                    deleted |= hit && other == scope && live(record);
                    !hit
                });
                Ok(deleted)
            }
            Defect::DeleteIgnoresCase => {
                let mut deleted = false;
                records.retain(|other, record| {
                    let hit = other.tenant() == scope.tenant()
                        && other
                            .key()
                            .as_str()
                            .eq_ignore_ascii_case(scope.key().as_str());
                    deleted |= other == scope && hit && live(record);
                    !hit
                });
                Ok(deleted)
            }
            Defect::DeleteOnlyInFlight if records.get(scope).is_some_and(|r| !r.is_in_flight()) => {
                Ok(false)
            }
            Defect::DeleteExpiresLease => Ok(match records.get_mut(scope) {
                Some(record) => {
                    if record.is_in_flight() {
                        *record = record.clone().with_state(RecordState::InFlight {
                            lease_expires_at: now,
                        });
                    }
                    live(record)
                }
                None => false,
            }),
            Defect::DeleteCountsExpired => Ok(records.remove(scope).is_some()),
            _ => Ok(records.remove(scope).is_some_and(|r| live(&r))),
        }
    }

    async fn now(&self, _scope: &Scope) -> Result<Timestamp, StoreError> {
        if self.defect == Defect::NowFromAnotherClock {
            return Ok(self.now() - Duration::from_secs(3600));
        }
        Ok(self.now())
    }

    fn capabilities(&self) -> Capabilities {
        let name = match self.defect {
            Defect::StoreNamedAfterItsType => std::any::type_name::<Self>(),
            Defect::NameCountsInstances => COUNTED_NAMES[self.instance % COUNTED_NAMES.len()],
            _ => "own",
        };
        Capabilities::new(
            name,
            TransactionSharing::None,
            Durability::Volatile,
            ClockSource::Caller,
            self.max_response_bytes,
        )
    }
}
