//! The one wrapper around every store operation: its time limit, its span
//! and its metrics, written once here so every store times out, traces and
//! counts the same way (as OpenDAL's layers wrap every backend).

use crate::observability::store_call;
use crate::plumbing::error::{Operation, StoreError};
use crate::plumbing::scope::Scope;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// What a store does around each of its operations: bounds it in time,
/// opens its `idem.store` span and records its metrics (see
/// [`observability`](crate::observability)).
///
/// [`Layered`] applies it to every [`IdempotencyStore`](crate::store::IdempotencyStore) operation; a
/// backend calls it itself only for what the trait does not cover: opening
/// and committing a [`Transaction`](crate::store::Transaction), a claim
/// inside the caller's transaction, one batch of a purge, a read at start.
///
/// Past the limit the operation's future is dropped (whatever it was waiting
/// for: a connection, a reply, the driver's own retries) and the operation
/// ends in [`StoreError::Unavailable`] naming the store and the operation,
/// "timed out". As for every `Unavailable`, it may or may not have happened:
/// a retry with the same request or lease gets the true answer, since every
/// operation is safe to deliver twice. Without a limit
/// ([`unlimited`](Self::unlimited), or a limit too far ahead to represent,
/// such as [`Duration::MAX`]) no timer is set, so no tokio timer is needed.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Operation, StoreError};
/// use idem_core::store::OperationLayer;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let layer = OperationLayer::new("example", Duration::from_millis(10));
/// assert_eq!(layer.call(Operation::Get, None, async { Ok(7) }).await?, 7);
///
/// let stalled = std::future::pending::<Result<(), StoreError>>();
/// let err = layer.call(Operation::Claim, None, stalled).await.unwrap_err();
/// assert!(err.is_retryable());
/// assert_eq!(err.to_string(), "example claim: unavailable: timed out after 10ms");
/// # Ok::<(), StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationLayer {
    store: &'static str,
    timeout: Option<Duration>,
}

impl OperationLayer {
    /// The layer of the store named `store` (its
    /// [`Capabilities::store`](crate::store::Capabilities::store)), bounding each operation by `timeout`.
    pub fn new(store: &'static str, timeout: Duration) -> Self {
        let representable = tokio::time::Instant::now().checked_add(timeout).is_some();
        Self {
            store,
            timeout: representable.then_some(timeout),
        }
    }

    /// The layer of a store whose operations never wait (in process): spans
    /// and metrics, no time limit.
    pub fn unlimited(store: &'static str) -> Self {
        Self {
            store,
            timeout: None,
        }
    }

    /// The store's name, as spans, metrics and errors carry it.
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// The time limit of each operation, if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Runs `future`, one `operation` on `scope` (if it has one), within
    /// the limit, in its span.
    ///
    /// # Errors
    ///
    /// What `future` returns, or [`StoreError::Unavailable`] past the limit.
    pub async fn call<T>(
        &self,
        operation: Operation,
        scope: Option<&Scope>,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // Boxed: a driver's future (a pooled connection's `begin`, a query)
        // can be kilobytes, and each layer would otherwise hold it again.
        self.traced(operation, scope, None, Box::pin(future)).await
    }

    /// [`call`](Self::call) for a future that is small already (a boxed
    /// one, as every trait method's is).
    pub(crate) async fn traced<T>(
        &self,
        operation: Operation,
        scope: Option<&Scope>,
        attempt: Option<u32>,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bounded = self.bounded(operation, future);
        store_call(
            operation,
            self.store,
            scope,
            attempt,
            |_| ("ok", None),
            bounded,
        )
        .await
    }

    /// The span and metrics with no time limit, for a purge, whose batches
    /// the store bounds one by one with [`timed`](Self::timed).
    pub(crate) async fn call_unbounded<T>(
        &self,
        operation: Operation,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        store_call(operation, self.store, None, None, |_| ("ok", None), future).await
    }

    /// The time limit alone, for a part of an operation whose span the
    /// store's [`Layered`] opens (one batch of a purge).
    ///
    /// # Errors
    ///
    /// What `future` returns, or [`StoreError::Unavailable`] past the limit.
    pub async fn timed<T>(
        &self,
        operation: Operation,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded(operation, Box::pin(future)).await
    }

    pub(crate) async fn bounded<T>(
        &self,
        operation: Operation,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let Some(limit) = self.timeout else {
            return future.await;
        };
        match tokio::time::timeout(limit, future).await {
            Ok(result) => result,
            Err(_elapsed) => Err(StoreError::unavailable(
                self.store,
                operation,
                format!("timed out after {limit:?}"),
            )),
        }
    }
}

/// A store with its [`OperationLayer`] around every operation: what a
/// backend's public store holds, so that every operation is bounded,
/// traced and counted whoever calls it (the runner, a cache, an operator's
/// tool).
///
/// `purge_expired` gets its span but no overall limit: a store bounds each
/// of its batches (with [`OperationLayer::timed`]), since a purge of many
/// records may rightly take long.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Fingerprint, Scope};
/// use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Layered};
/// use idem_memory::MemoryStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = Layered::new(MemoryStore::new(), Duration::from_secs(1));
/// let request = ClaimRequest::new(Scope::parse("acme", "k")?, Fingerprint::of_bytes(b"r"));
/// assert!(matches!(store.claim(&request).await?, ClaimOutcome::Claimed { .. }));
/// assert_eq!(store.layer().store(), "memory");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Layered<S> {
    inner: S,
    layer: OperationLayer,
}

impl<S> Layered<S> {
    /// `inner` with the given layer: any store, an idempotency store or a
    /// journal store.
    pub fn with_layer(inner: S, layer: OperationLayer) -> Self {
        Self { inner, layer }
    }

    /// The store inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The layer around it.
    pub fn layer(&self) -> OperationLayer {
        self.layer
    }
}

impl<S: Clone> Clone for Layered<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer,
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Layered<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The layer is the store's own settings: show the store as itself.
        self.inner.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stalled_operation_is_unavailable_at_its_limit() {
        let limit = Duration::from_millis(40);
        let started = tokio::time::Instant::now();
        let err = OperationLayer::new("s", limit)
            .call(
                Operation::Complete,
                None,
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
        let lost = OperationLayer::new("s", Duration::from_secs(60))
            .call(Operation::Renew, None, async {
                Err::<(), _>(StoreError::LostLease)
            })
            .await;
        assert!(matches!(lost, Err(StoreError::LostLease)));
        let unlimited = OperationLayer::new("s", Duration::MAX);
        assert_eq!(unlimited.timeout(), None);
        let late = unlimited
            .call(Operation::Get, None, async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(1)
            })
            .await;
        assert_eq!(late.ok(), Some(1));
    }

    #[test]
    fn an_unlimited_layer_needs_no_timer() {
        // A runtime without its timer: a layer that set one would panic.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let answer =
            runtime.block_on(
                OperationLayer::unlimited("s").call(Operation::Get, None, async { Ok(3) }),
            );
        assert_eq!(answer.ok(), Some(3));
    }
}
