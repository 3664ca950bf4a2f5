//! # idem-dynamo
//!
//! The DynamoDB store for [idem](idem_core), and the store of its outbound
//! operation journal, over your [`aws_sdk_dynamodb::Client`].
//!
//! - [`DynamoStore::new`] takes the client (table `idem-records`);
//!   [`DynamoStore::with_options`] takes [`DynamoOptions`] (table, response
//!   limit, clock), checked once. [`DynamoStore::create_table`] creates the
//!   table (on-demand billing, TTL on `ttl`) for tests and quick starts, and
//!   documents the definition.
//! - One item per record under the partition key `<n>:<tenant>:<key>`
//!   ([`storage_key`](idem_core::store::storage_key)): injective, so no two
//!   scopes share an item.
//! - The claim is one conditional `UpdateItem` for every outcome; complete,
//!   renew and checkpoint are one conditional `UpdateItem` each, release one
//!   conditional `DeleteItem`, all fenced on the owner.
//! - DynamoDB evaluates no clock in a condition, so the store sends the
//!   time: the service's own, read from the `Date` header of its responses
//!   ([`ServiceClock`]), so callers whose clocks disagree by hours agree
//!   within about a second; the caller's clock is an option (see
//!   [`DynamoStore`] for the skew it tolerates). TTL deletes lazily, so
//!   every decision checks retention itself.
//! - [`DynamoStore::begin`] opens a [`DynamoTransaction`]: your
//!   `TransactWriteItem`s and the record's completion (and checkpoints)
//!   commit in one `TransactWriteItems`, driven by
//!   [`Idempotency::run_in`](idem_core::Idempotency::run_in).
//! - A response that cannot fit a 400 KB item is refused with `TooLarge`
//!   before anything is written.
//! - [`DynamoJournal`] is the [`JournalStore`](idem_core::store::JournalStore)
//!   (table `idem-journal`, [`DynamoJournalOptions`] beside
//!   [`DynamoOptions`]): one item per operation under
//!   [`OperationKey::storage_key`](idem_core::store::OperationKey::storage_key),
//!   each part of the record an attribute; `record` one conditional
//!   `PutItem`, `acquire`, `mark_sent` and `finish` one conditional
//!   `UpdateItem` each, fenced on the lease's owner and end and answering a
//!   second delivery from the item that refused it; `list` a query of a
//!   global secondary index (namespace and state, oldest change first),
//!   each operation found read again strongly consistent, since the index
//!   lags. [`DynamoJournal::record_item`] records an operation inside your
//!   own `TransactWriteItems`, with your business write.
//! - For a message consumer (`idem-consumer`): a [`DynamoStore`] is the
//!   inbox, and its [`DynamoTransaction`] the handler's, so the inbox
//!   record commits as one item of the handler's `TransactWriteItems`;
//!   [`DynamoParking`] (table `idem-parked`, [`DynamoParkingOptions`]) is
//!   the [`ParkingStore`](idem_core::store::ParkingStore), one item per
//!   consumer and message id, listed from strongly consistent local indexes
//!   in one request; [`VersionedItems`] is the
//!   [`VersionStore`](idem_core::store::VersionStore) over your own table,
//!   a consistent read and an update conditioned on the event's
//!   predecessor, pushed into the transaction.
//! - [`DynamoOutbox`] is the [`OutboxStore`](idem_core::store::OutboxStore)
//!   (table `idem-outbox`, [`DynamoOutboxOptions`] with its partition
//!   count): a log per partition read through a cursor with consistent
//!   queries, a message and its counters written in one
//!   `TransactWriteItems`; [`DynamoOutbox::enqueue_in`] puts them into
//!   your [`DynamoTransaction`], beside your business write.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
//! use idem_dynamo::{aws_sdk_dynamodb, DynamoOptions, DynamoStore};
//!
//! # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
//! let client = aws_sdk_dynamodb::Client::from_conf(config);
//! let store = DynamoStore::with_options(client, DynamoOptions::default().table("orders-idem"))?;
//! let idem = Idempotency::new(Arc::new(store));
//! let outcome = idem
//!     .run(Scope::parse("acme", "order-7")?, Fingerprint::of_bytes(b"{...}"), |_ctx| async move {
//!         Ok(StoredResponse::new(201, "order 7"))
//!     })
//!     .await?;
//! # let _ = outcome;
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! use idem_core::Tenant;
//! use idem_core::store::{JournalStore, NewOperation, OperationId, OperationKey};
//! use idem_dynamo::{aws_sdk_dynamodb, DynamoJournal};
//!
//! # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
//! let journal = DynamoJournal::new(aws_sdk_dynamodb::Client::from_conf(config));
//! let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-7", "charge")?);
//! let recorded = journal.record(&NewOperation::new(key, serde_json::json!({"amount": 700}))).await?;
//! println!("send with Idempotency-Key: {}", recorded.provider_key());
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_consumer::{Consumer, Handled, Handler, async_trait};
//! use idem_core::store::{InboundMessage, VersionStore};
//! use idem_core::{HandlerError, StoreError};
//! use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
//! use idem_dynamo::{DynamoParking, DynamoStore, DynamoTransaction, VersionedItems};
//!
//! struct Shipping { inbox: DynamoStore, orders: VersionedItems }
//!
//! #[async_trait]
//! impl Handler for Shipping {
//!     type Tx = DynamoTransaction;
//!     async fn begin(&self) -> Result<DynamoTransaction, StoreError> {
//!         self.inbox.begin().await // the inbox record commits with your items
//!     }
//!     async fn handle(&self, message: &InboundMessage, mut tx: DynamoTransaction) -> Result<(DynamoTransaction, Handled), HandlerError> {
//!         let (Some(order), Some(version)) = (message.aggregate(), message.version()) else {
//!             return Err("an order event without its version".into());
//!         };
//!         let check = self.orders.advance(&mut tx, order, version).await?;
//!         if check == idem_core::store::VersionCheck::Apply {
//!             let shipment = Put::builder()
//!                 .table_name("shipments")
//!                 .item("pk", AttributeValue::S(format!("{order}#{version}")))
//!                 .build()?;
//!             tx.push(TransactWriteItem::builder().put(shipment).build());
//!         }
//!         Ok((tx, check.into()))
//!     }
//! }
//!
//! # fn example(inbox: DynamoStore, parking: DynamoParking) -> Result<(), Box<dyn std::error::Error>> {
//! let orders = VersionedItems::new("orders", "pk", "version")?;
//! let shipping = Shipping { inbox: inbox.clone(), orders };
//! let consumer = Consumer::new("shipping", Arc::new(inbox), Arc::new(parking), shipping)?;
//! # let _ = consumer;
//! # Ok(()) }
//! ```
//!
//! The modules, as in every idem store: `store` (the store and its trait
//! implementation), `options`, `claim` (the one-round-trip claim), `codec`
//! (item and record), `error` (driver error mapping), `commands` (the
//! expressions sent) and `transaction`; for the journal, `journal` (the
//! store, its table and its transaction item) and `journal_item` (its item
//! and expressions); for a consumer, `parking` (the parking store, its
//! table and item) and `versions` (the version check); `outbox` (the
//! outbox store, its table, items and enqueue in a transaction).
#![doc = include_str!("../GUIDE.md")]

