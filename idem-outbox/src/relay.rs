//! The relay: claims what committed, publishes it, marks it sent.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
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

/// The most batches one relay keeps in flight.
pub const MAX_IN_FLIGHT: usize = 16;

/// How a relay works: batch, lease, retries and back-off, and how often it
/// looks when nothing woke it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayOptions {
    batch: usize,
    in_flight: usize,
    lease: Duration,
    max_attempts: u32,
    first_retry: Duration,
    max_retry: Duration,
    poll_interval: Duration,
    retention: Duration,
    purge_every: Duration,
}

impl Default for RelayOptions {
    /// Batches of 100, two in flight at once, a 30 s lease, 10 attempts with back-off from 1 s
    /// doubling to 5 min, a look every second when nothing wakes it, sent
    /// messages kept 7 days and purged (a batch at a time) every minute.
    fn default() -> Self {
        Self {
            batch: 100,
            in_flight: 2,
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

    /// Batches a [`drain`](Relay::drain) (and so [`run`](Relay::run)) keeps
    /// in flight at once, 1 to [`MAX_IN_FLIGHT`]: while the broker confirms
    /// one batch, the next is claimed and earlier ones are marked sent, so
    /// the store's round trips overlap the broker's instead of adding to
    /// them. The broker still receives one batch at a time. 1 is strictly
    /// one pass after another.
    ///
    /// The next batch may hold the next message of an aggregate whose
    /// message is at the broker (claimed ahead, under that message's
    /// lease): it is published only once that one was confirmed. A claimed
    /// batch waits for the ones ahead of it to be published, so the
    /// [lease](Self::with_lease) must outlast that many batches'
    /// publishing.
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

    /// How long a relay holds what it claimed (1 ms to 7 days): longer than
    /// a batch's publishing takes (times the batches in flight); another
    /// relay takes the messages over once it passed.
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

    /// Batches a drain keeps in flight at once.
    pub fn in_flight(&self) -> usize {
        self.in_flight
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
    /// Claims that found something (1 for a pass that did).
    pub batches: usize,
    /// Confirmed by the broker and marked sent.
    pub published: u64,
    /// Of those, recognised by the broker as duplicates.
    pub duplicates: usize,
    /// Failed, to be retried after their back-off.
    pub failed: usize,
    /// Failed for the last time: parked with their aggregate.
    pub parked: usize,
    /// Claimed ahead behind a message of their aggregate that then failed:
    /// handed back unpublished, to follow it once it is sent.
    pub released: u64,
    /// Confirmed, but no longer this relay's to mark (its lease was taken
    /// over): the next relay publishes them again, and the message id lets
    /// the broker or the consumer drop the copy.
    pub lost: u64,
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

/// What the broker answered for batches not yet marked.
#[derive(Debug, Default)]
struct Answered {
    batches: usize,
    sent: Vec<MessageId>,
    duplicates: usize,
    failures: Vec<(OutboxMessage, String)>,
    /// Claimed ahead behind a failure of their aggregate: not published.
    held: Vec<MessageId>,
}

impl Answered {
    fn absorb(&mut self, more: Self) {
        self.batches += more.batches;
        self.sent.extend(more.sent);
        self.duplicates += more.duplicates;
        self.failures.extend(more.failures);
        self.held.extend(more.held);
    }
}

/// The aggregates whose message failed in this drain, with that message's
/// sequence and id: what the relay claimed of them ahead, above it, must
/// not reach the broker before it.
#[derive(Debug, Default)]
struct Behind(HashMap<String, (u64, MessageId)>);

impl Behind {
    /// Splits a claimed batch into what may be published now and what
    /// waits behind a failure of its aggregate.
    fn split(&self, batch: Vec<OutboxMessage>) -> (Vec<OutboxMessage>, Vec<MessageId>) {
        if self.0.is_empty() {
            return (batch, Vec::new());
        }
        let mut held = Vec::new();
        let batch = batch
            .into_iter()
            .filter(|message| {
                let failed = self.0.get(message.message().aggregate());
                let behind = failed.is_some_and(|&(failed, _)| message.parts().sequence > failed);
                if behind {
                    held.push(message.id());
                }
                !behind
            })
            .collect();
        (batch, held)
    }

    /// Learns what the broker answered of a batch: its failures, and
    /// which failed messages it has now confirmed.
    fn learn(&mut self, answered: &Answered) {
        for (message, _) in &answered.failures {
            let (aggregate, sequence) = (message.message().aggregate(), message.parts().sequence);
            let failed = self
                .0
                .entry(aggregate.to_string())
                .or_insert((sequence, message.id()));
            if sequence < failed.0 {
                *failed = (sequence, message.id());
            }
        }
        if !self.0.is_empty() {
            self.0.retain(|_, (_, id)| !answered.sent.contains(id));
        }
    }
}

/// What marking some batches did.
#[derive(Debug)]
struct Marked {
    batches: usize,
    pass: RelayPass,
    error: Option<StoreError>,
}

impl Marked {
    /// Adds this to `total`, and to the counters.
    fn count(&self, total: &mut RelayPass) {
        let pass = &self.pass;
        total.published += pass.published;
        total.duplicates += pass.duplicates;
        total.failed += pass.failed;
        total.parked += pass.parked;
        total.released += pass.released;
        total.lost += pass.lost;
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(crate::PUBLISHED).increment(pass.published);
            metrics::counter!(crate::FAILED).increment((pass.failed + pass.parked) as u64);
            metrics::counter!(crate::PARKED).increment(pass.parked as u64);
        }
    }
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
        self.traced(Some(1)).await
    }

    /// Passes until nothing is due: claims, publishes and marks batch after
    /// batch, with up to [`in_flight`](RelayOptions::with_in_flight) batches
    /// at once, and returns what they did together. It ends when a claim
    /// made while no other batch was in flight finds nothing, so messages
    /// that an earlier batch's marks made the heads of their aggregates are
    /// published in the same drain.
    ///
    /// With more than one batch in flight, the next batch is claimed while
    /// the broker confirms the last, and the marks of earlier batches run
    /// beside both; the broker sees one batch at a time, in the order they
    /// were claimed. The claim beside a batch in flight takes the next
    /// message of each aggregate that batch holds ([claim
    /// ahead](idem_core::store::OutboxStore#contract)), so even when every
    /// aggregate with messages due is in flight, the next batch waits at
    /// the broker's door rather than for a mark. Order per aggregate holds:
    /// a message claimed ahead is published only after the one before it
    /// was confirmed, in a later batch; if that one failed, what was claimed
    /// ahead of it is handed back unpublished
    /// ([`released`](RelayPass::released)) and follows it once it is sent.
    /// Confirmed messages that wait for a mark are marked together in one
    /// round trip. Once a claim made beside batches in flight finds nothing
    /// (every message due is in flight already), each further claim of the
    /// drain waits for a mark rather than search in vain.
    ///
    /// When the store fails, nothing more is claimed; what was claimed is
    /// still published and marked, and the first error is returned.
    ///
    /// # Cancellation
    ///
    /// Dropped mid-way (a relay that crashes or is cut off), what the drain
    /// claimed stays leased to it until its lease lapses, then any relay
    /// claims it again, in order: nothing is lost or published out of
    /// order. A message the broker confirmed before the drop may be
    /// published again (the same message id: JetStream's duplicate window
    /// keeps one copy, a consumer's inbox drops the other). A mark that was
    /// sent lands or not, fenced by the lease.
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
    /// let options = RelayOptions::default().with_in_flight(4)?;
    /// let relay = Relay::new(outbox.clone(), Arc::new(Accepts), options);
    /// // One message of the aggregate at a time, all five in one drain.
    /// let drained = relay.drain().await?;
    /// assert_eq!((drained.published, drained.batches), (5, 5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`RelayError::Store`] when the store fails.
    pub async fn drain(&self) -> Result<RelayPass, RelayError> {
        self.traced(None).await
    }

    /// [`passes`](Self::passes) in the relay's span.
    async fn traced(&self, claims: Option<usize>) -> Result<RelayPass, RelayError> {
        let span = tracing::debug_span!(
            "idem.outbox.relay",
            store = self.store.capabilities().store,
            claimed = tracing::field::Empty,
            published = tracing::field::Empty,
            failed = tracing::field::Empty,
        );
        let pass = self.passes(claims).instrument(span.clone()).await?;
        span.record("claimed", pass.claimed);
        span.record("published", pass.published);
        span.record("failed", pass.failed);
        Ok(pass)
    }

    /// Claims (at most `claims` times, or until nothing is due), publishes
    /// and marks, with up to the in-flight window of batches at once.
    async fn passes(&self, claims: Option<usize>) -> Result<RelayPass, RelayError> {
        let owner = OwnerToken::generate();
        let (batch, lease) = (self.options.batch, self.options.lease);
        let ask = BatchClaim::new(owner, lease, batch);
        let mut total = RelayPass::default();
        let mut error: Option<StoreError> = None;
        let mut claims_left = claims;
        // Whether to claim again, and whether to wait for a mark first (the
        // last claim took every head that was due). Once a claim made beside
        // batches in flight found nothing, every due aggregate fits in the
        // batches in flight: claiming ahead only costs the store a search,
        // so for the rest of the drain each claim waits for a mark.
        let (mut more, mut paused, mut saturated) = (true, false, false);
        // Batches being claimed, waiting, published or marked.
        let mut in_flight = 0usize;
        let mut claim_alone = false;
        let mut claiming: Option<Step<'_, Result<Vec<OutboxMessage>, StoreError>>> = None;
        let mut waiting: VecDeque<Vec<OutboxMessage>> = VecDeque::new();
        let mut publishing: Option<Step<'_, Answered>> = None;
        let mut answered = Answered::default();
        let mut behind = Behind::default();
        let mut marking: Option<Step<'_, Marked>> = None;
        loop {
            if more && !paused && claiming.is_none() && in_flight < self.options.in_flight {
                claim_alone = in_flight == 0;
                claiming = Some(self.store.claim(&ask));
                in_flight += 1;
                if let Some(left) = claims_left.as_mut() {
                    *left = left.saturating_sub(1);
                    more = *left > 0;
                }
            }
            if publishing.is_none()
                && let Some(next) = waiting.pop_front()
            {
                let (batch, held) = behind.split(next);
                publishing = Some(Box::pin(self.publish(batch, held)));
            }
            if marking.is_none() && answered.batches > 0 {
                marking = Some(Box::pin(self.mark(owner, std::mem::take(&mut answered))));
            }
            if claiming.is_none() && publishing.is_none() && marking.is_none() {
                break;
            }
            tokio::select! {
                claimed = settle(&mut claiming) => {
                    claiming = None;
                    match claimed {
                        Ok(claimed) if claimed.is_empty() => {
                            in_flight -= 1;
                            // Nothing due even with nothing else in flight:
                            // drained. Else the marks of what is in flight
                            // may free heads (claim again once they did, or
                            // at once if they already have).
                            more &= !claim_alone;
                            paused = in_flight > 0;
                            saturated |= !claim_alone;
                        }
                        Ok(claimed) => {
                            total.claimed += claimed.len();
                            total.batches += 1;
                            paused = saturated || claimed.len() < batch;
                            waiting.push_back(claimed);
                        }
                        Err(failed) => {
                            in_flight -= 1;
                            more = false;
                            error.get_or_insert(failed);
                        }
                    }
                }
                published = settle(&mut publishing) => {
                    publishing = None;
                    behind.learn(&published);
                    answered.absorb(published);
                }
                marked = settle(&mut marking) => {
                    marking = None;
                    in_flight -= marked.batches;
                    paused = false;
                    marked.count(&mut total);
                    if let Some(failed) = marked.error {
                        more = false;
                        error.get_or_insert(failed);
                    }
                }
            }
        }
        match error {
            Some(error) => Err(error.into()),
            None => Ok(total),
        }
    }

    /// Publishes one claimed batch (but what it `held` behind a failure)
    /// and sorts the broker's answers.
    async fn publish(&self, batch: Vec<OutboxMessage>, held: Vec<MessageId>) -> Answered {
        let mut answered = Answered {
            batches: 1,
            held,
            ..Answered::default()
        };
        if batch.is_empty() {
            return answered;
        }
        #[cfg(feature = "metrics")]
        let started = Instant::now();
        let results = self.publisher.publish(&batch).await;
        #[cfg(feature = "metrics")]
        metrics::histogram!(crate::PUBLISH_DURATION).record(started.elapsed().as_secs_f64());
        for (i, message) in batch.into_iter().enumerate() {
            match results.get(i) {
                Some(Ok(published)) => {
                    answered.sent.push(message.id());
                    answered.duplicates += usize::from(published.duplicate);
                }
                Some(Err(error)) => answered.failures.push((message, error.to_string())),
                None => answered
                    .failures
                    .push((message, "the publisher gave no answer".into())),
            }
        }
        answered
    }

    /// Marks what the broker confirmed sent (one round trip), then counts
    /// each failure and hands back what waited behind one (one round trip);
    /// stops at the first store error.
    async fn mark(&self, owner: OwnerToken, answered: Answered) -> Marked {
        let mut marked = Marked {
            batches: answered.batches,
            pass: RelayPass {
                duplicates: answered.duplicates,
                ..RelayPass::default()
            },
            error: None,
        };
        if !answered.sent.is_empty() {
            match self.store.mark_sent(owner, &answered.sent).await {
                Ok(published) => {
                    marked.pass.published = published;
                    marked.pass.lost = (answered.sent.len() as u64).saturating_sub(published);
                }
                Err(error) => {
                    marked.error = Some(error);
                    return marked;
                }
            }
        }
        for (message, error) in answered.failures {
            let attempts = message.parts().attempts.saturating_add(1);
            let retry_after = self.options.retry_after(attempts);
            let failure = PublishFailure::new(owner, message.id(), error.as_str())
                .retry_after(retry_after)
                .max_attempts(self.options.max_attempts);
            let state = self.store.mark_failed(&failure).await;
            match state {
                Ok(MessageState::Parked) => {
                    marked.pass.parked += 1;
                    tracing::warn!(
                        message_id = %message.id(),
                        aggregate_hash = %idem_core::redacted(message.message().aggregate()),
                        %error,
                        "an outbox message failed its last attempt; it and its aggregate are parked"
                    );
                }
                Ok(_) => marked.pass.failed += 1,
                // Taken over: the new holder publishes it.
                Err(StoreError::LostLease) => marked.pass.lost += 1,
                Err(other) => {
                    marked.error = Some(other);
                    return marked;
                }
            }
        }
        // After the failures they waited behind: a claim never takes them
        // again before those are sent.
        if !answered.held.is_empty() {
            match self.store.release(owner, &answered.held).await {
                Ok(released) => marked.pass.released = released,
                Err(error) => marked.error = Some(error),
            }
        }
        marked
    }

    /// Relays until `shutdown` completes: a [`drain`](Self::drain), then a
    /// wait for a wake-up or the poll interval; when idle, a batch of sent
    /// messages past their retention is purged at most every purge
    /// interval. A failing store is retried at the poll interval, with a
    /// warning. Gauges (with the `metrics` feature) are refreshed after each
    /// drain.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut next_purge = tokio::time::Instant::now();
        loop {
            if let Err(error) = self.drain().await {
                tracing::warn!(%error, "the outbox relay could not make a pass");
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
