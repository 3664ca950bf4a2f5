//! # idem-postgres
//!
//! The Postgres store for [idem](idem_core): the idempotency record lives in
//! the same database as the business data, so the effect and the record of
//! it can commit together.
//!
//! - [`PostgresStore::new`] takes your `sqlx::PgPool`. Where code of yours
//!   that can be cut off opens transactions on it with sqlx's `begin`,
//!   build it with [`guarded`] (a connection a dropped future left inside a
//!   transaction block is rolled back before anyone borrows it), or open
//!   them with [`begin`], as the stores do, and it needs no guard;
//!   [`PostgresStore::migrate`]
//!   creates the table and the claim function ([`PostgresStore::migration_sql`]
//!   gives the same SQL to your own migration tool).
//! - Every claim is one round trip for every outcome: a call of a PL/pgSQL
//!   function (see `claim.rs` and `migrations/`) whose replay path writes
//!   nothing. Complete, renew, release and checkpoint are one fenced
//!   statement each. The server's clock judges leases and retention.
//! - [`PostgresStore::begin`] opens a [`PgTransaction`] for
//!   [`Idempotency::run_in`](idem_core::Idempotency::run_in): the handler's
//!   writes, its checkpoints and the completion commit together;
//!   [`PostgresStore::claim_in`] is the inbox mode for message consumers.
//! - [`IdempotencyStore::purge_expired`](idem_core::store::IdempotencyStore::purge_expired)
//!   deletes in bounded `SKIP LOCKED` batches; run it on an interval with
//!   [`idem_core::Sweeper`].
//! - [`PostgresJournal`] is the outbound operation journal's store
//!   ([`JournalStore`](idem_core::store::JournalStore)) in a table of its
//!   own (`idem_journal`; [`PostgresJournalOptions`]): one PL/pgSQL call per
//!   operation, on the server's clock, and
//!   [`PostgresJournal::record_in`] records an operation inside the
//!   caller's business transaction.
//! - [`PostgresOutbox`] is the transactional outbox's store
//!   ([`OutboxStore`](idem_core::store::OutboxStore)) in a table of its own
//!   (`idem_outbox`, with a counter row per aggregate in
//!   `idem_outbox_aggregates`; [`PostgresOutboxOptions`]):
//!   [`PostgresOutbox::enqueue_in`] writes a message inside the business
//!   transaction, sequences follow the commit order per aggregate, a
//!   relay leases a partition and reads its log through a cursor (a
//!   batch's settlement and the next read are one statement), and
//!   [`PostgresOutbox::listen`] wakes a relay when a message commits.
//! - [`PostgresParking`] keeps a message consumer's parked messages
//!   ([`ParkingStore`](idem_core::store::ParkingStore)) in a table of its
//!   own (`idem_parked`; [`PostgresParkingOptions`]), and
//!   [`VersionedTable`] applies an event only when your own table holds its
//!   predecessor's version.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
//! use idem_postgres::{sqlx::postgres::PgPoolOptions, PostgresStore};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = idem_postgres::guarded(PgPoolOptions::new()).connect("postgres://localhost/app").await?;
//! let store = PostgresStore::new(pool);
//! store.migrate().await?;
//! let idem = Idempotency::new(Arc::new(store));
//! let outcome = idem
//!     .run(Scope::parse("acme", "k-1")?, Fingerprint::of_bytes(b"body"), |_ctx| async {
//!         Ok(StoredResponse::new(200, "done"))
//!     })
//!     .await?;
//! # let _ = outcome; Ok(()) }
//! ```
#![doc = include_str!("../GUIDE.md")]

mod claim;
mod codec;
mod commands;
mod error;
mod fenced;
mod journal;
mod migrate;
mod options;
mod outbox;
mod parking;
mod part;
mod pool;
mod store;
mod transaction;
mod versions;

pub use journal::PostgresJournal;
pub use options::{
    DEFAULT_JOURNAL_TABLE, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_OUTBOX_TABLE, DEFAULT_PARKING_TABLE,
    DEFAULT_PURGE_BATCH, DEFAULT_TABLE, MAX_RESPONSE_BYTES_LIMIT, MAX_TABLE_NAME,
    PostgresJournalOptions, PostgresOptions, PostgresOutboxOptions, PostgresParkingOptions,
    TableName,
};
pub use outbox::{OutboxListener, PostgresOutbox};
pub use parking::PostgresParking;
pub use pool::{begin, guarded, release_check};
pub use store::PostgresStore;
pub use transaction::PgTransaction;
pub use versions::VersionedTable;

/// The driver, re-exported so your pool and ours are the same version.
pub use sqlx;
