//! The store trait every backend implements, what it reports about itself,
//! and the transaction a completion can share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::claim::{ClaimOutcome, ClaimRequest};
use crate::clock::Timestamp;
use crate::error::StoreError;
use crate::record::{Checkpoint, Lease, Record, StoredResponse};
use crate::scope::Scope;

/// What a store can share with the caller's own writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransactionSharing {
    /// Nothing: completion commits on its own.
    None,
    /// Completion can run inside the caller's transaction on the same database.
    SameDatabase,
    /// Completion can be one item of the caller's multi-item transaction.
    TransactItems,
}

/// Whether a completed record survives a restart of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Lost when the process or server stops.
    Volatile,
    /// Kept on durable storage once acknowledged.
    Durable,
    /// The store cannot tell (for example, a server whose settings are hidden).
    Unknown,
}

/// Whose clock judges leases and retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockSource {
    /// The server's clock: callers' clocks may disagree freely.
    Server,
    /// The calling process's clock: callers' clocks must agree within the
    /// lease's margin.
    Caller,
}

/// Whether a store may drop records that have not reached their retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Eviction {
    /// Records stay until retention.
    Never,
    /// The store may evict under memory pressure (the user accepted the risk).
    Possible,
    /// The store cannot tell (for example, its configuration is hidden).
    Unknown,
}

/// What a store reports about itself.
///
/// ```
/// use idem_core::store::{Capabilities, ClockSource, Durability, TransactionSharing};
///
/// let caps = Capabilities::new(
///     "memory",
///     TransactionSharing::None,
///     Durability::Volatile,
///     ClockSource::Caller,
///     1 << 20,
/// );
/// assert_eq!(caps.store, "memory");
/// assert_eq!(caps.max_response_bytes, 1 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The store's name, as its errors, spans and metrics carry it
    /// (`"memory"`, `"postgres"`, `"redis"`, `"dynamodb"`): one short
    /// lowercase word per backend (ASCII lowercase letters and digits,
    /// starting with a letter, at most 16 bytes), the same for every
    /// instance, so it can be a metric label.
    pub store: &'static str,
    /// What the store can share with the caller's business writes.
    pub transactions: TransactionSharing,
    /// Whether completed records survive a restart.
    pub durability: Durability,
    /// Whose clock judges leases and retention.
    pub clock: ClockSource,
    /// The largest [`StoredResponse::size`] the store accepts; `usize::MAX`
    /// for a store with no limit of its own.
    pub max_response_bytes: usize,
    /// Whether records can vanish before retention.
    pub eviction: Eviction,
}

impl Capabilities {
    /// Capabilities from each field; eviction [`Eviction::Never`].
    pub fn new(
        store: &'static str,
        transactions: TransactionSharing,
        durability: Durability,
        clock: ClockSource,
        max_response_bytes: usize,
    ) -> Self {
        Self {
            store,
            transactions,
            durability,
            clock,
            max_response_bytes,
            eviction: Eviction::Never,
        }
    }

    /// The same capabilities with another eviction answer.
    pub fn with_eviction(mut self, eviction: Eviction) -> Self {
        self.eviction = eviction;
        self
    }
}

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

    /// Deletes records past retention and returns how many it deleted.
    ///
    /// # Contract
    ///
    /// Never deletes a live record. Stores whose server expires records by
    /// itself may find nothing left to delete.
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
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if a fenced write found another owner (then
    /// nothing was written); [`StoreError::Rejected`] if the caller's own
    /// writes were refused (nothing was written);
    /// [`StoreError::Unavailable`] if the outcome is unknown.
    async fn commit(self) -> Result<(), StoreError>
    where
        Self: Sized;
}
