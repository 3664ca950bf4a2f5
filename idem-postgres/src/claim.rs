//! The claim: one call of the `<table>_claim` function that `migrate()`
//! installs (see `migrations/0001_idem_records.sql`), one round trip for
//! every outcome.

use idem_core::Operation;
use idem_core::StoreError;
use idem_core::StoredResponse;
use idem_core::store::{ClaimOutcome, ClaimRequest, millis};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, PgExecutor, Postgres, Row};

use crate::codec::{bind_response, claim_outcome};
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

/// `sql` with the requests' columns bound, one array each, in their order.
fn bound_requests<'q>(
    sql: &std::sync::Arc<str>,
    requests: &'q [ClaimRequest],
) -> Query<'q, Postgres, PgArguments> {
    let tenants: Vec<&str> = requests
        .iter()
        .map(|r| r.scope().tenant().as_str())
        .collect();
    let keys: Vec<&str> = requests.iter().map(|r| r.scope().key().as_str()).collect();
    let fingerprints: Vec<Vec<u8>> = requests
        .iter()
        .map(|r| r.fingerprint().as_bytes().to_vec())
        .collect();
    let owners: Vec<_> = requests.iter().map(|r| r.owner().as_uuid()).collect();
    let leases: Vec<i64> = requests.iter().map(|r| millis(r.lease())).collect();
    let retentions: Vec<i64> = requests.iter().map(|r| millis(r.retention())).collect();
    sqlx::query(AssertSqlSafe(sql.clone()))
        .bind(tenants)
        .bind(keys)
        .bind(fingerprints)
        .bind(owners)
        .bind(leases)
        .bind(retentions)
}

/// The rows a claim function answers.
async fn answered<'e>(
    query: Query<'_, Postgres, PgArguments>,
    executor: impl PgExecutor<'e>,
) -> Result<Vec<PgRow>, StoreError> {
    query
        .fetch_all(executor)
        .await
        .map_err(|e| classify(Operation::Claim, e))
}

/// Why a function meant to answer one row per request answered another
/// count.
fn counted(rows: &[PgRow], requests: &[ClaimRequest]) -> Result<(), StoreError> {
    if rows.len() == requests.len() {
        return Ok(());
    }
    Err(StoreError::backend(
        crate::error::STORE,
        Operation::Claim,
        format!(
            "the claim function answered {} rows for {} claims",
            rows.len(),
            requests.len()
        ),
    ))
}

/// Runs the claim function on each request at once, in their order, on
/// `executor` (the caller's transaction): one statement for them all.
pub(crate) async fn claim_all<'e>(
    sql: &std::sync::Arc<str>,
    executor: impl PgExecutor<'e>,
    requests: &[ClaimRequest],
) -> Result<Vec<ClaimOutcome>, StoreError> {
    let rows = answered(bound_requests(sql, requests), executor).await?;
    counted(&rows, requests)?;
    rows.iter()
        .zip(requests)
        .map(|(row, request)| claim_outcome(row, request, request.owner()))
        .collect()
}

/// Runs the `<table>_claim_completed` function on `executor` (the
/// caller's transaction): each free request's record written once,
/// completed with `response`; `None` for those, the claim's answer for the
/// others. The requests name each scope once (the caller checks).
pub(crate) async fn claim_completed_all<'e>(
    sql: &std::sync::Arc<str>,
    executor: impl PgExecutor<'e>,
    requests: &[ClaimRequest],
    response: &StoredResponse,
) -> Result<Vec<Option<ClaimOutcome>>, StoreError> {
    let query = bind_response(bound_requests(sql, requests), response);
    let rows = answered(query, executor).await?;
    let outcome = |row: &PgRow| -> Result<String, StoreError> {
        row.try_get("o_outcome")
            .map_err(|e| classify(Operation::Claim, e))
    };
    // Every request recorded (a consumer's batch, as a rule): one row.
    if let [row] = rows.as_slice()
        && outcome(row)? == "recorded_all"
    {
        return Ok(vec![None; requests.len()]);
    }
    counted(&rows, requests)?;
    rows.iter()
        .zip(requests)
        .map(|(row, request)| {
            if outcome(row)? == "recorded" {
                return Ok(None);
            }
            claim_outcome(row, request, request.owner()).map(Some)
        })
        .collect()
}
