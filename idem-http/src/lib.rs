//! # idem-http
//!
//! The `Idempotency-Key` HTTP header's semantics (IETF draft "The
//! Idempotency-Key HTTP Header Field") as a tower [`Layer`](tower::Layer),
//! for axum, hyper and every tower stack, over any idem store.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, routing::post};
//! use idem_core::Idempotency;
//! use idem_core::store::IdempotencyStore;
//! use idem_http::IdempotencyLayer;
//!
//! async fn create_order(body: String) -> (http::StatusCode, String) {
//!     (http::StatusCode::CREATED, format!("order for {body}"))
//! }
//!
//! let store: Arc<dyn IdempotencyStore> = Arc::new(idem_memory::MemoryStore::new());
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(Idempotency::new(store)).require_key());
//! # let _ = app;
//! ```
//!
//! What a client meets, for the methods the layer covers (`POST` and `PATCH`
//! by default):
//!
//! | request | response |
//! |---|---|
//! | first with a key | the handler's response, stored by the status policy |
//! | a retry (same key, same request) | the stored status, headers and body, with `Idempotent-Replayed: true` |
//! | a duplicate while the first runs | 409, `Retry-After`; or, with [`IdempotencyLayer::wait_for_result`], the replay once it is stored |
//! | the key reused for another request | 422 |
//! | no key where required, an invalid or repeated key | 400 |
//! | a body over the limit | 413, before anything is claimed (a declared `Content-Length` over it before any of the body is read) |
//! | a response too large for the store | the response; retries replay the small answer stored in its place |
//!
//! Refusals are `application/problem+json` (RFC 9457): `about:blank` with
//! the status phrase as title, or, with
//! [`IdempotencyLayer::problem_documentation`], a type URI per problem under
//! your link with the draft's titles. The key must be one RFC 9651 sf-string
//! (`Idempotency-Key: "8e03978e-40d5"`), parsed with `sfv`. Requests are
//! fingerprinted by method, path and query, chosen headers and the body
//! (canonical JSON for JSON bodies, numbers by exact decimal value, or only
//! chosen JSON pointers), so the same key sent to another route is a
//! mismatch, never a replay. The handler's lease is renewed while it runs
//! (the runner's default).
//!
//! Handlers find the run's [`RunContext`](idem_core::RunContext) in their
//! request's extensions, always over `dyn IdempotencyStore` whatever the
//! layer's store (with axum, `Extension<RunContext<dyn IdempotencyStore>>`,
//! over `Arc<PostgresStore>` as over `Arc<dyn IdempotencyStore>`), for
//! downstream keys and checkpoints; in the transactional mode
//! ([`IdempotencyLayer::in_transaction`]) also an [`IdempotencyTransaction`] to write
//! through.
//!
//! Keys can be personal data: the layer logs a hash of a key, never the key.
#![doc = include_str!("../GUIDE.md")]

mod body;
mod config;
mod fingerprint;
mod future;
mod key;
mod layer;
mod problem;
mod replay;
mod service;
mod tenant;
mod transaction;

pub use body::ResponseBody;
pub use config::{NEVER_REPLAYED, REPLAY_HEADER, StatusAction, default_status_policy};
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use problem::ProblemDetails;
pub use service::IdempotencyService;
pub use tenant::{TenantRejection, TenantSource};
pub use transaction::{IdempotencyTransaction, TransactionTaken};
