//! The expressions the store sends, and the fenced updates built from them
//! (one shape for a single `UpdateItem` and for an item of a transaction).
//!
//! Placeholders: `#exp` and `#ttl` name `exp` and `ttl`; the values each
//! expression names are described beside it.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idem_core::store::{
    Lease, OwnerToken, Record, RecordState, Timestamp, check_response_size, checkpoint_json,
    encode_headers,
};
use idem_core::{Checkpoint, Operation, Scope, StoreError, StoredResponse};

use crate::codec::{COMPLETED, IN_FLIGHT, attr, b, get_n, get_s, key, n, s};
use crate::error::build_failure;
use crate::options::{ITEM_LIMIT, ITEM_OVERHEAD};

/// The claim's `UpdateExpression`: `:fp` (B), `:own` (S), `:f` ("f"),
/// `:lease`, `:exp` (epoch ms), `:ttl` (epoch s), `:zero`, `:one`,
/// `:tenant`, `:k` (S).
pub(crate) const CLAIM_UPDATE: &str = "SET fp = :fp, own = :own, st = :f, lease = :lease, \
    #exp = :exp, #ttl = :ttl, att = if_not_exists(att, :zero) + :one, tenant = :tenant, k = :k \
    REMOVE rs, rh, rb, datt";

/// The claim's `ConditionExpression`: absent, past retention, or a takeover
/// of an expired lease with the same fingerprint by another owner (the
/// owner's own claim delivered again after its lease expired is still its
/// claim, answered from the item without a write); `:now` is epoch ms.
pub(crate) const CLAIM_CONDITION: &str = "attribute_not_exists(pk) OR #exp <= :now \
    OR (st = :f AND lease <= :now AND fp = :fp AND own <> :own)";

/// Resets a claim over an abandoned item past retention to attempt 1,
/// without its checkpoint: `:one`, `:own` (the new owner).
pub(crate) const RESET_UPDATE: &str = "SET att = :one REMOVE cpn, cpd";
/// The condition of [`RESET_UPDATE`]: the new owner still holds the item.
pub(crate) const RESET_CONDITION: &str = "own = :own";

/// The completion's `UpdateExpression`: `:c` ("c"), `:rs` (N), `:rh`,
/// `:rb` (B), `:exp`, `:ttl`, `:att` (N).
pub(crate) const COMPLETE_UPDATE: &str = "SET st = :c, rs = :rs, rh = :rh, rb = :rb, \
    #exp = :exp, #ttl = :ttl, datt = :att REMOVE lease, att, cpn, cpd";

/// A renewal within the record's retention: `:lease` (epoch ms).
pub(crate) const RENEW_UPDATE: &str = "SET lease = :lease";
/// The extra condition of [`RENEW_UPDATE`]: the record outlives the new lease.
/// Without max() in update expressions, the rare renewal past retention is
/// a second request ([`RENEW_STRETCHING_UPDATE`]).
pub(crate) const RENEW_WITHIN_RETENTION: &str = "#exp >= :lease";
/// A renewal past the record's retention, which it stretches to the new
/// lease: `:lease` and `:exp` (epoch ms, the same), `:ttl` (epoch s).
pub(crate) const RENEW_STRETCHING_UPDATE: &str = "SET lease = :lease, #exp = :exp, #ttl = :ttl";

/// The checkpoint's `UpdateExpression`: `:cpn` (S), `:cpd` (S, JSON).
pub(crate) const CHECKPOINT_UPDATE: &str = "SET cpn = :cpn, cpd = :cpd";

/// The fence of every write after the claim: `:own`, `:f`, `:now`.
pub(crate) const FENCE: &str = "own = :own AND st = :f AND #exp > :now";

/// The condition of a release: [`FENCE`], or a record nobody holds.
pub(crate) const RELEASE_CONDITION: &str =
    "(own = :own AND st = :f AND #exp > :now) OR attribute_not_exists(pk) OR #exp <= :now";

/// The condition of the sweeper's deletes: `:now`.
pub(crate) const PAST_RETENTION: &str = "#exp <= :now";

/// The values [`FENCE`] names, for `lease` at `now`.
pub(crate) fn fence_values(lease: &Lease, now: Timestamp) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (":own".to_string(), s(lease.owner().to_string())),
        (":f".to_string(), s(IN_FLIGHT)),
        (":now".to_string(), n(now.as_unix_millis())),
    ])
}

/// An update of a lease's record, fenced on its owner: sent alone as an
/// `UpdateItem`, or as an item of a `TransactWriteItems`.
#[derive(Debug, Clone)]
pub(crate) struct FencedUpdate {
    /// The operation it performs, for errors.
    pub(crate) operation: Operation,
    /// The item's partition key value.
    pub(crate) key: AttributeValue,
    update: &'static str,
    condition: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
}

