//! A journal store of one's own, written against [`idem_core::store`] alone,
//! with the realistic bugs the public journal suite must catch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    Acquired, Capabilities, Clock, ClockSource, Durability, Finish, Holder, JournalParts,
    JournalRecord, JournalStore, ListQuery, NewOperation, OperationKey, OwnerToken, SystemClock,
    Timestamp, TransactionSharing, validate_lease, validate_list_limit,
};
use idem_core::{StoreError, async_trait};

use crate::Rivals;

/// A deliberate bug of a journal store, for proving that the journal suite
/// catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalDefect {
    /// No bug: the store keeps the whole contract.
    None,
    /// A second record of a key replaces the first.
    RecordOverwrites,
    /// Keys operations by their identity alone, whatever the namespace.
    NamespaceIgnored,
    /// Leases to whoever asks, live lease or not.
    AcquireIgnoresLiveLease,
    /// Never takes over a lapsed lease.
    NoTakeover,
    /// Tells the holder itself that the operation is busy.
    HolderIsBusy,
    /// Leases settled operations like open ones.
    LeasesSettled,
    /// Accepts any lease, however out of range.
    LeaseUnchecked,
    /// Reads, yields, then writes an acquisition: racing owners both hold.
    NonAtomicAcquire,
    /// Counts every delivery of a send.
    SendCountedTwice,
    /// Counts sends whoever asks.
    SendIgnoresOwner,
    /// Starts the key window again on every send.
    WindowRestarts,
    /// Finishes whoever asks.
    FinishIgnoresOwner,
    /// Keeps the lease after a finish.
    FinishKeepsLease,
    /// A finish without a provider id erases the stored one.
    FinishErasesProviderId,
    /// Drops the search deadline.
    SearchDeadlineDropped,
    /// Answers a second delivery of a finish as a lost lease.
    FinishRedeliveryLost,
    /// Overwrites settled states.
    SettledOverwritten,
    /// Lists every namespace.
    ListAnyNamespace,
    /// Lists newest first.
    ListNewestFirst,
    /// Ignores `older_than`.
    ListIgnoresAge,
    /// Accepts any list limit.
    ListLimitUnchecked,
    /// Ends a lease half its length after the acquisition.
    LeaseEndsEarly,
    /// Records the operation under a provider key of its own making.
    RecordRekeys,
    /// Creates and leases an operation nobody recorded.
    AcquireCreates,
    /// Names itself with spaces and capitals.
    UnlabelledName,
    /// Answers `Busy` with the lease asked for, not the time left on the
    /// holder's.
    BusyGivesTheWholeLease,
    /// Stamps a later send's `updated_at` with the first send's time.
    LaterSendStampsTheWindow,
    /// Takes the caller's count on trust: a send after any count is
    /// counted from it.
    SendTrustsTheCallersCount,
    /// Takes a send after any count below the stored one for a send
    /// delivered again (only one below is).
    SendBelowIsDeliveredAgain,
}

/// The journal store: a map under one lock, on the system clock.
#[derive(Debug)]
pub struct OwnJournal {
    operations: Mutex<BTreeMap<(String, String, String), JournalRecord>>,
    clock: Arc<dyn Clock>,
    defect: JournalDefect,
    rivals: Rivals<OperationKey>,
}

impl Default for OwnJournal {
    fn default() -> Self {
        Self::with_defect(JournalDefect::None)
    }
}

impl OwnJournal {
    /// A correct store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `defect`.
    pub fn with_defect(defect: JournalDefect) -> Self {
        Self {
            operations: Mutex::default(),
            clock: Arc::new(SystemClock),
            defect,
            rivals: Rivals::default(),
        }
    }

    fn locked(&self) -> MutexGuard<'_, BTreeMap<(String, String, String), JournalRecord>> {
        self.operations.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn map_key(&self, key: &OperationKey) -> (String, String, String) {
        let namespace = if self.defect == JournalDefect::NamespaceIgnored {
            String::new()
        } else {
            key.namespace().as_str().to_string()
        };
        let id = key.id();
        (namespace, id.subject().to_string(), id.effect().to_string())
    }

