//! The store of idempotency records: the trait every backend implements
//! and the transaction a completion can share.

use crate::inbound::claim::{ClaimOutcome, ClaimRequest};
use crate::inbound::record::{Checkpoint, Lease, Record, StoredResponse};
use crate::observability::store_call;
use crate::plumbing::capabilities::Capabilities;
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::{InvalidInput, Operation, StoreError};
use crate::plumbing::layer::Layered;
use crate::plumbing::layer::OperationLayer;
use crate::plumbing::scope::Scope;
use async_trait::async_trait;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A store of idempotency records.
///
/// The contract every store keeps (the record, the decision table, fencing,
/// time) is the [`store`](crate::store) module's documentation; each sentence
/// of it is a case of the `idem-conformance` suite.
///
/// The trait is object safe: `Arc<dyn IdempotencyStore>` is a store too.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::store::IdempotencyStore;
///
/// fn takes_any_store(_store: Arc<dyn IdempotencyStore>) {}
/// fn takes_generic<S: IdempotencyStore>(_store: S) {}
///
/// fn forward(store: Arc<dyn IdempotencyStore>) {
///     takes_generic(store.clone());
///     takes_any_store(store);
/// }
/// ```
#[async_trait]
pub trait IdempotencyStore: Send + Sync + fmt::Debug + 'static {
    /// Decides and records one claim atomically.
    ///
    /// # Contract
    ///
    /// The decision table, in one atomic step: two racing claims of one
    /// scope never both come back `Claimed`. A record past retention counts as
    /// absent. A takeover carries the checkpoint to the new owner.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store cannot be reached (the claim
    /// may or may not have been written: a retry is answered by the table).
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Stores the response and marks the record completed.
    ///
    /// # Contract
    ///
    /// In flight with this owner becomes completed with `response` stored
    /// verbatim, kept for the lease's retention from now.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if the lease no longer owns the record;
    /// [`StoreError::TooLarge`] if the response is over
    /// [`Capabilities::max_response_bytes`]. Neither writes anything.
    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError>;

    /// Moves the lease's expiry to `extend` from now, for long work.
    ///
    /// # Contract
    ///
    /// Returns the lease with its new expiry (now + `extend`, by the store's
    /// clock). The record is retained until the later of its old retention
    /// and the new expiry.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if the lease no longer owns the record;
    /// [`StoreError::InvalidInput`] if `extend` is out of the lease range.
    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError>;

    /// Deletes the claim, for work that provably did not start, so the client
    /// may retry at once.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if the lease no longer owns the record.
    async fn release(&self, lease: &Lease) -> Result<(), StoreError>;

    /// Records a recovery point that a takeover will receive.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if the lease no longer owns the record.
    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError>;

    /// Reads the record of a scope, or `None` if absent or past retention.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`].
    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError>;

    /// Deletes records past retention and returns how many it deleted, for
    /// an operator's log.
    ///
    /// # Contract
    ///
    /// Never deletes a live record. Stores whose server expires records by
    /// itself may find nothing left to delete. The count is not part of the
    /// contract: it covers the whole store (every tenant's records) and may
    /// be 0 where the server expired them first, so no caller can check it
    /// against what it wrote.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`].
    async fn purge_expired(&self) -> Result<u64, StoreError>;

    /// Deletes the record of a scope, whatever its state: for operators (a
    /// stuck key, a client that must retry now).
    ///
    /// # Contract
    ///
    /// Outside the fencing protocol: it removes whatever is there, in flight
    /// or completed, held by anyone. The next claim of the scope is a fresh
    /// claim at attempt 1 with no checkpoint; a later fenced write by the
    /// old owner is `LostLease` (and its release succeeds, as a release of a
    /// record nobody holds does). Returns whether a live record was there: a
    /// record past retention counts as absent, so deleting one (or nothing)
    /// returns `false`. No other scope is touched.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] (the record may or may not be gone: delete
    /// again) or [`StoreError::Backend`].
    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError>;

    /// The time by the clock that judges `scope`'s record
    /// ([`Capabilities::clock`]): the server's, read from the server that
    /// holds the record, or the caller's.
    ///
    /// # Contract
    ///
    /// A record is live while this reads earlier than its
    /// [`retained_until`](Record::retained_until), and a lease holds while it
    /// reads earlier than the lease's expiry. Stores with a server clock read
    /// it in one round trip; the others read their [`Clock`](crate::store::Clock).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`].
    async fn now(&self, scope: &Scope) -> Result<Timestamp, StoreError>;

    /// What the store can do.
    fn capabilities(&self) -> Capabilities;
}

