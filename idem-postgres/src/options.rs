//! How a store is built: its table, validated before it goes anywhere near
//! SQL, its response limit and its purge batch.

use std::fmt;

use idem_core::store::validate_name;
use idem_core::{InvalidInput, StoreOptions};

/// The default table name.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The default table name of a [`PostgresJournal`](crate::PostgresJournal).
pub const DEFAULT_JOURNAL_TABLE: &str = "idem_journal";

/// The default table name of a [`PostgresOutbox`](crate::PostgresOutbox).
pub const DEFAULT_OUTBOX_TABLE: &str = "idem_outbox";

/// The default table name of a [`PostgresParking`](crate::PostgresParking).
pub const DEFAULT_PARKING_TABLE: &str = "idem_parked";

/// The parking store's migration for its default table, as shipped in `migrations/`.
const PARKING_MIGRATION: &str = include_str!("../migrations/0004_idem_parked.sql");

/// The indexes of the parking store's migration, by their suffix.
const PARKING_INDEXES: [&str; 3] = ["_waiting_idx", "_aggregate_idx", "_resolved_idx"];

/// The migration for the default table, as shipped in `migrations/`.
const MIGRATION: &str = include_str!("../migrations/0001_idem_records.sql");

/// The journal's migration for its default table, as shipped in `migrations/`.
const JOURNAL_MIGRATION: &str = include_str!("../migrations/0002_idem_journal.sql");

/// The outbox's migration for its default table, as shipped in `migrations/`.
const OUTBOX_MIGRATION: &str = include_str!("../migrations/0003_idem_outbox.sql");

/// The indexes of the outbox's migration, by their suffix to the table's name.
const OUTBOX_INDEXES: [&str; 4] = ["_log_idx", "_lane_idx", "_parked_idx", "_finished_idx"];

/// The statement that ends the outbox's migration, with its partition count.
const OUTBOX_PARTITIONS: &str = "SELECT idem_outbox_set_partitions(1);";

/// The longest notification channel Postgres accepts (`NAMEDATALEN - 1`).
const MAX_CHANNEL: usize = 63;

/// The longest table name accepted: Postgres identifiers hold 63 bytes, and
/// the index and function names add a suffix to the table's.
pub const MAX_TABLE_NAME: usize = 40;

/// A validated table name: an optional schema and a table, each a lowercase
/// SQL identifier (`[a-z_][a-z0-9_]*`), table at most 40 bytes.
///
/// Only validated names are ever spliced into SQL, so no name can inject
/// anything.
///
/// ```
/// use idem_postgres::TableName;
///
/// assert!(TableName::new("idem_records").is_ok());
/// assert!(TableName::new("billing.idem_records").is_ok());
/// assert!(TableName::new("records; DROP TABLE users").is_err());
/// assert!(TableName::new("Records").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

pub(crate) fn identifier(field: &'static str, part: &str, max: usize) -> Result<(), InvalidInput> {
    let rule = "not a lowercase SQL identifier ([a-z_][a-z0-9_]*, optionally schema-qualified)";
    validate_name(
        field,
        part,
        max,
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_',
        rule,
    )?;
    if part.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(InvalidInput::Malformed {
            field,
            reason: rule.into(),
        });
    }
    Ok(())
}

