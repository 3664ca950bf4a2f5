//! `DynamoOutbox`: the transactional outbox's store on DynamoDB: a log per
//! partition under one partition key, a counter item per partition and per
//! aggregate, an id item per message, and the retry lane in a local index.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, DeleteRequest, KeyType, KeysAndAttributes, LocalSecondaryIndex,
    Projection, ProjectionType, Put, ReturnValue, ScalarAttributeType, TransactWriteItem, Update,
    WriteRequest,
};
use idem_core::store::{
    Advance, Capabilities, LogBatch, LogPosition, MessageId, MessageParts, MessageState,
    NewMessage, OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PageAfter, PartitionLease,
    PartitionStats, Timestamp, partition_of, validate_lease, validate_outbox_batch,
};
use idem_core::{InvalidInput, Operation, StoreError, async_trait};

use crate::codec::{Item, b, check_fits, get_b, get_n, get_s, item_size, n, s, text_list};
use crate::error::{
    RETRYABLE_REASONS, STORE, build_failure, classify, corrupt, is_condition_failure,
};
use crate::journal_item::names;
use crate::options::DynamoOutboxOptions;
use crate::part::{attribute_definition, key_element};
use crate::transaction::{Counter, DynamoTransaction, MAX_TRANSACTION_ITEMS};

/// Attribute names. Every expression names them through `#` placeholders.
mod attr {
    /// Partition key: `p#<partition>` (its log and its state), `n#<partition>`
    /// (its position counter), `a#<aggregate>` (its sequence counter) or
    /// `m#<id>` (where a message stands).
    pub(super) const PK: &str = "pk";
    /// Sort key: a message's position in its log; 0 for every other item.
    pub(super) const SK: &str = "sk";
    pub(super) const ID: &str = "id";
    pub(super) const AGGREGATE: &str = "agg";
    pub(super) const SEQUENCE: &str = "seq";
    pub(super) const KIND: &str = "kind";
    pub(super) const HEADER_NAMES: &str = "hn";
    pub(super) const HEADER_VALUES: &str = "hv";
    pub(super) const PAYLOAD: &str = "pl";
    /// Epoch milliseconds, like every time here.
    pub(super) const ENQUEUED_AT: &str = "eat";
    pub(super) const ATTEMPTS: &str = "att";
    /// Absent while the message is in the log; [`MessageState::as_str`]
    /// once it left it.
    pub(super) const STATE: &str = "st";
    pub(super) const LAST_ERROR: &str = "err";
    pub(super) const AVAILABLE_AT: &str = "avl";
    pub(super) const SENT_AT: &str = "sat";
    /// Sort key of the lane index, on waiting and parked messages only.
    pub(super) const LANE: &str = "ln";
    /// A partition's holder, until when, and its cursor (on its state item).
    pub(super) const OWNER: &str = "own";
    pub(super) const UNTIL: &str = "until";
    pub(super) const CURSOR: &str = "ck";
    /// A counter's value; on an id item, its message's partition and
    /// position.
    pub(super) const COUNT: &str = "n";
    pub(super) const PARTITION: &str = "part";
}

/// Local secondary index: a partition's retry lane, by aggregate, then
/// sequence.
const LANE_INDEX: &str = "lane";

/// How often an enqueue counts again after racing enqueues took the
/// numbers it read: each loss means another enqueue of its partition or
/// aggregate committed, so losing this often means a hot partition.
const ENQUEUE_ATTEMPTS: u32 = 50;

/// The cancellation reason of a refused condition.
const CONDITION_FAILED: &str = "ConditionalCheckFailed";

/// DynamoDB's most keys in one `BatchGetItem`, and items in one
/// `BatchWriteItem`.
const BATCH_GET: usize = 100;
const BATCH_WRITE: usize = 25;

