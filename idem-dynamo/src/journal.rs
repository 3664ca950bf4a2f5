//! `DynamoJournal`: the outbound operation journal's store on DynamoDB:
//! construction, the table, the caller's transaction item, and the trait
//! implementation (one conditional request per operation, `list` aside).

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, GlobalSecondaryIndex, KeyType, KeysAndAttributes, Projection,
    ProjectionType, Put, ReturnValue, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TransactWriteItem,
};
use idem_core::store::{
    Acquired, Capabilities, Finish, Holder, JournalRecord, JournalStore, ListQuery, NewOperation,
    OperationKey, OperationState, Timestamp, validate_lease, validate_list_limit,
};
use idem_core::{Operation, StoreError, Tenant, async_trait};

use crate::codec::{Item, n, s};
use crate::error::{STORE, build_failure, classify};
use crate::journal_item::{
    self, LIST_INDEX, attr, list_key, millis, names, open_condition, used_values,
};
use crate::options::DynamoJournalOptions;
use crate::part::{attribute_definition, key_element};

/// The most keys one `BatchGetItem` takes.
const BATCH_GET_LIMIT: usize = 100;

/// How many times `list` asks again for keys DynamoDB left unprocessed
/// (throttled) before it gives up as unavailable.
const UNPROCESSED_RETRIES: u32 = 8;

crate::part::dynamo_part!(
    /// The journal store on DynamoDB, over the caller's `aws_sdk_dynamodb::Client`:
    /// what [`idem-journal`](idem_core::store::JournalStore) keeps of each call
    /// to a provider.
    ///
    /// One item per operation under the partition key
    /// [`OperationKey::storage_key`] (injective, so no two operations, nor two
    /// namespaces, share an item), each part of the record an attribute of its
    /// own. Each operation is one request: `record` a conditional `PutItem`
    /// (`attribute_not_exists(pk)`, answered from the item that stopped it, so
    /// a second record or a second delivery returns the first), `get` a
    /// strongly consistent `GetItem`, `acquire`, `mark_sent` and `finish` one
    /// conditional `UpdateItem` each, fenced on the lease's owner and end, the
    /// state and (for a send) the count, each answering a refusal from the item
    /// that refused it (`ReturnValuesOnConditionCheckFailure::AllOld`), so a
    /// second delivery gets the first's answer without a read. `list` is a
    /// `Query` per state asked and a `BatchGetItem` per hundred operations
    /// found (see [`list`](JournalStore::list) below).
    ///
    /// An update stamps `updated_at` with the store's now only if that is not
    /// before the stored one (DynamoDB has no `max()` in update expressions):
    /// in the rare case of a writer whose clock is behind the last one's, the
    /// write is sent again keeping the stored time, a second request.
    ///
    /// Leases, the key window and every time in a record are the service's
    /// clock's by default ([`ServiceClock`](crate::ServiceClock): DynamoDB's
    /// time from its responses), so callers whose own clocks disagree by
    /// hours agree within about a second, as for
    /// [`DynamoStore`](crate::DynamoStore); with
    /// [`DynamoJournalOptions::clock`](crate::DynamoJournalOptions) the
    /// caller's clock judges, and callers' clocks must agree to within a
    /// small part of the lease (a caller whose clock runs ahead may take
    /// over a live lease early, or start again an operation whose window it
    /// thinks is over).
    ///
    /// **`list` reads a global secondary index**, which DynamoDB keeps
    /// eventually consistent: an operation changed a moment ago may be missing
    /// from it, or still filed under its old state. So `list` reads each
    /// operation it finds again, strongly consistent, and returns it only if it
    /// still is in a state asked and unchanged for `older_than`: what it
    /// returns is current, but an operation that changed within the last
    /// moment (usually well under a second) may be left out, and a list may
    /// hold fewer than `limit` though more qualify. A sweep that lists again
    /// later finds them; acquiring one is strongly consistent and fenced either
    /// way.
    ///
    /// Every operation goes through the journal's
    /// [`OperationLayer`](idem_core::store::OperationLayer): it is bounded by the
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout) (5 s
    /// by default), ends in a retryable [`StoreError::Unavailable`] past it, and
    /// gets its span and metrics whoever calls it.
    ///
    /// ```no_run
    /// use idem_core::Tenant;
    /// use idem_core::store::{Acquired, JournalStore, NewOperation, OperationId, OperationKey, OwnerToken};
    /// use idem_dynamo::{aws_sdk_dynamodb, DynamoJournal, DynamoJournalOptions};
    ///
    /// # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = aws_sdk_dynamodb::Client::from_conf(config);
    /// let journal = DynamoJournal::with_options(client, DynamoJournalOptions::default().table("payments-journal"))?;
    /// journal.create_table().await?; // tests and quick starts
    /// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
    /// journal.record(&NewOperation::new(key.clone(), serde_json::json!({"amount": 1200}))).await?;
    /// let owner = OwnerToken::generate();
    /// if let Acquired::Held { record, .. } = journal.acquire(key.held_by(owner), std::time::Duration::from_secs(30)).await? {
    ///     let sent = journal.mark_sent(key.held_by(owner), record.parts().sends).await?;
    ///     # let _ = sent;
    /// }
    /// # Ok(()) }
    /// ```
    pub struct DynamoJournal => operations: Operations, forward_journal_store,
    DynamoJournalOptions, DEFAULT_JOURNAL_TABLE, usize::MAX, "journal store"
);

