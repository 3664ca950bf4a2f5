//! The runner: claim, run the handler once, complete, and answer retries.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;

use crate::decision::{ClaimRequest, validate_lease_ttl, validate_retention};
use crate::error::{InvalidInput, StoreError};
use crate::fingerprint::Fingerprint;
use crate::record::{Checkpoint, Lease, StoredResponse};
use crate::scope::{IdempotencyKey, Scope};
use crate::store::{ClaimOutcome, IdempotencyStore};

/// Makes handlers idempotent over a store.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::{Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoredResponse};
/// use idem_memory::MemoryStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let idem = Idempotency::new(Arc::new(MemoryStore::new()));
/// let scope = Scope::parse("acme", "order-42")?;
/// let fingerprint = Fingerprint::json(r#"{"sku":"A-1","qty":2}"#)?;
///
/// let first = idem
///     .run(scope.clone(), fingerprint, |_ctx| async {
///         Ok::<_, idem_core::HandlerError<std::io::Error>>(StoredResponse::new(201, "order 42"))
///     })
///     .await?;
/// assert!(matches!(first, RunOutcome::Executed(_)));
///
/// // The retry never runs the handler: it gets the stored response.
/// let retry = idem
///     .run(scope, fingerprint, |_ctx| async { unreachable!("ran twice") })
///     .await?;
/// assert_eq!(retry, RunOutcome::Replayed(StoredResponse::new(201, "order 42")));
/// # Ok::<(), RunError<std::io::Error>>(())
/// # }).unwrap();
/// ```
pub struct Idempotency<S: ?Sized> {
    store: Arc<S>,
    lease_ttl: Duration,
    retention: Duration,
    auto_renew_cap: Option<Duration>,
}

impl<S: ?Sized> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            lease_ttl: self.lease_ttl,
            retention: self.retention,
            auto_renew_cap: self.auto_renew_cap,
        }
    }
}

impl<S: IdempotencyStore + ?Sized> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.store)
            .field("lease_ttl", &self.lease_ttl)
            .field("retention", &self.retention)
            .field("auto_renew_cap", &self.auto_renew_cap)
            .finish()
    }
}

