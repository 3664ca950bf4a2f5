//! What the record decoders' targets share.

use idem_core::{Operation, StoreError};

/// Passes a decoder's answer that is a value, or the `Corrupt` of `store`'s
/// `operation`; anything else is a finding.
///
/// # Panics
///
/// On any other error: that is what the fuzzer looks for.
pub fn decoded_or_corrupt<T>(
    result: Result<T, StoreError>,
    store: &'static str,
    operation: Operation,
) {
    match result {
        Ok(_) => {}
        Err(StoreError::Corrupt {
            store: named,
            operation: op,
            ..
        }) if named == store && op == operation => {}
        Err(other) => panic!("not a Corrupt of {store} {operation:?}: {other:?}"),
    }
}
