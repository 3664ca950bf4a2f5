//! How a consumer retries and how long its inbox remembers.

use std::time::Duration;

use idem_core::InvalidInput;
use idem_core::store::{ClaimRequest, validate_lease, validate_retention};

/// How a [`Consumer`](crate::Consumer) is run; validated once by
/// [`Consumer::with_options`](crate::Consumer::with_options).
///
/// ```
/// use std::time::Duration;
/// use idem_consumer::ConsumerOptions;
///
/// let options = ConsumerOptions::default()
///     .max_deliveries(8)
///     .backoff(Duration::from_millis(500), Duration::from_secs(30))
///     .retention(Duration::from_secs(7 * 24 * 3600));
/// assert_eq!(options.delay_after(1), Duration::from_millis(500));
/// assert_eq!(options.delay_after(3), Duration::from_secs(2));
/// assert_eq!(options.delay_after(20), Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerOptions {
    pub(crate) max_deliveries: u32,
    pub(crate) first_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) release_batch: usize,
    pub(crate) release_interval: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) concurrency: usize,
    pub(crate) batch_size: usize,
    pub(crate) batch_wait: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            max_deliveries: Self::DEFAULT_MAX_DELIVERIES,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            lease: ClaimRequest::DEFAULT_LEASE,
            retention: Self::DEFAULT_RETENTION,
            release_batch: 100,
            release_interval: Self::DEFAULT_RELEASE_INTERVAL,
            shutdown_grace: Self::DEFAULT_SHUTDOWN_GRACE,
            concurrency: 1,
            batch_size: Self::DEFAULT_BATCH_SIZE,
            batch_wait: Self::DEFAULT_BATCH_WAIT,
        }
    }
}

impl ConsumerOptions {
    /// The default number of deliveries before a message is parked: 5.
    pub const DEFAULT_MAX_DELIVERIES: u32 = 5;

    /// The default retention of an inbox record: 7 days, well past any
    /// broker's redelivery of a message the consumer keeps up with.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

    /// The most deliveries [`concurrency`](Self::concurrency) allows at once.
    pub const MAX_CONCURRENCY: usize = 1024;

    /// The default most deliveries of one batch: 64.
    pub const DEFAULT_BATCH_SIZE: usize = 64;

    /// The most deliveries [`batch`](Self::batch) allows in one batch.
    pub const MAX_BATCH_SIZE: usize = 1024;

    /// The default longest wait for a batch to fill: 5 ms.
    pub const DEFAULT_BATCH_WAIT: Duration = Duration::from_millis(5);

    /// The default pause between two sweeps of stuck aggregates: 60 s.
    pub const DEFAULT_RELEASE_INTERVAL: Duration = Duration::from_secs(60);

    /// The default wait at shutdown for deliveries being handled: 30 s.
    pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

    /// The failed attempt at which a message that still fails (or is still
    /// a version gap) is parked (default
    /// [`DEFAULT_MAX_DELIVERIES`](Self::DEFAULT_MAX_DELIVERIES), at least
    /// 1), counted by the consumer itself: a delivery no consumer settled
    /// (one that died with it, one held past the broker's ack wait) does
    /// not count, and the broker must not limit deliveries at all
    /// ([`Consumer::check`](crate::Consumer::check) refuses one that does).
    /// The count lives in the consumer (its clones share it), for up to
    /// 65,536 failing messages at once: a restarted process counts again
    /// from zero, so a failing message is then tried more, never less.
    #[must_use]
    pub fn max_deliveries(mut self, max: u32) -> Self {
        self.max_deliveries = max;
        self
    }

