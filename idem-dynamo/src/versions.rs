//! `VersionedItems`: version checks over items of the caller's table,
//! inside the caller's `TransactWriteItems`.

use std::fmt;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idem_core::store::{VersionCheck, VersionStore};
use idem_core::{InvalidInput, Operation, StoreError, async_trait};

use crate::codec::{Item, n};
use crate::error::{build_failure, classify, corrupt};
use crate::transaction::DynamoTransaction;

const OP: Operation = Operation::Advance;

/// The longest attribute name accepted (DynamoDB's limit for a key's).
const MAX_ATTRIBUTE: usize = 255;

/// An aggregate's key in the table, from its name.
type KeyOf = Arc<dyn Fn(&str) -> Item + Send + Sync>;

/// A table of yours whose items carry an aggregate's version, for applying
/// an event only when the item holds its predecessor ([`VersionStore`]),
/// inside a [`DynamoTransaction`]: a consistent `GetItem` of the
/// aggregate's item reads its version; on the event's predecessor an
/// `Update` setting the event's version, conditioned on the predecessor
/// still being there, joins the transaction (your writes and the inbox
/// record commit with it), and the check is [`VersionCheck::Apply`]; at or
/// past the event's version it is [`VersionCheck::Stale`], below the
/// predecessor [`VersionCheck::Gap`], and nothing is pushed.
///
/// The condition serialises racing handlers of one aggregate: both may
/// read the predecessor and push, but DynamoDB commits one transaction and
/// cancels the other, whose commit fails with [`StoreError::Rejected`]
/// (writing nothing, its inbox claim released). The consumer delivers the
/// message again, and the next check reads the committed version: stale.
///
/// An item that does not exist, or has no version attribute, is at version
/// 0: event 1 of a new aggregate applies, and the update creates the item
/// with its key and version 1.
///
/// DynamoDB refuses two writes to one item in one transaction: write the
/// event's effect to other items, or to the aggregate's own item through
/// [`advance_setting`](Self::advance_setting), which sets your attributes
/// in the version's update. A second check of one aggregate in one
/// transaction reads nothing and answers [`VersionCheck::Gap`] (its
/// `current` the version the first one writes), and the transaction no
/// longer [fits](idem_core::store::Transaction::fits): commit it and check
/// again in the next (a consumer's batch does so by itself).
///
/// ```no_run
/// use idem_core::store::{VersionCheck, VersionStore};
/// use idem_dynamo::{DynamoStore, VersionedItems};
///
/// # async fn example(store: DynamoStore) -> Result<(), Box<dyn std::error::Error>> {
/// let orders = VersionedItems::new("orders", "pk", "version")?;
/// let mut tx = store.begin().await?;
/// match orders.advance(&mut tx, "order-42", 3).await? {
///     VersionCheck::Apply => { /* push the event's effect on other items, then commit */ }
///     VersionCheck::Stale { .. } => { /* a duplicate: acknowledge it */ }
///     _ => { /* a gap: retry later */ }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct VersionedItems {
    table: String,
    version: String,
    key: KeyOf,
}

impl fmt::Debug for VersionedItems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VersionedItems")
            .field("table", &self.table)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

fn attribute(field: &'static str, name: &str) -> Result<(), InvalidInput> {
    idem_core::store::validate_name(field, name, MAX_ATTRIBUTE, |_| true, "")
}

impl VersionedItems {
    /// The table `table` whose items are keyed by the string attribute
    /// `key_attribute` (the partition key, no sort key), holding the
    /// aggregate's name, and carry a number `version_attribute`.
    ///
    /// ```
    /// use idem_dynamo::VersionedItems;
    ///
    /// assert!(VersionedItems::new("orders", "pk", "version").is_ok());
    /// assert!(VersionedItems::new("no spaces", "pk", "version").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a table name that breaks DynamoDB's rules, or an
    /// empty or over-long attribute name.
    pub fn new(
        table: &str,
        key_attribute: &str,
        version_attribute: &str,
    ) -> Result<Self, InvalidInput> {
        attribute("key attribute", key_attribute)?;
        let key_attribute = key_attribute.to_string();
        Self::keyed(table, version_attribute, move |aggregate| {
            Item::from([(key_attribute.clone(), AttributeValue::S(aggregate.into()))])
        })
    }

    /// The same for items of another key: `key` gives an aggregate's whole
    /// primary key (a prefix, a sort key, a number).
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use idem_dynamo::VersionedItems;
    /// use idem_dynamo::aws_sdk_dynamodb::types::AttributeValue;
    ///
    /// let accounts = VersionedItems::keyed("app", "version", |account| {
    ///     HashMap::from([
    ///         ("pk".to_string(), AttributeValue::S(format!("ACCOUNT#{account}"))),
    ///         ("sk".to_string(), AttributeValue::S("META".into())),
    ///     ])
    /// });
    /// assert!(accounts.is_ok());
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a table name that breaks DynamoDB's rules, or an
    /// empty or over-long version attribute.
    pub fn keyed(
        table: &str,
        version_attribute: &str,
        key: impl Fn(&str) -> std::collections::HashMap<String, AttributeValue> + Send + Sync + 'static,
    ) -> Result<Self, InvalidInput> {
        crate::options::validate_table(table)?;
        attribute("version attribute", version_attribute)?;
        Ok(Self {
            table: table.to_string(),
            version: version_attribute.to_string(),
            key: Arc::new(key),
        })
    }