impl DynamoJournal {
    /// Creates the table and its list index if the table does not exist,
    /// and waits until it is active.
    ///
    /// The definition, for those who create tables with their own tools:
    ///
    /// - partition key `pk`, type `S` (no sort key): the operation key's
    ///   [`storage_key`](OperationKey::storage_key), each part
    ///   length-prefixed;
    /// - a global secondary index `by-state` with partition key `lst` (`S`:
    ///   `<length of the namespace>:<namespace>#<state>`) and sort key `uat`
    ///   (`N`: when the operation last changed, epoch milliseconds),
    ///   projecting keys only (`list` reads each operation again from the
    ///   table);
    /// - billing mode on demand (`PAY_PER_REQUEST`) here; provisioned works
    ///   too, with capacity for the index;
    /// - no Time to Live: operations are kept until you delete them.
    ///
    /// ```no_run
    /// # async fn example(journal: idem_dynamo::DynamoJournal) -> Result<(), idem_core::StoreError> {
    /// journal.create_table().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`] from DynamoDB.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        const OP: Operation = Operation::Setup;
        let index = GlobalSecondaryIndex::builder()
            .index_name(LIST_INDEX)
            .key_schema(key_element(attr::LIST_KEY, KeyType::Hash)?)
            .key_schema(key_element(attr::UPDATED_AT, KeyType::Range)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::KeysOnly)
                    .build(),
            )
            .build()
            .map_err(|e| build_failure(OP, e))?;
        let create = self
            .client()
            .create_table()
            .table_name(self.table())
            .attribute_definitions(attribute_definition(attr::PK, ScalarAttributeType::S)?)
            .attribute_definitions(attribute_definition(
                attr::LIST_KEY,
                ScalarAttributeType::S,
            )?)
            .attribute_definitions(attribute_definition(
                attr::UPDATED_AT,
                ScalarAttributeType::N,
            )?)
            .key_schema(key_element(attr::PK, KeyType::Hash)?)
            .global_secondary_indexes(index)
            .billing_mode(BillingMode::PayPerRequest);
        crate::part::create_table(self.client(), self.table(), create).await
    }

    /// The `Put` that records `operation` (as [`record`](JournalStore::record)
    /// would), for your own `TransactWriteItems`: the operation is then
    /// recorded if and only if your business writes commit, in one
    /// transaction.
    ///
    /// The put is conditional on `attribute_not_exists(pk)`. If the
    /// transaction is cancelled with the reason `ConditionalCheckFailed` at
    /// this item's index, the operation was recorded already (a retry of
    /// yours, or another request for the same operation): nothing of the
    /// transaction was written; [`get`](JournalStore::get) gives the stored
    /// operation. The record's times are the journal clock's when this is
    /// called, not when the transaction commits (the service's clock as far
    /// as a response has told it: in a process where no DynamoDB part has
    /// had an answer yet, the process's own time). DynamoDB refuses two writes
    /// to one item in a transaction, so record each operation once in it.
    ///
    /// ```no_run
    /// use idem_core::Tenant;
    /// use idem_core::store::{NewOperation, OperationId, OperationKey};
    /// use idem_dynamo::DynamoJournal;
    /// use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    ///
    /// # async fn example(journal: DynamoJournal) -> Result<(), Box<dyn std::error::Error>> {
    /// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
    /// let charge = NewOperation::new(key, serde_json::json!({"amount": 1200}));
    /// let order = Put::builder()
    ///     .table_name("orders")
    ///     .item("pk", AttributeValue::S("order#42".into()))
    ///     .condition_expression("attribute_not_exists(pk)")
    ///     .build()?;
    /// journal
    ///     .client()
    ///     .transact_write_items()
    ///     .transact_items(TransactWriteItem::builder().put(order).build())
    ///     .transact_items(journal.record_item(&charge)?)
    ///     .send()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] when the request leaves too little of a
    /// 400 KB item for the rest of the record; nothing is sent either way.
    pub fn record_item(&self, operation: &NewOperation) -> Result<TransactWriteItem, StoreError> {
        let now = self.parts().now();
        let item = journal_item::item(&operation.clone().into_record(now))?;
        let condition = format!("attribute_not_exists(#{})", attr::PK);
        let put = Put::builder()
            .table_name(self.table())
            .set_item(Some(item))
            .set_expression_attribute_names(Some(names(&[&condition])))
            .condition_expression(condition)
            .build()
            .map_err(|e| build_failure(Operation::Record, e))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }
}

