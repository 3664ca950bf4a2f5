//! The runner: claim, run the handler once, complete, and answer retries.

use crate::inbound::claim::{ClaimOutcome, ClaimRequest, validate_lease, validate_retention};
use crate::inbound::fingerprint::Fingerprint;
use crate::inbound::outcome::{HandlerError, IntoVerdict, RunError, RunOutcome, Storable, Verdict};
use crate::inbound::record::{Checkpoint, Lease, Record, StoredResponse};
use crate::inbound::store::{IdempotencyStore, Transaction};
use crate::observability::{handler, run_span};
use crate::plumbing::error::{InvalidInput, StoreError};
use crate::plumbing::scope::{IdempotencyKey, Scope};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tracing::{Instrument, Span};

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
///     .run(scope, fingerprint, |_ctx| async {
///         unreachable!("ran twice") as Result<StoredResponse, _>
///     })
///     .await?;
/// assert_eq!(retry, RunOutcome::Replayed(StoredResponse::new(201, "order 42")));
/// # Ok::<(), RunError>(())
/// # }).unwrap();
/// ```
pub struct Idempotency<S: ?Sized = dyn IdempotencyStore> {
    store: Arc<S>,
    /// The store's name in spans and metrics, read once.
    store_name: &'static str,
    /// The store's response limit, read once.
    max_response_bytes: usize,
    lease: Duration,
    retention: Duration,
    max_run_time: Option<Duration>,
    too_large: Option<TooLarge>,
}

/// Builds what is stored for a response larger than the store keeps.
type TooLarge = Arc<dyn Fn(&StoredResponse, usize) -> StoredResponse + Send + Sync>;

impl<S: ?Sized> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            store_name: self.store_name,
            max_response_bytes: self.max_response_bytes,
            lease: self.lease,
            retention: self.retention,
            max_run_time: self.max_run_time,
            too_large: self.too_large.clone(),
        }
    }
}

impl<S: IdempotencyStore + ?Sized> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("store", &self.store)
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("max_run_time", &self.max_run_time)
            .field("custom_too_large", &self.too_large.is_some())
            .finish()
    }
}

impl<S: ?Sized> Idempotency<S> {
    /// How long the lease is renewed for a running handler by default.
    pub const DEFAULT_MAX_RUN_TIME: Duration = Duration::from_secs(15 * 60);
}

