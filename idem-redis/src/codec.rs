//! What the scripts reply, decoded: a claim's reply into a [`ClaimOutcome`],
//! a record's hash into a [`Record`]. Anything the scripts cannot have
//! written is [`StoreError::Corrupt`], naming the part that does not decode.
//!
//! The hash of a record (written by `lua/*.lua`):
//!
//! | field | holds |
//! |---|---|
//! | `fp` | the fingerprint, 32 raw bytes |
//! | `own` | the owner token, UUID text |
//! | `att` | the attempt |
//! | `st` | `f` in flight, `c` completed |
//! | `lease` | the lease's expiry, unix ms (in flight) |
//! | `exp` | retained until, unix ms (also the key's `PEXPIREAT`) |
//! | `cpn`, `cpd` | the checkpoint's name and JSON data |
//! | `rs`, `rh`, `rb` | the response's status, [encoded headers](idem_core::store::encode_headers) and body |

use std::collections::HashMap;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Lease, OwnerToken, Record, Timestamp, decode_checkpoint,
    decode_response, retry_after_millis,
};
use idem_core::{Checkpoint, Fingerprint, Operation, Scope, StoreError, StoredResponse};
use redis::Value;

use crate::error::corrupt;

/// A bulk or simple string; `None` for nil or anything else.
pub(crate) fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// An integer, or a string holding one.
pub(crate) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        other => std::str::from_utf8(&bytes(other)?).ok()?.parse().ok(),
    }
}

/// `value`, or the corrupt-record error naming `field`.
fn need<T>(value: Option<T>, operation: Operation, field: &'static str) -> Result<T, StoreError> {
    value.ok_or_else(|| corrupt(operation, field))
}

/// An attempt, which a `u32` holds.
fn attempt(value: i64, operation: Operation) -> Result<u32, StoreError> {
    need(u32::try_from(value).ok(), operation, "attempt")
}

/// A checkpoint from its stored name and data, either possibly absent.
fn checkpoint(
    operation: Operation,
    name: Option<Vec<u8>>,
    data: Option<Vec<u8>>,
) -> Result<Option<Checkpoint>, StoreError> {
    let bad = |_| corrupt(operation, "checkpoint");
    let name = name.map(String::from_utf8).transpose().map_err(bad)?;
    let data = data.map(String::from_utf8).transpose().map_err(bad)?;
    decode_checkpoint(name.as_deref(), data.as_deref())
        .map_err(|_| corrupt(operation, "checkpoint"))
}

/// A stored response from its status, encoded headers and body.
fn response(
    operation: Operation,
    status: i64,
    headers: &[u8],
    body: Vec<u8>,
) -> Result<StoredResponse, StoreError> {
    need(
        decode_response(status, headers, body),
        operation,
        "response",
    )
}

/// The outcome of `lua/claim.lua`'s reply to `request`, claimed (if it was)
/// by `owner`.
pub(crate) fn claim_outcome(
    reply: &[Value],
    request: &ClaimRequest,
    owner: OwnerToken,
) -> Result<ClaimOutcome, StoreError> {
    const OP: Operation = Operation::Claim;
    let at = |i: usize| reply.get(i);
    let int_at = |i: usize, field| need(at(i).and_then(int), OP, field);
    let bytes_at = |i: usize, field| need(at(i).and_then(bytes), OP, field);
    match bytes_at(0, "outcome")?.as_slice() {
        b"claimed" => {
            let attempt = attempt(int_at(1, "attempt")?, OP)?;
            let expires_at = Timestamp::from_unix_millis(int_at(2, "lease expiry")?);
            let checkpoint = checkpoint(OP, at(3).and_then(bytes), at(4).and_then(bytes))?;
            let lease = Lease::issued(
                request.scope().clone(),
                owner,
                attempt,
                expires_at,
                request.retention(),
            );
            Ok(ClaimOutcome::Claimed { lease, checkpoint })
        }
        b"in_progress" => Ok(ClaimOutcome::InProgress {
            retry_after: retry_after_millis(int_at(1, "retry after")?),
        }),
        b"completed" => Ok(ClaimOutcome::Completed(response(
            OP,
            int_at(1, "status")?,
            &bytes_at(2, "headers")?,
            bytes_at(3, "body")?,
        )?)),
        b"mismatch" => Ok(ClaimOutcome::Mismatch),
        _ => Err(corrupt(OP, "outcome")),
    }
}

