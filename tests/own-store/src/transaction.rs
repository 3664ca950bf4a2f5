//! The own store's transaction, which batches: written from
//! [`Transaction`]'s documentation alone. It decides each claim from what
//! the records hold (and from what it writes itself), writes nothing until
//! its commit, and commits every write at once if no record a claim read
//! has changed since (a store that decides at the commit); savepoints are
//! copies of what it holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Clock, Lease, Record, SystemClock, Transaction, decide, once_each,
};
use idem_core::{Checkpoint, Operation, Scope, StoreError, StoredResponse, async_trait};

/// A deliberate bug of the own store's transaction, for proving that the
/// batch suite catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchDefect {
    /// No bug: the transaction keeps the whole contract.
    None,
    /// Writes a claim to the records at once, not at the commit.
    ClaimWritesAtOnce,
    /// Commits its claims over whatever the records hold by then.
    CommitOverwritesARacingClaim,
    /// Claims again a scope it claimed and completed itself.
    ClaimIgnoresItsOwnWrites,
    /// Takes a claim of another fingerprint for the record's own.
    ClaimIgnoresFingerprint,
    /// Rolls back to the first savepoint still open, not the latest.
    RollsBackToTheFirstSavepoint,
    /// Keeps what was written since the savepoint it rolls back to.
    RollbackKeepsWrites,
    /// Undoes what was written since the savepoint it releases.
    ReleaseUndoesWrites,
    /// Claims many at once, answering their outcomes in reverse order.
    ClaimAllAnswersReversed,
    /// Completes many at once, but only the first.
    CompleteAllOnlyTheFirst,
    /// Commits a fenced write only over the very record it read, so the
    /// holder's own renewal since refuses it.
    CommitRefusesItsOwnRenewal,
    /// Commits a fenced checkpoint with the lease as it read it, undoing
    /// the holder's renewal since.
    CommitWritesTheLeaseBack,
    /// Rolls back to a savepoint the completions written since, but keeps
    /// a claim made since that was not completed.
    RollbackKeepsBareClaims,
    /// Claims many at once each against the records alone, so a scope twice
    /// in the batch is claimed twice.
    ClaimAllIgnoresItsOwn,
    /// Completes again, replacing it, a write it already completed.
    CompletesItsCompletionAgain,
    /// Releases a savepoint but leaves it open for a later rollback.
    ReleaseLeavesItOpen,
    /// Commits a fenced write while its owner's record is there, in flight
    /// or not, so a completion through the store meanwhile is overwritten.
    CommitFencesByOwnerAlone,
    /// Answers a claim it holds, delivered again, in progress: its own
    /// claim taken for another owner's.
    ClaimRefusesItsOwnAgain,
    /// Claims many and completes at once what it claims, but leaves the
    /// claims in flight.
    ClaimCompletedLeavesItInFlight,
    /// Claims many and completes at once, answering every request as
    /// recorded, what it found included.
    ClaimCompletedHidesWhatItFound,
    /// Claims many and completes at once a scope named twice.
    ClaimCompletedTakesAScopeTwice,
    /// Claims many and completes at once with an empty body, not the
    /// response it was given.
    ClaimCompletedStoresAnotherResponse,
}

/// A record the transaction writes at its commit.
#[derive(Debug, Clone)]
struct Write {
    /// The record as the claim read it (`None`: no live record), or the
    /// lease's record, for a lease claimed outside the transaction.
    read: Option<Record>,
    /// The record as the commit writes it.
    record: Record,
    /// Claimed outside the transaction: its record must still be the
    /// lease's at the commit.
    fenced: bool,
}

/// A transaction of an [`OwnStore`](crate::OwnStore)
/// ([`OwnStore::begin`](crate::OwnStore::begin)).
#[derive(Debug)]
pub struct OwnTransaction {
    records: Arc<Mutex<HashMap<Scope, Record>>>,
    defect: BatchDefect,
    writes: Vec<Write>,
    /// What it held at each open savepoint, the latest last.
    savepoints: Vec<Vec<Write>>,
}

impl OwnTransaction {
    pub(crate) fn new(records: Arc<Mutex<HashMap<Scope, Record>>>, defect: BatchDefect) -> Self {
        Self {
            records,
            defect,
            writes: Vec::new(),
            savepoints: Vec::new(),
        }
    }

