//! What the record decoders' targets share.

use arbitrary::{Result as Generated, Unstructured};
use idem_core::store::decode_checkpoint;
use idem_core::{Checkpoint, Operation, StoreError};

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

/// JSON texts, well-formed or not, for the stored documents.
const JSON: &[&str] = &[
    "{\"id\":7}",
    "[1,2.5,-0]",
    "null",
    "\"é\"",
    "1e400",
    "{",
    "",
    "[1]]",
];

/// A checkpoint's name and data as stored, and what it decodes to (`None`
/// if the pair is not a checkpoint, which makes the record corrupt).
pub fn checkpoint(u: &mut Unstructured<'_>) -> Generated<(String, String, Option<Checkpoint>)> {
    let name = if u.arbitrary()? {
        "charged".to_owned()
    } else {
        u.arbitrary()?
    };
    let data = if u.ratio(3, 4)? {
        (*u.choose(JSON)?).to_owned()
    } else {
        u.arbitrary()?
    };
    let decoded = decode_checkpoint(Some(&name), Some(&data)).ok().flatten();
    Ok((name, data, decoded))
}

/// Words a stored field is likely to hold, or nearly: states, numbers at
/// their edges, JSON, an id, field names.
pub const WORDS: &[&str] = &[
    "claimed",
    "in_progress",
    "completed",
    "mismatch",
    "fp",
    "own",
    "att",
    "st",
    "lease",
    "exp",
    "cpn",
    "cpd",
    "rs",
    "rh",
    "rb",
    "f",
    "c",
    "0",
    "1",
    "-1",
    "200",
    "4294967296",
    "{}",
    "[1]",
    "9000",
    "1e3",
    "-0",
    " 1",
    "{\"a\":1}",
    "null",
    "00000000-0000-0000-0000-000000000000",
];
