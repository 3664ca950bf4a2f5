//! # idem-cache
//!
//! A replay cache in front of any idem store: completed records are kept in
//! this process, so a retry of finished work is answered without a round
//! trip. [`CachedStore`] is itself an [`IdempotencyStore`], with the inner
//! store's [`Capabilities`], and passes the whole conformance suite in front
//! of every backend.
//!
//! - A claim whose scope has a cached completed record answers
//!   [`ClaimOutcome::Completed`] (same fingerprint) or
//!   [`ClaimOutcome::Mismatch`] (another one) by itself.
//! - Everything else goes to the inner store: fresh claims, duplicates in
//!   flight, takeovers, completions, renewals, releases, checkpoints, reads.
//!   A `Completed` answer from the inner store, and a successful
//!   [`complete`](IdempotencyStore::complete) of a claim made through the
//!   cache, are cached.
//! - [`delete`](IdempotencyStore::delete) evicts the scope here and deletes
//!   it there.
//! - Bounded by entries and by bytes (a weigher counts each response, its
//!   headers and its scope), both in [`CacheOptions`]; moka evicts the least
//!   useful entries past either bound.
//!
//! It is a crate of its own, not part of `idem-memory`: it sits in front of
//! Postgres, Redis or DynamoDB as much as memory, and a service on a
//! networked store should not depend on the in-memory store to get it.
//!
//! ```
//! use std::sync::Arc;
//! use idem_cache::{CacheOptions, CachedStore};
//! use idem_core::{Fingerprint, Idempotency, RunOutcome, Scope, StoredResponse};
//! use idem_memory::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let options = CacheOptions::default().max_entries(50_000).max_bytes(32 << 20);
//! let store = CachedStore::with_options(Arc::new(MemoryStore::new()), options)?;
//! let idem = Idempotency::new(Arc::new(store));
//! let (scope, fingerprint) = (Scope::parse("acme", "order-1")?, Fingerprint::of_bytes(b"order"));
//! idem.run(scope.clone(), fingerprint, |_| async { Ok(StoredResponse::new(201, "placed")) }).await?;
//! // The retry is answered from this process's cache.
//! let retry = idem
//!     .run(scope, fingerprint, |_| async { unreachable!("ran twice") as Result<StoredResponse, _> })
//!     .await?;
//! assert_eq!(retry, RunOutcome::Replayed(StoredResponse::new(201, "placed")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Never past the inner store's retention
//!
//! A cached record must never answer after the inner store would count it
//! absent (a retry then runs again there, and a reused key is claimed
//! afresh). Each entry therefore keeps a deadline no later than the inner
//! record's retention, judged as the inner store judges it
//! ([`Capabilities::clock`]):
//!
//! - **After `complete`.** The inner store retains the record for the
//!   lease's retention from the moment it completes it, which is after this
//!   cache sent the completion. The deadline is the retention counted from
//!   *before* the call: for a server-clock store (Postgres, Redis) on this
//!   process's monotonic clock, for a caller-clock store (memory, DynamoDB)
//!   on the store's own clock ([`IdempotencyStore::now`]), read before the
//!   call. A completion delivered again (after a lost reply, or twice)
//!   counts from the first delivery this cache saw, and a second successful
//!   delivery caches nothing new, since the record was retained from the
//!   first.
//! - **After a `Completed` claim.** A claim's answer does not say how long
//!   the record is kept, so the cache reads the record
//!   ([`get`](IdempotencyStore::get)) and the store's clock
//!   ([`now`](IdempotencyStore::now)) together, once per key: the remaining
//!   retention is `retained_until - now`, by the store's own clock, and is
//!   counted from before both requests were sent. (For a server-clock store
//!   that costs one more round trip, on the first replay a process sees.)
//! - **On every hit**, the deadline is checked: on the monotonic clock for a
//!   server-clock store, on the store's clock for a caller-clock store (no
//!   I/O: its clock is this process's), so a test's
//!   [`ManualClock`](idem_core::ManualClock) that jumps past retention
//!   empties the cache too. moka's per-entry expiry removes entries at the
//!   same deadline.
//!
//! The clocks are assumed to run at the same rate (the lease margin already
//! assumes that); their offsets do not matter, as no time is carried from
//! one clock to another.
//!
//! # Deleting in a fleet
//!
//! [`delete`](IdempotencyStore::delete) through this cache evicts the record
//! here, but a cache in another process keeps answering until its entry's
//! deadline. Where operators delete records, bound that with
//! [`CacheOptions::time_to_live`].
//!
//! # Observability
//!
//! With the `metrics` feature, every claim counts as a hit
//! (`idem_cache_hits_total`) or a miss (`idem_cache_misses_total`), labelled
//! with the inner store's name; see [`idem_core::observability`].
#![doc = include_str!("../GUIDE.md")]

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use idem_core::observability::record_cache_lookup;
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, ClockSource, ExpireAfter, IdempotencyStore, Lease,
    OwnerToken, Record, Timestamp,
};
use idem_core::{
    Checkpoint, Fingerprint, InvalidInput, Scope, StoreError, StoredResponse, async_trait,
};
use moka::sync::Cache;

