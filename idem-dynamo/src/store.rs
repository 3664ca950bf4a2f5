//! `DynamoStore`: construction, the table, and the trait implementation.

use aws_sdk_dynamodb::operation::create_table::CreateTableError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    BillingMode, KeyType, ReturnValue, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TimeToLiveSpecification,
};
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, IdempotencyStore, Lease, Record, Timestamp,
    validate_lease,
};
use idem_core::{Checkpoint, Operation, Scope, StoreError, StoredResponse, async_trait};
use std::future::Future;
use std::time::Duration;

use crate::codec::{self, attr, key, n};
use crate::commands::{self, PAST_RETENTION, RELEASE_CONDITION, fence_values};
use crate::error::{build_failure, classify, corrupt, fenced, is_condition_failure};
use crate::options::DynamoOptions;
use crate::part::{attribute_definition, key_element};
use crate::transaction::DynamoTransaction;

crate::part::dynamo_part!(
    /// The DynamoDB store, over the caller's `aws_sdk_dynamodb::Client`.
    ///
    /// DynamoDB evaluates no clock of its own in a condition, so the store
    /// sends the time: by default the service's, read from the `Date`
    /// header of DynamoDB's responses ([`ServiceClock`](crate::ServiceClock)),
    /// so callers whose own clocks disagree by hours still judge leases and
    /// retention within about a second of each other (keep leases well
    /// over a second; the default is 30 s). With
    /// [`DynamoOptions::clock`](crate::DynamoOptions) the caller's clock
    /// judges instead: callers' clocks must then agree to within a small part of the lease,
    /// since a caller whose clock runs `d` ahead sees leases expire `d`
    /// early and may take over a live owner `d` before its lease ends (its
    /// fenced writes then fail with `LostLease`, so nothing is written
    /// twice, but work may run twice). Either way the clock is read in this
    /// process, so [`Capabilities::clock`](idem_core::store::Capabilities) is
    /// [`ClockSource::Caller`](idem_core::store::ClockSource::Caller): a cache
    /// in front judges by it without a request.
    ///
    /// Every operation goes through the store's
    /// [`OperationLayer`](idem_core::store::OperationLayer): it is bounded by the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout) (5 s
    /// by default), the SDK's retries included, ends in a retryable
    /// [`StoreError::Unavailable`] past it, and gets its span and metrics
    /// whoever calls it.
    ///
    /// ```no_run
    /// use idem_dynamo::{aws_sdk_dynamodb, DynamoOptions, DynamoStore};
    ///
    /// # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = aws_sdk_dynamodb::Client::from_conf(config);
    /// let store = DynamoStore::with_options(client, DynamoOptions::default().table("orders-idem"))?;
    /// store.create_table().await?; // tests and quick starts
    /// # Ok(()) }
    /// ```
    pub struct DynamoStore => records: Records, forward_store,
    DynamoOptions, DEFAULT_TABLE, crate::DEFAULT_MAX_RESPONSE_BYTES, "store"
);

impl DynamoStore {
    /// Opens a transaction that the completion (and checkpoints) of a run
    /// join: your items and the record commit in one `TransactWriteItems`.
    /// No request is sent until [`commit`](idem_core::store::Transaction::commit);
    /// it is `async` to fit [`Idempotency::run_in`](idem_core::Idempotency::run_in).
    /// See [`DynamoTransaction`].
    ///
    /// # Errors
    ///
    /// None today; the signature leaves room for one.
    pub fn begin(
        &self,
    ) -> impl Future<Output = Result<DynamoTransaction, StoreError>> + Send + use<> {
        // Owned, so `move || store.begin()` can open one per request.
        let Records { client, settings } = self.parts().clone();
        std::future::ready(Ok(DynamoTransaction::new(client, settings)))
    }

