//! The item layout: attribute names, attribute values, and a [`Record`] read
//! back from an item.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::store::{
    OwnerToken, Record, Timestamp, decode_checkpoint, decode_response, storage_key,
};
use idem_core::{Checkpoint, Fingerprint, Operation, Scope, StoreError, StoredResponse};

use crate::error::corrupt;

/// An item as the SDK hands it over.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Attribute names. `exp` and `ttl` go through `#` placeholders in every
/// expression, in case either is or becomes a reserved word.
pub(crate) mod attr {
    /// Partition key: [`storage_key`](idem_core::store::storage_key) of the scope.
    pub(crate) const PK: &str = "pk";
    // The claim also writes `tenant` and `k`, for people reading the table.
    pub(crate) const FINGERPRINT: &str = "fp";
    pub(crate) const OWNER: &str = "own";
    /// Attempt of an in-flight record; a completed one keeps it in `datt`,
    /// so that a claim after retention counts from one again.
    pub(crate) const ATTEMPT: &str = "att";
    pub(crate) const DONE_ATTEMPT: &str = "datt";
    /// `f` in flight, `c` completed.
    pub(crate) const STATUS: &str = "st";
    pub(crate) const LEASE: &str = "lease";
    /// Retention in epoch milliseconds; every decision checks it.
    pub(crate) const EXPIRES: &str = "exp";
    /// Retention in epoch seconds, for DynamoDB TTL (which deletes lazily).
    pub(crate) const TTL: &str = "ttl";
    pub(crate) const CHECKPOINT_NAME: &str = "cpn";
    pub(crate) const CHECKPOINT_DATA: &str = "cpd";
    pub(crate) const RESPONSE_STATUS: &str = "rs";
    pub(crate) const RESPONSE_HEADERS: &str = "rh";
    pub(crate) const RESPONSE_BODY: &str = "rb";
}

/// The `st` value of an in-flight item.
pub(crate) const IN_FLIGHT: &str = "f";
/// The `st` value of a completed item.
pub(crate) const COMPLETED: &str = "c";

/// The partition key value of a scope's item.
pub(crate) fn key(scope: &Scope) -> AttributeValue {
    s(storage_key(scope))
}

pub(crate) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

pub(crate) fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn b(value: impl Into<Vec<u8>>) -> AttributeValue {
    AttributeValue::B(Blob::new(value))
}

pub(crate) fn get_s<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    item.get(name)?.as_s().ok().map(String::as_str)
}

pub(crate) fn get_n(item: &Item, name: &str) -> Option<i64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

pub(crate) fn get_b<'a>(item: &'a Item, name: &str) -> Option<&'a [u8]> {
    item.get(name)?.as_b().ok().map(Blob::as_ref)
}

pub(crate) fn text_list<'a>(values: impl Iterator<Item = &'a str>) -> AttributeValue {
    AttributeValue::L(values.map(s).collect())
}

/// About what DynamoDB counts of an item: names and values (a list's
/// elements a few bytes each beyond their text).
pub(crate) fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    AttributeValue::S(text) | AttributeValue::N(text) => text.len(),
                    AttributeValue::B(bytes) => bytes.as_ref().len(),
                    AttributeValue::L(list) => list
                        .iter()
                        .map(|v| v.as_s().map_or(0, String::len) + 3)
                        .sum(),
                    _ => 0,
                }
        })
        .sum()
}

/// Refuses an item too large for what is added to it later: `field`
/// named, with the largest payload (of `payload` bytes in it) that fits.
pub(crate) fn check_fits(
    item: &Item,
    payload: usize,
    field: &'static str,
) -> Result<(), StoreError> {
    let size = item_size(item);
    let max = crate::options::ITEM_LIMIT - crate::options::ITEM_OVERHEAD;
    if size > max {
        return Err(idem_core::InvalidInput::TooLong {
            field,
            len: payload,
            max: max.saturating_sub(size - payload),
        }
        .into());
    }
    Ok(())
}

/// Whether the item is still live at `now` (retention not passed).
pub(crate) fn is_live(item: &Item, now: Timestamp) -> bool {
    get_n(item, attr::EXPIRES).is_some_and(|exp| now.as_unix_millis() < exp)
}

/// The checkpoint an item carries, if any.
pub(crate) fn checkpoint(item: &Item, op: Operation) -> Result<Option<Checkpoint>, StoreError> {
    decode_checkpoint(
        get_s(item, attr::CHECKPOINT_NAME),
        get_s(item, attr::CHECKPOINT_DATA),
    )
    .map_err(|_| corrupt(op, "checkpoint"))
}

/// The stored response of a completed item.
fn response(item: &Item, op: Operation) -> Result<StoredResponse, StoreError> {
    let status =
        get_n(item, attr::RESPONSE_STATUS).ok_or_else(|| corrupt(op, "response status"))?;
    let body = get_b(item, attr::RESPONSE_BODY).ok_or_else(|| corrupt(op, "response body"))?;
    let headers =
        get_b(item, attr::RESPONSE_HEADERS).ok_or_else(|| corrupt(op, "response headers"))?;
    decode_response(status, headers, body.to_vec()).ok_or_else(|| corrupt(op, "response"))
}

