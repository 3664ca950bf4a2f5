//! `DynamoTransaction`: the caller's items and the record's fenced writes in
//! one `TransactWriteItems`.

use std::fmt;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Lease, OwnerToken, Record, Timestamp, Transaction, decide,
};
use idem_core::{Checkpoint, Operation, StoreError, StoredResponse, async_trait};

use crate::codec::{self, attr};
use crate::commands::{self, FencedUpdate};
use crate::error::{RETRYABLE_REASONS, STORE, classify};
use crate::options::Settings;

const OP: Operation = Operation::Transaction;

/// The cancellation reason of an item that did not fail.
const NO_FAILURE: &str = "None";
/// The cancellation reason of a refused condition.
const CONDITION_FAILED: &str = "ConditionalCheckFailed";

/// Your `TransactWriteItem`s and the record's completion (and checkpoints),
/// committed in one `TransactWriteItems`: all of it, or nothing.
///
/// Open one with [`DynamoStore::begin`](crate::DynamoStore::begin) (no
/// request is sent), add your items with [`push`](Self::push), and let
/// [`Idempotency::run_in`](idem_core::Idempotency::run_in) complete and
/// commit it. The record's writes are fenced on the lease, so a lease lost to
/// a takeover cancels the whole transaction: your items are not written
/// either, and the run ends in [`RunError::LostLease`](idem_core::RunError::LostLease).
/// If your own items cancel it (a condition of yours failed), the commit
/// fails with [`StoreError::Rejected`] naming them by their index in the
/// order you pushed them, and the runner releases the claim: nothing happened,
/// and the client may retry at once.
///
/// [`DynamoOutbox::enqueue_in`](crate::DynamoOutbox::enqueue_in) adds a
/// message to it, with its outbox counters conditioned on what the enqueue
/// read: a racing enqueue of the same aggregate or partition that commits
/// first cancels the commit with a retryable [`StoreError::Unavailable`]
/// (nothing written; run the transaction again).
///
/// DynamoDB refuses two operations on one item in one transaction: a
/// completion replaces a pending checkpoint of the same record (a completed
/// record keeps no checkpoint), and your items must not write the record's
/// own item (they may share its table). DynamoDB caps a transaction at 100
/// items and 4 MB.
///
/// It batches ([`Transaction::batches`]), for a consumer's batch of
/// messages: [`claim`](Transaction::claim) reads the record (one consistent
/// `GetItem`), decides as the store's claim does, and on a claim adds the
/// record's write, conditioned on the table still holding what it read (no
/// live record, or the same lapsed lease); the completion and checkpoints
/// of that claim rewrite that one write. A claim of the same record that
/// commits first elsewhere cancels the commit with a retryable
/// [`StoreError::Unavailable`] naming the record's item: nothing was
/// written. Savepoints are marks in the items gathered, undone in process.
/// [`fits`](Transaction::fits) turns false past 100 items or when a
/// version check found its aggregate written already in it
/// ([`VersionedItems`](crate::VersionedItems)).
///
/// The commit is bounded by the store's
/// [operation timeout](idem_core::StoreOptions::with_operation_timeout); a commit
/// that times out has an unknown outcome, as any `Unavailable`.
///
/// ```no_run
/// use std::sync::Arc;
/// use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
/// use idem_dynamo::DynamoStore;
/// use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
///
/// # async fn example(store: DynamoStore) -> Result<(), Box<dyn std::error::Error>> {
/// let idem = Idempotency::new(Arc::new(store.clone()));
/// let order = TransactWriteItem::builder()
///     .put(
///         Put::builder()
///             .table_name("orders")
///             .item("pk", AttributeValue::S("order#7".into()))
///             .condition_expression("attribute_not_exists(pk)")
///             .build()?,
///     )
///     .build();
/// let scope = Scope::parse("acme", "order-7")?;
/// let outcome = idem
///     .run_in(scope, Fingerprint::of_bytes(b"{...}"), store.begin(), |ctx, mut tx| async move {
///         tx.push(order);
///         ctx.checkpoint_in(&mut tx, "order written", &7).await?;
///         Ok((tx, StoredResponse::new(201, "order 7")))
///     })
///     .await?;
/// # let _ = outcome;
/// # Ok(()) }
/// ```
pub struct DynamoTransaction {
    client: Client,
    settings: Settings,
    items: Vec<TransactWriteItem>,
    records: Vec<RecordWrite>,
    /// The outbox's messages enqueued in it (their log and id items).
    outbox: Vec<TransactWriteItem>,
    /// What the outbox's items weigh, about.
    outbox_bytes: usize,
    /// The outbox's counters it moves, each once, however many messages
    /// took a number from it.
    counters: Vec<Counter>,
    /// The aggregates' items a version check writes in it (table, key,
    /// version): DynamoDB takes one write per item in a transaction.
    versioned: Vec<(String, crate::codec::Item, u64)>,
    /// A version check found its aggregate's item written already: the
    /// transaction no longer [fits](Transaction::fits).
    crowded: bool,
    /// What it held at each open savepoint, the latest last.
    savepoints: Vec<Mark>,
}

