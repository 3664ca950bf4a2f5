//! How a memory record store is built: its clock and its response limit.
use std::sync::Arc;

use idem_core::store::{Clock, SystemClock};

/// The default [`Capabilities::max_response_bytes`](idem_core::store::Capabilities::max_response_bytes): 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1 << 20;

/// How a [`MemoryStore`](crate::MemoryStore) is built: its clock and its response limit.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{IdempotencyStore, Timestamp};
/// use idem_core::ManualClock;
/// use idem_memory::{MemoryOptions, MemoryStore};
///
/// let clock = ManualClock::new(Timestamp::from_unix_millis(0));
/// let store = MemoryStore::with_options(
///     MemoryOptions::default().clock(clock.clone()).max_response_bytes(64 * 1024),
/// )?;
/// clock.advance(Duration::from_secs(60)); // leases judged by this clock
/// assert_eq!(store.capabilities().max_response_bytes, 64 * 1024);
/// assert!(MemoryStore::with_options(MemoryOptions::default().max_response_bytes(0)).is_err());
/// # Ok::<(), idem_core::StoreError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemoryOptions {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_response_bytes: usize,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl MemoryOptions {
    /// Judges leases and retention by `clock` (default: the system clock).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The largest response accepted, as [`StoredResponse::size`](idem_core::StoredResponse::size) counts
    /// (default 1 MiB).
    #[must_use]
    pub fn max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
        self
    }
}
