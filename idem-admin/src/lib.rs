//! # idem-admin
//!
//! The operator's console: see and mend what is stuck, from a browser, a
//! JSON API or (with `idem-cli`) a terminal.
//!
//! Every part of idem can get stuck in a way only a person settles: a
//! parked outbox message, a consumer's parked message, a journal operation
//! whose outcome is unknown, a record a client needs cleared. One
//! [`Admin`] is built from whichever stores a service has, each optional,
//! on any backend through the store traits:
//!
//! - **records** ([`Admin::records`], an `Idempotency`): read one by tenant
//!   and key, delete it;
//! - **the outbox** ([`Admin::outbox`], an `OutboxStore`): the pending
//!   count and the oldest unsent age (per partition where the store reports
//!   partitions), parked messages by page, retry, drop with a reason;
//! - **consumers** ([`Admin::consumer`], a [`ConsumerParking`] each): their
//!   parked messages by page, replay (through the consumer: its handler
//!   runs), drop with a reason;
//! - **journals** ([`Admin::journal`], a `Journal` each): operations whose
//!   outcome is unknown or that need review, settled with the provider's
//!   answer.
//!
//! [`Admin::authorize`] puts it behind the service's authorization check,
//! and only then is there a [`router`](Console::router): the JSON API
//! under `api/` (answers as JSON, errors as RFC 9457 problems) and a
//! server-rendered page (no JavaScript), to mount under the service's own
//! prefix. Form posts carry a token bound to the operator, and unsafe
//! requests from another origin are refused. Every action is traced
//! (`tracing`, target `idem_admin`, span `idem.admin`) with what was done,
//! the target's hash (never a key), the reason and the operator; every
//! action is safe to repeat, and a repeat answers what the first did
//! ([`Done::changed`] `false`).
//!
//! ```
//! use std::sync::Arc;
//! use http::request::Parts;
//! use idem_admin::{Admin, Operator, Refusal};
//! use idem_core::Idempotency;
//! use idem_memory::{MemoryOutbox, MemoryStore};
//!
//! fn admin_routes(idem: Idempotency, outbox: Arc<MemoryOutbox>) -> axum::Router {
//!     let console = Admin::new()
//!         .records(idem)
//!         .outbox(outbox)
//!         .authorize(|request: &Parts| {
//!             // The service's own check: a session, a proxy's header, a token.
//!             match request.headers.get("x-ops-user").and_then(|v| v.to_str().ok()) {
//!                 Some(user) => Operator::new(user).map_err(|_| Refusal::Forbidden),
//!                 None => Err(Refusal::unauthenticated(None)),
//!             }
//!         })
//!         .router();
//!     axum::Router::new().nest("/admin", console)
//! }
//! # let _ = admin_routes(Idempotency::new(Arc::new(MemoryStore::new())), Arc::new(MemoryOutbox::new()));
//! ```
#![doc = include_str!("../GUIDE.md")]

/// The console's JSON API as an OpenAPI 3.1 document: every route under
/// `api/`, its parameters, bodies and answers. The router serves it at
/// `api/openapi.json`, behind the same authorization check.
///
/// ```
/// let api: serde_json::Value = serde_json::from_str(idem_admin::OPENAPI)?;
/// assert_eq!(api["openapi"], "3.1.0");
/// assert!(api["paths"]["/api/summary"]["get"].is_object());
/// # Ok::<(), serde_json::Error>(())
/// ```
pub const OPENAPI: &str = include_str!("../openapi.json");

mod admin;
mod api;
mod consumers;
mod error;
mod html;
mod journal;
mod outbox;
mod page;
mod records;
mod router;
mod security;
mod shared;
mod view;

pub use admin::{
    Admin, AttentionFigures, ConsumerSummary, JournalSummary, MAX_REASON_BYTES, ParkedFigures,
    Reading, Summary,
};
pub use consumers::{ConsumerParking, ParkedView, StuckView};
pub use error::AdminError;
pub use journal::{OperationView, Outcome, Settlement};
pub use outbox::{OutboxMessageView, OutboxSummary, PartitionBacklog};
pub use records::RecordRef;
pub use router::Console;
pub use security::{Authorize, Check, Operator, Refusal};
pub use view::{Action, Done, Listing, Page, Payload};