impl<S: IdempotencyStore + ?Sized> Idempotency<S> {
    /// A runner with the default lease (30 s) and retention (24 h), without
    /// automatic renewal.
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            lease_ttl: ClaimRequest::DEFAULT_LEASE_TTL,
            retention: ClaimRequest::DEFAULT_RETENTION,
            auto_renew_cap: None,
        }
    }

    /// Sets how long a claim holds the key before a retry may take it over.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 7 days.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Result<Self, InvalidInput> {
        self.lease_ttl = validate_lease_ttl(ttl)?;
        Ok(self)
    }

    /// Sets how long completed records are kept for replay.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 10 years.
    pub fn with_retention(mut self, retention: Duration) -> Result<Self, InvalidInput> {
        self.retention = validate_retention(retention)?;
        Ok(self)
    }

    /// Renews the lease automatically while the handler runs: every third of
    /// the lease, by a whole lease, until the handler has run for `cap`. After
    /// the cap the lease runs out normally, so a stuck handler cannot hold a
    /// key forever.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] if `cap` is zero.
    pub fn with_auto_renew(mut self, cap: Duration) -> Result<Self, InvalidInput> {
        if cap.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "auto-renew cap",
                reason: "must be more than zero",
            });
        }
        self.auto_renew_cap = Some(cap);
        Ok(self)
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Runs `handler` at most once per scope and fingerprint.
    ///
    /// - A fresh key (or an expired lease: a takeover) runs the handler; its
    ///   `Ok` response is completed under the lease and returned as
    ///   [`RunOutcome::Executed`].
    /// - A completed key returns the stored response as [`RunOutcome::Replayed`].
    /// - A key held by a valid lease is refused with [`RunError::InProgress`];
    ///   a key used with another fingerprint with [`RunError::Mismatch`].
    ///
    /// A handler error keeps the claim until its lease expires (the work may
    /// have started), unless it is [`HandlerError::NotStarted`], which
    /// releases the claim so the client may retry at once.
    ///
    /// # Errors
    ///
    /// The refusals above; [`RunError::Rejected`] and [`RunError::Failed`]
    /// carry the handler's error; [`RunError::Store`] when the store fails,
    /// including [`StoreError::LostLease`] when the lease was taken over
    /// before completion (the response was not stored: roll back what the
    /// handler did, or make it idempotent downstream).
    pub async fn run<F, Fut, E>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Result<RunOutcome, RunError<E>>
    where
        F: FnOnce(Context<S>) -> Fut,
        Fut: Future<Output = Result<StoredResponse, HandlerError<E>>>,
    {
        let request = ClaimRequest::new(scope, fingerprint)
            .with_lease_ttl(self.lease_ttl)?
            .with_retention(self.retention)?;
        let (lease, checkpoint) = match self.store.claim(&request).await? {
            ClaimOutcome::Claimed { lease, checkpoint } => (lease, checkpoint),
            ClaimOutcome::Completed(response) => return Ok(RunOutcome::Replayed(response)),
            ClaimOutcome::InProgress { retry_after } => {
                return Err(RunError::InProgress { retry_after });
            }
            ClaimOutcome::Mismatch => return Err(RunError::Mismatch),
        };
        tracing::debug!(
            tenant = %lease.scope().tenant(),
            key = %lease.scope().key().redacted(),
            attempt = lease.attempt(),
            "idempotency key claimed"
        );
        let ctx = Context {
            store: Arc::clone(&self.store),
            lease: Arc::new(Mutex::new(lease)),
            checkpoint,
            lease_ttl: self.lease_ttl,
        };
        let work = handler(ctx.clone());
        let result = match self.auto_renew_cap {
            None => work.await,
            Some(cap) => {
                tokio::pin!(work);
                let renewing = ctx.renew_until(cap);
                tokio::pin!(renewing);
                tokio::select! {
                    biased;
                    result = &mut work => result,
                    () = &mut renewing => work.await,
                }
            }
        };
        let lease = ctx.lease();
        match result {
            Ok(response) => {
                self.store.complete(&lease, &response).await?;
                Ok(RunOutcome::Executed(response))
            }
            Err(HandlerError::NotStarted(error)) => {
                if let Err(release) = self.store.release(&lease).await {
                    tracing::warn!(error = %release, "could not release a claim; it will expire with its lease");
                }
                Err(RunError::Rejected(error))
            }
            Err(HandlerError::Failed(error)) => Err(RunError::Failed(error)),
        }
    }
}

/// What [`Idempotency::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// The handler ran now and its response was stored.
    Executed(StoredResponse),
    /// An earlier run's stored response.
    Replayed(StoredResponse),
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

    /// Whether this is a replay.
    pub fn is_replay(&self) -> bool {
        matches!(self, Self::Replayed(_))
    }
}

/// A handler's failure, saying whether the work may have started.
///
/// `?` on any `E` gives [`Failed`](Self::Failed): the safe default.
///
/// ```
/// use idem_core::HandlerError;
///
/// fn validate(qty: u32) -> Result<(), HandlerError<String>> {
///     if qty == 0 {
///         // Nothing happened: let the client retry at once.
///         return Err(HandlerError::NotStarted("qty must be positive".into()));
///     }
///     Ok(())
/// }
/// assert!(matches!(validate(0), Err(HandlerError::NotStarted(_))));
/// let failed: HandlerError<String> = String::from("db down").into();
/// assert!(matches!(failed, HandlerError::Failed(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerError<E> {
    /// Nothing started (validation failed): the claim is released.
    NotStarted(E),
    /// The work may have started: the claim is kept until its lease expires,
    /// and a retry after that takes it over.
    Failed(E),
}

impl<E> From<E> for HandlerError<E> {
    fn from(error: E) -> Self {
        Self::Failed(error)
    }
}

/// Why [`Idempotency::run`] produced no response.
#[derive(Debug)]
#[non_exhaustive]
pub enum RunError<E> {
    /// Another request holds the key (HTTP 409 with `Retry-After`).
    InProgress {
        /// The holder's remaining lease.
        retry_after: Duration,
    },
    /// The key was used for another request (HTTP 422).
    Mismatch,
    /// The handler said nothing started; the claim was released.
    Rejected(E),
    /// The handler failed; the claim is kept until its lease expires.
    Failed(E),
    /// The store failed, or the lease was lost before completion.
    Store(StoreError),
}

