//! # idem-outbox
//!
//! The transactional outbox: a business change and the event that reports
//! it commit together, and a [`Relay`] publishes every committed event, in
//! order per aggregate, through a [`Publisher`] (RabbitMQ with
//! `idem-rabbitmq`, NATS JetStream with `idem-nats`, or one of yours).
//!
//! - Enqueue in the business transaction: a backend's outbox store writes
//!   the message beside your rows (Postgres: inside any sqlx transaction, or
//!   the runner's `run_in`), so a message exists exactly when its change
//!   committed. Each message has a unique id (the broker message id), an
//!   aggregate and its next sequence, a type, headers and a payload.
//! - Messages form one log per partition (an aggregate's partition is a
//!   stable hash of it). A relay holds partitions under leases (any number
//!   of relays share them; a dead relay's go to another once its leases
//!   lapse), reads each log through its cursor (one read per batch), holds
//!   no database transaction while it publishes, and moves the cursor once
//!   the broker confirmed the batch (one write per batch; a relay whose
//!   lease lapsed moves nothing). A batch reaches the broker in waves, never
//!   two messages of one aggregate at once, and the next batch is read
//!   while the broker confirms one. A message that fails leaves the log for
//!   its partition's retry lane, with the later messages of its aggregate,
//!   and is retried with back-off, then parked with its last error: only
//!   its aggregate waits. A relay can still publish a message twice (it
//!   stopped after the broker confirmed and before its cursor moved): the
//!   message id lets the broker (JetStream's duplicate window) or the
//!   consumer (an inbox) drop the copy.
//! - Operators list parked messages, retry one or drop one, through the
//!   store ([`OutboxStore::parked`](idem_core::store::OutboxStore::parked),
//!   `retry`, `drop_message`).
//!
//! The store's contract is `idem_core::store::OutboxStore`, implemented
//! beside each backend's other stores (`idem_memory::MemoryOutbox`, the
//! Postgres and DynamoDB outboxes).
//!
//! # Metrics
//!
//! With the `metrics` feature: [`PENDING`], [`OLDEST_PENDING`] and
//! [`PARTITION_LAG`] (gauges, refreshed by [`Relay::run`] when idle),
//! [`PUBLISHED`], [`FAILED`] and
//! [`PARKED`] (counters), [`PUBLISH_DURATION`] (histogram, seconds, one
//! observation per batch). Each `relay_once` and each `drain` is a DEBUG span,
//! `idem.outbox.relay`.
#![doc = include_str!("../GUIDE.md")]

mod publisher;
mod relay;

pub use publisher::{
    MAX_PUBLISH_TIMEOUT, PublishError, Published, Publisher, validate_publish_timeout,
};
pub use relay::{MAX_IN_FLIGHT, Relay, RelayError, RelayOptions, RelayPass};

/// To implement [`Publisher`].
pub use idem_core::async_trait;

/// Gauge: messages waiting to be published.
pub const PENDING: &str = "idem_outbox_pending";
/// Gauge, seconds: how long the oldest pending message has waited (sent
/// and parked messages do not count).
pub const OLDEST_PENDING: &str = "idem_outbox_oldest_pending_seconds";
/// Counter: messages the broker confirmed and the relay settled (its
/// cursor moved past them, or a lane message marked sent).
pub const PUBLISHED: &str = "idem_outbox_published_total";
/// Counter: failed publishes (retried or parked).
pub const FAILED: &str = "idem_outbox_failed_total";
/// Counter: messages parked after their last attempt.
pub const PARKED: &str = "idem_outbox_parked_total";
/// Histogram, seconds: one batch's publishing, to the broker's confirmations.
pub const PUBLISH_DURATION: &str = "idem_outbox_publish_duration_seconds";
/// Gauge, seconds, by `partition`: how long the partition's oldest pending
/// message has waited (its lag).
pub const PARTITION_LAG: &str = "idem_outbox_partition_lag_seconds";
