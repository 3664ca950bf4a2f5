//! The stores' settings: table, response limit and clock, validated once by
//! [`DynamoStore::with_options`](crate::DynamoStore::with_options) and
//! [`DynamoJournal::with_options`](crate::DynamoJournal::with_options).

use std::sync::Arc;

use idem_core::store::{Clock, OperationLayer, validate_name};
use idem_core::{InvalidInput, StoreOptions};

use crate::clock::ServiceClock;
use crate::error::STORE;

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

/// What a store, its transactions and a journal work with, once checked.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) table: String,
    /// The clock that judges: the service's unless the options set another.
    pub(crate) clock: Arc<dyn Clock>,
    /// That clock, when it is the service's: synced before the first
    /// operation, and read by the client's interceptor.
    pub(crate) service: Option<ServiceClock>,
    pub(crate) max_response_bytes: usize,
    pub(crate) layer: OperationLayer,
    /// The outbox's partition count (1 for every other part).
    pub(crate) partitions: u32,
}

impl Settings {
    /// The defaults on `table`.
    pub(crate) fn on(table: &str, max_response_bytes: usize) -> Self {
        let service = ServiceClock::shared();
        Self {
            table: table.to_string(),
            clock: Arc::new(service.clone()),
            service: Some(service),
            max_response_bytes,
            layer: OperationLayer::new(STORE, StoreOptions::DEFAULT_OPERATION_TIMEOUT),
            partitions: 1,
        }
    }
}