impl<S: IdempotencyStore + ?Sized> Idempotency<S> {
    /// A runner with the default lease (30 s) and retention (24 h), renewing
    /// the lease while a handler runs, for up to
    /// [`DEFAULT_MAX_RUN_TIME`](Self::DEFAULT_MAX_RUN_TIME) (15 minutes).
    ///
    /// Every run is a `tracing` span, and the store's operations it makes
    /// are spans inside it; with the `metrics` feature it records metrics
    /// too: see [`observability`](crate::observability) for their names and
    /// fields.
    pub fn new(store: Arc<S>) -> Self {
        let capabilities = store.capabilities();
        Self {
            store_name: capabilities.store,
            max_response_bytes: capabilities.max_response_bytes,
            store,
            lease: ClaimRequest::DEFAULT_LEASE,
            retention: ClaimRequest::DEFAULT_RETENTION,
            max_run_time: Some(Self::DEFAULT_MAX_RUN_TIME),
            too_large: None,
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

    /// How long a handler's lease is renewed while it runs (default
    /// [`DEFAULT_MAX_RUN_TIME`](Self::DEFAULT_MAX_RUN_TIME)).
    ///
    /// While the handler runs, the runner renews its lease every third of
    /// the lease (counted from each renewal's start), by a whole lease, so a
    /// live process never loses the key to a retry however long the handler
    /// takes, as long as each renewal reaches the store within two thirds of
    /// a lease: choose a lease of at least one and a half times the slowest
    /// store round trip you expect (under load, Postgres renewals were seen
    /// taking 300 ms; the default 30 s leaves a wide margin). After `max` the renewals
    /// stop (logged as a warning) and the lease runs out normally: a handler
    /// that hangs cannot hold its key forever, and a retry may then take the
    /// key over.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] if `max` is zero.
    pub fn with_max_run_time(mut self, max: Duration) -> Result<Self, InvalidInput> {
        if max.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "max run time",
                reason: "must be more than zero",
            });
        }
        self.max_run_time = Some(max);
        Ok(self)
    }

    /// Never renews a running handler's lease.
    ///
    /// What it costs: a handler that runs longer than the lease loses its
    /// key to the next retry, which takes it over and **runs the handler a
    /// second time** while the first still runs; the first then cannot
    /// store its response ([`RunError::LostLease`]). Choose it only for
    /// handlers that always finish well within the lease, or that renew
    /// themselves with [`RunContext::renew`]; it saves one store call per third
    /// of a lease of run time.
    #[must_use]
    pub fn without_auto_renew(mut self) -> Self {
        self.max_run_time = None;
        self
    }

    /// What is stored for a response larger than the store keeps
    /// ([`Capabilities::max_response_bytes`](crate::store::Capabilities)).
    ///
    /// The work happened, so its key must never run again: the caller still
    /// gets the whole response, and the record is completed with what
    /// `fallback` makes of it (given the response and the store's limit),
    /// which every retry then gets as a replay. By default that is the
    /// response's status with an `application/problem+json` body saying the
    /// response was too large to keep. A fallback that is itself too large
    /// is replaced by the status alone, with an empty body.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::{Fingerprint, Idempotency, RunOutcome, Scope, StoredResponse};
    /// use idem_memory::{MemoryOptions, MemoryStore};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let store = MemoryStore::with_options(MemoryOptions::default().max_response_bytes(64))?;
    /// let idem = Idempotency::new(Arc::new(store)).with_too_large_response(|response, _max| {
    ///     StoredResponse::new(response.status(), "report ready: GET /reports/7")
    /// });
    /// let (scope, fp) = (Scope::parse("acme", "report-7")?, Fingerprint::of_bytes(b"report"));
    /// let big = StoredResponse::new(200, vec![b'x'; 1000]);
    /// let first = idem.run(scope.clone(), fp, |_| async { Ok(big) }).await?;
    /// assert!(matches!(first, RunOutcome::Executed(r) if r.body().len() == 1000));
    /// let retry = idem
    ///     .run(scope, fp, |_| async { unreachable!("ran twice") as Result<StoredResponse, _> })
    ///     .await?;
    /// assert_eq!(retry, RunOutcome::Replayed(StoredResponse::new(200, "report ready: GET /reports/7")));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn with_too_large_response<F>(mut self, fallback: F) -> Self
    where
        F: Fn(&StoredResponse, usize) -> StoredResponse + Send + Sync + 'static,
    {
        self.too_large = Some(Arc::new(fallback));
        self
    }

    /// What the record stores for `response`: itself, or its fallback when
    /// the store cannot keep it.
    fn storable<'r>(&self, response: &'r StoredResponse) -> Cow<'r, StoredResponse> {
        let max = self.max_response_bytes;
        let size = response.size();
        if size <= max {
            return Cow::Borrowed(response);
        }
        tracing::warn!(
            size,
            max,
            "response too large for the idempotency store; its fallback is stored instead"
        );
        let fallback = match &self.too_large {
            Some(make) => make(response, max),
            None => too_large_problem(response, max),
        };
        if fallback.size() <= max {
            Cow::Owned(fallback)
        } else {
            Cow::Owned(StoredResponse::new(response.status(), Vec::new()))
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// The record of `scope`, or `None` if absent or past retention: for an
    /// admin route that shows a key's state (a [`Record`] serialises with
    /// serde).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
    /// use idem_memory::MemoryStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let idem: Idempotency = Idempotency::new(Arc::new(MemoryStore::new()));
    /// let scope = Scope::parse("acme", "order-1")?;
    /// idem.run(scope.clone(), Fingerprint::of_bytes(b"r"), |_| async {
    ///     Ok(StoredResponse::new(201, "placed"))
    /// })
    /// .await?;
    /// let record = idem.get(&scope).await?.expect("stored");
    /// assert!(serde_json::to_string(&record)?.contains("completed"));
    /// assert!(idem.delete(&scope).await?); // the next claim starts afresh
    /// assert!(idem.get(&scope).await?.is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::get`].
    ///
    /// [`Record`]: crate::store::Record
    pub async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.store.get(scope).await
    }

    /// Deletes the record of `scope`, whatever its state, and answers
    /// whether a live record was there: for a stuck key, or a client that
    /// must retry now. Outside the fencing protocol, as
    /// [`IdempotencyStore::delete`] says: the old owner's later fenced
    /// writes are `LostLease`, and the next claim starts afresh at attempt 1.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::delete`].
    pub async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        self.store.delete(scope).await
    }

    /// Runs `handler` at most once per scope and fingerprint.
    ///
    /// - A fresh key (or an expired lease: a takeover) runs the handler. It
    ///   returns its value with a [`Verdict`] (a plain [`StoredResponse`]
    ///   means [`Verdict::Store`]): stored, the key kept to its lease, or the
    ///   key released; the value comes back as [`RunOutcome::Executed`].
    /// - A completed key returns the stored response as [`RunOutcome::Replayed`].
    /// - A key held by a valid lease is refused with [`RunError::InProgress`];
    ///   a key used with another fingerprint with [`RunError::Mismatch`].
    ///
    /// A handler error keeps the claim until its lease expires (the work may
    /// have started), unless it is [`HandlerError::not_started`], which
    /// releases the claim so the client may retry at once. While the handler
    /// runs its lease is renewed (see [`with_max_run_time`](Self::with_max_run_time)),
    /// and a response too large for the store is stored as its fallback
    /// (see [`with_too_large_response`](Self::with_too_large_response)).
    ///
    /// # Cancellation
    ///
    /// Dropping the future (a timeout, an aborted task, a client gone)
    /// stops the handler where it is. The key stays claimed until its lease
    /// ends, since the handler's work may have happened; a retry is then
    /// told [`RunError::InProgress`] and, after the lease, takes the key
    /// over with the last checkpoint. Dropped during the completion, the
    /// record is completed or still in flight, never anything else. To run
    /// a handler to its end whatever its caller does, spawn the run (as
    /// `idem-http` does).
    ///
    /// # Errors
    ///
    /// The refusals above; [`RunError::NotStarted`] and [`RunError::Failed`]
    /// carry the handler's error; [`RunError::LostLease`] when another owner
    /// took the key over before completion (the response was not stored);
    /// [`RunError::Store`] when the store fails.
    pub async fn run<T, H, F, Fut>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        handler: F,
    ) -> Result<RunOutcome<T>, RunError>
    where
        T: Storable,
        H: IntoVerdict<T>,
        F: FnOnce(RunContext<S>) -> Fut,
        Fut: Future<Output = Result<H, HandlerError>>,
    {
        let no_transaction: Option<std::future::Ready<Result<NoTransaction, StoreError>>> = None;
        self.execute(scope, fingerprint, no_transaction, |ctx, _| async move {
            Ok((None, handler(ctx).await?))
        })
        .await
    }

    /// Runs `handler` at most once per scope and fingerprint, completing
    /// inside the transaction `begin` opens: the handler's writes and the
    /// stored response commit together, or neither does.
    ///
    /// The same as [`run`](Self::run) (settings, [`RunContext`], auto-renewal,
    /// outcomes) except where the completion lands. The claim commits on its
    /// own first, so a concurrent duplicate sees it; only then is `begin`
    /// awaited. The handler gets the transaction, writes through it, and
    /// hands it back with the response; the runner completes inside it and
    /// commits. [`RunContext::checkpoint_in`] writes a recovery point inside a
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
    /// # Cancellation
    ///
    /// Dropping the future before the commit has answered rolls the
    /// transaction back (the driver's drop) and releases the claim in a
    /// background task, fenced by the lease: if the commit had reached the
    /// store, its record stays completed (the store's lock or condition
    /// orders the release after it); if not, the key is free for the next
    /// delivery at once. Nothing is ever half written: the handler's
    /// writes and the completion commit together or not at all. Without a
    /// Tokio runtime to release in, the claim expires with its lease.
    ///
    /// # Errors
    ///
    /// As [`run`](Self::run); the errors of `begin` and of the commit as
    /// [`RunError::Store`] (after which the claim has been released).
    pub async fn run_in<T, Tx, H, B, F, Fut>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        begin: B,
        handler: F,
    ) -> Result<RunOutcome<T>, RunError>
    where
        T: Storable,
        Tx: Transaction,
        H: IntoVerdict<T>,
        B: Future<Output = Result<Tx, StoreError>>,
        F: FnOnce(RunContext<S>, Tx) -> Fut,
        Fut: Future<Output = Result<(Tx, H), HandlerError>>,
    {
        self.execute(scope, fingerprint, Some(begin), |ctx, tx| async move {
            let Some(tx) = tx else {
                return Err(HandlerError::not_started("no transaction was opened"));
            };
            let (tx, produced) = handler(ctx, tx).await?;
            Ok((Some(tx), produced))
        })
        .await
    }

    /// The one body of both runners: claim, open the transaction if there is
    /// one, run, and carry out the handler's verdict.
    async fn execute<T, Tx, H, B, W, Fut>(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
        begin: Option<B>,
        work: W,
    ) -> Result<RunOutcome<T>, RunError>
    where
        T: Storable,
        Tx: Transaction,
        H: IntoVerdict<T>,
        B: Future<Output = Result<Tx, StoreError>>,
        W: FnOnce(RunContext<S>, Option<Tx>) -> Fut,
        Fut: Future<Output = Result<(Option<Tx>, H), HandlerError>>,
    {
        let transactional = begin.is_some();
        let span = run_span(self.store_name, &scope, transactional);
        let result = async {
            let ctx = match self.claim(scope, fingerprint).await? {
                Claimed::Run(ctx) => ctx,
                Claimed::Replay(response) => return Ok(RunOutcome::Replayed(response)),
            };
            // A transactional run dropped before its commit ended wrote
            // nothing (or its commit's outcome is unknown): its claim is
            // released in the background, fenced, so a landed commit keeps
            // its record and a lost one frees the key at once.
            let mut abandoned = transactional.then(|| ReleaseOnDrop(Some(ctx.clone())));
            // Boxed: the handler's future and the completion after it are
            // kilobytes, which a replay never needs and which every future
            // holding this one would otherwise carry (and copy) inline.
            let finished = Box::pin(async move {
                let tx = match begin {
                    None => None,
                    Some(begin) => match begin.await {
                        Ok(tx) => Some(tx),
                        Err(error) => return Err(self.nothing_committed(&ctx, error).await),
                    },
                };
                let (tx, produced) = match self.drive(&ctx, work(ctx.clone(), tx)).await {
                    Ok(done) => done,
                    Err(error) => return Err(self.fail(&ctx, error, transactional).await),
                };
                let value = match produced.into_verdict() {
                    Verdict::Store(value) => value,
                    // Dropping the transaction rolls the handler's writes back.
                    Verdict::Keep(value) => return Ok(RunOutcome::Executed(value)),
                    Verdict::Release(value) => {
                        drop(tx);
                        self.release(&ctx).await;
                        return Ok(RunOutcome::Executed(value));
                    }
                };
                let lease = ctx.lease();
                {
                    let response = value.to_stored();
                    let stored = self.storable(&response);
                    match tx {
                        // The handler's work happened outside: a failed completion
                        // keeps the key (fenced, its outcome may be unknown).
                        None => {
                            self.store.complete(&lease, &stored).await?;
                        }
                        Some(mut tx) => {
                            if let Err(error) = tx.complete(&lease, &stored).await {
                                drop(tx);
                                return Err(self.nothing_committed(&ctx, error).await);
                            }
                            if let Err(error) = tx.commit().await {
                                return Err(self.nothing_committed(&ctx, error).await);
                            }
                        }
                    }
                }
                Ok(RunOutcome::Executed(value))
            })
            .await;
            if let Some(guard) = abandoned.as_mut() {
                guard.disarm();
            }
            finished
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
        let claimed = self.store.claim(&request).await?;
        let (lease, checkpoint) = match claimed {
            ClaimOutcome::Claimed { lease, checkpoint } => (lease, checkpoint),
            ClaimOutcome::Completed(response) => return Ok(Claimed::Replay(response)),
            ClaimOutcome::InProgress { retry_after } => {
                return Err(RunError::InProgress { retry_after });
            }
            ClaimOutcome::Mismatch => return Err(RunError::Mismatch),
        };
        // The run's span: a claim is made inside it.
        Span::current().record("attempt", lease.attempt());
        Ok(Claimed::Run(RunContext {
            store: Arc::clone(&self.store),
            lease: Arc::new(Mutex::new(lease)),
            checkpoint,
            lease_duration: self.lease,
        }))
    }

    /// Awaits the handler's work, renewing the lease meanwhile if asked to.
    async fn drive<T>(&self, ctx: &RunContext<S>, work: impl Future<Output = T>) -> T {
        let work = handler(self.store_name, work);
        let Some(max) = self.max_run_time else {
            return work.await;
        };
        tokio::pin!(work);
        let renewing = ctx.renew_until(max);
        tokio::pin!(renewing);
        tokio::select! {
            biased;
            result = &mut work => result,
            () = &mut renewing => work.await,
        }
    }

    async fn fail(&self, ctx: &RunContext<S>, error: HandlerError, rolled_back: bool) -> RunError {
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
    async fn nothing_committed(&self, ctx: &RunContext<S>, error: StoreError) -> RunError {
        if !error.is_lost_lease() {
            self.release(ctx).await;
        }
        error.into()
    }

    async fn release(&self, ctx: &RunContext<S>) {
        let lease = ctx.lease();
        let released = self.store.release(&lease).await;
        if let Err(error) = released {
            tracing::warn!(%error, "could not release a claim; it will expire with its lease");
        }
    }
}

/// The default stored answer for a response too large to keep: its status
/// and a small problem document (RFC 9457) saying so.
fn too_large_problem(response: &StoredResponse, max: usize) -> StoredResponse {
    let body = serde_json::json!({
        "type": "about:blank",
        "status": response.status(),
        "detail": format!(
            "The request was processed, but its response ({} bytes) was larger than the idempotency store keeps ({max} bytes); this is its stored answer.",
            response.size()
        ),
    });
    StoredResponse::new(response.status(), body.to_string())
        .with_header("content-type", "application/problem+json")
}

/// Releases a transactional run's claim if the run is dropped before it
/// ends (see `execute`).
struct ReleaseOnDrop<S: IdempotencyStore + ?Sized>(Option<RunContext<S>>);

impl<S: IdempotencyStore + ?Sized> ReleaseOnDrop<S> {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl<S: IdempotencyStore + ?Sized> Drop for ReleaseOnDrop<S> {
    fn drop(&mut self) {
        let Some(ctx) = self.0.take() else {
            return;
        };
        // Without a runtime (one shutting down) the claim expires with its
        // lease instead.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let lease = ctx.lease();
        runtime.spawn(async move {
            if let Err(error) = ctx.store.release(&lease).await
                && !error.is_lost_lease()
            {
                tracing::warn!(%error, "could not release an abandoned run's claim; it expires with its lease");
            }
        });
    }
}

enum Claimed<S: ?Sized> {
    Run(RunContext<S>),
    Replay(StoredResponse),
}

/// The transaction of a run that opens none (as [`Idempotency::run`], or a
/// layer without `in_transaction`): it has no values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTransaction {}

#[async_trait::async_trait]
impl Transaction for NoTransaction {
    async fn complete(&mut self, _: &Lease, _: &StoredResponse) -> Result<(), StoreError> {
        match *self {}
    }

    async fn checkpoint(&mut self, _: &Lease, _: &Checkpoint) -> Result<(), StoreError> {
        match *self {}
    }

    async fn commit(self) -> Result<(), StoreError> {
        match self {}
    }
}

/// What a handler gets: its lease, its attempt, the checkpoint a previous
/// owner left, and fenced operations on its record.
pub struct RunContext<S: ?Sized> {
    store: Arc<S>,
    lease: Arc<Mutex<Lease>>,
    checkpoint: Option<Checkpoint>,
    lease_duration: Duration,
}

impl<S: crate::store::AsDynStore + ?Sized> RunContext<S> {
    /// The same context over `dyn IdempotencyStore` (the same store, lease
    /// and checkpoint): the one type a layer hands its handlers whatever
    /// its store's (`idem-http` puts it in each request's extensions, so a
    /// handler over any store asks for
    /// `RunContext<dyn IdempotencyStore>`).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::store::IdempotencyStore;
    /// use idem_core::{Fingerprint, Idempotency, RunContext, Scope, StoredResponse};
    /// use idem_memory::MemoryStore;
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let idem = Idempotency::new(Arc::new(MemoryStore::new()));
    /// let scope = Scope::parse("acme", "order-1")?;
    /// idem.run(scope, Fingerprint::of_bytes(b"x"), |ctx| async move {
    ///     let any: RunContext<dyn IdempotencyStore> = ctx.erased();
    ///     let _key = any.downstream_key("charge");
    ///     Ok(StoredResponse::new(200, "done"))
    /// })
    /// .await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn erased(self) -> RunContext<dyn crate::store::IdempotencyStore> {
        RunContext {
            store: self.store.as_dyn_store(),
            lease: self.lease,
            checkpoint: self.checkpoint,
            lease_duration: self.lease_duration,
        }
    }
}

impl<S: ?Sized> Clone for RunContext<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            lease: Arc::clone(&self.lease),
            checkpoint: self.checkpoint.clone(),
            lease_duration: self.lease_duration,
        }
    }
}

