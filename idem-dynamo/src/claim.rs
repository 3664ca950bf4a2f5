//! The claim: one conditional `UpdateItem`, one round trip for every outcome.
//!
//! The update succeeds when the item is absent, past retention, or in flight
//! with an expired lease, the same fingerprint and another owner (a
//! takeover); it writes the new owner and lease, and
//! `att = if_not_exists(att, 0) + 1` numbers the attempt. `ReturnValues = ALL_OLD` hands back the item it replaced, which
//! tells a takeover (attempt and checkpoint carried) from a fresh claim.
//! When the condition fails, `ReturnValuesOnConditionCheckFailure = ALL_OLD`
//! hands back the item that stopped it; decoded into a record, the core's
//! decision table answers in progress, replay or mismatch from it, without a
//! read.
//!
//! A `PutItem` cannot number a takeover (it would have to know the old
//! attempt), hence `UpdateItem`. One case costs a second request: an
//! abandoned in-flight item past retention that DynamoDB TTL has not yet
//! deleted, whose attempt and checkpoint the update carried over; the claim
//! resets them, fenced on its own new owner.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::store::{ClaimOutcome, ClaimRequest, Lease, OwnerToken, Record, Timestamp, decide};
use idem_core::{Operation, StoreError};

use crate::codec::{self, IN_FLIGHT, attr, b, get_n, key, n, s};
use crate::commands::{CLAIM_CONDITION, CLAIM_UPDATE, RESET_CONDITION, RESET_UPDATE};
use crate::error::{STORE, classify, corrupt};

const OP: Operation = Operation::Claim;

/// Decides and records one claim of `request` on `table`, judged at `now`.
pub(crate) async fn claim(
    client: &Client,
    table: &str,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<ClaimOutcome, StoreError> {
    let owner = request.owner();
    let lease_until = now + request.lease();
    let retained_until = now + request.claim_retention();
    let scope = request.scope();
    let sent = client
        .update_item()
        .table_name(table)
        .key(attr::PK, key(scope))
        .update_expression(CLAIM_UPDATE)
        .condition_expression(CLAIM_CONDITION)
        .expression_attribute_names("#exp", attr::EXPIRES)
        .expression_attribute_names("#ttl", attr::TTL)
        .expression_attribute_values(":fp", b(request.fingerprint().as_bytes().to_vec()))
        .expression_attribute_values(":own", s(owner.to_string()))
        .expression_attribute_values(":f", s(IN_FLIGHT))
        .expression_attribute_values(":lease", n(lease_until.as_unix_millis()))
        .expression_attribute_values(":exp", n(retained_until.as_unix_millis()))
        .expression_attribute_values(":ttl", n(retained_until.as_unix_secs_ceil()))
        .expression_attribute_values(":zero", n(0))
        .expression_attribute_values(":one", n(1))
        .expression_attribute_values(":now", n(now.as_unix_millis()))
        .expression_attribute_values(":tenant", s(scope.tenant().as_str()))
        .expression_attribute_values(":k", s(scope.key().as_str()))
        .return_values(ReturnValue::AllOld)
        .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
        .send()
        .await;
    let output = match sent {
        Ok(output) => output,
        Err(error) => {
            return match error.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let old = failed.item().ok_or_else(|| {
                        StoreError::backend(STORE, OP, "the condition failed without the item")
                    })?;
                    refused(&codec::record(scope, old, OP)?, request, now)
                }
                _ => Err(classify(OP, error)),
            };
        }
    };
    let lease = |attempt| {
        Lease::issued(
            scope.clone(),
            owner,
            attempt,
            lease_until,
            request.retention(),
        )
    };
    match output.attributes() {
        // A takeover: the old item was live, so the update numbered the
        // attempt and kept the checkpoint.
        Some(old) if codec::is_live(old, now) => {
            let attempt = get_n(old, attr::ATTEMPT)
                .and_then(|a| u32::try_from(a.saturating_add(1)).ok())
                .ok_or_else(|| corrupt(OP, "attempt"))?;
            Ok(ClaimOutcome::Claimed {
                lease: lease(attempt),
                checkpoint: codec::checkpoint(old, OP)?,
            })
        }
        Some(old) => {
            if old.contains_key(attr::ATTEMPT) || old.contains_key(attr::CHECKPOINT_NAME) {
                reset_lingering(client, table, request, owner).await?;
            }
            Ok(ClaimOutcome::Claimed {
                lease: lease(1),
                checkpoint: None,
            })
        }
        None => Ok(ClaimOutcome::Claimed {
            lease: lease(1),
            checkpoint: None,
        }),
    }
}

/// The answer when the claim's condition refused `old`: the decision table's
/// for that record. The condition refuses exactly what the table does not
/// claim afresh, so a `Claimed` here is either this very claim delivered
/// again (the item is already this owner's) or an item and a condition that
/// disagree.
fn refused(
    old: &Record,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<ClaimOutcome, StoreError> {
    match decide(Some(old), request, now).outcome {
        ClaimOutcome::Claimed { .. } if old.owner() != request.owner() => Err(StoreError::backend(
            STORE,
            OP,
            "the claim's condition refused an item that the decision table claims",
        )),
        answer => Ok(answer),
    }
}

/// Counts a claim over an abandoned item past retention from attempt 1,
/// without the stale checkpoint (the second request of the rare case).
async fn reset_lingering(
    client: &Client,
    table: &str,
    request: &ClaimRequest,
    owner: OwnerToken,
) -> Result<(), StoreError> {
    client
        .update_item()
        .table_name(table)
        .key(attr::PK, key(request.scope()))
        .update_expression(RESET_UPDATE)
        .condition_expression(RESET_CONDITION)
        .expression_attribute_values(":one", n(1))
        .expression_attribute_values(":own", s(owner.to_string()))
        .send()
        .await
        .map_err(|e| classify(OP, e))?;
    Ok(())
}