crate::part::dynamo_part!(
    /// The outbox store on DynamoDB, over the caller's
    /// `aws_sdk_dynamodb::Client`: the design of the Postgres outbox (a log
    /// per partition, read by one relay at a time through a cursor, a retry
    /// lane beside it) in DynamoDB's items, and
    /// [`enqueue_in`](Self::enqueue_in) puts a message into your own
    /// [`DynamoTransaction`], so it exists exactly when your business write
    /// committed.
    ///
    /// **The items** (one table, partition key `pk`, numeric sort key `sk`):
    ///
    /// - each message is an item under `p#<partition>`, its sort key its
    ///   position in the partition's log (1, 2, 3...): a read is one
    ///   strongly consistent `Query` after the cursor;
    /// - `p#<partition>` at 0 is the partition's state: its holder, the
    ///   lease's end and the cursor, every write to it fenced by a
    ///   condition on the holder and the lease;
    /// - `n#<partition>` counts the partition's positions, and
    ///   `a#<aggregate>` the aggregate's sequences;
    /// - `m#<id>` tells where a message stands (partition, position), for
    ///   the operations by id.
    ///
    /// **Enqueue** reads both counters (one consistent `BatchGetItem`),
    /// then writes the message, its id item and both counters in one
    /// `TransactWriteItems`, each counter conditioned on the value read. Of
    /// two writers of one partition or one aggregate that read the same
    /// value, one commits and the other is cancelled and counts again:
    /// sequences follow the commit order, and no two messages share a
    /// position. `TransactWriteItems` returns no values, so the counters
    /// are read first: an enqueue is two requests (two more for each race
    /// it loses, after a random pause that keeps the last winner from
    /// winning every round; the duplicate of a stored id reads the stored
    /// message instead).
    ///
    /// **Late commits.** The position counter moves in the transaction that
    /// writes the message at that position, conditioned on the position
    /// before it: the message at position `k + 1` can only commit after
    /// the one at `k` did. So the log has no holes past the cursor (a
    /// message leaving the log for the retry lane stays in it, marked) and
    /// a message that commits late takes a position after every one
    /// committed before it. A `Query` is not a snapshot, though: it reads
    /// its items one after another, and one that commits meanwhile may be
    /// missed while a later one is seen. A read therefore answers only the
    /// unbroken run of positions after the one it was given, stopping at
    /// the first one missing: a relay reading through its cursor can never
    /// step over a message. (A read from below the cursor stops at the
    /// first purged message too; relays read from the cursor.)
    ///
    /// **Why not DynamoDB Streams.** A stream hands over what committed in
    /// order per item only (each message is an item of its own, so an
    /// aggregate's order would have to be rebuilt across shards), keeps
    /// 24 hours (a relay down longer loses messages), and needs shard
    /// iterators checkpointed across shard splits; the tests' emulator,
    /// moto, would have to serve all of that as DynamoDB does, which was
    /// not relied on. The queries above read what committed, in order, on
    /// moto and DynamoDB alike, with nothing lost after a day.
    ///
    /// **The lane.** A message that failed (or waits behind its aggregate's
    /// failed one) stays at its place in the log, marked waiting or parked,
    /// and carries the key of the local index `lane` (its aggregate, then
    /// its sequence): [`due`](OutboxStore::due) is one consistent `Query`
    /// of it, [`parked`](OutboxStore::parked) one per partition.
    ///
    /// **Requests.** [`read`](OutboxStore::read) is a `Query` of the log
    /// and one of the lane (for the blocked aggregates), sent at once;
    /// [`advance`](OutboxStore::advance) one `TransactWriteItems` (the
    /// state's fenced update and one conditioned update per message it
    /// settles), after one `BatchGetItem` of the id items of the messages
    /// it names, and one transaction per 99 of them: each fenced, the
    /// cursor moved by the last. A message's condition refusing (the same
    /// advance delivered twice) is dropped from a transaction sent again.
    /// [`acquire`](OutboxStore::acquire) one `BatchGetItem` of the states
    /// (per 100 partitions) and one conditioned `UpdateItem`;
    /// [`release`](OutboxStore::release) one `UpdateItem`; the operations
    /// by id (`message`, `retry`, `drop_message`) read the id item, then
    /// the message; [`stats`](OutboxStore::stats) and
    /// [`purge_sent`](OutboxStore::purge_sent) one `Query` per partition
    /// (a page each 1 MB), a purge then a `BatchWriteItem` per 25 deletes.
    ///
    /// **Limits.** A message is one item, at most 400 KB with its
    /// attributes: a larger one is refused with [`InvalidInput::TooLong`]
    /// before anything is sent. A partition's messages share one item
    /// collection, which a table with a local index keeps to 10 GB: purge
    /// sent messages, or use more partitions. Each partition's enqueues
    /// are serialised on its counter: more partitions, more enqueues at
    /// once.
    ///
    /// Leases, back-off and ages are the service's clock's
    /// ([`ServiceClock`](crate::ServiceClock)), or the caller's the options
    /// set. On the service's clock a back-off is a tenth longer than asked:
    /// the clock may run that much fast while it catches up with the
    /// service, and a back-off never ends early. Every operation goes through the store's
    /// [`OperationLayer`](idem_core::store::OperationLayer): bounded by the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout),
    /// in its span and metrics, ending in a retryable
    /// [`StoreError::Unavailable`] past it.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use idem_core::store::{Advance, NewMessage, OutboxStore, OwnerToken};
    /// use idem_dynamo::{aws_sdk_dynamodb, DynamoOutbox, DynamoOutboxOptions};
    ///
    /// # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = aws_sdk_dynamodb::Client::from_conf(config);
    /// let outbox = DynamoOutbox::with_options(client, DynamoOutboxOptions::default().partitions(4))?;
    /// outbox.create_table().await?; // tests and quick starts
    /// let placed = outbox
    ///     .enqueue(&NewMessage::new("order-42", "order.placed", b"{}".to_vec())?)
    ///     .await?;
    /// assert_eq!(placed.parts().sequence, 1);
    /// let lease = outbox.acquire(OwnerToken::generate(), Duration::from_secs(30)).await?.expect("a free partition");
    /// let batch = outbox.read(lease.partition(), lease.cursor(), 100).await?;
    /// // ... published and confirmed ...
    /// if let Some(end) = batch.end() {
    ///     outbox.advance(&lease, &Advance::to(end)).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub struct DynamoOutbox => messages: Messages, forward_outbox_store,
    DynamoOutboxOptions, DEFAULT_OUTBOX_TABLE, usize::MAX, "outbox store"
);

impl DynamoOutbox {
    /// Creates the table with its lane index, unless it exists, then waits
    /// for it to be active. To create it with other tools instead:
    ///
    /// - partition key `pk` (`S`), sort key `sk` (`N`);
    /// - a local secondary index `lane` with sort key `ln` (`S`),
    ///   projecting all attributes (`due` and `parked` read messages from
    ///   it);
    /// - billed on demand (`PAY_PER_REQUEST`) here, or provisioned;
    /// - no Time to Live: messages stay until purged.
    ///
    /// Local indexes can only be made with the table.
    ///
    /// ```no_run
    /// # async fn example(outbox: idem_dynamo::DynamoOutbox) -> Result<(), idem_core::StoreError> {
    /// outbox.create_table().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// DynamoDB's refusal or failure: [`StoreError::Backend`], or
    /// [`StoreError::Unavailable`] (retryable).
    pub async fn create_table(&self) -> Result<(), StoreError> {
        const OP: Operation = Operation::Setup;
        let lane = LocalSecondaryIndex::builder()
            .index_name(LANE_INDEX)
            .key_schema(key_element(attr::PK, KeyType::Hash)?)
            .key_schema(key_element(attr::LANE, KeyType::Range)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build(),
            )
            .build()
            .map_err(|e| build_failure(OP, e))?;
        let mut create = self
            .client()
            .create_table()
            .table_name(self.table())
            .key_schema(key_element(attr::PK, KeyType::Hash)?)
            .key_schema(key_element(attr::SK, KeyType::Range)?)
            .local_secondary_indexes(lane)
            .billing_mode(BillingMode::PayPerRequest);
        for (name, kind) in [
            (attr::PK, ScalarAttributeType::S),
            (attr::SK, ScalarAttributeType::N),
            (attr::LANE, ScalarAttributeType::S),
        ] {
            create = create.attribute_definitions(attribute_definition(name, kind)?);
        }
        crate::part::create_table(self.client(), self.table(), create).await
    }

    /// How many partitions the outbox has.
    ///
    /// ```no_run
    /// # fn example(outbox: idem_dynamo::DynamoOutbox) {
    /// assert!(outbox.partitions() >= 1);
    /// # }
    /// ```
    pub fn partitions(&self) -> u32 {
        self.parts().settings.partitions
    }