impl<S: ?Sized> fmt::Debug for RunContext<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("lease", &*self.locked())
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

impl<S: ?Sized> RunContext<S> {
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

impl<S: IdempotencyStore + ?Sized> RunContext<S> {
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
        tx.checkpoint(&lease, &point).await
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
        let renewed = self.store.renew(&lease, extend).await?;
        *self.locked() = renewed;
        Ok(())
    }

    /// Renews by a whole lease every third of a lease until `max` has passed
    /// or a renewal fails; completion reports a lost lease, so a failure here
    /// only stops renewing. Each renewal starts a third of a lease after the
    /// last one started, not after it answered, so slow replies do not eat
    /// the margin: a lease holds while each renewal lands within two thirds
    /// of one.
    async fn renew_until(&self, max: Duration) {
        let every = (self.lease_duration / 3).max(Duration::from_millis(1));
        let deadline = tokio::time::Instant::now() + max;
        let mut next = tokio::time::Instant::now() + every;
        loop {
            tokio::time::sleep_until(next).await;
            next = tokio::time::Instant::now() + every;
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    max_run_time_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX),
                    key_hash = %self.locked().scope().key().redacted(),
                    "the handler is still running after its maximum run time; its lease is no longer renewed"
                );
                return;
            }
            if let Err(error) = self.renew(self.lease_duration).await {
                tracing::warn!(%error, "automatic lease renewal stopped");
                return;
            }
        }
    }
}

/// Records a finished run's outcome on its span.
fn finish_run<T>(span: &Span, result: &Result<RunOutcome<T>, RunError>) {
    let outcome = match result {
        Ok(RunOutcome::Executed(_)) => "executed",
        Ok(RunOutcome::Replayed(_)) => "replayed",
        Err(RunError::InProgress { .. }) => "in_progress",
        Err(RunError::Mismatch) => "mismatch",
        Err(RunError::LostLease) => "lost_lease",
        Err(RunError::NotStarted(_)) => "not_started",
        Err(RunError::Failed(_)) => "failed",
        Err(RunError::Store(_)) => "error",
    };
    span.record("outcome", outcome);
}
