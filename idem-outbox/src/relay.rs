//! The relay: reads each partition it holds through its cursor, publishes
//! what committed, and moves the cursor once a batch is confirmed.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
#[cfg(feature = "metrics")]
use std::time::Instant;

use idem_core::store::{
    Advance, LogBatch, LogPosition, MAX_PARTITIONS, OutboxMessage, OutboxStore, OwnerToken,
    PartitionLease, PublishFailure, validate_lease, validate_outbox_batch,
};
use idem_core::{InvalidInput, StoreError};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::publisher::Publisher;

/// The first look again after a wake-up that read nothing.
const FIRST_RECHECK: Duration = Duration::from_millis(10);

/// The most batches one relay keeps in flight per partition.
pub const MAX_IN_FLIGHT: usize = 16;

/// How a relay works: batch, lease, retries and back-off, how many
/// partitions it holds, and how often it looks when nothing woke it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayOptions {
    batch: usize,
    in_flight: usize,
    lease: Duration,
    max_partitions: u32,
    max_attempts: u32,
    first_retry: Duration,
    max_retry: Duration,
    poll_interval: Duration,
    retention: Duration,
    purge_every: Duration,
}

impl Default for RelayOptions {
    /// Batches of 100, two in flight at once per partition, partitions held
    /// under a 30 s lease (as many as are free), 10 attempts with back-off
    /// from 1 s doubling to 5 min, a look every second when nothing wakes
    /// it, sent messages kept 7 days and purged (a batch at a time) every
    /// minute.
    fn default() -> Self {
        Self {
            batch: 100,
            in_flight: 2,
            lease: Duration::from_secs(30),
            max_partitions: MAX_PARTITIONS,
            max_attempts: 10,
            first_retry: Duration::from_secs(1),
            max_retry: Duration::from_secs(300),
            poll_interval: Duration::from_secs(1),
            retention: Duration::from_secs(7 * 24 * 3600),
            purge_every: Duration::from_secs(60),
        }
    }
}

impl RelayOptions {
    /// Messages read and published at once (1 to 1000).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside it.
    pub fn with_batch(mut self, batch: usize) -> Result<Self, InvalidInput> {
        self.batch = validate_outbox_batch(batch)?;
        Ok(self)
    }

    /// Batches of one partition a [`drain`](Relay::drain) (and so
    /// [`run`](Relay::run)) keeps in flight at once, 1 to
    /// [`MAX_IN_FLIGHT`]: while the broker confirms one batch, the next is
    /// read and the cursor moves past earlier ones, so the store's round
    /// trips overlap the broker's instead of adding to them. The broker
    /// still receives a partition's batches one at a time, in log order. 1
    /// is strictly one batch after another.
    ///
    /// ```
    /// use idem_outbox::RelayOptions;
    ///
    /// let options = RelayOptions::default().with_in_flight(4)?;
    /// assert_eq!(options.in_flight(), 4);
    /// assert!(RelayOptions::default().with_in_flight(0).is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside 1 to [`MAX_IN_FLIGHT`].
    pub fn with_in_flight(mut self, batches: usize) -> Result<Self, InvalidInput> {
        if !(1..=MAX_IN_FLIGHT).contains(&batches) {
            return Err(InvalidInput::OutOfRange {
                field: "batches in flight",
                reason: "must be 1 to 16",
            });
        }
        self.in_flight = batches;
        Ok(self)
    }

