//! **Not part of the API**: the decoders of the items DynamoDB hands back,
//! for the fuzz targets in `fuzz/` and the corrupt-record property tests in
//! `tests/fuzz-props`. Only with the `fuzzing` feature; may change or vanish
//! in any release.
//!
//! Each is a thin wrapper over the store's own codec: whatever the item
//! holds, the answer is a value or [`StoreError::Corrupt`], never a panic.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::store::{Record, Timestamp};
use idem_core::{Checkpoint, Operation, Scope, StoreError};

/// An item as the SDK hands it over.
pub type Item = HashMap<String, AttributeValue>;

/// The record of `scope` an item holds, decoded as `get` does.
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the attribute that does not decode.
pub fn record(scope: &Scope, item: &Item) -> Result<Record, StoreError> {
    crate::codec::record(scope, item, Operation::Get)
}

/// The item a claim's condition refused (`ALL_OLD` on the condition
/// failure), decoded as the claim does before the decision table answers.
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the attribute that does not decode.
pub fn refused_item(scope: &Scope, item: &Item) -> Result<Record, StoreError> {
    crate::codec::record(scope, item, Operation::Claim)
}

/// The checkpoint of the item a takeover replaced, as the claim reads it.
///
/// # Errors
///
/// [`StoreError::Corrupt`] if the checkpoint attributes do not decode.
pub fn takeover_checkpoint(item: &Item) -> Result<Option<Checkpoint>, StoreError> {
    crate::codec::checkpoint(item, Operation::Claim)
}

/// Whether an item is still live at `now`, as every decision asks.
pub fn is_live(item: &Item, now: Timestamp) -> bool {
    crate::codec::is_live(item, now)
}
