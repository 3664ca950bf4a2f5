//! The relay: claims what committed, publishes it, marks it sent.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
#[cfg(feature = "metrics")]
use std::time::Instant;

use idem_core::store::{
    BatchClaim, MessageId, MessageState, OutboxMessage, OutboxStore, OwnerToken, PublishFailure,
    validate_lease, validate_outbox_batch,
};
use idem_core::{InvalidInput, StoreError};
use tokio::sync::Notify;
use tracing::Instrument;

use crate::publisher::Publisher;

/// How a relay works: batch, lease, retries and back-off, and how often it
/// looks when nothing woke it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayOptions {
    batch: usize,
    lease: Duration,
    max_attempts: u32,
    first_retry: Duration,
    max_retry: Duration,
    poll_interval: Duration,
    retention: Duration,
    purge_every: Duration,
}

impl Default for RelayOptions {
    /// Batches of 100, a 30 s lease, 10 attempts with back-off from 1 s
    /// doubling to 5 min, a look every second when nothing wakes it, sent
    /// messages kept 7 days and purged (a batch at a time) every minute.
    fn default() -> Self {
        Self {
            batch: 100,
            lease: Duration::from_secs(30),
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
    /// Messages claimed and published at once (1 to 1000).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside it.
    pub fn with_batch(mut self, batch: usize) -> Result<Self, InvalidInput> {
        self.batch = validate_outbox_batch(batch)?;
        Ok(self)
    }

    /// How long a relay holds what it claimed (1 ms to 7 days): longer than
    /// a batch's publishing takes; another relay takes the messages over
    /// once it passed.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside it.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, InvalidInput> {
        self.lease = validate_lease(lease)?;
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

    /// How long a relay holds what it claimed.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The back-off after the `attempts`-th failure.
    fn retry_after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(30);
        self.first_retry
            .saturating_mul(1 << doublings)
            .min(self.max_retry)
    }
}

/// What one pass of the relay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayPass {
    /// Messages claimed.
    pub claimed: usize,
    /// Confirmed by the broker and marked sent.
    pub published: u64,
    /// Of those, recognised by the broker as duplicates.
    pub duplicates: usize,
    /// Failed, to be retried after their back-off.
    pub failed: usize,
    /// Failed for the last time: parked with their aggregate.
    pub parked: usize,
    /// Confirmed, but no longer this relay's to mark (its lease was taken
    /// over): the next relay publishes them again, and the message id lets
    /// the broker or the consumer drop the copy.
    pub lost: u64,
}

/// Why a relay pass stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The outbox store failed; the next pass tries again (a message
    /// published but not marked is published again, with its id).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Publishes what the outbox holds, in order per aggregate, through a
/// [`Publisher`]. Any number of relays may run at once over one store: each
/// claims under a lease of its own, and a relay whose lease was taken over
/// marks nothing. No database transaction is held while it publishes.
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
}

impl<S: ?Sized, P: ?Sized> Clone for Relay<S, P> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            publisher: Arc::clone(&self.publisher),
            options: self.options,
            wake: Arc::clone(&self.wake),
        }
    }
}