    fn is(&self, defect: JournalDefect) -> bool {
        self.defect == defect
    }

    /// What an acquisition of `found` by `owner` writes and answers.
    fn decide(
        &self,
        found: Option<JournalRecord>,
        owner: OwnerToken,
        lease: Duration,
        now: Timestamp,
    ) -> (Option<JournalRecord>, Acquired) {
        let Some(record) = found else {
            return (None, Acquired::Absent);
        };
        if record.state().is_settled() && !self.is(JournalDefect::LeasesSettled) {
            return (None, Acquired::Settled(record));
        }
        let other = record.parts().lease_owner != Some(owner);
        let busy = match record.parts().lease_until {
            _ if self.is(JournalDefect::AcquireIgnoresLiveLease) => None,
            Some(until) if self.is(JournalDefect::NoTakeover) && other => Some(
                until
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1)),
            ),
            Some(until) if self.is(JournalDefect::HolderIsBusy) && until > now => {
                Some(until.saturating_duration_since(now))
            }
            _ => record.held_by_other(owner, now),
        };
        if let Some(retry_after) = busy {
            let retry_after = if self.is(JournalDefect::BusyGivesTheWholeLease) {
                lease
            } else {
                retry_after
            };
            return (
                None,
                Acquired::Busy {
                    record,
                    retry_after,
                },
            );
        }
        let length = if self.is(JournalDefect::LeaseEndsEarly) {
            lease / 2
        } else {
            lease
        };
        let held = record.acquired(owner, now + length, now);
        (Some(held.clone()), Acquired::Held { record: held, now })
    }

    /// Whether `owner` may write `record` at `now`, as this store judges it.
    fn may_write(&self, record: &JournalRecord, owner: OwnerToken, now: Timestamp) -> bool {
        let settled = record.state().is_settled() && !self.is(JournalDefect::SettledOverwritten);
        !settled && record.is_held_by(owner, now)
    }
}

