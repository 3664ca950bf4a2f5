//! The claim: one call of the `<table>_claim` function that `migrate()`
//! installs (see `migrations/0001_idem_records.sql`), one round trip for
//! every outcome.

use std::time::Duration;

use idem_core::{
    Checkpoint, ClaimOutcome, ClaimRequest, Lease, OwnerToken, StoreError, StoredResponse,
    Timestamp,
};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgExecutor, Row};

use crate::error::{classify, corrupt};

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs the claim function on `executor` (a pool, or the caller's connection).
pub(crate) async fn claim<'e>(
    sql: &std::sync::Arc<str>,
    executor: impl PgExecutor<'e>,
    request: &ClaimRequest,
) -> Result<ClaimOutcome, StoreError> {
    let owner = OwnerToken::generate();
    let row = sqlx::query(AssertSqlSafe(sql.clone()))
        .bind(request.scope().tenant().as_str())
        .bind(request.scope().key().as_str())
        .bind(request.fingerprint().as_bytes().as_slice())
        .bind(owner.as_uuid())
        .bind(millis(request.lease_ttl()))
        .bind(millis(request.retention()))
        .fetch_one(executor)
        .await
        .map_err(|e| classify("claim", e))?;
    decode(&row, request, owner).map_err(|e| match e {
        DecodeError::Driver(e) => classify("claim decode", e),
        DecodeError::Corrupt(what) => corrupt(what),
    })
}

enum DecodeError {
    Driver(sqlx::Error),
    Corrupt(&'static str),
}

impl From<sqlx::Error> for DecodeError {
    fn from(e: sqlx::Error) -> Self {
        Self::Driver(e)
    }
}

fn decode(
    row: &PgRow,
    request: &ClaimRequest,
    owner: OwnerToken,
) -> Result<ClaimOutcome, DecodeError> {
    let outcome: String = row.try_get("o_outcome")?;
    Ok(match outcome.as_str() {
        "claimed" => {
            let attempt: i32 = row.try_get("o_attempt")?;
            let expires: i64 = row.try_get("o_lease_expires_ms")?;
            let checkpoint = match (
                row.try_get::<Option<String>, _>("o_checkpoint_name")?,
                row.try_get::<Option<String>, _>("o_checkpoint_data")?,
            ) {
                (Some(name), Some(data)) => Some(
                    Checkpoint::from_json(name, &data)
                        .map_err(|_| DecodeError::Corrupt("checkpoint"))?,
                ),
                _ => None,
            };
            let lease = Lease::issued(
                request.scope().clone(),
                owner,
                u32::try_from(attempt).map_err(|_| DecodeError::Corrupt("attempt"))?,
                Timestamp::from_unix_millis(expires),
                request.retention(),
            );
            ClaimOutcome::Claimed { lease, checkpoint }
        }
        "in_progress" => {
            let ms: i64 = row.try_get("o_retry_after_ms")?;
            ClaimOutcome::InProgress {
                retry_after: Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1)),
            }
        }
        "completed" => ClaimOutcome::Completed(
            decode_response(
                row.try_get("o_response_status")?,
                row.try_get("o_response_header_names")?,
                row.try_get("o_response_header_values")?,
                row.try_get("o_response_body")?,
            )
            .ok_or(DecodeError::Corrupt("stored response"))?,
        ),
        "mismatch" => ClaimOutcome::Mismatch,
        _ => return Err(DecodeError::Corrupt("claim outcome")),
    })
}

/// A stored response from its columns; `None` if they do not form one.
pub(crate) fn decode_response(
    status: Option<i32>,
    names: Option<Vec<Vec<u8>>>,
    values: Option<Vec<Vec<u8>>>,
    body: Option<Vec<u8>>,
) -> Option<StoredResponse> {
    let status = u16::try_from(status?).ok()?;
    let (names, values) = (names?, values?);
    if names.len() != values.len() {
        return None;
    }
    let mut response = StoredResponse::new(status, body?);
    for (name, value) in names.into_iter().zip(values) {
        response = response.with_header(String::from_utf8(name).ok()?, value);
    }
    Some(response)
}

/// Binds a stored response's columns: status, header names, header values, body.
pub(crate) fn bind_response<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    response: &'q StoredResponse,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let names: Vec<&[u8]> = response
        .headers()
        .iter()
        .map(|(n, _)| n.as_bytes())
        .collect();
    let values: Vec<&[u8]> = response
        .headers()
        .iter()
        .map(|(_, v)| v.as_slice())
        .collect();
    query
        .bind(i32::from(response.status()))
        .bind(names)
        .bind(values)
        .bind(response.body())
}
