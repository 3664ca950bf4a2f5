//! **Not part of the API**: the decoders of what the scripts reply, for the
//! fuzz targets in `fuzz/` and the corrupt-record property tests in
//! `tests/fuzz-props`. Only with the `fuzzing` feature; may change or vanish
//! in any release.
//!
//! Each is a thin wrapper over the store's own codec: whatever the reply
//! holds, the answer is a value or [`StoreError::Corrupt`], never a panic.

use idem_core::store::{ClaimOutcome, ClaimRequest, Record};
use idem_core::{Scope, StoreError};
use redis::Value;

/// `lua/claim.lua`'s reply to `request`, decoded as the claim does (the
/// claim sent `request`'s owner).
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the part that does not decode.
pub fn claim_reply(reply: &[Value], request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
    crate::codec::claim_outcome(reply, request, request.owner())
}

/// `lua/get.lua`'s reply for `scope` (a record's hash, its fields and values
/// in turn), decoded as `get` does.
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the part that does not decode.
pub fn record_hash(scope: &Scope, reply: &[Value]) -> Result<Option<Record>, StoreError> {
    crate::codec::record(scope, reply)
}
