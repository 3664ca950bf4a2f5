//! The one wrapper around every store operation: its time limit, its span
//! and its metrics, written once here so every store times out, traces and
//! counts the same way (as OpenDAL's layers wrap every backend).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{Capabilities, IdempotencyStore};
use crate::claim::{ClaimOutcome, ClaimRequest};
use crate::clock::Timestamp;
use crate::error::{Operation, StoreError};
use crate::journal::{
    Acquired, Finish, Holder, JournalRecord, JournalStore, ListQuery, NewOperation, OperationKey,
};
use crate::observability::store_call;
use crate::outbox::{
    BatchClaim, MessageId, MessageState, NewMessage, OutboxMessage, OutboxStats, OutboxStore,
    PublishFailure,
};
use crate::record::{Checkpoint, Lease, OwnerToken, Record, StoredResponse};
use crate::scope::Scope;

/// What a store does around each of its operations: bounds it in time,
/// opens its `idem.store` span and records its metrics (see
/// [`observability`](crate::observability)).
///
/// [`Layered`] applies it to every [`IdempotencyStore`] operation; a
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
    /// [`Capabilities::store`]), bounding each operation by `timeout`.
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

    /// [`call`](Self::call) for an operation under `lease`: its span
    /// carries the lease's scope and attempt.
    ///
    /// # Errors
    ///
    /// What `future` returns, or [`StoreError::Unavailable`] past the limit.
    pub async fn call_under<T>(
        &self,
        operation: Operation,
        lease: &Lease,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let attempt = Some(lease.attempt());
        self.traced(operation, Some(lease.scope()), attempt, Box::pin(future))
            .await
    }

    /// [`call`](Self::call) for a claim: its span and metrics carry the
    /// claim's outcome and, once claimed, its attempt.
    ///
    /// # Errors
    ///
    /// What `future` returns, or [`StoreError::Unavailable`] past the limit.
    pub async fn claim(
        &self,
        request: &ClaimRequest,
        future: impl Future<Output = Result<ClaimOutcome, StoreError>>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.traced_claim(request, Box::pin(future)).await
    }

    /// [`call`](Self::call) for a future that is small already (a boxed
    /// one, as every trait method's is).
    async fn traced<T>(
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

    async fn traced_claim(
        &self,
        request: &ClaimRequest,
        future: impl Future<Output = Result<ClaimOutcome, StoreError>>,
    ) -> Result<ClaimOutcome, StoreError> {
        let bounded = self.bounded(Operation::Claim, future);
        let scope = Some(request.scope());
        store_call(
            Operation::Claim,
            self.store,
            scope,
            None,
            claim_outcome,
            bounded,
        )
        .await
    }

    /// The span and metrics with no time limit, for a purge, whose batches
    /// the store bounds one by one with [`timed`](Self::timed).
    async fn call_unbounded<T>(
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

    async fn bounded<T>(
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

/// A claim's span outcome and attempt.
fn claim_outcome(outcome: &ClaimOutcome) -> (&'static str, Option<u32>) {
    match outcome {
        ClaimOutcome::Claimed { lease, .. } if lease.attempt() > 1 => {
            ("takeover", Some(lease.attempt()))
        }
        ClaimOutcome::Claimed { lease, .. } => ("claimed", Some(lease.attempt())),
        ClaimOutcome::Completed(_) => ("replayed", None),
        ClaimOutcome::InProgress { .. } => ("in_progress", None),
        ClaimOutcome::Mismatch => ("mismatch", None),
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

impl<S: IdempotencyStore> Layered<S> {
    /// `inner` with every operation bounded by `timeout`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        let layer = OperationLayer::new(inner.capabilities().store, timeout);
        Self { inner, layer }
    }
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

#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for Layered<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.layer
            .traced_claim(request, self.inner.claim(request))
            .await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let done = self.inner.complete(lease, response);
        self.layer
            .call_under(Operation::Complete, lease, done)
            .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let renewed = self.inner.renew(lease, extend);
        self.layer
            .call_under(Operation::Renew, lease, renewed)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let done = self.inner.release(lease);
        self.layer
            .traced(
                Operation::Release,
                Some(lease.scope()),
                Some(lease.attempt()),
                done,
            )
            .await
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let done = self.inner.checkpoint(lease, checkpoint);
        self.layer
            .call_under(Operation::Checkpoint, lease, done)
            .await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let read = self.inner.get(scope);
        self.layer
            .traced(Operation::Get, Some(scope), None, read)
            .await
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let purged = self.inner.purge_expired();
        self.layer.call_unbounded(Operation::Purge, purged).await
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let deleted = self.inner.delete(scope);
        self.layer
            .call(Operation::Delete, Some(scope), deleted)
            .await
    }

    async fn now(&self, scope: &Scope) -> Result<Timestamp, StoreError> {
        let read = self.inner.now(scope);
        self.layer
            .traced(Operation::Now, Some(scope), None, read)
            .await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl<S: JournalStore> JournalStore for Layered<S> {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        let recorded = self.inner.record(operation);
        let scope = journal_scope(operation.key());
        self.layer
            .traced(Operation::Record, scope.as_ref(), None, recorded)
            .await
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        let read = self.inner.get(key);
        let scope = journal_scope(key);
        self.layer
            .traced(Operation::Get, scope.as_ref(), None, read)
            .await
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let acquired = self.inner.acquire(held, lease);
        let scope = journal_scope(held.key);
        self.layer
            .traced(Operation::Acquire, scope.as_ref(), None, acquired)
            .await
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let sent = self.inner.mark_sent(held, sends);
        let scope = journal_scope(held.key);
        self.layer
            .traced(Operation::MarkSent, scope.as_ref(), None, sent)
            .await
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let finished = self.inner.finish(held, finish);
        let scope = journal_scope(held.key);
        self.layer
            .traced(Operation::Finish, scope.as_ref(), None, finished)
            .await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        let listed = self.inner.list(query);
        self.layer.traced(Operation::List, None, None, listed).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl<S: OutboxStore> OutboxStore for Layered<S> {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        let enqueued = self.inner.enqueue(message);
        self.layer
            .traced(Operation::Enqueue, None, None, enqueued)
            .await
    }

    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError> {
        let claimed = self.inner.claim(batch);
        self.layer
            .traced(Operation::Claim, None, None, claimed)
            .await
    }

    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let sent = self.inner.mark_sent(owner, ids);
        self.layer
            .traced(Operation::MarkSent, None, None, sent)
            .await
    }

    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let released = self.inner.release(owner, ids);
        self.layer
            .traced(Operation::Release, None, None, released)
            .await
    }

    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError> {
        let failed = self.inner.mark_failed(failure);
        self.layer
            .traced(Operation::MarkFailed, None, None, failed)
            .await
    }

    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let parked = self.inner.parked(limit);
        self.layer.traced(Operation::List, None, None, parked).await
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let retried = self.inner.retry(id);
        self.layer
            .traced(Operation::Retry, None, None, retried)
            .await
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let dropped = self.inner.drop_message(id, reason);
        self.layer
            .traced(Operation::Drop, None, None, dropped)
            .await
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let purged = self.inner.purge_sent(older_than, limit);
        self.layer
            .traced(Operation::Purge, None, None, purged)
            .await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let stats = self.inner.stats();
        self.layer.traced(Operation::Stats, None, None, stats).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

/// A journal operation's span fields ([`OperationKey::span_scope`]).
fn journal_scope(key: &OperationKey) -> Option<Scope> {
    key.span_scope()
}

/// Implements [`IdempotencyStore`] for a type by forwarding every operation
/// to a field that is a store (a [`Layered`] one, usually): how a backend's
/// public store type gets its layer without writing the trait twice.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{IdempotencyStore, Layered, forward_store};
/// use idem_memory::MemoryStore;
///
/// #[derive(Debug)]
/// struct MyStore {
///     records: Layered<MemoryStore>,
/// }
/// forward_store!(MyStore => records);
///
/// let store = MyStore { records: Layered::new(MemoryStore::new(), Duration::from_secs(1)) };
/// assert_eq!(store.capabilities().store, "memory");
/// ```
#[macro_export]
#[doc(hidden)]
macro_rules! __forward_store {
    (outbox $ty:ty => $field:ident) => {
        #[$crate::async_trait]
        impl $crate::store::OutboxStore for $ty {
            async fn enqueue(
                &self,
                message: &$crate::store::NewMessage,
            ) -> ::core::result::Result<$crate::store::OutboxMessage, $crate::StoreError> {
                self.$field.enqueue(message).await
            }
            async fn claim(
                &self,
                batch: &$crate::store::BatchClaim,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.claim(batch).await
            }
            async fn mark_sent(
                &self,
                owner: $crate::store::OwnerToken,
                ids: &[$crate::store::MessageId],
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.mark_sent(owner, ids).await
            }
            async fn release(
                &self,
                owner: $crate::store::OwnerToken,
                ids: &[$crate::store::MessageId],
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.release(owner, ids).await
            }
            async fn mark_failed(
                &self,
                failure: &$crate::store::PublishFailure,
            ) -> ::core::result::Result<$crate::store::MessageState, $crate::StoreError> {
                self.$field.mark_failed(failure).await
            }
            async fn parked(
                &self,
                limit: usize,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.parked(limit).await
            }
            async fn retry(
                &self,
                id: $crate::store::MessageId,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.retry(id).await
            }
            async fn drop_message(
                &self,
                id: $crate::store::MessageId,
                reason: &str,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.drop_message(id, reason).await
            }
            async fn purge_sent(
                &self,
                older_than: ::core::time::Duration,
                limit: usize,
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.purge_sent(older_than, limit).await
            }
            async fn stats(
                &self,
            ) -> ::core::result::Result<$crate::store::OutboxStats, $crate::StoreError> {
                self.$field.stats().await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
    (journal $ty:ty => $field:ident) => {
        #[$crate::async_trait]
        impl $crate::store::JournalStore for $ty {
            async fn record(
                &self,
                operation: &$crate::store::NewOperation,
            ) -> ::core::result::Result<$crate::store::JournalRecord, $crate::StoreError> {
                self.$field.record(operation).await
            }
            async fn get(
                &self,
                key: &$crate::store::OperationKey,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::store::JournalRecord>,
                $crate::StoreError,
            > {
                self.$field.get(key).await
            }
            async fn acquire(
                &self,
                held: $crate::store::Holder<'_>,
                lease: ::core::time::Duration,
            ) -> ::core::result::Result<$crate::store::Acquired, $crate::StoreError> {
                self.$field.acquire(held, lease).await
            }
            async fn mark_sent(
                &self,
                held: $crate::store::Holder<'_>,
                sends: u32,
            ) -> ::core::result::Result<$crate::store::JournalRecord, $crate::StoreError> {
                self.$field.mark_sent(held, sends).await
            }
            async fn finish(
                &self,
                held: $crate::store::Holder<'_>,
                finish: &$crate::store::Finish,
            ) -> ::core::result::Result<$crate::store::JournalRecord, $crate::StoreError> {
                self.$field.finish(held, finish).await
            }
            async fn list(
                &self,
                query: &$crate::store::ListQuery,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::JournalRecord>,
                $crate::StoreError,
            > {
                self.$field.list(query).await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
    ($ty:ty => $field:ident) => {
        #[$crate::async_trait]
        impl $crate::store::IdempotencyStore for $ty {
            async fn claim(
                &self,
                request: &$crate::store::ClaimRequest,
            ) -> ::core::result::Result<$crate::store::ClaimOutcome, $crate::StoreError> {
                self.$field.claim(request).await
            }
            async fn complete(
                &self,
                lease: &$crate::store::Lease,
                response: &$crate::StoredResponse,
            ) -> ::core::result::Result<(), $crate::StoreError> {
                self.$field.complete(lease, response).await
            }
            async fn renew(
                &self,
                lease: &$crate::store::Lease,
                extend: ::core::time::Duration,
            ) -> ::core::result::Result<$crate::store::Lease, $crate::StoreError> {
                self.$field.renew(lease, extend).await
            }
            async fn release(
                &self,
                lease: &$crate::store::Lease,
            ) -> ::core::result::Result<(), $crate::StoreError> {
                self.$field.release(lease).await
            }
            async fn checkpoint(
                &self,
                lease: &$crate::store::Lease,
                checkpoint: &$crate::Checkpoint,
            ) -> ::core::result::Result<(), $crate::StoreError> {
                self.$field.checkpoint(lease, checkpoint).await
            }
            async fn get(
                &self,
                scope: &$crate::Scope,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::store::Record>,
                $crate::StoreError,
            > {
                self.$field.get(scope).await
            }
            async fn purge_expired(&self) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.purge_expired().await
            }
            async fn delete(
                &self,
                scope: &$crate::Scope,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.delete(scope).await
            }
            async fn now(
                &self,
                scope: &$crate::Scope,
            ) -> ::core::result::Result<$crate::store::Timestamp, $crate::StoreError> {
                self.$field.now(scope).await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
}

/// Implements [`OutboxStore`] for a type by forwarding every operation to a
/// field that is an outbox store: `forward_outbox_store!(MyOutbox => field)`.
#[macro_export]
#[doc(hidden)]
macro_rules! __forward_outbox_store {
    ($ty:ty => $field:ident) => {
        $crate::__forward_store!(outbox $ty => $field);
    };
}

/// Implements [`JournalStore`] for a type by forwarding every operation to
/// a field that is a journal store: `forward_journal_store!(MyJournal =>
/// field)`, as [`forward_store!`](crate::store::forward_store) does for
/// [`IdempotencyStore`].
#[macro_export]
#[doc(hidden)]
macro_rules! __forward_journal_store {
    ($ty:ty => $field:ident) => {
        $crate::__forward_store!(journal $ty => $field);
    };
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