    fn records(&self) -> MutexGuard<'_, HashMap<Scope, Record>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The write of `scope` it holds.
    fn written(&mut self, scope: &Scope) -> Option<&mut Write> {
        self.writes.iter_mut().find(|w| w.record.scope() == scope)
    }

    /// `lease`'s record as `change` leaves it, written at the commit.
    fn fenced_write(
        &mut self,
        lease: &Lease,
        change: impl FnOnce(Record) -> Record,
    ) -> Result<(), StoreError> {
        let again = self.defect == BatchDefect::CompletesItsCompletionAgain;
        if let Some(write) = self.written(lease.scope()) {
            if write.record.owner() != lease.owner() || !(again || write.record.is_in_flight()) {
                return Err(StoreError::LostLease);
            }
            write.record = change(write.record.clone());
            return Ok(());
        }
        let now = SystemClock.now();
        let held = self
            .records()
            .get(lease.scope())
            .filter(|record| record.is_held_by(lease, now))
            .cloned()
            .ok_or(StoreError::LostLease)?;
        self.writes.push(Write {
            read: Some(held.clone()),
            record: change(held),
            fenced: true,
        });
        Ok(())
    }
}

fn no_savepoint() -> StoreError {
    StoreError::Misconfigured {
        store: "own",
        message: "no savepoint is open".into(),
    }
}

