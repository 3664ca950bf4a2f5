//! `DynamoStore`: the trait implementation and the fenced writes.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure, Update};
use idem_core::{
    Capabilities, Checkpoint, ClaimOutcome, ClaimRequest, Clock, ClockSource, Durability,
    IdempotencyStore, InvalidInput, Lease, Record, Scope, StoreError, StoredResponse, SystemClock,
    Timestamp, TransactionSharing, async_trait, validate_lease_ttl,
};

use crate::config::{DEFAULT_MAX_RESPONSE_BYTES, ITEM_LIMIT, ITEM_OVERHEAD, TableName};
use crate::error::{classify, corrupt};
use crate::item::{self, attr, b, n, s};

use crate::expressions::{COMPLETE_UPDATE, FENCE};

/// The DynamoDB store, over the caller's `aws_sdk_dynamodb::Client`.
///
/// DynamoDB has no clock to ask, so leases and retention are judged by the
/// caller's clock ([`ClockSource::Caller`]). Callers' clocks must agree to
/// within a small part of the lease: a caller whose clock runs `d` ahead
/// sees leases expire `d` early and may take over a live owner `d` before its
/// lease ends (its fenced writes then fail with `LostLease`, so nothing is
/// written twice, but work may run twice). With NTP-synchronised hosts
/// (skew of milliseconds) and leases of seconds, that margin is ample; keep
/// leases at least 100 times the skew you expect.
///
/// ```no_run
/// use idem_dynamo::{aws_sdk_dynamodb, DynamoStore};
///
/// # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
/// let client = aws_sdk_dynamodb::Client::from_conf(config);
/// let store = DynamoStore::new(client, "idem-records")?;
/// store.create_table().await?; // tests and quick starts
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) client: Client,
    pub(crate) table: TableName,
    clock: Arc<dyn Clock>,
    max_response_bytes: usize,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("clock", &self.clock)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    /// A store on `table`, on the system clock.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] if `table` is not a valid DynamoDB table name.
    pub fn new(client: Client, table: &str) -> Result<Self, InvalidInput> {
        Ok(Self {
            client,
            table: TableName::new(table)?,
            clock: Arc::new(SystemClock),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        })
    }

    /// Judges leases and retention by `clock` (tests inject a manual clock).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Lowers the largest response accepted (the default is what an item holds).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] above [`DEFAULT_MAX_RESPONSE_BYTES`].
    pub fn with_max_response_bytes(mut self, max: usize) -> Result<Self, InvalidInput> {
        if max > DEFAULT_MAX_RESPONSE_BYTES {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "a DynamoDB item holds 400 KB, the record's own attributes included",
            });
        }
        self.max_response_bytes = max;
        Ok(self)
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The values [`FENCE`] names, for the lease at `now`; more are added
    /// beside them.
    fn fence_values(lease: &Lease, now: Timestamp) -> HashMap<String, AttributeValue> {
        HashMap::from([
            (":own".to_string(), s(lease.owner().to_string())),
            (":f".to_string(), s("f")),
            (":now".to_string(), n(now.as_unix_millis())),
        ])
    }

    /// An `UpdateItem` on the lease's record, fenced on its owner.
    fn fenced_update(&self, lease: &Lease, now: Timestamp) -> UpdateItemFluentBuilder {
        self.client
            .update_item()
            .table_name(self.table.as_str())
            .key(attr::PK, s(crate::item_key(lease.scope())))
            .condition_expression(FENCE)
            .expression_attribute_names("#exp", attr::EXPIRES)
            .set_expression_attribute_values(Some(Self::fence_values(lease, now)))
    }

    /// Refuses a response that cannot fit one item, before anything is written.
    fn check_size(&self, lease: &Lease, response: &StoredResponse) -> Result<Vec<u8>, StoreError> {
        let headers = response.encoded_headers();
        let scope = lease.scope();
        // DynamoDB counts attribute names and values: names (32 bytes),
        // fingerprint (32), owner (36), status (1), four numbers (21 each at
        // most), the key's length digits and colons (5), then tenant and key
        // twice (in `pk` and on their own), headers and body.
        let item = 190
            + 2 * (scope.tenant().as_str().len() + scope.key().as_str().len())
            + headers.len()
            + response.body().len();
        if response.size() > self.max_response_bytes || item > ITEM_LIMIT {
            return Err(StoreError::TooLarge {
                size: response.size().max(item.saturating_sub(ITEM_OVERHEAD)),
                max: self.max_response_bytes,
            });
        }
        Ok(headers)
    }

    /// The completion as one `Update`, fenced on the lease: for
    /// [`IdempotencyStore::complete`] and for the caller's own transactions.
    pub(crate) fn completion(
        &self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<Update, StoreError> {
        let headers = self.check_size(lease, response)?;
        let now = self.now();
        let expires = now + lease.retention();
        Update::builder()
            .table_name(self.table.as_str())
            .key(attr::PK, s(crate::item_key(lease.scope())))
            .update_expression(COMPLETE_UPDATE)
            .condition_expression(FENCE)
            .expression_attribute_names("#exp", attr::EXPIRES)
            .expression_attribute_names("#ttl", attr::TTL)
            .set_expression_attribute_values(Some(Self::fence_values(lease, now)))
            .expression_attribute_values(":c", s("c"))
            .expression_attribute_values(":rs", n(response.status()))
            .expression_attribute_values(":rh", b(headers))
            .expression_attribute_values(":rb", b(response.body().to_vec()))
            .expression_attribute_values(":exp", n(expires.as_unix_millis()))
            .expression_attribute_values(":ttl", n(expires.as_unix_secs_ceil()))
            .expression_attribute_values(":att", n(lease.attempt()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| StoreError::backend("building the completion", e))
    }
}

/// A fenced write's result: a failed condition is a lost lease.
fn fenced<T, R>(
    what: &str,
    result: Result<T, SdkError<UpdateItemError, R>>,
) -> Result<T, StoreError>
where
    R: fmt::Debug + Send + Sync + 'static,
{
    result.map_err(|error| match error.as_service_error() {
        Some(UpdateItemError::ConditionalCheckFailedException(_)) => StoreError::LostLease,
        _ => classify(what, error),
    })
}

#[async_trait]
impl IdempotencyStore for DynamoStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.claim_item(request).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let update = self.completion(lease, response)?;
        let sent = self
            .client
            .update_item()
            .table_name(update.table_name())
            .set_key(Some(update.key().clone()))
            .update_expression(update.update_expression())
            .set_condition_expression(update.condition_expression().map(str::to_string))
            .set_expression_attribute_names(update.expression_attribute_names().cloned())
            .set_expression_attribute_values(update.expression_attribute_values().cloned())
            .send()
            .await;
        fenced("complete", sent).map(|_| ())
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = validate_lease_ttl(extend)?;
        let now = self.now();
        let until = now + extend;
        // The record must outlive the lease; without max() in update
        // expressions, keep retention from now, as a fresh claim would.
        let expires = now + extend.max(lease.retention());
        let sent = self
            .fenced_update(lease, now)
            .update_expression("SET lease = :lease, #exp = :exp, #ttl = :ttl")
            .expression_attribute_names("#ttl", attr::TTL)
            .expression_attribute_values(":lease", n(until.as_unix_millis()))
            .expression_attribute_values(":exp", n(expires.as_unix_millis()))
            .expression_attribute_values(":ttl", n(expires.as_unix_secs_ceil()))
            .send()
            .await;
        fenced("renew", sent)?;
        Ok(lease.renewed(until))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let now = self.now();
        self.client
            .delete_item()
            .table_name(self.table.as_str())
            .key(attr::PK, s(crate::item_key(lease.scope())))
            .condition_expression(FENCE)
            .expression_attribute_names("#exp", attr::EXPIRES)
            .set_expression_attribute_values(Some(Self::fence_values(lease, now)))
            .send()
            .await
            .map_err(|error| match error.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => StoreError::LostLease,
                _ => classify("release", error),
            })?;
        Ok(())
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let sent = self
            .fenced_update(lease, self.now())
            .update_expression("SET cpn = :cpn, cpd = :cpd")
            .expression_attribute_values(":cpn", s(checkpoint.name()))
            .expression_attribute_values(":cpd", s(checkpoint.data_json()))
            .send()
            .await;
        fenced("checkpoint", sent).map(|_| ())
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(self.table.as_str())
            .key(attr::PK, s(crate::item_key(scope)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify("get", e))?;
        match output.item() {
            // TTL deletes lazily: an item past retention counts as absent.
            Some(found) if item::is_live(found, self.now()) => item::record(scope, found).map(Some),
            _ => Ok(None),
        }
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = self.now();
        let mut deleted = 0;
        let mut pages = self
            .client
            .scan()
            .table_name(self.table.as_str())
            .filter_expression("#exp <= :now")
            .projection_expression("pk")
            .expression_attribute_names("#exp", attr::EXPIRES)
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| classify("purge scan", e))?;
            for found in page.items() {
                let key = found.get(attr::PK).ok_or_else(|| corrupt(attr::PK))?;
                // Conditional, so a record claimed afresh since the scan stays.
                let result = self
                    .client
                    .delete_item()
                    .table_name(self.table.as_str())
                    .key(attr::PK, key.clone())
                    .condition_expression("#exp <= :now")
                    .expression_attribute_names("#exp", attr::EXPIRES)
                    .expression_attribute_values(":now", n(now.as_unix_millis()))
                    .send()
                    .await;
                match result {
                    Ok(_) => deleted += 1,
                    Err(error) => match error.as_service_error() {
                        Some(DeleteItemError::ConditionalCheckFailedException(_)) => {}
                        _ => return Err(classify("purge delete", error)),
                    },
                }
            }
        }
        Ok(deleted)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            TransactionSharing::TransactItems,
            Durability::Durable,
            ClockSource::Caller,
            self.max_response_bytes,
        )
    }
}