impl TableName {
    /// Validates `name`, `table` or `schema.table`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] if a part is empty, too long or not a lowercase identifier.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        let (schema, table) = match name.split_once('.') {
            Some((schema, table)) => {
                identifier("schema name", schema, 63)?;
                (Some(schema.to_string()), table)
            }
            None => (None, name),
        };
        identifier("table name", table, MAX_TABLE_NAME)?;
        Ok(Self {
            schema,
            table: table.to_string(),
        })
    }

    /// A name derived from the table's, in the same schema (`<table><suffix>`).
    pub(crate) fn derived(&self, suffix: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}{suffix}", self.table),
            None => format!("{}{suffix}", self.table),
        }
    }

    /// The migration SQL for this table: the shipped migration with its names
    /// replaced.
    pub fn migration_sql(&self) -> String {
        self.renamed(MIGRATION, DEFAULT_TABLE, &["_expires_at_idx"])
    }

    /// The journal's migration SQL for this table (see
    /// [`PostgresJournal::migration_sql`](crate::PostgresJournal::migration_sql)).
    pub(crate) fn journal_migration_sql(&self) -> String {
        self.renamed(JOURNAL_MIGRATION, DEFAULT_JOURNAL_TABLE, &["_list_idx"])
    }

    /// The outbox's migration SQL for this table (see
    /// [`PostgresOutbox::migration_sql`](crate::PostgresOutbox::migration_sql)):
    /// its tables, indexes and functions renamed, and its notification
    /// channel this table's [`outbox_channel`](Self::outbox_channel).
    pub(crate) fn outbox_migration_sql(&self, partitions: u32) -> String {
        // The channel is a string, not a name: set aside before the rename.
        let channel = format!("'{DEFAULT_OUTBOX_TABLE}'");
        let counted = OUTBOX_MIGRATION.replace(
            OUTBOX_PARTITIONS,
            &format!("SELECT idem_outbox_set_partitions({partitions});"),
        );
        let renamed = self.renamed(
            &counted.replace(&channel, "\u{1}"),
            DEFAULT_OUTBOX_TABLE,
            &OUTBOX_INDEXES,
        );
        renamed.replace('\u{1}', &format!("'{}'", self.outbox_channel()))
    }

    /// The channel an outbox on this table notifies when a message commits:
    /// the table's name as written (`schema.table` when qualified), cut to
    /// the 63 bytes Postgres keeps of a channel's name. (Two long names
    /// that share their first 63 bytes share a channel, which costs only
    /// wake-ups.)
    pub(crate) fn outbox_channel(&self) -> String {
        let mut channel = self.derived("");
        // Identifiers are ASCII, so any byte is a character boundary.
        channel.truncate(MAX_CHANNEL);
        channel
    }

    /// `migration` with every object named `default` or `default<suffix>`
    /// renamed after this table.
    fn renamed(&self, migration: &str, default: &str, index_suffixes: &[&str]) -> String {
        // Every object in a migration is named `<default>` or
        // `<default>_<suffix>`; an index takes its table's schema and must
        // not be qualified, so each is set aside before the qualified rename.
        let mark = |i: usize| format!("\u{0}{i}\u{0}");
        let mut sql = migration.to_string();
        for (i, suffix) in index_suffixes.iter().enumerate() {
            sql = sql.replace(&format!("{default}{suffix}"), &mark(i));
        }
        sql = sql.replace(default, &self.derived(""));
        for (i, suffix) in index_suffixes.iter().enumerate() {
            sql = sql.replace(&mark(i), &format!("{}{suffix}", self.table));
        }
        sql
    }

    /// The parking store's migration SQL for this table (see
    /// [`PostgresParking::migration_sql`](crate::PostgresParking::migration_sql)).
    pub(crate) fn parking_migration_sql(&self) -> String {
        self.renamed(PARKING_MIGRATION, DEFAULT_PARKING_TABLE, &PARKING_INDEXES)
    }

    /// The default table of a parking store, `idem_parked`.
    pub(crate) fn parking_default() -> Self {
        Self {
            schema: None,
            table: DEFAULT_PARKING_TABLE.to_string(),
        }
    }

    /// The default table of an outbox, `idem_outbox`.
    pub(crate) fn outbox_default() -> Self {
        Self {
            schema: None,
            table: DEFAULT_OUTBOX_TABLE.to_string(),
        }
    }

    /// The default table of a journal, `idem_journal`.
    pub(crate) fn journal_default() -> Self {
        Self {
            schema: None,
            table: DEFAULT_JOURNAL_TABLE.to_string(),
        }
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self {
            schema: None,
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.derived(""))
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TableName({self})")
    }
}

/// The default [`Capabilities::max_response_bytes`](idem_core::store::Capabilities): 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;
/// The largest response limit accepted: Postgres caps a `bytea` at 1 GiB.
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 512 << 20;
/// The default number of rows one purge statement deletes.
pub const DEFAULT_PURGE_BATCH: u32 = 5_000;

