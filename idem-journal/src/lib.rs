//! # idem-journal
//!
//! The other half of idempotency: the calls a service makes. When a charge
//! at a payment provider times out, the customer may or may not have been
//! charged; the answer is neither "failed" nor "succeeded" but "unknown,
//! find out". The journal converges each business effect to exactly one:
//!
//! - an operation has a business identity ([`OperationId`]: order 42 /
//!   charge) and is recorded before its side effect ([`Journal::record`]);
//! - the provider's idempotency key is derived from that identity
//!   ([`OperationId::provider_key`]), the same after a crash and restart;
//! - [`Journal::execute`] sends with that key while the provider keeps keys
//!   ([`Provider::key_window`], measured from the first send, which is
//!   recorded before it happens), retrieves by the provider's id once known,
//!   and past the window never sends again: [`Provider::find`] settles it,
//!   and no match or several mark it for review;
//! - the provider's answers are classified by whether they settle anything
//!   ([`ProviderOutcome`]): ambiguity is never rounded to failure;
//! - executors hold an operation under a lease, so one sends at a time, and
//!   a crashed executor's operation is taken over;
//! - [`Journal::reconcile`] drives what stayed pending or unknown, in bounded
//!   batches at a bounded rate; [`Journal::needs_review`] and
//!   [`Journal::settle`] are for the operator;
//! - a settled state ([`OperationState::Succeeded`], [`OperationState::Failed`])
//!   is final: nothing overwrites it and the provider is never called for it
//!   again.
//!
//! Stores: [`MemoryJournal`], [`PostgresJournal`] (which can record an
//! operation inside the caller's business transaction) and [`RedisJournal`]
//! (one node).

mod error;
mod journal;
mod operation;
mod postgres;
mod provider;
mod redis;
mod store;

pub use error::JournalError;
pub use journal::{Journal, Reconciled};
pub use operation::{Operation, OperationId, OperationState};
pub use postgres::PostgresJournal;
pub use provider::{Match, Provider, ProviderOutcome};
pub use redis::RedisJournal;
pub use store::{JournalStore, MemoryJournal, Versioned};
