//! # idem-redis
//!
//! The Redis store for [idem](idem_core): the fast store, and the one most
//! often misconfigured.
//!
//! - [`RedisStore::new`] over a [`redis::aio::ConnectionManager`] (it
//!   reconnects by itself) or a [`redis::cluster_async::ClusterConnection`],
//!   with the same behaviour; [`RedisStore::with_options`] takes
//!   [`RedisOptions`] (key prefix, response limit, eviction opt-in), checked
//!   once at construction.
//! - Every operation is one Lua script, one round trip; the claim is
//!   `lua/claim.lua` (driven from `claim.rs`). The server's `TIME` judges
//!   leases and retention, never the caller's clock.
//! - One Redis key per record, injective in (tenant, key), with a hash tag
//!   that is exactly the scope: see [`RedisStore::record_key`].
//! - Construction refuses a `maxmemory-policy` that can evict records, unless
//!   [`RedisOptions::accept_eviction_risk`] says otherwise.
//! - Nothing to share with the caller's transactions; `purge_expired` has
//!   nothing to do, since Redis expires records by `PEXPIREAT`.
//! - [`RedisJournal`] is the outbound operation journal's store
//!   ([`JournalStore`](idem_core::store::JournalStore)), on one node or a
//!   cluster alike: one hash per operation and one sorted set per namespace
//!   and state for listings, all under the namespace's hash tag, each
//!   operation one script on the server's `TIME` (`lua/journal_*.lua`);
//!   [`RedisJournalOptions`] sets its prefix (`idem-journal`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_core::Idempotency;
//! use idem_redis::{redis, RedisStore};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let store = RedisStore::new(redis::aio::ConnectionManager::new(client).await?).await?;
//! let idem = Idempotency::new(Arc::new(store));
//! # let _ = idem; Ok(()) }
//! ```
#![doc = include_str!("../GUIDE.md")]

mod claim;
mod codec;
mod commands;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod journal;
mod options;
mod store;

pub use journal::RedisJournal;
pub use options::{
    DEFAULT_JOURNAL_PREFIX, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_PREFIX, MAX_RESPONSE_BYTES_LIMIT,
    RedisJournalOptions, RedisOptions,
};
pub use store::{RedisConnection, RedisStore};

/// The driver, re-exported so your connection and ours are the same version.
pub use redis;

/// **Not part of the API**: the exact scripts the store runs, for
/// `idem-bench` to measure the store against its bare scripts. Only with the
/// `bench` feature; may change or vanish in any release.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod scripts {
    use redis::Script;

    /// The claim: `KEYS[1]` the record key; `ARGV` fingerprint (32 bytes),
    /// owner (UUID text), lease ms, retention ms.
    pub fn claim() -> &'static Script {
        &crate::commands::SCRIPTS.claim
    }

    /// The completion: `KEYS[1]` the record key; `ARGV` owner, retention ms,
    /// status, encoded headers, body. Replies 1, or 0 for a lost lease.
    pub fn complete() -> &'static Script {
        &crate::commands::SCRIPTS.complete
    }
}
