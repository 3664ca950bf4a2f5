//! The runner: claim, run the handler once, complete, and answer retries.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use tracing::{Instrument, Span};

use crate::backend::{IdempotencyStore, Transaction};
use crate::claim::{ClaimOutcome, ClaimRequest, validate_lease, validate_retention};
use crate::error::{InvalidInput, Operation, StoreError};
use crate::fingerprint::Fingerprint;
use crate::observability::{finish_run, handler, lease_call, run_span, store_call};
use crate::outcome::{HandlerError, RunError, RunOutcome};
use crate::record::{Checkpoint, Lease, StoredResponse};
use crate::scope::{IdempotencyKey, Scope};

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
///     .run(scope.clone(), fingerprint, |_ctx| async { Ok(StoredResponse::new(201, "order 42")) })
///     .await?;
/// assert!(matches!(first, RunOutcome::Executed(_)));
///
/// // The retry never runs the handler: it gets the stored response.
/// let retry = idem
///     .run(scope, fingerprint, |_ctx| async { unreachable!("ran twice") })
///     .await?;
/// assert_eq!(retry, RunOutcome::Replayed(StoredResponse::new(201, "order 42")));
/// # Ok::<(), RunError>(())
/// # }).unwrap();
/// ```
pub struct Idempotency<S: ?Sized> {
    store: Arc<S>,
    /// The store's name in spans and metrics, read once.
    store_name: &'static str,
    lease: Duration,
    retention: Duration,
    auto_renew_cap: Option<Duration>,
}

impl<S: ?Sized> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            store_name: self.store_name,
            lease: self.lease,
            retention: self.retention,
            auto_renew_cap: self.auto_renew_cap,
        }
    }
}

impl<S: IdempotencyStore + ?Sized> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.store)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("auto_renew_cap", &self.auto_renew_cap)
            .finish()
    }
}

