//! Maps driver errors onto [`StoreError`] by the driver's own classification.

use idem_core::StoreError;
use redis::{RedisError, RetryMethod};

/// Classifies a driver error for the operation `what`.
pub(crate) fn classify(what: &str, error: RedisError) -> StoreError {
    let retryable = error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || !matches!(error.retry_method(), RetryMethod::NoRetry);
    StoreError::from_driver(retryable, format!("redis {what} failed"), error)
}

/// A reply that the scripts should have made impossible.
pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Backend {
        message: format!("redis returned an unexpected {what}"),
        source: None,
    }
}
