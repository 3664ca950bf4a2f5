//! The store's settings: table, response limit and clock, validated once by
//! [`DynamoStore::with_options`](crate::DynamoStore::with_options).

use std::sync::Arc;
use std::time::Duration;

use idem_core::InvalidInput;
use idem_core::store::{Clock, SystemClock, validate_operation_timeout};

/// DynamoDB's item size limit, in bytes.
pub const ITEM_LIMIT: usize = 400 * 1024;

/// What a completed item holds besides the response, at most: key, tenant and
/// key attributes (up to 255 bytes each, twice), fingerprint, owner, numbers
/// and attribute names, with room to spare.
pub(crate) const ITEM_OVERHEAD: usize = 2 * 1024;

/// The default largest response
/// ([`Capabilities::max_response_bytes`](idem_core::store::Capabilities)):
/// whatever an item leaves beside the record's own attributes.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = ITEM_LIMIT - ITEM_OVERHEAD;

/// The table [`DynamoStore::new`](crate::DynamoStore::new) uses.
pub const DEFAULT_TABLE: &str = "idem-records";

/// Settings of a [`DynamoStore`](crate::DynamoStore).
///
/// The setters never fail: [`DynamoStore::with_options`](crate::DynamoStore::with_options)
/// checks the whole set once.
///
/// ```
/// use std::time::Duration;
/// use idem_dynamo::DynamoOptions;
///
/// let options = DynamoOptions::default()
///     .table("orders-idempotency")
///     .max_response_bytes(64 * 1024)
///     .operation_timeout(Duration::from_secs(2));
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DynamoOptions {
    pub(crate) table: String,
    pub(crate) max_response_bytes: usize,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) operation_timeout: Duration,
}

impl Default for DynamoOptions {
    /// Table [`DEFAULT_TABLE`], limit [`DEFAULT_MAX_RESPONSE_BYTES`], the
    /// system clock, a 5 s operation timeout.
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_string(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            clock: Arc::new(SystemClock),
            operation_timeout: Self::DEFAULT_OPERATION_TIMEOUT,
        }
    }
}

impl DynamoOptions {
    /// The default [`operation_timeout`](Self::operation_timeout): 5 s.
    ///
    /// A healthy request takes milliseconds; 5 s leaves room for the SDK's
    /// own retries of a throttled or failed attempt (3 attempts with
    /// back-off by default), yet fails a stalled call long before HTTP
    /// clients and load balancers give up on the request (30 to 60 s). The
    /// SDK sets no operation timeout of its own by default.
    pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

    /// The table holding the records: 3 to 255 characters of `[A-Za-z0-9_.-]`.
    #[must_use]
    pub fn table(mut self, name: &str) -> Self {
        self.table = name.to_string();
        self
    }

    /// The largest response accepted, as
    /// [`StoredResponse::size`](idem_core::StoredResponse::size) counts it:
    /// 1 byte to [`DEFAULT_MAX_RESPONSE_BYTES`] (the default, what an item holds).
    #[must_use]
    pub fn max_response_bytes(mut self, max: usize) -> Self {
        self.max_response_bytes = max;
        self
    }

    /// The clock that judges leases and retention (DynamoDB has none to
    /// ask); tests inject a [`ManualClock`](idem_core::store::ManualClock).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The time limit of each operation (default
    /// [`DEFAULT_OPERATION_TIMEOUT`](Self::DEFAULT_OPERATION_TIMEOUT), 5 s;
    /// more than zero; [`Duration::MAX`] for none).
    ///
    /// It bounds every [`IdempotencyStore`](idem_core::store::IdempotencyStore)
    /// operation as a whole, the SDK's retries included (a claim or a renewal
    /// that takes two requests gets one limit; `purge_expired` gets one per
    /// request, each scan page and each delete), and the commit of a
    /// [`DynamoTransaction`](crate::DynamoTransaction); not
    /// [`create_table`](crate::DynamoStore::create_table), which waits for
    /// the table to become active. Past it the operation ends in
    /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable),
    /// "timed out": it may or may not have happened, and a retry with the
    /// same request or lease gets the true answer.
    ///
    /// The client's own limits apply inside it, and the shorter fires first,
    /// both as `Unavailable`: the SDK's `TimeoutConfig` (its
    /// `operation_timeout`, unset by default, bounds the same span as this;
    /// `operation_attempt_timeout`, unset by default, bounds each attempt, so
    /// set it below this limit for the SDK to retry a stalled attempt within
    /// it) and its `RetryConfig`.
    #[must_use]
    pub fn operation_timeout(mut self, limit: Duration) -> Self {
        self.operation_timeout = limit;
        self
    }

    /// Checks every setting against DynamoDB's rules.
    pub(crate) fn validate(self) -> Result<Self, InvalidInput> {
        validate_operation_timeout(self.operation_timeout)?;
        validate_table(&self.table)?;
        if self.max_response_bytes == 0 || self.max_response_bytes > DEFAULT_MAX_RESPONSE_BYTES {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "must be at least 1 byte and fit a 400 KB DynamoDB item beside the \
                         record's own attributes",
            });
        }
        Ok(self)
    }
}

/// DynamoDB's table name rules: 3 to 255 characters of `[A-Za-z0-9_.-]`.
fn validate_table(name: &str) -> Result<(), InvalidInput> {
    let field = "table name";
    if name.len() < 3 {
        return Err(InvalidInput::OutOfRange {
            field,
            reason: "DynamoDB table names are 3 to 255 characters",
        });
    }
    if name.len() > 255 {
        return Err(InvalidInput::TooLong {
            field,
            len: name.len(),
            max: 255,
        });
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(InvalidInput::Malformed {
            field,
            reason: format!("{name:?} holds a character outside [A-Za-z0-9_.-]"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_follow_dynamodb_rules() {
        assert!(validate_table(DEFAULT_TABLE).is_ok());
        assert!(validate_table("a.b_c-1").is_ok());
        assert!(validate_table("ab").is_err());
        assert!(validate_table("no spaces").is_err());
        assert!(validate_table(&"t".repeat(256)).is_err());
    }

    #[test]
    fn response_limit_must_fit_an_item() {
        let with = |max| DynamoOptions::default().max_response_bytes(max).validate();
        assert!(with(1).is_ok());
        assert!(with(DEFAULT_MAX_RESPONSE_BYTES).is_ok());
        assert!(with(0).is_err());
        assert!(with(DEFAULT_MAX_RESPONSE_BYTES + 1).is_err());
    }
}
