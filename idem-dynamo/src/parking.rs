//! `DynamoParking`: a message consumer's parked messages on DynamoDB:
//! construction, the table and its indexes, the item layout, and the trait
//! implementation (one request per operation, a purge's deletes aside).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, GlobalSecondaryIndex, KeyType, LocalSecondaryIndex, Projection,
    ProjectionType, ScalarAttributeType, Select,
};
use idem_core::store::{
    Capabilities, InboundMessage, NewParked, ParkedMessage, ParkedQuery, ParkedState, ParkingStore,
    Resolution, Timestamp, validate_parking_batch,
};
use idem_core::{ConsumerName, IdempotencyKey, Operation, StoreError, async_trait};

use crate::codec::{Item, b, check_fits, get_b, get_n, get_s, n, s, text_list};
use crate::error::{build_failure, classify, corrupt, is_condition_failure};
use crate::journal_item::names;
use crate::options::DynamoParkingOptions;
use crate::part::{attribute_definition, key_element};

/// Attribute names. Every expression names them through `#` placeholders.
mod attr {
    /// Partition key: the consumer's name.
    pub(super) const PK: &str = "pk";
    /// Sort key: the message id.
    pub(super) const SK: &str = "sk";
    pub(super) const KIND: &str = "kind";
    pub(super) const AGGREGATE: &str = "agg";
    pub(super) const VERSION: &str = "ver";
    pub(super) const HEADER_NAMES: &str = "hn";
    pub(super) const HEADER_VALUES: &str = "hv";
    pub(super) const PAYLOAD: &str = "pl";
    pub(super) const REASON: &str = "why";
    pub(super) const DELIVERIES: &str = "dlv";
    /// [`ParkedState::as_str`].
    pub(super) const STATE: &str = "st";
    /// Epoch milliseconds, like `rat`.
    pub(super) const PARKED_AT: &str = "pat";
    /// Also the sort key of the purge index.
    pub(super) const RESOLVED_AT: &str = "rat";
    pub(super) const RESOLUTION: &str = "res";
    /// Sort key of the age index, on parked entries only.
    pub(super) const AGE_KEY: &str = "age";
    /// Sort key of the version index, on parked entries of an aggregate only.
    pub(super) const VERSION_KEY: &str = "avk";
    /// Partition key of the purge index, on resolved entries only.
    pub(super) const RESOLVED: &str = "rsv";
}

/// Local secondary index: a consumer's parked entries, oldest first.
const AGE_INDEX: &str = "by-age";
/// Local secondary index: a consumer's parked entries by aggregate, then
/// version (versionless last), then age.
const VERSION_INDEX: &str = "by-version";
/// Global secondary index: resolved entries of every consumer, by when.
const RESOLVED_INDEX: &str = "by-resolution";
/// The one partition key of the purge index.
const RESOLVED: &str = "resolved";
/// The version part of a versionless entry's version key: after every
/// digit, so after every version.
const NO_VERSION: &str = "~";