/// How a [`PostgresStore`](crate::PostgresStore) is built; validated once by
/// [`PostgresStore::with_options`](crate::PostgresStore::with_options).
///
/// The [operation timeout](StoreOptions::with_operation_timeout) bounds the
/// whole operation: acquiring a connection from the pool (reconnecting
/// included) and the statement's round trip. It applies to every
/// [`IdempotencyStore`](idem_core::store::IdempotencyStore) operation (for
/// `purge_expired`, to each batch), to
/// [`claim_in`](crate::PostgresStore::claim_in),
/// [`begin`](crate::PostgresStore::begin), and the completion, checkpoint
/// and commit of a [`PgTransaction`](crate::PgTransaction); not to
/// [`migrate`](crate::PostgresStore::migrate), which may wait for a
/// concurrent migration. The pool's own settings still apply inside it:
/// sqlx's `acquire_timeout` (30 s by default) bounds only the wait for a
/// connection, and a server-side `statement_timeout` only the statement's
/// execution, neither a stalled network. A connection whose statement timed
/// out is tested by sqlx in the background as it returns to the pool, and
/// closed if broken. Inside the caller's transaction (`claim_in`,
/// [`PgTransaction`](crate::PgTransaction)) a timed-out statement leaves the
/// transaction's outcome to the caller: roll it back.
///
/// ```
/// use std::time::Duration;
/// use idem_core::StoreOptions;
/// use idem_postgres::PostgresOptions;
///
/// let options = PostgresOptions::default()
///     .table("billing.idempotency")
///     .purge_batch(1_000)
///     .store_options(
///         StoreOptions::default()
///             .with_max_response_bytes(1 << 20)
///             .with_operation_timeout(Duration::from_secs(2)),
///     );
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    pub(crate) table: String,
    pub(crate) purge_batch: u32,
    pub(crate) store: StoreOptions,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE.to_string(),
            purge_batch: DEFAULT_PURGE_BATCH,
            store: StoreOptions::default(),
        }
    }
}

impl PostgresOptions {
    /// The table: `table` or `schema.table`, lowercase SQL identifiers
    /// (default `idem_records`; see [`TableName`]).
    #[must_use]
    pub fn table(mut self, name: &str) -> Self {
        self.table = name.to_string();
        self
    }

    /// How many rows one purge statement deletes (default 5,000, at least 1).
    #[must_use]
    pub fn purge_batch(mut self, rows: u32) -> Self {
        self.purge_batch = rows;
        self
    }

    /// The operation timeout and the response limit (default 8 MiB, at most
    /// 512 MiB).
    #[must_use]
    pub fn store_options(mut self, store: StoreOptions) -> Self {
        self.store = store;
        self
    }

    /// The table name and the response limit, validated.
    pub(crate) fn validate(&self) -> Result<(TableName, usize), InvalidInput> {
        let max_response_bytes = self.store.checked(
            DEFAULT_MAX_RESPONSE_BYTES,
            MAX_RESPONSE_BYTES_LIMIT,
            "Postgres bytea holds at most 1 GiB; the limit is 512 MiB",
        )?;
        if self.purge_batch == 0 {
            return Err(InvalidInput::OutOfRange {
                field: "purge batch",
                reason: "must be at least 1",
            });
        }
        Ok((TableName::new(&self.table)?, max_response_bytes))
    }
}

