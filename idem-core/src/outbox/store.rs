//! The outbox's store: a log per partition that a relay reads through a
//! cursor, a retry lane beside it, and what they take and answer.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::outbox::message::{LogPosition, MessageId, MessageState, NewMessage, OutboxMessage};
use crate::plumbing::capabilities::Capabilities;
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::{Operation, StoreError};
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::layer::Layered;
use async_trait::async_trait;

/// A relay's hold on one partition, minted by
/// [`OutboxStore::acquire`] and renewed by each
/// [`advance`](OutboxStore::advance): the partition, its holder, for how
/// long, and the cursor as the holder last moved it.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{LogPosition, OwnerToken, PartitionLease, Timestamp};
///
/// let owner = OwnerToken::generate();
/// let until = Timestamp::from_unix_millis(30_000);
/// let lease = PartitionLease::issued(3, owner, Duration::from_secs(30), until, LogPosition::START);
/// assert_eq!((lease.partition(), lease.owner(), lease.until()), (3, owner, until));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionLease {
    partition: u32,
    owner: OwnerToken,
    lease: Duration,
    until: Timestamp,
    cursor: LogPosition,
}

impl PartitionLease {
    /// The lease a store issued: `partition` held by `owner` for `lease`,
    /// until `until` by the store's clock, its cursor at `cursor`.
    pub fn issued(
        partition: u32,
        owner: OwnerToken,
        lease: Duration,
        until: Timestamp,
        cursor: LogPosition,
    ) -> Self {
        Self {
            partition,
            owner,
            lease,
            until,
            cursor,
        }
    }

    /// The partition held.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// Who holds it.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// For how long each acquire or advance holds it.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Until when, by the store's clock.
    pub fn until(&self) -> Timestamp {
        self.until
    }

    /// The cursor: every message of the log at or before it was sent (or
    /// taken out of the log into the retry lane).
    pub fn cursor(&self) -> LogPosition {
        self.cursor
    }

    /// The same lease renewed until `until`, its cursor at `cursor`.
    #[must_use]
    pub fn renewed(self, until: Timestamp, cursor: LogPosition) -> Self {
        Self {
            until,
            cursor,
            ..self
        }
    }
}

/// What [`OutboxStore::read`] found in a partition's log.
///
/// ```
/// use idem_core::store::LogBatch;
///
/// let empty = LogBatch::default();
/// assert!(empty.messages.is_empty() && empty.end().is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogBatch {
    /// The messages, in log order.
    pub messages: Vec<OutboxMessage>,
    /// Of their aggregates, those with a message in the partition's retry
    /// lane (waiting or parked): their messages here must not reach the
    /// broker before it, so a relay moves them to the lane
    /// ([`Advance::held`]). A message sent or dropped from the lane no
    /// longer blocks: once an operator drops its aggregate's parked
    /// message (and nothing else of it waits there), the aggregate is not
    /// blocked and the rest of it flows again.
    pub blocked: BTreeSet<String>,
}

impl LogBatch {
    /// A batch of `messages` (in log order), with the `blocked` aggregates.
    pub fn new(messages: Vec<OutboxMessage>, blocked: BTreeSet<String>) -> Self {
        Self { messages, blocked }
    }

    /// A batch of `messages` (in log order) whose blocked aggregates are
    /// those of its messages that `in_lane` says have a message in the
    /// partition's retry lane.
    ///
    /// ```
    /// use idem_core::store::{LogBatch, LogPosition, MessageParts, MessageState, NewMessage, OutboxMessage, Timestamp};
    ///
    /// let at = Timestamp::from_unix_millis(0);
    /// let parts = MessageParts {
    ///     sequence: 2, partition: 0, position: LogPosition::new(7, 0), state: MessageState::Pending,
    ///     attempts: 0, last_error: None, enqueued_at: at, available_at: at, sent_at: None,
    /// };
    /// let paid = OutboxMessage::new(NewMessage::new("order-1", "order.paid", b"{}".to_vec())?, parts);
    /// let batch = LogBatch::among(vec![paid], |aggregate| aggregate == "order-1");
    /// assert!(batch.blocked.contains("order-1"));
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn among(messages: Vec<OutboxMessage>, in_lane: impl Fn(&str) -> bool) -> Self {
        let blocked = messages
            .iter()
            .map(|m| m.message().aggregate())
            .filter(|aggregate| in_lane(aggregate))
            .map(str::to_string)
            .collect();
        Self::new(messages, blocked)
    }

