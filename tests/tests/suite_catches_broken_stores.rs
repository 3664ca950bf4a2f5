//! The suite is itself tested: a simple correct store passes every case, and
//! each deliberately broken variant of it fails the cases that describe its
//! defect. A suite that passes a broken store proves nothing.

#![allow(clippy::unwrap_used)] // test code: a poisoned lock or a failed runtime should fail loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Clock, ClockSource, Durability, IdempotencyStore,
    Lease, OwnerToken, Record, RecordState, SystemClock, Timestamp, TransactionSharing, decide,
};
use idem_core::{Checkpoint, Scope, StoreError, StoredResponse, async_trait};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defect {
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

#[derive(Debug)]
struct NaiveStore {
    records: Mutex<HashMap<Scope, Record>>,
    defect: Defect,
}

impl NaiveStore {
    fn new(defect: Defect) -> Arc<Self> {
        Arc::new(Self {
            records: Mutex::new(HashMap::new()),
            defect,
        })
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
        let mut records = self.records.lock().unwrap();
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
impl IdempotencyStore for NaiveStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.now();
        let existing = {
            let records = self.records.lock().unwrap();
            self.live(records.get(request.scope()), now)
        };
        if self.defect == Defect::NonAtomicClaim {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut records = self.records.lock().unwrap();
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
        let mut records = self.records.lock().unwrap();
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
        let records = self.records.lock().unwrap();
        // Report the stored record, not the expiry `live` may have stretched.
        Ok(self
            .live(records.get(scope), now)
            .and(records.get(scope).cloned()))
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = self.now();
        let mut records = self.records.lock().unwrap();
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

fn failing(defect: Defect) -> Vec<&'static str> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(idem_conformance::failing_cases(NaiveStore::new(defect)))
}

fn assert_caught(defect: Defect, expected: &[&str]) {
    let failed = failing(defect);
    for name in expected {
        assert!(
            failed.contains(name),
            "{defect:?} should fail {name}; it failed {failed:?}"
        );
    }
}

#[test]
fn suite_has_at_least_25_named_cases_with_unique_names() {
    let cases = idem_conformance::all_cases::<NaiveStore>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 25, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn correct_naive_store_passes_every_case() {
    assert_eq!(failing(Defect::None), Vec::<&str>::new());
}

#[test]
fn non_atomic_claim_fails_the_race_cases() {
    assert_caught(
        Defect::NonAtomicClaim,
        &[
            "concurrent_claims_of_one_key_have_one_winner",
            "concurrent_takeovers_of_an_expired_lease_have_one_winner",
        ],
    );
}

#[test]
fn complete_ignoring_the_owner_fails_the_fencing_cases() {
    assert_caught(
        Defect::CompleteIgnoresOwner,
        &[
            "stale_owner_cannot_complete_after_takeover",
            "completed_record_cannot_be_completed_again",
            "runner_reports_a_lost_lease_instead_of_success",
        ],
    );
}

#[test]
fn ignored_fingerprint_fails_the_mismatch_cases() {
    assert_caught(
        Defect::FingerprintIgnored,
        &[
            "other_fingerprint_while_in_flight_is_mismatch",
            "other_fingerprint_on_expired_lease_is_mismatch",
            "other_fingerprint_on_completed_record_is_mismatch",
            "runner_refuses_a_reused_key_with_another_payload",
        ],
    );
}

#[test]
fn renew_ignoring_the_owner_fails_the_stale_renew_case() {
    assert_caught(
        Defect::RenewIgnoresOwner,
        &["stale_owner_cannot_renew_after_takeover"],
    );
}

#[test]
fn ignored_retention_fails_the_retention_cases() {
    assert_caught(
        Defect::IgnoresRetention,
        &[
            "completed_record_past_retention_counts_as_absent",
            "record_past_retention_is_claimed_afresh",
            "purge_expired_removes_only_what_is_past_retention",
        ],
    );
}

#[test]
fn dropped_checkpoint_fails_the_takeover_cases() {
    assert_caught(
        Defect::CheckpointNotCarried,
        &[
            "takeover_carries_the_checkpoint",
            "runner_gives_a_takeover_the_checkpoint_and_the_same_downstream_key",
        ],
    );
}

#[test]
fn lossy_bodies_fail_the_byte_exact_case() {
    assert_caught(
        Defect::TextOnlyBodies,
        &["replay_is_byte_exact_for_binary_bodies_and_headers"],
    );
}
