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
//! - The relay claims a batch in one round trip under a lease, holds no
//!   database transaction while it publishes, marks what the broker
//!   confirmed sent in one round trip, and never has two messages of one
//!   aggregate in flight: it claims an aggregate's next message while the
//!   broker confirms the last, and publishes it once that one is
//!   confirmed (handing it back if that one failed); a message that keeps failing is retried with
//!   back-off, then parked with its last error, and only its aggregate
//!   waits. A relay can still publish a message twice (it stopped after the
//!   broker confirmed and before it marked): the message id lets the broker
//!   (JetStream's duplicate window) or the consumer (an inbox) drop the copy.
//! - Operators list parked messages, retry one or drop one, through the
//!   store ([`OutboxStore::parked`](idem_core::store::OutboxStore::parked),
//!   `retry`, `drop_message`).
//!
//! The store's contract is `idem_core::store::OutboxStore`, implemented
//! beside each backend's other stores (`idem_memory::MemoryOutbox`, the
//! Postgres outbox).
//!
//! # Metrics
//!
//! With the `metrics` feature: [`PENDING`] and [`OLDEST_PENDING`] (gauges,
//! refreshed by [`Relay::run`] when idle), [`PUBLISHED`], [`FAILED`] and
//! [`PARKED`] (counters), [`PUBLISH_DURATION`] (histogram, seconds, one
//! observation per batch). Each `relay_once` and each `drain` is a DEBUG span,
//! `idem.outbox.relay`.

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
/// Counter: messages the broker confirmed and the relay marked sent.
pub const PUBLISHED: &str = "idem_outbox_published_total";
/// Counter: failed publishes (retried or parked).
pub const FAILED: &str = "idem_outbox_failed_total";
/// Counter: messages parked after their last attempt.
pub const PARKED: &str = "idem_outbox_parked_total";
/// Histogram, seconds: one batch's publishing, to the broker's confirmations.
pub const PUBLISH_DURATION: &str = "idem_outbox_publish_duration_seconds";