impl<E> RunError<E> {
    /// The HTTP status this refusal maps to, where DESIGN.md names one
    /// (409 in progress, 422 mismatch).
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::InProgress { .. } => Some(409),
            Self::Mismatch => Some(422),
            _ => None,
        }
    }
}

impl<E> From<StoreError> for RunError<E> {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl<E> From<InvalidInput> for RunError<E> {
    fn from(error: InvalidInput) -> Self {
        Self::Store(StoreError::InvalidInput(error))
    }
}

impl<E: fmt::Display> fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InProgress { retry_after } => write!(
                f,
                "another request holds this key; retry after {} ms",
                retry_after.as_millis()
            ),
            Self::Mismatch => f.write_str("the key was already used for a different request"),
            Self::Rejected(e) => write!(f, "handler rejected the request: {e}"),
            Self::Failed(e) => write!(f, "handler failed: {e}"),
            Self::Store(e) => write!(f, "{e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Rejected(e) | Self::Failed(e) => Some(e),
            Self::Store(e) => Some(e),
            Self::InProgress { .. } | Self::Mismatch => None,
        }
    }
}

/// What a handler gets: its lease, its attempt, the checkpoint a previous
/// owner left, and fenced operations on its record.
pub struct Context<S: ?Sized> {
    store: Arc<S>,
    lease: Arc<Mutex<Lease>>,
    checkpoint: Option<Checkpoint>,
    lease_ttl: Duration,
}

impl<S: ?Sized> Clone for Context<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            lease: Arc::clone(&self.lease),
            checkpoint: self.checkpoint.clone(),
            lease_ttl: self.lease_ttl,
        }
    }
}

impl<S: ?Sized> fmt::Debug for Context<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("lease", &*self.locked())
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

impl<S: ?Sized> Context<S> {
    fn locked(&self) -> MutexGuard<'_, Lease> {
        // A panic elsewhere cannot leave a Lease half-written: keep using it.
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current lease (its expiry moves with renewals).
    pub fn lease(&self) -> Lease {
        self.locked().clone()
    }

    /// The scope being worked on.
    pub fn scope(&self) -> Scope {
        self.locked().scope().clone()
    }

    /// 1 on the first attempt, +1 on every takeover.
    pub fn attempt(&self) -> u32 {
        self.locked().attempt()
    }

    /// The recovery point a previous owner left, if this is a takeover that has one.
    pub fn previous_checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// The idempotency key to send to a downstream call named `name`: the
    /// same on every attempt and takeover, different per name.
    pub fn downstream_key(&self, name: &str) -> IdempotencyKey {
        self.locked().scope().downstream_key(name)
    }
}

impl<S: IdempotencyStore + ?Sized> Context<S> {
    /// Records a recovery point that a takeover will receive.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for a bad name or data too large;
    /// [`StoreError::LostLease`] if another owner took over.
    pub async fn checkpoint(&self, name: &str, data: &impl Serialize) -> Result<(), StoreError> {
        let point = Checkpoint::new(name, data)?;
        let lease = self.lease();
        self.store.checkpoint(&lease, &point).await
    }

    /// Extends the lease to `extend` from now.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if another owner took over.
    pub async fn renew(&self, extend: Duration) -> Result<(), StoreError> {
        let lease = self.lease();
        let renewed = self.store.renew(&lease, extend).await?;
        *self.locked() = renewed;
        Ok(())
    }

    /// Renews by a whole lease every third of a lease until `cap` has passed
    /// or a renewal fails; completion reports a lost lease, so a failure here
    /// only stops renewing.
    async fn renew_until(&self, cap: Duration) {
        let every = (self.lease_ttl / 3).max(Duration::from_millis(1));
        let deadline = tokio::time::Instant::now() + cap;
        loop {
            tokio::time::sleep(every).await;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            if let Err(error) = self.renew(self.lease_ttl).await {
                tracing::warn!(%error, "automatic lease renewal stopped");
                return;
            }
        }
    }
}
