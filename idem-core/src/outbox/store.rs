//! The outbox's store: the operations a relay uses to publish messages in
//! order, once per aggregate at a time, and what they take and answer.

use crate::outbox::message::{MessageId, MessageState, NewMessage, OutboxMessage};
use crate::plumbing::capabilities::Capabilities;
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::{Operation, StoreError};
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::layer::Layered;
use async_trait::async_trait;
use std::fmt;
use std::time::Duration;

/// The age of the backlog, for gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting to be published.
    pub pending: u64,
    /// Messages parked.
    pub parked: u64,
    /// How long the oldest pending message has waited, by the store's
    /// clock (sent and parked messages do not count).
    pub oldest_pending_age: Option<Duration>,
}

impl OutboxStats {
    /// Stats from each figure.
    pub fn new(pending: u64, parked: u64, oldest_pending_age: Option<Duration>) -> Self {
        Self {
            pending,
            parked,
            oldest_pending_age,
        }
    }
}

/// What a relay asks of [`OutboxStore::claim`]: up to `limit` messages,
/// leased to `owner` for `lease`.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{BatchClaim, OwnerToken};
///
/// let batch = BatchClaim::new(OwnerToken::generate(), Duration::from_secs(30), 100);
/// assert_eq!(batch.limit, 100);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchClaim {
    /// Who leases the messages.
    pub owner: OwnerToken,
    /// For how long, by the store's clock (1 ms to 7 days: the store
    /// refuses others).
    pub lease: Duration,
    /// At most this many (1 to [`MAX_OUTBOX_BATCH`](crate::store::MAX_OUTBOX_BATCH): the store refuses
    /// others).
    pub limit: usize,
}

impl BatchClaim {
    /// Up to `limit` messages for `owner`, for `lease`.
    pub fn new(owner: OwnerToken, lease: Duration, limit: usize) -> Self {
        Self {
            owner,
            lease,
            limit,
        }
    }
}

/// A failed publish, as [`OutboxStore::mark_failed`] counts it: the message,
/// the owner whose lease it is under, the broker's error, and what the
/// failure leads to.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{MessageId, OwnerToken, PublishFailure};
///
/// let failure = PublishFailure::new(OwnerToken::generate(), MessageId::generate(), "nacked")
///     .retry_after(Duration::from_secs(2))
///     .max_attempts(5);
/// assert_eq!(failure.max_attempts, 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishFailure {
    /// Whose lease the message is under.
    pub owner: OwnerToken,
    /// The message.
    pub id: MessageId,
    /// Why it failed, kept with the message.
    pub error: String,
    /// How long until the message is available again.
    pub retry_after: Duration,
    /// The failures at which the message is parked instead (at least 1).
    pub max_attempts: u32,
}

impl PublishFailure {
    /// A failure of `id` under `owner`'s lease: available again at once,
    /// parked at its tenth failure.
    pub fn new(owner: OwnerToken, id: MessageId, error: impl Into<String>) -> Self {
        Self {
            owner,
            id,
            error: error.into(),
            retry_after: Duration::ZERO,
            max_attempts: 10,
        }
    }

    /// Available again only after `retry_after`.
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

/// The storage of a transactional outbox (`idem-outbox`).
///
/// # Contract
///
/// Each sentence is a case of the public outbox suite in `idem-conformance`.
///
/// - **Enqueue.** [`enqueue`](Self::enqueue) stores a message pending, with
///   the next sequence of its aggregate (1 for the first); a second enqueue
///   of one id stores nothing more and returns the first. An aggregate's
///   sequence keeps counting after its messages were purged: it never
///   starts again at 1. Backends that share the caller's transaction
///   enqueue inside it, so a message exists exactly when the business
///   change committed, and sequences follow the commit order within an
///   aggregate.
/// - **Claim.** [`claim`](Self::claim) leases to the batch's `owner`, for
///   its `lease` by the store's clock at the store's precision (a lease
///   under a second is not rounded to nothing: another owner's claim right
///   after it gets nothing), up to its `limit` messages: for each
///   aggregate, its lowest pending message that nobody holds, if it is
///   available (`available_at` passed) and every open (pending or parked)
///   message of the aggregate below it is held by that owner. So a claim
///   takes each aggregate's head, never two messages of one aggregate, and
///   nothing above a parked message or one another owner holds. When more
///   are due than `limit`, it takes those enqueued first (by `enqueued_at`,
///   then id). It never skips a message: one that commits late is claimed
///   when it is the head of its aggregate. A lease that lapsed counts as
///   none, for claims and for its owner alike.
/// - **Claim ahead.** The message after those its owner holds is claimed
///   too, under the earliest of their leases, so an aggregate's leases
///   lapse together: a relay claims an aggregate's next message while the
///   broker confirms the last, and publishes it once that one is confirmed.
/// - **Sent.** [`mark_sent`](Self::mark_sent) marks the given messages sent,
///   in one operation, only those `owner` still holds (a lease that lapsed,
///   even with nobody claiming the message since, holds nothing); it
///   answers how many. Delivered twice, the second marks nothing more and
///   fails nothing.
/// - **Release.** [`release`](Self::release) frees the given messages that
///   `owner` holds, unpublished: available at once, no attempt counted,
///   nothing written but the lease's end (the attempts and the last error
///   of earlier failures stay as they were); it answers how many.
///   Delivered twice, the second frees nothing.
/// - **Failed.** [`mark_failed`](Self::mark_failed) counts a failed publish
///   under its owner's lease, keeps the error, frees the message, and makes
///   it available again after `retry_after`; at `max_attempts` failures it is
///   parked instead, and so, in effect, its aggregate. Without the lease:
///   [`StoreError::LostLease`], nothing written.
/// - **Operator.** [`parked`](Self::parked) lists parked messages, oldest
///   (first enqueued) first; [`retry`](Self::retry) makes a parked message
///   pending again in its place (its sequence kept, so it is claimed before
///   the later messages of its aggregate), with its attempts reset, its
///   last error kept, and available at once whatever its back-off;
///   [`drop_message`](Self::drop_message) drops a pending or parked message
///   so its aggregate flows again, keeping the reason as its `last_error`
///   and the time of the drop as its `sent_at`. A sent (or dropped)
///   message is not dropped: nothing changes. Each answers whether it
///   changed anything. [`message`](Self::message) reads one message in any
///   state, so a dropped message's reason is read there.
/// - **Purge.** [`purge_sent`](Self::purge_sent) deletes up to `limit` sent
///   or dropped messages at least `older_than` old, aged from their
///   `sent_at` (the send, or the drop), never an unsent one.
/// - **Stats.** [`stats`](Self::stats) counts pending and parked messages,
///   and ages the oldest pending one: neither sent nor parked messages
///   count in the age.
/// - **Time.** Leases, back-off and ages are the store's clock's, never
///   the caller's: a store whose clock is far from the process's passes
///   every case. A store author whose store reads a clock of its own (a
///   server's) should run the suite also against the store built on a
///   clock hours from the process's, as `idem-conformance` does for its
///   own stores with its `SkewedClock`.
#[async_trait]
pub trait OutboxStore: Send + Sync + fmt::Debug + 'static {
    /// Stores `message` pending with its aggregate's next sequence.
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError>;