/// The options of a part kept in one table of its own and holding no
/// responses (the journal, the outbox): its table and the shared
/// [`StoreOptions`], validated once by the part's `with_options`.
macro_rules! part_options {
    (
        $(#[$doc:meta])* $name:ident, $default:ident, $why:literal
        $(, $(#[$field_doc:meta])* $field:ident: $ty:ty = $init:expr, checked by $check:path)*
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct $name {
            pub(crate) table: String,
            pub(crate) store: StoreOptions,
            $(pub(crate) $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    table: $default.to_string(),
                    store: StoreOptions::default(),
                    $($field: $init,)*
                }
            }
        }

        impl $name {
            #[doc = concat!("The table: `table` or `schema.table`, lowercase SQL identifiers (default [`", stringify!($default), "`]; see [`TableName`]).")]
            #[must_use]
            pub fn table(mut self, name: &str) -> Self {
                self.table = name.to_string();
                self
            }

            /// The operation timeout (default 5 s, more than zero).
            #[must_use]
            pub fn store_options(mut self, store: StoreOptions) -> Self {
                self.store = store;
                self
            }

            $(
                $(#[$field_doc])*
                #[must_use]
                pub fn $field(mut self, $field: $ty) -> Self {
                    self.$field = $field;
                    self
                }
            )*

            /// The table name, validated with the shared options (no
            /// ceiling on responses, which the part never stores) and the
            /// part's own.
            pub(crate) fn validate(&self) -> Result<TableName, InvalidInput> {
                self.store.checked(usize::MAX, usize::MAX, $why)?;
                $($check(self.$field)?;)*
                TableName::new(&self.table)
            }
        }
    };
}

part_options!(
    /// How a [`PostgresJournal`](crate::PostgresJournal) is built; validated once
    /// by [`PostgresJournal::with_options`](crate::PostgresJournal::with_options).
    ///
    /// The [operation timeout](StoreOptions::with_operation_timeout) bounds each
    /// journal operation as a whole (acquiring a connection from the pool
    /// included), and [`record_in`](crate::PostgresJournal::record_in) inside
    /// the caller's transaction; not [`migrate`](crate::PostgresJournal::migrate),
    /// which may wait for a concurrent migration. The journal keeps no
    /// responses: a response limit set in the store options is only checked to
    /// be at least 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    /// use idem_postgres::PostgresJournalOptions;
    ///
    /// let options = PostgresJournalOptions::default()
    ///     .table("billing.idem_journal")
    ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(2)));
    /// # let _ = options;
    /// ```
    PostgresJournalOptions,
    DEFAULT_JOURNAL_TABLE,
    "a journal keeps no responses"
);

part_options!(
    /// How a [`PostgresOutbox`](crate::PostgresOutbox) is built; validated
    /// once by [`PostgresOutbox::with_options`](crate::PostgresOutbox::with_options).
    /// Its counter and partition tables are named after its table,
    /// `<table>_aggregates` and `<table>_partitions`, in the same schema.
    ///
    /// The [operation timeout](StoreOptions::with_operation_timeout) bounds each
    /// outbox operation as a whole (acquiring a connection from the pool
    /// included), and [`enqueue_in`](crate::PostgresOutbox::enqueue_in) inside
    /// the caller's transaction; not [`migrate`](crate::PostgresOutbox::migrate),
    /// which may wait for a concurrent migration. An outbox keeps no responses:
    /// a response limit set in the store options is only checked to be at least 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    /// use idem_postgres::PostgresOutboxOptions;
    ///
    /// let options = PostgresOutboxOptions::default()
    ///     .table("billing.idem_outbox")
    ///     .partitions(8)
    ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(2)));
    /// # let _ = options;
    /// ```
    PostgresOutboxOptions,
    DEFAULT_OUTBOX_TABLE,
    "an outbox keeps no responses",
    /// How many partitions the outbox has (1 to 1024; 1 by default): each
    /// is read by one relay at a time, so this bounds how many relays share
    /// the work. [`migrate`](crate::PostgresOutbox::migrate) sets it; it can
    /// change only while every message is sent (an aggregate's messages must
    /// stay in one partition to stay in order).
    partitions: u32 = 1, checked by idem_core::store::validate_partitions
);

