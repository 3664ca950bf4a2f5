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

/// The exact expressions the store sends, for tools that measure the store
/// against bare SDK requests. Placeholders: `#exp` and `#ttl` name `exp` and
/// `ttl`; values are described beside each.
pub mod expressions {
    /// The claim's `UpdateExpression`: `:fp` (B), `:own` (S), `:f` ("f"),
    /// `:lease`, `:exp` (epoch ms), `:ttl` (epoch s), `:zero`, `:one`,
    /// `:tenant`, `:k` (S).
    pub const CLAIM_UPDATE: &str = "SET fp = :fp, own = :own, st = :f, lease = :lease, #exp = :exp, \
        #ttl = :ttl, att = if_not_exists(att, :zero) + :one, tenant = :tenant, k = :k \
        REMOVE rs, rh, rb, datt";
    /// The claim's `ConditionExpression`; `:now` is epoch ms.
    pub const CLAIM_CONDITION: &str = "attribute_not_exists(pk) OR #exp <= :now \
        OR (st = :f AND lease <= :now AND fp = :fp)";
    /// The completion's `UpdateExpression`: `:c` ("c"), `:rs` (N), `:rh`,
    /// `:rb` (B), `:exp`, `:ttl`, `:att` (N).
    pub const COMPLETE_UPDATE: &str = "SET st = :c, rs = :rs, rh = :rh, rb = :rb, #exp = :exp, \
        #ttl = :ttl, datt = :att REMOVE lease, att, cpn, cpd";
    /// The fence of every write after the claim: `:own`, `:f`, `:now`.
    pub const FENCE: &str = "own = :own AND st = :f AND #exp > :now";
}

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