    /// An empty [`DynamoTransaction`] on the outbox's client (no request is
    /// sent): push your items, [`enqueue_in`](Self::enqueue_in) your
    /// messages, and [`commit`](idem_core::store::Transaction::commit) it.
    /// Inside [`Idempotency::run_in`](idem_core::Idempotency::run_in), use
    /// the one [`DynamoStore::begin`](crate::DynamoStore::begin) opens
    /// instead: the record's completion commits with them.
    ///
    /// ```no_run
    /// # async fn example(outbox: idem_dynamo::DynamoOutbox) -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_core::store::{NewMessage, Transaction};
    ///
    /// let mut tx = outbox.begin();
    /// outbox.enqueue_in(&mut tx, &NewMessage::new("order-42", "order.placed", b"{}".to_vec())?).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn begin(&self) -> DynamoTransaction {
        let parts = self.parts();
        DynamoTransaction::new(parts.client.clone(), parts.settings.clone())
    }

    /// Enqueues `message` inside your transaction: the message, its id
    /// item and its partition's and aggregate's counters join your items,
    /// and commit with them or not at all. Reads the counters now (one
    /// consistent `BatchGetItem`); the counters' updates are conditioned on
    /// what it read, so a racing enqueue of the same aggregate or partition
    /// that commits first cancels your commit, which then fails with a
    /// retryable [`StoreError::Unavailable`]: nothing was written, and run
    /// again (a new transaction, your items and this enqueue) it counts
    /// anew. Several messages in one transaction take consecutive numbers.
    /// Answers the message as it will be stored once the transaction
    /// commits. An id stored already is answered as stored, and nothing
    /// joins the transaction.
    ///
    /// ```no_run
    /// use idem_core::store::{NewMessage, Transaction};
    /// use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    /// use idem_dynamo::DynamoOutbox;
    ///
    /// # async fn example(outbox: DynamoOutbox) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = outbox.begin();
    /// tx.push(TransactWriteItem::builder().put(
    ///     Put::builder().table_name("orders").item("pk", AttributeValue::S("order#42".into())).build()?,
    /// ).build());
    /// let placed = NewMessage::new("order-42", "order.placed", br#"{"id":42}"#.to_vec())?;
    /// outbox.enqueue_in(&mut tx, &placed).await?;
    /// tx.commit().await?; // the order and its message, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`OutboxStore::enqueue`]; [`StoreError::InvalidInput`] when the
    /// transaction would exceed DynamoDB's limits (100 items, 4 MB), with
    /// nothing added to it.
    pub async fn enqueue_in(
        &self,
        tx: &mut DynamoTransaction,
        message: &NewMessage,
    ) -> Result<OutboxMessage, StoreError> {
        let enqueued = self.parts().enqueue_into(tx, message);
        self.messages
            .layer()
            .call(Operation::Enqueue, None, enqueued)
            .await
    }
}

/// The log's partition key of `partition`.
fn log_pk(partition: u32) -> String {
    format!("p#{partition}")
}

fn key(pk: String, sk: u64) -> Item {
    Item::from([(attr::PK.to_string(), s(pk)), (attr::SK.to_string(), n(sk))])
}

/// The state item of `partition`: its holder and cursor.
fn state_key(partition: u32) -> Item {
    key(log_pk(partition), 0)
}

fn position_key(partition: u32) -> Item {
    key(format!("n#{partition}"), 0)
}

fn sequence_key(aggregate: &str) -> Item {
    key(format!("a#{aggregate}"), 0)
}

fn id_key(id: MessageId) -> Item {
    key(format!("m#{id}"), 0)
}

fn message_key(partition: u32, position: u64) -> Item {
    key(log_pk(partition), position)
}

/// The lane index's sort key: `<length>:<aggregate>#<sequence>`, the
/// length first so that no aggregate's keys begin with another's, the
/// sequence in 20 digits so that they sort as numbers.
fn lane_key(aggregate: &str, sequence: u64) -> AttributeValue {
    s(format!("{}:{aggregate}#{sequence:020}", aggregate.len()))
}

fn millis(at: Timestamp) -> AttributeValue {
    n(at.as_unix_millis())
}

/// The item of `message` enqueued at `now` as `parts` say.
///
/// # Errors
///
/// [`InvalidInput::TooLong`] when it leaves too little of a 400 KB item for
/// what a failure adds later.
fn message_item(message: &NewMessage, parts: &MessageParts) -> Result<Item, StoreError> {
    let headers = message.headers();
    let mut item = message_key(parts.partition, parts.position.major());
    item.extend([
        (attr::ID.to_string(), s(message.id().to_string())),
        (attr::AGGREGATE.to_string(), s(message.aggregate())),
        (attr::SEQUENCE.to_string(), n(parts.sequence)),
        (attr::KIND.to_string(), s(message.kind())),
        (
            attr::HEADER_NAMES.to_string(),
            text_list(headers.iter().map(|(name, _)| name.as_str())),
        ),
        (
            attr::HEADER_VALUES.to_string(),
            text_list(headers.iter().map(|(_, value)| value.as_str())),
        ),
        (attr::PAYLOAD.to_string(), b(message.payload().to_vec())),
        (attr::ENQUEUED_AT.to_string(), millis(parts.enqueued_at)),
        (attr::AVAILABLE_AT.to_string(), millis(parts.available_at)),
        (attr::ATTEMPTS.to_string(), n(0)),
        (
            LANE_SOURCE.to_string(),
            lane_key(message.aggregate(), parts.sequence),
        ),
    ]);
    check_fits(&item, message.payload().len(), "outbox message")?;
    Ok(item)
}

/// The partition an item's key `p#<partition>` names.
fn partition_in(item: &Item, op: Operation) -> Result<u32, StoreError> {
    get_s(item, attr::PK)
        .and_then(|pk| pk.strip_prefix("p#"))
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| corrupt(op, "partition"))
}

fn number(item: &Item, name: &'static str, op: Operation) -> Result<u64, StoreError> {
    get_n(item, name)
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| corrupt(op, name))
}

fn time(item: &Item, name: &'static str) -> Option<Timestamp> {
    get_n(item, name).map(Timestamp::from_unix_millis)
}

/// The message an item holds, shown sent if it is in the log at or before
/// `cursor`.
fn stored(
    item: &Item,
    cursor: Option<LogPosition>,
    op: Operation,
) -> Result<OutboxMessage, StoreError> {
    let text = |name: &'static str| get_s(item, name).ok_or_else(|| corrupt(op, name));
    let list = |name: &'static str| -> Result<Vec<String>, StoreError> {
        let values = item
            .get(name)
            .and_then(|v| v.as_l().ok())
            .ok_or_else(|| corrupt(op, name))?;
        values
            .iter()
            .map(|v| v.as_s().cloned().map_err(|_| corrupt(op, name)))
            .collect()
    };
    let id = uuid_of(text(attr::ID)?).ok_or_else(|| corrupt(op, attr::ID))?;
    let position = LogPosition::new(number(item, attr::SK, op)?, 0);
    let state = match get_s(item, attr::STATE) {
        None if cursor.is_some_and(|cursor| position <= cursor) => MessageState::Sent,
        None => MessageState::Pending,
        Some(name) => MessageState::parse(name).ok_or_else(|| corrupt(op, attr::STATE))?,
    };
    let (names, values) = (list(attr::HEADER_NAMES)?, list(attr::HEADER_VALUES)?);
    if names.len() != values.len() {
        return Err(corrupt(op, "headers"));
    }
    let payload = get_b(item, attr::PAYLOAD).ok_or_else(|| corrupt(op, attr::PAYLOAD))?;
    let required = |name: &'static str| time(item, name).ok_or_else(|| corrupt(op, name));
    let parts = MessageParts {
        sequence: number(item, attr::SEQUENCE, op)?,
        partition: partition_in(item, op)?,
        position,
        state,
        attempts: u32::try_from(number(item, attr::ATTEMPTS, op)?)
            .map_err(|_| corrupt(op, attr::ATTEMPTS))?,
        last_error: get_s(item, attr::LAST_ERROR).map(str::to_string),
        enqueued_at: required(attr::ENQUEUED_AT)?,
        available_at: required(attr::AVAILABLE_AT)?,
        sent_at: time(item, attr::SENT_AT),
    };
    let message = NewMessage::from_stored(
        MessageId::from_uuid(id),
        text(attr::AGGREGATE)?.to_string(),
        text(attr::KIND)?.to_string(),
        names.into_iter().zip(values).collect(),
        payload.to_vec(),
    );
    Ok(OutboxMessage::new(message, parts))
}

