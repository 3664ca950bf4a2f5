//! The journal's item layout: one item per operation, each part of its
//! record an attribute of its own (so a conditional write can test and set
//! one without reading the others), and the placeholders of the expressions
//! that write them.

use std::collections::{HashMap, HashSet};

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::store::{
    JournalParts, JournalRecord, NewOperation, OperationId, OperationKey, OperationState,
    OwnerToken, Timestamp,
};
use idem_core::{InvalidInput, Operation, StoreError, Tenant};

use crate::codec::{Item, get_n, get_s, n, s};
use crate::error::corrupt;
use crate::options::{ITEM_LIMIT, ITEM_OVERHEAD};

/// Attribute names. Every expression names them through `#` placeholders
/// (`#st` for `st`), so none can clash with a reserved word, now or later.
pub(crate) mod attr {
    /// Partition key: the operation key's
    /// [`storage_key`](idem_core::store::OperationKey::storage_key).
    pub(crate) const PK: &str = "pk";
    pub(crate) const NAMESPACE: &str = "ns";
    pub(crate) const SUBJECT: &str = "subj";
    pub(crate) const EFFECT: &str = "eff";
    /// The caller's request, as JSON text.
    pub(crate) const REQUEST: &str = "req";
    pub(crate) const PROVIDER_KEY: &str = "pkey";
    /// [`OperationState::as_str`](idem_core::store::OperationState::as_str).
    pub(crate) const STATE: &str = "st";
    pub(crate) const PROVIDER_ID: &str = "pid";
    pub(crate) const DETAIL: &str = "det";
    /// Epoch milliseconds, like every time below.
    pub(crate) const FIRST_SENT_AT: &str = "fsa";
    pub(crate) const SENDS: &str = "sends";
    pub(crate) const CREATED_AT: &str = "cat";
    /// Also the sort key of the list index.
    pub(crate) const UPDATED_AT: &str = "uat";
    pub(crate) const LEASE_OWNER: &str = "own";
    pub(crate) const LEASE_UNTIL: &str = "lu";
    pub(crate) const SEARCH_UNTIL: &str = "su";
    /// The list index's partition key: [`list_key`](super::list_key).
    pub(crate) const LIST_KEY: &str = "lst";
}

/// The global secondary index that `list` queries: partition key `lst`,
/// sort key `uat`, keys only.
pub(crate) const LIST_INDEX: &str = "by-state";

/// The partition key value of `key`'s item.
pub(crate) fn key(key: &OperationKey) -> AttributeValue {
    s(key.storage_key())
}

/// The list index's partition key of the operations of `namespace` in
/// `state`: `<length>:<namespace>#<state>`. The length prefix keeps it
/// unambiguous whatever the namespace holds (`#` included).
pub(crate) fn list_key(namespace: &Tenant, state: OperationState) -> AttributeValue {
    let namespace = namespace.as_str();
    s(format!(
        "{}:{namespace}#{}",
        namespace.len(),
        state.as_str()
    ))
}

/// The item of a record just made (all of it: `record` and `record_item`
/// write it whole).
///
/// # Errors
///
/// [`InvalidInput::TooLong`] when the request leaves too little of a 400 KB
/// item for the rest of the record.
pub(crate) fn item(record: &JournalRecord) -> Result<Item, StoreError> {
    let request = serde_json::to_string(record.request()).map_err(|e| InvalidInput::Malformed {
        field: "operation request",
        reason: e.to_string(),
    })?;
    let request_len = request.len();
    let key = record.key();
    let parts = record.parts();
    let mut item = Item::from([
        (attr::PK.into(), self::key(key)),
        (attr::NAMESPACE.into(), s(key.namespace().as_str())),
        (attr::SUBJECT.into(), s(key.id().subject())),
        (attr::EFFECT.into(), s(key.id().effect())),
        (attr::REQUEST.into(), s(request)),
        (attr::PROVIDER_KEY.into(), s(record.provider_key())),
        (attr::STATE.into(), s(parts.state.as_str())),
        (attr::SENDS.into(), n(parts.sends)),
        (
            attr::CREATED_AT.into(),
            n(parts.created_at.as_unix_millis()),
        ),
        (
            attr::UPDATED_AT.into(),
            n(parts.updated_at.as_unix_millis()),
        ),
        (
            attr::LIST_KEY.into(),
            list_key(key.namespace(), parts.state),
        ),
    ]);
    let optional = [
        (attr::PROVIDER_ID, parts.provider_id.clone().map(s)),
        (attr::DETAIL, parts.detail.clone().map(s)),
        (attr::FIRST_SENT_AT, parts.first_sent_at.map(millis)),
        (
            attr::LEASE_OWNER,
            parts.lease_owner.map(|o| s(o.to_string())),
        ),
        (attr::LEASE_UNTIL, parts.lease_until.map(millis)),
        (attr::SEARCH_UNTIL, parts.search_until.map(millis)),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            item.insert(name.into(), value);
        }
    }
    // DynamoDB counts names and values; a number's text is at least its
    // stored size, so this bounds the item from above. The overhead is room
    // for what a finish adds later (a provider id, a short detail).
    let size: usize = item
        .iter()
        .map(|(name, value)| name.len() + value.as_s().or(value.as_n()).map_or(0, String::len))
        .sum();
    let max = ITEM_LIMIT - ITEM_OVERHEAD;
    if size > max {
        return Err(InvalidInput::TooLong {
            field: "operation request",
            len: request_len,
            max: max.saturating_sub(size - request_len),
        }
        .into());
    }
    Ok(item)
}

