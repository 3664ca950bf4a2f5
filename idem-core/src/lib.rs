//! # idem-core
//!
//! Idempotency keys for Rust services: a request carrying an idempotency key
//! runs once, and every retry gets the original response.
//!
//! This crate holds everything that is not a backend:
//!
//! - validated names: [`Tenant`], [`IdempotencyKey`], [`Scope`];
//! - request [`Fingerprint`]s, with RFC 8785 canonical JSON;
//! - the record ([`Record`], [`Lease`], [`StoredResponse`], [`Checkpoint`]);
//! - the claim decision table as a pure function, [`decide`];
//! - the store trait, [`IdempotencyStore`], that every backend implements;
//! - the runner, [`Idempotency`], that wraps a handler.
//!
//! Pick a store crate (`idem-memory`, `idem-postgres`, `idem-redis`,
//! `idem-dynamo`) and check your own with `idem-conformance`.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, HandlerError, Idempotency, RunError, Scope, StoredResponse};
//! use idem_memory::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let idem = Idempotency::new(Arc::new(MemoryStore::new()));
//! let body = r#"{"amount": 1000, "currency": "EUR"}"#;
//! let outcome = idem
//!     .run(Scope::parse("acme", "pay-1")?, Fingerprint::json(body)?, |ctx| async move {
//!         // Pass a stable key to the payment provider so its side is idempotent too.
//!         let _provider_key = ctx.downstream_key("charge");
//!         Ok::<_, HandlerError<std::io::Error>>(StoredResponse::new(201, "paid"))
//!     })
//!     .await?;
//! assert_eq!(outcome.response().body(), b"paid");
//! # Ok::<(), RunError<std::io::Error>>(())
//! # }).unwrap();
//! ```

mod canonical;
pub mod clock;
pub mod decision;
pub mod error;
pub mod fingerprint;
pub mod record;
pub mod runner;
pub mod scope;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{ClaimRequest, Decision, decide, validate_lease_ttl, validate_retention};
pub use error::{InvalidInput, StoreError};
pub use fingerprint::{Fingerprint, FingerprintBuilder, canonical_json};
pub use record::{Checkpoint, Lease, OwnerToken, Record, RecordState, StoredResponse};
pub use runner::{Context, HandlerError, Idempotency, RunError, RunOutcome};
pub use scope::{IdempotencyKey, Scope, Tenant};
pub use store::{
    Capabilities, ClaimOutcome, ClockSource, Durability, Eviction, IdempotencyStore,
    TransactionSharing,
};

/// Re-exported so store crates and their users agree on one version.
pub use async_trait::async_trait;