/// A fenced update of one operation's item: what it sets and removes, on
/// which condition, besides the `updated_at` stamp [`Operations::update`]
/// adds.
struct Fenced<'a> {
    operation: Operation,
    key: &'a OperationKey,
    set: Vec<String>,
    remove: Vec<String>,
    condition: String,
    values: HashMap<String, AttributeValue>,
}

impl<'a> Fenced<'a> {
    /// An update of `key`'s existing, open item, on `condition` too.
    fn new(operation: Operation, key: &'a OperationKey, condition: &str) -> Self {
        let (open, values) = open_condition();
        Self {
            operation,
            key,
            set: Vec::new(),
            remove: Vec::new(),
            condition: format!("attribute_exists(#{}) AND {open} AND {condition}", attr::PK),
            values,
        }
    }

    fn set(mut self, attribute: &str, expression: &str) -> Self {
        self.set.push(format!("#{attribute} = {expression}"));
        self
    }

    /// Sets `attribute` to `value`, or removes it for `None`.
    fn set_or_remove(mut self, attribute: &str, value: Option<AttributeValue>) -> Self {
        match value {
            Some(value) => {
                self.values.insert(format!(":{attribute}"), value);
                self.set(attribute, &format!(":{attribute}"))
            }
            None => {
                self.remove.push(format!("#{attribute}"));
                self
            }
        }
    }

    fn value(mut self, placeholder: &str, value: AttributeValue) -> Self {
        self.values.insert(placeholder.to_string(), value);
        self
    }
}

/// What a fenced update found.
enum Answer {
    /// It wrote; the record as it is now.
    Written(JournalRecord),
    /// The condition refused the item (as it was), or there is none.
    Refused(Option<JournalRecord>),
}

/// The fence of a write under `:own`'s lease: held, and live at `:now`.
fn held_condition() -> String {
    format!(
        "#{own} = :own AND #{until} > :now",
        own = attr::LEASE_OWNER,
        until = attr::LEASE_UNTIL
    )
}

impl Operations {
    /// Sends `write` at `now`, stamping `updated_at`; if the only thing in
    /// its way is a stored `updated_at` after `now` (the last writer's
    /// clock ahead of this one's), sends it again keeping that time, so
    /// `updated_at` never runs backwards. `writable` says whether the rest
    /// of the condition holds on a record at `now`.
    async fn update(
        &self,
        write: Fenced<'_>,
        now: Timestamp,
        writable: impl Fn(&JournalRecord) -> bool,
    ) -> Result<Answer, StoreError> {
        match self.send(&write, now, true).await? {
            Answer::Refused(Some(old)) if writable(&old) && old.parts().updated_at > now => {
                self.send(&write, now, false).await
            }
            answer => Ok(answer),
        }
    }

