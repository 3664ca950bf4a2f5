//! What a run produced, and why it produced nothing.

use crate::inbound::record::StoredResponse;
use crate::plumbing::error::{BoxError, InvalidInput, StoreError};
use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// What [`Idempotency::run`](crate::Idempotency::run) did: the handler's own
/// value when it ran, an earlier run's stored response when it did not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome<T = StoredResponse> {
    /// The handler ran now; its value, whose [`Verdict`] the runner carried
    /// out (for a plain [`StoredResponse`]: stored).
    Executed(T),
    /// An earlier run's stored response.
    Replayed(StoredResponse),
}

impl<T> RunOutcome<T> {
    /// Whether this is a replay.
    pub fn is_replay(&self) -> bool {
        matches!(self, Self::Replayed(_))
    }
}

impl RunOutcome {
    /// The response, whichever way it came.
    pub fn response(&self) -> &StoredResponse {
        match self {
            Self::Executed(r) | Self::Replayed(r) => r,
        }
    }

    /// Takes the response out.
    pub fn into_response(self) -> StoredResponse {
        match self {
            Self::Executed(r) | Self::Replayed(r) => r,
        }
    }
}

/// What becomes of what a handler produced: a handler returns its value
/// with its verdict, and the runner carries it out and gives the value back
/// as [`RunOutcome::Executed`].
///
/// A handler that returns a plain [`StoredResponse`] means `Store`.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{Fingerprint, Idempotency, RunOutcome, Scope, StoredResponse, Verdict};
/// use idem_memory::MemoryStore;
///
/// /// A job queue's answer: what the job did, and the response kept for retries.
/// #[derive(Debug, PartialEq)]
/// enum Job { Sent { id: u32 }, Refused(&'static str) }
///
/// impl idem_core::Storable for Job {
///     fn to_stored(&self) -> std::borrow::Cow<'_, StoredResponse> {
///         match self {
///             Job::Sent { id } => std::borrow::Cow::Owned(StoredResponse::new(200, id.to_string())),
///             Job::Refused(why) => std::borrow::Cow::Owned(StoredResponse::new(400, *why)),
///         }
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let idem = Idempotency::new(Arc::new(MemoryStore::new()));
/// let (scope, fp) = (Scope::parse("queue", "job-1")?, Fingerprint::of_bytes(b"job"));
/// // Refused before anything happened: release, so a retry runs at once.
/// let first = idem.run(scope.clone(), fp, |_| async { Ok(Verdict::Release(Job::Refused("busy"))) }).await?;
/// assert_eq!(first, RunOutcome::Executed(Job::Refused("busy")));
/// let second = idem.run(scope.clone(), fp, |_| async { Ok(Verdict::Store(Job::Sent { id: 7 })) }).await?;
/// assert_eq!(second, RunOutcome::Executed(Job::Sent { id: 7 }));
/// let third = idem.run(scope, fp, |_| async { Ok(Verdict::Store(Job::Sent { id: 8 })) }).await?;
/// assert_eq!(third, RunOutcome::Replayed(StoredResponse::new(200, "7")));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<T> {
    /// Complete the record with the value's [`Storable::to_stored`]: every
    /// retry replays it.
    Store(T),
    /// Store nothing and keep the key until its lease expires: the work may
    /// have happened, so a retry gets "in progress" until then and takes the
    /// key over after (with the checkpoint left).
    Keep(T),
    /// Store nothing and release the key: nothing happened, and a retry runs
    /// at once. Under [`run_in`](crate::Idempotency::run_in) the transaction
    /// is rolled back, as it is for `Keep`.
    Release(T),
}

impl<T> Verdict<T> {
    /// The value, whatever becomes of it.
    pub fn into_value(self) -> T {
        match self {
            Self::Store(value) | Self::Keep(value) | Self::Release(value) => value,
        }
    }
}

/// A value whose verdict may be [`Verdict::Store`]: what is kept for replay.
pub trait Storable {
    /// The response every retry is answered with.
    fn to_stored(&self) -> Cow<'_, StoredResponse>;
}

impl Storable for StoredResponse {
    fn to_stored(&self) -> Cow<'_, StoredResponse> {
        Cow::Borrowed(self)
    }
}

/// What a handler may return: a [`Verdict`] on a value, or a
/// [`StoredResponse`], which is stored.
pub trait IntoVerdict<T> {
    /// The verdict.
    fn into_verdict(self) -> Verdict<T>;
}

impl IntoVerdict<StoredResponse> for StoredResponse {
    fn into_verdict(self) -> Verdict<StoredResponse> {
        Verdict::Store(self)
    }
}

impl<T> IntoVerdict<T> for Verdict<T> {
    fn into_verdict(self) -> Verdict<T> {
        self
    }
}

/// Whether a failed handler's work may have started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Started {
    /// The handler did not say: the runner decides (see [`HandlerError`]).
    Unsaid,
    No,
    Maybe,
}

