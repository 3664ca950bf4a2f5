//! The one moka expiry of the in-process stores (`idem-memory`) and caches
//! (`idem-cache`): each entry lives as long as its value says.

use std::time::{Duration, Instant};

/// A [moka `Expiry`](moka::Expiry) that asks each value, whenever moka
/// stores it, how long it has left: a record until its retention by the
/// store's clock, a cached replay until its deadline. With the `moka`
/// feature.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::ExpireAfter;
/// use moka::sync::Cache;
///
/// let cache: Cache<&str, Duration> = Cache::builder()
///     .expire_after(ExpireAfter::new(|ttl: &Duration| *ttl))
///     .build();
/// cache.insert("brief", Duration::ZERO);
/// cache.insert("kept", Duration::from_secs(60));
/// assert_eq!(cache.get("brief"), None);
/// assert_eq!(cache.get("kept"), Some(Duration::from_secs(60)));
/// ```
pub struct ExpireAfter<F> {
    remaining: F,
}

impl<F> ExpireAfter<F> {
    /// The expiry giving each value `remaining(value)` from the moment moka
    /// stores it.
    pub fn new(remaining: F) -> Self {
        Self { remaining }
    }
}

impl<K, V, F> moka::Expiry<K, V> for ExpireAfter<F>
where
    F: Fn(&V) -> Duration,
{
    fn expire_after_create(&self, _: &K, value: &V, _: Instant) -> Option<Duration> {
        Some((self.remaining)(value))
    }

    fn expire_after_update(
        &self,
        _: &K,
        value: &V,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some((self.remaining)(value))
    }
}