/// The options of a DynamoDB part: its table (on `$default` unless set), its
/// clock and the shared [`StoreOptions`], whose response limit is checked
/// against `$limits` (default, ceiling, why); and the part's own settings,
/// each with its default and its check, carried into [`Settings`] under
/// the same name.
macro_rules! part_options {
    (
        $(#[$doc:meta])* $name:ident, $default:ident, $limits:expr, $table_doc:literal
        $(, $(#[$field_doc:meta])* $field:ident: $ty:ty = $init:expr, checked by $check:path)*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct $name {
            table: String,
            clock: Arc<dyn Clock>,
            service: Option<ServiceClock>,
            store: StoreOptions,
            $($field: $ty,)*
        }

        impl Default for $name {
            #[doc = concat!("Table [`", stringify!($default), "`], the service's clock ([`ServiceClock::shared`]), a 5 s operation timeout.")]
            fn default() -> Self {
                let service = ServiceClock::shared();
                Self {
                    table: $default.to_string(),
                    clock: Arc::new(service.clone()),
                    service: Some(service),
                    store: StoreOptions::default(),
                    $($field: $init,)*
                }
            }
        }

        impl $name {
            #[doc = concat!("The table: 3 to 255 characters of `[A-Za-z0-9_.-]`. ", $table_doc)]
            ///
            /// ```
            #[doc = concat!("let options = idem_dynamo::", stringify!($name), "::default().table(\"payments-idem\");")]
            /// # let _ = options;
            /// ```
            #[must_use]
            pub fn table(mut self, name: &str) -> Self {
                self.table = name.to_string();
                self
            }

            /// The caller's clock, instead of the service's, to judge
            /// leases and stamp every time of a record: callers' clocks
            /// must then agree within a small part of every lease (tests
            /// inject a [`ManualClock`](idem_core::ManualClock)).
            ///
            /// ```
            /// use idem_core::ManualClock;
            /// use idem_core::store::Timestamp;
            ///
            /// let clock = ManualClock::new(Timestamp::from_unix_millis(1_700_000_000_000));
            #[doc = concat!("let options = idem_dynamo::", stringify!($name), "::default().clock(clock.clone());")]
            /// # let _ = options;
            /// ```
            #[must_use]
            pub fn clock(mut self, clock: impl Clock) -> Self {
                self.clock = Arc::new(clock);
                self.service = None;
                self
            }

            /// The service's clock `clock` instead of the process's one
            /// ([`ServiceClock::shared`], the default): its reader is
            /// installed on the part's client.
            ///
            /// ```
            /// use idem_dynamo::ServiceClock;
            ///
            #[doc = concat!("let options = idem_dynamo::", stringify!($name), "::default().service_clock(ServiceClock::new());")]
            /// # let _ = options;
            /// ```
            #[must_use]
            pub fn service_clock(mut self, clock: ServiceClock) -> Self {
                self.clock = Arc::new(clock.clone());
                self.service = Some(clock);
                self
            }

            /// The operation timeout and the response limit (see the
            /// type's documentation for what each bounds here).
            ///
            /// ```
            /// use std::time::Duration;
            /// use idem_core::StoreOptions;
            ///
            #[doc = concat!("let options = idem_dynamo::", stringify!($name), "::default()")]
            ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(1)));
            /// # let _ = options;
            /// ```
            #[must_use]
            pub fn store_options(mut self, store: StoreOptions) -> Self {
                self.store = store;
                self
            }

            /// Checks every setting against DynamoDB's rules.
            pub(crate) fn validate(self) -> Result<Settings, InvalidInput> {
                let (default, ceiling, why) = $limits;
                let max_response_bytes = self.store.checked(default, ceiling, why)?;
                validate_table(&self.table)?;
                #[allow(unused_mut)] // parts without settings of their own
                let mut settings = Settings {
                    table: self.table,
                    clock: self.clock,
                    service: self.service,
                    max_response_bytes,
                    layer: OperationLayer::new(STORE, self.store.operation_timeout()),
                    partitions: 1,
                };
                $(settings.$field = $check(self.$field)?;)*
                Ok(settings)
            }

            $(
                $(#[$field_doc])*
                #[must_use]
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

part_options!(
    /// Settings of a [`DynamoStore`](crate::DynamoStore). Its response limit,
    /// as [`StoredResponse::size`](idem_core::StoredResponse::size) counts it,
    /// is 1 byte to [`DEFAULT_MAX_RESPONSE_BYTES`] (the default, what an item
    /// holds).
    ///
    /// The setters never fail: [`DynamoStore::with_options`](crate::DynamoStore::with_options)
    /// checks the whole set once.
    ///
    /// The [operation timeout](StoreOptions::with_operation_timeout) bounds each
    /// [`IdempotencyStore`](idem_core::store::IdempotencyStore) operation as a
    /// whole, the SDK's retries included (a claim or a renewal that takes two
    /// requests gets one limit; `purge_expired` gets one per request, each scan
    /// page and each delete), and the commit of a
    /// [`DynamoTransaction`](crate::DynamoTransaction); not
    /// [`create_table`](crate::DynamoStore::create_table), which waits for the
    /// table to become active. The SDK's own limits apply inside it, and the
    /// shorter fires first: its `TimeoutConfig` (`operation_timeout`, unset by
    /// default, bounds the same span; `operation_attempt_timeout`, unset by
    /// default, bounds each attempt, so set it below this limit for the SDK to
    /// retry a stalled attempt within it) and its `RetryConfig` (3 attempts with
    /// back-off by default).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    /// use idem_dynamo::DynamoOptions;
    ///
    /// let options = DynamoOptions::default().table("orders-idempotency").store_options(
    ///     StoreOptions::default()
    ///         .with_max_response_bytes(64 * 1024)
    ///         .with_operation_timeout(Duration::from_secs(2)),
    /// );
    /// # let _ = options;
    /// ```
    DynamoOptions,
    DEFAULT_TABLE,
    (
        DEFAULT_MAX_RESPONSE_BYTES,
        DEFAULT_MAX_RESPONSE_BYTES,
        "must fit a 400 KB DynamoDB item beside the record's own attributes",
    ),
    ""
);

/// The table [`DynamoJournal::new`](crate::DynamoJournal::new) uses.
///
/// ```
/// assert_eq!(idem_dynamo::DEFAULT_JOURNAL_TABLE, "idem-journal");
/// ```
pub const DEFAULT_JOURNAL_TABLE: &str = "idem-journal";

part_options!(
    /// Settings of a [`DynamoJournal`](crate::DynamoJournal): its table, its
    /// clock and its [operation timeout](StoreOptions::with_operation_timeout),
    /// in the shape of [`DynamoOptions`].
    ///
    /// The setters never fail: [`DynamoJournal::with_options`](crate::DynamoJournal::with_options)
    /// checks the whole set once.
    ///
    /// The operation timeout bounds each
    /// [`JournalStore`](idem_core::store::JournalStore) operation as a whole, the
    /// SDK's retries included, and every request of it (a `list` is a few); not
    /// [`create_table`](crate::DynamoJournal::create_table). The SDK's own limits
    /// apply inside it, as for [`DynamoOptions`]. A journal keeps no responses,
    /// so the response limit of [`StoreOptions`] is not used (it is still
    /// checked, as everywhere: a zero one is refused).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::{ManualClock, StoreOptions};
    /// use idem_core::store::Timestamp;
    /// use idem_dynamo::DynamoJournalOptions;
    ///
    /// let options = DynamoJournalOptions::default()
    ///     .table("payments-journal")
    ///     .clock(ManualClock::new(Timestamp::from_unix_millis(0)))
    ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(2)));
    /// # let _ = options;
    /// ```
    DynamoJournalOptions,
    DEFAULT_JOURNAL_TABLE,
    (ITEM_LIMIT, usize::MAX, "unused by a journal"),
    "It may be the records' table of a [`DynamoStore`](crate::DynamoStore) only if that table has the journal's index (see [`create_table`](crate::DynamoJournal::create_table)); a table of its own is simpler."
);

/// The table [`DynamoParking::new`](crate::DynamoParking::new) uses.
///
/// ```
/// assert_eq!(idem_dynamo::DEFAULT_PARKING_TABLE, "idem-parked");
/// ```
pub const DEFAULT_PARKING_TABLE: &str = "idem-parked";

part_options!(
    /// Settings of a [`DynamoParking`](crate::DynamoParking): its table, its
    /// clock (which stamps when an entry is parked and resolved) and its
    /// [operation timeout](StoreOptions::with_operation_timeout), in the shape
    /// of [`DynamoOptions`].
    ///
    /// The setters never fail: [`DynamoParking::with_options`](crate::DynamoParking::with_options)
    /// checks the whole set once.
    ///
    /// The operation timeout bounds each
    /// [`ParkingStore`](idem_core::store::ParkingStore) operation as a whole,
    /// the SDK's retries and every request of it included (a purge is a few);
    /// not [`create_table`](crate::DynamoParking::create_table). A parking
    /// store keeps no responses, so the response limit of [`StoreOptions`] is
    /// not used (it is still checked, as everywhere: a zero one is refused).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    /// use idem_dynamo::DynamoParkingOptions;
    ///
    /// let options = DynamoParkingOptions::default()
    ///     .table("shipping-parked")
    ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(2)));
    /// # let _ = options;
    /// ```
    DynamoParkingOptions,
    DEFAULT_PARKING_TABLE,
    (ITEM_LIMIT, usize::MAX, "unused by a parking store"),
    "A table of its own: its key and indexes are the parking store's (see [`create_table`](crate::DynamoParking::create_table))."
);

/// The table [`DynamoOutbox::new`](crate::DynamoOutbox::new) uses.
///
/// ```
/// assert_eq!(idem_dynamo::DEFAULT_OUTBOX_TABLE, "idem-outbox");
/// ```
pub const DEFAULT_OUTBOX_TABLE: &str = "idem-outbox";

part_options!(
    /// Settings of a [`DynamoOutbox`](crate::DynamoOutbox): its table, its
    /// clock (which judges leases and back-off and stamps every time of a
    /// message), its [operation timeout](StoreOptions::with_operation_timeout)
    /// and its partition count, in the shape of [`DynamoOptions`].
    ///
    /// The setters never fail: [`DynamoOutbox::with_options`](crate::DynamoOutbox::with_options)
    /// checks the whole set once.
    ///
    /// The operation timeout bounds each
    /// [`OutboxStore`](idem_core::store::OutboxStore) operation as a whole,
    /// every request of it and the SDK's retries included, and an
    /// [`enqueue_in`](crate::DynamoOutbox::enqueue_in)'s read; not
    /// [`create_table`](crate::DynamoOutbox::create_table). An outbox keeps
    /// no responses, so the response limit of [`StoreOptions`] is not used
    /// (it is still checked, as everywhere: a zero one is refused).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    /// use idem_dynamo::DynamoOutboxOptions;
    ///
    /// let options = DynamoOutboxOptions::default()
    ///     .table("orders-outbox")
    ///     .partitions(8)
    ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(2)));
    /// # let _ = options;
    /// ```
    DynamoOutboxOptions,
    DEFAULT_OUTBOX_TABLE,
    (ITEM_LIMIT, usize::MAX, "unused by an outbox"),
    "A table of its own: its key and index are the outbox's (see [`create_table`](crate::DynamoOutbox::create_table)).",
    /// How many partitions the outbox has (1 to 1024; 1 by default): each
    /// is a log that one relay at a time reads, so as many relays publish
    /// at once, and each partition's enqueues are serialised on its
    /// position counter (more partitions, more enqueues at once). Every
    /// process of one table must agree on it: an aggregate's partition is
    /// its hash modulo the count.
    ///
    /// ```
    /// let options = idem_dynamo::DynamoOutboxOptions::default().partitions(4);
    /// # let _ = options;
    /// ```
    partitions: u32 = 1, checked by idem_core::store::validate_partitions
);