    /// How long a relay holds each partition without moving its cursor (1
    /// ms to 7 days): longer than the batches in flight take to publish;
    /// another relay takes a partition over once its lease lapsed, and the
    /// relay that lost it moves its cursor no more.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside it.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, InvalidInput> {
        self.lease = validate_lease(lease)?;
        Ok(self)
    }

    /// The most partitions the relay holds at once (1 to
    /// [`MAX_PARTITIONS`]; all of them by default). Relays share an
    /// outbox's partitions by each taking what is free: with `n` relays
    /// over `p` partitions, a cap a little over `p / n` spreads them, and
    /// leaves each room to take over a dead relay's.
    ///
    /// ```
    /// use idem_outbox::RelayOptions;
    ///
    /// let options = RelayOptions::default().with_max_partitions(4)?;
    /// assert_eq!(options.max_partitions(), 4);
    /// assert!(RelayOptions::default().with_max_partitions(0).is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside it.
    pub fn with_max_partitions(mut self, partitions: u32) -> Result<Self, InvalidInput> {
        self.max_partitions = idem_core::store::validate_partitions(partitions)?;
        Ok(self)
    }

    /// Failed publishes before a message is parked (at least 1), and the
    /// back-off between them: `first`, doubling, at most `max`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for zero attempts or `first` over `max`.
    pub fn with_retries(
        mut self,
        max_attempts: u32,
        first: Duration,
        max: Duration,
    ) -> Result<Self, InvalidInput> {
        if max_attempts == 0 || first > max {
            return Err(InvalidInput::OutOfRange {
                field: "relay retries",
                reason: "at least one attempt, and a first back-off no longer than the last",
            });
        }
        self.max_attempts = max_attempts;
        self.first_retry = first;
        self.max_retry = max;
        Ok(self)
    }

    /// How often the relay looks when nothing woke it (the fallback to a
    /// wake-up on commit; more than zero).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for zero.
    pub fn with_poll_interval(mut self, every: Duration) -> Result<Self, InvalidInput> {
        if every.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "poll interval",
                reason: "must be more than zero",
            });
        }
        self.poll_interval = every;
        Ok(self)
    }

    /// How long sent (and dropped) messages are kept, and how often an idle
    /// relay deletes a batch of the older ones (more than zero).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a zero interval.
    pub fn with_retention(
        mut self,
        keep: Duration,
        purge_every: Duration,
    ) -> Result<Self, InvalidInput> {
        if purge_every.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "purge interval",
                reason: "must be more than zero",
            });
        }
        self.retention = keep;
        self.purge_every = purge_every;
        Ok(self)
    }

    /// How long a relay holds a partition.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Batches of a partition a drain keeps in flight at once.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The most partitions a relay holds.
    pub fn max_partitions(&self) -> u32 {
        self.max_partitions
    }

    /// The back-off after the `attempts`-th failure.
    fn retry_after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(30);
        self.first_retry
            .saturating_mul(1 << doublings)
            .min(self.max_retry)
    }

    /// The failure of `message` with `error`, as the store counts it.
    fn failure(&self, message: &OutboxMessage, error: &str) -> PublishFailure {
        let attempts = message.parts().attempts;
        PublishFailure::new(message.id(), attempts, error)
            .retry_after(self.retry_after(attempts.saturating_add(1)))
            .max_attempts(self.max_attempts)
    }

    /// Whether `failure` parks its message.
    fn parks(&self, failure: &PublishFailure) -> bool {
        failure.attempts.saturating_add(1) >= self.max_attempts
    }
}

/// What a relay did, over the partitions it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayPass {
    /// Partitions held during the pass.
    pub partitions: usize,
    /// Messages read from the partitions' logs and retry lanes.
    pub read: usize,
    /// Reads that found something.
    pub batches: usize,
    /// Confirmed by the broker and settled (the cursor moved past them, or
    /// a lane message marked sent).
    pub published: u64,
    /// Of those, recognised by the broker as duplicates.
    pub duplicates: usize,
    /// Failed, to be retried from the retry lane after their back-off.
    pub failed: usize,
    /// Failed for the last time: parked, with their aggregate.
    pub parked: usize,
    /// Not published because an earlier message of their aggregate waits
    /// in the retry lane: moved there behind it.
    pub held: usize,
    /// Confirmed, but not settled because the partition was no longer this
    /// relay's (its lease lapsed): the next holder publishes them again,
    /// and the message id lets the broker or the consumer drop the copy.
    pub lost: u64,
}

impl RelayPass {
    fn absorb(&mut self, other: &Self) {
        self.partitions += other.partitions;
        self.read += other.read;
        self.batches += other.batches;
        self.published += other.published;
        self.duplicates += other.duplicates;
        self.failed += other.failed;
        self.parked += other.parked;
        self.held += other.held;
        self.lost += other.lost;
    }

    #[cfg(feature = "metrics")]
    fn count(&self) {
        metrics::counter!(crate::PUBLISHED).increment(self.published);
        metrics::counter!(crate::FAILED).increment((self.failed + self.parked) as u64);
        metrics::counter!(crate::PARKED).increment(self.parked as u64);
    }