crate::part::dynamo_part!(
    /// A consumer's parked messages on DynamoDB, over the caller's
    /// `aws_sdk_dynamodb::Client`: what `idem-consumer` could not apply,
    /// with the reason, for an operator to list, replay or drop.
    ///
    /// **The key.** One item per consumer and message id: partition key
    /// `pk` the consumer's name, sort key `sk` the message id. Everything a
    /// consumer asks of its own entries lives in its own partition, so
    /// every operation but a purge is one request, strongly consistent:
    ///
    /// - `park` is one `PutItem` of the whole entry (parking again replaces
    ///   it, whatever its state: one entry per message);
    /// - `get` one consistent `GetItem`;
    /// - `resolve` one `UpdateItem` conditioned on the entry being parked
    ///   (absent or resolved, the condition refuses and nothing changes);
    /// - `parked` one consistent `Query` of a **local** secondary index:
    ///   `by-age` (sort key `<parked at>#<id>`) oldest first, or, for one
    ///   aggregate, `by-version` (sort key
    ///   `<length>:<aggregate>#<version>#<parked at>#<id>`, versionless
    ///   last), the order a replay applies them in. Only a parked entry
    ///   carries these sort keys, so the indexes hold nothing else; and a
    ///   local index, unlike a global one, reads strongly consistent, so an
    ///   entry parked or resolved a moment ago is listed as it is;
    /// - `count` one consistent `Query` of `by-age` that counts.
    ///
    /// A listing or a count whose entries fill more than DynamoDB's 1 MB
    /// page takes a request per page. Times and versions are fixed-width
    /// digits, so the sort keys order as the numbers do, ties by id in byte
    /// order.
    ///
    /// **Purge.** A resolved entry carries the key of a global secondary
    /// index, `by-resolution` (partition `rsv`, the same for all; sort key
    /// `rat`, when it was resolved): a purge is one `Query` of it for the
    /// oldest resolved entries, then one `DeleteItem` per entry found,
    /// conditioned on its still being resolved that long, so an entry
    /// parked again since stays. That index is eventually consistent: an
    /// entry resolved a moment ago may wait for the next purge.
    ///
    /// **Limits.** An entry is one item, at most 400 KB: a message whose
    /// payload and headers leave no room for the rest is refused with
    /// [`InvalidInput::TooLong`](idem_core::InvalidInput::TooLong) before
    /// anything is sent. A table with local indexes keeps at most 10 GB per partition, here per consumer: room
    /// for far more parked messages than an operator reads.
    ///
    /// The service's clock ([`ServiceClock`](crate::ServiceClock)), or the
    /// caller's the options set, stamps when an entry is parked and
    /// resolved.
    /// Every operation goes through the store's
    /// [`OperationLayer`](idem_core::store::OperationLayer): bounded by the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout),
    /// in its span and metrics.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use idem_core::ConsumerName;
    /// use idem_core::store::{ParkedQuery, ParkingStore};
    /// use idem_dynamo::{aws_sdk_dynamodb, DynamoParking, DynamoParkingOptions};
    ///
    /// # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = aws_sdk_dynamodb::Client::from_conf(config);
    /// let parking = DynamoParking::with_options(client, DynamoParkingOptions::default().table("shipping-parked"))?;
    /// parking.create_table().await?; // tests and quick starts
    /// for entry in parking.parked(&ParkedQuery::new(ConsumerName::new("shipping")?)).await? {
    ///     println!("{:?}: {}", entry.parked.message, entry.parked.reason);
    /// }
    /// # Ok(()) }
    /// ```
    pub struct DynamoParking => entries: Entries, forward_parking_store,
    DynamoParkingOptions, DEFAULT_PARKING_TABLE, usize::MAX, "parking store"
);

impl DynamoParking {
    /// Creates the table with its three indexes, unless it exists, then
    /// waits for it to be active. To create it with other tools instead:
    ///
    /// - partition key `pk` (`S`: the consumer's name), sort key `sk` (`S`:
    ///   the message id);
    /// - local secondary indexes `by-age` (sort key `age`, `S`) and
    ///   `by-version` (sort key `avk`, `S`), both projecting all
    ///   attributes (a listing reads its entries from the index);
    /// - a global secondary index `by-resolution` with partition key `rsv`
    ///   (`S`) and sort key `rat` (`N`, epoch milliseconds), keys only;
    /// - billed on demand (`PAY_PER_REQUEST`) here, or provisioned with
    ///   capacity for the global index;
    /// - no Time to Live: entries stay until purged.
    ///
    /// Local indexes can only be made with the table.
    ///
    /// ```no_run
    /// # async fn example(parking: idem_dynamo::DynamoParking) -> Result<(), idem_core::StoreError> {
    /// parking.create_table().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// DynamoDB's refusal or failure: [`StoreError::Backend`], or
    /// [`StoreError::Unavailable`] (retryable).
    pub async fn create_table(&self) -> Result<(), StoreError> {
        const OP: Operation = Operation::Setup;
        let projection = |kind: ProjectionType| Projection::builder().projection_type(kind).build();
        let local = |name: &str, sort: &str| {
            LocalSecondaryIndex::builder()
                .index_name(name)
                .key_schema(key_element(attr::PK, KeyType::Hash)?)
                .key_schema(key_element(sort, KeyType::Range)?)
                .projection(projection(ProjectionType::All))
                .build()
                .map_err(|e| build_failure(OP, e))
        };
        let resolved = GlobalSecondaryIndex::builder()
            .index_name(RESOLVED_INDEX)
            .key_schema(key_element(attr::RESOLVED, KeyType::Hash)?)
            .key_schema(key_element(attr::RESOLVED_AT, KeyType::Range)?)
            .projection(projection(ProjectionType::KeysOnly))
            .build()
            .map_err(|e| build_failure(OP, e))?;
        let mut create = self
            .client()
            .create_table()
            .table_name(self.table())
            .key_schema(key_element(attr::PK, KeyType::Hash)?)
            .key_schema(key_element(attr::SK, KeyType::Range)?)
            .local_secondary_indexes(local(AGE_INDEX, attr::AGE_KEY)?)
            .local_secondary_indexes(local(VERSION_INDEX, attr::VERSION_KEY)?)
            .global_secondary_indexes(resolved)
            .billing_mode(BillingMode::PayPerRequest);
        for (name, kind) in [
            (attr::PK, ScalarAttributeType::S),
            (attr::SK, ScalarAttributeType::S),
            (attr::AGE_KEY, ScalarAttributeType::S),
            (attr::VERSION_KEY, ScalarAttributeType::S),
            (attr::RESOLVED, ScalarAttributeType::S),
            (attr::RESOLVED_AT, ScalarAttributeType::N),
        ] {
            create = create.attribute_definitions(attribute_definition(name, kind)?);
        }
        crate::part::create_table(self.client(), self.table(), create).await
    }
}