#[async_trait]
impl JournalStore for OwnJournal {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        let now = self.clock.now();
        let mut operations = self.locked();
        let map_key = self.map_key(operation.key());
        if let Some(existing) = operations.get(&map_key)
            && !self.is(JournalDefect::RecordOverwrites)
        {
            return Ok(existing.clone());
        }
        let record = if self.is(JournalDefect::RecordRekeys) {
            NewOperation::from_stored(
                operation.key().clone(),
                operation.request().clone(),
                format!("own-{}", operation.key().storage_key()),
            )
            .into_record(now)
        } else {
            operation.clone().into_record(now)
        };
        operations.insert(map_key, record.clone());
        Ok(record)
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        Ok(self.locked().get(&self.map_key(key)).cloned())
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let Holder { key, owner, .. } = held;
        let lease = if self.is(JournalDefect::LeaseUnchecked) {
            lease
        } else {
            validate_lease(lease)?
        };
        let map_key = self.map_key(key);
        let now = self.clock.now();
        if self.is(JournalDefect::NonAtomicAcquire) {
            let found = self.locked().get(&map_key).cloned();
            // Held until a rival acquisition has read too, so racing
            // acquisitions meet whenever they race, not now and then.
            let _reading = self.rivals.meet(key).await;
            let (write, answer) = self.decide(found, owner, lease, now);
            if let Some(write) = write {
                self.locked().insert(map_key, write);
            }
            return Ok(answer);
        }
        let mut operations = self.locked();
        if self.is(JournalDefect::AcquireCreates) && !operations.contains_key(&map_key) {
            let made = NewOperation::new(key.clone(), serde_json::Value::Null).into_record(now);
            operations.insert(map_key.clone(), made);
        }
        let (write, answer) = self.decide(operations.get(&map_key).cloned(), owner, lease, now);
        if let Some(write) = write {
            operations.insert(map_key, write);
        }
        Ok(answer)
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let now = self.clock.now();
        let mut operations = self.locked();
        let map_key = self.map_key(key);
        let record = operations
            .get(&map_key)
            .cloned()
            .ok_or(StoreError::LostLease)?;
        if !self.is(JournalDefect::SendIgnoresOwner) && !self.may_write(&record, owner, now) {
            return Err(StoreError::LostLease);
        }
        let trusted = self.is(JournalDefect::SendTrustsTheCallersCount)
            && sends != record.parts().sends
            && sends.saturating_add(1) != record.parts().sends;
        let counts =
            record.parts().sends == sends || self.is(JournalDefect::SendCountedTwice) || trusted;
        let first_sent = record.parts().first_sent_at;
        let mut written = if counts { record.sent(now) } else { record };
        if trusted || (self.is(JournalDefect::LaterSendStampsTheWindow) && counts) {
            let mut parts = written.parts().clone();
            if trusted {
                parts.sends = sends.saturating_add(1);
            } else if let Some(first) = first_sent {
                parts.updated_at = first;
            }
            written = with_parts(&written, parts);
        }
        if self.is(JournalDefect::WindowRestarts) && counts {
            let mut parts = written.parts().clone();
            parts.first_sent_at = Some(now);
            written = with_parts(&written, parts);
        }
        let again_any =
            self.is(JournalDefect::SendBelowIsDeliveredAgain) && sends < written.parts().sends;
        if written.parts().sends != sends.saturating_add(1)
            && !self.is(JournalDefect::SendCountedTwice)
            && !again_any
        {
            return Err(StoreError::LostLease);
        }
        operations.insert(map_key, written.clone());
        Ok(written)
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let now = self.clock.now();
        let mut operations = self.locked();
        let map_key = self.map_key(key);
        let record = operations
            .get(&map_key)
            .cloned()
            .ok_or(StoreError::LostLease)?;
        if !self.is(JournalDefect::FinishRedeliveryLost) && record.is_finished_by(owner, finish) {
            return Ok(record);
        }
        let allowed = self.is(JournalDefect::FinishIgnoresOwner)
            || self.may_write(&record, owner, now)
            || (self.is(JournalDefect::SettledOverwritten)
                && record.parts().lease_owner == Some(owner));
        if !allowed {
            return Err(StoreError::LostLease);
        }
        let keep_lease = record.parts().lease_until;
        let erased = record.parts().provider_id.is_some() && finish.provider_id.is_none();
        let written = record.finished(finish, now);
        let mut parts = written.parts().clone();
        if self.is(JournalDefect::FinishKeepsLease) {
            parts.lease_until = keep_lease;
        }
        if self.is(JournalDefect::FinishErasesProviderId) && erased {
            parts.provider_id = None;
        }
        if self.is(JournalDefect::SearchDeadlineDropped) {
            parts.search_until = None;
        }
        let written = with_parts(&written, parts);
        operations.insert(map_key, written.clone());
        Ok(written)
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        let ListQuery {
            namespace,
            states,
            older_than,
            limit,
            ..
        } = query;
        let limit = if self.is(JournalDefect::ListLimitUnchecked) {
            (*limit).max(1)
        } else {
            validate_list_limit(*limit)?
        };
        let cutoff = self.clock.now() - *older_than;
        let mut found: Vec<JournalRecord> = self
            .locked()
            .values()
            .filter(|r| {
                (self.is(JournalDefect::ListAnyNamespace) || r.key().namespace() == namespace)
                    && states.contains(&r.state())
                    && (self.is(JournalDefect::ListIgnoresAge) || r.parts().updated_at <= cutoff)
            })
            .cloned()
            .collect();
        found.sort_by_key(|r| r.parts().updated_at);
        if self.is(JournalDefect::ListNewestFirst) {
            found.reverse();
        }
        found.truncate(limit);
        Ok(found)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            if self.is(JournalDefect::UnlabelledName) {
                "Own Journal"
            } else {
                "ownjournal"
            },
            TransactionSharing::None,
            Durability::Volatile,
            ClockSource::Caller,
            usize::MAX,
        )
    }
}

/// `record` with `parts` in place of its own.
fn with_parts(record: &JournalRecord, parts: JournalParts) -> JournalRecord {
    JournalRecord::new(
        NewOperation::from_stored(
            record.key().clone(),
            record.request().clone(),
            record.provider_key().to_string(),
        ),
        parts,
    )
}
