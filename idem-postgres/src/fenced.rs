//! The fenced writes that `PostgresStore` and `PgTransaction` share (on the
//! pool, or inside the caller's transaction), and the layer every call to
//! the database goes through.

use std::sync::Arc;

use idem_core::store::{Lease, OperationLayer, check_response_size, checkpoint_json, millis};
use idem_core::{Checkpoint, Operation, StoreError, StoredResponse};
use sqlx::{AssertSqlSafe, PgExecutor, Row};

use crate::codec::bind_response;
use crate::commands::Statements;
use crate::error::classify;

/// The statements, limit and layer of one store, cheap to clone.
#[derive(Clone)]
pub(crate) struct Fenced {
    pub(crate) sql: Arc<Statements>,
    max_response_bytes: usize,
    /// Times, traces and counts what the store's own [`Layered`] does not
    /// wrap: transactions, `claim_in`, purge batches.
    ///
    /// [`Layered`]: idem_core::store::Layered
    pub(crate) layer: OperationLayer,
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
        layer: OperationLayer,
    ) -> Self {
        Self {
            sql,
            max_response_bytes,
            layer,
        }
    }

    pub(crate) fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
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
    /// transaction); the caller's layer bounds it.
    pub(crate) async fn complete_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        check_response_size(response, self.max_response_bytes)?;
        let query = Self::query(&self.sql.complete, lease).bind(millis(lease.retention()));
        let done = bind_response(query, response)
            .fetch_one(executor)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| classify(Operation::Complete, e))?;
        held(done)
    }

    /// Writes a checkpoint on the lease's record on `executor`; the caller's
    /// layer bounds it.
    pub(crate) async fn checkpoint_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let done = Self::query(&self.sql.checkpoint, lease)
            .bind(checkpoint.name())
            .bind(checkpoint_json(checkpoint))
            .execute(executor)
            .await
            .map_err(|e| classify(Operation::Checkpoint, e))?;
        held(done.rows_affected() == 1)
    }
}