/// A time as an attribute: epoch milliseconds.
pub(crate) fn millis(at: Timestamp) -> AttributeValue {
    n(at.as_unix_millis())
}

/// The record an item holds, read for `op`.
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the attribute that does not decode.
pub(crate) fn record(item: &Item, op: Operation) -> Result<JournalRecord, StoreError> {
    let text = |name: &'static str| get_s(item, name).ok_or_else(|| corrupt(op, name));
    let time = |name: &'static str| {
        get_n(item, name)
            .map(Timestamp::from_unix_millis)
            .ok_or_else(|| corrupt(op, name))
    };
    // An absent optional attribute is `None`; a present one must decode.
    let optional_time = |name: &'static str| match item.get(name) {
        None => Ok(None),
        Some(_) => time(name).map(Some),
    };
    let optional_text = |name: &'static str| match item.get(name) {
        None => Ok(None),
        Some(_) => text(name).map(|t| Some(t.to_string())),
    };
    let namespace =
        Tenant::new(text(attr::NAMESPACE)?).map_err(|_| corrupt(op, attr::NAMESPACE))?;
    let id = OperationId::new(text(attr::SUBJECT)?, text(attr::EFFECT)?)
        .map_err(|_| corrupt(op, "operation id"))?;
    let key = OperationKey::new(namespace, id);
    if get_s(item, attr::PK) != Some(key.storage_key().as_str()) {
        return Err(corrupt(op, attr::PK));
    }
    let request =
        serde_json::from_str(text(attr::REQUEST)?).map_err(|_| corrupt(op, attr::REQUEST))?;
    let state =
        OperationState::parse(text(attr::STATE)?).ok_or_else(|| corrupt(op, attr::STATE))?;
    let sends = get_n(item, attr::SENDS)
        .and_then(|sends| u32::try_from(sends).ok())
        .ok_or_else(|| corrupt(op, attr::SENDS))?;
    let lease_owner = match item.get(attr::LEASE_OWNER) {
        None => None,
        Some(_) => Some(
            get_s(item, attr::LEASE_OWNER)
                .and_then(OwnerToken::parse)
                .ok_or_else(|| corrupt(op, attr::LEASE_OWNER))?,
        ),
    };
    let parts = JournalParts {
        state,
        provider_id: optional_text(attr::PROVIDER_ID)?,
        detail: optional_text(attr::DETAIL)?,
        first_sent_at: optional_time(attr::FIRST_SENT_AT)?,
        sends,
        created_at: time(attr::CREATED_AT)?,
        updated_at: time(attr::UPDATED_AT)?,
        lease_owner,
        lease_until: optional_time(attr::LEASE_UNTIL)?,
        search_until: optional_time(attr::SEARCH_UNTIL)?,
    };
    let provider_key = text(attr::PROVIDER_KEY)?.to_string();
    Ok(JournalRecord::new(
        NewOperation::from_stored(key, request, provider_key),
        parts,
    ))
}

/// The placeholders (`#name` and `:value`) that `expressions` use.
fn placeholders(expressions: &[&str]) -> HashSet<String> {
    let mut found = HashSet::new();
    for expression in expressions {
        let mut chars = expression.char_indices().peekable();
        while let Some((start, c)) = chars.next() {
            if c != '#' && c != ':' {
                continue;
            }
            let mut end = start + 1;
            while let Some(&(i, next)) = chars.peek() {
                if !(next.is_ascii_alphanumeric() || next == '_') {
                    break;
                }
                end = i + next.len_utf8();
                chars.next();
            }
            if end > start + 1 {
                found.insert(expression[start..end].to_string());
            }
        }
    }
    found
}

/// The attribute names of the `#name` placeholders `expressions` use: each
/// names the attribute after its `#`. DynamoDB refuses a name or a value
/// that no expression uses, so each request carries exactly these.
pub(crate) fn names(expressions: &[&str]) -> HashMap<String, String> {
    placeholders(expressions)
        .into_iter()
        .filter_map(|p| Some((p.clone(), p.strip_prefix('#')?.to_string())))
        .collect()
}