    /// The position of its last message: where a cursor moves once every
    /// message of the batch is settled.
    pub fn end(&self) -> Option<LogPosition> {
        self.messages.last().map(|m| m.parts().position)
    }
}

/// A failed publish, as [`Advance::failed`] records it: the message, the
/// attempts it had when the relay read it, the broker's error, and what the
/// failure leads to.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{MessageId, PublishFailure};
///
/// let failure = PublishFailure::new(MessageId::generate(), 0, "nacked")
///     .retry_after(Duration::from_secs(2))
///     .max_attempts(5);
/// assert_eq!(failure.max_attempts, 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishFailure {
    /// The message.
    pub id: MessageId,
    /// Its failed attempts when the relay read it: the failure counts only
    /// on that count, so a failure delivered twice counts once.
    pub attempts: u32,
    /// Why it failed, kept with the message.
    pub error: String,
    /// How long until the message is due again.
    pub retry_after: Duration,
    /// The failures at which the message is parked instead (at least 1).
    pub max_attempts: u32,
}

impl PublishFailure {
    /// A failure of `id`, read with `attempts` failed attempts: due again
    /// at once, parked at its tenth failure.
    pub fn new(id: MessageId, attempts: u32, error: impl Into<String>) -> Self {
        Self {
            id,
            attempts,
            error: error.into(),
            retry_after: Duration::ZERO,
            max_attempts: 10,
        }
    }

    /// Due again only after `retry_after`.
    #[must_use]
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Parked at its `max_attempts`-th failure (0 counts as 1).
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }
}

/// What a relay settles in one [`OutboxStore::advance`]: where the cursor
/// moves, and what became of the messages it did not simply publish from
/// the log.
///
/// ```
/// use idem_core::store::{Advance, LogPosition, MessageId, PublishFailure};
///
/// let settled = Advance::to(LogPosition::new(7, 2))
///     .failed(PublishFailure::new(MessageId::generate(), 0, "nacked"))
///     .held(MessageId::generate());
/// assert_eq!(settled.to, Some(LogPosition::new(7, 2)));
/// assert!(Advance::default().is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Advance {
    /// Where the cursor moves: every message of the log up to it was
    /// published and confirmed, but those failed or held here.
    pub to: Option<LogPosition>,
    /// Messages of the retry lane the broker confirmed.
    pub sent: Vec<MessageId>,
    /// Failed publishes, of log or lane messages.
    pub failed: Vec<PublishFailure>,
    /// Log messages not published because an earlier message of their
    /// aggregate is in the lane: they move to the lane behind it.
    pub held: Vec<MessageId>,
}

impl Advance {
    /// The cursor moved to `to`.
    pub fn to(to: LogPosition) -> Self {
        Self {
            to: Some(to),
            ..Self::default()
        }
    }

    /// The same, with `id` (a lane message) confirmed.
    #[must_use]
    pub fn sent(mut self, id: MessageId) -> Self {
        self.sent.push(id);
        self
    }

    /// The same, with `failure` recorded.
    #[must_use]
    pub fn failed(mut self, failure: PublishFailure) -> Self {
        self.failed.push(failure);
        self
    }

    /// The same, with `id` (a log message) held behind its aggregate.
    #[must_use]
    pub fn held(mut self, id: MessageId) -> Self {
        self.held.push(id);
        self
    }

    /// Whether it settles nothing (an advance of it only renews the lease).
    pub fn is_empty(&self) -> bool {
        self.to.is_none() && self.sent.is_empty() && self.failed.is_empty() && self.held.is_empty()
    }
}

/// What [`OutboxStore::advance_and_read`] answers: the lease its advance
/// renewed, and what the read after it found. The read can fail on its own
/// once the advance landed; the renewed lease (its cursor moved) is kept
/// either way.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{AdvancedRead, LogBatch, LogPosition, OwnerToken, PartitionLease, Timestamp};
///
/// let until = Timestamp::from_unix_millis(30_000);
/// let lease = PartitionLease::issued(0, OwnerToken::generate(), Duration::from_secs(30), until, LogPosition::START);
/// let answered = AdvancedRead::new(lease, Ok(LogBatch::default()));
/// assert_eq!(answered.lease, lease);
/// assert!(answered.batch.is_ok_and(|batch| batch.messages.is_empty()));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct AdvancedRead {
    /// The lease, renewed by the advance.
    pub lease: PartitionLease,
    /// The read after the advance.
    pub batch: Result<LogBatch, StoreError>,
}