#[async_trait]
impl Transaction for OwnTransaction {
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let retained_until = SystemClock.now() + lease.retention();
        self.fenced_write(lease, |record| {
            record.completed(response.clone(), retained_until)
        })
    }

    async fn checkpoint(
        &mut self,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        self.fenced_write(lease, |record| {
            record.with_checkpoint(Some(checkpoint.clone()))
        })
    }

    async fn commit(self) -> Result<(), StoreError> {
        let now = SystemClock.now();
        let mut records = self.records();
        for write in &self.writes {
            let current = records
                .get(write.record.scope())
                .filter(|record| record.is_live(now));
            let unchanged = match self.defect {
                BatchDefect::CommitOverwritesARacingClaim => true,
                BatchDefect::ClaimWritesAtOnce if !write.fenced => true,
                BatchDefect::CommitRefusesItsOwnRenewal => current == write.read.as_ref(),
                BatchDefect::CommitFencesByOwnerAlone if write.fenced => {
                    current.is_some_and(|current| current.owner() == write.record.owner())
                }
                // A lease fences by its owner alone.
                _ if write.fenced => current.is_some_and(|current| {
                    current.is_in_flight() && current.owner() == write.record.owner()
                }),
                _ => current == write.read.as_ref(),
            };
            if unchanged {
                continue;
            }
            if write.fenced {
                return Err(StoreError::LostLease);
            }
            return Err(StoreError::Unavailable {
                store: "own",
                operation: Operation::Transaction,
                message: "a record claimed in the transaction changed before its commit: \
                          nothing was written"
                    .into(),
                source: None,
            });
        }
        for write in self.writes.iter().cloned() {
            let scope = write.record.scope().clone();
            let mut record = write.record;
            // A record left in flight keeps the lease as its holder renewed
            // it meanwhile.
            if write.fenced
                && record.is_in_flight()
                && self.defect != BatchDefect::CommitWritesTheLeaseBack
                && let Some(current) = records.get(&scope)
            {
                record = record
                    .with_state(current.state().clone())
                    .with_retained_until(current.retained_until());
            }
            records.insert(scope, record);
        }
        Ok(())
    }

    fn batches(&self) -> bool {
        true
    }

    fn free_savepoints(&self) -> bool {
        true
    }

    async fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = SystemClock.now();
        let defect = self.defect;
        if defect != BatchDefect::ClaimIgnoresItsOwnWrites
            && let Some(write) = self.written(request.scope())
        {
            let outcome = decide(Some(&write.record), request, now).outcome;
            // The record it writes takes no second owner.
            return Ok(match outcome {
                ClaimOutcome::Claimed { .. }
                    if write.record.owner() != request.owner()
                        || defect == BatchDefect::ClaimRefusesItsOwnAgain =>
                {
                    ClaimOutcome::InProgress {
                        retry_after: Duration::from_millis(1),
                    }
                }
                outcome => outcome,
            });
        }
        let existing = self
            .records()
            .get(request.scope())
            .filter(|record| record.is_live(now))
            .cloned();
        let request = match (&existing, defect) {
            (Some(record), BatchDefect::ClaimIgnoresFingerprint) => {
                ClaimRequest::new(request.scope().clone(), record.fingerprint())
                    .with_lease(request.lease())?
                    .with_retention(request.retention())?
            }
            _ => request.clone(),
        };
        let decision = decide(existing.as_ref(), &request, now);
        if let Some(record) = decision.write {
            if defect == BatchDefect::ClaimWritesAtOnce {
                self.records()
                    .insert(request.scope().clone(), record.clone());
            }
            self.writes.push(Write {
                read: existing,
                record,
                fenced: false,
            });
        }
        Ok(decision.outcome)
    }

    async fn claim_all(
        &mut self,
        requests: &[ClaimRequest],
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut outcomes = Vec::with_capacity(requests.len());
        let ignoring = self.defect == BatchDefect::ClaimAllIgnoresItsOwn;
        for request in requests {
            if ignoring {
                self.defect = BatchDefect::ClaimIgnoresItsOwnWrites;
            }
            let outcome = self.claim(request).await;
            if ignoring {
                self.defect = BatchDefect::ClaimAllIgnoresItsOwn;
            }
            outcomes.push(outcome?);
        }
        if self.defect == BatchDefect::ClaimAllAnswersReversed {
            outcomes.reverse();
        }
        Ok(outcomes)
    }

    async fn complete_all(
        &mut self,
        completions: &[(Lease, StoredResponse)],
    ) -> Result<(), StoreError> {
        let take = match self.defect {
            BatchDefect::CompleteAllOnlyTheFirst => 1,
            _ => completions.len(),
        };
        for (lease, response) in completions.iter().take(take) {
            self.complete(lease, response).await?;
        }
        Ok(())
    }

    async fn claim_completed_all(
        &mut self,
        requests: &[ClaimRequest],
        response: &StoredResponse,
    ) -> Result<Vec<Option<ClaimOutcome>>, StoreError> {
        if self.defect != BatchDefect::ClaimCompletedTakesAScopeTwice {
            once_each(requests)?;
        }
        let recorded = match self.defect {
            BatchDefect::ClaimCompletedStoresAnotherResponse => StoredResponse::new(200, ""),
            _ => response.clone(),
        };
        let mut answers = Vec::with_capacity(requests.len());
        for request in requests {
            match self.claim(request).await? {
                ClaimOutcome::Claimed { lease, .. } => {
                    if self.defect != BatchDefect::ClaimCompletedLeavesItInFlight {
                        self.complete(&lease, &recorded).await?;
                    }
                    answers.push(None);
                }
                _ if self.defect == BatchDefect::ClaimCompletedHidesWhatItFound => {
                    answers.push(None);
                }
                other => answers.push(Some(other)),
            }
        }
        Ok(answers)
    }

    async fn savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoints.push(self.writes.clone());
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        let latest = self.savepoints.pop().ok_or_else(no_savepoint)?;
        match self.defect {
            BatchDefect::RollbackKeepsWrites => {}
            BatchDefect::RollsBackToTheFirstSavepoint => {
                self.writes = self.savepoints.first().cloned().unwrap_or(latest);
            }
            BatchDefect::RollbackKeepsBareClaims => {
                let bare: Vec<Write> = self
                    .writes
                    .iter()
                    .filter(|w| w.record.is_in_flight() && !w.fenced)
                    .filter(|w| !latest.iter().any(|l| l.record.scope() == w.record.scope()))
                    .cloned()
                    .collect();
                self.writes = latest;
                self.writes.extend(bare);
            }
            _ => self.writes = latest,
        }
        Ok(())
    }

    async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        if self.defect == BatchDefect::ReleaseLeavesItOpen {
            return self.savepoints.last().map(|_| ()).ok_or_else(no_savepoint);
        }
        let latest = self.savepoints.pop().ok_or_else(no_savepoint)?;
        if self.defect == BatchDefect::ReleaseUndoesWrites {
            self.writes = latest;
        }
        Ok(())
    }
}
