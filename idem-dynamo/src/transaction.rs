//! `DynamoTransaction`: the caller's items and the record's fenced writes in
//! one `TransactWriteItems`.

use std::fmt;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem};
use idem_core::store::{Lease, OwnerToken, Transaction};
use idem_core::{Checkpoint, Operation, StoreError, StoredResponse, async_trait};

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
struct RecordWrite {
    key: AttributeValue,
    owner: OwnerToken,
    completes: bool,
    item: TransactWriteItem,
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
        }
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
        let update = commands::complete(lease, response, now, self.settings.max_response_bytes)?;
        self.write(lease, update, true)
    }

    async fn checkpoint(
        &mut self,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let now = self.settings.clock.now();
        self.write(lease, commands::checkpoint(lease, checkpoint, now), false)
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