/// Of `values`, those whose placeholders `expressions` use.
pub(crate) fn used_values(
    expressions: &[&str],
    mut values: HashMap<String, AttributeValue>,
) -> HashMap<String, AttributeValue> {
    let used = placeholders(expressions);
    values.retain(|placeholder, _| used.contains(placeholder));
    values
}

/// The condition that an operation is open (not settled), and the values it
/// names: one `#st <> :<state>` per settled state.
pub(crate) fn open_condition() -> (String, HashMap<String, AttributeValue>) {
    let settled: Vec<OperationState> = OperationState::ALL
        .into_iter()
        .filter(|state| state.is_settled())
        .collect();
    let condition = settled
        .iter()
        .map(|state| format!("#{} <> :{}", attr::STATE, state.as_str()))
        .collect::<Vec<_>>()
        .join(" AND ");
    let values = settled
        .iter()
        .map(|state| (format!(":{}", state.as_str()), s(state.as_str())))
        .collect();
    (condition, values)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use idem_core::store::Finish;
    use serde_json::json;

    use super::*;

    fn operation_key() -> OperationKey {
        OperationKey::new(
            Tenant::new("bill#ing").unwrap(),
            OperationId::new("order-1", "charge").unwrap(),
        )
    }

    fn full_record() -> JournalRecord {
        let now = Timestamp::from_unix_millis(1_000);
        let owner = OwnerToken::generate();
        NewOperation::new(operation_key(), json!({"amount": 1.5, "items": [1, 2]}))
            .into_record(now)
            .acquired(owner, now + std::time::Duration::from_secs(5), now)
            .sent(Timestamp::from_unix_millis(1_500))
            .finished(
                &Finish::new(OperationState::Unknown, Some("timed out".into()))
                    .with_provider_id(Some("ch_1".into()))
                    .with_search_until(Some(Timestamp::from_unix_millis(9_000))),
                Timestamp::from_unix_millis(2_000),
            )
    }

    #[test]
    fn a_record_survives_its_item() {
        let fresh = NewOperation::new(operation_key(), json!(null))
            .into_record(Timestamp::from_unix_millis(7));
        for record in [full_record(), fresh] {
            let item = item(&record).unwrap();
            assert_eq!(super::record(&item, Operation::Get).unwrap(), record);
        }
    }

    #[test]
    fn list_keys_are_unambiguous() {
        let a = list_key(&Tenant::new("a#pending").unwrap(), OperationState::Unknown);
        let b = list_key(&Tenant::new("a").unwrap(), OperationState::Pending);
        assert_ne!(a, b);
        assert_eq!(b.as_s().unwrap(), "1:a#pending");
    }

    #[test]
    fn broken_items_are_corrupt_naming_the_attribute() {
        let field = |item: &Item| match record(item, Operation::List) {
            Err(StoreError::Corrupt {
                store: "dynamodb",
                operation: Operation::List,
                field,
            }) => field,
            other => panic!("expected Corrupt, got {other:?}"),
        };
        let good = item(&full_record()).unwrap();
        let broken = |name: &str, value: AttributeValue| {
            let mut item = good.clone();
            item.insert(name.into(), value);
            item
        };
        assert_eq!(field(&broken(attr::STATE, s("done"))), attr::STATE);
        assert_eq!(field(&broken(attr::SENDS, n(-1))), attr::SENDS);
        assert_eq!(field(&broken(attr::REQUEST, s("{"))), attr::REQUEST);
        assert_eq!(field(&broken(attr::LEASE_OWNER, s("x"))), attr::LEASE_OWNER);
        assert_eq!(field(&broken(attr::LEASE_UNTIL, s("x"))), attr::LEASE_UNTIL);
        assert_eq!(field(&broken(attr::PK, s("1:a1:b1:c"))), attr::PK);
        let mut missing = good.clone();
        missing.remove(attr::UPDATED_AT);
        assert_eq!(field(&missing), attr::UPDATED_AT);
    }

    #[test]
    fn a_request_too_large_for_an_item_is_refused() {
        let big = "x".repeat(ITEM_LIMIT);
        let record = NewOperation::new(operation_key(), json!({ "blob": big }))
            .into_record(Timestamp::from_unix_millis(0));
        assert!(matches!(
            item(&record),
            Err(StoreError::InvalidInput(InvalidInput::TooLong {
                field: "operation request",
                ..
            }))
        ));
    }

    #[test]
    fn each_request_names_exactly_what_its_expressions_use() {
        let expressions = ["SET #st = :st, #uat = :now", "#lu > :now AND #own = :own"];
        let names = names(&expressions);
        assert_eq!(names.len(), 4);
        assert_eq!(names["#uat"], "uat");
        let values = HashMap::from([
            (":st".to_string(), s("x")),
            (":own".to_string(), s("o")),
            (":now".to_string(), n(1)),
            (":unused".to_string(), n(2)),
        ]);
        let used = used_values(&expressions, values);
        assert_eq!(used.len(), 3);
        assert!(!used.contains_key(":unused"));
    }
}