    /// One `UpdateItem` of `write`: with `stamp`, setting `updated_at` to
    /// `now` where it is not later; without, where it is.
    async fn send(
        &self,
        write: &Fenced<'_>,
        now: Timestamp,
        stamp: bool,
    ) -> Result<Answer, StoreError> {
        let op = write.operation;
        let uat = attr::UPDATED_AT;
        let mut set = write.set.clone();
        let condition = if stamp {
            set.push(format!("#{uat} = :now"));
            format!("{} AND #{uat} <= :now", write.condition)
        } else {
            format!("{} AND #{uat} > :now", write.condition)
        };
        let mut update = format!("SET {}", set.join(", "));
        if !write.remove.is_empty() {
            update.push_str(" REMOVE ");
            update.push_str(&write.remove.join(", "));
        }
        let mut values = write.values.clone();
        values.insert(":now".to_string(), millis(now));
        let expressions = [update.as_str(), condition.as_str()];
        let sent = self
            .client
            .update_item()
            .table_name(self.table())
            .key(attr::PK, journal_item::key(write.key))
            .set_expression_attribute_names(Some(names(&expressions)))
            .set_expression_attribute_values(Some(used_values(&expressions, values)))
            .update_expression(update)
            .condition_expression(condition)
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match sent {
            Ok(output) => {
                let written = output
                    .attributes()
                    .ok_or_else(|| StoreError::backend(STORE, op, "the update returned no item"))?;
                journal_item::record(written, op).map(Answer::Written)
            }
            Err(error) => match error.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(failed)) => failed
                    .item()
                    .map(|old| journal_item::record(old, op))
                    .transpose()
                    .map(Answer::Refused),
                _ => Err(classify(op, error)),
            },
        }
    }

    /// The keys of the operations of `namespace` in `state` unchanged since
    /// `cutoff`, oldest first, at most `limit`, with when each changed, as
    /// the list index has them (eventually consistent).
    async fn listed_keys(
        &self,
        namespace: &Tenant,
        state: OperationState,
        cutoff: Option<Timestamp>,
        limit: usize,
    ) -> Result<Vec<(i64, AttributeValue)>, StoreError> {
        const OP: Operation = Operation::List;
        let condition = match cutoff {
            Some(_) => format!(
                "#{} = :lst AND #{} <= :cutoff",
                attr::LIST_KEY,
                attr::UPDATED_AT
            ),
            None => format!("#{} = :lst", attr::LIST_KEY),
        };
        crate::part::query_pages(
            &self.client,
            self.table(),
            LIST_INDEX,
            &condition,
            OP,
            limit,
            |query| {
                let query = query.expression_attribute_values(":lst", list_key(namespace, state));
                match cutoff {
                    Some(cutoff) => query.expression_attribute_values(":cutoff", millis(cutoff)),
                    None => query,
                }
            },
            |item| {
                let pk = item
                    .get(attr::PK)
                    .ok_or_else(|| StoreError::corrupt(STORE, OP, attr::PK))?;
                let changed = crate::codec::get_n(item, attr::UPDATED_AT)
                    .ok_or_else(|| StoreError::corrupt(STORE, OP, attr::UPDATED_AT))?;
                Ok((changed, pk.clone()))
            },
        )
        .await
    }

    /// The items of `keys`, read strongly consistent, in any order; those
    /// deleted since are left out.
    async fn read_again(&self, keys: Vec<AttributeValue>) -> Result<Vec<Item>, StoreError> {
        const OP: Operation = Operation::List;
        let mut items = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH_GET_LIMIT) {
            let mut pending: Vec<Item> = chunk
                .iter()
                .map(|pk| Item::from([(attr::PK.to_string(), pk.clone())]))
                .collect();
            let mut retries = 0;
            while !pending.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| build_failure(OP, e))?;
                let output = self
                    .client
                    .batch_get_item()
                    .request_items(self.table(), request)
                    .send()
                    .await
                    .map_err(|e| classify(OP, e))?;
                if let Some(read) = output.responses().and_then(|r| r.get(self.table())) {
                    items.extend(read.iter().cloned());
                }
                if let Some(left) = output.unprocessed_keys().and_then(|u| u.get(self.table())) {
                    pending = left.keys().to_vec();
                }
                if pending.is_empty() {
                    break;
                }
                // Throttled: back off as DynamoDB asks, within the
                // operation's time limit.
                retries += 1;
                if retries > UNPROCESSED_RETRIES {
                    return Err(StoreError::unavailable(
                        STORE,
                        OP,
                        "DynamoDB left keys unprocessed after every retry",
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10 << retries)).await;
            }
        }
        Ok(items)
    }
}