    /// Creates the table if it does not exist, and enables TTL on it.
    ///
    /// The definition, for those who create tables with their own tools:
    ///
    /// - partition key `pk`, type `S` (no sort key):
    ///   [`storage_key`](idem_core::store::storage_key) of the scope,
    ///   `<n>:<tenant>:<key>`;
    /// - billing mode on demand (`PAY_PER_REQUEST`) here; provisioned works too;
    /// - Time to Live enabled on the attribute `ttl` (epoch seconds). TTL
    ///   deletes lazily, so the store checks retention (`exp`, epoch
    ///   milliseconds) on every read and write itself.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`] from DynamoDB.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        const OP: Operation = Operation::Setup;
        let created = self
            .client()
            .create_table()
            .table_name(self.table())
            .attribute_definitions(attribute_definition(attr::PK, ScalarAttributeType::S)?)
            .key_schema(key_element(attr::PK, KeyType::Hash)?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        if let Err(error) = created {
            return match error.as_service_error() {
                Some(CreateTableError::ResourceInUseException(_)) => Ok(()),
                _ => Err(classify(OP, error)),
            };
        }
        crate::part::wait_until_active(self.client(), self.table()).await?;
        self.client()
            .update_time_to_live()
            .table_name(self.table())
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(attr::TTL)
                    .enabled(true)
                    .build()
                    .map_err(|e| build_failure(OP, e))?,
            )
            .send()
            .await
            .map_err(|e| classify(OP, e))?;
        Ok(())
    }
}