/// What a transaction held at a savepoint.
struct Mark {
    items: usize,
    records: Vec<RecordWrite>,
    outbox: usize,
    outbox_bytes: usize,
    counters: Vec<Counter>,
    versioned: usize,
    crowded: bool,
}

/// DynamoDB's most items in one `TransactWriteItems`.
pub(crate) const MAX_TRANSACTION_ITEMS: usize = 100;

/// DynamoDB's largest `TransactWriteItems`, in bytes.
pub(crate) const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// A counter item of the outbox moved from `from` (absent: never moved) to
/// `to`, conditioned on standing at `from`: a racing transaction that moved
/// it first cancels this one.
#[derive(Debug, Clone)]
pub(crate) struct Counter {
    pub(crate) table: String,
    pub(crate) key: crate::codec::Item,
    pub(crate) attr: &'static str,
    pub(crate) from: Option<u64>,
    pub(crate) to: u64,
}

impl Counter {
    /// The conditioned update.
    pub(crate) fn item(&self) -> Result<TransactWriteItem, StoreError> {
        let set = format!("SET #{} = :to", self.attr);
        let condition = match self.from {
            None => format!("attribute_not_exists(#{})", self.attr),
            Some(_) => format!("#{} = :from", self.attr),
        };
        let mut update = aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .set_key(Some(self.key.clone()))
            .set_expression_attribute_names(Some(crate::journal_item::names(&[&set, &condition])))
            .update_expression(set)
            .condition_expression(condition)
            .expression_attribute_values(":to", crate::codec::n(self.to));
        if let Some(from) = self.from {
            update = update.expression_attribute_values(":from", crate::codec::n(from));
        }
        let update = update
            .build()
            .map_err(|e| crate::error::build_failure(Operation::Enqueue, e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }
}

/// A fenced write of the store's own, pending in the transaction.
#[derive(Clone)]
struct RecordWrite {
    key: AttributeValue,
    owner: OwnerToken,
    completes: bool,
    item: TransactWriteItem,
    /// Claimed in this transaction: the record is not the owner's in the
    /// table yet, so its writes carry the claim's condition.
    claimed: Option<Claimed>,
}

/// A claim made inside a transaction.
#[derive(Clone)]
struct Claimed {
    /// The record as the transaction will write it.
    record: Record,
    /// The owner of the lapsed lease the claim takes over, if any.
    read: Option<OwnerToken>,
    /// When the claim was decided.
    at: Timestamp,
}

/// The refusal of a savepoint operation with none open.
fn no_savepoint() -> StoreError {
    StoreError::Misconfigured {
        store: STORE,
        message: "a savepoint was rolled back to or released with none open".into(),
    }
}

impl fmt::Debug for DynamoTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoTransaction")
            .field("table", &self.settings.table)
            .field("items", &self.items.len())
            .field("record_writes", &self.records.len())
            .field("outbox_writes", &(self.outbox.len() + self.counters.len()))
            .finish_non_exhaustive()
    }
}

impl DynamoTransaction {
    pub(crate) fn new(client: Client, settings: Settings) -> Self {
        Self {
            client,
            settings,
            items: Vec::new(),
            records: Vec::new(),
            outbox: Vec::new(),
            outbox_bytes: 0,
            counters: Vec::new(),
            versioned: Vec::new(),
            crowded: false,
            savepoints: Vec::new(),
        }
    }