impl<S: IdempotencyStore + ?Sized> Idempotency<S> {
    /// A runner with the default lease (30 s) and retention (24 h), without
    /// automatic renewal.
    ///
    /// Every run is a `tracing` span, and every store operation it makes one
    /// inside it; with the `metrics` feature it records metrics too: see
    /// [`observability`](crate::observability) for their names and fields.
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store_name: store.capabilities().store,
            store,
            lease: ClaimRequest::DEFAULT_LEASE,
            retention: ClaimRequest::DEFAULT_RETENTION,
            auto_renew_cap: None,
        }
    }

    /// Sets the lease: how long a claim holds the key before a retry may take
    /// it over.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 7 days.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, InvalidInput> {
        self.lease = validate_lease(lease)?;
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
    /// have started), unless it is [`HandlerError::not_started`], which
    /// releases the claim so the client may retry at once.
    ///
    /// # Errors
    ///
    /// The refusals above; [`RunError::NotStarted`] and [`RunError::Failed`]
    /// carry the handler's error; [`RunError::LostLease`] when another owner
    /// took the key over before completion (the response was not stored);
    /// [`RunError::Store`] when the store fails.
    pub async fn run<F, Fut>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Result<RunOutcome, RunError>
    where
        F: FnOnce(Context<S>) -> Fut,
        Fut: Future<Output = Result<StoredResponse, HandlerError>>,
    {
        let span = run_span(self.store_name, &scope, false);
        let result = async {
            let ctx = match self.claim(scope, fingerprint).await? {
                Claimed::Run(ctx) => ctx,
                Claimed::Answered(outcome) => return Ok(outcome),
            };
            match self.drive(&ctx, handler(ctx.clone())).await {
                Ok(response) => {
                    let lease = ctx.lease();
                    lease_call(
                        self.store_name,
                        Operation::Complete,
                        &lease,
                        self.store.complete(&lease, &response),
                    )
                    .await?;
                    Ok(RunOutcome::Executed(response))
                }
                Err(error) => Err(self.fail(&ctx, error, false).await),
            }
        }
        .instrument(span.clone())
        .await;
        finish_run(&span, &result);
        result
    }

    /// Runs `handler` at most once per scope and fingerprint, completing
    /// inside the transaction `begin` opens: the handler's writes and the
    /// stored response commit together, or neither does.
    ///
    /// The same as [`run`](Self::run) (settings, [`Context`], auto-renewal,
    /// outcomes) except where the completion lands. The claim commits on its
    /// own first, so a concurrent duplicate sees it; only then is `begin`
    /// awaited. The handler gets the transaction, writes through it, and
    /// hands it back with the response; the runner completes inside it and
    /// commits. [`Context::checkpoint_in`] writes a recovery point inside a
    /// transaction, so a phase's writes and its checkpoint commit together.
    ///
    /// When nothing committed, nothing happened: a handler error (the
    /// handler dropped the transaction, rolling it back), a refused or failed
    /// commit, or a completion that could not be written release the claim,
    /// so the client may retry at once; the handler can keep the claim
    /// instead with [`HandlerError::started`] (for work outside the
    /// transaction). A lost lease rolls everything back and returns
    /// [`RunError::LostLease`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::{Fingerprint, Idempotency, RunOutcome, Scope, StoredResponse};
    /// use idem_core::store::{IdempotencyStore, Transaction};
    /// use idem_memory::MemoryStore;
    ///
    /// /// A transaction that commits its writes and the completion together
    /// /// (real ones come from store crates: `PostgresStore::begin`, ...).
    /// struct Ledger { store: MemoryStore, completion: Option<(idem_core::store::Lease, StoredResponse)> }
    ///
    /// #[idem_core::async_trait]
    /// impl Transaction for Ledger {
    ///     async fn complete(&mut self, lease: &idem_core::store::Lease, response: &StoredResponse) -> Result<(), idem_core::StoreError> {
    ///         self.completion = Some((lease.clone(), response.clone()));
    ///         Ok(())
    ///     }
    ///     async fn checkpoint(&mut self, _: &idem_core::store::Lease, _: &idem_core::Checkpoint) -> Result<(), idem_core::StoreError> {
    ///         Ok(())
    ///     }
    ///     async fn commit(self) -> Result<(), idem_core::StoreError> {
    ///         match self.completion {
    ///             Some((lease, response)) => self.store.complete(&lease, &response).await,
    ///             None => Ok(()),
    ///         }
    ///     }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = MemoryStore::new();
    /// let idem = Idempotency::new(Arc::new(store.clone()));
    /// let begin = async { Ok(Ledger { store, completion: None }) };
    /// let outcome = idem
    ///     .run_in(Scope::parse("acme", "order-7")?, Fingerprint::of_bytes(b"..."), begin, |_ctx, tx| async move {
    ///         Ok((tx, StoredResponse::new(201, "order 7")))
    ///     })
    ///     .await?;
    /// assert!(matches!(outcome, RunOutcome::Executed(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run); the errors of `begin` and of the commit as
    /// [`RunError::Store`] (after which the claim has been released).
    pub async fn run_in<T, B, F, Fut>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        begin: B,
        handler: F,
    ) -> Result<RunOutcome, RunError>
    where
        T: Transaction,
        B: Future<Output = Result<T, StoreError>>,
        F: FnOnce(Context<S>, T) -> Fut,
        Fut: Future<Output = Result<(T, StoredResponse), HandlerError>>,
    {
        let span = run_span(self.store_name, &scope, true);
        let result = async {
            let ctx = match self.claim(scope, fingerprint).await? {
                Claimed::Run(ctx) => ctx,
                Claimed::Answered(outcome) => return Ok(outcome),
            };
            let lease = ctx.lease();
            let tx = match lease_call(self.store_name, Operation::Transaction, &lease, begin).await
            {
                Ok(tx) => tx,
                Err(error) => return Err(self.nothing_committed(&ctx, error).await),
            };
            let (mut tx, response) = match self.drive(&ctx, handler(ctx.clone(), tx)).await {
                Ok(done) => done,
                Err(error) => return Err(self.fail(&ctx, error, true).await),
            };
            let lease = ctx.lease();
            let completed = lease_call(
                self.store_name,
                Operation::Complete,
                &lease,
                tx.complete(&lease, &response),
            )
            .await;
            if let Err(error) = completed {
                drop(tx);
                return Err(self.nothing_committed(&ctx, error).await);
            }
            match lease_call(self.store_name, Operation::Transaction, &lease, tx.commit()).await {
                Ok(()) => Ok(RunOutcome::Executed(response)),
                Err(error) => Err(self.nothing_committed(&ctx, error).await),
            }
        }
        .instrument(span.clone())
        .await;
        finish_run(&span, &result);
        result
    }

    async fn claim(&self, scope: Scope, fingerprint: Fingerprint) -> Result<Claimed<S>, RunError> {
        let request = ClaimRequest::new(scope, fingerprint)
            .with_lease(self.lease)?
            .with_retention(self.retention)?;
        let claimed = store_call(
            Operation::Claim,
            self.store_name,
            request.scope(),
            None,
            self.store.claim(&request),
        )
        .await?;
        let (lease, checkpoint) = match claimed {
            ClaimOutcome::Claimed { lease, checkpoint } => (lease, checkpoint),
            ClaimOutcome::Completed(response) => {
                return Ok(Claimed::Answered(RunOutcome::Replayed(response)));
            }
            ClaimOutcome::InProgress { retry_after } => {
                return Err(RunError::InProgress { retry_after });
            }
            ClaimOutcome::Mismatch => return Err(RunError::Mismatch),
        };
        // The run's span: a claim is made inside it.
        Span::current().record("attempt", lease.attempt());
        Ok(Claimed::Run(Context {
            store: Arc::clone(&self.store),
            store_name: self.store_name,
            lease: Arc::new(Mutex::new(lease)),
            checkpoint,
            lease_duration: self.lease,
        }))
    }

    /// Awaits the handler's work, renewing the lease meanwhile if asked to.
    async fn drive<T>(&self, ctx: &Context<S>, work: impl Future<Output = T>) -> T {
        let work = handler(self.store_name, work);
        let Some(cap) = self.auto_renew_cap else {
            return work.await;
        };
        tokio::pin!(work);
        let renewing = ctx.renew_until(cap);
        tokio::pin!(renewing);
        tokio::select! {
            biased;
            result = &mut work => result,
            () = &mut renewing => work.await,
        }
    }

    async fn fail(&self, ctx: &Context<S>, error: HandlerError, rolled_back: bool) -> RunError {
        if error.releases(rolled_back) {
            self.release(ctx).await;
            RunError::NotStarted(error.into_inner())
        } else {
            RunError::Failed(error.into_inner())
        }
    }

    /// A transactional run wrote nothing: free the key unless another owner
    /// has it. Release is fenced, so after a commit whose outcome is unknown
    /// it changes nothing if the commit did land.
    async fn nothing_committed(&self, ctx: &Context<S>, error: StoreError) -> RunError {
        if !error.is_lost_lease() {
            self.release(ctx).await;
        }
        error.into()
    }

    async fn release(&self, ctx: &Context<S>) {
        let lease = ctx.lease();
        let released = lease_call(
            self.store_name,
            Operation::Release,
            &lease,
            self.store.release(&lease),
        )
        .await;
        if let Err(error) = released {
            tracing::warn!(%error, "could not release a claim; it will expire with its lease");
        }
    }
}

