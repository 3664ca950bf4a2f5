//! `PostgresJournal`: the outbound operation journal's store, one row per
//! operation, each operation one statement (a call of a PL/pgSQL function
//! that `migrate()` installs; see `migrations/0002_idem_journal.sql`).

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Acquired, Capabilities, Finish, Holder, JournalParts, JournalRecord, JournalStore, Layered,
    ListQuery, NewOperation, OperationId, OperationKey, OperationState, OwnerToken, Timestamp,
    forward_journal_store, millis, validate_lease, validate_list_limit,
};
use idem_core::{Operation, StoreError, Tenant, async_trait};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgConnection, PgExecutor, Postgres};

use crate::codec::column;
use crate::error::{STORE, classify, corrupt};
use crate::options::{PostgresJournalOptions, TableName};
use crate::part::aliased;

/// Serialises concurrent `migrate()` calls of journals (CREATE OR REPLACE
/// FUNCTION races otherwise); not the records' lock, so neither waits for
/// the other.
const MIGRATION_LOCK: i64 = 0x1de3_0002;

/// The columns every statement reads back, one per part of a record.
const COLUMNS: [&str; 15] = [
    "namespace",
    "subject",
    "effect",
    "request",
    "provider_key",
    "state",
    "provider_id",
    "detail",
    "first_sent_at",
    "sends",
    "created_at",
    "updated_at",
    "lease_owner",
    "lease_until",
    "search_until",
];

/// The journal store on Postgres, over the caller's `sqlx::PgPool`: one row
/// per operation in the table `idem_journal` (or another, see
/// [`PostgresJournalOptions`]), in the same database as the business data,
/// so [`record_in`](Self::record_in) can record an operation inside the
/// caller's business transaction.
///
/// Every operation is one statement and one round trip (after the
/// connection has prepared it once), for every outcome: `record`,
/// `acquire`, `mark_sent` and `finish` each call one PL/pgSQL function that
/// [`migrate`](Self::migrate) installs. Leases, the key window and every
/// time in a record are the database server's clock's. Build the pool with
/// [`guarded`](crate::guarded) (no ping before every use, and no connection
/// back in service inside a transaction block it was left in).
///
/// Every operation goes through the store's
/// [`OperationLayer`](idem_core::store::OperationLayer): it is bounded by the
/// [operation timeout](idem_core::StoreOptions::with_operation_timeout) (5 s
/// by default), acquiring its connection included, ends in a retryable
/// [`StoreError::Unavailable`] past it, and gets its span and metrics.
///
/// ```no_run
/// use idem_core::Tenant;
/// use idem_core::store::{JournalStore, NewOperation, OperationId, OperationKey};
/// use idem_postgres::PostgresJournal;
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = idem_postgres::guarded(PgPoolOptions::new())
///     .connect("postgres://localhost/app")
///     .await?;
/// let journal = PostgresJournal::new(pool);
/// journal.migrate().await?;
/// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
/// let recorded = journal
///     .record(&NewOperation::new(key.clone(), serde_json::json!({"amount": 500})))
///     .await?;
/// assert_eq!(journal.get(&key).await?, Some(recorded));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresJournal {
    operations: Layered<Operations>,
}

forward_journal_store!(PostgresJournal => operations);

/// Every statement the journal runs, built once per table name from a
/// validated name.
#[derive(Debug)]
struct Statements {
    record: Arc<str>,
    get: Arc<str>,
    acquire: Arc<str>,
    mark_sent: Arc<str>,
    finish: Arc<str>,
    list: Arc<str>,
}

