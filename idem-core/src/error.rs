//! Typed errors: bad input refused before anything is written, and store failures.

use std::error::Error as StdError;

/// A value that breaks one of idem's input rules. Nothing was written.
///
/// ```
/// use idem_core::{IdempotencyKey, InvalidInput};
///
/// let err = IdempotencyKey::new("").unwrap_err();
/// assert_eq!(err, InvalidInput::Empty { field: "key" });
/// assert_eq!(err.to_string(), "key is empty");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The value is empty.
    #[error("{field} is empty")]
    Empty {
        /// Which input.
        field: &'static str,
    },
    /// The value is longer than allowed.
    #[error("{field} is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Which input.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The value holds a control character.
    #[error("{field} holds a control character at byte {position}")]
    ControlCharacter {
        /// Which input.
        field: &'static str,
        /// Byte offset of the first control character.
        position: usize,
    },
    /// A number or duration outside its range.
    #[error("{field} is out of range: {reason}")]
    OutOfRange {
        /// Which input.
        field: &'static str,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A value that is not of the expected form (hex, JSON, ...).
    #[error("{field} is malformed: {reason}")]
    Malformed {
        /// Which input.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a store operation failed.
///
/// Expected races are not errors: a duplicate or a mismatch comes back as a
/// [`ClaimOutcome`](crate::ClaimOutcome). These are the failures.
///
/// ```
/// use idem_core::StoreError;
///
/// let err = StoreError::unavailable("connection refused");
/// assert!(err.is_retryable());
/// assert!(!StoreError::LostLease.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The lease named is no longer the owner of an in-flight record: it was
    /// taken over, completed, released or has passed retention. Nothing was
    /// changed; roll back any work done under the lease.
    #[error("the lease was lost: the record is no longer in flight under this owner")]
    LostLease,
    /// Input refused before anything was written.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// The response does not fit the store; nothing was written.
    #[error("response of {size} bytes exceeds this store's limit of {max} bytes")]
    TooLarge {
        /// Size of the response as [`StoredResponse::size`](crate::StoredResponse::size) counts it.
        size: usize,
        /// The store's limit, as its capabilities advertise.
        max: usize,
    },
    /// The store could not be reached or timed out; the operation may or may
    /// not have happened, and retrying is safe.
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What happened.
        message: String,
        /// The driver's error, where there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store is configured in a way that would break the contract
    /// (for example a cache that may evict records).
    #[error("store misconfigured: {0}")]
    Misconfigured(String),
    /// The backend failed in a way that retrying will not fix.
    #[error("backend error: {message}")]
    Backend {
        /// What was being done.
        message: String,
        /// The driver's error.
        #[source]
        source: Option<BoxError>,
    },
}

impl StoreError {
    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// An [`Unavailable`](Self::Unavailable) error without a source.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: None,
        }
    }

    /// An [`Unavailable`](Self::Unavailable) error keeping the driver's error.
    pub fn unavailable_from(
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Unavailable {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A driver's error as [`Unavailable`](Self::Unavailable) when the
    /// backend classified it as retryable, else as [`Backend`](Self::Backend).
    pub fn from_driver(
        retryable: bool,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        if retryable {
            Self::unavailable_from(message, source)
        } else {
            Self::backend(message, source)
        }
    }

    /// A [`Backend`](Self::Backend) error keeping the driver's error.
    pub fn backend(
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}
