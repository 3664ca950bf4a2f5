//! The item layout: attribute names, and reading a record back from an item.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{
    Checkpoint, Fingerprint, OwnerToken, Record, RecordState, Scope, StoreError, StoredResponse,
    Timestamp,
};

use crate::error::corrupt;

/// An item as the SDK hands it over.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Attribute names. `exp` and `ttl` go through `#` placeholders in every
/// expression, in case either is or becomes a reserved word.
pub(crate) mod attr {
    /// Partition key: see [`item_key`](crate::item_key).
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

/// Whether the item is still live at `now` (retention not passed).
pub(crate) fn is_live(item: &Item, now: Timestamp) -> bool {
    get_n(item, attr::EXPIRES).is_some_and(|exp| now.as_unix_millis() < exp)
}

/// The checkpoint an item carries, if any.
pub(crate) fn checkpoint(item: &Item) -> Result<Option<Checkpoint>, StoreError> {
    match (
        get_s(item, attr::CHECKPOINT_NAME),
        get_s(item, attr::CHECKPOINT_DATA),
    ) {
        (Some(name), Some(data)) => Checkpoint::from_json(name, data)
            .map(Some)
            .map_err(|_| corrupt("checkpoint")),
        _ => Ok(None),
    }
}

/// The stored response of a completed item.
pub(crate) fn response(item: &Item) -> Result<StoredResponse, StoreError> {
    let status = get_n(item, attr::RESPONSE_STATUS)
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| corrupt("response status"))?;
    let body = get_b(item, attr::RESPONSE_BODY).ok_or_else(|| corrupt("response body"))?;
    let headers = get_b(item, attr::RESPONSE_HEADERS).ok_or_else(|| corrupt("response headers"))?;
    StoredResponse::new(status, body.to_vec())
        .with_encoded_headers(headers)
        .map_err(|_| corrupt("response headers"))
}

/// The record an item holds.
pub(crate) fn record(scope: &Scope, item: &Item) -> Result<Record, StoreError> {
    let number = |name: &'static str| get_n(item, name).ok_or_else(|| corrupt(name));
    let (state, attempt) = match get_s(item, attr::STATUS) {
        Some("f") => (
            RecordState::InFlight {
                lease_expires_at: Timestamp::from_unix_millis(number(attr::LEASE)?),
            },
            number(attr::ATTEMPT)?,
        ),
        Some("c") => (
            RecordState::Completed {
                response: response(item)?,
            },
            number(attr::DONE_ATTEMPT)?,
        ),
        _ => return Err(corrupt("status")),
    };
    let owner = get_s(item, attr::OWNER)
        .and_then(|o| uuid::Uuid::parse_str(o).ok())
        .ok_or_else(|| corrupt("owner"))?;
    let fingerprint = get_b(item, attr::FINGERPRINT)
        .and_then(|fp| Fingerprint::try_from_slice(fp).ok())
        .ok_or_else(|| corrupt("fingerprint"))?;
    Ok(Record {
        scope: scope.clone(),
        fingerprint,
        owner: OwnerToken::from_uuid(owner),
        attempt: u32::try_from(attempt).map_err(|_| corrupt("attempt"))?,
        state,
        checkpoint: checkpoint(item)?,
        expires_at: Timestamp::from_unix_millis(number(attr::EXPIRES)?),
    })
}
