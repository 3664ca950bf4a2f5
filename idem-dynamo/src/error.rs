//! Maps SDK errors onto [`StoreError`] by type and service error code, never by message text.

use std::error::Error as StdError;
use std::fmt::Debug;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem_core::StoreError;

/// Service error codes after which the same call may succeed.
const RETRYABLE_CODES: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "ThrottlingException",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "TransactionInProgressException",
];

/// Classifies an SDK error for the operation `what`.
pub(crate) fn classify<E, R>(what: &str, error: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    R: Debug + Send + Sync + 'static,
{
    let retryable = match &error {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => service
            .err()
            .code()
            .is_some_and(|code| RETRYABLE_CODES.contains(&code)),
        _ => false,
    };
    StoreError::from_driver(retryable, format!("dynamodb {what} failed"), error)
}

/// An item that the store's own writes should have made impossible.
pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Backend {
        message: format!("dynamodb returned an item with a bad {what}"),
        source: None,
    }
}