#[async_trait]
impl JournalStore for Operations {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        const OP: Operation = Operation::Record;
        let now = self.synced_now().await?;
        let record = operation.clone().into_record(now);
        let item = journal_item::item(&record)?;
        let condition = format!("attribute_not_exists(#{})", attr::PK);
        let sent = self
            .client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .set_expression_attribute_names(Some(names(&[&condition])))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let Err(error) = sent else {
            return Ok(record);
        };
        // Recorded already (by another request, or by this one delivered
        // before a lost reply): what is stored is the answer.
        match error.as_service_error() {
            Some(PutItemError::ConditionalCheckFailedException(failed)) => {
                let old = failed.item().ok_or_else(|| {
                    StoreError::backend(STORE, OP, "the condition failed without the item")
                })?;
                journal_item::record(old, OP)
            }
            _ => Err(classify(OP, error)),
        }
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(self.table())
            .key(attr::PK, journal_item::key(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| classify(Operation::Get, e))?;
        output
            .item()
            .map(|item| journal_item::record(item, Operation::Get))
            .transpose()
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let Holder { key, owner, .. } = held;
        const OP: Operation = Operation::Acquire;
        let lease = validate_lease(lease)?;
        let now = self.synced_now().await?;
        // Nobody else holds it: no owner, released, lapsed, or this owner's
        // (a second delivery, its lease moved).
        let free = format!(
            "(attribute_not_exists(#{own}) OR attribute_not_exists(#{until}) \
             OR #{until} <= :now OR #{own} = :own)",
            own = attr::LEASE_OWNER,
            until = attr::LEASE_UNTIL
        );
        let write = Fenced::new(OP, key, &free)
            .set(attr::LEASE_OWNER, ":own")
            .set(attr::LEASE_UNTIL, ":lu")
            .value(":own", s(owner.to_string()))
            .value(":lu", millis(now + lease));
        let writable =
            |r: &JournalRecord| !r.state().is_settled() && r.held_by_other(owner, now).is_none();
        match self.update(write, now, writable).await? {
            Answer::Written(record) => Ok(Acquired::Held { record, now }),
            Answer::Refused(None) => Ok(Acquired::Absent),
            Answer::Refused(Some(record)) if record.state().is_settled() => {
                Ok(Acquired::Settled(record))
            }
            Answer::Refused(Some(record)) => match record.held_by_other(owner, now) {
                Some(retry_after) => Ok(Acquired::Busy {
                    record,
                    retry_after,
                }),
                None => Err(StoreError::backend(
                    STORE,
                    OP,
                    "the acquisition's condition refused an operation nobody holds",
                )),
            },
        }
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        const OP: Operation = Operation::MarkSent;
        let now = self.synced_now().await?;
        let next = sends.saturating_add(1);
        let condition = format!("{} AND #{} = :sends", held_condition(), attr::SENDS);
        let write = Fenced::new(OP, key, &condition)
            .set(attr::SENDS, ":next")
            .set(
                attr::FIRST_SENT_AT,
                &format!("if_not_exists(#{}, :now)", attr::FIRST_SENT_AT),
            )
            .value(":own", s(owner.to_string()))
            .value(":sends", n(sends))
            .value(":next", n(next));
        let open_and_held = |r: &JournalRecord| r.is_held_by(owner, now) && !r.state().is_settled();
        let writable = |r: &JournalRecord| open_and_held(r) && r.parts().sends == sends;
        match self.update(write, now, writable).await? {
            Answer::Written(record) => Ok(record),
            // Counted already: this very send delivered again.
            Answer::Refused(Some(record))
                if open_and_held(&record) && record.parts().sends == next =>
            {
                Ok(record)
            }
            Answer::Refused(_) => Err(StoreError::LostLease),
        }
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        const OP: Operation = Operation::Finish;
        let now = self.synced_now().await?;
        let mut write = Fenced::new(OP, key, &held_condition())
            .value(":own", s(owner.to_string()))
            .set_or_remove(attr::STATE, Some(s(finish.state.as_str())))
            .set_or_remove(
                attr::LIST_KEY,
                Some(list_key(key.namespace(), finish.state)),
            )
            .set_or_remove(attr::DETAIL, finish.detail.clone().map(s))
            .set_or_remove(attr::SEARCH_UNTIL, finish.search_until.map(millis))
            .set_or_remove(attr::LEASE_UNTIL, None);
        // `None` keeps the provider id stored.
        if let Some(provider_id) = &finish.provider_id {
            write = write.set_or_remove(attr::PROVIDER_ID, Some(s(provider_id)));
        }
        let writable = |r: &JournalRecord| r.is_held_by(owner, now) && !r.state().is_settled();
        match self.update(write, now, writable).await? {
            Answer::Written(record) => Ok(record),
            // This very finish, delivered again: answer as the first did.
            Answer::Refused(Some(record)) if record.is_finished_by(owner, finish) => Ok(record),
            Answer::Refused(_) => Err(StoreError::LostLease),
        }
    }

