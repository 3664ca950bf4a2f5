//! # idem-core
//!
//! Idempotency keys for Rust services: a request carrying an idempotency key
//! runs once, and every retry gets the original response.
//!
//! Two audiences, two namespaces:
//!
//! - **Service authors** use the crate root: the runner [`Idempotency`] and
//!   its [`RunContext`], outcomes and errors, validated names ([`Scope`],
//!   [`Tenant`], [`IdempotencyKey`]), request [`Fingerprint`]s (exact
//!   canonical JSON), the [`StoredResponse`] kept for replay, and a
//!   [`Sweeper`] for stores that want one.
//! - **Store authors** use [`store`]: the trait every backend implements, the
//!   contract it keeps, the decision table as a function, clocks, and the
//!   codecs stores share.
//!
//! [`observability`] names the `tracing` spans the runner opens and the
//! metrics it records (with the `metrics` feature); the key never appears in
//! either, only its hash. [`store::Record`] and [`StoredResponse`] serialise
//! with serde for admin routes, and
//! [`IdempotencyStore::delete`](store::IdempotencyStore::delete) clears a
//! record by scope on every backend.
//!
//! Pick a store crate (`idem-memory`, `idem-postgres`, `idem-redis`,
//! `idem-dynamo`) and check your own with `idem-conformance`.
//!
//! ```
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, Idempotency, RunError, Scope, StoredResponse};
//! use idem_memory::MemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let idem = Idempotency::new(Arc::new(MemoryStore::new()));
//! let body = r#"{"amount": 1000, "currency": "EUR"}"#;
//! let outcome = idem
//!     .run(Scope::parse("acme", "pay-1")?, Fingerprint::json(body)?, |ctx| async move {
//!         // Pass a stable key to the payment provider so its side is idempotent too.
//!         let _provider_key = ctx.downstream_key("charge");
//!         Ok(StoredResponse::new(201, "paid"))
//!     })
//!     .await?;
//! assert_eq!(outcome.response().body(), b"paid");
//! # Ok::<(), RunError>(())
//! # }).unwrap();
//! ```
#![doc = include_str!("../GUIDE.md")]

mod canonical;
mod inbound;
mod journal;
mod outbox;
mod parking;
mod plumbing;

pub use inbound::fingerprint::{Fingerprint, FingerprintBuilder, canonical_json};
pub use inbound::outcome::{
    HandlerError, IntoVerdict, ResultExt, RunError, RunOutcome, Storable, Verdict,
};
pub use inbound::record::{Checkpoint, MAX_CHECKPOINT_BYTES, StoredResponse};
pub use inbound::runner::{Idempotency, NoTransaction, RunContext};
pub use inbound::sweeper::Sweeper;
pub use outbox::message::Event;
pub use plumbing::clock::ManualClock;
pub use plumbing::error::{BoxError, InvalidInput, Operation, StoreError};
pub use plumbing::options::StoreOptions;
pub use plumbing::scope::{ConsumerName, IdempotencyKey, MAX_NAME_BYTES, Scope, Tenant, redacted};
pub use plumbing::service::{PartOutput, Service, ServiceError, Shutdown};

/// Re-exported so store crates and their users agree on one version.
pub use async_trait::async_trait;

pub mod observability;
pub mod store;