macro_rules! forward_store {
    ($($ptr:ident),*) => {$(
        #[async_trait]
        impl<T: IdempotencyStore + ?Sized> IdempotencyStore for $ptr<T> {
            async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
                (**self).claim(request).await
            }
            async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
                (**self).complete(lease, response).await
            }
            async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
                (**self).renew(lease, extend).await
            }
            async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
                (**self).release(lease).await
            }
            async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
                (**self).checkpoint(lease, checkpoint).await
            }
            async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
                (**self).get(scope).await
            }
            async fn purge_expired(&self) -> Result<u64, StoreError> {
                (**self).purge_expired().await
            }
            async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
                (**self).delete(scope).await
            }
            async fn now(&self, scope: &Scope) -> Result<Timestamp, StoreError> {
                (**self).now(scope).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
        }
    )*};
}

forward_store!(Arc, Box);

/// A record store seen as `dyn IdempotencyStore`: every sized store, and
/// `dyn IdempotencyStore` itself. It lets a layer hand its handlers one
/// context type whatever its store's
/// ([`RunContext::erased`](crate::RunContext::erased)); nothing to
/// implement, every store has it.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::store::{AsDynStore, IdempotencyStore};
/// use idem_memory::MemoryStore;
///
/// let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new()).as_dyn_store();
/// let again: Arc<dyn IdempotencyStore> = store.as_dyn_store();
/// # let _ = again;
/// ```
pub trait AsDynStore: IdempotencyStore {
    /// The same store behind a `dyn IdempotencyStore`.
    fn as_dyn_store(self: Arc<Self>) -> Arc<dyn IdempotencyStore>;
}

impl<T: IdempotencyStore> AsDynStore for T {
    fn as_dyn_store(self: Arc<Self>) -> Arc<dyn IdempotencyStore> {
        self
    }
}

impl AsDynStore for dyn IdempotencyStore {
    fn as_dyn_store(self: Arc<Self>) -> Arc<dyn IdempotencyStore> {
        self
    }
}

