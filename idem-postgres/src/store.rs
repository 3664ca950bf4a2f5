//! `PostgresStore`: the trait implementation, the fenced statements, and the
//! operations that run inside the caller's transaction.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{
    Capabilities, Checkpoint, ClaimOutcome, ClaimRequest, ClockSource, Durability, Fingerprint,
    HandlerError, IdempotencyKey, IdempotencyStore, InvalidInput, Lease, OwnerToken, Record,
    RecordState, RunError, RunOutcome, Scope, StoreError, StoredResponse, Timestamp,
    TransactionSharing, async_trait, validate_lease_ttl,
};
use sqlx::{AssertSqlSafe, PgConnection, PgExecutor, PgPool, Row};

use crate::claim::{self, bind_response, decode_response, millis};
use crate::config::{Statements, TableName};
use crate::error::{classify, corrupt};

/// The default [`Capabilities::max_response_bytes`]: 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;
/// The largest response limit accepted: Postgres caps a `bytea` at 1 GiB.
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 512 << 20;
/// The default number of rows one purge statement deletes.
pub const DEFAULT_PURGE_BATCH: u32 = 5_000;

/// Serialises concurrent `migrate()` calls (CREATE OR REPLACE FUNCTION races otherwise).
const MIGRATION_LOCK: i64 = 0x1de3_0001;

/// The future a transactional handler returns; it may borrow the connection.
pub type TxFuture<'t, T> = Pin<Box<dyn Future<Output = T> + Send + 't>>;

/// What a transactional handler is told about its claim.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TxClaim {
    /// The lease the completion will name.
    pub lease: Lease,
    /// The checkpoint a previous owner left (takeovers only).
    pub checkpoint: Option<Checkpoint>,
}

impl TxClaim {
    /// A deterministic key for a downstream call; see [`Scope::downstream_key`].
    pub fn downstream_key(&self, name: &str) -> IdempotencyKey {
        self.lease.scope().downstream_key(name)
    }
}

/// The Postgres store, over the caller's `sqlx::PgPool`.
///
/// Leases and retention are judged by the database server's clock. Every
/// operation is one statement and one round trip (after the connection has
/// prepared it once). For exactly one round trip per operation, build the
/// pool with `test_before_acquire(false)`: otherwise sqlx pings the
/// connection before every use.
///
/// ```no_run
/// use idem_postgres::PostgresStore;
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = PgPoolOptions::new()
///     .test_before_acquire(false)
///     .connect("postgres://localhost/app")
///     .await?;
/// let store = PostgresStore::new(pool).with_table("billing.idempotency")?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    table: TableName,
    sql: Arc<Statements>,
    max_response_bytes: usize,
    purge_batch: u32,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table)
            .field("pool_size", &self.pool.size())
            .field("max_response_bytes", &self.max_response_bytes)
            .field("purge_batch", &self.purge_batch)
            .finish_non_exhaustive()
    }
}

fn rows_to_lease(affected: u64) -> Result<(), StoreError> {
    if affected == 1 {
        Ok(())
    } else {
        Err(StoreError::LostLease)
    }
}

impl PostgresStore {
    /// A store on the default table, `idem_records`.
    pub fn new(pool: PgPool) -> Self {
        let table = TableName::default();
        Self {
            sql: Arc::new(Statements::new(&table)),
            pool,
            table,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            purge_batch: DEFAULT_PURGE_BATCH,
        }
    }

    /// Uses another table: `table` or `schema.table`, lowercase identifiers.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] if the name is not an identifier.
    pub fn with_table(mut self, name: &str) -> Result<Self, InvalidInput> {
        self.table = TableName::new(name)?;
        self.sql = Arc::new(Statements::new(&self.table));
        Ok(self)
    }

