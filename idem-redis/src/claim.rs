//! The claim: one `EVALSHA` of `lua/claim.lua`, one round trip for every outcome.

use idem_core::store::{ClaimOutcome, ClaimRequest, millis};
use idem_core::{Operation, StoreError};
use redis::Value;
use redis::aio::ConnectionLike;

use crate::codec::claim_outcome;
use crate::commands::SCRIPTS;
use crate::error::classify;

/// Claims `request` under the record key `key`, as the request's owner.
pub(crate) async fn claim<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    request: &ClaimRequest,
) -> Result<ClaimOutcome, StoreError> {
    let owner = request.owner();
    let reply: Vec<Value> = SCRIPTS
        .claim
        .key(key)
        .arg(request.fingerprint().as_bytes().as_slice())
        .arg(owner.to_string())
        .arg(millis(request.lease()))
        .arg(millis(request.retention()))
        .invoke_async(conn)
        .await
        .map_err(|e| classify(Operation::Claim, e))?;
    claim_outcome(&reply, request, owner)
}
