//! The time limit a networked store puts on each of its operations, written
//! once here so every store times out the same way and says so the same way.

use std::future::Future;
use std::time::Duration;

use crate::error::{InvalidInput, Operation, StoreError};

/// Runs `future`, one operation of `store`, for at most `limit`.
///
/// Past the limit the future is dropped (whatever it was waiting for, a
/// connection, a reply, the driver's own retries) and the operation ends in
/// [`StoreError::Unavailable`] naming `store` and `operation`, with a message
/// that says it timed out. As for every `Unavailable`, the operation may or
/// may not have happened: a retry with the same request or lease gets the
/// true answer, since every operation is safe to deliver twice. A limit too
/// far ahead to represent (such as [`Duration::MAX`]) is no limit.
///
/// Needs a tokio runtime with its timer enabled, as every networked driver does.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Operation, StoreError};
/// use idem_core::store::with_timeout;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let quick = with_timeout("example", Operation::Get, Duration::from_secs(5), async { Ok(7) });
/// assert_eq!(quick.await?, 7);
///
/// let stalled = std::future::pending::<Result<(), StoreError>>();
/// let err = with_timeout("example", Operation::Claim, Duration::from_millis(10), stalled)
///     .await
///     .unwrap_err();
/// assert!(err.is_retryable());
/// assert_eq!(err.to_string(), "example claim: unavailable: timed out after 10ms");
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
///
/// # Errors
///
/// What `future` returns, or [`StoreError::Unavailable`] past the limit.
pub async fn with_timeout<T>(
    store: &'static str,
    operation: Operation,
    limit: Duration,
    future: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, future).await {
        Ok(result) => result,
        Err(_elapsed) => Err(StoreError::unavailable(
            store,
            operation,
            format!("timed out after {limit:?}"),
        )),
    }
}

/// Validates an operation timeout: anything above zero (a zero limit would
/// fail every operation before it starts).
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] for [`Duration::ZERO`].
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::validate_operation_timeout;
///
/// assert!(validate_operation_timeout(Duration::from_secs(5)).is_ok());
/// assert!(validate_operation_timeout(Duration::ZERO).is_err());
/// ```
pub fn validate_operation_timeout(limit: Duration) -> Result<Duration, InvalidInput> {
    if limit.is_zero() {
        return Err(InvalidInput::OutOfRange {
            field: "operation timeout",
            reason: "must be more than zero",
        });
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stalled_operation_is_unavailable_at_its_limit() {
        let limit = Duration::from_millis(40);
        let started = tokio::time::Instant::now();
        let err = with_timeout(
            "s",
            Operation::Complete,
            limit,
            std::future::pending::<Result<(), StoreError>>(),
        )
        .await
        .unwrap_err();
        assert!(started.elapsed() >= limit);
        assert!(matches!(
            &err,
            StoreError::Unavailable {
                store: "s",
                operation: Operation::Complete,
                message,
                ..
            } if message.contains("timed out")
        ));
    }

    #[tokio::test]
    async fn errors_within_the_limit_pass_through_and_no_limit_never_fires() {
        let lost = with_timeout("s", Operation::Renew, Duration::from_secs(60), async {
            Err::<(), _>(StoreError::LostLease)
        })
        .await;
        assert!(matches!(lost, Err(StoreError::LostLease)));
        let late = with_timeout("s", Operation::Get, Duration::MAX, async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(1)
        })
        .await;
        assert_eq!(late.ok(), Some(1));
    }
}