    /// One `Query` of the list index per state asked (more for a state
    /// whose keys fill more than a 1 MB page), then a strongly consistent
    /// `BatchGetItem` per hundred operations found, which are returned only
    /// if they still match (see [`DynamoJournal`] on the index's
    /// consistency).
    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        const OP: Operation = Operation::List;
        let limit = validate_list_limit(query.limit)?;
        let now = self.synced_now().await?;
        // Every age: one written by a caller whose clock runs a little ahead
        // of this one's is listed too.
        let cutoff = (!query.older_than.is_zero()).then(|| now - query.older_than);
        // The oldest `limit` of all states are among the oldest `limit` of
        // each.
        let mut found = Vec::new();
        for state in &query.states {
            found.extend(
                self.listed_keys(&query.namespace, *state, cutoff, limit)
                    .await?,
            );
        }
        found.sort_by_key(|(changed, _)| *changed);
        found.truncate(limit);
        let items = self
            .read_again(found.into_iter().map(|(_, pk)| pk).collect())
            .await?;
        let mut listed = Vec::with_capacity(items.len());
        for item in &items {
            let record = journal_item::record(item, OP)?;
            // The index lags the table: keep only what still matches.
            if query.matches(&record, now) {
                listed.push(record);
            }
        }
        listed
            .sort_by(|a, b| (a.parts().updated_at, a.key()).cmp(&(b.parts().updated_at, b.key())));
        Ok(listed)
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::Client;
    use aws_sdk_dynamodb::config::{Credentials, Region};
    use idem_core::{InvalidInput, StoreOptions};

    use super::*;

    fn client() -> Client {
        // Building a client sends nothing.
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version_latest()
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "unit"))
            .build();
        Client::from_conf(config)
    }

    #[test]
    fn options_are_checked_once_at_construction() {
        let zero = StoreOptions::default().with_operation_timeout(Duration::ZERO);
        assert!(matches!(
            DynamoJournal::with_options(
                client(),
                DynamoJournalOptions::default().store_options(zero)
            ),
            Err(StoreError::InvalidInput(InvalidInput::OutOfRange {
                field: "operation timeout",
                ..
            }))
        ));
        let journal = DynamoJournal::new(client());
        assert_eq!(journal.table(), crate::DEFAULT_JOURNAL_TABLE);
        assert_eq!(
            journal.operations.layer().timeout(),
            Some(StoreOptions::DEFAULT_OPERATION_TIMEOUT)
        );
        // The service's clock is read in this process, as the caller's is.
        assert_eq!(
            journal.capabilities().clock,
            idem_core::store::ClockSource::Caller
        );
    }

    #[test]
    fn the_record_item_is_a_conditional_put_of_the_whole_record() {
        let journal = DynamoJournal::new(client());
        let key = OperationKey::new(
            Tenant::new("billing").unwrap(),
            idem_core::store::OperationId::new("order-1", "charge").unwrap(),
        );
        let operation = NewOperation::new(key.clone(), serde_json::json!({"amount": 5}));
        let item = journal.record_item(&operation);
        let put = item.as_ref().ok().and_then(|i| i.put());
        assert_eq!(
            put.map(|p| p.condition_expression()),
            Some(Some("attribute_not_exists(#pk)"))
        );
        let stored = put.map(|p| journal_item::record(p.item(), Operation::Record));
        assert!(matches!(
            stored,
            Some(Ok(record)) if record.key() == &key && record.provider_key() == operation.provider_key()
        ));
    }
}
