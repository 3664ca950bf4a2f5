//! What every networked store's options share, and the one check of a name
//! that stores splice into keys, tables and prefixes.

use crate::plumbing::error::InvalidInput;
use std::time::Duration;

/// The settings every networked store shares: the time limit of each
/// operation and the largest response it accepts. Each backend's options
/// embed one (`PostgresOptions::store_options`, `RedisOptions::store_options`,
/// `DynamoOptions::store_options`) and its `with_options` checks it against
/// the backend's own ceiling.
///
/// ```
/// use std::time::Duration;
/// use idem_core::StoreOptions;
///
/// let shared = StoreOptions::default()
///     .with_operation_timeout(Duration::from_secs(2))
///     .with_max_response_bytes(1 << 20);
/// assert_eq!(shared.operation_timeout(), Duration::from_secs(2));
/// assert_eq!(shared.max_response_bytes(), Some(1 << 20));
/// assert_eq!(StoreOptions::default().max_response_bytes(), None); // the backend's default
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreOptions {
    operation_timeout: Duration,
    max_response_bytes: Option<usize>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
            max_response_bytes: None,
        }
    }
}

impl StoreOptions {
    /// The default [operation timeout](Self::with_operation_timeout): 5 s.
    ///
    /// A healthy operation takes milliseconds, and a busy one (waiting for a
    /// pooled connection, a row lock, a driver's retry or a failover) well
    /// under a second or two; 5 s never cuts those short, yet fails a stalled
    /// call long before HTTP clients and load balancers give up on the
    /// request (30 to 60 s).
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

    /// Bounds each store operation as a whole (default
    /// [`DEFAULT_OPERATION_TIMEOUT`](Self::DEFAULT_OPERATION_TIMEOUT); more
    /// than zero; [`Duration::MAX`] for none): whatever the driver does
    /// inside it (acquiring a connection, reconnecting, redirects, its own
    /// retries). Past it the operation ends in
    /// [`StoreError::Unavailable`](crate::StoreError::Unavailable), "timed
    /// out": it may or may not have happened, and a retry with the same
    /// request or lease gets the true answer. The driver's own limits still
    /// apply inside it, and the shorter fires first; each backend's options
    /// say which those are.
    #[must_use]
    pub fn with_operation_timeout(mut self, limit: Duration) -> Self {
        self.operation_timeout = limit;
        self
    }

    /// The largest response accepted, as
    /// [`StoredResponse::size`](crate::StoredResponse::size) counts it
    /// (default: the backend's, up to the backend's ceiling).
    #[must_use]
    pub fn with_max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = Some(max);
        self
    }

    /// The operation timeout.
    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// The response limit, if one was set.
    pub fn max_response_bytes(&self) -> Option<usize> {
        self.max_response_bytes
    }

    /// For store authors: checks the options against a backend's rules and
    /// gives the response limit to use (`default` unless one was set).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    ///
    /// let limit = StoreOptions::default().checked(8 << 20, 512 << 20, "bytea holds 1 GiB");
    /// assert_eq!(limit, Ok(8 << 20));
    /// assert!(StoreOptions::default().with_max_response_bytes(0).checked(1, 2, "").is_err());
    /// assert!(StoreOptions::default().with_max_response_bytes(3).checked(1, 2, "").is_err());
    /// assert!(StoreOptions::default().with_operation_timeout(Duration::ZERO).checked(1, 2, "").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] for a zero timeout, or a response limit
    /// of zero or over `ceiling` (`why` says where the ceiling comes from).
    pub fn checked(
        &self,
        default: usize,
        ceiling: usize,
        why: &'static str,
    ) -> Result<usize, InvalidInput> {
        if self.operation_timeout.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "operation timeout",
                reason: "must be more than zero",
            });
        }
        let max = self.max_response_bytes.unwrap_or(default);
        if max == 0 {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "must be at least 1",
            });
        }
        if max > ceiling {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: why,
            });
        }
        Ok(max)
    }
}

/// Checks a name: not empty, at most `max_bytes` of UTF-8, no control
/// character, and every character `allowed` (else
/// [`InvalidInput::Malformed`] with `rule` as the reason). The one check of
/// tenants, keys, checkpoint names, and every name a store splices into its
/// keys or SQL (a key prefix, a table).
///
/// ```
/// use idem_core::InvalidInput;
/// use idem_core::store::validate_name;
///
/// let no_colon = |c: char| c != ':';
/// assert!(validate_name("prefix", "billing", 64, no_colon, "no ':'").is_ok());
/// assert_eq!(
///     validate_name("prefix", "", 64, no_colon, "no ':'"),
///     Err(InvalidInput::Empty { field: "prefix" })
/// );
/// assert!(matches!(
///     validate_name("prefix", "a:b", 64, no_colon, "no ':'"),
///     Err(InvalidInput::Malformed { .. })
/// ));
/// ```
///
/// # Errors
///
/// [`InvalidInput`] naming `field` and the first rule broken.
pub fn validate_name(
    field: &'static str,
    value: &str,
    max_bytes: usize,
    allowed: impl Fn(char) -> bool,
    rule: &'static str,
) -> Result<(), InvalidInput> {
    if value.is_empty() {
        return Err(InvalidInput::Empty { field });
    }
    if value.len() > max_bytes {
        return Err(InvalidInput::TooLong {
            field,
            len: value.len(),
            max: max_bytes,
        });
    }
    if let Some((position, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidInput::ControlCharacter { field, position });
    }
    if !value.chars().all(allowed) {
        return Err(InvalidInput::Malformed {
            field,
            reason: rule.into(),
        });
    }
    Ok(())
}
