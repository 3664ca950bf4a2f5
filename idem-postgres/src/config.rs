//! The table name, validated before it goes anywhere near SQL, and the SQL
//! built from it.

use std::fmt;
use std::sync::Arc;

use idem_core::InvalidInput;

/// The default table name.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The migration for the default table, as shipped in `migrations/`.
const MIGRATION: &str = include_str!("../migrations/0001_idem_records.sql");

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

fn identifier(field: &'static str, part: &str, max: usize) -> Result<(), InvalidInput> {
    let mut chars = part.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if part.is_empty() {
        return Err(InvalidInput::Empty { field });
    }
    if part.len() > max {
        return Err(InvalidInput::TooLong {
            field,
            len: part.len(),
            max,
        });
    }
    if !valid_start || !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err(InvalidInput::Malformed {
            field,
            reason: format!(
                "{part:?} is not a lowercase SQL identifier ([a-z_][a-z0-9_]*, optionally schema-qualified)"
            ),
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
    fn derived(&self, suffix: &str) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}{suffix}", self.table),
            None => format!("{}{suffix}", self.table),
        }
    }

    /// The migration SQL for this table: the shipped migration with its names
    /// replaced.
    pub fn migration_sql(&self) -> String {
        // Every object in the migration is named `idem_records` or
        // `idem_records_<suffix>`; an index takes its table's schema and must
        // not be qualified.
        let index = "idem_records_expires_at_idx";
        MIGRATION
            .replace(index, "\u{0}")
            .replace(DEFAULT_TABLE, &self.derived(""))
            .replace('\u{0}', &format!("{}_expires_at_idx", self.table))
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

/// Every statement the store runs, built once per table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) checkpoint: Arc<str>,
    pub(crate) get: Arc<str>,
    pub(crate) purge_batch: Arc<str>,
}

/// Millisecond precision keeps every store's timestamps comparable.
const NOW: &str = "(SELECT date_trunc('milliseconds', clock_timestamp()) AS now) AS c";
/// The fence: live, in flight, and owned by the lease's owner ($1, $2, $3).
const FENCE: &str = "r.tenant = $1 AND r.key = $2 AND r.owner = $3 \
                     AND r.status = 'in_flight' AND r.expires_at > c.now";
const MS: &str = "* interval '1 millisecond'";

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = table.derived("");
        let claim_fn = table.derived("_claim");
        Self {
            claim: format!("SELECT * FROM {claim_fn}($1, $2, $3, $4, $5, $6)").into(),
            complete: format!(
                "UPDATE {t} AS r SET status = 'completed', lease_expires_at = NULL, \
                 expires_at = c.now + $4 {MS}, response_status = $5, \
                 response_header_names = $6, response_header_values = $7, response_body = $8 \
                 FROM {NOW} WHERE {FENCE}"
            )
            .into(),
            renew: format!(
                "UPDATE {t} AS r SET lease_expires_at = c.now + $4 {MS}, \
                 expires_at = greatest(r.expires_at, c.now + $4 {MS}) \
                 FROM {NOW} WHERE {FENCE} \
                 RETURNING (extract(epoch FROM r.lease_expires_at) * 1000)::bigint"
            )
            .into(),
            release: format!("DELETE FROM {t} AS r USING {NOW} WHERE {FENCE}").into(),
            checkpoint: format!(
                "UPDATE {t} AS r SET checkpoint_name = $4, checkpoint_data = $5 \
                 FROM {NOW} WHERE {FENCE}"
            )
            .into(),
            get: format!(
                "SELECT r.fingerprint, r.owner, r.attempt, r.status, \
                 (extract(epoch FROM r.lease_expires_at) * 1000)::bigint AS lease_expires_ms, \
                 (extract(epoch FROM r.expires_at) * 1000)::bigint AS expires_ms, \
                 r.checkpoint_name, r.checkpoint_data, r.response_status, \
                 r.response_header_names, r.response_header_values, r.response_body \
                 FROM {t} AS r, {NOW} WHERE r.tenant = $1 AND r.key = $2 AND r.expires_at > c.now"
            )
            .into(),
            // Bounded, and SKIP LOCKED: a sweep never waits on (or blocks) a live claim.
            purge_batch: format!(
                "DELETE FROM {t} AS r USING (\
                   SELECT tenant, key FROM {t} WHERE expires_at <= now() \
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED\
                 ) AS old WHERE r.tenant = old.tenant AND r.key = old.key"
            )
            .into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