    /// Sets the largest response accepted (default 8 MiB).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] above 512 MiB.
    pub fn with_max_response_bytes(mut self, max: usize) -> Result<Self, InvalidInput> {
        if max > MAX_RESPONSE_BYTES_LIMIT {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "Postgres bytea holds at most 1 GiB; the limit is 512 MiB",
            });
        }
        self.max_response_bytes = max;
        Ok(self)
    }

    /// Sets how many rows one purge statement deletes (default 5,000).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] for zero.
    pub fn with_purge_batch_size(mut self, rows: u32) -> Result<Self, InvalidInput> {
        if rows == 0 {
            return Err(InvalidInput::OutOfRange {
                field: "purge batch size",
                reason: "must be at least 1",
            });
        }
        self.purge_batch = rows;
        Ok(self)
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The exact statement a claim sends: `SELECT * FROM <table>_claim($1..$6)`
    /// with tenant, key, fingerprint, new owner, lease ms and retention ms.
    /// For tools that measure the store against its bare SQL.
    pub fn claim_sql(&self) -> &str {
        &self.sql.claim
    }

    /// The exact statement a completion sends: tenant, key, owner, retention
    /// ms, status, header names, header values, body.
    pub fn complete_sql(&self) -> &str {
        &self.sql.complete
    }

    /// The SQL that [`migrate`](Self::migrate) runs, for your own migration tool.
    pub fn migration_sql(&self) -> String {
        self.table.migration_sql()
    }

    /// Creates the table, its index and the claim function if missing, and
    /// replaces the function with this version's. Safe to run concurrently.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`] from the database.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let fail = |e| classify("migration", e);
        let mut tx = self.pool.begin().await.map_err(fail)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        sqlx::raw_sql(AssertSqlSafe(self.migration_sql()))
            .execute(&mut *tx)
            .await
            .map_err(fail)?;
        tx.commit().await.map_err(fail)
    }

    /// Claims inside the caller's transaction: the inbox mode.
    ///
    /// A message consumer claims in its own domain transaction, so the claim
    /// and the domain writes commit together. A duplicate delivery racing it
    /// waits on the row until that transaction ends, then sees `Completed`
    /// (or claims, if the transaction rolled back). Needs READ COMMITTED, the
    /// default isolation.
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::claim`].
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        claim::claim(&self.sql.claim, conn, request).await
    }

    /// Completes inside the caller's transaction: the business writes and the
    /// completed marker commit or vanish together.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] if another owner took over: roll the
    /// transaction back. [`StoreError::TooLarge`] before anything is written.
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.complete_on(conn, lease, response).await
    }

    /// The whole transactional flow: the claim commits on its own (so a
    /// concurrent duplicate sees it), then a transaction opens, `handler`
    /// does its writes on it, the completion runs in it, and it commits.
    ///
    /// A lost lease rolls the handler's writes back and returns
    /// [`StoreError::LostLease`]. A handler error rolls back too; as with
    /// [`Idempotency::run`](idem_core::Idempotency::run),
    /// [`HandlerError::NotStarted`] also releases the claim.
    ///
    /// ```no_run
    /// use idem_core::{ClaimRequest, Fingerprint, HandlerError, Scope, StoredResponse};
    /// use idem_postgres::PostgresStore;
    ///
    /// # async fn example(store: PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let request = ClaimRequest::new(Scope::parse("acme", "order-9")?, Fingerprint::of_bytes(b"..."));
    /// let outcome = store
    ///     .run_in_transaction(&request, |tx, _claim| {
    ///         Box::pin(async move {
    ///             sqlx::query("INSERT INTO orders (id) VALUES (9)").execute(&mut *tx).await?;
    ///             Ok::<_, HandlerError<sqlx::Error>>(StoredResponse::new(201, "order 9"))
    ///         })
    ///     })
    ///     .await?;
    /// # let _ = outcome; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Idempotency::run`](idem_core::Idempotency::run).
    pub async fn run_in_transaction<F, E>(
        &self,
        request: &ClaimRequest,
        handler: F,
    ) -> Result<RunOutcome, RunError<E>>
    where
        F: for<'t> FnOnce(
            &'t mut PgConnection,
            TxClaim,
        ) -> TxFuture<'t, Result<StoredResponse, HandlerError<E>>>,
    {
        let (lease, checkpoint) = match self.claim(request).await? {
            ClaimOutcome::Claimed { lease, checkpoint } => (lease, checkpoint),
            ClaimOutcome::Completed(response) => return Ok(RunOutcome::Replayed(response)),
            ClaimOutcome::InProgress { retry_after } => {
                return Err(RunError::InProgress { retry_after });
            }
            ClaimOutcome::Mismatch => return Err(RunError::Mismatch),
        };
        let fail = |e| RunError::Store(classify("transaction", e));
        let mut tx = self.pool.begin().await.map_err(fail)?;
        let claim = TxClaim {
            lease: lease.clone(),
            checkpoint,
        };
        match handler(&mut tx, claim).await {
            Ok(response) => match self.complete_on(&mut *tx, &lease, &response).await {
                Ok(()) => {
                    tx.commit().await.map_err(fail)?;
                    Ok(RunOutcome::Executed(response))
                }
                Err(error) => {
                    tx.rollback().await.map_err(fail)?;
                    Err(RunError::Store(error))
                }
            },
            Err(HandlerError::NotStarted(error)) => {
                tx.rollback().await.map_err(fail)?;
                if let Err(release) = self.release(&lease).await {
                    tracing::warn!(error = %release, "could not release a claim; it will expire with its lease");
                }
                Err(RunError::Rejected(error))
            }
            Err(HandlerError::Failed(error)) => {
                tx.rollback().await.map_err(fail)?;
                Err(RunError::Failed(error))
            }
        }
    }

    fn check_size(&self, response: &StoredResponse) -> Result<(), StoreError> {
        let size = response.size();
        if size > self.max_response_bytes {
            return Err(StoreError::TooLarge {
                size,
                max: self.max_response_bytes,
            });
        }
        Ok(())
    }

    async fn complete_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.check_size(response)?;
        let query = Self::fenced(&self.sql.complete, lease).bind(millis(lease.retention()));
        let done = bind_response(query, response)
            .execute(executor)
            .await
            .map_err(|e| classify("complete", e))?;
        rows_to_lease(done.rows_affected())
    }

    /// Deletes one batch of rows past retention; returns how many.
    async fn purge_batch(&self) -> Result<u64, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.sql.purge_batch.clone()))
            .bind(i64::from(self.purge_batch))
            .execute(&self.pool)
            .await
            .map_err(|e| classify("purge", e))?;
        Ok(done.rows_affected())
    }

    fn fenced<'q>(
        sql: &Arc<str>,
        lease: &'q Lease,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(lease.scope().tenant().as_str())
            .bind(lease.scope().key().as_str())
            .bind(lease.owner().as_uuid())
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        claim::claim(&self.sql.claim, &self.pool, request).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.complete_on(&self.pool, lease, response).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = validate_lease_ttl(extend)?;
        let until: Option<i64> = Self::fenced(&self.sql.renew, lease)
            .bind(millis(extend))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify("renew", e))?
            .map(|row| row.try_get(0))
            .transpose()
            .map_err(|e| classify("renew decode", e))?;
        let until = until.ok_or(StoreError::LostLease)?;
        Ok(lease.renewed(Timestamp::from_unix_millis(until)))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let done = Self::fenced(&self.sql.release, lease)
            .execute(&self.pool)
            .await
            .map_err(|e| classify("release", e))?;
        rows_to_lease(done.rows_affected())
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let done = Self::fenced(&self.sql.checkpoint, lease)
            .bind(checkpoint.name())
            .bind(checkpoint.data_json())
            .execute(&self.pool)
            .await
            .map_err(|e| classify("checkpoint", e))?;
        rows_to_lease(done.rows_affected())
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.get.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.key().as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify("get", e))?;
        row.map(|row| record_from_row(scope, &row)).transpose()
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let deleted = self.purge_batch().await?;
            total += deleted;
            if deleted < u64::from(self.purge_batch) {
                return Ok(total);
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            TransactionSharing::SameDatabase,
            Durability::Durable,
            ClockSource::Server,
            self.max_response_bytes,
        )
    }
}

