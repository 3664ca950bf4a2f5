//! Maps SDK errors onto [`StoreError`] by type and service error code, never
//! by message text.

use std::error::Error as StdError;
use std::fmt::Debug;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use idem_core::{Operation, StoreError};

/// The store's name in every [`StoreError`] it returns.
pub(crate) const STORE: &str = "dynamodb";

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

/// Cancellation reasons of a transaction (one per item) after which the same
/// transaction may succeed.
pub(crate) const RETRYABLE_REASONS: &[&str] = &[
    "TransactionConflict",
    "ProvisionedThroughputExceeded",
    "ThrottlingError",
    "RequestLimitExceeded",
];

/// The service's code for a refused condition.
const CONDITION_FAILED: &str = "ConditionalCheckFailedException";

/// Classifies an SDK error of `operation`: unavailable when a retry may
/// succeed, a backend failure otherwise.
pub(crate) fn classify<E, R>(operation: Operation, error: SdkError<E, R>) -> StoreError
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
    StoreError::from_driver(retryable, STORE, operation, error)
}

/// A fenced write's error: a refused condition is a lost lease, the rest is
/// classified.
pub(crate) fn fenced<E, R>(operation: Operation, error: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    R: Debug + Send + Sync + 'static,
{
    if is_condition_failure(&error) {
        StoreError::LostLease
    } else {
        classify(operation, error)
    }
}

/// Whether the service refused the request's condition.
pub(crate) fn is_condition_failure<E, R>(error: &SdkError<E, R>) -> bool
where
    E: ProvideErrorMetadata,
{
    error
        .as_service_error()
        .is_some_and(|e| e.code() == Some(CONDITION_FAILED))
}

/// A request the SDK refused to build (a missing required field): a bug of
/// this crate, never worth retrying.
pub(crate) fn build_failure(
    operation: Operation,
    error: aws_sdk_dynamodb::error::BuildError,
) -> StoreError {
    StoreError::from_driver(false, STORE, operation, error)
}

/// An item that the store's own writes cannot have produced.
pub(crate) fn corrupt(operation: Operation, field: &'static str) -> StoreError {
    StoreError::corrupt(STORE, operation, field)
}