part_options!(
    /// How a [`PostgresParking`](crate::PostgresParking) is built; validated
    /// once by [`PostgresParking::with_options`](crate::PostgresParking::with_options).
    ///
    /// The [operation timeout](StoreOptions::with_operation_timeout) bounds each
    /// operation as a whole (acquiring a connection from the pool included);
    /// not [`migrate`](crate::PostgresParking::migrate). A parking store keeps
    /// no responses: a response limit set in the store options is only checked
    /// to be at least 1.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::StoreOptions;
    /// use idem_postgres::PostgresParkingOptions;
    ///
    /// let options = PostgresParkingOptions::default()
    ///     .table("billing.idem_parked")
    ///     .store_options(StoreOptions::default().with_operation_timeout(Duration::from_secs(2)));
    /// # let _ = options;
    /// ```
    PostgresParkingOptions,
    DEFAULT_PARKING_TABLE,
    "a parking store keeps no responses"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parking_migration_is_renamed_whole() {
        let sql = TableName::new("app.held").unwrap().parking_migration_sql();
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.held ("));
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS held_aggregate_idx ON app.held"));
        assert!(sql.contains("FUNCTION app.held_now()"));
        assert!(!sql.contains("idem_parked"), "{sql}");
        assert_eq!(
            TableName::parking_default().parking_migration_sql(),
            PARKING_MIGRATION
        );
    }

    #[test]
    fn names_that_are_not_identifiers_are_refused() {
        for bad in [
            "",
            "1records",
            "records-x",
            "rec ords",
            "\"records\"",
            "a.b.c",
            ".records",
            "records.",
            "RECORDS",
            "ré",
            "x;drop table y",
        ] {
            assert!(TableName::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TableName::new(&"t".repeat(MAX_TABLE_NAME + 1)).is_err());
        assert!(TableName::new(&"t".repeat(MAX_TABLE_NAME)).is_ok());
    }

    #[test]
    fn migration_for_another_table_renames_every_object() {
        let sql = TableName::new("billing.keys").unwrap().migration_sql();
        assert!(!sql.contains("idem_records"));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS billing.keys ("));
        assert!(sql.contains("FUNCTION billing.keys_claim("));
        assert!(sql.contains("billing.keys%ROWTYPE"));
        assert!(sql.contains("INDEX IF NOT EXISTS keys_expires_at_idx ON billing.keys"));
        assert_eq!(TableName::default().migration_sql(), MIGRATION);
    }

    #[test]
    fn journal_migration_for_another_table_renames_every_object() {
        let sql = TableName::new("app.ops").unwrap().journal_migration_sql();
        assert!(!sql.contains("idem_journal"));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.ops ("));
        for function in ["now", "record", "acquire", "mark_sent", "finish"] {
            assert!(
                sql.contains(&format!("FUNCTION app.ops_{function}(")),
                "{function}"
            );
        }
        assert!(sql.contains("app.ops%ROWTYPE"));
        assert!(sql.contains("SETOF app.ops\n"));
        assert!(sql.contains("INDEX IF NOT EXISTS ops_list_idx ON app.ops ("));
        assert_eq!(
            TableName::journal_default().journal_migration_sql(),
            JOURNAL_MIGRATION
        );
    }

    #[test]
    fn outbox_migration_for_another_table_renames_every_object() {
        let sql = TableName::new("app.events")
            .unwrap()
            .outbox_migration_sql(8);
        assert!(!sql.contains("idem_outbox"), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.events ("));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.events_aggregates ("));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS app.events_partitions ("));
        for function in ["now", "xmin", "enqueue", "set_partitions", "read", "stats"] {
            assert!(
                sql.contains(&format!("FUNCTION app.events_{function}(")),
                "{function}"
            );
        }
        for index in OUTBOX_INDEXES {
            assert!(
                sql.contains(&format!(
                    "INDEX IF NOT EXISTS events{index} ON app.events ("
                )),
                "{index}"
            );
        }
        assert!(sql.contains("app.events%ROWTYPE"));
        assert!(sql.contains("SETOF app.events\n"));
        assert!(sql.contains("pg_notify('app.events', '')"));
        assert!(
            sql.ends_with("SELECT app.events_set_partitions(8);\n"),
            "{sql}"
        );
        assert_eq!(
            TableName::outbox_default().outbox_migration_sql(1),
            OUTBOX_MIGRATION
        );
    }

    #[test]
    fn an_outbox_channel_is_the_qualified_name_within_63_bytes() {
        assert_eq!(TableName::outbox_default().outbox_channel(), "idem_outbox");
        assert_eq!(
            TableName::new("app.events").unwrap().outbox_channel(),
            "app.events"
        );
        let long = format!("{}.{}", "s".repeat(63), "t".repeat(MAX_TABLE_NAME));
        let channel = TableName::new(&long).unwrap().outbox_channel();
        assert_eq!(channel.len(), 63);
        assert!(
            TableName::new(&long)
                .unwrap()
                .outbox_migration_sql(1)
                .contains(&format!("pg_notify('{channel}', '')"))
        );
    }

    #[test]
    fn journal_options_refuse_a_bad_table_and_a_zero_timeout() {
        use std::time::Duration;
        assert_eq!(
            PostgresJournalOptions::default().validate(),
            Ok(TableName::journal_default())
        );
        assert!(
            PostgresJournalOptions::default()
                .table("Bad")
                .validate()
                .is_err()
        );
        let zero = StoreOptions::default().with_operation_timeout(Duration::ZERO);
        assert!(matches!(
            PostgresJournalOptions::default()
                .store_options(zero)
                .validate(),
            Err(InvalidInput::OutOfRange {
                field: "operation timeout",
                ..
            })
        ));
    }
}