/// A handler's failure, and whether its work may have started.
///
/// `?` turns any error (anything `Into<Box<dyn Error + Send + Sync>>`) into a
/// `HandlerError`, so one handler can use `?` on errors of several types.
/// What happens to the claim then:
///
/// - [`HandlerError::not_started`]: nothing happened (validation failed),
///   the claim is released and the client may retry at once
///   ([`RunError::NotStarted`]);
/// - [`HandlerError::started`]: the work may have happened, the claim is
///   kept until its lease expires and a retry then takes it over with the
///   checkpoint left ([`RunError::Failed`]);
/// - plain `?`: `started` under [`Idempotency::run`](crate::Idempotency::run),
///   and `not_started` under [`Idempotency::run_in`](crate::Idempotency::run_in),
///   whose transaction rolled back.
///
/// [`ResultExt`] says the same on a `Result`.
///
/// ```
/// use idem_core::{HandlerError, ResultExt, StoredResponse};
///
/// #[derive(Debug)]
/// struct OutOfStock;
/// impl std::fmt::Display for OutOfStock {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("out of stock") }
/// }
/// impl std::error::Error for OutOfStock {}
///
/// fn reserve(qty: &str, in_stock: bool) -> Result<StoredResponse, HandlerError> {
///     let qty: u32 = qty.parse().not_started()?; // a ParseIntError: nothing happened
///     if !in_stock {
///         return Err(HandlerError::not_started(OutOfStock));
///     }
///     std::fs::metadata("/")?; // an io::Error: the same `?`, no map_err
///     Ok(StoredResponse::new(201, format!("reserved {qty}")))
/// }
///
/// assert!(reserve("x", true).unwrap_err().is_not_started());
/// assert!(reserve("1", false).unwrap_err().is_not_started());
/// assert_eq!(reserve("2", true).unwrap().body(), b"reserved 2");
/// ```
pub struct HandlerError {
    error: BoxError,
    started: Started,
}

impl HandlerError {
    /// Nothing started: the claim is released.
    pub fn not_started(error: impl Into<BoxError>) -> Self {
        Self {
            error: error.into(),
            started: Started::No,
        }
    }

    /// The work may have started: the claim is kept until its lease expires,
    /// even where a transaction rolled back (work outside it may have run).
    pub fn started(error: impl Into<BoxError>) -> Self {
        Self {
            error: error.into(),
            started: Started::Maybe,
        }
    }

    /// Whether the handler said nothing started.
    pub fn is_not_started(&self) -> bool {
        self.started == Started::No
    }

    /// The error itself.
    pub fn into_inner(self) -> BoxError {
        self.error
    }

    /// Whether the claim is released, given whether the runner's transaction
    /// rolled the work back.
    pub(crate) fn releases(&self, rolled_back: bool) -> bool {
        match self.started {
            Started::No => true,
            Started::Maybe => false,
            Started::Unsaid => rolled_back,
        }
    }
}

impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self {
            error: error.into(),
            started: Started::Unsaid,
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("started", &self.started)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// Says on a `Result` whether the work may have started, for `?` in handlers.
///
/// ```
/// use idem_core::{HandlerError, ResultExt};
///
/// fn parse(body: &str) -> Result<u32, HandlerError> {
///     body.parse::<u32>().not_started()
/// }
/// assert!(parse("nope").unwrap_err().is_not_started());
/// ```
pub trait ResultExt<T> {
    /// An error means nothing started: see [`HandlerError::not_started`].
    ///
    /// # Errors
    ///
    /// The error, as a [`HandlerError`].
    fn not_started(self) -> Result<T, HandlerError>;

    /// An error means the work may have started: see [`HandlerError::started`].
    ///
    /// # Errors
    ///
    /// The error, as a [`HandlerError`].
    fn started(self) -> Result<T, HandlerError>;
}

impl<T, E: Into<BoxError>> ResultExt<T> for Result<T, E> {
    fn not_started(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::not_started)
    }

    fn started(self) -> Result<T, HandlerError> {
        self.map_err(HandlerError::started)
    }
}

/// Why [`Idempotency::run`](crate::Idempotency::run) produced no response.
///
/// ```
/// use idem_core::RunError;
///
/// let err = RunError::Mismatch;
/// assert_eq!(err.http_status(), Some(422));
/// assert!(!RunError::LostLease.is_retryable());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// Another request holds the key (HTTP 409 with `Retry-After`).
    #[error("another request holds this key; retry after {} ms", .retry_after.as_millis())]
    InProgress {
        /// The holder's remaining lease.
        retry_after: Duration,
    },
    /// The key was used for another request (HTTP 422).
    #[error("the key was already used for a different request")]
    Mismatch,
    /// Another owner took the key over before this run completed: the
    /// response was not stored. Roll back what the handler did, or make it
    /// idempotent downstream (with [`RunContext::downstream_key`](crate::RunContext::downstream_key)).
    /// Under [`Idempotency::run_in`](crate::Idempotency::run_in) the
    /// transaction was already rolled back.
    #[error("the lease was lost before completion: the response was not stored")]
    LostLease,
    /// Nothing happened (the handler said so, or its transaction rolled
    /// back): the claim was released and the client may retry at once.
    #[error("nothing happened: {0}")]
    NotStarted(#[source] BoxError),
    /// The handler failed after its work may have started: the claim is kept
    /// until its lease expires, and a retry then takes it over.
    #[error("handler failed: {0}")]
    Failed(#[source] BoxError),
    /// The store failed (never [`StoreError::LostLease`], which is
    /// [`RunError::LostLease`]).
    #[error(transparent)]
    Store(StoreError),
}

impl RunError {
    /// The HTTP status a refusal maps to: 409 in progress, 422 mismatch.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::InProgress { .. } => Some(409),
            Self::Mismatch => Some(422),
            _ => None,
        }
    }

    /// Whether the same request, retried with the same key, may succeed:
    /// in progress, nothing happened, a handler failure (after the lease),
    /// or a store that was unavailable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::InProgress { .. } | Self::NotStarted(_) | Self::Failed(_) => true,
            Self::Store(e) => e.is_retryable(),
            Self::Mismatch | Self::LostLease => false,
        }
    }

    /// The handler's own error, if the handler failed.
    pub fn handler_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match self {
            Self::NotStarted(e) | Self::Failed(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<StoreError> for RunError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::LostLease => Self::LostLease,
            other => Self::Store(other),
        }
    }
}

impl From<InvalidInput> for RunError {
    fn from(error: InvalidInput) -> Self {
        Self::Store(StoreError::InvalidInput(error))
    }
}