fn record_from_row(scope: &Scope, row: &sqlx::postgres::PgRow) -> Result<Record, StoreError> {
    let get_err = |e| classify("get decode", e);
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(get_err)?;
    let owner: uuid::Uuid = row.try_get("owner").map_err(get_err)?;
    let attempt: i32 = row.try_get("attempt").map_err(get_err)?;
    let status: String = row.try_get("status").map_err(get_err)?;
    let expires_ms: i64 = row.try_get("expires_ms").map_err(get_err)?;
    let state = match status.as_str() {
        "in_flight" => RecordState::InFlight {
            lease_expires_at: Timestamp::from_unix_millis(
                row.try_get::<Option<i64>, _>("lease_expires_ms")
                    .map_err(get_err)?
                    .ok_or_else(|| corrupt("lease expiry"))?,
            ),
        },
        "completed" => RecordState::Completed {
            response: decode_response(
                row.try_get("response_status").map_err(get_err)?,
                row.try_get("response_header_names").map_err(get_err)?,
                row.try_get("response_header_values").map_err(get_err)?,
                row.try_get("response_body").map_err(get_err)?,
            )
            .ok_or_else(|| corrupt("stored response"))?,
        },
        _ => return Err(corrupt("status")),
    };
    let checkpoint = match (
        row.try_get::<Option<String>, _>("checkpoint_name")
            .map_err(get_err)?,
        row.try_get::<Option<String>, _>("checkpoint_data")
            .map_err(get_err)?,
    ) {
        (Some(name), Some(data)) => {
            Some(Checkpoint::from_json(name, &data).map_err(|_| corrupt("checkpoint"))?)
        }
        _ => None,
    };
    Ok(Record {
        scope: scope.clone(),
        fingerprint: Fingerprint::try_from_slice(&fingerprint)
            .map_err(|_| corrupt("fingerprint"))?,
        owner: OwnerToken::from_uuid(owner),
        attempt: u32::try_from(attempt).map_err(|_| corrupt("attempt"))?,
        state,
        checkpoint,
        expires_at: Timestamp::from_unix_millis(expires_ms),
    })
}