fn uuid_of(text: &str) -> Option<uuid::Uuid> {
    uuid::Uuid::parse_str(text).ok()
}

/// A state item's cursor (none moved yet: the start).
fn cursor_of(state: Option<&Item>, op: Operation) -> Result<LogPosition, StoreError> {
    match state {
        Some(item) if item.contains_key(attr::CURSOR) => {
            Ok(LogPosition::new(number(item, attr::CURSOR, op)?, 0))
        }
        _ => Ok(LogPosition::START),
    }
}

/// The item of `items` whose key is `key`.
fn find<'a>(items: &'a [Item], key: &Item) -> Option<&'a Item> {
    items.iter().find(|item| {
        item.get(attr::PK) == key.get(attr::PK) && item.get(attr::SK) == key.get(attr::SK)
    })
}

/// A message's enqueue, planned on the counters as read: what it writes,
/// the counters it moves, and the message as it will be stored.
struct Plan {
    stored: OutboxMessage,
    writes: Vec<TransactWriteItem>,
    bytes: usize,
    counters: Vec<Counter>,
}

/// A transaction's outcome: committed, or cancelled with each item's
/// reason (`None` where it did not fail).
enum Sent {
    Committed,
    Cancelled(Vec<String>),
}

impl Messages {
    fn partitions(&self) -> u32 {
        self.settings.partitions
    }

    fn check_partition(&self, partition: u32) -> Result<(), StoreError> {
        if partition >= self.partitions() {
            return Err(InvalidInput::OutOfRange {
                field: "partition",
                reason: "the outbox has no such partition",
            }
            .into());
        }
        Ok(())
    }

