//! `PostgresStore`: the trait implementation over the pool (its fenced
//! writes, shared with `PgTransaction`, are in `fenced.rs`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, IdempotencyStore, Layered, Lease, OperationLayer,
    Record, Timestamp, forward_store, millis, validate_lease,
};
use idem_core::{Checkpoint, Operation, Scope, StoreError, StoredResponse, async_trait};
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use crate::claim;
use crate::codec::record;
use crate::commands::Statements;
use crate::error::{STORE, classify};
use crate::fenced::{Fenced, held};
use crate::options::{DEFAULT_MAX_RESPONSE_BYTES, PostgresOptions, TableName};
use crate::transaction::PgTransaction;

/// Serialises concurrent `migrate()` calls (CREATE OR REPLACE FUNCTION races otherwise).
const MIGRATION_LOCK: i64 = 0x1de3_0001;

/// The Postgres store, over the caller's `sqlx::PgPool`.
///
/// Leases and retention are judged by the database server's clock. Every
/// operation is one statement and one round trip (after the connection has
/// prepared it once). Build the pool with [`guarded`](crate::guarded): no
/// connection then goes back into service inside a transaction block a
/// dropped future left it in, and sqlx does not ping the connection before
/// every use (`test_before_acquire(false)`), so an operation is exactly
/// one round trip.
///
/// Every operation goes through the store's
/// [`OperationLayer`](idem_core::store::OperationLayer): it is bounded by the
/// [operation timeout](idem_core::StoreOptions::with_operation_timeout) (5 s
/// by default), acquiring its connection from the pool included, ends in a
/// retryable [`StoreError::Unavailable`] past it, and gets its span and
/// metrics whoever calls it.
///
/// ```no_run
/// use idem_postgres::{PostgresOptions, PostgresStore};
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = idem_postgres::guarded(PgPoolOptions::new())
///     .connect("postgres://localhost/app")
///     .await?;
/// let store = PostgresStore::with_options(pool, PostgresOptions::default().table("billing.idempotency"))?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresStore {
    records: Layered<Records>,
}

forward_store!(PostgresStore => records);

/// The store's parts, and the statements of the trait, inside its layer.
#[derive(Clone)]
struct Records {
    pool: PgPool,
    table: TableName,
    fenced: Fenced,
    purge_batch: u32,
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table)
            .field("pool_size", &self.pool.size())
            .field("max_response_bytes", &self.fenced.max_response_bytes())
            .field("purge_batch", &self.purge_batch)
            .field("operation_timeout", &self.fenced.layer.timeout())
            .finish_non_exhaustive()
    }
}

crate::part::table_accessors!(
    PostgresStore,
    "idem_records",
    "0001_idem_records.sql",
    migration_sql,
    MIGRATION_LOCK
);

impl PostgresStore {
    /// A store with the default options: table `idem_records`, 8 MiB
    /// responses, a 5 s operation timeout.
    pub fn new(pool: PgPool) -> Self {
        let defaults = PostgresOptions::default();
        Self::from_parts(
            pool,
            TableName::default(),
            DEFAULT_MAX_RESPONSE_BYTES,
            &defaults,
        )
    }

    /// A store built from `options`.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] if the table is not a lowercase
    /// identifier, the response limit is over 512 MiB, the purge batch is 0
    /// or the operation timeout is zero.
    pub fn with_options(pool: PgPool, options: PostgresOptions) -> Result<Self, StoreError> {
        let (table, max_response_bytes) = options.validate()?;
        Ok(Self::from_parts(pool, table, max_response_bytes, &options))
    }

    fn from_parts(
        pool: PgPool,
        table: TableName,
        max_response_bytes: usize,
        options: &PostgresOptions,
    ) -> Self {
        let layer = OperationLayer::new(STORE, options.store.operation_timeout());
        let records = Records {
            fenced: Fenced::new(Arc::new(Statements::new(&table)), max_response_bytes, layer),
            pool,
            table,
            purge_batch: options.purge_batch,
        };
        Self {
            records: Layered::with_layer(records, layer),
        }
    }

    fn parts(&self) -> &Records {
        self.records.get_ref()
    }

    /// The exact statement a claim sends: `SELECT * FROM <table>_claim($1..$6)`
    /// with tenant, key, fingerprint, new owner, lease ms and retention ms.
    /// For the benchmarks only; not part of the API.
    #[cfg(feature = "bench")]
    pub fn claim_sql(&self) -> &str {
        &self.parts().fenced.sql.claim
    }

    /// The exact statement a completion sends: tenant, key, owner, retention
    /// ms, status, header names, header values, body. For the benchmarks
    /// only; not part of the API.
    #[cfg(feature = "bench")]
    pub fn complete_sql(&self) -> &str {
        &self.parts().fenced.sql.complete
    }