mod claim;
mod clock;
mod codec;
mod commands;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod journal;
mod journal_item;
mod options;
mod outbox;
mod parking;
mod part;
mod store;
mod transaction;
mod versions;

pub use clock::ServiceClock;
pub use journal::DynamoJournal;
pub use options::{
    DEFAULT_JOURNAL_TABLE, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_OUTBOX_TABLE, DEFAULT_PARKING_TABLE,
    DEFAULT_TABLE, DynamoJournalOptions, DynamoOptions, DynamoOutboxOptions, DynamoParkingOptions,
    ITEM_LIMIT,
};
pub use outbox::DynamoOutbox;
pub use parking::DynamoParking;
pub use store::DynamoStore;
pub use transaction::DynamoTransaction;
pub use versions::VersionedItems;

/// The SDK, re-exported so your client and ours are the same version.
pub use aws_sdk_dynamodb;

/// **Not part of the API**: the exact expressions the store sends, for
/// `idem-bench` to measure the store against bare SDK requests. Only with
/// the `bench` feature; may change in any release.
///
/// Placeholders: `#exp` and `#ttl` name `exp` and `ttl`; values are
/// described beside each.
#[cfg(feature = "bench")]
pub mod expressions {
    /// The claim's `UpdateExpression`: `:fp` (B), `:own` (S), `:f` ("f"),
    /// `:lease`, `:exp` (epoch ms), `:ttl` (epoch s), `:zero`, `:one`,
    /// `:tenant`, `:k` (S).
    pub const CLAIM_UPDATE: &str = crate::commands::CLAIM_UPDATE;
    /// The claim's `ConditionExpression`; `:now` is epoch ms.
    pub const CLAIM_CONDITION: &str = crate::commands::CLAIM_CONDITION;
    /// The completion's `UpdateExpression`: `:c` ("c"), `:rs` (N), `:rh`,
    /// `:rb` (B), `:exp`, `:ttl`, `:att` (N).
    pub const COMPLETE_UPDATE: &str = crate::commands::COMPLETE_UPDATE;
    /// The fence of every write after the claim: `:own`, `:f`, `:now`.
    pub const FENCE: &str = crate::commands::FENCE;
}