/// The record of `scope` an item holds, read for `op`.
pub(crate) fn record(scope: &Scope, item: &Item, op: Operation) -> Result<Record, StoreError> {
    let number = |name: &'static str| get_n(item, name).ok_or_else(|| corrupt(op, name));
    let owner = get_s(item, attr::OWNER)
        .and_then(OwnerToken::parse)
        .ok_or_else(|| corrupt(op, "owner"))?;
    let fingerprint = get_b(item, attr::FINGERPRINT)
        .and_then(|fp| Fingerprint::try_from_slice(fp).ok())
        .ok_or_else(|| corrupt(op, "fingerprint"))?;
    let retained_until = Timestamp::from_unix_millis(number(attr::EXPIRES)?);
    let attempt = |name: &'static str| {
        number(name).and_then(|a| u32::try_from(a).map_err(|_| corrupt(op, "attempt")))
    };
    match get_s(item, attr::STATUS) {
        Some(IN_FLIGHT) => Ok(Record::in_flight(
            scope.clone(),
            fingerprint,
            owner,
            attempt(attr::ATTEMPT)?,
            Timestamp::from_unix_millis(number(attr::LEASE)?),
            retained_until,
        )
        .with_checkpoint(checkpoint(item, op)?)),
        Some(COMPLETED) => Ok(Record::in_flight(
            scope.clone(),
            fingerprint,
            owner,
            attempt(attr::DONE_ATTEMPT)?,
            retained_until,
            retained_until,
        )
        .completed(response(item, op)?, retained_until)),
        _ => Err(corrupt(op, "status")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use idem_core::store::{RecordState, encode_headers};

    use super::*;

    fn in_flight_item() -> Item {
        Item::from([
            (attr::PK.into(), s("1:t:k")),
            (
                attr::FINGERPRINT.into(),
                b(Fingerprint::of_bytes(b"x").as_bytes().to_vec()),
            ),
            (attr::OWNER.into(), s(OwnerToken::generate().to_string())),
            (attr::STATUS.into(), s(IN_FLIGHT)),
            (attr::ATTEMPT.into(), n(2)),
            (attr::LEASE.into(), n(5_000)),
            (attr::EXPIRES.into(), n(9_000)),
        ])
    }

    #[test]
    fn in_flight_item_decodes_with_its_checkpoint() {
        let scope = Scope::parse("t", "k").unwrap();
        let mut item = in_flight_item();
        item.insert(attr::CHECKPOINT_NAME.into(), s("half"));
        item.insert(attr::CHECKPOINT_DATA.into(), s("{\"a\":1}"));
        let record = record(&scope, &item, Operation::Get).unwrap();
        assert_eq!(record.attempt(), 2);
        assert_eq!(
            record.lease_expires_at(),
            Some(Timestamp::from_unix_millis(5_000))
        );
        assert_eq!(record.retained_until(), Timestamp::from_unix_millis(9_000));
        assert_eq!(record.checkpoint().map(Checkpoint::name), Some("half"));
    }

    #[test]
    fn completed_item_decodes_its_response() {
        let scope = Scope::parse("t", "k").unwrap();
        let response = StoredResponse::new(201, "made").with_header("x", "y");
        let mut item = in_flight_item();
        item.remove(attr::ATTEMPT);
        item.remove(attr::LEASE);
        item.insert(attr::STATUS.into(), s(COMPLETED));
        item.insert(attr::DONE_ATTEMPT.into(), n(3));
        item.insert(attr::RESPONSE_STATUS.into(), n(201));
        item.insert(attr::RESPONSE_HEADERS.into(), b(encode_headers(&response)));
        item.insert(attr::RESPONSE_BODY.into(), b(b"made".to_vec()));
        let record = record(&scope, &item, Operation::Get).unwrap();
        assert_eq!(record.attempt(), 3);
        assert!(matches!(record.state(), RecordState::Completed { response: r } if *r == response));
    }

    #[test]
    fn broken_items_are_corrupt_naming_the_field() {
        let scope = Scope::parse("t", "k").unwrap();
        let field = |item: &Item| match record(&scope, item, Operation::Claim) {
            Err(StoreError::Corrupt {
                store: "dynamodb",
                operation: Operation::Claim,
                field,
            }) => field,
            other => panic!("expected Corrupt, got {other:?}"),
        };
        let mut item = in_flight_item();
        item.insert(attr::OWNER.into(), s("not a uuid"));
        assert_eq!(field(&item), "owner");
        let mut item = in_flight_item();
        item.insert(attr::STATUS.into(), s("x"));
        assert_eq!(field(&item), "status");
        let mut item = in_flight_item();
        item.insert(attr::CHECKPOINT_NAME.into(), s("only a name"));
        assert_eq!(field(&item), "checkpoint");
        let mut item = in_flight_item();
        item.insert(attr::ATTEMPT.into(), n(-1));
        assert_eq!(field(&item), "attempt");
    }
}