    /// Claims inside the caller's transaction: the inbox mode.
    ///
    /// A message consumer claims in its own domain transaction, so the claim
    /// and the domain writes commit together. A duplicate delivery racing it
    /// waits on the row until that transaction ends, then sees `Completed`
    /// (or claims, if the transaction rolled back). Needs READ COMMITTED, the
    /// default isolation. The wait on the row counts against the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout).
    ///
    /// # Errors
    ///
    /// As [`IdempotencyStore::claim`]. After a timeout the claim's outcome
    /// within your transaction is unknown: roll the transaction back.
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        let fenced = &self.parts().fenced;
        let claim = claim::claim(&fenced.sql.claim, conn, request);
        fenced.layer.claim(request, claim).await
    }

    /// Opens a transaction on the store's database for
    /// [`Idempotency::run_in`](idem_core::Idempotency::run_in): the handler
    /// writes through it, and the completion (and any
    /// [`checkpoint_in`](idem_core::RunContext::checkpoint_in)) commits with
    /// those writes or not at all.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
    /// use idem_core::store::IdempotencyStore;
    /// use idem_postgres::PostgresStore;
    ///
    /// # async fn example(store: PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let idem: Idempotency<dyn IdempotencyStore> = Idempotency::new(Arc::new(store.clone()));
    /// let scope = Scope::parse("acme", "order-9")?;
    /// let outcome = idem
    ///     .run_in(scope, Fingerprint::of_bytes(b"..."), store.begin(), |ctx, mut tx| async move {
    ///         sqlx::query("INSERT INTO orders (id) VALUES (9)").execute(tx.conn()).await?;
    ///         ctx.checkpoint_in(&mut tx, "order-written", &9).await?;
    ///         Ok((tx, StoredResponse::new(201, "order 9")))
    ///     })
    ///     .await?;
    /// # let _ = outcome; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] if no connection could be had within the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout).
    pub fn begin(&self) -> impl Future<Output = Result<PgTransaction, StoreError>> + Send + use<> {
        // The future owns a clone of the store, so `move || store.begin()`
        // can open one per request (idem-http's transactional mode).
        let Records {
            pool,
            table,
            fenced,
            ..
        } = self.parts().clone();
        async move {
            let tx = fenced
                .layer
                .call(Operation::Transaction, None, async {
                    // Whole, in a task of its own: a timeout here must not cut
                    // BEGIN off mid-flight (see `pool::begin`).
                    crate::pool::begin(&pool)
                        .await
                        .map_err(|e| classify(Operation::Transaction, e))
                })
                .await?;
            Ok(PgTransaction::new(fenced, table, tx))
        }
    }
}

impl Records {
    /// Deletes one batch of rows past retention, within the operation
    /// timeout; returns how many.
    async fn purge_batch(&self) -> Result<u64, StoreError> {
        let done = self
            .fenced
            .layer
            .timed(Operation::Purge, async {
                sqlx::query(AssertSqlSafe(self.fenced.sql.purge_batch.clone()))
                    .bind(i64::from(self.purge_batch))
                    .execute(&self.pool)
                    .await
                    .map_err(|e| classify(Operation::Purge, e))
            })
            .await?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl IdempotencyStore for Records {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        claim::claim(&self.fenced.sql.claim, &self.pool, request).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        self.fenced.complete_on(&self.pool, lease, response).await
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = validate_lease(extend)?;
        let until: Option<i64> = Fenced::query(&self.fenced.sql.renew, lease)
            .bind(millis(extend))
            .fetch_optional(&self.pool)
            .await
            .and_then(|row| row.map(|row| row.try_get(0)).transpose())
            .map_err(|e| classify(Operation::Renew, e))?;
        let until = until.ok_or(StoreError::LostLease)?;
        Ok(lease.renewed(Timestamp::from_unix_millis(until)))
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        let done = Fenced::query(&self.fenced.sql.release, lease)
            .fetch_one(&self.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| classify(Operation::Release, e))?;
        held(done)
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.fenced
            .checkpoint_on(&self.pool, lease, checkpoint)
            .await
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(AssertSqlSafe(self.fenced.sql.get.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.key().as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(Operation::Get, e))?;
        row.map(|row| record(scope, &row)).transpose()
    }

    /// Each batch is bounded by the operation timeout, not the whole sweep.
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

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let live: Option<bool> = sqlx::query(AssertSqlSafe(self.fenced.sql.delete.clone()))
            .bind(scope.tenant().as_str())
            .bind(scope.key().as_str())
            .fetch_optional(&self.pool)
            .await
            .and_then(|row| row.map(|row| row.try_get(0)).transpose())
            .map_err(|e| classify(Operation::Delete, e))?;
        Ok(live.unwrap_or(false))
    }

    async fn now(&self, _scope: &Scope) -> Result<Timestamp, StoreError> {
        let millis: i64 = sqlx::query(AssertSqlSafe(self.fenced.sql.now.clone()))
            .fetch_one(&self.pool)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| classify(Operation::Now, e))?;
        Ok(Timestamp::from_unix_millis(millis))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(self.fenced.max_response_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::StoreOptions;
    use sqlx::postgres::PgPoolOptions;

    #[tokio::test]
    async fn a_zero_operation_timeout_is_refused_at_construction() {
        // A lazy pool connects on first use, which never comes.
        let pool = PgPoolOptions::new()
            .connect_lazy("postgres://127.0.0.1:1/none")
            .expect("a URL that parses");
        let with_timeout = |limit| {
            PostgresOptions::default()
                .store_options(StoreOptions::default().with_operation_timeout(limit))
        };
        let refused = PostgresStore::with_options(pool.clone(), with_timeout(Duration::ZERO));
        let refused = refused.expect_err("a zero timeout");
        assert!(
            matches!(refused, StoreError::InvalidInput(_))
                && refused
                    .to_string()
                    .contains("operation timeout is out of range"),
            "{refused}"
        );
        let store = PostgresStore::with_options(pool, with_timeout(Duration::from_millis(1)))
            .expect("any limit above zero");
        assert_eq!(
            store.records.layer().timeout(),
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            PostgresStore::new(store.pool().clone())
                .records
                .layer()
                .timeout(),
            Some(StoreOptions::DEFAULT_OPERATION_TIMEOUT)
        );
    }
}
