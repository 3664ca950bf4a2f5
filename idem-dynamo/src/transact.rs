//! Completion as one item of the caller's `TransactWriteItems`.

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::TransactWriteItem;
use idem_core::{Lease, StoreError, StoredResponse};

use crate::error::classify;
use crate::store::DynamoStore;

/// One of the caller's items that cancelled a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectedItem {
    /// Its position in the caller's `business_items`.
    pub index: usize,
    /// DynamoDB's cancellation code (`ConditionalCheckFailed`, `ValidationError`, ...).
    pub code: String,
    /// DynamoDB's message, if any.
    pub message: Option<String>,
}

/// Why [`DynamoStore::complete_with`] wrote nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactError {
    /// The caller's items cancelled the transaction; the completion did not
    /// happen either, and the lease still holds.
    #[error("the transaction was cancelled by the caller's items {}", describe(.0))]
    ItemsRejected(Vec<RejectedItem>),
    /// The store failed, or the lease was lost ([`StoreError::LostLease`]):
    /// nothing was written, the caller's items included.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn describe(items: &[RejectedItem]) -> String {
    items
        .iter()
        .map(|item| format!("#{} ({})", item.index, item.code))
        .collect::<Vec<_>>()
        .join(", ")
}

impl TransactError {
    /// Whether the lease was lost (another owner took over, or it completed).
    pub fn is_lost_lease(&self) -> bool {
        matches!(self, Self::Store(StoreError::LostLease))
    }
}

impl DynamoStore {
    /// The `TransactWriteItem` that completes the record under `lease`, for
    /// the caller's own `TransactWriteItems`: the business items and the
    /// completion commit together or not at all. If the transaction is
    /// cancelled with `ConditionalCheckFailed` on this item, the lease was lost.
    ///
    /// # Errors
    ///
    /// [`StoreError::TooLarge`] if the response cannot fit one item.
    pub fn complete_item(
        &self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<TransactWriteItem, StoreError> {
        Ok(TransactWriteItem::builder()
            .update(self.completion(lease, response)?)
            .build())
    }

    /// Completes the record and writes `business_items` in one
    /// `TransactWriteItems` (one round trip): all of it commits, or none.
    ///
    /// # Errors
    ///
    /// [`TransactError::Store`] with [`StoreError::LostLease`] when the lease
    /// no longer holds (roll back nothing: nothing was written);
    /// [`TransactError::ItemsRejected`] naming the caller's items that
    /// cancelled the transaction; other store errors as usual.
    pub async fn complete_with(
        &self,
        lease: &Lease,
        response: &StoredResponse,
        business_items: Vec<TransactWriteItem>,
    ) -> Result<(), TransactError> {
        let mut items = Vec::with_capacity(business_items.len() + 1);
        items.push(self.complete_item(lease, response)?);
        items.extend(business_items);
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        let Err(error) = result else {
            return Ok(());
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            error.as_service_error()
        else {
            return Err(classify("transact completion", error).into());
        };
        let failed = |code: Option<&str>| code.is_some_and(|c| c != "None");
        let reasons = cancelled.cancellation_reasons();
        if reasons
            .first()
            .is_some_and(|ours| ours.code() == Some("ConditionalCheckFailed"))
        {
            return Err(StoreError::LostLease.into());
        }
        let rejected: Vec<RejectedItem> = reasons
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, reason)| failed(reason.code()))
            .map(|(i, reason)| RejectedItem {
                index: i - 1,
                code: reason.code().unwrap_or_default().to_string(),
                message: reason.message().map(str::to_string),
            })
            .collect();
        if rejected.is_empty() {
            return Err(classify("transact completion", error).into());
        }
        Err(TransactError::ItemsRejected(rejected))
    }
}
