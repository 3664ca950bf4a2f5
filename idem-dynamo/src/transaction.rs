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
        }
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
        if self.items.is_empty() && self.records.is_empty() {
            return Ok(());
        }
        let callers = self.items.len();
        let mut items = self.items;
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
            .any(|&(i, code)| i >= callers && code == CONDITION_FAILED)
        {
            return Err(StoreError::LostLease);
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
