//! The claim: one conditional `UpdateItem`, one round trip for every outcome.
//!
//! The update succeeds when the item is absent, past retention, or in flight
//! with an expired lease and the same fingerprint (a takeover); it writes the
//! new owner and lease, and `att = if_not_exists(att, 0) + 1` numbers the
//! attempt. `ReturnValues = ALL_OLD` hands back the item it replaced, which
//! tells a takeover (attempt and checkpoint carried) from a fresh claim.
//! When the condition fails, `ReturnValuesOnConditionCheckFailure = ALL_OLD`
//! hands back the item that stopped it, and in progress, replay or mismatch
//! are decided from that, without a read.
//!
//! A `PutItem` cannot number a takeover (it would have to know the old
//! attempt), hence `UpdateItem`. One case costs a second request: an
//! abandoned in-flight item past retention that DynamoDB TTL has not yet
//! deleted, whose attempt and checkpoint the update carried over; the claim
//! resets them, fenced on its own new owner.

use std::time::Duration;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{ReturnValue, ReturnValuesOnConditionCheckFailure};
use idem_core::{ClaimOutcome, ClaimRequest, Lease, OwnerToken, StoreError, Timestamp};

use crate::error::{classify, corrupt};
use crate::item::{self, Item, attr, b, get_b, get_n, get_s, n, s};
use crate::store::DynamoStore;

impl DynamoStore {
    pub(crate) async fn claim_item(
        &self,
        request: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        let now = self.now();
        let owner = OwnerToken::generate();
        let lease_until = now + request.lease_ttl();
        let expires = now + request.record_ttl();
        let sent = self
            .client
            .update_item()
            .table_name(self.table.as_str())
            .key(attr::PK, s(crate::item_key(request.scope())))
            .update_expression(crate::expressions::CLAIM_UPDATE)
            .condition_expression(crate::expressions::CLAIM_CONDITION)
            .expression_attribute_names("#exp", attr::EXPIRES)
            .expression_attribute_names("#ttl", attr::TTL)
            .expression_attribute_values(":fp", b(request.fingerprint().as_bytes().to_vec()))
            .expression_attribute_values(":own", s(owner.to_string()))
            .expression_attribute_values(":f", s("f"))
            .expression_attribute_values(":lease", n(lease_until.as_unix_millis()))
            .expression_attribute_values(":exp", n(expires.as_unix_millis()))
            .expression_attribute_values(":ttl", n(expires.as_unix_secs_ceil()))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":tenant", s(request.scope().tenant().as_str()))
            .expression_attribute_values(":k", s(request.scope().key().as_str()))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(output) => {
                let lease = |attempt| {
                    Lease::issued(
                        request.scope().clone(),
                        owner,
                        attempt,
                        lease_until,
                        request.retention(),
                    )
                };
                match output.attributes() {
                    // A takeover: the old item was live, so the update numbered
                    // the attempt and kept the checkpoint.
                    Some(old) if item::is_live(old, now) => {
                        let attempt =
                            get_n(old, attr::ATTEMPT).ok_or_else(|| corrupt(attr::ATTEMPT))?;
                        let attempt = u32::try_from(attempt.saturating_add(1))
                            .map_err(|_| corrupt(attr::ATTEMPT))?;
                        Ok(ClaimOutcome::Claimed {
                            lease: lease(attempt),
                            checkpoint: item::checkpoint(old)?,
                        })
                    }
                    Some(old) => {
                        if old.contains_key(attr::ATTEMPT)
                            || old.contains_key(attr::CHECKPOINT_NAME)
                        {
                            self.reset_lingering(request, owner).await?;
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
            Err(error) => match error.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                    let old = failed
                        .item()
                        .ok_or_else(|| corrupt("condition failure without the old item"))?;
                    decide_refusal(old, request, now)
                }
                _ => Err(classify("claim", error)),
            },
        }
    }

    /// Counts a claim over an abandoned item past retention from attempt 1,
    /// without the stale checkpoint (the second request of the rare case).
    async fn reset_lingering(
        &self,
        request: &ClaimRequest,
        owner: OwnerToken,
    ) -> Result<(), StoreError> {
        self.client
            .update_item()
            .table_name(self.table.as_str())
            .key(attr::PK, s(crate::item_key(request.scope())))
            .update_expression("SET att = :one REMOVE cpn, cpd")
            .condition_expression("own = :own")
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":own", s(owner.to_string()))
            .send()
            .await
            .map_err(|e| classify("claim reset", e))?;
        Ok(())
    }
}

/// The answer when the claim's condition failed, from the item that failed it.
fn decide_refusal(
    old: &Item,
    request: &ClaimRequest,
    now: Timestamp,
) -> Result<ClaimOutcome, StoreError> {
    if get_b(old, attr::FINGERPRINT) != Some(request.fingerprint().as_bytes().as_slice()) {
        return Ok(ClaimOutcome::Mismatch);
    }
    match get_s(old, attr::STATUS) {
        Some("c") => Ok(ClaimOutcome::Completed(item::response(old)?)),
        Some("f") => {
            let lease = get_n(old, attr::LEASE).ok_or_else(|| corrupt(attr::LEASE))?;
            let remaining = lease.saturating_sub(now.as_unix_millis());
            Ok(ClaimOutcome::InProgress {
                retry_after: Duration::from_millis(u64::try_from(remaining).unwrap_or(0).max(1)),
            })
        }
        _ => Err(corrupt(attr::STATUS)),
    }
}
