//! # idem-journal
//!
//! The other half of idempotency: the calls a service makes. When a charge
//! at a payment provider times out, the customer may or may not have been
//! charged; the answer is neither "failed" nor "succeeded" but "unknown,
//! find out". The journal converges each business effect to exactly one:
//!
//! - an operation has a business identity ([`OperationId`]: order 42 /
//!   charge) within the journal's namespace and is recorded before its side
//!   effect ([`Journal::record`]), with the idempotency key the provider will
//!   get ([`JournalRecord::provider_key`]): derived from the namespace, the
//!   identity and a random part drawn when it is recorded, so it is the same
//!   after a crash and restart, and two journals (two tenants, two services,
//!   a store recreated after a reset) never send one key;
//! - [`Journal::execute`] sends with that key while the provider keeps keys
//!   ([`Delivery::Keyed`], measured from the first send, which is recorded
//!   before it happens, by the store's clock, stopping a [`KeyWindow`]'s
//!   margin early so a clock stepped back by less sends no second effect), retrieves by the provider's id once known, and past
//!   the window never sends again: [`Provider::find`], given the recorded
//!   operation, settles it, and no match or several mark it for review; for
//!   providers without keys, [`Delivery::AtMostOnce`] or
//!   [`Delivery::AtLeastOnce`] says what an unknown outcome means;
//! - the provider's answers are classified by whether they settle anything
//!   ([`ProviderOutcome`]): ambiguity is never rounded to failure;
//! - executors hold an operation under a lease, so one sends at a time, and
//!   a crashed executor's operation is taken over; the store's clock judges
//!   leases and the key window (the database server's on Postgres, Redis's
//!   `TIME`), never an executor's;
//! - [`Journal::reconcile`] drives what stayed pending or unknown, and
//!   searches again what a search did not find yet, in bounded batches at a
//!   bounded rate, reporting each step; [`Journal::needs_review`] and
//!   [`Journal::settle`] (refused while an executor holds the operation) are
//!   for the operator;
//! - a settled state ([`OperationState::Succeeded`], [`OperationState::Failed`])
//!   is final: nothing overwrites it and the provider is never called for it
//!   again.
//!
//! The rules live here; the stores live in the backend crates, beside their
//! idempotency stores: `idem_memory::MemoryJournal`, and the Postgres,
//! Redis and DynamoDB journals (the contract, and the suite every journal
//! store passes, are `idem_core::store::JournalStore` and
//! `idem_conformance::journal_suite!`).
#![doc = include_str!("../GUIDE.md")]

mod error;
mod journal;
mod provider;

pub use error::JournalError;
pub use journal::{Journal, MAX_BATCH, Reconciled, Step};
pub use provider::{Delivery, KeyWindow, Match, Provider, ProviderOutcome};

/// What a journal user handles, from the store's namespace.
pub use idem_core::store::{JournalRecord, OperationId, OperationState};

/// To implement [`Provider`].
pub use idem_core::async_trait;
