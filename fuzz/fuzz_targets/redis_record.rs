//! The Redis store's reply decoders on any reply: a claim's reply
//! (`lua/claim.lua`) and a record's hash (`lua/get.lua`) decode to a value or
//! to `StoreError::Corrupt`, never a panic, whatever the server sent; what
//! the scripts write decodes to exactly what they wrote.
//!
//! Input: driven through `arbitrary`. Half the inputs are replies as the
//! scripts write them, from a record made of the input, then changed a few
//! times (a field dropped, replaced, retyped, repeated, one added); the rest
//! are any values, biased towards the words the scripts write.
#![no_main]

use std::time::Duration;

use arbitrary::{Result, Unstructured};
use idem_core::store::{
    ClaimOutcome, ClaimRequest, Lease, OwnerToken, Record, Timestamp, encode_headers,
    retry_after_millis,
};
use idem_core::{Fingerprint, Operation, Scope, StoredResponse};
use idem_fuzz::{WORDS, checkpoint, decoded_or_corrupt};
use idem_redis::fuzzing::{claim_reply, record_hash};
use idem_redis::redis::{self, Value};
use libfuzzer_sys::fuzz_target;

fn text(u: &mut Unstructured<'_>) -> Result<Vec<u8>> {
    Ok(match u.int_in_range(0..=4)? {
        0 | 1 => u.choose(WORDS)?.as_bytes().to_vec(),
        2 => Fingerprint::of_bytes(u.arbitrary::<&[u8]>()?)
            .as_bytes()
            .to_vec(),
        3 => owner(u)?.to_string().into_bytes(),
        _ => u.arbitrary()?,
    })
}

fn owner(u: &mut Unstructured<'_>) -> Result<OwnerToken> {
    Ok(OwnerToken::from_slice(&u.arbitrary::<[u8; 16]>()?).unwrap_or_else(OwnerToken::generate))
}

fn value(u: &mut Unstructured<'_>, depth: u32) -> Result<Value> {
    let nested = depth < 3;
    Ok(match u.int_in_range(0..=12)? {
        0 => Value::Nil,
        1 => Value::Int(u.arbitrary()?),
        2 => Value::Int(u.int_in_range(-2..=70_000)?),
        3..=5 => Value::BulkString(text(u)?),
        6 => Value::SimpleString(String::from_utf8_lossy(&text(u)?).into_owned()),
        7 => Value::Okay,
        8 => Value::Double(u.arbitrary()?),
        9 => Value::Boolean(u.arbitrary()?),
        10 if nested => Value::Array(values(u, depth + 1)?),
        11 if nested => Value::Set(values(u, depth + 1)?),
        12 if nested => {
            let keys = values(u, depth + 1)?;
            let mut pairs = Vec::with_capacity(keys.len());
            for key in keys {
                pairs.push((key, value(u, depth + 1)?));
            }
            Value::Map(pairs)
        }
        _ => Value::BulkString(u.arbitrary()?),
    })
}

fn values(u: &mut Unstructured<'_>, depth: u32) -> Result<Vec<Value>> {
    let len = u.int_in_range(0..=24)?;
    (0..len).map(|_| value(u, depth)).collect()
}

fn bulk(bytes: impl Into<Vec<u8>>) -> Value {
    Value::BulkString(bytes.into())
}

/// A number as the scripts may reply it: an integer, or text holding one.
fn number(u: &mut Unstructured<'_>, n: i64) -> Result<Value> {
    Ok(if u.arbitrary()? {
        Value::Int(n)
    } else {
        bulk(n.to_string())
    })
}

fn response(u: &mut Unstructured<'_>) -> Result<StoredResponse> {
    let mut response = StoredResponse::new(u.arbitrary()?, u.arbitrary::<Vec<u8>>()?);
    for _ in 0..u.int_in_range(0..=3)? {
        response = response.with_header(u.arbitrary::<String>()?, u.arbitrary::<Vec<u8>>()?);
    }
    Ok(response)
}

