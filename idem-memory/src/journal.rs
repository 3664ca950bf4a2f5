//! `MemoryJournal`: the journal store in process, on the caller's clock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Acquired, Capabilities, Clock, Finish, Holder, JournalRecord, JournalStore, Layered, ListQuery,
    NewOperation, OperationKey, OwnerToken, forward_journal_store, validate_lease,
    validate_list_limit,
};
use idem_core::{Operation, StoreError, async_trait};
use moka::ops::compute::Op;
use moka::sync::Cache;

use crate::part::STORE;

/// An in-process journal store: tests, examples and single-process
/// services. Operations live in this process only, and the caller's
/// [`Clock`] judges leases and the key window (tests inject a
/// [`ManualClock`](idem_core::ManualClock) with [`with_clock`](Self::with_clock)).
/// Each operation on one key runs inside one moka `and_compute_with`, so it
/// reads and writes atomically. Cloning is cheap and shares the operations.
///
/// ```
/// use idem_core::Tenant;
/// use idem_core::store::{JournalStore, NewOperation, OperationId, OperationKey, OperationState};
/// use idem_memory::MemoryJournal;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let journal = MemoryJournal::new();
/// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-1", "charge")?);
/// let recorded = journal.record(&NewOperation::new(key.clone(), serde_json::json!({"amount": 5}))).await?;
/// assert_eq!(recorded.state(), OperationState::Pending);
/// assert_eq!(journal.get(&key).await?, Some(recorded));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct MemoryJournal {
    operations: Layered<Operations>,
}

forward_journal_store!(MemoryJournal => operations);

#[derive(Clone)]
struct Operations {
    operations: Cache<OperationKey, Arc<JournalRecord>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Operations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryJournal")
            .field("operations", &self.operations.entry_count())
            .field("clock", &self.clock)
            .finish()
    }
}

crate::part::clocked_part!(MemoryJournal => operations: Operations, "journal store");

impl Operations {
    fn on(clock: Arc<dyn Clock>) -> Self {
        Self {
            operations: Cache::builder().build(),
            clock,
        }
    }

    /// Runs `change` on the stored record of `key` atomically; its answer.
    fn change<T>(
        &self,
        operation: Operation,
        key: &OperationKey,
        change: impl FnOnce(Option<&JournalRecord>) -> (Option<JournalRecord>, T),
    ) -> Result<T, StoreError> {
        let mut answer = None;
        self.operations
            .entry(key.clone())
            .and_compute_with(|entry| {
                let (write, out) = change(entry.as_ref().map(|e| e.value().as_ref()));
                answer = Some(out);
                match write {
                    Some(record) => Op::Put(Arc::new(record)),
                    None => Op::Nop,
                }
            });
        answer.ok_or_else(|| StoreError::backend(STORE, operation, "moka did not run the change"))
    }

    /// A fenced write: `write` when `owner` holds the record, else what
    /// `again` says of a second delivery.
    fn fenced(
        &self,
        operation: Operation,
        key: &OperationKey,
        owner: OwnerToken,
        write: impl FnOnce(JournalRecord) -> JournalRecord,
        again: impl FnOnce(&JournalRecord) -> bool,
    ) -> Result<JournalRecord, StoreError> {
        let now = self.clock.now();
        self.change(operation, key, |stored| match stored {
            Some(record) if record.is_held_by(owner, now) && !record.state().is_settled() => {
                let written = write(record.clone());
                (Some(written.clone()), Ok(written))
            }
            Some(record) if again(record) => (None, Ok(record.clone())),
            _ => (None, Err(StoreError::LostLease)),
        })?
    }
}

#[async_trait]
impl JournalStore for Operations {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        let now = self.clock.now();
        self.change(Operation::Record, operation.key(), |stored| match stored {
            Some(record) => (None, record.clone()),
            None => {
                let record = operation.clone().into_record(now);
                (Some(record.clone()), record)
            }
        })
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        Ok(self.operations.get(key).map(|r| (*r).clone()))
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let Holder { key, owner, .. } = held;
        let lease = validate_lease(lease)?;
        let now = self.clock.now();
        self.change(Operation::Acquire, key, |stored| match stored {
            None => (None, Acquired::Absent),
            Some(record) if record.state().is_settled() => {
                (None, Acquired::Settled(record.clone()))
            }
            Some(record) => match record.held_by_other(owner, now) {
                Some(retry_after) => (
                    None,
                    Acquired::Busy {
                        record: record.clone(),
                        retry_after,
                    },
                ),
                None => {
                    let held = record.clone().acquired(owner, now + lease, now);
                    (Some(held.clone()), Acquired::Held { record: held, now })
                }
            },
        })
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let now = self.clock.now();
        let written = self.fenced(
            Operation::MarkSent,
            key,
            owner,
            // Already counted (a second delivery), or counted now.
            |record| {
                if record.parts().sends == sends {
                    record.sent(now)
                } else {
                    record
                }
            },
            |_| false,
        )?;
        if written.parts().sends == sends.saturating_add(1) {
            Ok(written)
        } else {
            Err(StoreError::LostLease)
        }
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let now = self.clock.now();
        self.fenced(
            Operation::Finish,
            key,
            owner,
            |record| record.finished(finish, now),
            |record| record.is_finished_by(owner, finish),
        )
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        let limit = validate_list_limit(query.limit)?;
        let now = self.clock.now();
        let mut found: Vec<JournalRecord> = self
            .operations
            .iter()
            .map(|(_, record)| (*record).clone())
            .filter(|record| query.matches(record, now))
            .collect();
        found.sort_by_key(|record| record.parts().updated_at);
        found.truncate(limit);
        Ok(found)
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