impl Statements {
    fn new(table: &TableName, _: &PostgresJournalOptions) -> Self {
        let t = table.derived("");
        let row = aliased(&COLUMNS, "r.");
        let key = "r.namespace = $1 AND r.subject = $2 AND r.effect = $3";
        Self {
            record: format!(
                "SELECT {row} FROM {}($1, $2, $3, $4, $5) AS r",
                table.derived("_record")
            )
            .into(),
            get: format!("SELECT {row} FROM {t} AS r WHERE {key}").into(),
            acquire: format!(
                "SELECT a.o_outcome, a.o_now, {} FROM {}($1, $2, $3, $4, $5) AS a",
                aliased(&COLUMNS, "(a.o_record)."),
                table.derived("_acquire")
            )
            .into(),
            mark_sent: format!(
                "SELECT {row} FROM {}($1, $2, $3, $4, $5) AS r",
                table.derived("_mark_sent")
            )
            .into(),
            finish: format!(
                "SELECT {row} FROM {}($1, $2, $3, $4, $5, $6, $7, $8) AS r",
                table.derived("_finish")
            )
            .into(),
            // The scalar subquery reads the clock once, and lets the cutoff
            // bound the index scan. Ties in time go by identity, so pages of
            // a listing come in one order.
            list: format!(
                "SELECT {row} FROM {t} AS r WHERE r.namespace = $1 AND r.state = ANY($2) \
                 AND r.updated_at <= (SELECT {}()) - $3 \
                 ORDER BY r.updated_at, r.subject, r.effect LIMIT $4",
                table.derived("_now")
            )
            .into(),
        }
    }
}

crate::part::part_constructors!(PostgresJournal => operations: Operations, PostgresJournalOptions, TableName::journal_default(), "journal store", "billing.idem_journal");
crate::part::table_accessors!(
    PostgresJournal,
    "idem_journal",
    "0002_idem_journal.sql",
    journal_migration_sql,
    MIGRATION_LOCK
);

impl PostgresJournal {
    /// Records `operation` inside the caller's transaction: the operation
    /// and the business writes that call for it commit together, or vanish
    /// together. As [`JournalStore::record`] otherwise: a key recorded
    /// already returns what is stored. A racing record of the same key
    /// waits on the row until this transaction ends. Needs READ COMMITTED,
    /// the default isolation. The wait counts against the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout).
    ///
    /// ```no_run
    /// use idem_core::Tenant;
    /// use idem_core::store::{NewOperation, OperationId, OperationKey};
    /// use idem_postgres::PostgresJournal;
    ///
    /// # async fn example(journal: PostgresJournal) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = journal.pool().begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
    /// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
    /// journal
    ///     .record_in(&mut tx, &NewOperation::new(key, serde_json::json!({"amount": 500})))
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`JournalStore::record`]. After a timeout the record's outcome
    /// within your transaction is unknown: roll the transaction back.
    pub async fn record_in(
        &self,
        conn: &mut PgConnection,
        operation: &NewOperation,
    ) -> Result<JournalRecord, StoreError> {
        let scope = operation.key().span_scope();
        let recorded = self.parts().record_on(conn, operation);
        self.operations
            .layer()
            .call(Operation::Record, scope.as_ref(), recorded)
            .await
    }
}

/// `sql` with the key's namespace, subject and effect bound as `$1..$3`.
fn keyed<'q>(sql: &Arc<str>, key: &'q OperationKey) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(AssertSqlSafe(sql.clone()))
        .bind(key.namespace().as_str())
        .bind(key.id().subject())
        .bind(key.id().effect())
}

impl Operations {
    /// Records on `executor` (the pool, or the caller's transaction); the
    /// caller's layer bounds it.
    async fn record_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        operation: &NewOperation,
    ) -> Result<JournalRecord, StoreError> {
        const OP: Operation = Operation::Record;
        let request = serde_json::to_string(operation.request())
            .map_err(|e| StoreError::backend(STORE, OP, format!("request: {e}")))?;
        let row = keyed(&self.sql.record, operation.key())
            .bind(request)
            .bind(operation.provider_key())
            .fetch_one(executor)
            .await
            .map_err(|e| classify(OP, e))?;
        record(&row, OP)
    }

    /// A fenced function's row: the record, or none for a lost lease.
    fn fenced(row: Option<PgRow>, operation: Operation) -> Result<JournalRecord, StoreError> {
        match row {
            Some(row) => record(&row, operation),
            None => Err(StoreError::LostLease),
        }
    }
}

