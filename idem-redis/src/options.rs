//! How a [`RedisStore`](crate::RedisStore) is set up.

use std::time::Duration;

use idem_core::InvalidInput;
use idem_core::store::validate_operation_timeout;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idem";
/// The default [`Capabilities::max_response_bytes`](idem_core::store::Capabilities::max_response_bytes): 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;
/// The largest response limit accepted: a Redis string holds 512 MiB, and
/// the response travels as one script argument.
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 256 << 20;
/// The longest key prefix accepted, in bytes.
const MAX_PREFIX_BYTES: usize = 64;

/// How a [`RedisStore`](crate::RedisStore) is set up.
///
/// The setters never fail: [`RedisStore::with_options`](crate::RedisStore::with_options)
/// checks the whole set once, and refuses an invalid one with
/// [`StoreError::InvalidInput`](idem_core::StoreError::InvalidInput).
///
/// ```
/// use std::time::Duration;
/// use idem_redis::RedisOptions;
///
/// let options = RedisOptions::default()
///     .prefix("billing-idem")
///     .max_response_bytes(1 << 20)
///     .operation_timeout(Duration::from_secs(1));
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) max_response_bytes: usize,
    pub(crate) accept_eviction_risk: bool,
    pub(crate) accept_volatility: bool,
    pub(crate) operation_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            accept_eviction_risk: false,
            accept_volatility: false,
            operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
        }
    }
}

impl RedisOptions {
    /// The default [`operation_timeout`](Self::operation_timeout): 5 s, as
    /// the other networked stores.
    ///
    /// redis-rs already bounds each round trip (its response timeout, 500 ms
    /// by default); this bounds the whole operation, the driver's reconnects,
    /// cluster redirects and retries included. A healthy operation takes
    /// milliseconds; 5 s leaves room for a retried round trip or a failover,
    /// yet fails a stalled call long before HTTP clients and load balancers
    /// give up on the request (30 to 60 s).
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

    /// Sets the prefix of every key (default [`DEFAULT_PREFIX`]): 1 to 64
    /// bytes, no braces, colons or control characters.
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// Sets the largest response accepted (default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`], at most [`MAX_RESPONSE_BYTES_LIMIT`]).
    #[must_use]
    pub fn max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
        self
    }

    /// Runs on a server whose `maxmemory-policy` may evict records.
    ///
    /// An evicted record is a forgotten key: the next retry runs the work a
    /// second time. Only for caches of idempotency, never for guarantees.
    #[must_use]
    pub fn accept_eviction_risk(mut self) -> Self {
        self.accept_eviction_risk = true;
        self
    }

    /// Runs on a server that keeps no append-only file (`appendonly no`).
    ///
    /// Such a server loses the records written since its last snapshot (all
    /// of them, with `save ""`) when it restarts, and every retry of a lost
    /// key then runs the work again. For tests, caches and services that
    /// accept that; otherwise set `appendonly yes` (with `appendfsync
    /// always` or `everysec`).
    #[must_use]
    pub fn accept_volatility(mut self) -> Self {
        self.accept_volatility = true;
        self
    }

    /// Sets the time limit of each operation (default
    /// [`DEFAULT_OPERATION_TIMEOUT`](Self::DEFAULT_OPERATION_TIMEOUT), 5 s;
    /// more than zero; [`Duration::MAX`] for none).
    ///
    /// It bounds every [`IdempotencyStore`](idem_core::store::IdempotencyStore)
    /// operation as a whole, whatever the driver does inside it: its
    /// round trips (a script the server lacks costs a second one), the
    /// [`ConnectionManager`](redis::aio::ConnectionManager)'s reconnects, the
    /// cluster client's redirects and retries. It also bounds each of the two
    /// `CONFIG GET` reads of [`RedisStore::with_options`](crate::RedisStore::with_options).
    /// Past it the operation ends in
    /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable),
    /// "timed out": it may or may not have happened, and a retry with the
    /// same request or lease gets the true answer.
    ///
    /// The driver's own limits apply inside it, and the shorter fires first,
    /// both as `Unavailable`: redis-rs's response timeout
    /// (`ConnectionManagerConfig::set_response_timeout`,
    /// `ClusterClientBuilder::response_timeout`; 500 ms by default) bounds
    /// each round trip, so with the defaults a stalled reply fails the
    /// operation at 500 ms, and the store's limit catches what the driver's
    /// does not (no response timeout, reconnect back-off, retries). With the
    /// driver's response timeout above this limit, or none, the store's
    /// fires first.
    #[must_use]
    pub fn operation_timeout(mut self, limit: Duration) -> Self {
        self.operation_timeout = limit;
        self
    }

    /// Checks every option against its rule.
    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        validate_operation_timeout(self.operation_timeout)?;
        let field = "key prefix";
        let prefix = self.prefix.as_str();
        if prefix.is_empty() {
            return Err(InvalidInput::Empty { field });
        }
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(InvalidInput::TooLong {
                field,
                len: prefix.len(),
                max: MAX_PREFIX_BYTES,
            });
        }
        if let Some(position) = prefix.find(|c: char| c.is_control()) {
            return Err(InvalidInput::ControlCharacter { field, position });
        }
        if prefix.contains(['{', '}', ':']) {
            return Err(InvalidInput::Malformed {
                field,
                reason: "must not contain '{', '}' or ':'".into(),
            });
        }
        if self.max_response_bytes > MAX_RESPONSE_BYTES_LIMIT {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "Redis strings hold 512 MiB; the limit is 256 MiB",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_are_valid() {
        assert_eq!(RedisOptions::default().validate(), Ok(()));
        let options = RedisOptions::default()
            .prefix("billing-idem")
            .max_response_bytes(MAX_RESPONSE_BYTES_LIMIT)
            .accept_eviction_risk();
        assert_eq!(options.validate(), Ok(()));
    }

    #[test]
    fn prefixes_that_could_break_the_key_format_are_refused() {
        let check = |prefix: &str| RedisOptions::default().prefix(prefix).validate();
        assert_eq!(
            check(""),
            Err(InvalidInput::Empty {
                field: "key prefix"
            })
        );
        assert!(matches!(
            check(&"p".repeat(MAX_PREFIX_BYTES + 1)),
            Err(InvalidInput::TooLong { max: 64, .. })
        ));
        assert_eq!(check(&"p".repeat(MAX_PREFIX_BYTES)), Ok(()));
        assert!(matches!(
            check("a\nb"),
            Err(InvalidInput::ControlCharacter { position: 1, .. })
        ));
        for bad in ["bad{prefix}", "a}", "a:b"] {
            assert!(
                matches!(check(bad), Err(InvalidInput::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn response_limits_over_256_mib_are_refused() {
        let over = RedisOptions::default().max_response_bytes(MAX_RESPONSE_BYTES_LIMIT + 1);
        assert!(matches!(
            over.validate(),
            Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                ..
            })
        ));
    }
}