impl AdvancedRead {
    /// The advance renewed `lease`, and the read after it found `batch`.
    pub fn new(lease: PartitionLease, batch: Result<LogBatch, StoreError>) -> Self {
        Self { lease, batch }
    }
}

/// Where a listing of parked messages goes on: after this place in their
/// order (first enqueued, then id), the last message of the page before.
///
/// ```
/// use idem_core::store::{MessageId, PageAfter, Timestamp};
///
/// let after = PageAfter::new(Timestamp::from_unix_millis(1_000), MessageId::generate());
/// assert_eq!(after.enqueued_at, Timestamp::from_unix_millis(1_000));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageAfter {
    /// The enqueue of the last message listed.
    pub enqueued_at: Timestamp,
    /// Its id.
    pub id: MessageId,
}

impl PageAfter {
    /// After the message enqueued at `enqueued_at` with `id`.
    pub fn new(enqueued_at: Timestamp, id: MessageId) -> Self {
        Self { enqueued_at, id }
    }

    /// After `message`: the next page of a listing that ended with it.
    pub fn of(message: &OutboxMessage) -> Self {
        Self::new(message.parts().enqueued_at, message.id())
    }

    /// Whether `message` comes after this place.
    pub fn precedes(&self, message: &OutboxMessage) -> bool {
        (self.enqueued_at, self.id) < (message.parts().enqueued_at, message.id())
    }
}

/// One partition's backlog and holder, for gauges and operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PartitionStats {
    /// The partition.
    pub partition: u32,
    /// Messages not yet sent: in the log past the cursor, or waiting in the
    /// retry lane.
    pub pending: u64,
    /// Messages parked.
    pub parked: u64,
    /// How long the oldest pending message has waited, by the store's
    /// clock: the partition's lag.
    pub oldest_pending_age: Option<Duration>,
    /// The relay holding it, while one does.
    pub holder: Option<OwnerToken>,
    /// Until when it holds it.
    pub held_until: Option<Timestamp>,
    /// Its cursor.
    pub cursor: LogPosition,
}

impl PartitionStats {
    /// The stats of `partition`, idle and unheld.
    pub fn new(partition: u32) -> Self {
        Self {
            partition,
            ..Self::default()
        }
    }
}

/// The backlog, for gauges: totals and each partition's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages not yet sent (pending in a log, or waiting in a lane).
    pub pending: u64,
    /// Messages parked.
    pub parked: u64,
    /// How long the oldest pending message has waited, by the store's
    /// clock (sent and parked messages do not count).
    pub oldest_pending_age: Option<Duration>,
    /// Each partition's, by partition.
    pub partitions: Vec<PartitionStats>,
}

impl OutboxStats {
    /// The totals of `partitions`, and the partitions themselves.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::store::{OutboxStats, PartitionStats};
    ///
    /// let mut busy = PartitionStats::new(1);
    /// busy.pending = 3;
    /// busy.oldest_pending_age = Some(Duration::from_secs(2));
    /// let stats = OutboxStats::of_partitions(vec![PartitionStats::new(0), busy]);
    /// assert_eq!((stats.pending, stats.oldest_pending_age), (3, Some(Duration::from_secs(2))));
    /// ```
    pub fn of_partitions(mut partitions: Vec<PartitionStats>) -> Self {
        partitions.sort_by_key(|p| p.partition);
        Self {
            pending: partitions.iter().map(|p| p.pending).sum(),
            parked: partitions.iter().map(|p| p.parked).sum(),
            oldest_pending_age: partitions.iter().filter_map(|p| p.oldest_pending_age).max(),
            partitions,
        }
    }
}