/// Changes `fields` a few times; whether it changed anything.
fn mutate<T: Clone>(
    u: &mut Unstructured<'_>,
    fields: &mut Vec<T>,
    junk: impl Fn(&mut Unstructured<'_>) -> Result<T>,
) -> Result<bool> {
    let mut changed = false;
    for _ in 0..u.int_in_range(0..=3)? {
        let at = u.choose_index(fields.len().max(1))?;
        match u.int_in_range(0..=3)? {
            0 if at < fields.len() => {
                fields.remove(at);
            }
            1 if at < fields.len() => fields[at] = junk(u)?,
            2 if at < fields.len() => {
                let copy = fields[at].clone();
                fields.push(copy);
            }
            _ => fields.insert(at.min(fields.len()), junk(u)?),
        }
        changed = true;
    }
    Ok(changed)
}

/// A record hash as `lua/*.lua` writes it, changed by the input; the record
/// it must decode to if unchanged (`None`: corrupt as written).
fn written_hash(
    u: &mut Unstructured<'_>,
    scope: &Scope,
) -> Result<(Vec<Value>, bool, Option<Record>)> {
    let fingerprint = Fingerprint::from_digest(u.arbitrary()?);
    let owner = owner(u)?;
    let attempt: u32 = u.arbitrary()?;
    let lease = Timestamp::from_unix_millis(u.arbitrary()?);
    let retained = Timestamp::from_unix_millis(u.arbitrary()?);
    let (name, data, point) = checkpoint(u)?;
    let mut fields = vec![
        ("fp", bulk(fingerprint.as_bytes().to_vec())),
        ("own", bulk(owner.to_string())),
        ("att", number(u, i64::from(attempt))?),
        ("exp", number(u, retained.as_unix_millis())?),
    ];
    let record = Record::in_flight(scope.clone(), fingerprint, owner, attempt, lease, retained);
    let has_checkpoint = u.arbitrary()?;
    if has_checkpoint {
        fields.push(("cpn", bulk(name)));
        fields.push(("cpd", bulk(data)));
    }
    let expected = if u.arbitrary()? {
        fields.push(("st", bulk("f")));
        fields.push(("lease", number(u, lease.as_unix_millis())?));
        match (has_checkpoint, point) {
            (false, _) => Some(record),
            (true, Some(point)) => Some(record.with_checkpoint(Some(point))),
            (true, None) => None,
        }
    } else {
        // A completed record's checkpoint, if any, is not read.
        let response = response(u)?;
        fields.push(("st", bulk("c")));
        fields.push(("rs", number(u, i64::from(response.status()))?));
        fields.push(("rh", bulk(encode_headers(&response))));
        fields.push(("rb", bulk(response.body().to_vec())));
        Some(record.completed(response, retained))
    };
    let mut pairs: Vec<(Value, Value)> = fields.into_iter().map(|(n, v)| (bulk(n), v)).collect();
    let changed = mutate(u, &mut pairs, |u| Ok((bulk(text(u)?), value(u, 1)?)))?;
    // Sometimes one value retyped: the same text as a simple string, or nil.
    let retyped = if !pairs.is_empty() && u.ratio(1, 4)? {
        let at = u.choose_index(pairs.len())?;
        pairs[at].1 = match &pairs[at].1 {
            Value::BulkString(b) => Value::SimpleString(String::from_utf8_lossy(b).into_owned()),
            _ => Value::Nil,
        };
        true
    } else {
        false
    };
    let reply = pairs.into_iter().flat_map(|(n, v)| [n, v]).collect();
    Ok((reply, changed || retyped, expected))
}

/// A claim reply as `lua/claim.lua` writes it, changed by the input; the
/// outcome it must decode to if unchanged (`None`: corrupt as written).
fn written_claim(
    u: &mut Unstructured<'_>,
    request: &ClaimRequest,
) -> Result<(Vec<Value>, bool, Option<ClaimOutcome>)> {
    let (mut reply, expected) = match u.int_in_range(0..=3)? {
        0 => {
            let attempt: u32 = u.arbitrary()?;
            let expires: i64 = u.arbitrary()?;
            let mut reply = vec![
                bulk("claimed"),
                number(u, i64::from(attempt))?,
                number(u, expires)?,
            ];
            let lease = Lease::issued(
                request.scope().clone(),
                request.owner(),
                attempt,
                Timestamp::from_unix_millis(expires),
                request.retention(),
            );
            let checkpoint = if u.arbitrary()? {
                let (name, data, point) = checkpoint(u)?;
                reply.extend([bulk(name), bulk(data)]);
                point.map(Some)
            } else {
                reply.extend([Value::Nil, Value::Nil]);
                Some(None)
            };
            (
                reply,
                checkpoint.map(|checkpoint| ClaimOutcome::Claimed { lease, checkpoint }),
            )
        }
        1 => {
            let remaining: i64 = u.arbitrary()?;
            let reply = vec![bulk("in_progress"), number(u, remaining)?];
            let retry_after = retry_after_millis(remaining);
            assert!(retry_after >= Duration::from_millis(1));
            (reply, Some(ClaimOutcome::InProgress { retry_after }))
        }
        2 => {
            let response = response(u)?;
            let reply = vec![
                bulk("completed"),
                number(u, i64::from(response.status()))?,
                bulk(encode_headers(&response)),
                bulk(response.body().to_vec()),
            ];
            (reply, Some(ClaimOutcome::Completed(response)))
        }
        _ => (vec![bulk("mismatch")], Some(ClaimOutcome::Mismatch)),
    };
    let changed = mutate(u, &mut reply, |u| value(u, 1))?;
    Ok((reply, changed, expected))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(scope) = Scope::parse("tenant", "key") else {
        return;
    };
    let request = ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(b"request"));
    let Ok(mode) = u.int_in_range(0..=3) else {
        return;
    };
    let reply = match mode {
        0 => match written_claim(&mut u, &request) {
            Ok((reply, changed, expected)) => {
                let decoded = claim_reply(&reply, &request);
                if !changed {
                    assert_eq!(decoded.as_ref().ok(), expected.as_ref(), "{reply:?}");
                }
                reply
            }
            Err(_) => return,
        },
        1 => match written_hash(&mut u, &scope) {
            Ok((reply, changed, expected)) => {
                let decoded = record_hash(&scope, &reply);
                if !changed {
                    assert_eq!(decoded.ok().flatten(), expected, "{reply:?}");
                }
                reply
            }
            Err(_) => return,
        },
        _ => match values(&mut u, 0) {
            Ok(reply) => reply,
            Err(_) => return,
        },
    };
    // Every reply through both decoders: a value or Corrupt.
    let claimed = claim_reply(&reply, &request);
    if let Ok(ClaimOutcome::Claimed { lease, .. }) = &claimed {
        assert_eq!(lease.owner(), request.owner());
        assert_eq!(lease.scope(), &scope);
    }
    decoded_or_corrupt(claimed, "redis", Operation::Claim);
    match record_hash(&scope, &reply) {
        Ok(Some(record)) => assert_eq!(record.scope(), &scope),
        Ok(None) => assert!(reply.is_empty()),
        Err(e) => decoded_or_corrupt::<()>(Err(e), "redis", Operation::Get),
    }
    // A whole reply as the driver hands it over, through its own conversion.
    if let Ok(whole) = value(&mut u, 0)
        && let Ok(reply) = redis::from_redis_value::<Vec<Value>>(whole)
    {
        decoded_or_corrupt(claim_reply(&reply, &request), "redis", Operation::Claim);
        decoded_or_corrupt(record_hash(&scope, &reply), "redis", Operation::Get);
    }
});