enum Claimed<S: ?Sized> {
    Run(Context<S>),
    Answered(RunOutcome),
}

/// What a handler gets: its lease, its attempt, the checkpoint a previous
/// owner left, and fenced operations on its record.
pub struct Context<S: ?Sized> {
    store: Arc<S>,
    store_name: &'static str,
    lease: Arc<Mutex<Lease>>,
    checkpoint: Option<Checkpoint>,
    lease_duration: Duration,
}

impl<S: ?Sized> Clone for Context<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            store_name: self.store_name,
            lease: Arc::clone(&self.lease),
            checkpoint: self.checkpoint.clone(),
            lease_duration: self.lease_duration,
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

    /// The current lease (its expiry moves with renewals), to name in
    /// fenced operations of your own.
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
        lease_call(
            self.store_name,
            Operation::Checkpoint,
            &lease,
            self.store.checkpoint(&lease, &point),
        )
        .await
    }

    /// Records a recovery point inside the caller's transaction `tx`, so that
    /// a phase's writes and its recovery point commit, or roll back, together.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for a bad name or data too large;
    /// [`StoreError::LostLease`] if the store can already tell another owner
    /// took over (otherwise the commit fails with it).
    pub async fn checkpoint_in<T: Transaction>(
        &self,
        tx: &mut T,
        name: &str,
        data: &impl Serialize,
    ) -> Result<(), StoreError> {
        let point = Checkpoint::new(name, data)?;
        let lease = self.lease();
        lease_call(
            self.store_name,
            Operation::Checkpoint,
            &lease,
            tx.checkpoint(&lease, &point),
        )
        .await
    }

    /// Extends the lease to `extend` from now.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] if `extend` is outside 1 ms to 7 days;
    /// [`StoreError::LostLease`] if another owner took over.
    pub async fn renew(&self, extend: Duration) -> Result<(), StoreError> {
        let extend = validate_lease(extend)?;
        let lease = self.lease();
        let renewed = lease_call(
            self.store_name,
            Operation::Renew,
            &lease,
            self.store.renew(&lease, extend),
        )
        .await?;
        *self.locked() = renewed;
        Ok(())
    }

    /// Renews by a whole lease every third of a lease until `cap` has passed
    /// or a renewal fails; completion reports a lost lease, so a failure here
    /// only stops renewing.
    async fn renew_until(&self, cap: Duration) {
        let every = (self.lease_duration / 3).max(Duration::from_millis(1));
        let deadline = tokio::time::Instant::now() + cap;
        loop {
            tokio::time::sleep(every).await;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            if let Err(error) = self.renew(self.lease_duration).await {
                tracing::warn!(%error, "automatic lease renewal stopped");
                return;
            }
        }
    }
}
