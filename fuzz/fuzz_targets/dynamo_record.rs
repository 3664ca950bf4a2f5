//! The DynamoDB store's item decoder on any item: a record read by `get`, the
//! item a claim's condition refused, and the checkpoint of the item a
//! takeover replaced decode to a value or to `StoreError::Corrupt`, never a
//! panic, whatever the table holds; an item as the store writes it decodes
//! to exactly the record written.
//!
//! Input: driven through `arbitrary`. Half the inputs are items as the store
//! writes them, from a record made of the input, then changed a few times
//! (an attribute dropped, replaced, retyped, one added); the rest are any
//! items, biased towards the store's attribute names and values.
#![no_main]

use std::collections::HashMap;

use arbitrary::{Result, Unstructured};
use idem_core::store::{OwnerToken, Record, Timestamp, encode_headers};
use idem_core::{Checkpoint, Fingerprint, Operation, Scope, StoredResponse};
use idem_dynamo::aws_sdk_dynamodb::primitives::Blob;
use idem_dynamo::aws_sdk_dynamodb::types::AttributeValue;
use idem_dynamo::fuzzing::{Item, is_live, record, refused_item, takeover_checkpoint};
use idem_fuzz::{WORDS, checkpoint, decoded_or_corrupt};
use libfuzzer_sys::fuzz_target;

const NAMES: &[&str] = &[
    "pk", "tenant", "k", "fp", "own", "att", "datt", "st", "lease", "exp", "ttl", "cpn", "cpd",
    "rs", "rh", "rb",
];

fn owner(u: &mut Unstructured<'_>) -> Result<OwnerToken> {
    Ok(OwnerToken::from_slice(&u.arbitrary::<[u8; 16]>()?).unwrap_or_else(OwnerToken::generate))
}

fn text(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=3)? {
        0 | 1 => (*u.choose(WORDS)?).to_owned(),
        2 => owner(u)?.to_string(),
        _ => u.arbitrary()?,
    })
}

fn number(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=2)? {
        0 => u.int_in_range(-2i64..=70_000)?.to_string(),
        1 => u.arbitrary::<i64>()?.to_string(),
        _ => text(u)?,
    })
}

fn blob(u: &mut Unstructured<'_>) -> Result<Blob> {
    Ok(Blob::new(match u.int_in_range(0..=3)? {
        0 => Fingerprint::of_bytes(u.arbitrary::<&[u8]>()?)
            .as_bytes()
            .to_vec(),
        1 => encode_headers(&response(u)?),
        _ => u.arbitrary()?,
    }))
}

fn value(u: &mut Unstructured<'_>, depth: u32) -> Result<AttributeValue> {
    let nested = depth < 2;
    Ok(match u.int_in_range(0..=11)? {
        0 | 1 => AttributeValue::S(text(u)?),
        2 | 3 => AttributeValue::N(number(u)?),
        4 | 5 => AttributeValue::B(blob(u)?),
        6 => AttributeValue::Bool(u.arbitrary()?),
        7 => AttributeValue::Null(u.arbitrary()?),
        8 => AttributeValue::Ss(vec![text(u)?, text(u)?]),
        9 => AttributeValue::Ns(vec![number(u)?]),
        10 => AttributeValue::Bs(vec![blob(u)?]),
        11 if nested => AttributeValue::L(vec![value(u, depth + 1)?, value(u, depth + 1)?]),
        _ if nested => AttributeValue::M(item(u, depth + 1)?),
        _ => AttributeValue::Null(true),
    })
}

fn name(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(if u.ratio(7, 8)? {
        (*u.choose(NAMES)?).to_owned()
    } else {
        u.arbitrary()?
    })
}

fn item(u: &mut Unstructured<'_>, depth: u32) -> Result<Item> {
    let mut item = HashMap::new();
    for _ in 0..u.int_in_range(0..=16)? {
        item.insert(name(u)?, value(u, depth)?);
    }
    Ok(item)
}

fn response(u: &mut Unstructured<'_>) -> Result<StoredResponse> {
    let mut response = StoredResponse::new(u.arbitrary()?, u.arbitrary::<Vec<u8>>()?);
    for _ in 0..u.int_in_range(0..=3)? {
        response = response.with_header(u.arbitrary::<String>()?, u.arbitrary::<Vec<u8>>()?);
    }
    Ok(response)
}

fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

fn b(bytes: impl Into<Vec<u8>>) -> AttributeValue {
    AttributeValue::B(Blob::new(bytes))
}

