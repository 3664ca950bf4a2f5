//! # idem-memory
//!
//! An in-process [`IdempotencyStore`](idem_core::store::IdempotencyStore) on [moka](https://docs.rs/moka): for
//! tests, examples and single-process services. Records live in this
//! process only (not durable, nothing shared across instances), and the
//! caller's [`Clock`](idem_core::store::Clock) judges leases and retention, so tests can inject a
//! [`ManualClock`](idem_core::ManualClock) through [`MemoryOptions`].
//!
//! Each decision runs inside one moka `and_compute_with` on the record's
//! key, which serialises all operations on one scope: a claim reads and
//! writes atomically, never a get followed by an insert. moka expires every
//! record at its retention.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, Scope, StoredResponse};
//! use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore};
//! use idem_memory::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let request = ClaimRequest::new(Scope::parse("acme", "k1")?, Fingerprint::of_bytes(b"req"));
//! let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await? else { unreachable!() };
//! store.complete(&lease, &StoredResponse::new(200, "ok")).await?;
//! assert_eq!(
//!     store.claim(&request).await?,
//!     ClaimOutcome::Completed(StoredResponse::new(200, "ok"))
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod journal;
mod options;
mod outbox;
mod parking;
mod part;
mod store;
mod transaction;

pub use journal::MemoryJournal;
pub use options::{DEFAULT_MAX_RESPONSE_BYTES, MemoryOptions};
pub use outbox::MemoryOutbox;
pub use parking::MemoryParking;
pub use store::MemoryStore;
pub use transaction::MemoryTransaction;
