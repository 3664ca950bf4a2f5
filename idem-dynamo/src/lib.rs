//! # idem-dynamo
//!
//! The DynamoDB store for [idem](idem_core), over your
//! [`aws_sdk_dynamodb::Client`].
//!
//! - [`DynamoStore::new`] takes the client and a table name;
//!   [`DynamoStore::create_table`] creates the table (on-demand billing, TTL
//!   on `ttl`) for tests and quick starts, and documents the definition.
//! - One item per record under the partition key `<n>:<tenant>:<key>`
//!   ([`item_key`]): injective, so no two scopes share an item.
//! - The claim is one conditional `UpdateItem` for every outcome (see
//!   `claim.rs`); complete, renew and checkpoint are one conditional
//!   `UpdateItem` each, release one conditional `DeleteItem`, all fenced on
//!   the owner.
//! - DynamoDB has no clock: the caller's judges leases and retention (see
//!   [`DynamoStore`] for the skew this tolerates). TTL deletes lazily, so
//!   every decision checks retention itself.
//! - [`DynamoStore::complete_item`] gives the completion as a
//!   `TransactWriteItem` for your own transaction; [`DynamoStore::complete_with`]
//!   sends it with your items.
//! - A response that cannot fit a 400 KB item is refused with `TooLarge`
//!   before anything is written.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_core::Idempotency;
//! use idem_dynamo::{aws_sdk_dynamodb, DynamoStore};
//!
//! # async fn example(config: aws_sdk_dynamodb::Config) -> Result<(), Box<dyn std::error::Error>> {
//! let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), "idem-records")?;
//! let idem = Idempotency::new(Arc::new(store));
//! # let _ = idem; Ok(()) }
//! ```

mod claim;
mod config;
mod error;
mod item;
mod store;
mod table;
mod transact;

pub use config::{DEFAULT_MAX_RESPONSE_BYTES, ITEM_LIMIT, TableName, item_key};
pub use store::DynamoStore;
pub use transact::{RejectedItem, TransactError};

/// The SDK, re-exported so your client and ours are the same version.
pub use aws_sdk_dynamodb;