    #[cfg(not(feature = "metrics"))]
    fn count(&self) {}
}

/// Why a relay pass stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The outbox store failed; the next pass tries again (a message
    /// published but not settled is published again, with its id).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A store's or publisher's future, borrowing the relay.
type Step<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The output of the future in `slot`; never, while there is none.
async fn settle<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// What the broker answered for one batch, and what it leads to.
#[derive(Debug, Default)]
struct Answered {
    settle: Advance,
    pass: RelayPass,
}

impl Answered {
    fn absorb(&mut self, more: Self) {
        if more.settle.to.is_some() {
            self.settle.to = more.settle.to;
        }
        self.settle.sent.extend(more.settle.sent);
        self.settle.failed.extend(more.settle.failed);
        self.settle.held.extend(more.settle.held);
        self.pass.absorb(&more.pass);
    }
}

/// How one partition's drain ended.
struct Drained {
    pass: RelayPass,
    /// The lease as it stands, or `None` once it was lost.
    lease: Option<PartitionLease>,
    error: Option<StoreError>,
}

/// Publishes what the outbox holds, in order per aggregate, through a
/// [`Publisher`]. Each relay holds partitions of the outbox under leases
/// (as many as are free, up to
/// [`max_partitions`](RelayOptions::with_max_partitions)), reads each
/// through its cursor (one read per batch), publishes, and moves the
/// cursor once the broker confirmed the batch (one write per batch); any
/// number of relays share an outbox's partitions, and take over a dead
/// relay's once its leases lapse. A relay whose lease lapsed moves no
/// cursor. No database transaction is held while it publishes.
///
/// Within a batch, never two messages of one aggregate reach the broker at
/// once: the batch goes out in waves (each aggregate's first message, then
/// its second...), so a failure stops its aggregate there. A failed message
/// leaves the log for the partition's retry lane, where it is retried with
/// back-off and then parked with its last error; the later messages of its
/// aggregate follow it there, in order, while every other aggregate flows.
///
/// A relay is a cheap handle: clones share its partitions.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::store::{NewMessage, OutboxMessage, OutboxStore};
/// use idem_memory::MemoryOutbox;
/// use idem_outbox::{async_trait, PublishError, Published, Publisher, Relay, RelayOptions};
///
/// struct Accepts;
///
/// #[async_trait]
/// impl Publisher for Accepts {
///     async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
///         batch.iter().map(|_| Ok(Published::stored())).collect()
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let outbox = Arc::new(MemoryOutbox::new());
/// outbox.enqueue(&NewMessage::new("order-42", "order.placed", b"{}".to_vec())?).await?;
/// let relay = Relay::new(outbox.clone(), Arc::new(Accepts), RelayOptions::default());
/// let pass = relay.relay_once().await?;
/// assert_eq!(pass.published, 1);
/// assert_eq!(outbox.stats().await?.pending, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Relay<S: ?Sized = dyn OutboxStore, P: ?Sized = dyn Publisher> {
    store: Arc<S>,
    publisher: Arc<P>,
    options: RelayOptions,
    wake: Arc<Notify>,
    owner: OwnerToken,
    held: Arc<Mutex<BTreeMap<u32, Held>>>,
}

/// A partition the relay holds: its lease, and when it last renewed it.
#[derive(Debug, Clone, Copy)]
struct Held {
    lease: PartitionLease,
    renewed: tokio::time::Instant,
}

impl<S: ?Sized, P: ?Sized> Clone for Relay<S, P> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            publisher: Arc::clone(&self.publisher),
            options: self.options,
            wake: Arc::clone(&self.wake),
            owner: self.owner,
            held: Arc::clone(&self.held),
        }
    }
}