    /// The version a check of this transaction writes to `key` of
    /// `table` already, if one does: the transaction is then crowded (it
    /// no longer fits), as the item takes no second write.
    pub(crate) fn version_written(&mut self, table: &str, key: &crate::codec::Item) -> Option<u64> {
        let written = self
            .versioned
            .iter()
            .find(|(t, k, _)| t == table && k == key)
            .map(|(_, _, version)| *version);
        self.crowded |= written.is_some();
        written
    }

    /// A version check's update of `key` of `table` to `version`, joining
    /// the transaction.
    pub(crate) fn push_version(
        &mut self,
        table: &str,
        key: &crate::codec::Item,
        version: u64,
        update: TransactWriteItem,
    ) {
        self.versioned
            .push((table.to_string(), key.clone(), version));
        self.items.push(update);
    }

    /// The items the commit would send.
    fn item_count(&self) -> usize {
        self.items.len() + self.outbox.len() + self.counters.len() + self.records.len()
    }

    fn mark(&self) -> Mark {
        Mark {
            items: self.items.len(),
            records: self.records.clone(),
            outbox: self.outbox.len(),
            outbox_bytes: self.outbox_bytes,
            counters: self.counters.clone(),
            versioned: self.versioned.len(),
            crowded: self.crowded,
        }
    }

    fn restore(&mut self, mark: Mark) {
        self.items.truncate(mark.items);
        self.records = mark.records;
        self.outbox.truncate(mark.outbox);
        self.outbox_bytes = mark.outbox_bytes;
        self.counters = mark.counters;
        self.versioned.truncate(mark.versioned);
        self.crowded = mark.crowded;
    }

