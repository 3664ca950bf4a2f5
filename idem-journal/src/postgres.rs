//! The journal on Postgres: one row per operation; an operation can be
//! recorded inside the caller's business transaction.

use idem_core::async_trait;
use idem_postgres::sqlx::{self, PgConnection, PgPool, Row};

use crate::error::JournalError;
use crate::journal::Journal;
use crate::operation::{Operation, OperationId, OperationState};
use crate::store::{JournalStore, Versioned};

const STORE: &str = "postgres";

/// The table and its index; `migrate` runs it, and it is safe to run again.
const MIGRATION: &str = "\
CREATE TABLE IF NOT EXISTS idem_journal (
    subject    text   NOT NULL,
    effect     text   NOT NULL,
    version    bigint NOT NULL,
    state      text   NOT NULL,
    updated_ms bigint NOT NULL,
    operation  text   NOT NULL,
    PRIMARY KEY (subject, effect)
);
CREATE INDEX IF NOT EXISTS idem_journal_state_idx ON idem_journal (state, updated_ms);";

/// The journal store on the caller's `PgPool`, in the table `idem_journal`
/// (or another).
#[derive(Debug, Clone)]
pub struct PostgresJournal {
    pool: PgPool,
    table: String,
}

fn encode(operation: &Operation) -> Result<String, JournalError> {
    serde_json::to_string(operation).map_err(|e| JournalError::store(STORE, e))
}

fn decode(text: &str) -> Result<Operation, JournalError> {
    serde_json::from_str(text).map_err(|e| JournalError::store(STORE, e))
}

fn failed(error: sqlx::Error) -> JournalError {
    JournalError::store(STORE, error)
}

impl PostgresJournal {
    /// The journal store on `pool`; run [`migrate`](Self::migrate) once.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            table: "idem_journal".to_string(),
        }
    }

    /// The same in another table: `table` or `schema.table`, lowercase
    /// identifiers (as [`idem_postgres::TableName`] checks).
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] if the name is not an identifier.
    pub fn with_table(pool: PgPool, table: &str) -> Result<Self, JournalError> {
        let table = idem_postgres::TableName::new(table)?.to_string();
        Ok(Self { pool, table })
    }

    /// `sql` for this store's table (only validated names are spliced in).
    fn sql(&self, sql: &str) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(sql.replace("idem_journal", &self.table))
    }

    /// Creates the table and its index if missing.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the database fails.
    pub async fn migrate(&self) -> Result<(), JournalError> {
        let index = format!("{}_state_idx", self.table.replace('.', "_"));
        let sql = MIGRATION
            .replace("idem_journal_state_idx", &index)
            .replace("idem_journal", &self.table);
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .map_err(failed)?;
        Ok(())
    }
}

impl Journal<PostgresJournal> {
    /// Records an operation inside the caller's transaction, so that the
    /// business write (the order confirmed) and the operation recorded
    /// before its side effect (the charge) commit together. Recording it
    /// twice gives the same operation.
    ///
    /// # Errors
    ///
    /// [`JournalError::Mismatch`] if `id` exists with another request;
    /// [`JournalError::Store`] when the database fails.
    pub async fn record_in(
        &self,
        conn: &mut PgConnection,
        id: &OperationId,
        request: serde_json::Value,
    ) -> Result<Operation, JournalError> {
        let fresh = Operation::new(id.clone(), request, self.now());
        let stored = insert(self.store(), conn, &fresh).await?.operation;
        if stored.request != fresh.request {
            return Err(JournalError::Mismatch(id.clone()));
        }
        Ok(stored)
    }
}

/// INSERT if absent, then read what is there, on `conn`.
async fn insert(
    store: &PostgresJournal,
    conn: &mut PgConnection,
    operation: &Operation,
) -> Result<Versioned, JournalError> {
    sqlx::query(store.sql(
        "INSERT INTO idem_journal (subject, effect, version, state, updated_ms, operation) \
         VALUES ($1, $2, 1, $3, $4, $5) ON CONFLICT (subject, effect) DO NOTHING",
    ))
    .bind(operation.id.subject())
    .bind(operation.id.effect())
    .bind(operation.state.as_str())
    .bind(operation.updated_at_ms)
    .bind(encode(operation)?)
    .execute(&mut *conn)
    .await
    .map_err(failed)?;
    select(store, conn, &operation.id)
        .await?
        .ok_or_else(|| JournalError::NotFound(operation.id.clone()))
}

async fn select(
    store: &PostgresJournal,
    conn: &mut PgConnection,
    id: &OperationId,
) -> Result<Option<Versioned>, JournalError> {
    let row = sqlx::query(
        store.sql("SELECT version, operation FROM idem_journal WHERE subject = $1 AND effect = $2"),
    )
    .bind(id.subject())
    .bind(id.effect())
    .fetch_optional(&mut *conn)
    .await
    .map_err(failed)?;
    row.map(|row| {
        let version: i64 = row.try_get(0).map_err(failed)?;
        let text: String = row.try_get(1).map_err(failed)?;
        Ok(Versioned {
            operation: decode(&text)?,
            version: u64::try_from(version).unwrap_or(0),
        })
    })
    .transpose()
}

#[async_trait]
impl JournalStore for PostgresJournal {
    async fn insert_if_absent(&self, operation: &Operation) -> Result<Versioned, JournalError> {
        let mut conn = self.pool.acquire().await.map_err(failed)?;
        insert(self, &mut conn, operation).await
    }

    async fn get(&self, id: &OperationId) -> Result<Option<Versioned>, JournalError> {
        let mut conn = self.pool.acquire().await.map_err(failed)?;
        select(self, &mut conn, id).await
    }

    async fn compare_and_set(
        &self,
        version: u64,
        operation: &Operation,
    ) -> Result<bool, JournalError> {
        let done = sqlx::query(self.sql(
            "UPDATE idem_journal SET version = version + 1, state = $3, updated_ms = $4, operation = $5 \
             WHERE subject = $1 AND effect = $2 AND version = $6",
        ))
        .bind(operation.id.subject())
        .bind(operation.id.effect())
        .bind(operation.state.as_str())
        .bind(operation.updated_at_ms)
        .bind(encode(operation)?)
        .bind(i64::try_from(version).unwrap_or(i64::MAX))
        .execute(&self.pool)
        .await
        .map_err(failed)?;
        Ok(done.rows_affected() == 1)
    }

    async fn list(
        &self,
        states: &[OperationState],
        updated_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, JournalError> {
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let rows = sqlx::query(self.sql(
            "SELECT operation FROM idem_journal WHERE state = ANY($1) AND updated_ms < $2 \
             ORDER BY updated_ms LIMIT $3",
        ))
        .bind(states)
        .bind(updated_before_ms)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(failed)?;
        rows.iter()
            .map(|row| decode(&row.try_get::<String, _>(0).map_err(failed)?))
            .collect()
    }
}
