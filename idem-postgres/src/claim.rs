//! The claim: one call of the `<table>_claim` function that `migrate()`
//! installs (see `migrations/0001_idem_records.sql`), one round trip for
//! every outcome.

use idem_core::Operation;
use idem_core::StoreError;
use idem_core::store::{ClaimOutcome, ClaimRequest, millis};
use sqlx::{AssertSqlSafe, PgExecutor};

use crate::codec::claim_outcome;
use crate::error::classify;

/// Runs the claim function on `executor` (a pool, or the caller's connection).
pub(crate) async fn claim<'e>(
    sql: &std::sync::Arc<str>,
    executor: impl PgExecutor<'e>,
    request: &ClaimRequest,
) -> Result<ClaimOutcome, StoreError> {
    let owner = request.owner();
    let row = sqlx::query(AssertSqlSafe(sql.clone()))
        .bind(request.scope().tenant().as_str())
        .bind(request.scope().key().as_str())
        .bind(request.fingerprint().as_bytes().as_slice())
        .bind(owner.as_uuid())
        .bind(millis(request.lease()))
        .bind(millis(request.retention()))
        .fetch_one(executor)
        .await
        .map_err(|e| classify(Operation::Claim, e))?;
    claim_outcome(&row, request, owner)
}
