//! # idem-consumer
//!
//! The consuming side of exactly-once effects: a [`Consumer`] takes a
//! broker's deliveries ([`Source`], [`Delivery`]: RabbitMQ with
//! `idem-rabbitmq`, NATS JetStream with `idem-nats`, or one of yours) and
//! gives each message one effect, however often it is delivered.
//!
//! - **Inbox.** Per delivery the message id is claimed, scoped by the
//!   consumer's name, and the [`Handler`]'s writes and the inbox record
//!   commit in one transaction (the store's, through
//!   [`Idempotency::run_in`](idem_core::Idempotency::run_in)); the delivery
//!   is acknowledged only after that commit. A redelivery of an applied
//!   message is acknowledged with no effect.
//! - **Batches.** [`Consumer::run`] gathers deliveries into batches
//!   ([`ConsumerOptions::batch`]) handled in one transaction that batches
//!   ([`Transaction::batches`](idem_core::store::Transaction::batches):
//!   `idem_postgres::PgTransaction`): each message's claim and writes
//!   under a savepoint of its own, one commit, then the acks together
//!   ([`Delivery::ack_all`]); see [`Consumer::consume_batch`].
//! - **Redelivery and parking.** A failure rolls the writes back and asks
//!   the broker again after a back-off (one that no redelivery can fix,
//!   [`Permanent`], is parked at once), a bounded number of times by the
//!   consumer's own count (never the broker's: only the consumer decides
//!   that a message is done, and a broker that limits its deliveries is
//!   refused); then the message is parked with its reason in an
//!   [`idem_core::store::ParkingStore`] (`idem_memory::MemoryParking`,
//!   `idem_postgres::PostgresParking`, `idem_dynamo::DynamoParking`), where
//!   operators list, replay or drop it.
//! - **Version checks.** An event carries its aggregate's version; the
//!   handler applies it only on its predecessor
//!   ([`VersionStore`](idem_core::store::VersionStore),
//!   `idem_postgres::VersionedTable` or `idem_dynamo::VersionedItems` over
//!   your own table) and returns the check as [`Handled`]: a duplicate or
//!   stale event is acknowledged with no effect, a gap is retried, then
//!   parked, and later versions wait behind it until the gap fills; an
//!   aggregate stuck behind a gap is listed ([`Consumer::stuck`], the
//!   [`STUCK`] gauge) and swept.
//! - **Retention against the broker.** [`Consumer::check`] refuses an
//!   inbox retention shorter than the broker's redelivery horizon
//!   ([`RedeliveryHorizon`]) with [`ConsumerError::Misconfigured`] naming
//!   the figure; [`Consumer::run`] checks before its first delivery.
//!
//! # Metrics
//!
//! With the `metrics` feature: [`MESSAGES`] (counter, by `consumer` and
//! `outcome`: `applied`, `stale`, `duplicate`, `retried`, `in_progress`,
//! `parked`), [`LAG`] (histogram, seconds from the broker's publish to
//! the settlement), [`BATCH_SIZE`] (histogram, deliveries per batch) and
//! [`IN_FLIGHT`] (gauge, deliveries being handled in batches). Each
//! delivery is an INFO span, `idem.consume`; each batch one too,
//! `idem.consume_batch`, with its `size` and its `commits`.
#![doc = include_str!("../GUIDE.md")]

mod consumer;
mod delivery;
mod failures;
mod flight;
mod options;
mod permanent;
mod raw;

pub use consumer::{Consumer, ConsumerError, Handled, Handler, Settled, Stuck, WAITING_PER_SLOT};
pub use delivery::{BrokerError, Delivery, RedeliveryHorizon, Source, bounded};
pub use options::ConsumerOptions;
pub use permanent::Permanent;
pub use raw::{MALFORMED_KIND, Malformed, RawMessage};

/// To implement [`Handler`], [`Delivery`] and [`Source`].
pub use idem_core::async_trait;

/// Counter: deliveries settled, by `consumer` and `outcome`.
pub const MESSAGES: &str = "idem_consumer_messages_total";
/// Histogram, seconds: from the broker's publish to the settlement.
pub const LAG: &str = "idem_consumer_lag_seconds";

/// Histogram: deliveries per batch, by `consumer`.
pub const BATCH_SIZE: &str = "idem_consumer_batch_size";
/// Gauge: deliveries being handled in batches, by `consumer`.
pub const IN_FLIGHT: &str = "idem_consumer_in_flight";
/// Gauge: aggregates still stuck after a sweep ([`Consumer::stuck`]), by
/// `consumer`.
pub const STUCK: &str = "idem_consumer_stuck_aggregates";

/// Records how many aggregates a sweep left stuck.
#[cfg(feature = "metrics")]
fn record_stuck(consumer: &idem_core::ConsumerName, stuck: usize) {
    metrics::gauge!(STUCK, "consumer" => consumer.as_str().to_string()).set(stuck as f64);
}

#[cfg(not(feature = "metrics"))]
fn record_stuck(_: &idem_core::ConsumerName, _: usize) {}

/// A batch's deliveries counted in [`IN_FLIGHT`] until dropped; its size
/// recorded in [`BATCH_SIZE`].
pub(crate) struct InFlight {
    #[cfg(feature = "metrics")]
    gauge: metrics::Gauge,
    #[cfg(feature = "metrics")]
    size: f64,
}

impl InFlight {
    #[cfg(feature = "metrics")]
    pub(crate) fn new(consumer: &idem_core::ConsumerName, size: usize) -> Self {
        let name = consumer.as_str().to_string();
        let size = size as f64;
        metrics::histogram!(BATCH_SIZE, "consumer" => name.clone()).record(size);
        let gauge = metrics::gauge!(IN_FLIGHT, "consumer" => name);
        gauge.increment(size);
        Self { gauge, size }
    }

    #[cfg(not(feature = "metrics"))]
    pub(crate) fn new(_: &idem_core::ConsumerName, _: usize) -> Self {
        Self {}
    }
}

#[cfg(feature = "metrics")]
impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.decrement(self.size);
    }
}

/// Records one settled delivery's metrics.
#[cfg(feature = "metrics")]
fn record(
    consumer: &idem_core::ConsumerName,
    consumed: &Settled,
    published_at: Option<idem_core::store::Timestamp>,
) {
    use idem_core::store::{Clock, SystemClock};
    let name = consumer.as_str().to_string();
    metrics::counter!(MESSAGES, "consumer" => name.clone(), "outcome" => consumed.as_str())
        .increment(1);
    if let Some(at) = published_at {
        let lag = SystemClock.now().saturating_duration_since(at);
        metrics::histogram!(LAG, "consumer" => name).record(lag.as_secs_f64());
    }
}

#[cfg(not(feature = "metrics"))]
fn record(_: &idem_core::ConsumerName, _: &Settled, _: Option<idem_core::store::Timestamp>) {}