/// The same attribute under another type, or a value of its type that the
/// store never writes.
fn retyped(u: &mut Unstructured<'_>, value: &AttributeValue) -> Result<AttributeValue> {
    Ok(match (value, u.int_in_range(0..=2)?) {
        (_, 0) => AttributeValue::Null(true),
        (AttributeValue::S(text), 1) => AttributeValue::Ss(vec![text.clone()]),
        (AttributeValue::S(text), _) => b(text.as_bytes().to_vec()),
        (AttributeValue::N(number), 1) => s(number.clone()),
        (AttributeValue::N(number), _) => n(format!("{number}.5")),
        (AttributeValue::B(blob), 1) => s(String::from_utf8_lossy(blob.as_ref())),
        (AttributeValue::B(blob), _) => AttributeValue::Bs(vec![blob.clone()]),
        (_, _) => AttributeValue::Bool(true),
    })
}

/// What a written item must decode to: the record (`None`: corrupt as
/// written) and the checkpoint a takeover reads from it.
struct Expected {
    record: Option<Record>,
    checkpoint: Option<Option<Checkpoint>>,
}

/// An item as the store writes it, changed by the input; whether it changed.
fn written(u: &mut Unstructured<'_>, scope: &Scope) -> Result<(Item, bool, Expected)> {
    let fingerprint = Fingerprint::from_digest(u.arbitrary()?);
    let owner = owner(u)?;
    let attempt: u32 = u.arbitrary()?;
    let lease = Timestamp::from_unix_millis(u.arbitrary()?);
    let retained = Timestamp::from_unix_millis(u.arbitrary()?);
    let mut item = Item::from([
        ("pk".to_owned(), s("6:tenant:key")),
        ("tenant".to_owned(), s("tenant")),
        ("k".to_owned(), s("key")),
        ("fp".to_owned(), b(fingerprint.as_bytes().to_vec())),
        ("own".to_owned(), s(owner.to_string())),
        ("exp".to_owned(), n(retained.as_unix_millis())),
        ("ttl".to_owned(), n(retained.as_unix_millis() / 1000)),
    ]);
    let record = Record::in_flight(scope.clone(), fingerprint, owner, attempt, lease, retained);
    // A checkpoint is stored in flight; a completed item may keep a stale one.
    let checkpoint = if u.arbitrary()? {
        let (name, data, decoded) = checkpoint(u)?;
        item.insert("cpn".into(), s(name));
        item.insert("cpd".into(), s(data));
        decoded.map(Some)
    } else {
        Some(None)
    };
    let expected = if u.arbitrary()? {
        item.insert("st".into(), s("f"));
        item.insert("att".into(), n(attempt));
        item.insert("lease".into(), n(lease.as_unix_millis()));
        Expected {
            record: checkpoint
                .clone()
                .map(|point| record.with_checkpoint(point)),
            checkpoint,
        }
    } else {
        let response = response(u)?;
        item.insert("st".into(), s("c"));
        item.insert("datt".into(), n(attempt));
        item.insert("rs".into(), n(response.status()));
        item.insert("rh".into(), b(encode_headers(&response)));
        item.insert("rb".into(), b(response.body().to_vec()));
        Expected {
            record: Some(record.completed(response, retained)),
            checkpoint,
        }
    };
    let mut changed = false;
    for _ in 0..u.int_in_range(0..=3)? {
        let name = name(u)?;
        match u.int_in_range(0..=2)? {
            0 => {
                item.remove(&name);
            }
            1 => {
                let new = match item.get(&name) {
                    Some(old) => retyped(u, old)?,
                    None => value(u, 1)?,
                };
                item.insert(name, new);
            }
            _ => {
                item.insert(name, value(u, 1)?);
            }
        }
        changed = true;
    }
    Ok((item, changed, expected))
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(scope) = Scope::parse("tenant", "key") else {
        return;
    };
    let item = if u.arbitrary().unwrap_or(false) {
        let Ok((item, changed, expected)) = written(&mut u, &scope) else {
            return;
        };
        if !changed {
            assert_eq!(record(&scope, &item).ok(), expected.record, "{item:?}");
            assert_eq!(refused_item(&scope, &item).ok(), expected.record);
            assert_eq!(takeover_checkpoint(&item).ok(), expected.checkpoint);
        }
        item
    } else {
        let Ok(item) = item(&mut u, 0) else {
            return;
        };
        item
    };
    let now = Timestamp::from_unix_millis(u.arbitrary().unwrap_or(0));
    let live = is_live(&item, now);
    match record(&scope, &item) {
        Ok(record) => {
            assert_eq!(record.scope(), &scope);
            assert_eq!(live, record.is_live(now));
        }
        Err(e) => decoded_or_corrupt::<()>(Err(e), "dynamodb", Operation::Get),
    }
    decoded_or_corrupt(refused_item(&scope, &item), "dynamodb", Operation::Claim);
    decoded_or_corrupt(takeover_checkpoint(&item), "dynamodb", Operation::Claim);
});
