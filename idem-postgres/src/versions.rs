//! `VersionedTable`: version checks over a table of the caller's, inside
//! the caller's transaction.

use idem_core::store::{VersionCheck, VersionStore};
use idem_core::{InvalidInput, Operation, StoreError, async_trait};
use sqlx::{AssertSqlSafe, PgConnection};

use crate::error::classify;
use crate::options::{TableName, identifier};

/// The longest column or type name accepted.
const MAX_IDENTIFIER: usize = 63;

/// A table of yours whose rows carry an aggregate's version, for applying
/// an event only when the row holds its predecessor
/// ([`VersionStore`]): `UPDATE <table> SET <version> = $v WHERE <id> = $a
/// AND <version> = $v - 1` inside your transaction, one round trip when it
/// applies. On zero rows a second statement reads the version with a row
/// lock (`FOR NO KEY UPDATE`: it waits for a transaction writing the row
/// and reads what that one committed) and tells a duplicate or stale event
/// from a gap. Read as the event's predecessor, the version was committed
/// after the update looked at the row (the predecessor's handler
/// committing just then): the update runs again under the lock, so
/// [`VersionCheck::Apply`] always means the version moved in your
/// transaction. The row stays locked until your transaction ends, so
/// racing handlers of one aggregate are serialised.
///
/// A row that does not exist is at version 0: event 1 of a new aggregate
/// is [`VersionCheck::Apply`] and your handler inserts the row at version
/// 1 (its primary key refuses a racing second insert; the retry then
/// reads version 1, stale).
///
/// Every name is a lowercase SQL identifier, validated before it goes
/// near SQL.
///
/// ```no_run
/// use idem_core::store::{VersionCheck, VersionStore};
/// use idem_postgres::VersionedTable;
///
/// # async fn example(pool: idem_postgres::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let orders = VersionedTable::new("shop.orders", "id", "version")?;
/// let mut tx = pool.begin().await?;
/// match orders.advance(&mut *tx, "order-42", 3).await? {
///     VersionCheck::Apply => { /* write the event's effect through tx, then commit */ }
///     VersionCheck::Stale { .. } => { /* a duplicate: acknowledge it */ }
///     _ => { /* a gap: retry later */ }
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct VersionedTable {
    advance: String,
    read: String,
}

impl VersionedTable {
    /// The table `table` (`table` or `schema.table`) whose rows are keyed
    /// by the text column `id_column` and carry a bigint `version_column`.
    ///
    /// ```
    /// use idem_postgres::VersionedTable;
    ///
    /// assert!(VersionedTable::new("orders", "id", "version").is_ok());
    /// assert!(VersionedTable::new("orders", "id; DROP TABLE orders", "version").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a name that is not a lowercase identifier.
    pub fn new(table: &str, id_column: &str, version_column: &str) -> Result<Self, InvalidInput> {
        Self::typed(table, id_column, "text", version_column)
    }

    /// The same for an id column of another type (`uuid`, `bigint`...):
    /// the aggregate's text is cast to it.
    ///
    /// ```
    /// let accounts = idem_postgres::VersionedTable::typed("accounts", "id", "uuid", "version");
    /// assert!(accounts.is_ok());
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a name that is not a lowercase identifier.
    pub fn typed(
        table: &str,
        id_column: &str,
        id_type: &str,
        version_column: &str,
    ) -> Result<Self, InvalidInput> {
        let table = TableName::new(table)?;
        identifier("id column", id_column, MAX_IDENTIFIER)?;
        identifier("id type", id_type, MAX_IDENTIFIER)?;
        identifier("version column", version_column, MAX_IDENTIFIER)?;
        let (id, v) = (id_column, version_column);
        Ok(Self {
            advance: format!(
                "UPDATE {table} SET {v} = $2 WHERE {id} = $1::{id_type} AND {v} = $2 - 1"
            ),
            read: format!("SELECT {v} FROM {table} WHERE {id} = $1::{id_type} FOR NO KEY UPDATE"),
        })
    }
}

#[async_trait]
impl VersionStore<PgConnection> for VersionedTable {
    async fn advance(
        &self,
        conn: &mut PgConnection,
        aggregate: &str,
        version: u64,
    ) -> Result<VersionCheck, StoreError> {
        const OP: Operation = Operation::Advance;
        let event =
            i64::try_from(version)
                .ok()
                .filter(|v| *v >= 1)
                .ok_or(InvalidInput::OutOfRange {
                    field: "version",
                    reason: "must be 1 to 2^63 - 1",
                })?;
        if self.moved(conn, aggregate, event).await? {
            return Ok(VersionCheck::Apply);
        }
        let current: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.read.clone()))
            .bind(aggregate)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| classify(OP, e))?;
        let Some(current) = current else {
            // No row: version 0, and the handler inserts version 1.
            return Ok(VersionCheck::of(version, 0));
        };
        let check = VersionCheck::of(version, u64::try_from(current).unwrap_or(0));
        if check != VersionCheck::Apply {
            return Ok(check);
        }
        // The predecessor committed after the update looked at the row; the
        // row is locked now, so the update sees it.
        if self.moved(conn, aggregate, event).await? {
            return Ok(VersionCheck::Apply);
        }
        Err(StoreError::backend(
            "postgres",
            OP,
            "the version row changed under its row lock",
        ))
    }
}

impl VersionedTable {
    /// The conditional update; whether it moved the row.
    async fn moved(
        &self,
        conn: &mut PgConnection,
        aggregate: &str,
        event: i64,
    ) -> Result<bool, StoreError> {
        let moved = sqlx::query(AssertSqlSafe(self.advance.clone()))
            .bind(aggregate)
            .bind(event)
            .execute(&mut *conn)
            .await
            .map_err(|e| classify(Operation::Advance, e))?;
        Ok(moved.rows_affected() > 0)
    }
}