/// A transaction of the caller's that a completion or a checkpoint can join,
/// so that the business writes and the idempotency record commit or vanish
/// together. Backends that share transactions provide one (a Postgres
/// transaction on the store's database; a set of DynamoDB transact items);
/// [`Idempotency::run_in`](crate::Idempotency::run_in) drives it.
///
/// Dropping a transaction without [`commit`](Self::commit) rolls it back.
#[async_trait]
pub trait Transaction: Send + 'static {
    /// Completes the record under `lease` as part of this transaction.
    ///
    /// # Contract
    ///
    /// As [`IdempotencyStore::complete`], taking effect only if the
    /// transaction commits.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] where the store can tell before the commit;
    /// [`StoreError::TooLarge`] before anything is written.
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError>;

    /// Records a recovery point under `lease` as part of this transaction, so
    /// that a phase's writes and its checkpoint commit together.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] where the store can tell before the commit.
    async fn checkpoint(
        &mut self,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError>;

    /// Commits everything written in the transaction.
    ///
    /// # Contract
    ///
    /// A lease fences by its owner alone: the holder's own renewal or
    /// checkpoint through the store after its completion or checkpoint
    /// joined the transaction (a runner renews while its handler runs)
    /// never refuses the commit, and a checkpoint committed so leaves the
    /// lease as renewed, never shorter.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if a fenced write's lease no longer held:
    /// another owner took its record, or its record was completed or
    /// released meanwhile (then nothing was written, of any record); [`StoreError::Rejected`] if the caller's own
    /// writes were refused, or an operation of the transaction failed
    /// before it where the failure spoils the whole transaction (Postgres:
    /// any statement's error), so that nothing was written: a commit never
    /// answers `Ok` for a transaction the store rolled back;
    /// [`StoreError::Unavailable`] if the outcome is unknown.
    async fn commit(self) -> Result<(), StoreError>
    where
        Self: Sized;

    /// Whether this transaction claims ([`claim`](Self::claim)) and keeps
    /// savepoints ([`savepoint`](Self::savepoint)): what a consumer needs
    /// to handle a batch of messages in it. `false` unless the backend
    /// says otherwise; the other batch operations then refuse.
    fn batches(&self) -> bool {
        false
    }

    /// Whether a savepoint costs nothing but memory (kept in process, as
    /// DynamoDB's and the memory store's are), so a consumer takes one
    /// around every message of a batch. `false` unless the backend says
    /// so: a savepoint is then taken to cost a round trip and a
    /// subtransaction held to the commit (Postgres), and a consumer
    /// handles a batch without any, beginning it again with one per
    /// message only when a message must be undone alone (a version gap, a
    /// refused completion, a transaction grown too large).
    fn free_savepoints(&self) -> bool {
        false
    }

    /// Whether everything written so far can commit as one transaction.
    /// A consumer handling a batch checks it after each message: a message
    /// that made the transaction too large is rolled back to its savepoint,
    /// the messages before it commit, and it goes on in the next
    /// transaction. `true` unless the backend caps a transaction (DynamoDB:
    /// 100 items, and one write per item).
    fn fits(&self) -> bool {
        true
    }

    /// Claims inside this transaction (the inbox mode of a batch): the
    /// claim is decided as [`IdempotencyStore::claim`] decides it, and
    /// takes effect only if the transaction commits, so a claim and the
    /// writes it guards need one commit between them.
    ///
    /// # Contract
    ///
    /// Two transactions claiming one scope never both apply: the second
    /// waits on the first's uncommitted claim (Postgres: on the record's
    /// primary key), then finds it completed (the first committed) or
    /// claims it (the first rolled back), or answers `InProgress` while
    /// the first holds it (stores that cannot wait), or claims it and its
    /// commit is refused with nothing written if the first committed
    /// meanwhile (stores that decide at the commit: DynamoDB), answering a
    /// retryable [`StoreError::Unavailable`] (claimed again, the scope then
    /// answers the first's completion). Within one
    /// transaction a scope claimed and completed before answers
    /// `Completed`; a claim delivered again answers as it did the first
    /// time (`Claimed`, the same lease), and another owner's claim of a
    /// scope claimed in it answers `InProgress` while that lease lives.
    /// Past the lease a store may let the other owner take the scope over
    /// (the first holder's completion is then a lost lease, as through
    /// the store: Postgres) or keep answering `InProgress` (a store that
    /// writes an item once per transaction: DynamoDB); either way one
    /// holder completes it.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::claim`]; after an error the transaction is
    /// to be rolled back. [`StoreError::Misconfigured`] where the
    /// transaction does not [`batch`](Self::batches).
    async fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let _ = request;
        Err(unbatched(Operation::Claim))
    }

    /// Claims each of `requests` inside this transaction, as
    /// [`claim`](Self::claim) would one after another, and answers each's
    /// outcome in their order; a store that can sends them in one round
    /// trip (Postgres: one statement). The default claims them one by one.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim), for the first that failed: the
    /// transaction is then to be rolled back.
    async fn claim_all(
        &mut self,
        requests: &[ClaimRequest],
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let mut outcomes = Vec::with_capacity(requests.len());
        for request in requests {
            outcomes.push(self.claim(request).await?);
        }
        Ok(outcomes)
    }

    /// Completes the record under each lease with its response as part of
    /// this transaction, as [`complete`](Self::complete) would one after
    /// another; a store that can sends them in one round trip. The default
    /// completes them one by one.
    ///
    /// # Errors
    ///
    /// As [`complete`](Self::complete), for the first that failed (a store
    /// that sends them at once answers [`StoreError::LostLease`] if any
    /// lease no longer holds): the transaction is then to be rolled back.
    async fn complete_all(
        &mut self,
        completions: &[(Lease, StoredResponse)],
    ) -> Result<(), StoreError> {
        for (lease, response) in completions {
            self.complete(lease, response).await?;
        }
        Ok(())
    }

    /// Claims each request and completes at once, with `response`, each it
    /// claims, as part of this transaction: the inbox of a consumer, whose
    /// stored response does not depend on what its handler did (the
    /// handler's writes join the transaction before the commit). A store
    /// that can writes each record once, complete, in one round trip; the
    /// default claims them all ([`claim_all`](Self::claim_all)), then
    /// completes the claimed ([`complete_all`](Self::complete_all)).
    ///
    /// # Contract
    ///
    /// Answers one entry per request, in their order: `None` where a claim
    /// would have answered `Claimed` (the scope free, past its retention,
    /// or its lease lapsed), the record now completed with `response` in
    /// the transaction, so that after the commit a claim of it answers
    /// `Completed` with `response`, and a rollback leaves it as it was;
    /// `Some` with what the claim answered otherwise (`InProgress`,
    /// `Completed`, `Mismatch`), nothing written for it. Each scope may
    /// appear once among the requests.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for a scope twice among the requests,
    /// before anything is written; otherwise as
    /// [`claim_all`](Self::claim_all) and
    /// [`complete_all`](Self::complete_all): the transaction is then to be
    /// rolled back.
    async fn claim_completed_all(
        &mut self,
        requests: &[ClaimRequest],
        response: &StoredResponse,
    ) -> Result<Vec<Option<ClaimOutcome>>, StoreError> {
        once_each(requests)?;
        let outcomes = self.claim_all(requests).await?;
        let mut completions = Vec::new();
        let answers = outcomes
            .into_iter()
            .map(|outcome| match outcome {
                ClaimOutcome::Claimed { lease, .. } => {
                    completions.push((lease, response.clone()));
                    None
                }
                other => Some(other),
            })
            .collect();
        self.complete_all(&completions).await?;
        Ok(answers)
    }

    /// Marks the point [`rollback_to_savepoint`](Self::rollback_to_savepoint)
    /// returns to. Savepoints nest: the rollback and the release name the
    /// latest one still open.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] (roll the transaction back);
    /// [`StoreError::Misconfigured`] where the transaction does not
    /// [`batch`](Self::batches).
    async fn savepoint(&mut self) -> Result<(), StoreError> {
        Err(unbatched(Operation::Transaction))
    }

    /// Undoes everything written since the latest open savepoint (claims
    /// and completions included) and closes it; what was written before
    /// it stays.
    ///
    /// # Errors
    ///
    /// As [`savepoint`](Self::savepoint). Called with no savepoint open it
    /// is the caller's mistake, answered with an error at once or at the
    /// transaction's next statement (where the store defers it: Postgres
    /// sends a release with the next statement); nothing written before is
    /// undone by it, and the transaction is to be rolled back.
    async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        Err(unbatched(Operation::Transaction))
    }

    /// Closes the latest open savepoint, keeping what was written since.
    ///
    /// # Errors
    ///
    /// As [`savepoint`](Self::savepoint). With no savepoint open, as
    /// [`rollback_to_savepoint`](Self::rollback_to_savepoint).
    async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        Err(unbatched(Operation::Transaction))
    }
}

