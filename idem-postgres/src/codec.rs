//! Between the table's rows and the core's values: the claim function's
//! reply, a stored record, and a response's columns.

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Lease, OwnerToken, Record, RecordState, Timestamp,
    decode_checkpoint, decode_response_parts, retry_after_millis,
};
use idem_core::{Fingerprint, Operation, Scope, StoreError, StoredResponse};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;

use crate::error::{classify, corrupt};

/// Reads a column, mapping a driver error to the operation's.
pub(crate) fn column<'r, T>(
    row: &'r PgRow,
    name: &str,
    operation: Operation,
) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name).map_err(|e| classify(operation, e))
}

/// The claim function's reply as an outcome; `owner` is the token the claim sent.
pub(crate) fn claim_outcome(
    row: &PgRow,
    request: &ClaimRequest,
    owner: OwnerToken,
) -> Result<ClaimOutcome, StoreError> {
    let op = Operation::Claim;
    let outcome: String = column(row, "o_outcome", op)?;
    Ok(match outcome.as_str() {
        "claimed" => {
            let attempt: i32 = column(row, "o_attempt", op)?;
            let expires: i64 = column(row, "o_lease_expires_ms", op)?;
            let checkpoint = checkpoint(
                column(row, "o_checkpoint_name", op)?,
                column(row, "o_checkpoint_data", op)?,
                op,
            )?;
            let lease = Lease::issued(
                request.scope().clone(),
                owner,
                u32::try_from(attempt).map_err(|_| corrupt(op, "attempt"))?,
                Timestamp::from_unix_millis(expires),
                request.retention(),
            );
            ClaimOutcome::Claimed { lease, checkpoint }
        }
        "in_progress" => ClaimOutcome::InProgress {
            retry_after: retry_after_millis(column(row, "o_retry_after_ms", op)?),
        },
        "completed" => ClaimOutcome::Completed(response(
            column(row, "o_response_status", op)?,
            column(row, "o_response_header_names", op)?,
            column(row, "o_response_header_values", op)?,
            column(row, "o_response_body", op)?,
            op,
        )?),
        "mismatch" => ClaimOutcome::Mismatch,
        _ => return Err(corrupt(op, "claim outcome")),
    })
}

/// A stored record from the `get` statement's row.
pub(crate) fn record(scope: &Scope, row: &PgRow) -> Result<Record, StoreError> {
    let op = Operation::Get;
    let fingerprint: Vec<u8> = column(row, "fingerprint", op)?;
    let owner: uuid::Uuid = column(row, "owner", op)?;
    let attempt: i32 = column(row, "attempt", op)?;
    let status: String = column(row, "status", op)?;
    let retained_ms: i64 = column(row, "expires_ms", op)?;
    let lease_ms: Option<i64> = column(row, "lease_expires_ms", op)?;
    let state = match status.as_str() {
        "in_flight" => RecordState::InFlight {
            lease_expires_at: Timestamp::from_unix_millis(
                lease_ms.ok_or_else(|| corrupt(op, "lease expiry"))?,
            ),
        },
        "completed" => RecordState::Completed {
            response: response(
                column(row, "response_status", op)?,
                column(row, "response_header_names", op)?,
                column(row, "response_header_values", op)?,
                column(row, "response_body", op)?,
                op,
            )?,
        },
        _ => return Err(corrupt(op, "status")),
    };
    let retained_until = Timestamp::from_unix_millis(retained_ms);
    Ok(Record::in_flight(
        scope.clone(),
        Fingerprint::try_from_slice(&fingerprint).map_err(|_| corrupt(op, "fingerprint"))?,
        OwnerToken::from_uuid(owner),
        u32::try_from(attempt).map_err(|_| corrupt(op, "attempt"))?,
        retained_until,
        retained_until,
    )
    .with_state(state)
    .with_checkpoint(checkpoint(
        column(row, "checkpoint_name", op)?,
        column(row, "checkpoint_data", op)?,
        op,
    )?))
}

fn checkpoint(
    name: Option<String>,
    data: Option<String>,
    op: Operation,
) -> Result<Option<idem_core::Checkpoint>, StoreError> {
    decode_checkpoint(name.as_deref(), data.as_deref()).map_err(|_| corrupt(op, "checkpoint"))
}

/// A stored response from its columns.
fn response(
    status: Option<i32>,
    names: Option<Vec<Vec<u8>>>,
    values: Option<Vec<Vec<u8>>>,
    body: Option<Vec<u8>>,
    op: Operation,
) -> Result<StoredResponse, StoreError> {
    let bad = || corrupt(op, "stored response");
    let (status, names, values, body) = (
        status.ok_or_else(bad)?,
        names.ok_or_else(bad)?,
        values.ok_or_else(bad)?,
        body.ok_or_else(bad)?,
    );
    if names.len() != values.len() {
        return Err(bad());
    }
    decode_response_parts(i64::from(status), names.into_iter().zip(values), body).ok_or_else(bad)
}

/// Binds a stored response's columns: status, header names, header values, body.
pub(crate) fn bind_response<'q>(
    query: Query<'q, sqlx::Postgres, PgArguments>,
    response: &'q StoredResponse,
) -> Query<'q, sqlx::Postgres, PgArguments> {
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