/// A time as fixed-width digits that sort as the times do (shifted, so a
/// time before 1970 sorts too).
fn sortable_time(at: Timestamp) -> String {
    let shifted = i128::from(at.as_unix_millis()) - i128::from(i64::MIN);
    format!("{shifted:020}")
}

/// The start of every version key of `aggregate`: its length keeps it
/// unambiguous whatever it holds (`#` included), so no aggregate's keys
/// begin with another's.
fn aggregate_prefix(aggregate: &str) -> String {
    format!("{}:{aggregate}#", aggregate.len())
}

/// The age index's sort key: `<parked at>#<id>`.
fn age_key(parked_at: Timestamp, id: &IdempotencyKey) -> String {
    format!("{}#{}", sortable_time(parked_at), id.as_str())
}

/// The version index's sort key: `<length>:<aggregate>#<version>#<parked
/// at>#<id>`, the version in 20 digits or `~` (after them) for none.
fn version_key(aggregate: &str, version: Option<u64>, parked_at: Timestamp, id: &str) -> String {
    let version = version.map_or_else(|| NO_VERSION.to_string(), |v| format!("{v:020}"));
    format!(
        "{}{version}#{}#{id}",
        aggregate_prefix(aggregate),
        sortable_time(parked_at)
    )
}

/// The item of an entry parked at `now` (all of it: a park writes it whole).
///
/// # Errors
///
/// [`InvalidInput::TooLong`](idem_core::InvalidInput::TooLong) when the
/// message leaves too little of a 400 KB item for the rest of the entry.
fn item(parked: &NewParked, now: Timestamp) -> Result<Item, StoreError> {
    let message = &parked.message;
    let id = message.id();
    let headers = message.headers();
    let mut item = Item::from([
        (attr::PK.into(), s(parked.consumer.as_str())),
        (attr::SK.into(), s(id.as_str())),
        (attr::KIND.into(), s(message.kind())),
        (
            attr::HEADER_NAMES.into(),
            text_list(headers.iter().map(|(name, _)| name.as_str())),
        ),
        (
            attr::HEADER_VALUES.into(),
            text_list(headers.iter().map(|(_, value)| value.as_str())),
        ),
        (attr::PAYLOAD.into(), b(message.payload().to_vec())),
        (attr::REASON.into(), s(&parked.reason)),
        (attr::DELIVERIES.into(), n(parked.deliveries)),
        (attr::STATE.into(), s(ParkedState::Parked.as_str())),
        (attr::PARKED_AT.into(), n(now.as_unix_millis())),
        (attr::AGE_KEY.into(), s(age_key(now, id))),
    ]);
    if let Some(version) = message.version() {
        item.insert(attr::VERSION.into(), n(version));
    }
    if let Some(aggregate) = message.aggregate() {
        item.insert(attr::AGGREGATE.into(), s(aggregate));
        let key = version_key(aggregate, message.version(), now, id.as_str());
        item.insert(attr::VERSION_KEY.into(), s(key));
    }
    // What a resolve adds later is within the overhead.
    check_fits(&item, message.payload().len(), "parked message")?;
    Ok(item)
}