/// DynamoDB's table name rules: 3 to 255 characters of `[A-Za-z0-9_.-]`.
pub(crate) fn validate_table(name: &str) -> Result<(), InvalidInput> {
    let field = "table name";
    validate_name(
        field,
        name,
        255,
        |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'),
        "holds a character outside [A-Za-z0-9_.-]",
    )?;
    if name.len() < 3 {
        return Err(InvalidInput::OutOfRange {
            field,
            reason: "DynamoDB table names are 3 to 255 characters",
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
    fn journal_options_check_the_table_and_the_timeout() {
        assert!(DynamoJournalOptions::default().validate().is_ok());
        assert!(
            DynamoJournalOptions::default()
                .table("ab")
                .validate()
                .is_err()
        );
        let zero = StoreOptions::default().with_operation_timeout(std::time::Duration::ZERO);
        assert!(
            DynamoJournalOptions::default()
                .store_options(zero)
                .validate()
                .is_err()
        );
    }

    #[test]
    fn response_limit_must_fit_an_item() {
        let with = |max| {
            DynamoOptions::default()
                .store_options(StoreOptions::default().with_max_response_bytes(max))
                .validate()
        };
        assert!(with(1).is_ok());
        assert!(with(DEFAULT_MAX_RESPONSE_BYTES).is_ok());
        assert!(with(0).is_err());
        assert!(with(DEFAULT_MAX_RESPONSE_BYTES + 1).is_err());
    }
}