    /// Leases the available heads of up to `batch.limit` aggregates to
    /// `batch.owner`, and the next message of each aggregate it holds.
    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError>;

    /// Marks `ids` sent where `owner` holds them; how many it marked.
    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError>;

    /// Frees `ids` where `owner` holds them, counting no attempt; how many
    /// it freed.
    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError>;

    /// Counts `failure` under its owner's lease; the state it leaves
    /// (pending again, or parked).
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] unless the owner holds it.
    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError>;

    /// Parked messages, oldest first, at most `limit`.
    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError>;

    /// Makes a parked message pending again; whether it was parked.
    async fn retry(&self, id: MessageId) -> Result<bool, StoreError>;

    /// Drops a pending or parked message with `reason`; whether it did.
    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError>;

    /// The message `id` in whatever state it is, while it is stored.
    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError>;

    /// Deletes up to `limit` sent or dropped messages at least `older_than`
    /// old (since their `sent_at`); how many.
    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError>;

    /// The backlog.
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

    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError> {
        let claimed = self.get_ref().claim(batch);
        self.layer()
            .traced(Operation::Claim, None, None, claimed)
            .await
    }

    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let sent = self.get_ref().mark_sent(owner, ids);
        self.layer()
            .traced(Operation::MarkSent, None, None, sent)
            .await
    }

    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let released = self.get_ref().release(owner, ids);
        self.layer()
            .traced(Operation::Release, None, None, released)
            .await
    }

    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError> {
        let failed = self.get_ref().mark_failed(failure);
        self.layer()
            .traced(Operation::MarkFailed, None, None, failed)
            .await
    }

    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let parked = self.get_ref().parked(limit);
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
            async fn claim(
                &self,
                batch: &$crate::store::BatchClaim,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.claim(batch).await
            }
            async fn mark_sent(
                &self,
                owner: $crate::store::OwnerToken,
                ids: &[$crate::store::MessageId],
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.mark_sent(owner, ids).await
            }
            async fn release(
                &self,
                owner: $crate::store::OwnerToken,
                ids: &[$crate::store::MessageId],
            ) -> ::core::result::Result<u64, $crate::StoreError> {
                self.$field.release(owner, ids).await
            }
            async fn mark_failed(
                &self,
                failure: &$crate::store::PublishFailure,
            ) -> ::core::result::Result<$crate::store::MessageState, $crate::StoreError> {
                self.$field.mark_failed(failure).await
            }
            async fn parked(
                &self,
                limit: usize,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::OutboxMessage>,
                $crate::StoreError,
            > {
                self.$field.parked(limit).await
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
    /// attempt, the error kept, the lease freed, available again after the
    /// back-off, parked at the last attempt.
    #[must_use]
    pub fn failed(&self, failure: &PublishFailure, now: Timestamp) -> Self {
        self.edited(|parts| {
            parts.attempts = parts.attempts.saturating_add(1);
            parts.last_error = Some(failure.error.clone());
            parts.lease_until = None;
            parts.available_at = now + failure.retry_after;
            if parts.attempts >= failure.max_attempts {
                parts.state = MessageState::Parked;
            }
        })
    }
}