    /// The delay before the second delivery of a failed message (default
    /// 1 s), doubling with each delivery up to `max` (default 60 s).
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = max;
        self
    }

    /// The inbox claim's lease: how long a delivery being handled keeps a
    /// redelivery of it waiting (default 30 s; the runner renews it while
    /// the handler runs).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long an inbox record is kept after its message was applied
    /// (default [`DEFAULT_RETENTION`](Self::DEFAULT_RETENTION)): it must
    /// outlast the broker's redelivery horizon, which the consumer checks.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long [`Consumer::run`](crate::Consumer::run) waits, once its
    /// shutdown completes, for the deliveries it has begun to commit and
    /// settle (default [`DEFAULT_SHUTDOWN_GRACE`](Self::DEFAULT_SHUTDOWN_GRACE)).
    /// Past it, `run` returns and what is left finishes in its task while
    /// the runtime lives; the broker delivers again whatever it never
    /// settled.
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How often [`Consumer::run`](crate::Consumer::run) sweeps for stuck
    /// aggregates (default
    /// [`DEFAULT_RELEASE_INTERVAL`](Self::DEFAULT_RELEASE_INTERVAL)): every
    /// aggregate whose oldest parked version is a gap
    /// ([`Consumer::stuck`](crate::Consumer::stuck)) is released again
    /// ([`Consumer::release`](crate::Consumer::release)), for a predecessor
    /// applied by a consumer that died before it released what waited
    /// behind it. Each sweep costs a listing of the parked messages and one
    /// replay per stuck aggregate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_consumer::ConsumerOptions;
    ///
    /// let options = ConsumerOptions::default().release_interval(Duration::from_secs(10));
    /// assert_ne!(options, ConsumerOptions::default());
    /// ```
    #[must_use]
    pub fn release_interval(mut self, interval: Duration) -> Self {
        self.release_interval = interval;
        self
    }

    /// How many batches ([`batch`](Self::batch)) [`Consumer::run`](crate::Consumer::run) handles
    /// at once (default 1; 1 to [`MAX_CONCURRENCY`](Self::MAX_CONCURRENCY)):
    /// never two deliveries of one aggregate at once, each aggregate's in
    /// delivery order. Each batch holds a connection of the handler's pool
    /// while it runs, so give the pool at least this many (and one more for
    /// a batch falling back to one message at a time), and the source a
    /// prefetch (RabbitMQ) or a pull batch (JetStream) of at least
    /// [`slots`](Self::slots), or the batches wait for the broker.
    ///
    /// ```
    /// use idem_consumer::ConsumerOptions;
    ///
    /// let options = ConsumerOptions::default().concurrency(16).batch(1, Default::default());
    /// assert_eq!(options.slots(), 16);
    /// ```
    #[must_use]
    pub fn concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = deliveries;
        self
    }

    /// How deliveries are gathered into batches that commit once (default
    /// [`DEFAULT_BATCH_SIZE`](Self::DEFAULT_BATCH_SIZE) and
    /// [`DEFAULT_BATCH_WAIT`](Self::DEFAULT_BATCH_WAIT)): up to `size`
    /// deliveries (1 to [`MAX_BATCH_SIZE`](Self::MAX_BATCH_SIZE)), or what
    /// arrived within `wait` of a batch's first delivery, are handled in
    /// one transaction of the handler's, each message's claim and writes
    /// under a savepoint of its own, then committed once and acknowledged
    /// together. [`concurrency`](Self::concurrency) batches run at once,
    /// never two deliveries of one aggregate at the same time. A
    /// transaction that does not batch
    /// ([`Transaction::batches`](idem_core::store::Transaction::batches))
    /// handles each delivery of a batch in a transaction of its own. A size
    /// of 1 commits once per message.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_consumer::ConsumerOptions;
    ///
    /// let options = ConsumerOptions::default()
    ///     .concurrency(4)
    ///     .batch(100, Duration::from_millis(10));
    /// assert_eq!(options.slots(), 400);
    /// assert_eq!(options.batch_size(), 100);
    /// ```
    #[must_use]
    pub fn batch(mut self, size: usize, wait: Duration) -> Self {
        self.batch_size = size;
        self.batch_wait = wait;
        self
    }

    /// The most deliveries of one batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The longest a batch waits to fill after its first delivery.
    pub fn batch_wait(&self) -> Duration {
        self.batch_wait
    }

    /// The most deliveries handled at once: [`concurrency`](Self::concurrency)
    /// batches of [`batch_size`](Self::batch_size).
    pub fn slots(&self) -> usize {
        self.concurrency.saturating_mul(self.batch_size)
    }

    /// The delay before delivery `delivery + 1` of a message whose delivery
    /// `delivery` failed.
    pub fn delay_after(&self, delivery: u32) -> Duration {
        let doublings = delivery.saturating_sub(1).min(31);
        self.first_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }

    /// The inbox record's retention.
    pub fn inbox_retention(&self) -> Duration {
        self.retention
    }

    /// The delivery at which a failing message is parked.
    pub fn parks_at(&self) -> u32 {
        self.max_deliveries
    }

    pub(crate) fn validated(self) -> Result<Self, InvalidInput> {
        if self.max_deliveries == 0 {
            return Err(InvalidInput::OutOfRange {
                field: "max deliveries",
                reason: "must be at least 1",
            });
        }
        if self.first_backoff > self.max_backoff {
            return Err(InvalidInput::OutOfRange {
                field: "backoff",
                reason: "the first delay exceeds the longest",
            });
        }
        if !(1..=Self::MAX_CONCURRENCY).contains(&self.concurrency) {
            return Err(InvalidInput::OutOfRange {
                field: "concurrency",
                reason: "must be 1 to 1024",
            });
        }
        if !(1..=Self::MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(InvalidInput::OutOfRange {
                field: "batch size",
                reason: "must be 1 to 1024",
            });
        }
        if self.release_interval.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "release interval",
                reason: "must be more than zero",
            });
        }
        validate_lease(self.lease)?;
        validate_retention(self.retention)?;
        Ok(self)
    }
}