    /// The items of `keys` that exist, read consistently: one
    /// `BatchGetItem` per 100 keys (and again for what it left
    /// unprocessed).
    async fn get_many(&self, keys: Vec<Item>, op: Operation) -> Result<Vec<Item>, StoreError> {
        let mut found = Vec::new();
        for chunk in keys.chunks(BATCH_GET) {
            let mut asking = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(chunk.to_vec()))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| build_failure(op, e))?,
            );
            while let Some(ask) = asking.take() {
                let answer = self
                    .client
                    .batch_get_item()
                    .request_items(self.table(), ask)
                    .send()
                    .await
                    .map_err(|e| classify(op, e))?;
                if let Some(items) = answer.responses().and_then(|r| r.get(self.table())) {
                    found.extend(items.iter().cloned());
                }
                asking = answer
                    .unprocessed_keys()
                    .and_then(|u| u.get(self.table()))
                    .filter(|left| !left.keys().is_empty())
                    .cloned();
            }
        }
        Ok(found)
    }

    /// One item, read consistently.
    async fn get(&self, key: Item, op: Operation) -> Result<Option<Item>, StoreError> {
        let answer = self
            .client
            .get_item()
            .table_name(self.table())
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(op, e))?;
        Ok(answer.item().cloned())
    }

    /// The items of a consistent `Query` (of `index`, or the table) whose
    /// key matches `condition` with `values`, in order, at most `limit`
    /// (every one if `None`): a request per page.
    async fn query(
        &self,
        op: Operation,
        index: Option<&str>,
        condition: &str,
        values: Item,
        limit: Option<usize>,
    ) -> Result<Vec<Item>, StoreError> {
        let query = self
            .client
            .query()
            .table_name(self.table())
            .set_index_name(index.map(str::to_string))
            .key_condition_expression(condition)
            .set_expression_attribute_names(Some(names(&[condition])))
            .set_expression_attribute_values(Some(values))
            .consistent_read(true)
            .scan_index_forward(true);
        let mut found = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let mut page = query.clone().set_exclusive_start_key(start.take());
            if let Some(limit) = limit {
                let left = limit.saturating_sub(found.len());
                page = page.limit(i32::try_from(left).unwrap_or(i32::MAX));
            }
            let answer = page.send().await.map_err(|e| classify(op, e))?;
            found.extend(answer.items().iter().cloned());
            start = answer.last_evaluated_key().cloned();
            let full = limit.is_some_and(|limit| found.len() >= limit);
            if start.is_none() || full {
                return Ok(found);
            }
        }
    }

    /// Every item of `partition`'s log collection: its state (first) and
    /// its messages, in position order.
    async fn collection(&self, partition: u32, op: Operation) -> Result<Vec<Item>, StoreError> {
        let condition = format!("#{} = :pk AND #{} >= :zero", attr::PK, attr::SK);
        let values = Item::from([
            (":pk".to_string(), s(log_pk(partition))),
            (":zero".to_string(), n(0)),
        ]);
        self.query(op, None, &condition, values, None).await
    }

    /// `partition`'s retry lane: its waiting and parked messages, each
    /// aggregate's in sequence order.
    async fn lane(&self, partition: u32, op: Operation) -> Result<Vec<Item>, StoreError> {
        let condition = format!("#{} = :pk", attr::PK);
        let values = Item::from([(":pk".to_string(), s(log_pk(partition)))]);
        self.query(op, Some(LANE_INDEX), &condition, values, None)
            .await
    }

    /// Sends `items` as one `TransactWriteItems`.
    async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        op: Operation,
    ) -> Result<Sent, StoreError> {
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        let Err(error) = sent else {
            return Ok(Sent::Committed);
        };
        let Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) =
            error.as_service_error()
        else {
            return Err(classify(op, error));
        };
        Ok(Sent::Cancelled(
            cancelled
                .cancellation_reasons()
                .iter()
                .map(|reason| reason.code().unwrap_or("None").to_string())
                .collect(),
        ))
    }

    /// The enqueue of `message` on the counters as read (`None`: never
    /// moved), at `now`.
    fn plan(
        &self,
        message: &NewMessage,
        now: Timestamp,
        sequence_from: Option<u64>,
        position_from: Option<u64>,
    ) -> Result<Plan, StoreError> {
        const OP: Operation = Operation::Enqueue;
        let partition = partition_of(message.aggregate(), self.partitions());
        let sequence = sequence_from.unwrap_or(0).saturating_add(1);
        let position = position_from.unwrap_or(0).saturating_add(1);
        let parts = MessageParts {
            sequence,
            partition,
            position: LogPosition::new(position, 0),
            state: MessageState::Pending,
            attempts: 0,
            last_error: None,
            enqueued_at: now,
            available_at: now,
            sent_at: None,
        };
        let item = message_item(message, &parts)?;
        let bytes = item_size(&item);
        let absent = format!("attribute_not_exists(#{})", attr::PK);
        let put = |item: Item| {
            Put::builder()
                .table_name(self.table())
                .set_item(Some(item))
                .condition_expression(absent.as_str())
                .set_expression_attribute_names(Some(names(&[&absent])))
                .build()
                .map(|put| TransactWriteItem::builder().put(put).build())
                .map_err(|e| build_failure(OP, e))
        };
        let mut pointer = id_key(message.id());
        pointer.extend([
            (attr::PARTITION.to_string(), n(partition)),
            (attr::COUNT.to_string(), n(position)),
        ]);
        let counter = |key: Item, from: Option<u64>, to: u64| Counter {
            table: self.table().to_string(),
            key,
            attr: attr::COUNT,
            from,
            to,
        };
        Ok(Plan {
            stored: OutboxMessage::new(message.clone(), parts),
            writes: vec![put(item)?, put(pointer)?],
            bytes,
            counters: vec![
                counter(sequence_key(message.aggregate()), sequence_from, sequence),
                counter(position_key(partition), position_from, position),
            ],
        })
    }

    /// Reads `message`'s id item and both its counters: the message stored
    /// under its id, or the counters' values (`None`: never moved).
    async fn counters(
        &self,
        message: &NewMessage,
    ) -> Result<Result<(Option<u64>, Option<u64>), Item>, StoreError> {
        const OP: Operation = Operation::Enqueue;
        let partition = partition_of(message.aggregate(), self.partitions());
        let keys = vec![
            id_key(message.id()),
            sequence_key(message.aggregate()),
            position_key(partition),
        ];
        let found = self.get_many(keys.clone(), OP).await?;
        if let Some(pointer) = find(&found, &keys[0]) {
            return Ok(Err(pointer.clone()));
        }
        let value = |key: &Item| {
            find(&found, key)
                .map(|item| number(item, attr::COUNT, OP))
                .transpose()
        };
        Ok(Ok((value(&keys[1])?, value(&keys[2])?)))
    }

    /// The message an id item points at, as it stands: its item and its
    /// partition's state read in one `BatchGetItem`.
    async fn pointed(
        &self,
        pointer: &Item,
        op: Operation,
    ) -> Result<Option<OutboxMessage>, StoreError> {
        let partition = u32::try_from(number(pointer, attr::PARTITION, op)?)
            .map_err(|_| corrupt(op, attr::PARTITION))?;
        let position = number(pointer, attr::COUNT, op)?;
        let keys = vec![message_key(partition, position), state_key(partition)];
        let found = self.get_many(keys.clone(), op).await?;
        let cursor = cursor_of(find(&found, &keys[1]), op)?;
        find(&found, &keys[0])
            .map(|item| stored(item, Some(cursor), op))
            .transpose()
    }

    /// The key of the message `id` (its partition and position), from its
    /// id item.
    async fn located(
        &self,
        id: MessageId,
        op: Operation,
    ) -> Result<Option<(u32, u64, Item)>, StoreError> {
        let Some(pointer) = self.get(id_key(id), op).await? else {
            return Ok(None);
        };
        let partition = u32::try_from(number(&pointer, attr::PARTITION, op)?)
            .map_err(|_| corrupt(op, attr::PARTITION))?;
        let position = number(&pointer, attr::COUNT, op)?;
        Ok(Some((
            partition,
            position,
            message_key(partition, position),
        )))
    }

    /// One `UpdateItem` of `key` under `condition`: whether the condition
    /// held (and the update was made).
    async fn update_if(
        &self,
        key: Item,
        update: &str,
        condition: &str,
        values: Item,
        op: Operation,
    ) -> Result<bool, StoreError> {
        let sent = self
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(key))
            .set_expression_attribute_names(Some(names(&[update, condition])))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(error) if is_condition_failure(&error) => Ok(false),
            Err(error) => Err(classify(op, error)),
        }
    }

    /// Updates the parked message `id` by `update` (with `values`), if it
    /// is parked: whether it was.
    async fn update_parked(
        &self,
        id: MessageId,
        update: &str,
        mut values: Item,
        op: Operation,
    ) -> Result<bool, StoreError> {
        let Some((_, _, key)) = self.located(id, op).await? else {
            return Ok(false);
        };
        let condition = format!("#{} = :parked", attr::STATE);
        values.insert(":parked".to_string(), s(MessageState::Parked.as_str()));
        self.update_if(key, update, &condition, values, op).await
    }

    /// Enqueues into `tx` (see [`DynamoOutbox::enqueue_in`]).
    async fn enqueue_into(
        &self,
        tx: &mut DynamoTransaction,
        message: &NewMessage,
    ) -> Result<OutboxMessage, StoreError> {
        const OP: Operation = Operation::Enqueue;
        let now = self.synced_now().await?;
        let (sequence, position) = match self.counters(message).await? {
            Ok(counters) => counters,
            Err(pointer) => {
                return self
                    .pointed(&pointer, OP)
                    .await?
                    .ok_or_else(|| corrupt(OP, "message"));
            }
        };
        let partition = partition_of(message.aggregate(), self.partitions());
        // Moved already in this transaction: count on from there, under
        // the condition its first move set.
        let sequence = tx
            .counter(self.table(), &sequence_key(message.aggregate()))
            .or(sequence);
        let position = tx
            .counter(self.table(), &position_key(partition))
            .or(position);
        let plan = self.plan(message, now, sequence, position)?;
        tx.enqueue(plan.writes, plan.bytes, plan.counters)?;
        Ok(plan.stored)
    }

    /// The update of one message of a settled advance, conditioned on the
    /// state it settles.
    fn settle_update(
        &self,
        key: Item,
        set: &str,
        condition: &str,
        values: Item,
    ) -> Result<TransactWriteItem, StoreError> {
        let update = Update::builder()
            .table_name(self.table())
            .set_key(Some(key))
            .set_expression_attribute_names(Some(names(&[set, condition])))
            .update_expression(set)
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .build()
            .map_err(|e| build_failure(Operation::Advance, e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// The updates `advance` makes to the messages it names in
    /// `partition`, by their id items.
    async fn settlements(
        &self,
        partition: u32,
        advance: &Advance,
        now: Timestamp,
    ) -> Result<Vec<TransactWriteItem>, StoreError> {
        const OP: Operation = Operation::Advance;
        let mut ids: Vec<MessageId> = Vec::new();
        let named = advance
            .failed
            .iter()
            .map(|f| f.id)
            .chain(advance.held.iter().copied())
            .chain(advance.sent.iter().copied());
        for id in named {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let pointers = self
            .get_many(ids.iter().map(|id| id_key(*id)).collect(), OP)
            .await?;
        // Where each message named stands in this partition; others are
        // not this lease's to settle.
        let mut places: HashMap<MessageId, u64> = HashMap::new();
        for pointer in &pointers {
            let id = get_s(pointer, attr::PK)
                .and_then(|pk| pk.strip_prefix("m#"))
                .and_then(uuid_of)
                .ok_or_else(|| corrupt(OP, attr::PK))?;
            if number(pointer, attr::PARTITION, OP)? == u64::from(partition) {
                places.insert(MessageId::from_uuid(id), number(pointer, attr::COUNT, OP)?);
            }
        }
        let waiting = MessageState::Waiting.as_str();
        // On the service's clock, which may run a tenth fast while it
        // catches up, a back-off is stretched so that it never ends early.
        let backoff = |span: Duration| match self.settings.service {
            Some(_) => crate::clock::ServiceClock::at_least(span),
            None => span,
        };
        // Each message's update: what it sets, on which condition, with
        // which values.
        let mut planned: Vec<(MessageId, String, String, Item)> = Vec::new();
        for failure in &advance.failed {
            let attempts = failure.attempts.saturating_add(1);
            let state = if attempts >= failure.max_attempts {
                MessageState::Parked
            } else {
                MessageState::Waiting
            };
            // Into the lane: its key is copied from the one the item got at
            // its enqueue, so no read of the message is needed.
            let set = format!(
                "SET #{att} = :att, #{err} = :err, #{avl} = :avl, #{st} = :st, #{ln} = #{lnk}",
                att = attr::ATTEMPTS,
                err = attr::LAST_ERROR,
                avl = attr::AVAILABLE_AT,
                st = attr::STATE,
                ln = attr::LANE,
                lnk = LANE_SOURCE,
            );
            let condition = format!(
                "#{att} = :was AND (attribute_not_exists(#{st}) OR #{st} = :waiting)",
                att = attr::ATTEMPTS,
                st = attr::STATE
            );
            let values = Item::from([
                (":att".to_string(), n(attempts)),
                (":was".to_string(), n(failure.attempts)),
                (":err".to_string(), s(&failure.error)),
                (
                    ":avl".to_string(),
                    millis(now + backoff(failure.retry_after)),
                ),
                (":st".to_string(), s(state.as_str())),
                (":waiting".to_string(), s(waiting)),
            ]);
            planned.push((failure.id, set, condition, values));
        }
        let held = format!(
            "SET #{st} = :waiting, #{avl} = :now, #{ln} = #{lnk}",
            st = attr::STATE,
            avl = attr::AVAILABLE_AT,
            ln = attr::LANE,
            lnk = LANE_SOURCE,
        );
        let in_log = format!(
            "attribute_exists(#{}) AND attribute_not_exists(#{})",
            attr::ID,
            attr::STATE
        );
        for id in &advance.held {
            let values = Item::from([
                (":waiting".to_string(), s(waiting)),
                (":now".to_string(), millis(now)),
            ]);
            planned.push((*id, held.clone(), in_log.clone(), values));
        }
        let sent = format!(
            "SET #{} = :sent, #{} = :now REMOVE #{}",
            attr::STATE,
            attr::SENT_AT,
            attr::LANE,
        );
        let in_lane = format!("#{} = :waiting", attr::STATE);
        for id in &advance.sent {
            let values = Item::from([
                (":sent".to_string(), s(MessageState::Sent.as_str())),
                (":waiting".to_string(), s(waiting)),
                (":now".to_string(), millis(now)),
            ]);
            planned.push((*id, sent.clone(), in_lane.clone(), values));
        }
        // One update per message (DynamoDB takes one per item in a
        // transaction): the first that names it.
        let mut settled: Vec<MessageId> = Vec::new();
        let mut updates = Vec::new();
        for (id, set, condition, values) in planned {
            let Some(position) = places.get(&id).copied() else {
                continue;
            };
            if settled.contains(&id) {
                continue;
            }
            settled.push(id);
            let key = message_key(partition, position);
            updates.push(self.settle_update(key, &set, &condition, values)?);
        }
        Ok(updates)
    }

    /// The fenced update of `lease`'s state: renewed until `until`, its
    /// cursor moved to `to` (only forward) if given.
    fn renewal(
        &self,
        lease: &PartitionLease,
        now: Timestamp,
        until: Timestamp,
        to: Option<LogPosition>,
    ) -> Result<TransactWriteItem, StoreError> {
        let mut set = format!("SET #{} = :until", attr::UNTIL);
        let mut condition = format!("#{} = :own AND #{} > :now", attr::OWNER, attr::UNTIL);
        let mut values = Item::from([
            (":own".to_string(), s(lease.owner().to_string())),
            (":until".to_string(), millis(until)),
            (":now".to_string(), millis(now)),
        ]);
        if let Some(to) = to {
            set.push_str(&format!(", #{} = :to", attr::CURSOR));
            condition.push_str(&format!(
                " AND (attribute_not_exists(#{ck}) OR #{ck} <= :to)",
                ck = attr::CURSOR
            ));
            values.insert(":to".to_string(), n(to.major()));
        }
        let update = Update::builder()
            .table_name(self.table())
            .set_key(Some(state_key(lease.partition())))
            .set_expression_attribute_names(Some(names(&[&set, &condition])))
            .update_expression(set)
            .condition_expression(condition)
            .set_expression_attribute_values(Some(values))
            .build()
            .map_err(|e| build_failure(Operation::Advance, e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }
}

/// A random pause of up to 2^`losses` ms (64 ms at most) after a lost
/// race for a counter: racing writers spread out instead of meeting again.
fn lost_race_pause(losses: u32) -> Duration {
    let ceiling = 1u64 << losses.min(6);
    let random = uuid::Uuid::new_v4().as_u128() as u64;
    Duration::from_millis(random % (ceiling + 1))
}

/// The attribute a message item keeps its own lane key in, from its
/// enqueue: a failure or a hold copies it into the lane index's key
/// ([`attr::LANE`]), so that an update needs no read of the message.
const LANE_SOURCE: &str = "lk";

#[async_trait]
impl OutboxStore for Messages {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        const OP: Operation = Operation::Enqueue;
        let now = self.synced_now().await?;
        for attempt in 0..ENQUEUE_ATTEMPTS {
            let (sequence, position) = match self.counters(message).await? {
                Ok(counters) => counters,
                Err(pointer) => {
                    return self
                        .pointed(&pointer, OP)
                        .await?
                        .ok_or_else(|| corrupt(OP, "message"));
                }
            };
            let plan = self.plan(message, now, sequence, position)?;
            let mut items = plan.writes;
            for counter in &plan.counters {
                items.push(counter.item()?);
            }
            match self.transact(items, OP).await? {
                Sent::Committed => return Ok(plan.stored),
                Sent::Cancelled(reasons)
                    if reasons.iter().all(|r| {
                        r == "None"
                            || r == CONDITION_FAILED
                            || RETRYABLE_REASONS.contains(&r.as_str())
                    }) =>
                {
                    // Another enqueue took a number first (or the same
                    // id committed meanwhile): read again, after a random
                    // pause growing with the losses, or the writer that
                    // just won, reading first, wins every round.
                    tokio::time::sleep(lost_race_pause(attempt)).await;
                }
                Sent::Cancelled(reasons) => {
                    return Err(StoreError::Backend {
                        store: STORE,
                        operation: OP,
                        message: format!("the enqueue was cancelled: {}", reasons.join(", ")),
                        source: None,
                    });
                }
            }
        }
        Err(StoreError::unavailable(
            STORE,
            OP,
            "racing enqueues of the same partition or aggregate took every number this one read",
        ))
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        const OP: Operation = Operation::Acquire;
        let lease = validate_lease(lease)?;
        let now = self.synced_now().await?;
        let keys: Vec<Item> = (0..self.partitions()).map(state_key).collect();
        let states = self.get_many(keys.clone(), OP).await?;
        let free = |key: &Item| {
            find(&states, key).is_none_or(|state| {
                !state.contains_key(attr::OWNER)
                    || get_n(state, attr::UNTIL).is_none_or(|until| until <= now.as_unix_millis())
            })
        };
        let until = now + lease;
        let set = format!("SET #{} = :own, #{} = :until", attr::OWNER, attr::UNTIL);
        let condition = format!(
            "attribute_not_exists(#{own}) OR attribute_not_exists(#{until}) OR #{until} <= :now",
            own = attr::OWNER,
            until = attr::UNTIL
        );
        for (partition, key) in (0..self.partitions()).zip(keys) {
            if !free(&key) {
                continue;
            }
            let taken = self
                .client
                .update_item()
                .table_name(self.table())
                .set_key(Some(key))
                .set_expression_attribute_names(Some(names(&[&set, &condition])))
                .update_expression(set.as_str())
                .condition_expression(condition.as_str())
                .expression_attribute_values(":own", s(owner.to_string()))
                .expression_attribute_values(":until", millis(until))
                .expression_attribute_values(":now", millis(now))
                .return_values(ReturnValue::AllNew)
                .send()
                .await;
            match taken {
                Ok(answer) => {
                    let cursor = cursor_of(answer.attributes(), OP)?;
                    return Ok(Some(PartitionLease::issued(
                        partition, owner, lease, until, cursor,
                    )));
                }
                // Taken by a racing acquire: the next free one.
                Err(error) if is_condition_failure(&error) => {}
                Err(error) => return Err(classify(OP, error)),
            }
        }
        Ok(None)
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        const OP: Operation = Operation::Read;
        let limit = validate_outbox_batch(limit)?;
        self.check_partition(partition)?;
        let condition = format!("#{} = :pk AND #{} > :after", attr::PK, attr::SK);
        let values = Item::from([
            (":pk".to_string(), s(log_pk(partition))),
            (":after".to_string(), n(after.major())),
        ]);
        let (log, lane) = tokio::try_join!(
            self.query(OP, None, &condition, values, Some(limit)),
            self.lane(partition, OP)
        )?;
        let in_lane: BTreeSet<&str> = lane
            .iter()
            .filter_map(|item| get_s(item, attr::AGGREGATE))
            .collect();
        let mut messages = Vec::new();
        let mut expected = after.major().saturating_add(1);
        for item in &log {
            // Only the unbroken run after `after`: a missing position is a
            // message whose commit this query did not see (see the type's
            // documentation), and nothing after it is read before it is.
            if number(item, attr::SK, OP)? != expected {
                break;
            }
            expected = expected.saturating_add(1);
            if item.contains_key(attr::STATE) {
                continue;
            }
            messages.push(stored(item, None, OP)?);
        }
        Ok(LogBatch::among(messages, |aggregate| {
            in_lane.contains(aggregate)
        }))
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        const OP: Operation = Operation::Advance;
        let partition = lease.partition();
        self.check_partition(partition)?;
        let now = self.synced_now().await?;
        let until = now + lease.lease();
        let mut updates = self.settlements(partition, advance, now).await?;
        let mut to = advance.to.filter(|to| *to > lease.cursor());
        let mut cursor = lease.cursor().max(to.unwrap_or(LogPosition::START));
        let per = MAX_TRANSACTION_ITEMS - 1;
        loop {
            let last = updates.len() <= per;
            let mut chunk: Vec<TransactWriteItem> =
                updates.drain(..updates.len().min(per)).collect();
            loop {
                let moving = if last { to } else { None };
                let mut items = vec![self.renewal(lease, now, until, moving)?];
                items.extend(chunk.iter().cloned());
                let reasons = match self.transact(items, OP).await? {
                    Sent::Committed => break,
                    Sent::Cancelled(reasons) => reasons,
                };
                if reasons.first().map(String::as_str) == Some(CONDITION_FAILED) {
                    // Lost, or the cursor stands past `to` already.
                    let state = self.get(state_key(partition), OP).await?;
                    let holds = state.as_ref().is_some_and(|state| {
                        get_s(state, attr::OWNER) == Some(lease.owner().to_string().as_str())
                            && get_n(state, attr::UNTIL)
                                .is_some_and(|until| until > now.as_unix_millis())
                    });
                    if !holds || moving.is_none() {
                        return Err(StoreError::LostLease);
                    }
                    cursor = cursor_of(state.as_ref(), OP)?;
                    to = None;
                    continue;
                }
                if reasons
                    .iter()
                    .any(|r| RETRYABLE_REASONS.contains(&r.as_str()))
                {
                    tokio::task::yield_now().await;
                    continue;
                }
                // A message not in the state it was settled from (settled
                // already: an advance delivered twice) changes nothing.
                let refused: Vec<usize> = reasons
                    .iter()
                    .enumerate()
                    .skip(1)
                    .filter(|(_, r)| *r == CONDITION_FAILED)
                    .map(|(i, _)| i - 1)
                    .collect();
                if refused.is_empty() {
                    return Err(StoreError::Backend {
                        store: STORE,
                        operation: OP,
                        message: format!("the advance was cancelled: {}", reasons.join(", ")),
                        source: None,
                    });
                }
                chunk = chunk
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !refused.contains(i))
                    .map(|(_, item)| item)
                    .collect();
            }
            if last {
                return Ok(lease.renewed(until, cursor));
            }
        }
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::Read;
        let limit = validate_outbox_batch(limit)?;
        self.check_partition(partition)?;
        let now = self.synced_now().await?;
        let lane = self.lane(partition, OP).await?;
        let mut due = Vec::new();
        let mut previous: Option<&str> = None;
        for item in &lane {
            let aggregate = get_s(item, attr::AGGREGATE);
            if aggregate == previous {
                continue;
            }
            previous = aggregate;
            let head = stored(item, None, OP)?;
            if head.state() == MessageState::Waiting && head.parts().available_at <= now {
                due.push(head);
            }
        }
        due.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        due.truncate(limit);
        Ok(due)
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        self.check_partition(lease.partition())?;
        let now = self.synced_now().await?;
        let update = format!("REMOVE #{}, #{}", attr::OWNER, attr::UNTIL);
        let condition = format!("#{} = :own AND #{} > :now", attr::OWNER, attr::UNTIL);
        let values = Item::from([
            (":own".to_string(), s(lease.owner().to_string())),
            (":now".to_string(), millis(now)),
        ]);
        let key = state_key(lease.partition());
        self.update_if(key, &update, &condition, values, Operation::Release)
            .await
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::List;
        let limit = validate_outbox_batch(limit)?;
        let lanes = futures_util::future::try_join_all(
            (0..self.partitions()).map(|partition| self.lane(partition, OP)),
        )
        .await?;
        let parked = MessageState::Parked.as_str();
        let mut found = Vec::new();
        for item in lanes.iter().flatten() {
            if get_s(item, attr::STATE) == Some(parked) {
                let message = stored(item, None, OP)?;
                if after.is_none_or(|after| after.precedes(&message)) {
                    found.push(message);
                }
            }
        }
        found.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        found.truncate(limit);
        Ok(found)
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let now = self.synced_now().await?;
        let update = format!(
            "SET #{} = :waiting, #{} = :zero, #{} = :now",
            attr::STATE,
            attr::ATTEMPTS,
            attr::AVAILABLE_AT
        );
        let values = Item::from([
            (":waiting".to_string(), s(MessageState::Waiting.as_str())),
            (":zero".to_string(), n(0)),
            (":now".to_string(), millis(now)),
        ]);
        self.update_parked(id, &update, values, Operation::Retry)
            .await
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let now = self.synced_now().await?;
        // Out of the lane: its aggregate flows again. The drop's time in
        // sent_at: a purge ages it from there.
        let update = format!(
            "SET #{} = :dropped, #{} = :why, #{} = :now REMOVE #{}",
            attr::STATE,
            attr::LAST_ERROR,
            attr::SENT_AT,
            attr::LANE
        );
        let values = Item::from([
            (":dropped".to_string(), s(MessageState::Dropped.as_str())),
            (":why".to_string(), s(reason)),
            (":now".to_string(), millis(now)),
        ]);
        self.update_parked(id, &update, values, Operation::Drop)
            .await
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::Get;
        match self.get(id_key(id), OP).await? {
            Some(pointer) => self.pointed(&pointer, OP).await,
            None => Ok(None),
        }
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        const OP: Operation = Operation::Purge;
        let limit = validate_outbox_batch(limit)?;
        let cutoff = (self.synced_now().await? - older_than).as_unix_millis();
        // Each message's item and its id item.
        let mut doomed: Vec<Item> = Vec::new();
        let mut purged: u64 = 0;
        'partitions: for partition in 0..self.partitions() {
            let items = self.collection(partition, OP).await?;
            let cursor = cursor_of(items.first().filter(|i| get_n(i, attr::SK) == Some(0)), OP)?;
            for item in &items {
                if purged >= limit as u64 {
                    break 'partitions;
                }
                let position = number(item, attr::SK, OP)?;
                // Never past the cursor: the log there has no holes (a
                // read stops at the first).
                if position == 0 || position > cursor.major() {
                    continue;
                }
                let finished = get_s(item, attr::STATE)
                    .map(|state| MessageState::parse(state).is_some_and(MessageState::is_final));
                let done = match finished {
                    // Sent from the log: aged from its enqueue.
                    None => get_n(item, attr::ENQUEUED_AT).is_some_and(|at| at <= cutoff),
                    Some(true) => get_n(item, attr::SENT_AT).is_some_and(|at| at <= cutoff),
                    Some(false) => false,
                };
                if !done {
                    continue;
                }
                let id = get_s(item, attr::ID)
                    .and_then(uuid_of)
                    .ok_or_else(|| corrupt(OP, attr::ID))?;
                doomed.push(message_key(partition, position));
                doomed.push(id_key(MessageId::from_uuid(id)));
                purged += 1;
            }
        }
        for chunk in doomed.chunks(BATCH_WRITE) {
            let mut requests: Vec<WriteRequest> = chunk
                .iter()
                .map(|key| {
                    DeleteRequest::builder()
                        .set_key(Some(key.clone()))
                        .build()
                        .map(|delete| WriteRequest::builder().delete_request(delete).build())
                        .map_err(|e| build_failure(OP, e))
                })
                .collect::<Result<_, _>>()?;
            while !requests.is_empty() {
                let answer = self
                    .client
                    .batch_write_item()
                    .request_items(self.table(), requests)
                    .send()
                    .await
                    .map_err(|e| classify(OP, e))?;
                requests = answer
                    .unprocessed_items()
                    .and_then(|left| left.get(self.table()))
                    .cloned()
                    .unwrap_or_default();
            }
        }
        Ok(purged)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        const OP: Operation = Operation::Stats;
        let now = self.synced_now().await?;
        let collections = futures_util::future::try_join_all(
            (0..self.partitions()).map(|partition| self.collection(partition, OP)),
        )
        .await?;
        let mut partitions = Vec::with_capacity(collections.len());
        for (partition, items) in (0..self.partitions()).zip(&collections) {
            let mut stats = PartitionStats::new(partition);
            let state = items.first().filter(|i| get_n(i, attr::SK) == Some(0));
            stats.cursor = cursor_of(state, OP)?;
            if let Some(state) = state
                && let (Some(owner), Some(until)) =
                    (get_s(state, attr::OWNER), time(state, attr::UNTIL))
                && until > now
            {
                stats.holder = OwnerToken::parse(owner);
                stats.held_until = stats.holder.map(|_| until);
            }
            for item in items {
                let position = number(item, attr::SK, OP)?;
                if position == 0 {
                    continue;
                }
                let pending = match get_s(item, attr::STATE) {
                    None => position > stats.cursor.major(),
                    Some(state) => match MessageState::parse(state) {
                        Some(MessageState::Waiting) => true,
                        Some(MessageState::Parked) => {
                            stats.parked += 1;
                            false
                        }
                        _ => false,
                    },
                };
                if pending {
                    stats.pending += 1;
                    let at = time(item, attr::ENQUEUED_AT)
                        .ok_or_else(|| corrupt(OP, attr::ENQUEUED_AT))?;
                    let age = now.saturating_duration_since(at);
                    stats.oldest_pending_age = stats.oldest_pending_age.max(Some(age));
                }
            }
            partitions.push(stats);
        }
        Ok(OutboxStats::of_partitions(partitions))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