impl<S: OutboxStore + ?Sized, P: Publisher + ?Sized> Relay<S, P> {
    /// A relay over `store` publishing through `publisher`.
    pub fn new(store: Arc<S>, publisher: Arc<P>, options: RelayOptions) -> Self {
        Self {
            store,
            publisher,
            options,
            wake: Arc::new(Notify::new()),
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

    /// One pass: claims a batch (one round trip), publishes it (no
    /// transaction held), marks what the broker confirmed sent (one round
    /// trip), and counts each failure (retried with back-off, parked after
    /// the last attempt).
    ///
    /// # Errors
    ///
    /// [`RelayError::Store`] when the store fails.
    pub async fn relay_once(&self) -> Result<RelayPass, RelayError> {
        let span = tracing::debug_span!(
            "idem.outbox.relay",
            store = self.store.capabilities().store,
            claimed = tracing::field::Empty,
            published = tracing::field::Empty,
            failed = tracing::field::Empty,
        );
        let pass = self.pass().instrument(span.clone()).await?;
        span.record("claimed", pass.claimed);
        span.record("published", pass.published);
        span.record("failed", pass.failed);
        Ok(pass)
    }

    async fn pass(&self) -> Result<RelayPass, RelayError> {
        let owner = OwnerToken::generate();
        let batch = self
            .store
            .claim(&BatchClaim::new(
                owner,
                self.options.lease,
                self.options.batch,
            ))
            .await?;
        let mut pass = RelayPass {
            claimed: batch.len(),
            ..RelayPass::default()
        };
        if batch.is_empty() {
            return Ok(pass);
        }
        #[cfg(feature = "metrics")]
        let started = Instant::now();
        let results = self.publisher.publish(&batch).await;
        #[cfg(feature = "metrics")]
        metrics::histogram!(crate::PUBLISH_DURATION).record(started.elapsed().as_secs_f64());
        let mut sent: Vec<MessageId> = Vec::with_capacity(batch.len());
        let mut failures: Vec<(&OutboxMessage, String)> = Vec::new();
        for (i, message) in batch.iter().enumerate() {
            match results.get(i) {
                Some(Ok(published)) => {
                    sent.push(message.id());
                    pass.duplicates += usize::from(published.duplicate);
                }
                Some(Err(error)) => failures.push((message, error.to_string())),
                None => failures.push((message, "the publisher gave no answer".into())),
            }
        }
        if !sent.is_empty() {
            pass.published = self.store.mark_sent(owner, &sent).await?;
            pass.lost = (sent.len() as u64).saturating_sub(pass.published);
        }
        for (message, error) in failures {
            let attempts = message.parts().attempts.saturating_add(1);
            let retry_after = self.options.retry_after(attempts);
            let failure = PublishFailure::new(owner, message.id(), error.as_str())
                .retry_after(retry_after)
                .max_attempts(self.options.max_attempts);
            let state = self.store.mark_failed(&failure).await;
            match state {
                Ok(MessageState::Parked) => {
                    pass.parked += 1;
                    tracing::warn!(
                        message_id = %message.id(),
                        aggregate = message.message().aggregate(),
                        %error,
                        "an outbox message failed its last attempt; it and its aggregate are parked"
                    );
                }
                Ok(_) => pass.failed += 1,
                // Taken over: the new holder publishes it.
                Err(StoreError::LostLease) => pass.lost += 1,
                Err(other) => return Err(other.into()),
            }
        }
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(crate::PUBLISHED).increment(pass.published);
            metrics::counter!(crate::FAILED).increment((pass.failed + pass.parked) as u64);
            metrics::counter!(crate::PARKED).increment(pass.parked as u64);
        }
        Ok(pass)
    }

    /// Relays until `shutdown` completes: a pass, then another at once while
    /// batches come back full, else a wait for a wake-up or the poll
    /// interval; when idle, a batch of sent messages past their retention
    /// is purged at most every purge interval. A failing store is retried at the poll interval, with a
    /// warning. Gauges (with the `metrics` feature) are refreshed after each
    /// idle pass.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut next_purge = tokio::time::Instant::now();
        loop {
            let full = match self.relay_once().await {
                Ok(pass) => pass.claimed >= self.options.batch,
                Err(error) => {
                    tracing::warn!(%error, "the outbox relay could not make a pass");
                    false
                }
            };
            if full {
                continue;
            }
            self.refresh_gauges().await;
            if tokio::time::Instant::now() >= next_purge {
                next_purge = tokio::time::Instant::now() + self.options.purge_every;
                self.purge().await;
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(self.options.poll_interval) => {}
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
        }
    }

    #[cfg(not(feature = "metrics"))]
    async fn refresh_gauges(&self) {}
}
