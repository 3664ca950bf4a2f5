//! The fenced writes that `PostgresStore` and `PgTransaction` share (on the
//! pool, or inside the caller's transaction), and the bound every call to
//! the database gets.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Lease, check_response_size, checkpoint_json, millis, with_timeout};
use idem_core::{Checkpoint, Operation, StoreError, StoredResponse};
use sqlx::{AssertSqlSafe, PgExecutor, Row};

use crate::codec::bind_response;
use crate::commands::Statements;
use crate::error::{STORE, classify};

/// The statements and limits of one store, cheap to clone.
#[derive(Clone)]
pub(crate) struct Fenced {
    pub(crate) sql: Arc<Statements>,
    max_response_bytes: usize,
    operation_timeout: Duration,
}

/// `LostLease` unless the fenced statement found the lease's record.
pub(crate) fn held(done: bool) -> Result<(), StoreError> {
    if done {
        Ok(())
    } else {
        Err(StoreError::LostLease)
    }
}

impl Fenced {
    pub(crate) fn new(
        sql: Arc<Statements>,
        max_response_bytes: usize,
        operation_timeout: Duration,
    ) -> Self {
        Self {
            sql,
            max_response_bytes,
            operation_timeout,
        }
    }

    pub(crate) fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    pub(crate) fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// Runs `operation` within the operation timeout: the one place every
    /// call to the database is bounded.
    pub(crate) async fn timed<T>(
        &self,
        operation: Operation,
        future: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        with_timeout(STORE, operation, self.operation_timeout, future).await
    }

    /// A fenced statement with the lease's tenant, key and owner bound.
    pub(crate) fn query<'q>(
        sql: &Arc<str>,
        lease: &'q Lease,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(lease.scope().tenant().as_str())
            .bind(lease.scope().key().as_str())
            .bind(lease.owner().as_uuid())
    }

    /// Completes the lease's record on `executor` (the pool, or a
    /// transaction), within the operation timeout.
    pub(crate) async fn complete_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        check_response_size(response, self.max_response_bytes)?;
        let query = Self::query(&self.sql.complete, lease).bind(millis(lease.retention()));
        let done = self
            .timed(Operation::Complete, async {
                bind_response(query, response)
                    .fetch_one(executor)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(|e| classify(Operation::Complete, e))
            })
            .await?;
        held(done)
    }

    /// Writes a checkpoint on the lease's record on `executor`, within the
    /// operation timeout.
    pub(crate) async fn checkpoint_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let done = self
            .timed(Operation::Checkpoint, async {
                Self::query(&self.sql.checkpoint, lease)
                    .bind(checkpoint.name())
                    .bind(checkpoint_json(checkpoint))
                    .execute(executor)
                    .await
                    .map_err(|e| classify(Operation::Checkpoint, e))
            })
            .await?;
        held(done.rows_affected() == 1)
    }
}
