//! How a [`RedisStore`](crate::RedisStore) is set up.

use idem_core::store::validate_name;
use idem_core::{InvalidInput, StoreOptions};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idem";
/// The default key prefix of a [`RedisJournal`](crate::RedisJournal).
pub const DEFAULT_JOURNAL_PREFIX: &str = "idem-journal";
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
/// The [operation timeout](StoreOptions::with_operation_timeout) bounds each
/// operation as a whole, whatever the driver does inside it: its round trips
/// (a script the server lacks costs a second one), the
/// [`ConnectionManager`](redis::aio::ConnectionManager)'s reconnects, the
/// cluster client's redirects and retries; and each of the two `CONFIG GET`
/// reads of [`RedisStore::with_options`](crate::RedisStore::with_options).
/// redis-rs's response timeout (`ConnectionManagerConfig::set_response_timeout`,
/// `ClusterClientBuilder::response_timeout`; 500 ms by default) bounds each
/// round trip inside it, and the shorter fires first, both as `Unavailable`:
/// with the defaults a stalled reply fails the operation at 500 ms, and the
/// store's limit catches what the driver's does not (no response timeout,
/// reconnect back-off, retries).
///
/// ```
/// use std::time::Duration;
/// use idem_core::StoreOptions;
/// use idem_redis::RedisOptions;
///
/// let options = RedisOptions::default().prefix("billing-idem").store_options(
///     StoreOptions::default()
///         .with_max_response_bytes(1 << 20)
///         .with_operation_timeout(Duration::from_secs(1)),
/// );
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) accept_eviction_risk: bool,
    pub(crate) accept_volatility: bool,
    pub(crate) store: StoreOptions,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            accept_eviction_risk: false,
            accept_volatility: false,
            store: StoreOptions::default(),
        }
    }
}

impl RedisOptions {
    /// Sets the prefix of every key (default [`DEFAULT_PREFIX`]): 1 to 64
    /// bytes, no braces, colons or control characters.
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
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

    /// The operation timeout and the response limit (default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`], at most [`MAX_RESPONSE_BYTES_LIMIT`]).
    #[must_use]
    pub fn store_options(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Checks every option against its rule; the response limit.
    pub(crate) fn validate(&self) -> Result<usize, InvalidInput> {
        let max_response_bytes = self.store.checked(
            DEFAULT_MAX_RESPONSE_BYTES,
            MAX_RESPONSE_BYTES_LIMIT,
            "Redis strings hold 512 MiB; the limit is 256 MiB",
        )?;
        validate_prefix(&self.prefix)?;
        Ok(max_response_bytes)
    }
}

/// Checks a key prefix: 1 to 64 bytes, no braces (which would move the hash
/// tag), colons (which separate a key's parts) or control characters.
fn validate_prefix(prefix: &str) -> Result<(), InvalidInput> {
    validate_name(
        "key prefix",
        prefix,
        MAX_PREFIX_BYTES,
        |c| !matches!(c, '{' | '}' | ':'),
        "must not contain '{', '}' or ':'",
    )
}

/// How a [`RedisJournal`](crate::RedisJournal) is set up.
///
/// The setters never fail: [`RedisJournal::with_options`](crate::RedisJournal::with_options)
/// checks the whole set once, and refuses an invalid one with
/// [`StoreError::InvalidInput`](idem_core::StoreError::InvalidInput).
///
/// The [operation timeout](StoreOptions::with_operation_timeout) bounds each
/// journal operation as a whole, as [`RedisOptions`] says of the store's.
/// The journal keeps no responses: a response limit set in the store options
/// is only checked to be at least 1.
///
/// ```
/// use std::time::Duration;
/// use idem_core::StoreOptions;
/// use idem_redis::RedisJournalOptions;
///
/// let options = RedisJournalOptions::default()
///     .prefix("billing-journal")
///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(1)));
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisJournalOptions {
    pub(crate) prefix: String,
    pub(crate) store: StoreOptions,
}

impl Default for RedisJournalOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_JOURNAL_PREFIX.to_string(),
            store: StoreOptions::default(),
        }
    }
}

impl RedisJournalOptions {
    /// Sets the prefix of every key (default [`DEFAULT_JOURNAL_PREFIX`]): 1
    /// to 64 bytes, no braces, colons or control characters.
    #[must_use]
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_string();
        self
    }

    /// The operation timeout (default 5 s, more than zero).
    #[must_use]
    pub fn store_options(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// Checks every option against its rule.
    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
        // One check of the shared options for every store; no ceiling on
        // responses, which a journal never stores.
        self.store
            .checked(usize::MAX, usize::MAX, "a journal keeps no responses")?;
        validate_prefix(&self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_are_valid() {
        assert_eq!(
            RedisOptions::default().validate(),
            Ok(DEFAULT_MAX_RESPONSE_BYTES)
        );
        let options = RedisOptions::default()
            .prefix("billing-idem")
            .store_options(
                StoreOptions::default().with_max_response_bytes(MAX_RESPONSE_BYTES_LIMIT),
            )
            .accept_eviction_risk();
        assert_eq!(options.validate(), Ok(MAX_RESPONSE_BYTES_LIMIT));
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
        assert!(check(&"p".repeat(MAX_PREFIX_BYTES)).is_ok());
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
    fn journal_options_check_the_prefix_and_the_timeout() {
        assert_eq!(RedisJournalOptions::default().validate(), Ok(()));
        for bad in ["", "a:b", "a{b"] {
            assert!(
                RedisJournalOptions::default()
                    .prefix(bad)
                    .validate()
                    .is_err(),
                "{bad:?}"
            );
        }
        let zero = StoreOptions::default().with_operation_timeout(std::time::Duration::ZERO);
        assert!(matches!(
            RedisJournalOptions::default()
                .store_options(zero)
                .validate(),
            Err(InvalidInput::OutOfRange {
                field: "operation timeout",
                ..
            })
        ));
    }

    #[test]
    fn response_limits_over_256_mib_are_refused() {
        let over = RedisOptions::default().store_options(
            StoreOptions::default().with_max_response_bytes(MAX_RESPONSE_BYTES_LIMIT + 1),
        );
        assert!(matches!(
            over.validate(),
            Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                ..
            })
        ));
    }
}