/// The storage of a transactional outbox (`idem-outbox`): one log per
/// partition, read by one relay at a time through a cursor, and a retry
/// lane beside each log for what failed.
///
/// # Contract
///
/// Each sentence is a case of the public outbox suite in `idem-conformance`.
///
/// - **Enqueue.** [`enqueue`](Self::enqueue) stores a message pending with
///   the next sequence of its aggregate (1 for the first), in the
///   partition [`partition_of`](crate::store::partition_of) its aggregate
///   among the store's partitions, at the end of that partition's log; a
///   second enqueue of one id stores nothing more and returns the first. An
///   aggregate's sequence keeps counting after its messages were purged: it
///   never starts again at 1. Backends that share the caller's transaction
///   enqueue inside it, so a message exists exactly when the business change
///   committed, and sequences follow the commit order within an aggregate.
/// - **Log.** [`read`](Self::read) answers up to `limit` messages of a
///   partition's log after a position, in log order, each with its
///   position: an aggregate's in sequence order, and never one that
///   something still uncommitted could precede (a message that commits
///   late takes a position after every one read before it committed), so a
///   relay reading through a cursor skips nothing. Messages taken out of
///   the log (into the retry lane, or dropped) are not read. The batch
///   names the aggregates among its messages that have a message in the
///   partition's retry lane (blocked).
/// - **Partitions.** [`acquire`](Self::acquire) leases to `owner` the
///   lowest-numbered partition nobody holds (never held, released, or its
///   lease lapsed), for `lease` by the store's clock at the store's
///   precision (a lease under a second is not rounded to nothing), and
///   answers its cursor where its last holder left it; `None` while every
///   partition is held. A lease that lapsed counts as none, for another
///   owner and for its own alike. [`release`](Self::release) frees a
///   partition its owner holds at once, its cursor kept.
/// - **Advance.** [`advance`](Self::advance) is one write, taking effect
///   only while the lease's owner holds the partition (a lease that lapsed,
///   even with nobody acquiring the partition since, holds nothing:
///   [`StoreError::LostLease`], nothing written). It moves the cursor to
///   `to` (never back), takes each failed message out of the log (or keeps
///   it in the lane) with one more attempt, its error kept and due again
///   after its back-off, parked at its `max_attempts`-th failure; moves
///   the held log messages to the lane, due at once behind their
///   aggregate's first, attempts unchanged; marks the sent lane messages
///   sent at the store's time; and renews the lease for its length. A
///   failure counts only on the attempts it names, a hold only on a message
///   in the log, a send only on a waiting one: delivered twice, an advance
///   changes nothing more.
/// - **Advance and read.** [`advance_and_read`](Self::advance_and_read)
///   is an [`advance`](Self::advance) and then a [`read`](Self::read) of
///   the lease's partition, in one round trip where the store can: the
///   read sees the log as the advance left it (what it took out of the log
///   is not read, and its aggregates are blocked), and answers with the
///   renewed lease. Under a lease its owner no longer holds it writes and
///   reads nothing ([`StoreError::LostLease`]).
/// - **Lane.** [`due`](Self::due) answers, for each aggregate of a
///   partition with messages in its retry lane, its first (lowest
///   sequence) if it is waiting and due (`available_at` passed), the
///   oldest enqueued first, at most `limit`: a parked message holds its
///   aggregate's lane until an operator retries or drops it.
/// - **Operator.** [`parked`](Self::parked) lists parked messages, oldest
///   (first enqueued, then id) first, after a given one for the next page;
///   [`retry`](Self::retry) makes a parked message waiting again in its
///   place (its sequence kept, so it goes before the later messages of its
///   aggregate), its attempts reset, its last error kept, due at once;
///   [`drop_message`](Self::drop_message) drops a parked message, keeping
///   the reason as its `last_error` and the time of the drop as its
///   `sent_at`, so the rest of its aggregate flows again. A message that is
///   not parked is neither retried nor dropped: nothing changes. Each
///   answers whether it changed anything. [`message`](Self::message) reads
///   one message in any state (a log message past its partition's cursor
///   is pending, one at or before it sent), so a dropped message's reason
///   is read there.
/// - **Purge.** [`purge_sent`](Self::purge_sent) deletes up to `limit` sent
///   or dropped messages at least `older_than` old, never an unsent one: a
///   message sent from the log aged from its enqueue, one sent from the
///   lane or dropped from its `sent_at`.
/// - **Stats.** [`stats`](Self::stats) answers each partition's pending
///   messages (past the cursor, or waiting) and parked ones, the age of its
///   oldest pending message (neither sent nor parked messages count), its
///   holder and cursor, and the totals.
/// - **Time.** Leases, back-off and ages are the store's clock's, never
///   the caller's: a store whose clock is far from the process's passes
///   every case. A store author whose store reads a clock of its own (a
///   server's) should run the suite also against the store built on a
///   clock hours from the process's, both ahead of it and behind it, as
///   `idem-conformance` does for its own stores with its `SkewedClock`:
///   each direction hides what the other shows (with the store's clock
///   ahead, an age taken by the caller's clock floors at zero and passes;
///   behind, it is hours).
#[async_trait]
pub trait OutboxStore: Send + Sync + fmt::Debug + 'static {
    /// Stores `message` pending with its aggregate's next sequence, at the
    /// end of its partition's log.
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError>;

    /// Leases the lowest-numbered free partition to `owner` for `lease`;
    /// `None` while every one is held.
    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError>;

    /// Up to `limit` messages of `partition`'s log after `after`, in log
    /// order, and which of their aggregates are blocked.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for a partition the store does not
    /// have (at or past its count of partitions).
    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError>;

    /// Settles `advance` under `lease` in one write; the lease renewed.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] unless the lease's owner holds the
    /// partition.
    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError>;

    /// Settles `advance` under `lease`, then reads up to `limit` messages
    /// of its partition's log after `after`: a relay's settlement of one
    /// batch and its read of the next, one round trip where the store can
    /// (the default is [`advance`](Self::advance), then
    /// [`read`](Self::read)).
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] unless the lease's owner holds the
    /// partition; a read that fails once the advance landed fails in
    /// [`AdvancedRead::batch`].
    async fn advance_and_read(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
        after: LogPosition,
        limit: usize,
    ) -> Result<AdvancedRead, StoreError> {
        let renewed = self.advance(lease, advance).await?;
        let batch = self.read(renewed.partition(), after, limit).await;
        Ok(AdvancedRead::new(renewed, batch))
    }

    /// The first message of each aggregate in `partition`'s retry lane that
    /// is waiting and due, oldest first, at most `limit`.
    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError>;

    /// Frees the partition `lease` holds, if its owner holds it still;
    /// whether it did.
    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError>;

    /// Parked messages, oldest first, after `after` (the last of the
    /// previous page), at most `limit`.
    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError>;

    /// Makes a parked message waiting again, due at once; whether it was
    /// parked.
    async fn retry(&self, id: MessageId) -> Result<bool, StoreError>;

    /// Drops a parked message with `reason`; whether it did.
    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError>;

    /// The message `id` in whatever state it is, while it is stored.
    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError>;

    /// Deletes up to `limit` sent or dropped messages at least `older_than`
    /// old; how many.
    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError>;

    /// The backlog, by partition.
    async fn stats(&self) -> Result<OutboxStats, StoreError>;

    /// What the store is.
    fn capabilities(&self) -> Capabilities;
}