impl FencedUpdate {
    fn new(operation: Operation, lease: &Lease, now: Timestamp, update: &'static str) -> Self {
        Self {
            operation,
            key: key(lease.scope()),
            update,
            condition: FENCE.to_string(),
            names: HashMap::from([("#exp".to_string(), attr::EXPIRES.to_string())]),
            values: fence_values(lease, now),
        }
    }

    fn name(mut self, placeholder: &str, name: &str) -> Self {
        self.names.insert(placeholder.to_string(), name.to_string());
        self
    }

    fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.to_string(), value);
        self
    }

    /// The same update, also conditional on `extra`.
    fn also(mut self, extra: &str) -> Self {
        self.condition = format!("{} AND {extra}", self.condition);
        self
    }

    /// The update as one `UpdateItem` request on `table`.
    pub(crate) fn request(self, client: &Client, table: &str) -> UpdateItemFluentBuilder {
        client
            .update_item()
            .table_name(table)
            .key(attr::PK, self.key)
            .update_expression(self.update)
            .condition_expression(self.condition)
            .set_expression_attribute_names(Some(self.names))
            .set_expression_attribute_values(Some(self.values))
    }

    /// The update as an item of a `TransactWriteItems` on `table`.
    pub(crate) fn transact_item(self, table: &str) -> Result<TransactWriteItem, StoreError> {
        let operation = self.operation;
        let update = Update::builder()
            .table_name(table)
            .key(attr::PK, self.key)
            .update_expression(self.update)
            .condition_expression(self.condition)
            .set_expression_attribute_names(Some(self.names))
            .set_expression_attribute_values(Some(self.values))
            .build()
            .map_err(|e| build_failure(operation, e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }
}

/// The completion of `lease`'s record with `response` at `now`.
///
/// # Errors
///
/// [`StoreError::TooLarge`] over `max` bytes, or when the response cannot
/// fit one item beside the record's own attributes.
pub(crate) fn complete(
    lease: &Lease,
    response: &StoredResponse,
    now: Timestamp,
    max: usize,
) -> Result<FencedUpdate, StoreError> {
    let headers = fitting_headers(lease.scope(), response, max)?;
    let retained_until = now + lease.retention();
    Ok(
        FencedUpdate::new(Operation::Complete, lease, now, COMPLETE_UPDATE)
            .name("#ttl", attr::TTL)
            .value(":c", s(COMPLETED))
            .value(":rs", n(response.status()))
            .value(":rh", b(headers))
            .value(":rb", b(response.body().to_vec()))
            .value(":exp", n(retained_until.as_unix_millis()))
            .value(":ttl", n(retained_until.as_unix_secs_ceil()))
            .value(":att", n(lease.attempt())),
    )
}

/// `response`'s encoded headers, once it is known to fit `scope`'s item.
///
/// # Errors
///
/// [`StoreError::TooLarge`] over `max` bytes, or when the response cannot
/// fit one item beside the record's own attributes.
fn fitting_headers(
    scope: &Scope,
    response: &StoredResponse,
    max: usize,
) -> Result<Vec<u8>, StoreError> {
    check_response_size(response, max)?;
    let headers = encode_headers(response);
    // DynamoDB counts attribute names and values: names (32 bytes),
    // fingerprint (32), owner (36), status (1), four numbers (21 each at
    // most), the key's length digits and colons (5), then tenant and key
    // twice (in `pk` and on their own), headers and body.
    let item = 190
        + 2 * (scope.tenant().as_str().len() + scope.key().as_str().len())
        + headers.len()
        + response.body().len();
    if item > ITEM_LIMIT {
        return Err(StoreError::TooLarge {
            size: response.size().max(item.saturating_sub(ITEM_OVERHEAD)),
            max,
        });
    }
    Ok(headers)
}

/// The condition of a claim made inside a transaction over no live record:
/// the table still holds none (`:now`, epoch ms).
const CLAIMED_OVER_NONE: &str = "attribute_not_exists(pk) OR #exp <= :now";
/// The condition of a claim made inside a transaction over a lapsed lease:
/// its owner (`:rown`) still holds the record in flight, its lease still
/// lapsed (`:f`, `:now`).
const CLAIMED_OVER_LAPSED: &str = "own = :rown AND st = :f AND lease <= :now";

/// The write of `record`, claimed inside a transaction at `now` and
/// perhaps completed or checkpointed since in it: the record's whole state,
/// conditioned on the table still holding what the claim read (no live
/// record, or `read`'s lapsed lease), so that a claim that commits first
/// elsewhere cancels the transaction instead of being overwritten.
///
/// # Errors
///
/// [`StoreError::TooLarge`] for a completion that cannot fit (as
/// [`complete`]'s), over `max` bytes.
pub(crate) fn claimed_in(
    table: &str,
    record: &Record,
    read: Option<OwnerToken>,
    now: Timestamp,
    max: usize,
) -> Result<TransactWriteItem, StoreError> {
    let scope = record.scope();
    let retained_until = record.retained_until();
    let mut set = vec![
        "fp = :fp",
        "own = :own",
        "#exp = :exp",
        "#ttl = :ttl",
        "tenant = :tenant",
        "k = :k",
    ];
    let mut values = HashMap::from([
        (
            ":fp".to_string(),
            b(record.fingerprint().as_bytes().to_vec()),
        ),
        (":own".to_string(), s(record.owner().to_string())),
        (":exp".to_string(), n(retained_until.as_unix_millis())),
        (":ttl".to_string(), n(retained_until.as_unix_secs_ceil())),
        (":tenant".to_string(), s(scope.tenant().as_str())),
        (":k".to_string(), s(scope.key().as_str())),
        (":now".to_string(), n(now.as_unix_millis())),
        (":att".to_string(), n(record.attempt())),
    ]);
    let remove = match record.state() {
        RecordState::Completed { response } => {
            let headers = fitting_headers(scope, response, max)?;
            set.extend(["st = :c", "rs = :rs", "rh = :rh", "rb = :rb", "datt = :att"]);
            values.insert(":c".to_string(), s(COMPLETED));
            values.insert(":rs".to_string(), n(response.status()));
            values.insert(":rh".to_string(), b(headers));
            values.insert(":rb".to_string(), b(response.body().to_vec()));
            "lease, att, cpn, cpd"
        }
        _ => {
            let lease = record.lease_expires_at().unwrap_or(now);
            set.extend(["st = :f", "lease = :lease", "att = :att"]);
            values.insert(":f".to_string(), s(IN_FLIGHT));
            values.insert(":lease".to_string(), n(lease.as_unix_millis()));
            match record.checkpoint() {
                Some(checkpoint) => {
                    set.extend(["cpn = :cpn", "cpd = :cpd"]);
                    values.insert(":cpn".to_string(), s(checkpoint.name()));
                    values.insert(":cpd".to_string(), s(checkpoint_json(checkpoint)));
                    "rs, rh, rb, datt"
                }
                None => "rs, rh, rb, datt, cpn, cpd",
            }
        }
    };
    let condition = match read {
        None => CLAIMED_OVER_NONE,
        Some(owner) => {
            values.insert(":rown".to_string(), s(owner.to_string()));
            values.insert(":f".to_string(), s(IN_FLIGHT));
            CLAIMED_OVER_LAPSED
        }
    };
    let update = Update::builder()
        .table_name(table)
        .key(attr::PK, key(scope))
        .update_expression(format!("SET {} REMOVE {remove}", set.join(", ")))
        .condition_expression(condition)
        .expression_attribute_names("#exp", attr::EXPIRES)
        .expression_attribute_names("#ttl", attr::TTL)
        .set_expression_attribute_values(Some(values))
        .build()
        .map_err(|e| build_failure(Operation::Claim, e))?;
    Ok(TransactWriteItem::builder().update(update).build())
}

/// The renewal of `lease` to `until`, for a record retained at least that long.
pub(crate) fn renew_within_retention(
    lease: &Lease,
    until: Timestamp,
    now: Timestamp,
) -> FencedUpdate {
    FencedUpdate::new(Operation::Renew, lease, now, RENEW_UPDATE)
        .also(RENEW_WITHIN_RETENTION)
        .value(":lease", n(until.as_unix_millis()))
}

/// The renewal of `lease` to `until`, retaining the record until then too.
pub(crate) fn renew_stretching_retention(
    lease: &Lease,
    until: Timestamp,
    now: Timestamp,
) -> FencedUpdate {
    FencedUpdate::new(Operation::Renew, lease, now, RENEW_STRETCHING_UPDATE)
        .name("#ttl", attr::TTL)
        .value(":lease", n(until.as_unix_millis()))
        .value(":exp", n(until.as_unix_millis()))
        .value(":ttl", n(until.as_unix_secs_ceil()))
}

/// Whether `old`, the item that refused [`renew_within_retention`], is still
/// held by `lease` and refused only because its retention ends before `until`.
pub(crate) fn held_but_retained_short(
    old: &crate::codec::Item,
    lease: &Lease,
    now: Timestamp,
    until: Timestamp,
) -> bool {
    let owner = lease.owner().to_string();
    get_s(old, attr::OWNER) == Some(owner.as_str())
        && get_s(old, attr::STATUS) == Some(IN_FLIGHT)
        && get_n(old, attr::EXPIRES)
            .is_some_and(|exp| exp > now.as_unix_millis() && exp < until.as_unix_millis())
}

/// The recovery point `checkpoint` on `lease`'s record at `now`.
pub(crate) fn checkpoint(lease: &Lease, checkpoint: &Checkpoint, now: Timestamp) -> FencedUpdate {
    FencedUpdate::new(Operation::Checkpoint, lease, now, CHECKPOINT_UPDATE)
        .value(":cpn", s(checkpoint.name()))
        .value(":cpd", s(checkpoint_json(checkpoint)))
}