/// The default [`CacheOptions::max_entries`]: 100,000 records.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;
/// The default [`CacheOptions::max_bytes`]: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// What an entry weighs beyond its response: the scope's text, the
/// fingerprint, the deadline and moka's own bookkeeping, roughly.
const ENTRY_OVERHEAD: u64 = 160;

/// How a [`CachedStore`] is bounded.
///
/// ```
/// use std::time::Duration;
/// use idem_cache::CacheOptions;
///
/// let options = CacheOptions::default()
///     .max_entries(10_000)
///     .max_bytes(16 << 20)
///     .time_to_live(Duration::from_secs(300));
/// assert!(options.validate().is_ok());
/// assert!(CacheOptions::default().max_entries(0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheOptions {
    max_entries: u64,
    max_bytes: u64,
    time_to_live: Option<Duration>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
            time_to_live: None,
        }
    }
}

impl CacheOptions {
    /// The most records kept (default 100,000).
    #[must_use]
    pub fn max_entries(mut self, max: u64) -> Self {
        self.max_entries = max;
        self
    }

    /// The most bytes kept, counting each response's
    /// [`size`](StoredResponse::size) and its scope (default 64 MiB). A
    /// response larger than this is never cached.
    #[must_use]
    pub fn max_bytes(mut self, max: u64) -> Self {
        self.max_bytes = max;
        self
    }

    /// Keeps no record longer than `ttl`, even within its retention (default:
    /// until retention). Bounds how long a record deleted through another
    /// process's cache is still answered here.
    #[must_use]
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.time_to_live = Some(ttl);
        self
    }

    /// Checks the options, as [`CachedStore::with_options`] does.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] for zero entries, zero bytes or a zero
    /// time to live.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let zero = |field| InvalidInput::OutOfRange {
            field,
            reason: "must be more than zero",
        };
        if self.max_entries == 0 {
            return Err(zero("cache max_entries"));
        }
        if self.max_bytes == 0 {
            return Err(zero("cache max_bytes"));
        }
        if self.time_to_live.is_some_and(|ttl| ttl.is_zero()) {
            return Err(zero("cache time_to_live"));
        }
        Ok(())
    }
}

/// When a cached record stops answering, by the clock that judges the inner
/// store's records.
#[derive(Debug, Clone, Copy)]
enum Deadline {
    /// A server-clock store: this process's monotonic clock.
    Local(Instant),
    /// A caller-clock store: the store's own clock.
    Store(Timestamp),
}

/// A moment just before a request, as both clocks read it.
#[derive(Debug, Clone, Copy)]
struct Moment {
    at: Instant,
    /// The store's clock, for caller-clock stores.
    store: Option<Timestamp>,
}

/// A completed record, as much of it as a claim needs.
#[derive(Debug)]
struct Replay {
    fingerprint: Fingerprint,
    response: StoredResponse,
    deadline: Deadline,
    /// When moka drops it: the deadline, on the monotonic clock.
    evict_at: Instant,
}

/// A claim made through the cache and not yet completed: what its
/// completion needs to be cached.
#[derive(Debug)]
struct Pending {
    fingerprint: Fingerprint,
    /// Before the first completion this cache sent for the lease.
    first_completion: OnceLock<Moment>,
    evict_at: Instant,
}

/// A replay cache in front of the store `S`; see the [crate docs](crate).
/// Cloning is cheap and shares the cache.
pub struct CachedStore<S: ?Sized> {
    replays: Cache<Scope, Arc<Replay>>,
    pending: Cache<OwnerToken, Arc<Pending>>,
    /// Moves before and after every delete, so a replay cached while a
    /// delete ran is dropped again.
    deletes: Arc<AtomicU64>,
    options: CacheOptions,
    /// Whose clock judges the inner store's records.
    clock: ClockSource,
    /// The inner store's name, for metrics.
    store: &'static str,
    inner: Arc<S>,
}