impl<S: OutboxStore + ?Sized, P: Publisher + ?Sized + 'static> Relay<S, P> {
    /// A relay over `store` publishing through `publisher`, holding no
    /// partition yet.
    pub fn new(store: Arc<S>, publisher: Arc<P>, options: RelayOptions) -> Self {
        Self {
            store,
            publisher,
            options,
            wake: Arc::new(Notify::new()),
            owner: OwnerToken::generate(),
            held: Arc::default(),
        }
    }

    /// What wakes the relay before its poll interval: notify it when a
    /// message commits (a Postgres `LISTEN`, a local enqueue).
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// The same relay woken by `waker`: relays of one process can share one
    /// (and one listener's connection); each notification wakes one of them,
    /// the others keep to their poll interval.
    #[must_use]
    pub fn with_waker(mut self, waker: Arc<Notify>) -> Self {
        self.wake = waker;
        self
    }

    /// The options.
    pub fn options(&self) -> RelayOptions {
        self.options
    }

    /// The token the relay holds its partitions under.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The partitions the relay holds, as far as it knows (a lease it has
    /// not renewed for its length may have lapsed).
    pub fn partitions(&self) -> Vec<u32> {
        self.locked().keys().copied().collect()
    }

    fn locked(&self) -> MutexGuard<'_, BTreeMap<u32, Held>> {
        // A panic elsewhere cannot leave a lease half-written.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One pass: takes what partitions are free (up to the cap), then for
    /// each partition it holds, publishes what of its retry lane is due and
    /// one batch of its log (one read), and settles both (one write).
    ///
    /// # Errors
    ///
    /// [`RelayError::Store`] when the store fails.
    pub async fn relay_once(&self) -> Result<RelayPass, RelayError> {
        self.traced(true).await
    }

    /// Passes until nothing is due: takes what partitions are free, then
    /// drains each partition it holds (all at once, each in a task of its
    /// own): its retry lane's due messages, then its log, batch after
    /// batch, up to [`in_flight`](RelayOptions::with_in_flight) batches at
    /// once, until a read finds nothing more. Returns what they did
    /// together.
    ///
    /// With more than one batch in flight, the next batch is read while
    /// the broker confirms the last, and the cursor moves past earlier
    /// ones beside both; the broker sees one batch of a partition at a
    /// time, in log order, and a batch's settlement (its cursor move, and
    /// where its failed and held messages go) is one write, made only once
    /// the broker confirmed the batch and every one before it. Once the
    /// window is full, the read that waits for room goes with the
    /// settlement that makes it, in one round trip
    /// ([`OutboxStore::advance_and_read`]): a batch costs the store one
    /// statement.
    ///
    /// When the store fails, nothing more is read from that partition;
    /// what was read is still published and settled, and the first error
    /// is returned.
    ///
    /// Each pass ([`relay_once`](Self::relay_once) too) ends by renewing
    /// the partitions it holds that nothing renewed for a third of the
    /// lease (nothing to read), so a loop of passes, [`run`](Self::run)'s
    /// or your own, keeps its partitions while idle.
    ///
    /// # Cancellation
    ///
    /// Dropped mid-way (a relay that crashes or is cut off), its partitions
    /// stay leased until their leases lapse (or another call of the same
    /// relay goes on with them); then any relay takes them over from their
    /// cursors, in order: nothing is lost or published out of order. A
    /// message the broker confirmed before the drop may be published again
    /// (the same message id: JetStream's duplicate window keeps one copy,
    /// a consumer's inbox drops the other). A settlement that was sent
    /// lands or not, whole, fenced by the lease.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::store::{NewMessage, OutboxMessage, OutboxStore};
    /// use idem_memory::MemoryOutbox;
    /// use idem_outbox::{async_trait, PublishError, Published, Publisher, Relay, RelayOptions};
    ///
    /// struct Accepts;
    ///
    /// #[async_trait]
    /// impl Publisher for Accepts {
    ///     async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
    ///         batch.iter().map(|_| Ok(Published::stored())).collect()
    ///     }
    /// }
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// let outbox = Arc::new(MemoryOutbox::new());
    /// for n in 0..5 {
    ///     outbox.enqueue(&NewMessage::new("order-42", "order.line", vec![n])?).await?;
    /// }
    /// let options = RelayOptions::default().with_batch(2)?.with_in_flight(4)?;
    /// let relay = Relay::new(outbox.clone(), Arc::new(Accepts), options);
    /// let drained = relay.drain().await?;
    /// assert_eq!((drained.published, drained.batches), (5, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`RelayError::Store`] when the store fails.
    pub async fn drain(&self) -> Result<RelayPass, RelayError> {
        self.traced(false).await
    }

    /// [`passes`](Self::passes) in the relay's span.
    async fn traced(&self, once: bool) -> Result<RelayPass, RelayError> {
        let span = tracing::debug_span!(
            "idem.outbox.relay",
            store = self.store.capabilities().store,
            read = tracing::field::Empty,
            published = tracing::field::Empty,
            failed = tracing::field::Empty,
        );
        let pass = self.passes(once).instrument(span.clone()).await;
        // Whatever the pass came to, a partition no batch renewed (nothing
        // to read) keeps its lease: a loop of passes keeps what it holds.
        self.renew_idle().await;
        let pass = pass?;
        span.record("read", pass.read);
        span.record("published", pass.published);
        span.record("failed", pass.failed);
        Ok(pass)
    }

    /// Takes free partitions up to the cap.
    async fn acquire(&self) -> Result<(), StoreError> {
        loop {
            if self.locked().len() >= self.options.max_partitions as usize {
                return Ok(());
            }
            let Some(lease) = self.store.acquire(self.owner, self.options.lease).await? else {
                return Ok(());
            };
            let held = Held {
                lease,
                renewed: tokio::time::Instant::now(),
            };
            self.locked().insert(lease.partition(), held);
        }
    }

    /// Drains every partition held, each in a task of its own.
    async fn passes(&self, once: bool) -> Result<RelayPass, RelayError> {
        let mut error = self.acquire().await.err();
        let held: Vec<Held> = self.locked().values().copied().collect();
        let mut total = RelayPass {
            partitions: held.len(),
            ..RelayPass::default()
        };
        let mut drains = JoinSet::new();
        for held in held {
            let relay = self.clone();
            drains.spawn(async move { relay.drain_partition(held.lease, once).await });
        }
        while let Some(joined) = drains.join_next().await {
            let Ok(drained) = joined else {
                // A panicking publisher: its partition stays leased, and
                // lapses if nothing renews it.
                continue;
            };
            total.absorb(&drained.pass);
            drained.pass.count();
            if let Some(failed) = drained.error {
                error.get_or_insert(failed);
            }
            self.keep(drained.lease);
        }
        match error {
            Some(error) => Err(error.into()),
            None => Ok(total),
        }
    }

    /// Records a partition's lease after its drain: renewed (now), or as
    /// it was (a drain that wrote nothing renewed nothing), or lost.
    fn keep(&self, lease: Option<PartitionLease>) {
        let Some(lease) = lease else {
            return;
        };
        let mut held = self.locked();
        let renewed = match held.get(&lease.partition()) {
            Some(kept) if kept.lease == lease => kept.renewed,
            _ => tokio::time::Instant::now(),
        };
        held.insert(lease.partition(), Held { lease, renewed });
    }

    /// One partition: its retry lane's due messages, then its log.
    async fn drain_partition(&self, lease: PartitionLease, once: bool) -> Drained {
        let mut drained = Drained {
            pass: RelayPass::default(),
            lease: Some(lease),
            error: None,
        };
        let partition = lease.partition();
        let lease = match self.drain_lane(lease, once, &mut drained.pass).await {
            Ok(lease) => lease,
            Err(error) => return self.stopped(drained, partition, error),
        };
        drained.lease = Some(lease);
        let (lease, error) = self.drain_log(lease, once, &mut drained.pass).await;
        drained.lease = lease;
        drained.error = error;
        if drained.lease.is_none() {
            self.locked().remove(&partition);
        }
        drained
    }

    /// A drain that stopped on `error`: a lost lease forgets the
    /// partition.
    fn stopped(&self, mut drained: Drained, partition: u32, error: StoreError) -> Drained {
        if matches!(error, StoreError::LostLease) {
            self.locked().remove(&partition);
            drained.lease = None;
        } else {
            drained.error = Some(error);
        }
        drained
    }

    /// Publishes the retry lane's due messages (each aggregate's first
    /// waiting one), settling each round in one write, until none is due
    /// (once, for [`relay_once`](Self::relay_once)).
    async fn drain_lane(
        &self,
        mut lease: PartitionLease,
        once: bool,
        pass: &mut RelayPass,
    ) -> Result<PartitionLease, StoreError> {
        loop {
            let due = self
                .store
                .due(lease.partition(), self.options.batch)
                .await?;
            if due.is_empty() {
                return Ok(lease);
            }
            pass.read += due.len();
            pass.batches += 1;
            // Each aggregate's first only: one wave.
            let mut answered = Answered::default();
            self.publish_wave(due, &mut answered, &mut BTreeSet::new(), true)
                .await;
            let sent_any = !answered.settle.sent.is_empty();
            match self.store.advance(&lease, &answered.settle).await {
                Ok(renewed) => {
                    lease = renewed;
                    pass.absorb(&answered.pass);
                }
                Err(StoreError::LostLease) => {
                    pass.lost += answered.pass.published;
                    return Err(StoreError::LostLease);
                }
                Err(error) => return Err(error),
            }
            if once || !sent_any {
                return Ok(lease);
            }
        }
    }

    /// Reads the log through the cursor and publishes it, batch after
    /// batch with up to the in-flight window at once, each batch settled
    /// in one write once it and those before it are confirmed. Ends with
    /// the lease as it stands (`None` once lost) and the first store error.
    async fn drain_log(
        &self,
        lease: PartitionLease,
        once: bool,
        pass: &mut RelayPass,
    ) -> (Option<PartitionLease>, Option<StoreError>) {
        let partition = lease.partition();
        let mut lease = Some(lease);
        let mut error: Option<StoreError> = None;
        let mut after = lease.map_or(LogPosition::START, |l| l.cursor());
        let mut more = true;
        // Batches read and not yet settled.
        let mut in_flight = 0usize;
        let mut reading: Option<Step<'_, Result<LogBatch, StoreError>>> = None;
        let mut waiting: VecDeque<LogBatch> = VecDeque::new();
        let mut publishing: Option<Step<'_, PublishedBatch>> = None;
        let mut answered: Option<Answered> = None;
        let mut settling: Option<Step<'_, Settled>> = None;
        // Whether the settlement in flight carries the next read.
        let mut read_settling = false;
        // Aggregates whose messages wait in the lane, or failed in this
        // drain: their later messages are held, never published.
        let mut behind: BTreeSet<String> = BTreeSet::new();
        // What a read answered: a batch to publish, or the end of what can
        // be read now. A macro, as it moves the loop's own state.
        macro_rules! took {
            ($read:expr) => {
                match $read {
                    Ok(batch) if batch.messages.is_empty() => {
                        in_flight -= 1;
                        more = false;
                    }
                    Ok(batch) => {
                        after = batch.end().unwrap_or(after);
                        pass.read += batch.messages.len();
                        pass.batches += 1;
                        waiting.push_back(batch);
                    }
                    Err(failed) => {
                        in_flight -= 1;
                        more = false;
                        error.get_or_insert(failed);
                    }
                }
            };
        }
        loop {
            if more && reading.is_none() && !read_settling && in_flight < self.options.in_flight {
                reading = Some(self.store.read(partition, after, self.options.batch));
                in_flight += 1;
                more = !once;
            }
            if publishing.is_none()
                && let Some(batch) = waiting.pop_front()
            {
                behind.extend(batch.blocked.iter().cloned());
                let held = std::mem::take(&mut behind);
                publishing = Some(Box::pin(self.publish_log(batch, held)));
            }
            if settling.is_none()
                && let (Some(ready), Some(current)) = (answered.take(), lease)
            {
                // A read still wanted here waits for the window, which this
                // settlement frees: it goes with it, one round trip for both.
                read_settling = more && reading.is_none();
                let next = read_settling.then_some(after);
                if read_settling {
                    in_flight += 1;
                }
                let batch = self.options.batch;
                settling = Some(Box::pin(async move {
                    let Some(after) = next else {
                        let settled = self.store.advance(&current, &ready.settle).await;
                        return (ready, settled, None);
                    };
                    match self
                        .store
                        .advance_and_read(&current, &ready.settle, after, batch)
                        .await
                    {
                        Ok(answer) => (ready, Ok(answer.lease), Some(answer.batch)),
                        Err(failed) => (ready, Err(failed), None),
                    }
                }));
            }
            if reading.is_none() && publishing.is_none() && settling.is_none() {
                break;
            }
            tokio::select! {
                read = settle(&mut reading) => {
                    reading = None;
                    took!(read);
                }
                published = settle(&mut publishing) => {
                    publishing = None;
                    behind = published.behind;
                    match answered.as_mut() {
                        Some(earlier) => earlier.absorb(published.answered),
                        None => answered = Some(published.answered),
                    }
                }
                settled = settle(&mut settling) => {
                    settling = None;
                    let (done, result, read) = settled;
                    in_flight -= done.pass.batches.max(1);
                    // The read that went with it is taken at once, so the
                    // next settlement can carry the next read.
                    if std::mem::take(&mut read_settling) {
                        match read {
                            Some(read) => took!(read),
                            None => in_flight -= 1,
                        }
                    }
                    match result {
                        Ok(renewed) => {
                            lease = Some(renewed);
                            let mut counted = done.pass;
                            counted.batches = 0;
                            pass.absorb(&counted);
                        }
                        Err(StoreError::LostLease) => {
                            pass.lost += done.pass.published;
                            lease = None;
                            more = false;
                        }
                        Err(failed) => {
                            more = false;
                            error.get_or_insert(failed);
                        }
                    }
                }
            }
            // Without the lease nothing can be settled: what is read,
            // published or being published is left to the next holder,
            // which reads it again from the cursor.
            if lease.is_none() {
                if let Some(dropped) = answered.take() {
                    pass.lost += dropped.pass.published;
                }
                break;
            }
        }
        (lease, error)
    }

    /// Publishes one log batch in waves, holding the messages of
    /// aggregates in `behind` (and of those that fail on the way); the
    /// batch's settlement, and which aggregates stay behind.
    async fn publish_log(&self, batch: LogBatch, mut behind: BTreeSet<String>) -> PublishedBatch {
        let mut answered = Answered::default();
        answered.settle.to = batch.end();
        answered.pass.batches = 1;
        let mut waves: Vec<Vec<OutboxMessage>> = Vec::new();
        let mut depth: HashMap<String, usize> = HashMap::new();
        for message in batch.messages {
            let aggregate = message.message().aggregate();
            let wave = depth.entry(aggregate.to_string()).or_insert(0);
            if waves.len() <= *wave {
                waves.push(Vec::new());
            }
            if let Some(messages) = waves.get_mut(*wave) {
                messages.push(message);
            }
            *wave += 1;
        }
        for wave in waves {
            self.publish_wave(wave, &mut answered, &mut behind, false)
                .await;
        }
        PublishedBatch { answered, behind }
    }

    /// Publishes `wave` (never two messages of one aggregate) but what is
    /// `behind`, which it holds; records what the broker answered, and
    /// puts each aggregate that failed behind. Lane messages confirmed are
    /// marked sent; log messages confirmed need only the cursor.
    async fn publish_wave(
        &self,
        wave: Vec<OutboxMessage>,
        answered: &mut Answered,
        behind: &mut BTreeSet<String>,
        lane: bool,
    ) {
        let (held, wave): (Vec<OutboxMessage>, Vec<OutboxMessage>) = wave
            .into_iter()
            .partition(|m| behind.contains(m.message().aggregate()));
        for message in held {
            answered.settle.held.push(message.id());
            answered.pass.held += 1;
        }
        if wave.is_empty() {
            return;
        }
        #[cfg(feature = "metrics")]
        let started = Instant::now();
        let results = self.publisher.publish(&wave).await;
        #[cfg(feature = "metrics")]
        metrics::histogram!(crate::PUBLISH_DURATION).record(started.elapsed().as_secs_f64());
        for (i, message) in wave.into_iter().enumerate() {
            let error = match results.get(i) {
                Some(Ok(published)) => {
                    answered.pass.published += 1;
                    answered.pass.duplicates += usize::from(published.duplicate);
                    if lane {
                        answered.settle.sent.push(message.id());
                    }
                    continue;
                }
                Some(Err(error)) => error.to_string(),
                None => "the publisher gave no answer".to_string(),
            };
            let failure = self.options.failure(&message, &error);
            if self.options.parks(&failure) {
                answered.pass.parked += 1;
                tracing::warn!(
                    message_id = %message.id(),
                    aggregate_hash = %idem_core::redacted(message.message().aggregate()),
                    %error,
                    "an outbox message failed its last attempt; it and its aggregate are parked"
                );
            } else {
                answered.pass.failed += 1;
            }
            behind.insert(message.message().aggregate().to_string());
            answered.settle.failed.push(failure);
        }
    }

    /// Relays until `shutdown` completes: a [`drain`](Self::drain), then a
    /// wait for a wake-up or the poll interval; when idle, a batch of sent messages past their retention
    /// is purged at most every purge interval. A failing store is retried
    /// at the poll interval, with a warning. Gauges (with the `metrics`
    /// feature) are refreshed after each drain. At the shutdown the relay
    /// releases its partitions, so another relay takes them at once.
    ///
    /// A wake-up whose drain reads nothing is looked at again after 10 ms,
    /// then at doubling intervals up to the poll interval: a store may hold
    /// a committed message back while an older transaction still runs (the
    /// Postgres outbox does), and the wake-up was its only notice.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut next_purge = tokio::time::Instant::now();
        // Set while a wake-up found nothing: the next look's delay.
        let mut chasing: Option<Duration> = None;
        let mut woken = false;
        loop {
            let read = match self.drain().await {
                Ok(pass) => pass.read,
                Err(error) => {
                    tracing::warn!(%error, "the outbox relay could not make a pass");
                    0
                }
            };
            chasing = if read > 0 || !woken {
                None
            } else {
                let next = chasing.map_or(FIRST_RECHECK, |delay| delay * 2);
                (next < self.options.poll_interval).then_some(next)
            };
            self.refresh_gauges().await;
            if tokio::time::Instant::now() >= next_purge {
                next_purge = tokio::time::Instant::now() + self.options.purge_every;
                self.purge().await;
            }
            tokio::select! {
                () = &mut shutdown => {
                    self.release().await;
                    return;
                }
                () = self.wake.notified() => woken = true,
                () = tokio::time::sleep(chasing.unwrap_or(self.options.poll_interval)) => {
                    woken = chasing.is_some();
                }
            }
        }
    }

    /// Renews each partition not renewed for a third of its lease.
    async fn renew_idle(&self) {
        let due = tokio::time::Instant::now()
            .checked_sub(self.options.lease / 3)
            .unwrap_or_else(tokio::time::Instant::now);
        let stale: Vec<Held> = self
            .locked()
            .values()
            .filter(|held| held.renewed <= due)
            .copied()
            .collect();
        for held in stale {
            match self.store.advance(&held.lease, &Advance::default()).await {
                Ok(renewed) => self.keep(Some(renewed)),
                Err(StoreError::LostLease) => {
                    self.locked().remove(&held.lease.partition());
                }
                Err(error) => {
                    tracing::warn!(%error, "the outbox relay could not renew a partition");
                }
            }
        }
    }

    /// Gives every partition back to the store, for another relay to take
    /// at once (each lapses anyway if this fails).
    pub async fn release(&self) {
        let held: Vec<Held> = std::mem::take(&mut *self.locked()).into_values().collect();
        for held in held {
            if let Err(error) = self.store.release(&held.lease).await {
                tracing::warn!(%error, "the outbox relay could not release a partition");
            }
        }
    }

    /// Deletes one batch of sent messages past their retention.
    async fn purge(&self) {
        let purged = self
            .store
            .purge_sent(self.options.retention, self.options.batch)
            .await;
        if let Err(error) = purged {
            tracing::warn!(%error, "the outbox relay could not purge sent messages");
        }
    }

    #[cfg(feature = "metrics")]
    async fn refresh_gauges(&self) {
        if let Ok(stats) = self.store.stats().await {
            metrics::gauge!(crate::PENDING).set(stats.pending as f64);
            metrics::gauge!(crate::OLDEST_PENDING).set(
                stats
                    .oldest_pending_age
                    .map_or(0.0, |age| age.as_secs_f64()),
            );
            for partition in &stats.partitions {
                metrics::gauge!(crate::PARTITION_LAG, "partition" => partition.partition.to_string())
                    .set(partition.oldest_pending_age.map_or(0.0, |age| age.as_secs_f64()));
            }
        }
    }

    #[cfg(not(feature = "metrics"))]
    async fn refresh_gauges(&self) {}
}

/// A settlement as it ended: what it settled, the lease it renewed, and
/// the read that went with it, if one did.
type Settled = (
    Answered,
    Result<PartitionLease, StoreError>,
    Option<Result<LogBatch, StoreError>>,
);

/// A log batch published: its settlement, and the aggregates that stay
/// behind for the next batch.
struct PublishedBatch {
    answered: Answered,
    behind: BTreeSet<String>,
}