/// The record of `scope` from `lua/get.lua`'s reply: the hash's fields and
/// values in turn, or nothing if the record is absent or past retention.
pub(crate) fn record(scope: &Scope, reply: &[Value]) -> Result<Option<Record>, StoreError> {
    const OP: Operation = Operation::Get;
    if reply.is_empty() {
        return Ok(None);
    }
    let pairs = reply.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return Err(corrupt(OP, "record"));
    }
    let mut fields = HashMap::with_capacity(reply.len() / 2);
    for pair in pairs {
        if let [name, value] = pair {
            fields.insert(need(bytes(name), OP, "field name")?, value);
        }
    }
    let field = |name: &str| fields.get(name.as_bytes()).copied();
    let int_field = |name: &str, what| need(field(name).and_then(int), OP, what);
    let bytes_field = |name: &str, what| need(field(name).and_then(bytes), OP, what);

    let fingerprint = Fingerprint::try_from_slice(&bytes_field("fp", "fingerprint")?)
        .map_err(|_| corrupt(OP, "fingerprint"))?;
    let owner = std::str::from_utf8(&bytes_field("own", "owner")?)
        .ok()
        .and_then(OwnerToken::parse);
    let owner = need(owner, OP, "owner")?;
    let attempt = attempt(int_field("att", "attempt")?, OP)?;
    let retained_until = Timestamp::from_unix_millis(int_field("exp", "retention")?);
    let in_flight = |lease_expires_at| {
        Record::in_flight(
            scope.clone(),
            fingerprint,
            owner,
            attempt,
            lease_expires_at,
            retained_until,
        )
    };
    match bytes_field("st", "state")?.as_slice() {
        b"f" => {
            let lease_expires_at = Timestamp::from_unix_millis(int_field("lease", "lease expiry")?);
            let checkpoint = checkpoint(
                OP,
                field("cpn").and_then(bytes),
                field("cpd").and_then(bytes),
            )?;
            Ok(Some(
                in_flight(lease_expires_at).with_checkpoint(checkpoint),
            ))
        }
        b"c" => {
            let response = response(
                OP,
                int_field("rs", "status")?,
                &bytes_field("rh", "headers")?,
                bytes_field("rb", "body")?,
            )?;
            // A completed record has no lease; the checkpoint it may still
            // hold belonged to the in-flight work and is not reported.
            Ok(Some(
                in_flight(retained_until).completed(response, retained_until),
            ))
        }
        _ => Err(corrupt(OP, "state")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn request() -> ClaimRequest {
        ClaimRequest::new(Scope::parse("t", "k").unwrap(), Fingerprint::of_bytes(b"x"))
    }

    #[test]
    fn claim_replies_decode_to_each_outcome() {
        let owner = OwnerToken::generate();
        let claimed = [
            text("claimed"),
            Value::Int(2),
            Value::Int(5_000),
            Value::Nil,
            Value::Nil,
        ];
        match claim_outcome(&claimed, &request(), owner).unwrap() {
            ClaimOutcome::Claimed { lease, checkpoint } => {
                assert_eq!(
                    (lease.attempt(), lease.owner(), checkpoint),
                    (2, owner, None)
                );
                assert_eq!(lease.expires_at(), Timestamp::from_unix_millis(5_000));
            }
            other => panic!("{other:?}"),
        }
        let busy = [text("in_progress"), Value::Int(0)];
        assert_eq!(
            claim_outcome(&busy, &request(), owner).unwrap(),
            ClaimOutcome::InProgress {
                retry_after: std::time::Duration::from_millis(1)
            }
        );
        let done = [text("completed"), Value::Int(201), text(""), text("ok")];
        assert_eq!(
            claim_outcome(&done, &request(), owner).unwrap(),
            ClaimOutcome::Completed(StoredResponse::new(201, "ok"))
        );
        assert_eq!(
            claim_outcome(&[text("mismatch")], &request(), owner).unwrap(),
            ClaimOutcome::Mismatch
        );
    }

    #[test]
    fn impossible_claim_replies_are_corrupt_naming_the_part() {
        let owner = OwnerToken::generate();
        let field = |reply: &[Value]| match claim_outcome(reply, &request(), owner) {
            Err(StoreError::Corrupt {
                store: "redis",
                operation: Operation::Claim,
                field,
            }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(&[]), "outcome");
        assert_eq!(field(&[text("maybe")]), "outcome");
        assert_eq!(
            field(&[text("claimed"), Value::Int(-1), Value::Int(1)]),
            "attempt"
        );
        let half_checkpoint = [
            text("claimed"),
            Value::Int(1),
            Value::Int(1),
            text("p"),
            Value::Nil,
        ];
        assert_eq!(field(&half_checkpoint), "checkpoint");
        assert_eq!(
            field(&[text("completed"), Value::Int(70_000), text(""), text("")]),
            "response"
        );
    }

    #[test]
    fn record_hashes_decode_by_state() {
        let scope = Scope::parse("t", "k").unwrap();
        let owner = OwnerToken::generate();
        let fp = Fingerprint::of_bytes(b"x");
        let common = [
            text("fp"),
            Value::BulkString(fp.as_bytes().to_vec()),
            text("own"),
            text(&owner.to_string()),
            text("att"),
            text("3"),
            text("exp"),
            text("9000"),
        ];
        let mut in_flight = common.to_vec();
        in_flight.extend([text("st"), text("f"), text("lease"), text("4000")]);
        in_flight.extend([text("cpn"), text("p"), text("cpd"), text("[1]")]);
        let record = record(&scope, &in_flight).unwrap().unwrap();
        assert_eq!((record.owner(), record.attempt()), (owner, 3));
        assert_eq!(
            record.lease_expires_at(),
            Some(Timestamp::from_unix_millis(4_000))
        );
        assert_eq!(record.retained_until(), Timestamp::from_unix_millis(9_000));
        assert_eq!(record.checkpoint().map(Checkpoint::name), Some("p"));

        let mut completed = common.to_vec();
        completed.extend([
            text("st"),
            text("c"),
            text("rs"),
            text("200"),
            text("rh"),
            text(""),
        ]);
        completed.extend([
            text("rb"),
            text("ok"),
            text("cpn"),
            text("p"),
            text("cpd"),
            text("[1]"),
        ]);
        let done = super::record(&scope, &completed).unwrap().unwrap();
        assert_eq!(done.response(), Some(&StoredResponse::new(200, "ok")));
        assert_eq!((done.lease_expires_at(), done.checkpoint()), (None, None));

        assert_eq!(super::record(&scope, &[]).unwrap(), None);
        assert!(matches!(
            super::record(&scope, &common[..3]),
            Err(StoreError::Corrupt {
                field: "record",
                ..
            })
        ));
        assert!(matches!(
            super::record(&scope, &common),
            Err(StoreError::Corrupt { field: "state", .. })
        ));
    }
}
