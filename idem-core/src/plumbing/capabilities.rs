//! What a store reports about itself: what it shares with the caller's
//! writes, how durable it is, whose clock it keeps, its limits.

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
    /// Completion can join a transaction kept in this process, which the
    /// caller's own in-process writes join as closures run at its commit
    /// (`idem_memory::MemoryTransaction::on_commit`).
    InProcess,
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
    /// The largest [`StoredResponse::size`](crate::StoredResponse::size) the store accepts; `usize::MAX`
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