/// Refuses requests naming one scope twice, as
/// [`Transaction::claim_completed_all`] does before anything is written.
///
/// # Errors
///
/// [`StoreError::InvalidInput`] for the first scope named again.
pub fn once_each(requests: &[ClaimRequest]) -> Result<(), StoreError> {
    let mut seen = std::collections::HashSet::with_capacity(requests.len());
    if requests.iter().all(|request| seen.insert(request.scope())) {
        return Ok(());
    }
    Err(StoreError::InvalidInput(InvalidInput::Malformed {
        field: "requests",
        reason: "a scope named twice in one claim_completed_all".to_string(),
    }))
}

/// The refusal of a batch operation by a transaction that does not batch.
fn unbatched(operation: Operation) -> StoreError {
    StoreError::Misconfigured {
        store: "transaction",
        message: format!(
            "{operation:?} of a batch asked of a transaction that does not batch \
             (Transaction::batches is false)"
        ),
    }
}

impl<S: IdempotencyStore> Layered<S> {
    /// `inner` with every operation bounded by `timeout`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        let layer = OperationLayer::new(inner.capabilities().store, timeout);
        Self::with_layer(inner, layer)
    }
}

#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for Layered<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.layer()
            .traced_claim(request, self.get_ref().claim(request))
            .await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let done = self.get_ref().complete(lease, response);
        self.layer()
            .call_under(Operation::Complete, lease, done)
            .await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let renewed = self.get_ref().renew(lease, extend);
        self.layer()
            .call_under(Operation::Renew, lease, renewed)
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let done = self.get_ref().release(lease);
        self.layer()
            .traced(
                Operation::Release,
                Some(lease.scope()),
                Some(lease.attempt()),
                done,
            )
            .await
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let done = self.get_ref().checkpoint(lease, checkpoint);
        self.layer()
            .call_under(Operation::Checkpoint, lease, done)
            .await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let read = self.get_ref().get(scope);
        self.layer()
            .traced(Operation::Get, Some(scope), None, read)
            .await
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let purged = self.get_ref().purge_expired();
        self.layer().call_unbounded(Operation::Purge, purged).await
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let deleted = self.get_ref().delete(scope);
        self.layer()
            .call(Operation::Delete, Some(scope), deleted)
            .await
    }

    async fn now(&self, scope: &Scope) -> Result<Timestamp, StoreError> {
        let read = self.get_ref().now(scope);
        self.layer()
            .traced(Operation::Now, Some(scope), None, read)
            .await
    }

    fn capabilities(&self) -> Capabilities {
        self.get_ref().capabilities()
    }
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

/// The layer's calls that name a record: under a lease, and the claim.
impl OperationLayer {
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

    async fn traced_claim(
        &self,
        request: &ClaimRequest,
        future: impl Future<Output = Result<ClaimOutcome, StoreError>>,
    ) -> Result<ClaimOutcome, StoreError> {
        let bounded = self.bounded(Operation::Claim, future);
        let scope = Some(request.scope());
        store_call(
            Operation::Claim,
            self.store(),
            scope,
            None,
            claim_outcome,
            bounded,
        )
        .await
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