#[async_trait]
impl<S: OutboxStore> OutboxStore for Layered<S> {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        let enqueued = self.get_ref().enqueue(message);
        self.layer()
            .traced(Operation::Enqueue, None, None, enqueued)
            .await
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        let acquired = self.get_ref().acquire(owner, lease);
        self.layer()
            .traced(Operation::Acquire, None, None, acquired)
            .await
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        let read = self.get_ref().read(partition, after, limit);
        self.layer().traced(Operation::Read, None, None, read).await
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        let advanced = self.get_ref().advance(lease, advance);
        self.layer()
            .traced(Operation::Advance, None, None, advanced)
            .await
    }

    async fn advance_and_read(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
        after: LogPosition,
        limit: usize,
    ) -> Result<AdvancedRead, StoreError> {
        let advanced = self
            .get_ref()
            .advance_and_read(lease, advance, after, limit);
        self.layer()
            .traced(Operation::Advance, None, None, advanced)
            .await
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let due = self.get_ref().due(partition, limit);
        self.layer().traced(Operation::Read, None, None, due).await
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        let released = self.get_ref().release(lease);
        self.layer()
            .traced(Operation::Release, None, None, released)
            .await
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let parked = self.get_ref().parked(after, limit);
        self.layer()
            .traced(Operation::List, None, None, parked)
            .await
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let retried = self.get_ref().retry(id);
        self.layer()
            .traced(Operation::Retry, None, None, retried)
            .await
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let dropped = self.get_ref().drop_message(id, reason);
        self.layer()
            .traced(Operation::Drop, None, None, dropped)
            .await
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        let read = self.get_ref().message(id);
        self.layer().traced(Operation::Get, None, None, read).await
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let purged = self.get_ref().purge_sent(older_than, limit);
        self.layer()
            .traced(Operation::Purge, None, None, purged)
            .await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let stats = self.get_ref().stats();
        self.layer()
            .traced(Operation::Stats, None, None, stats)
            .await
    }

    fn capabilities(&self) -> Capabilities {
        self.get_ref().capabilities()
    }
}

