//! Maps driver errors onto [`StoreError`] by the driver's own classification.

use idem_core::{Operation, StoreError};
use redis::{RedisError, RetryMethod};

/// The store's name in every error it reports.
pub(crate) const STORE: &str = "redis";

/// Classifies a driver error of the operation `operation`: retryable
/// (connection, timeout, or anything the driver would retry) is
/// [`StoreError::Unavailable`], the rest [`StoreError::Backend`].
pub(crate) fn classify(operation: Operation, error: RedisError) -> StoreError {
    let retryable = error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || !matches!(error.retry_method(), RetryMethod::NoRetry);
    StoreError::from_driver(retryable, STORE, operation, error)
}

/// A reply that the scripts should have made impossible: `field` does not decode.
pub(crate) fn corrupt(operation: Operation, field: &'static str) -> StoreError {
    StoreError::corrupt(STORE, operation, field)
}