    /// The claim of `request` in this transaction: the record it writes
    /// already answers for itself (one write per item); otherwise one
    /// consistent `GetItem`, the core's decision table, and on a claim
    /// the record's write joins the transaction, conditioned on what was
    /// read.
    async fn claim_within(&mut self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let key = codec::key(request.scope());
        if let Some(pending) = self.records.iter().find(|w| w.key == key) {
            let now = self.settings.clock.now();
            let outcome = match &pending.claimed {
                Some(claimed) => decide(Some(&claimed.record), request, now).outcome,
                None => ClaimOutcome::InProgress {
                    retry_after: request.lease(),
                },
            };
            // A second owner's claim of a record this transaction writes
            // would be a second write of its item.
            return Ok(match outcome {
                ClaimOutcome::Claimed { .. } if pending.owner != request.owner() => {
                    ClaimOutcome::InProgress {
                        retry_after: Duration::from_millis(1),
                    }
                }
                outcome => outcome,
            });
        }
        let read = self
            .client
            .get_item()
            .table_name(&self.settings.table)
            .key(attr::PK, key.clone())
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(Operation::Claim, e))?;
        // After the response: the service's clock has read its time.
        let now = self.settings.clock.now();
        let existing = read
            .item()
            .map(|item| codec::record(request.scope(), item, Operation::Claim))
            .transpose()?
            .filter(|record| record.is_live(now));
        let decision = decide(existing.as_ref(), request, now);
        let Some(record) = decision.write else {
            return Ok(decision.outcome);
        };
        let read = existing.map(|record| record.owner());
        let item = commands::claimed_in(
            &self.settings.table,
            &record,
            read,
            now,
            self.settings.max_response_bytes,
        )?;
        self.records.push(RecordWrite {
            key,
            owner: request.owner(),
            completes: false,
            item,
            claimed: Some(Claimed {
                record,
                read,
                at: now,
            }),
        });
        Ok(decision.outcome)
    }

    /// The pending write of a record `lease` claimed in this transaction,
    /// rewritten as `change` leaves it; `None` if it claimed none here.
    fn rewrite_claimed(
        &mut self,
        lease: &Lease,
        completes: bool,
        change: impl FnOnce(Record) -> Record,
    ) -> Option<Result<(), StoreError>> {
        let key = codec::key(lease.scope());
        let (table, max) = (&self.settings.table, self.settings.max_response_bytes);
        let pending = self
            .records
            .iter_mut()
            .find(|w| w.key == key && w.claimed.is_some())?;
        if pending.completes || pending.owner != lease.owner() {
            return Some(Err(StoreError::LostLease));
        }
        let claimed = pending.claimed.as_mut()?;
        let record = change(claimed.record.clone());
        let item = match commands::claimed_in(table, &record, claimed.read, claimed.at, max) {
            Ok(item) => item,
            Err(error) => return Some(Err(error)),
        };
        claimed.record = record;
        pending.item = item;
        pending.completes = completes;
        Some(Ok(()))
    }

    /// Where the transaction has moved the counter `key` of `table`
    /// already, if it has.
    pub(crate) fn counter(&self, table: &str, key: &crate::codec::Item) -> Option<u64> {
        self.counters
            .iter()
            .find(|c| c.table == table && c.key == *key)
            .map(|c| c.to)
    }

    /// Adds an enqueued message's items and the counters it moved: a
    /// counter moved already keeps its first condition and moves further.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`](idem_core::InvalidInput::OutOfRange)
    /// when the transaction would exceed DynamoDB's 100 items, or
    /// [`InvalidInput::TooLong`](idem_core::InvalidInput::TooLong) its
    /// 4 MB; nothing is added then.
    pub(crate) fn enqueue(
        &mut self,
        writes: Vec<TransactWriteItem>,
        bytes: usize,
        counters: Vec<Counter>,
    ) -> Result<(), StoreError> {
        let new_counters = counters
            .iter()
            .filter(|c| self.counter(&c.table, &c.key).is_none())
            .count();
        let total = self.items.len()
            + self.records.len()
            + self.outbox.len()
            + self.counters.len()
            + writes.len()
            + new_counters;
        if total > MAX_TRANSACTION_ITEMS {
            return Err(idem_core::InvalidInput::OutOfRange {
                field: "transaction",
                reason: "DynamoDB takes at most 100 items in one TransactWriteItems",
            }
            .into());
        }
        let written = self.outbox_bytes.saturating_add(bytes);
        if written > MAX_TRANSACTION_BYTES {
            return Err(idem_core::InvalidInput::TooLong {
                field: "transaction's outbox messages",
                len: written,
                max: MAX_TRANSACTION_BYTES,
            }
            .into());
        }
        self.outbox_bytes = written;
        self.outbox.extend(writes);
        for counter in counters {
            match self
                .counters
                .iter_mut()
                .find(|c| c.table == counter.table && c.key == counter.key)
            {
                Some(moved) => moved.to = counter.to,
                None => self.counters.push(counter),
            }
        }
        Ok(())
    }

    /// Adds one of your writes (put, update, delete or condition check, on
    /// any table but the store's).
    pub fn push(&mut self, item: TransactWriteItem) {
        self.items.push(item);
    }

    /// The client and the store's settings, for a version check's read.
    pub(crate) fn parts(&self) -> (&Client, &Settings) {
        (&self.client, &self.settings)
    }

    /// Your writes so far, in the order pushed (the indices that
    /// [`StoreError::Rejected`] names).
    pub fn items(&self) -> &[TransactWriteItem] {
        &self.items
    }

    /// Adds or replaces the fenced write of `lease`'s record.
    fn write(
        &mut self,
        lease: &Lease,
        update: FencedUpdate,
        completes: bool,
    ) -> Result<(), StoreError> {
        let key = update.key.clone();
        let item = update.transact_item(&self.settings.table)?;
        let write = RecordWrite {
            key,
            owner: lease.owner(),
            completes,
            item,
            claimed: None,
        };
        match self.records.iter_mut().find(|w| w.key == write.key) {
            // A completed record takes no further fenced write, and two
            // owners of one record cannot both still hold it.
            Some(pending) if pending.completes || pending.owner != write.owner => {
                Err(StoreError::LostLease)
            }
            Some(pending) => {
                *pending = write;
                Ok(())
            }
            None => {
                self.records.push(write);
                Ok(())
            }
        }
    }
}