/// A timestamp column, or none.
fn time(row: &PgRow, name: &str, operation: Operation) -> Result<Option<Timestamp>, StoreError> {
    let millis: Option<i64> = column(row, name, operation)?;
    Ok(millis.map(Timestamp::from_unix_millis))
}

/// The record in `row`, its columns named as [`COLUMNS`] are.
fn record(row: &PgRow, op: Operation) -> Result<JournalRecord, StoreError> {
    let text = |name: &str| column::<String>(row, name, op);
    let namespace = Tenant::new(text("namespace")?).map_err(|_| corrupt(op, "namespace"))?;
    let id = OperationId::new(&text("subject")?, &text("effect")?)
        .map_err(|_| corrupt(op, "operation id"))?;
    let request = serde_json::from_str(&text("request")?).map_err(|_| corrupt(op, "request"))?;
    let state = OperationState::parse(&text("state")?).ok_or_else(|| corrupt(op, "state"))?;
    let sends: i64 = column(row, "sends", op)?;
    let required = |name: &str, field| time(row, name, op)?.ok_or_else(|| corrupt(op, field));
    let parts = JournalParts {
        state,
        provider_id: column(row, "provider_id", op)?,
        detail: column(row, "detail", op)?,
        first_sent_at: time(row, "first_sent_at", op)?,
        sends: u32::try_from(sends).map_err(|_| corrupt(op, "sends"))?,
        created_at: required("created_at", "created at")?,
        updated_at: required("updated_at", "updated at")?,
        lease_owner: column::<Option<uuid::Uuid>>(row, "lease_owner", op)?
            .map(OwnerToken::from_uuid),
        lease_until: time(row, "lease_until", op)?,
        search_until: time(row, "search_until", op)?,
    };
    let operation = NewOperation::from_stored(
        OperationKey::new(namespace, id),
        request,
        text("provider_key")?,
    );
    Ok(JournalRecord::new(operation, parts))
}

#[async_trait]
impl JournalStore for Operations {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        self.record_on(&self.pool, operation).await
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        let row = keyed(&self.sql.get, key)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(Operation::Get, e))?;
        row.map(|row| record(&row, Operation::Get)).transpose()
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let Holder { key, owner, .. } = held;
        const OP: Operation = Operation::Acquire;
        let lease = validate_lease(lease)?;
        let row = keyed(&self.sql.acquire, key)
            .bind(owner.as_uuid())
            .bind(millis(lease))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let outcome: String = column(&row, "o_outcome", OP)?;
        let now = Timestamp::from_unix_millis(column(&row, "o_now", OP)?);
        Acquired::from_answer(outcome.as_bytes(), owner, now, || record(&row, OP))?
            .ok_or_else(|| corrupt(OP, "acquire outcome"))
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let row = keyed(&self.sql.mark_sent, key)
            .bind(owner.as_uuid())
            .bind(i64::from(sends))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(Operation::MarkSent, e))?;
        Self::fenced(row, Operation::MarkSent)
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let row = keyed(&self.sql.finish, key)
            .bind(owner.as_uuid())
            .bind(finish.state.as_str())
            .bind(finish.provider_id.as_deref())
            .bind(finish.detail.as_deref())
            .bind(finish.search_until.map(Timestamp::as_unix_millis))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(Operation::Finish, e))?;
        Self::fenced(row, Operation::Finish)
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        const OP: Operation = Operation::List;
        let limit = validate_list_limit(query.limit)?;
        let states: Vec<&str> = query.states.iter().map(|state| state.as_str()).collect();
        let rows = sqlx::query(AssertSqlSafe(self.sql.list.clone()))
            .bind(query.namespace.as_str())
            .bind(states)
            .bind(millis(query.older_than))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        rows.iter().map(|row| record(row, OP)).collect()
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
