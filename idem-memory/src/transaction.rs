//! `MemoryTransaction`: a transaction of the memory store that batches. It
//! decides each claim from what the records hold (and from what it wrote
//! itself), writes nothing until its commit, and commits every write at once
//! if no record a claim read has changed since; the caller's own writes
//! ride along as closures run at the commit.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Lease, Record, Timestamp, Transaction, check_response_size, decide,
};
use idem_core::{Checkpoint, Operation, StoreError, StoredResponse, async_trait};

use crate::part::STORE;
use crate::store::{MemoryStore, Records};

/// A write of one record, made at the commit.
#[derive(Clone)]
struct Write {
    /// The live record the claim (or the fenced lease) read; `None`: none.
    /// The commit writes only over this very record (a fenced one: over
    /// a record its owner still holds).
    read: Option<Arc<Record>>,
    /// The record as the commit writes it.
    record: Record,
    /// Claimed outside the transaction: a change of its record is a lost
    /// lease.
    fenced: bool,
}

/// What [`MemoryTransaction::rollback_to_savepoint`] undoes, newest last.
enum Undo {
    /// A write was added.
    Added,
    /// The write at this place held this before.
    Changed(usize, Box<Write>),
}

/// A caller's write, run at the commit.
type Effect = Box<dyn FnOnce() + Send>;

/// A transaction of a [`MemoryStore`](crate::MemoryStore)
/// ([`MemoryStore::begin`](crate::MemoryStore::begin)): its claims,
/// completions and checkpoints, and the caller's own writes
/// ([`on_commit`](Self::on_commit)), take effect together at
/// [`commit`](Transaction::commit), or not at all.
///
/// It batches ([`Transaction::batches`]), so a consumer handles a batch of
/// messages in one: each claim is decided as the store decides it, from the
/// records and from what the transaction wrote; savepoints undo what was
/// written since. The commit writes only over the records its claims read:
/// if another claim of one of them committed meanwhile, it is refused with
/// [`StoreError::Unavailable`] and nothing is written (a store that decides
/// at the commit); if a lease claimed outside it was taken over, with
/// [`StoreError::LostLease`] (its owner's own renewal meanwhile is no
/// takeover, and a checkpoint written here keeps the renewed lease).
/// Dropping it writes nothing.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use idem_core::{Fingerprint, Scope, StoredResponse};
/// use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Transaction};
/// use idem_memory::MemoryStore;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let shipped = Arc::new(Mutex::new(Vec::new()));
/// let request = ClaimRequest::new(Scope::parse("shipping", "order-7")?, Fingerprint::of_bytes(b"ship"));
///
/// let mut tx = store.begin();
/// let ClaimOutcome::Claimed { lease, .. } = tx.claim(&request).await? else { unreachable!() };
/// let books = Arc::clone(&shipped);
/// tx.on_commit(move || books.lock().unwrap().push("order-7"));
/// tx.complete(&lease, &StoredResponse::new(200, "shipped")).await?;
/// assert!(store.get(request.scope()).await?.is_none(), "nothing shows before the commit");
/// tx.commit().await?;
///
/// assert_eq!(*shipped.lock().unwrap(), ["order-7"]);
/// assert!(matches!(store.claim(&request).await?, ClaimOutcome::Completed(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct MemoryTransaction {
    records: Records,
    writes: Vec<Write>,
    undo: Vec<Undo>,
    effects: Vec<Effect>,
    /// Each open savepoint's lengths of `undo` and `effects`, the latest last.
    savepoints: Vec<(usize, usize)>,
}

impl fmt::Debug for MemoryTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTransaction")
            .field("writes", &self.writes.len())
            .field("effects", &self.effects.len())
            .field("savepoints", &self.savepoints.len())
            .finish()
    }
}

impl MemoryStore {
    /// Opens a transaction on the store ([`MemoryTransaction`]): claims,
    /// completions, checkpoints and the caller's own writes that commit
    /// together, as a consumer's batch needs.
    pub fn begin(&self) -> MemoryTransaction {
        MemoryTransaction {
            records: self.records().clone(),
            writes: Vec::new(),
            undo: Vec::new(),
            effects: Vec::new(),
            savepoints: Vec::new(),
        }
    }
}

impl MemoryTransaction {
    /// Runs `write` at the commit, after every check has passed and before
    /// the records are written, while no other operation of the store
    /// writes: the caller's writes (a map of its own) and the records
    /// commit together. A rollback to a savepoint taken before this call,
    /// or a transaction dropped without its commit, never runs it. It must
    /// not wait on the store.
    pub fn on_commit(&mut self, write: impl FnOnce() + Send + 'static) {
        self.effects.push(Box::new(write));
    }