#[async_trait]
impl IdempotencyStore for Records {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        crate::claim::claim(
            &self.client,
            self.table(),
            request,
            self.synced_now().await?,
        )
        .await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let now = self.synced_now().await?;
        let update = commands::complete(lease, response, now, self.settings.max_response_bytes)?;
        async {
            let sent = update
                .request(&self.client, self.table())
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let Err(error) = sent else {
                return Ok(());
            };
            // A second delivery (the SDK resends after a lost reply, the
            // caller after a timeout) finds the record this very completion
            // wrote: answer as the first did.
            if let Some(UpdateItemError::ConditionalCheckFailedException(failed)) =
                error.as_service_error()
                && let Some(old) = failed.item()
                && codec::is_live(old, now)
                && codec::record(lease.scope(), old, Operation::Complete)
                    .is_ok_and(|record| record.is_completed_by(lease, response))
            {
                return Ok(());
            }
            Err(fenced(Operation::Complete, error))
        }
        .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = validate_lease(extend)?;
        let now = self.synced_now().await?;
        let until = now + extend;
        async {
            let within = commands::renew_within_retention(lease, until, now)
                .request(&self.client, self.table())
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let Err(error) = within else {
                return Ok(lease.renewed(until));
            };
            let retained_short = matches!(
                error.as_service_error(),
                Some(UpdateItemError::ConditionalCheckFailedException(failed))
                    if failed.item().is_some_and(|old| commands::held_but_retained_short(old, lease, now, until))
            );
            if !retained_short {
                return Err(fenced(Operation::Renew, error));
            }
            commands::renew_stretching_retention(lease, until, now)
                .request(&self.client, self.table())
                .send()
                .await
                .map_err(|e| fenced(Operation::Renew, e))?;
            Ok(lease.renewed(until))
        }
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let sent = self
            .client
            .delete_item()
            .table_name(self.table())
            .key(attr::PK, key(lease.scope()))
            // Held by this lease, or held by nobody (released already: a
            // second delivery; or past retention, which counts as absent).
            .condition_expression(RELEASE_CONDITION)
            .expression_attribute_names("#exp", attr::EXPIRES)
            .set_expression_attribute_values(Some(fence_values(lease, self.synced_now().await?)))
            .send();
        sent.await.map_err(|e| fenced(Operation::Release, e))?;
        Ok(())
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let sent = commands::checkpoint(lease, checkpoint, self.synced_now().await?)
            .request(&self.client, self.table())
            .send();
        sent.await.map_err(|e| fenced(Operation::Checkpoint, e))?;
        Ok(())
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let sent = self
            .client
            .get_item()
            .table_name(self.table())
            .key(attr::PK, key(scope))
            .consistent_read(true)
            .send();
        let output = sent.await.map_err(|e| classify(Operation::Get, e))?;
        match output.item() {
            // TTL deletes lazily: an item past retention counts as absent.
            Some(found) if codec::is_live(found, self.synced_now().await?) => {
                codec::record(scope, found, Operation::Get).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Each request (a scan page, a delete) is bounded by the operation
    /// timeout, not the whole sweep. Deletes only records past their
    /// retention by [`SWEEP_MARGIN`](crate::clock::SWEEP_MARGIN) more, so a
    /// caller whose clock lags this one's never finds gone a record it
    /// still takes for live.
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        const OP: Operation = Operation::Purge;
        let layer = self.settings.layer;
        let swept_to = self.synced_now().await? - crate::clock::SWEEP_MARGIN;
        let now = n(swept_to.as_unix_millis());
        let mut deleted = 0;
        let mut pages = self
            .client
            .scan()
            .table_name(self.table())
            .filter_expression(PAST_RETENTION)
            .projection_expression(attr::PK)
            .expression_attribute_names("#exp", attr::EXPIRES)
            .expression_attribute_values(":now", now.clone())
            .into_paginator()
            .send();
        while let Some(page) = layer.timed(OP, async { Ok(pages.next().await) }).await? {
            let page = page.map_err(|e| classify(OP, e))?;
            for found in page.items() {
                let pk = found.get(attr::PK).ok_or_else(|| corrupt(OP, attr::PK))?;
                // Conditional, so a record claimed afresh since the scan stays.
                let sent = self
                    .client
                    .delete_item()
                    .table_name(self.table())
                    .key(attr::PK, pk.clone())
                    .condition_expression(PAST_RETENTION)
                    .expression_attribute_names("#exp", attr::EXPIRES)
                    .expression_attribute_values(":now", now.clone())
                    .send();
                match layer.timed(OP, async { Ok(sent.await) }).await? {
                    Ok(_) => deleted += 1,
                    Err(error) if is_condition_failure(&error) => {}
                    Err(error) => return Err(classify(OP, error)),
                }
            }
        }
        Ok(deleted)
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let now = self.synced_now().await?;
        let sent = self
            .client
            .delete_item()
            .table_name(self.table())
            .key(attr::PK, key(scope))
            .return_values(ReturnValue::AllOld)
            .send();
        let output = sent.await.map_err(|e| classify(Operation::Delete, e))?;
        // TTL deletes lazily: an item past retention was not a live record.
        Ok(output
            .attributes()
            .is_some_and(|old| codec::is_live(old, now)))
    }

    async fn now(&self, _scope: &Scope) -> Result<Timestamp, StoreError> {
        Ok(self.synced_now().await?)
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(self.settings.max_response_bytes)
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::Client;
    use aws_sdk_dynamodb::config::{Credentials, Region};
    use idem_core::{InvalidInput, StoreOptions};

    use super::*;

    #[test]
    fn a_zero_operation_timeout_is_refused_at_construction() {
        // Building a client sends nothing.
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version_latest()
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "unit"))
            .build();
        let client = Client::from_conf(config);
        let with_timeout = |limit| {
            DynamoOptions::default()
                .store_options(StoreOptions::default().with_operation_timeout(limit))
        };
        assert!(matches!(
            DynamoStore::with_options(client.clone(), with_timeout(Duration::ZERO)),
            Err(StoreError::InvalidInput(InvalidInput::OutOfRange {
                field: "operation timeout",
                reason: "must be more than zero",
            }))
        ));
        let store =
            DynamoStore::with_options(client.clone(), with_timeout(Duration::from_millis(1)))
                .expect("any limit above zero");
        assert_eq!(
            store.records.layer().timeout(),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            DynamoStore::new(client).records.layer().timeout(),
            Some(StoreOptions::DEFAULT_OPERATION_TIMEOUT)
        );
    }
}