/// The entry an item holds, read for `op`.
///
/// # Errors
///
/// [`StoreError::Corrupt`] naming the attribute that does not decode.
fn entry(item: &Item, op: Operation) -> Result<ParkedMessage, StoreError> {
    let text = |name: &'static str| get_s(item, name).ok_or_else(|| corrupt(op, name));
    let number = |name: &'static str| get_n(item, name).ok_or_else(|| corrupt(op, name));
    let optional = |name: &'static str| item.get(name).map(|_| number(name)).transpose();
    let list = |name: &'static str| -> Result<Vec<&str>, StoreError> {
        let values = item
            .get(name)
            .and_then(|v| v.as_l().ok())
            .ok_or_else(|| corrupt(op, name))?;
        values
            .iter()
            .map(|v| v.as_s().map(String::as_str).map_err(|_| corrupt(op, name)))
            .collect()
    };
    let payload = get_b(item, attr::PAYLOAD).ok_or_else(|| corrupt(op, attr::PAYLOAD))?;
    let mut message = InboundMessage::new(text(attr::SK)?, text(attr::KIND)?, payload.to_vec())
        .map_err(|_| corrupt(op, "message"))?;
    let version = optional(attr::VERSION)?
        .map(|v| u64::try_from(v).map_err(|_| corrupt(op, attr::VERSION)))
        .transpose()?;
    if item.contains_key(attr::AGGREGATE) {
        message = message
            .with_aggregate(text(attr::AGGREGATE)?, version)
            .map_err(|_| corrupt(op, attr::AGGREGATE))?;
    }
    let (header_names, header_values) = (list(attr::HEADER_NAMES)?, list(attr::HEADER_VALUES)?);
    if header_names.len() != header_values.len() {
        return Err(corrupt(op, "headers"));
    }
    for (name, value) in header_names.into_iter().zip(header_values) {
        message = message
            .with_header(name, value)
            .map_err(|_| corrupt(op, "headers"))?;
    }
    let resolution = match item.get(attr::RESOLUTION) {
        None => None,
        Some(_) => Some(text(attr::RESOLUTION)?.to_string()),
    };
    Ok(ParkedMessage {
        parked: NewParked {
            consumer: ConsumerName::new(text(attr::PK)?).map_err(|_| corrupt(op, attr::PK))?,
            message,
            reason: text(attr::REASON)?.to_string(),
            deliveries: u32::try_from(number(attr::DELIVERIES)?)
                .map_err(|_| corrupt(op, attr::DELIVERIES))?,
        },
        state: ParkedState::parse(text(attr::STATE)?).ok_or_else(|| corrupt(op, attr::STATE))?,
        parked_at: Timestamp::from_unix_millis(number(attr::PARKED_AT)?),
        resolved_at: optional(attr::RESOLVED_AT)?.map(Timestamp::from_unix_millis),
        resolution,
    })
}

impl Entries {
    fn key(consumer: &ConsumerName, id: &IdempotencyKey) -> Item {
        Item::from([
            (attr::PK.to_string(), s(consumer.as_str())),
            (attr::SK.to_string(), s(id.as_str())),
        ])
    }

    /// The parked entries of `consumer` in `index`, in its order, at most
    /// `limit`, those of one aggregate if `prefix` (its version keys'
    /// start) is given: consistent pages until `limit` or the last.
    async fn query(
        &self,
        index: &str,
        consumer: &ConsumerName,
        prefix: Option<String>,
        limit: usize,
    ) -> Result<Vec<ParkedMessage>, StoreError> {
        const OP: Operation = Operation::List;
        let condition = match prefix {
            None => format!("#{} = :c", attr::PK),
            Some(_) => format!(
                "#{} = :c AND begins_with(#{}, :p)",
                attr::PK,
                attr::VERSION_KEY
            ),
        };
        let values: HashMap<String, AttributeValue> = [(":c".to_string(), s(consumer.as_str()))]
            .into_iter()
            .chain(prefix.map(|p| (":p".to_string(), s(p))))
            .collect();
        crate::part::query_pages(
            &self.client,
            self.table(),
            index,
            &condition,
            OP,
            limit,
            |query| {
                query
                    .set_expression_attribute_values(Some(values))
                    .consistent_read(true)
            },
            |item| entry(item, OP),
        )
        .await
    }