    /// The place of `lease`'s scope among the writes.
    fn written(&self, scope: &idem_core::Scope) -> Option<usize> {
        self.writes.iter().position(|w| w.record.scope() == scope)
    }

    fn push(&mut self, write: Write) {
        self.writes.push(write);
        self.undo.push(Undo::Added);
    }

    /// `lease`'s record as `change` leaves it, written at the commit: the
    /// transaction's own claim, or a record the lease holds now.
    fn fenced_write(
        &mut self,
        lease: &Lease,
        change: impl FnOnce(Record, Timestamp) -> Record,
    ) -> Result<(), StoreError> {
        let now = self.records.now();
        if let Some(at) = self.written(lease.scope()) {
            let held = &self.writes[at];
            if held.record.owner() != lease.owner() || !held.record.is_in_flight() {
                return Err(StoreError::LostLease);
            }
            let changed = Write {
                read: held.read.clone(),
                record: change(held.record.clone(), now),
                fenced: held.fenced,
            };
            let before = std::mem::replace(&mut self.writes[at], changed);
            self.undo.push(Undo::Changed(at, Box::new(before)));
            return Ok(());
        }
        let held = self
            .records
            .read(lease.scope())
            .filter(|record| record.is_held_by(lease, now))
            .ok_or(StoreError::LostLease)?;
        let record = change(Record::clone(&held), now);
        self.push(Write {
            read: Some(held),
            record,
            fenced: true,
        });
        Ok(())
    }
}

fn no_savepoint() -> StoreError {
    StoreError::Misconfigured {
        store: STORE,
        message: "no savepoint is open in the transaction".into(),
    }
}

#[async_trait]
impl Transaction for MemoryTransaction {
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        check_response_size(response, self.records.max_response_bytes())?;
        self.fenced_write(lease, |record, now| {
            record.completed(response.clone(), now + lease.retention())
        })
    }

    async fn checkpoint(
        &mut self,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        self.fenced_write(lease, |record, _| {
            record.with_checkpoint(Some(checkpoint.clone()))
        })
    }

    async fn commit(self) -> Result<(), StoreError> {
        let Self {
            records,
            writes,
            effects,
            ..
        } = self;
        let total = writes.len();
        let fenced: Vec<bool> = writes.iter().map(|w| w.fenced).collect();
        let writes = writes
            .into_iter()
            .map(|w| (w.read, w.record, w.fenced))
            .collect();
        let Err(at) = records.commit(writes, move || effects.into_iter().for_each(|run| run()))
        else {
            return Ok(());
        };
        if fenced.get(at).copied().unwrap_or(false) {
            return Err(StoreError::LostLease);
        }
        Err(StoreError::Unavailable {
            store: STORE,
            operation: Operation::Transaction,
            message: format!(
                "the record of write {} of {total} changed after the transaction read it \
                 (another claim committed first): nothing was written",
                at + 1
            ),
            source: None,
        })
    }

    fn batches(&self) -> bool {
        true
    }

    fn free_savepoints(&self) -> bool {
        true
    }

    async fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.records.now();
        if let Some(at) = self.written(request.scope()) {
            let record = &self.writes[at].record;
            // The record it writes takes no second owner, even past its
            // lease: the transaction holds it until the commit.
            return Ok(match decide(Some(record), request, now).outcome {
                ClaimOutcome::Claimed { .. } if record.owner() != request.owner() => {
                    ClaimOutcome::InProgress {
                        retry_after: Duration::from_millis(1),
                    }
                }
                outcome => outcome,
            });
        }
        let read = self.records.read(request.scope());
        let decision = decide(read.as_deref(), request, now);
        if let Some(record) = decision.write {
            self.push(Write {
                read,
                record,
                fenced: false,
            });
        }
        Ok(decision.outcome)
    }

    async fn savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoints.push((self.undo.len(), self.effects.len()));
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        let (undo, effects) = self.savepoints.pop().ok_or_else(no_savepoint)?;
        for step in self.undo.drain(undo..).rev() {
            match step {
                Undo::Added => {
                    self.writes.pop();
                }
                Undo::Changed(at, before) => self.writes[at] = *before,
            }
        }
        self.effects.truncate(effects);
        Ok(())
    }

    async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoints.pop().map(drop).ok_or_else(no_savepoint)
    }
}