impl<S: ?Sized> Clone for CachedStore<S> {
    fn clone(&self) -> Self {
        Self {
            replays: self.replays.clone(),
            pending: self.pending.clone(),
            deletes: Arc::clone(&self.deletes),
            options: self.options.clone(),
            clock: self.clock,
            store: self.store,
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: fmt::Debug + ?Sized> fmt::Debug for CachedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStore")
            .field("inner", &self.inner)
            .field("options", &self.options)
            .field("replays", &self.replays.entry_count())
            .finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore + ?Sized> CachedStore<S> {
    /// A cache with the default bounds in front of `inner`.
    pub fn new(inner: Arc<S>) -> Self {
        Self::build(inner, CacheOptions::default())
    }

    /// A cache bounded by `options` in front of `inner`.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] as [`CacheOptions::validate`] says.
    pub fn with_options(inner: Arc<S>, options: CacheOptions) -> Result<Self, StoreError> {
        options.validate()?;
        Ok(Self::build(inner, options))
    }

    fn build(inner: Arc<S>, options: CacheOptions) -> Self {
        // One weight bounds both: every entry weighs at least a slot's share
        // of the bytes, so no more than `max_entries` fit, and at least its
        // own bytes, so no more than `max_bytes` do.
        let slot = options.max_bytes.div_ceil(options.max_entries);
        let replays = Cache::builder()
            .max_capacity(options.max_bytes)
            .weigher(move |scope: &Scope, replay: &Arc<Replay>| {
                u32::try_from(weight(scope, &replay.response).max(slot)).unwrap_or(u32::MAX)
            })
            .expire_after(ExpireAfter::new(|replay: &Arc<Replay>| {
                replay.evict_at.saturating_duration_since(Instant::now())
            }))
            .build();
        let pending = Cache::builder()
            .max_capacity(options.max_entries)
            .expire_after(ExpireAfter::new(|pending: &Arc<Pending>| {
                pending.evict_at.saturating_duration_since(Instant::now())
            }))
            .build();
        let capabilities = inner.capabilities();
        Self {
            replays,
            pending,
            deletes: Arc::new(AtomicU64::new(0)),
            options,
            clock: capabilities.clock,
            store: capabilities.store,
            inner,
        }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// How many completed records are cached (moka's count, which lags
    /// insertions and evictions slightly).
    pub fn cached_records(&self) -> u64 {
        self.replays.run_pending_tasks();
        self.replays.entry_count()
    }

    /// Now, by the monotonic clock and (for a caller-clock store) the
    /// store's; `None` if the store's clock cannot be read.
    async fn moment(&self, scope: &Scope) -> Option<Moment> {
        let at = Instant::now();
        let store = match self.clock {
            ClockSource::Server => None,
            _ => Some(self.inner.now(scope).await.ok()?),
        };
        Some(Moment { at, store })
    }

    /// The deadline `left` after `from`, capped by the time to live.
    fn deadline(&self, from: Moment, left: Duration) -> (Deadline, Instant) {
        let left = self.options.time_to_live.map_or(left, |ttl| left.min(ttl));
        let evict_at = from.at + left;
        let deadline = match from.store {
            Some(store) => Deadline::Store(store + left),
            None => Deadline::Local(evict_at),
        };
        (deadline, evict_at)
    }

    /// Whether `replay` may still answer for `scope`.
    async fn still_retained(&self, replay: &Replay, scope: &Scope) -> bool {
        match replay.deadline {
            Deadline::Local(until) => Instant::now() < until,
            Deadline::Store(until) => matches!(self.inner.now(scope).await, Ok(now) if now < until),
        }
    }

    /// Caches `replay` for `scope`, unless a delete ran since `deletes`
    /// was read (the record may be gone from the inner store).
    fn keep(&self, scope: &Scope, replay: Replay, deletes: u64) {
        if weight(scope, &replay.response) > self.options.max_bytes {
            return;
        }
        self.replays.insert(scope.clone(), Arc::new(replay));
        if self.deletes.load(Ordering::SeqCst) != deletes {
            self.replays.invalidate(scope);
        }
    }

    /// Caches the record a claim found completed with `response`, once the
    /// store says how long it keeps it.
    async fn fill(&self, request: &ClaimRequest, response: &StoredResponse, deletes: u64) {
        let scope = request.scope();
        let at = Instant::now();
        let (record, now) = tokio::join!(self.inner.get(scope), self.inner.now(scope));
        let (record, now) = match (record, now) {
            (Ok(Some(record)), Ok(now)) => (record, now),
            (Ok(None), _) => return,
            (Err(error), _) | (_, Err(error)) => {
                tracing::debug!(%error, "replay cache: cannot read the record's retention");
                return;
            }
        };
        if !same_completion(&record, request.fingerprint(), response) {
            return;
        }
        let store = (self.clock != ClockSource::Server).then_some(now);
        let left = record.retained_until().saturating_duration_since(now);
        let (deadline, evict_at) = self.deadline(Moment { at, store }, left);
        let replay = Replay {
            fingerprint: request.fingerprint(),
            response: response.clone(),
            deadline,
            evict_at,
        };
        self.keep(scope, replay, deletes);
    }
}

/// Whether `record` is the completion a claim just replayed.
fn same_completion(record: &Record, fingerprint: Fingerprint, response: &StoredResponse) -> bool {
    record.fingerprint() == fingerprint && record.response() == Some(response)
}

/// What a cached response weighs, in bytes.
fn weight(scope: &Scope, response: &StoredResponse) -> u64 {
    let scope_bytes = scope.tenant().as_str().len() + scope.key().as_str().len();
    u64::try_from(response.size() + scope_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(ENTRY_OVERHEAD)
}

#[async_trait]
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for CachedStore<S> {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let scope = request.scope();
        if let Some(replay) = self.replays.get(scope) {
            if self.still_retained(&replay, scope).await {
                record_cache_lookup(self.store, true);
                return Ok(if replay.fingerprint == request.fingerprint() {
                    ClaimOutcome::Completed(replay.response.clone())
                } else {
                    ClaimOutcome::Mismatch
                });
            }
            self.replays.invalidate(scope);
        }
        record_cache_lookup(self.store, false);
        let deletes = self.deletes.load(Ordering::SeqCst);
        let outcome = self.inner.claim(request).await?;
        match &outcome {
            ClaimOutcome::Claimed { lease, .. } => {
                let pending = Pending {
                    fingerprint: request.fingerprint(),
                    first_completion: OnceLock::new(),
                    evict_at: Instant::now() + request.claim_retention(),
                };
                // A claim delivered again keeps the first completion's moment.
                self.pending
                    .entry(lease.owner())
                    .or_insert_with(|| Arc::new(pending));
            }
            ClaimOutcome::Completed(response) => self.fill(request, response, deletes).await,
            ClaimOutcome::InProgress { .. } | ClaimOutcome::Mismatch => {}
        }
        Ok(outcome)
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        let pending = self.pending.get(&lease.owner());
        let first = match &pending {
            Some(pending) => self
                .moment(lease.scope())
                .await
                .map(|now| *pending.first_completion.get_or_init(|| now)),
            None => None,
        };
        let deletes = self.deletes.load(Ordering::SeqCst);
        let result = self.inner.complete(lease, response).await;
        match &result {
            Ok(()) => {
                // Taken out first: a second successful delivery caches nothing.
                self.pending.invalidate(&lease.owner());
                if let (Some(pending), Some(first)) = (pending, first) {
                    let (deadline, evict_at) = self.deadline(first, lease.retention());
                    let replay = Replay {
                        fingerprint: pending.fingerprint,
                        response: response.clone(),
                        deadline,
                        evict_at,
                    };
                    self.keep(lease.scope(), replay, deletes);
                }
            }
            Err(StoreError::LostLease) => self.pending.invalidate(&lease.owner()),
            Err(_) => {}
        }
        result
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        self.inner.renew(lease, extend).await
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.inner.release(lease).await?;
        self.pending.invalidate(&lease.owner());
        Ok(())
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.inner.checkpoint(lease, checkpoint).await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.inner.get(scope).await
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        self.inner.purge_expired().await
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.replays.invalidate(scope);
        let deleted = self.inner.delete(scope).await;
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.replays.invalidate(scope);
        deleted
    }

    async fn now(&self, scope: &Scope) -> Result<Timestamp, StoreError> {
        self.inner.now(scope).await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