#[async_trait]
impl Transaction for DynamoTransaction {
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let now = self.settings.clock.now();
        let retained_until = now + lease.retention();
        let completed = |record: Record| record.completed(response.clone(), retained_until);
        if let Some(rewritten) = self.rewrite_claimed(lease, true, completed) {
            return rewritten;
        }
        let update = commands::complete(lease, response, now, self.settings.max_response_bytes)?;
        self.write(lease, update, true)
    }

    async fn checkpoint(
        &mut self,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let recovers = |record: Record| record.with_checkpoint(Some(checkpoint.clone()));
        if let Some(rewritten) = self.rewrite_claimed(lease, false, recovers) {
            return rewritten;
        }
        let now = self.settings.clock.now();
        self.write(lease, commands::checkpoint(lease, checkpoint, now), false)
    }

    fn batches(&self) -> bool {
        true
    }

    fn free_savepoints(&self) -> bool {
        true
    }

    /// At most 100 items and 4 MB of the outbox's messages, and no
    /// aggregate's item checked twice ([`VersionedItems`](crate::VersionedItems)).
    fn fits(&self) -> bool {
        !self.crowded
            && self.item_count() <= MAX_TRANSACTION_ITEMS
            && self.outbox_bytes <= MAX_TRANSACTION_BYTES
    }

    async fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let layer = self.settings.layer;
        layer.claim(request, self.claim_within(request)).await
    }

    async fn savepoint(&mut self) -> Result<(), StoreError> {
        let mark = self.mark();
        self.savepoints.push(mark);
        Ok(())
    }

    async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        let mark = self.savepoints.pop().ok_or_else(no_savepoint)?;
        self.restore(mark);
        Ok(())
    }

    async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoints.pop().ok_or_else(no_savepoint)?;
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
        if self.items.is_empty() && self.records.is_empty() && self.outbox.is_empty() {
            return Ok(());
        }
        let callers = self.items.len();
        let mut items = self.items;
        items.extend(self.outbox);
        for counter in &self.counters {
            items.push(counter.item()?);
        }
        // The outbox's items stand between the caller's and the record's.
        let records = items.len();
        if records + self.records.len() > MAX_TRANSACTION_ITEMS {
            return Err(idem_core::InvalidInput::OutOfRange {
                field: "transaction",
                reason: "DynamoDB takes at most 100 items in one TransactWriteItems",
            }
            .into());
        }
        let claims: Vec<bool> = self.records.iter().map(|w| w.claimed.is_some()).collect();
        items.extend(self.records.into_iter().map(|w| w.item));
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send();
        let layer = self.settings.layer;
        let result = layer.call(OP, None, async { Ok(sent.await) }).await?;
        let Err(error) = result else {
            return Ok(());
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            error.as_service_error()
        else {
            return Err(classify(OP, error));
        };
        let reasons: Vec<(usize, &str)> = cancelled
            .cancellation_reasons()
            .iter()
            .enumerate()
            .filter_map(|(i, reason)| reason.code().map(|code| (i, code)))
            .filter(|(_, code)| *code != NO_FAILURE)
            .collect();
        // A claim made in this transaction whose record another claim
        // took and committed first: nothing was written, and claimed again
        // the record answers for itself.
        if let Some(&(i, code)) = reasons
            .iter()
            .find(|&&(i, _)| i >= records && claims.get(i - records) == Some(&true))
        {
            return Err(StoreError::Unavailable {
                store: STORE,
                operation: OP,
                message: format!(
                    "item #{i}, a record claimed in the transaction, cancelled it ({code}): \
                     another claim of it committed first; nothing was written"
                ),
                source: Some(Box::new(error)),
            });
        }
        if reasons
            .iter()
            .any(|&(i, code)| i >= records && code == CONDITION_FAILED)
        {
            return Err(StoreError::LostLease);
        }
        // A racing transaction took a sequence or a position this one
        // counted on: nothing was written, and run again it counts anew.
        if reasons
            .iter()
            .any(|&(i, code)| i >= callers && code == CONDITION_FAILED)
        {
            return Err(StoreError::Unavailable {
                store: STORE,
                operation: OP,
                message: "a racing enqueue took the outbox's next sequence or position first: \
                          nothing was written; run the transaction again"
                    .into(),
                source: Some(Box::new(error)),
            });
        }
        if reasons
            .iter()
            .any(|(_, code)| RETRYABLE_REASONS.contains(code))
        {
            return Err(StoreError::from_driver(true, STORE, OP, error));
        }
        let rejected: Vec<String> = reasons
            .iter()
            .filter(|&&(i, _)| i < callers)
            .map(|(i, code)| format!("#{i} ({code})"))
            .collect();
        if rejected.is_empty() {
            return Err(classify(OP, error));
        }
        Err(StoreError::Rejected {
            store: STORE,
            operation: OP,
            message: format!(
                "the caller's items {} cancelled the transaction",
                rejected.join(", ")
            ),
            source: Some(Box::new(error)),
        })
    }
}