/// Implements [`OutboxStore`] for a type by forwarding every operation to a
/// field that is an outbox store: `forward_outbox_store!(MyOutbox => field)`.
#[macro_export]
#[doc(hidden)]
macro_rules! __forward_outbox_store {
    ($ty:ty => $field:ident) => {
        #[$crate::async_trait]
        impl $crate::store::OutboxStore for $ty {
            async fn enqueue(
                &self,
                message: &$crate::store::NewMessage,
            ) -> ::core::result::Result<$crate::store::OutboxMessage, $crate::StoreError> {
                self.$field.enqueue(message).await
            }
            async fn acquire(
                &self,
                owner: $crate::store::OwnerToken,
                lease: ::core::time::Duration,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::store::PartitionLease>,
                $crate::StoreError,
            > {
                self.$field.acquire(owner, lease).await
            }
            async fn read(
                &self,
                partition: u32,
                after: $crate::store::LogPosition,
                limit: usize,
            ) -> ::core::result::Result<$crate::store::LogBatch, $crate::StoreError> {
                self.$field.read(partition, after, limit).await
            }
            async fn advance(
                &self,
                lease: &$crate::store::PartitionLease,
                advance: &$crate::store::Advance,
            ) -> ::core::result::Result<$crate::store::PartitionLease, $crate::StoreError> {
                self.$field.advance(lease, advance).await
            }
            async fn advance_and_read(
                &self,
                lease: &$crate::store::PartitionLease,
                advance: &$crate::store::Advance,
                after: $crate::store::LogPosition,
                limit: usize,
            ) -> ::core::result::Result<$crate::store::AdvancedRead, $crate::StoreError> {
                self.$field
                    .advance_and_read(lease, advance, after, limit)
                    .await
            }
            async fn due(
                &self,
                partition: u32,
                limit: usize,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.due(partition, limit).await
            }
            async fn release(
                &self,
                lease: &$crate::store::PartitionLease,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.release(lease).await
            }
            async fn parked(
                &self,
                after: ::core::option::Option<$crate::store::PageAfter>,
                limit: usize,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.parked(after, limit).await
            }
            async fn retry(
                &self,
                id: $crate::store::MessageId,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.retry(id).await
            }
            async fn drop_message(
                &self,
                id: $crate::store::MessageId,
                reason: &str,
            ) -> ::core::result::Result<bool, $crate::StoreError> {
                self.$field.drop_message(id, reason).await
            }
            async fn message(
                &self,
                id: $crate::store::MessageId,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.message(id).await
            }
            async fn purge_sent(
                &self,
                older_than: ::core::time::Duration,
                limit: usize,
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.purge_sent(older_than, limit).await
            }
            async fn stats(
                &self,
            ) -> ::core::result::Result<$crate::store::OutboxStats, $crate::StoreError> {
                self.$field.stats().await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
}

/// What a store does with a [`PublishFailure`]: the message it leaves.
impl OutboxMessage {
    /// The message after `failure` at the store's time `now`: one more
    /// attempt, the error kept, in the retry lane due again after the
    /// back-off, parked at the last attempt.
    #[must_use]
    pub fn failed(&self, failure: &PublishFailure, now: Timestamp) -> Self {
        self.edited(|parts| {
            parts.attempts = parts.attempts.saturating_add(1);
            parts.last_error = Some(failure.error.clone());
            parts.available_at = now + failure.retry_after;
            parts.state = if parts.attempts >= failure.max_attempts {
                MessageState::Parked
            } else {
                MessageState::Waiting
            };
        })
    }
}
