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

/// A boxed error, as handlers and drivers hand them over.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The store operation that failed, as a field of [`StoreError`].
///
/// ```
/// use idem_core::{Operation, StoreError};
///
/// let err = StoreError::unavailable("postgres", Operation::Claim, "connection reset");
/// assert_eq!(err.operation(), Some(Operation::Claim));
/// assert_eq!(err.store(), Some("postgres"));
/// assert_eq!(err.to_string(), "postgres claim: unavailable: connection reset");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// A claim.
    Claim,
    /// A completion.
    Complete,
    /// A lease renewal.
    Renew,
    /// A release: of a claim, or of an outbox partition.
    Release,
    /// A checkpoint.
    Checkpoint,
    /// A read of one record.
    Get,
    /// A sweep of records past retention.
    Purge,
    /// An operator's deletion of one record.
    Delete,
    /// A reading of the clock that judges a record.
    Now,
    /// Opening, committing or rolling back the caller's transaction.
    Transaction,
    /// Server set-up and checks: migrations, tables, configuration.
    Setup,
    /// Recording an outbound operation in a journal.
    Record,
    /// Leasing a journal's operation to an executor, or an outbox's
    /// partition to a relay.
    Acquire,
    /// Counting a send of a journal's operation.
    MarkSent,
    /// Writing a journal operation's outcome and releasing it.
    Finish,
    /// Listing a journal's operations, or an outbox's parked messages.
    List,
    /// Writing a message to an outbox.
    Enqueue,
    /// Counting a failed publish of an outbox message.
    MarkFailed,
    /// An operator's retry of a parked message.
    Retry,
    /// An operator's drop of a message.
    Drop,
    /// Reading an outbox's backlog, or counting a consumer's parked messages.
    Stats,
    /// Parking a message a consumer could not apply.
    Park,
    /// Settling a parked message: replayed or dropped.
    Resolve,
    /// A version check: moving an aggregate's version to an event's; or a
    /// relay's settling of a batch: moving an outbox partition's cursor.
    Advance,
    /// Reading an outbox partition's log, or its retry lane.
    Read,
}

impl Operation {
    /// The operation's name, lowercase.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Complete => "complete",
            Self::Renew => "renew",
            Self::Release => "release",
            Self::Checkpoint => "checkpoint",
            Self::Get => "get",
            Self::Purge => "purge",
            Self::Delete => "delete",
            Self::Now => "now",
            Self::Transaction => "transaction",
            Self::Setup => "setup",
            Self::Record => "record",
            Self::Acquire => "acquire",
            Self::MarkSent => "mark_sent",
            Self::Finish => "finish",
            Self::List => "list",
            Self::Enqueue => "enqueue",
            Self::MarkFailed => "mark_failed",
            Self::Retry => "retry",
            Self::Drop => "drop",
            Self::Stats => "stats",
            Self::Park => "park",
            Self::Resolve => "resolve",
            Self::Advance => "advance",
            Self::Read => "read",
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a store operation failed.
///
/// Expected races are not errors: a duplicate or a mismatch comes back as a
/// [`ClaimOutcome`](crate::store::ClaimOutcome). These are the failures. Errors
/// from a backend name the store and the [`Operation`] as fields.
///
/// ```
/// use idem_core::{Operation, StoreError};
///
/// let err = StoreError::unavailable("redis", Operation::Complete, "timed out");
/// assert!(err.is_retryable());
/// assert!(!StoreError::LostLease.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The lease no longer holds the record: another owner took it over
    /// after the lease expired, or it was completed, released or passed
    /// retention. Nothing of this call was stored; roll back any work done
    /// under the lease. (A second delivery of an operation that did succeed
    /// is answered as the first was, never with this.)
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
    /// The store could not be reached or timed out: the operation may or may
    /// not have happened. Retrying with the same key is safe, and the retry
    /// gets the true answer.
    #[error("{store} {operation}: unavailable: {message}")]
    Unavailable {
        /// Which store (`"postgres"`, `"redis"`, ...).
        store: &'static str,
        /// Which operation.
        operation: Operation,
        /// What happened.
        message: String,
        /// The driver's error, where there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The caller's own writes in a shared transaction were refused (a
    /// constraint or a condition of theirs): nothing was written, the
    /// completion included.
    #[error("{store} {operation}: the transaction was refused: {message}")]
    Rejected {
        /// Which store.
        store: &'static str,
        /// Which operation.
        operation: Operation,
        /// What was refused.
        message: String,
        /// The driver's error, where there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A stored record that this store's own writes cannot have produced
    /// (edited by hand, or written by an incompatible version).
    #[error("{store} {operation}: corrupt record: bad {field}")]
    Corrupt {
        /// Which store.
        store: &'static str,
        /// Which operation read it.
        operation: Operation,
        /// The part that does not decode.
        field: &'static str,
    },
    /// The store is configured in a way that would break the contract
    /// (for example a cache that may evict records).
    #[error("{store} misconfigured: {message}")]
    Misconfigured {
        /// Which store.
        store: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The backend failed in a way that retrying will not fix.
    #[error("{store} {operation}: {message}")]
    Backend {
        /// Which store.
        store: &'static str,
        /// Which operation.
        operation: Operation,
        /// What went wrong.
        message: String,
        /// The driver's error, where there is one.
        #[source]
        source: Option<BoxError>,
    },
}

impl StoreError {
    /// Whether the same call may succeed if tried again.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether this is [`LostLease`](Self::LostLease).
    pub fn is_lost_lease(&self) -> bool {
        matches!(self, Self::LostLease)
    }

    /// The store that failed, where the error names one.
    pub fn store(&self) -> Option<&'static str> {
        match self {
            Self::Unavailable { store, .. }
            | Self::Rejected { store, .. }
            | Self::Corrupt { store, .. }
            | Self::Misconfigured { store, .. }
            | Self::Backend { store, .. } => Some(store),
            Self::LostLease | Self::InvalidInput(_) | Self::TooLarge { .. } => None,
        }
    }

    /// The operation that failed, where the error names one.
    pub fn operation(&self) -> Option<Operation> {
        match self {
            Self::Unavailable { operation, .. }
            | Self::Rejected { operation, .. }
            | Self::Corrupt { operation, .. }
            | Self::Backend { operation, .. } => Some(*operation),
            _ => None,
        }
    }

    /// An [`Unavailable`](Self::Unavailable) error without a source.
    pub fn unavailable(
        store: &'static str,
        operation: Operation,
        message: impl Into<String>,
    ) -> Self {
        Self::Unavailable {
            store,
            operation,
            message: message.into(),
            source: None,
        }
    }

    /// A driver's error: [`Unavailable`](Self::Unavailable) when the backend
    /// classified it as retryable, else [`Backend`](Self::Backend).
    pub fn from_driver(
        retryable: bool,
        store: &'static str,
        operation: Operation,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        let message = source.to_string();
        let source = Some(Box::new(source) as BoxError);
        if retryable {
            Self::Unavailable {
                store,
                operation,
                message,
                source,
            }
        } else {
            Self::Backend {
                store,
                operation,
                message,
                source,
            }
        }
    }

    /// A [`Backend`](Self::Backend) error with a message and no source.
    pub fn backend(store: &'static str, operation: Operation, message: impl Into<String>) -> Self {
        Self::Backend {
            store,
            operation,
            message: message.into(),
            source: None,
        }
    }

    /// A [`Corrupt`](Self::Corrupt) record.
    pub fn corrupt(store: &'static str, operation: Operation, field: &'static str) -> Self {
        Self::Corrupt {
            store,
            operation,
            field,
        }
    }
}
