//! How a [`RedisStore`](crate::RedisStore) is set up.

use idem_core::InvalidInput;

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
/// use idem_redis::RedisOptions;
///
/// let options = RedisOptions::default()
///     .prefix("billing-idem")
///     .max_response_bytes(1 << 20);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) max_response_bytes: usize,
    pub(crate) accept_eviction_risk: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            accept_eviction_risk: false,
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

    /// Checks every option against its rule.
    pub(crate) fn validate(&self) -> Result<(), InvalidInput> {
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