    /// The table's name.
    ///
    /// ```
    /// let orders = idem_dynamo::VersionedItems::new("orders", "pk", "version")?;
    /// assert_eq!(orders.table(), "orders");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn table(&self) -> &str {
        &self.table
    }

    /// [`advance`](VersionStore::advance), whose update, when the event
    /// applies, also sets `attributes` on the aggregate's item: the event's
    /// effect on the item itself, in the one write DynamoDB allows it in a
    /// transaction.
    ///
    /// ```no_run
    /// use idem_core::store::VersionCheck;
    /// use idem_dynamo::{DynamoStore, VersionedItems};
    /// use idem_dynamo::aws_sdk_dynamodb::types::AttributeValue;
    ///
    /// # async fn example(store: DynamoStore, orders: VersionedItems) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = store.begin().await?;
    /// let status = [("status", AttributeValue::S("shipped".into()))];
    /// if orders.advance_setting(&mut tx, "order-42", 3, &status).await? == VersionCheck::Apply {
    ///     // the status and version 3 are written when tx commits
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for version 0, an empty aggregate, or an
    /// attribute that is the version's or named twice; the store's failures.
    pub async fn advance_setting(
        &self,
        tx: &mut DynamoTransaction,
        aggregate: &str,
        version: u64,
        attributes: &[(&str, AttributeValue)],
    ) -> Result<VersionCheck, StoreError> {
        if version == 0 {
            return Err(InvalidInput::OutOfRange {
                field: "version",
                reason: "versions start at 1",
            }
            .into());
        }
        if aggregate.is_empty() {
            return Err(InvalidInput::Empty { field: "aggregate" }.into());
        }
        for (i, (name, _)) in attributes.iter().enumerate() {
            attribute("attribute", name)?;
            if *name == self.version || attributes[..i].iter().any(|(other, _)| other == name) {
                return Err(InvalidInput::Malformed {
                    field: "attribute",
                    reason: format!("{name} is the version's or named twice"),
                }
                .into());
            }
        }
        let key = (self.key)(aggregate);
        // DynamoDB takes one write per item in a transaction: a second
        // check of one aggregate waits for the next transaction.
        if let Some(written) = tx.version_written(&self.table, &key) {
            return Ok(VersionCheck::Gap { current: written });
        }
        let (client, settings) = tx.parts();
        let read = client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key.clone()))
            .consistent_read(true)
            .projection_expression("#v")
            .expression_attribute_names("#v", &self.version)
            .send();
        let read = settings
            .layer
            .call(OP, None, async { read.await.map_err(|e| classify(OP, e)) })
            .await?;
        let current = match read.item().and_then(|item| item.get(&self.version)) {
            None => 0,
            Some(stored) => stored
                .as_n()
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| corrupt(OP, "version"))?,
        };
        let check = VersionCheck::of(version, current);
        if check == VersionCheck::Apply {
            let update = self.update(key.clone(), version, attributes)?;
            tx.push_version(&self.table, &key, version, update);
        }
        Ok(check)
    }

    /// The update to `version` on its predecessor, setting `attributes` too.
    fn update(
        &self,
        key: Item,
        version: u64,
        attributes: &[(&str, AttributeValue)],
    ) -> Result<TransactWriteItem, StoreError> {
        let previous = version - 1;
        let condition = if previous == 0 {
            "attribute_not_exists(#v) OR #v = :prev"
        } else {
            "#v = :prev"
        };
        let mut set = String::from("SET #v = :v");
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key))
            .condition_expression(condition)
            .expression_attribute_names("#v", &self.version)
            .expression_attribute_values(":v", n(version))
            .expression_attribute_values(":prev", n(previous));
        for (i, (name, value)) in attributes.iter().enumerate() {
            set.push_str(&format!(", #a{i} = :a{i}"));
            update = update
                .expression_attribute_names(format!("#a{i}"), *name)
                .expression_attribute_values(format!(":a{i}"), value.clone());
        }
        let update = update
            .update_expression(set)
            .build()
            .map_err(|e| build_failure(OP, e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }
}

#[async_trait]
impl VersionStore<DynamoTransaction> for VersionedItems {
    /// One consistent `GetItem`; on [`VersionCheck::Apply`] one conditional
    /// `Update` pushed into `tx` (see [`VersionedItems`]).
    async fn advance(
        &self,
        tx: &mut DynamoTransaction,
        aggregate: &str,
        version: u64,
    ) -> Result<VersionCheck, StoreError> {
        self.advance_setting(tx, aggregate, version, &[]).await
    }
}
