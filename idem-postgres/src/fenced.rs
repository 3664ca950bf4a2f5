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

    /// Completes every lease's record at once on `executor` (the caller's
    /// transaction), each response without headers: `LostLease` unless
    /// every record was live, in flight and its lease's owner's. The
    /// caller's layer bounds it.
    pub(crate) async fn complete_all_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        completions: &[(Lease, StoredResponse)],
    ) -> Result<(), StoreError> {
        let mut columns = CompletionColumns::default();
        for (lease, response) in completions {
            check_response_size(response, self.max_response_bytes)?;
            columns.tenants.push(lease.scope().tenant().as_str());
            columns.keys.push(lease.scope().key().as_str());
            columns.owners.push(lease.owner().as_uuid());
            columns.retentions.push(millis(lease.retention()));
            columns.statuses.push(i32::from(response.status()));
            columns.bodies.push(response.body());
        }
        let completed: i64 = sqlx::query(AssertSqlSafe(self.sql.complete_all.clone()))
            .bind(columns.tenants)
            .bind(columns.keys)
            .bind(columns.owners)
            .bind(columns.retentions)
            .bind(columns.statuses)
            .bind(columns.bodies)
            .fetch_one(executor)
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| classify(Operation::Complete, e))?;
        held(usize::try_from(completed).is_ok_and(|n| n == completions.len()))
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

/// The columns of a completion of many records, one array each.
#[derive(Default)]
struct CompletionColumns<'a> {
    tenants: Vec<&'a str>,
    keys: Vec<&'a str>,
    owners: Vec<uuid::Uuid>,
    retentions: Vec<i64>,
    statuses: Vec<i32>,
    bodies: Vec<&'a [u8]>,
}