    /// The keys of up to `limit` entries resolved at or before `cutoff`,
    /// oldest first, as the purge index has them (eventually consistent).
    async fn resolved_keys(
        &self,
        cutoff: Timestamp,
        limit: usize,
    ) -> Result<Vec<Item>, StoreError> {
        const OP: Operation = Operation::Purge;
        let condition = format!(
            "#{} = :rsv AND #{} <= :cutoff",
            attr::RESOLVED,
            attr::RESOLVED_AT
        );
        crate::part::query_pages(
            &self.client,
            self.table(),
            RESOLVED_INDEX,
            &condition,
            OP,
            limit,
            |query| {
                query
                    .expression_attribute_values(":rsv", s(RESOLVED))
                    .expression_attribute_values(":cutoff", n(cutoff.as_unix_millis()))
            },
            |found| {
                [attr::PK, attr::SK]
                    .map(|name| {
                        found
                            .get(name)
                            .cloned()
                            .map(|value| (name.to_string(), value))
                            .ok_or_else(|| corrupt(OP, name))
                    })
                    .into_iter()
                    .collect::<Result<Item, _>>()
            },
        )
        .await
    }
}

#[async_trait]
impl ParkingStore for Entries {
    async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError> {
        let now = self.synced_now().await?;
        let item = item(parked, now)?;
        self.client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| classify(Operation::Park, e))?;
        Ok(ParkedMessage {
            parked: parked.clone(),
            state: ParkedState::Parked,
            parked_at: now,
            resolved_at: None,
            resolution: None,
        })
    }

    async fn get(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(Self::key(consumer, id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(Operation::Get, e))?;
        output
            .item()
            .map(|item| entry(item, Operation::Get))
            .transpose()
    }

    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
        let limit = validate_parking_batch(query.limit)?;
        match query.aggregate.as_deref() {
            None => self.query(AGE_INDEX, &query.consumer, None, limit).await,
            Some(aggregate) => {
                let prefix = Some(aggregate_prefix(aggregate));
                self.query(VERSION_INDEX, &query.consumer, prefix, limit)
                    .await
            }
        }
    }

    async fn resolve(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        const OP: Operation = Operation::Resolve;
        let mut set = format!(
            "SET #{st} = :st, #{rat} = :now, #{rsv} = :rsv",
            st = attr::STATE,
            rat = attr::RESOLVED_AT,
            rsv = attr::RESOLVED
        );
        let mut values = Item::from([
            (":st".to_string(), s(resolution.state().as_str())),
            (
                ":now".to_string(),
                n(self.synced_now().await?.as_unix_millis()),
            ),
            (":rsv".to_string(), s(RESOLVED)),
            (":parked".to_string(), s(ParkedState::Parked.as_str())),
        ]);
        if let Some(reason) = resolution.reason() {
            set.push_str(&format!(", #{} = :res", attr::RESOLUTION));
            values.insert(":res".to_string(), s(reason));
        }
        // Out of the listing indexes, into the purge's.
        let update = format!("{set} REMOVE #{}, #{}", attr::AGE_KEY, attr::VERSION_KEY);
        let condition = format!("#{} = :parked", attr::STATE);
        let sent = self
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(Self::key(consumer, id)))
            .set_expression_attribute_names(Some(names(&[&update, &condition])))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            // Absent, or resolved already: nothing changes.
            Err(error) if is_condition_failure(&error) => Ok(false),
            Err(error) => Err(classify(OP, error)),
        }
    }

    /// One `Query` of the purge index, then one conditional `DeleteItem`
    /// per entry found (see [`DynamoParking`]).
    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        const OP: Operation = Operation::Purge;
        let limit = validate_parking_batch(limit)?;
        let cutoff = self.synced_now().await? - older_than;
        // Still resolved, that long ago: the index lags the table, and an
        // entry parked again since must stay.
        let condition = format!(
            "#{} = :rsv AND #{} <= :cutoff",
            attr::RESOLVED,
            attr::RESOLVED_AT
        );
        let mut deleted = 0;
        for key in self.resolved_keys(cutoff, limit).await? {
            let sent = self
                .client
                .delete_item()
                .table_name(self.table())
                .set_key(Some(key))
                .set_expression_attribute_names(Some(names(&[&condition])))
                .condition_expression(condition.as_str())
                .expression_attribute_values(":rsv", s(RESOLVED))
                .expression_attribute_values(":cutoff", n(cutoff.as_unix_millis()))
                .send()
                .await;
            match sent {
                Ok(_) => deleted += 1,
                // Parked again, or purged by a racing purge.
                Err(error) if is_condition_failure(&error) => {}
                Err(error) => return Err(classify(OP, error)),
            }
        }
        Ok(deleted)
    }

    async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError> {
        const OP: Operation = Operation::Stats;
        let condition = format!("#{} = :c", attr::PK);
        let mut counted = 0;
        let mut start: Option<Item> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(self.table())
                .index_name(AGE_INDEX)
                .key_condition_expression(condition.as_str())
                .set_expression_attribute_names(Some(names(&[&condition])))
                .expression_attribute_values(":c", s(consumer.as_str()))
                .select(Select::Count)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| classify(OP, e))?;
            counted += u64::try_from(page.count()).map_err(|_| corrupt(OP, "count"))?;
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(counted);
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use idem_core::InvalidInput;

    use super::*;
    use crate::options::{ITEM_LIMIT, ITEM_OVERHEAD};

    fn parked(payload: Vec<u8>) -> NewParked {
        let message = InboundMessage::new("m-1", "order.placed", payload)
            .and_then(|m| m.with_aggregate("order#1", Some(3)))
            .and_then(|m| m.with_header("content-type", "text/plain"))
            .unwrap();
        NewParked {
            consumer: ConsumerName::new("shipping").unwrap(),
            message,
            reason: "bad total".into(),
            deliveries: 5,
        }
    }

    #[test]
    fn an_entry_survives_its_item() {
        let at = Timestamp::from_unix_millis(1_700_000_000_000);
        let new = parked(b"{}".to_vec());
        let read = entry(&item(&new, at).unwrap(), Operation::Get).unwrap();
        assert_eq!(
            (read.parked, read.state, read.parked_at, read.resolved_at),
            (new, ParkedState::Parked, at, None)
        );
    }

    #[test]
    fn sort_keys_order_as_times_and_versions_do() {
        let early = Timestamp::from_unix_millis(-5);
        let late = Timestamp::from_unix_millis(1_700_000_000_000);
        assert!(sortable_time(early) < sortable_time(late));
        assert!(
            sortable_time(Timestamp::from_unix_millis(9))
                < sortable_time(Timestamp::from_unix_millis(10))
        );
        let key = |version| version_key("order-1", version, early, "m");
        assert!(key(Some(9)) < key(Some(10)));
        assert!(key(Some(u64::MAX)) < key(None), "versionless last");
        assert!(
            !version_key("a#1", Some(1), early, "m").starts_with(&aggregate_prefix("a")),
            "no aggregate's keys begin with another's"
        );
    }

    #[test]
    fn a_message_too_large_for_an_item_is_refused() {
        let big = parked(vec![0; ITEM_LIMIT]);
        assert!(matches!(
            item(&big, Timestamp::from_unix_millis(0)),
            Err(StoreError::InvalidInput(InvalidInput::TooLong {
                field: "parked message",
                ..
            }))
        ));
        assert!(
            item(
                &parked(vec![0; ITEM_LIMIT - 2 * ITEM_OVERHEAD]),
                Timestamp::from_unix_millis(0)
            )
            .is_ok()
        );
    }

    #[test]
    fn broken_items_are_corrupt_naming_the_attribute() {
        let good = item(&parked(b"{}".to_vec()), Timestamp::from_unix_millis(0)).unwrap();
        let field = |name: &str, value: Option<AttributeValue>| {
            let mut broken = good.clone();
            match value {
                Some(value) => broken.insert(name.into(), value),
                None => broken.remove(name),
            };
            match entry(&broken, Operation::List) {
                Err(StoreError::Corrupt { field, .. }) => field,
                other => panic!("expected Corrupt, got {other:?}"),
            }
        };
        assert_eq!(field(attr::STATE, Some(s("gone"))), attr::STATE);
        assert_eq!(field(attr::DELIVERIES, Some(n(-1))), attr::DELIVERIES);
        assert_eq!(
            field(attr::HEADER_VALUES, Some(text_list(std::iter::empty()))),
            "headers"
        );
        assert_eq!(field(attr::PARKED_AT, None), attr::PARKED_AT);
        assert_eq!(field(attr::PAYLOAD, Some(s("text"))), attr::PAYLOAD);
    }
}
