//! # idem-own-store
//!
//! A store of one's own, written against [`idem_core::store`] alone (the
//! trait, the record, [`decide`](idem_core::store::decide) and the contract
//! in its documentation), the way a user writes one for a backend idem does
//! not ship. It passes the whole `idem-conformance` suite (see
//! `tests/conformance.rs`); each [`Defect`] is a realistic bug that the suite
//! must catch, which `idem-conformance`'s own tests prove.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Clock, ClockSource, Durability, IdempotencyStore,
    Lease, OwnerToken, Record, RecordState, SystemClock, Timestamp, TransactionSharing, decide,
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
}

/// A store of one's own: a `Mutex<HashMap>` written from the
/// [`idem_core::store`] documentation alone, as a user would write one.
#[derive(Debug)]
pub struct OwnStore {
    records: Mutex<HashMap<Scope, Record>>,
    defect: Defect,
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
            records: Mutex::new(HashMap::new()),
            defect,
        }
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

    fn fenced(
        &self,
        lease: &Lease,
        ignore_owner: bool,
        change: impl FnOnce(Record, Timestamp) -> Record,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        match records.get(lease.scope()) {
            Some(record)
                if record.is_held_by(lease, now) || (ignore_owner && record.is_live(now)) =>
            {
                let changed = change(record.clone(), now);
                records.insert(lease.scope().clone(), changed);
                Ok(())
            }
            _ => Err(StoreError::LostLease),
        }
    }
}

#[async_trait]
impl IdempotencyStore for OwnStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.now();
        let existing = {
            let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
            self.live(records.get(request.scope()), now)
        };
        if self.defect == Defect::NonAtomicClaim {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let existing = if self.defect == Defect::NonAtomicClaim {
            existing
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
        let mut decision = decide(existing.as_ref(), &request, now, OwnerToken::generate());
        if self.defect == Defect::CheckpointNotCarried
            && let ClaimOutcome::Claimed { checkpoint, .. } = &mut decision.outcome
        {
            *checkpoint = None;
        }
        if let Some(record) = decision.write {
            records.insert(request.scope().clone(), record);
        }
        Ok(decision.outcome)
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let max = self.capabilities().max_response_bytes;
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
        let ignore_owner = self.defect == Defect::CompleteIgnoresOwner;
        self.fenced(lease, ignore_owner, |record, now| {
            record.completed(response, now + lease.retention())
        })
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let ignore_owner = self.defect == Defect::RenewIgnoresOwner;
        let until = self.now() + extend;
        self.fenced(lease, ignore_owner, |record, _| {
            let retained_until = record.retained_until().max(until);
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
            Some(record) if record.is_held_by(lease, now) => {
                records.remove(lease.scope());
                Ok(())
            }
            _ => Err(StoreError::LostLease),
        }
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.fenced(lease, false, |record, _| {
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
        if self.defect != Defect::IgnoresRetention {
            records.retain(|_, r| r.is_live(now));
        }
        Ok((before - records.len()) as u64)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            TransactionSharing::None,
            Durability::Volatile,
            ClockSource::Caller,
            64 * 1024,
        )
    }
}
