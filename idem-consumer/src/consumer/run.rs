//! Receiving: the lanes of the deliveries received, the batches gathered
//! from them and handled in tasks of their own, the shutdown, and the
//! sweep of stuck aggregates beside it.

use super::*;

use crate::flight::{Lanes, Tasks};

/// The deliveries being handled, each task ending in how it went.
type Handling = Tasks<Result<(), ConsumerError>>;
/// A batch's task ending, or saying deliveries committed.
type Next = crate::flight::Next<Result<(), ConsumerError>>;

/// What [`Consumer::run`] holds: the lanes of the deliveries received, the
/// batches being handled, and the batch being gathered.
pub(super) struct Flight<D> {
    lanes: Lanes<D>,
    tasks: Handling,
    /// Deliveries free to start, each with its aggregate, oldest first.
    gathered: Vec<(Option<String>, D)>,
    /// When the gathered batch starts, full or not.
    due: Option<tokio::time::Instant>,
    /// When the deliveries held waiting are next said to be in progress.
    keep: tokio::time::Interval,
}

/// A third of `ack_wait` (at least 100 ms): how often a held delivery is
/// said to be in progress, so two calls come within every ack wait.
fn keep_alive_period(ack_wait: Duration) -> Duration {
    (ack_wait / 3).max(Duration::from_millis(100))
}

pub(super) fn log_handled(handled: Result<Result<(), ConsumerError>, tokio::task::JoinError>) {
    match handled {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "a delivery failed; the broker delivers it again");
        }
        Err(error) => {
            tracing::error!(%error, "a delivery's task ended abnormally; the broker delivers it again");
        }
    }
}

/// A task aborted when this guard drops.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<H: Handler> Consumer<H> {
    /// Checks the horizon of `source`, then consumes its deliveries until
    /// it closes or `shutdown` completes, in batches
    /// ([`ConsumerOptions::batch`]): the deliveries received within the
    /// batch's wait, up to its size, are handled in one transaction and
    /// committed once ([`consume_batch`](Self::consume_batch)), up to
    /// [`ConsumerOptions::concurrency`] batches at once. Never two
    /// deliveries of one aggregate are handled at the same time, and each
    /// aggregate's waiting deliveries start lowest version first, else in
    /// the order the source delivered them (so version checks see them in
    /// order, and a predecessor received after its successors goes before
    /// them; a message without an aggregate waits only for room). Beside the deliveries, every
    /// [`ConsumerOptions::release_interval`] a sweep replays the parked
    /// versions of the aggregates stuck behind a gap
    /// ([`stuck`](Self::stuck)); such a replay may run beside a delivery
    /// of the same aggregate, and its version check keeps them in order.
    /// A delivery of an aggregate being handled waits behind it,
    /// outside any batch, so a slow aggregate holds up only its own and its
    /// batch-mates (which commit with it). An aggregate goes on once its
    /// batch has committed, while the batch's acknowledgements are on their
    /// way, when nothing of the consumer's is parked (as a rule; else once
    /// the batch has released what waited behind its events); as many
    /// batches again as the concurrency may be settling so. `run` stops receiving while
    /// [`WAITING_PER_SLOT`] deliveries per slot
    /// ([`ConsumerOptions::slots`]) wait so. A retryable broker error
    /// receiving (a lost connection, a timeout) is logged and asked again
    /// after the consumer's back-off, doubling while it lasts.
    ///
    /// # Cancellation
    ///
    /// Each batch is handled in a task of its own, so that it commits whole
    /// or rolls back whole and is then settled, whatever becomes of `run`:
    /// dropping `run`'s future (or aborting its task) stops the receiving,
    /// never a batch between its statements. When `shutdown` completes,
    /// `run` stops receiving and waits for the batches being handled, up to
    /// [`ConsumerOptions::shutdown_grace`]; deliveries received and not
    /// begun are left unsettled, for the broker to deliver again. A process
    /// that dies mid-batch leaves its transaction to roll back and its
    /// deliveries to the broker, which delivers them again.
    ///
    /// # Errors
    ///
    /// [`ConsumerError::Misconfigured`] from [`check`](Self::check), before
    /// any delivery; a broker error receiving that is not retryable (once
    /// the batches being handled are done). A failure of one delivery is
    /// logged and left to the broker's redelivery.
    pub async fn run<S: Source>(
        &self,
        source: &mut S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumerError> {
        self.check(&source.horizon())?;
        let _sweeper = self.sweeper();
        tokio::pin!(shutdown);
        let slots = self.parts.options.slots();
        let horizon = source.horizon();
        let every = keep_alive_period(horizon.ack_wait);
        let millis = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
        self.parts
            .keep_alive_millis
            .store(millis, std::sync::atomic::Ordering::Relaxed);
        let mut keep = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        keep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flight = Flight {
            lanes: Lanes::new(slots, slots.saturating_mul(WAITING_PER_SLOT)),
            tasks: Handling::default(),
            gathered: Vec::new(),
            due: None,
            keep,
        };
        // Receive failures in a row: the back-off's delivery count.
        let mut failures = 0u32;
        loop {
            // Until there is room: only settle what is handled.
            while !flight.lanes.has_room() {
                let (flushable, due) = self.flush_due(&flight);
                tokio::select! {
                    biased;
                    () = &mut shutdown => {
                        self.finish(flight.tasks).await;
                        return Ok(());
                    }
                    Some(next) = flight.tasks.next() => self.went_on(&mut flight, next),
                    _ = flight.keep.tick() => self.keep_waiting(&flight).await,
                    () = tokio::time::sleep_until(due), if flushable => self.flush(&mut flight),
                    // Nothing runs, so nothing would make room: receive.
                    else => break,
                }
            }
            // One receive, never dropped for a settlement (a source's next
            // need not be cancel-safe), only for the shutdown, as before.
            let Some(next) = self
                .meanwhile(&mut flight, &mut shutdown, source.next())
                .await
            else {
                return Ok(());
            };
            let next = match next {
                Ok(next) => next,
                Err(error) if error.is_retryable() => {
                    failures = failures.saturating_add(1);
                    let after = self.parts.options.delay_after(failures);
                    tracing::warn!(%error, ?after, "the source could not receive; asking again");
                    let resume = tokio::time::sleep(after);
                    if self
                        .meanwhile(&mut flight, &mut shutdown, resume)
                        .await
                        .is_none()
                    {
                        return Ok(());
                    }
                    continue;
                }
                Err(error) => {
                    self.drain(&mut flight, &mut shutdown).await;
                    return Err(error.into());
                }
            };
            failures = 0;
            let Some(delivery) = next else {
                self.drain(&mut flight, &mut shutdown).await;
                return Ok(());
            };
            let aggregate = delivery.message().aggregate().map(str::to_string);
            let version = delivery.message().version();
            if let Some(delivery) = flight.lanes.admit(aggregate.clone(), version, delivery) {
                self.gather(&mut flight, aggregate, delivery);
            }
        }
    }

    /// Says every delivery held waiting (behind its aggregate, or gathered)
    /// is in progress.
    async fn keep_waiting<D: Delivery + 'static>(&self, flight: &Flight<D>) {
        let held: Vec<&D> = flight
            .lanes
            .held()
            .chain(flight.gathered.iter().map(|(_, delivery)| delivery))
            .collect();
        if !held.is_empty() {
            keep_alive(&held).await;
        }
    }

    /// Awaits `work` while settling the batches that end and starting a
    /// gathered one whose wait is up; `None` when `shutdown` completed
    /// first (the batches being handled then finish, within the grace).
    pub(super) async fn meanwhile<D: Delivery + 'static, T>(
        &self,
        flight: &mut Flight<D>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        work: impl Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        loop {
            let (flushable, due) = self.flush_due(flight);
            tokio::select! {
                biased;
                () = &mut *shutdown => {
                    self.finish(std::mem::take(&mut flight.tasks)).await;
                    return None;
                }
                Some(next) = flight.tasks.next() => self.went_on(flight, next),
                _ = flight.keep.tick() => self.keep_waiting(flight).await,
                () = tokio::time::sleep_until(due), if flushable => self.flush(flight),
                done = &mut work => return Some(done),
            }
        }
    }

    /// Whether a gathered batch may start when its wait is up, and when
    /// that is (a batch task must be free).
    pub(super) fn flush_due<D>(&self, flight: &Flight<D>) -> (bool, tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        match flight.due {
            Some(due) if flight.tasks.has_room(self.parts.options.concurrency) => (true, due),
            _ => (false, now),
        }
    }

    /// A delivery may start: it joins the batch being gathered, which
    /// starts once full (and a batch task is free).
    pub(super) fn gather<D: Delivery + 'static>(
        &self,
        flight: &mut Flight<D>,
        aggregate: Option<String>,
        delivery: D,
    ) {
        if flight.gathered.is_empty() {
            flight.due = Some(tokio::time::Instant::now() + self.parts.options.batch_wait);
        }
        flight.gathered.push((aggregate, delivery));
        let options = &self.parts.options;
        while flight.gathered.len() >= options.batch_size
            && flight.tasks.has_room(options.concurrency)
        {
            self.start(flight);
        }
    }

    /// The gathered batch's wait is up: it starts as it is.
    pub(super) fn flush<D: Delivery + 'static>(&self, flight: &mut Flight<D>) {
        if flight.tasks.has_room(self.parts.options.concurrency) {
            self.start(flight);
        }
    }

    /// Starts a batch of the gathered deliveries (the oldest, up to the
    /// batch size) in a task of its own.
    pub(super) fn start<D: Delivery + 'static>(&self, flight: &mut Flight<D>) {
        let size = flight.gathered.len().min(self.parts.options.batch_size);
        if size == 0 {
            flight.due = None;
            return;
        }
        let (aggregates, batch): (Vec<_>, Vec<_>) = flight.gathered.drain(..size).unzip();
        if flight.gathered.is_empty() {
            flight.due = None;
        }
        let consumer = self.clone();
        flight.tasks.spawn(aggregates, |committed| async move {
            let settled = consumer
                .consume_batch_saying(&batch, |positions| committed.say(positions))
                .await;
            for settled in settled {
                if let Err(error) = settled {
                    tracing::warn!(%error, "a delivery failed; the broker delivers it again");
                }
            }
            Ok(())
        });
    }

    /// A batch's task ended (logged), or said deliveries committed: gathers
    /// what waited for their aggregates.
    pub(super) fn went_on<D: Delivery + 'static>(&self, flight: &mut Flight<D>, next: Next) {
        let aggregates = match next {
            Next::Joined((aggregates, handled)) => {
                log_handled(handled);
                aggregates
            }
            Next::Committed(aggregates) => aggregates,
        };
        for aggregate in aggregates {
            for (aggregate, delivery) in flight.lanes.finished(aggregate.as_deref()) {
                self.gather(flight, aggregate, delivery);
            }
        }
        // A batch task is free: a batch whose wait is up starts now.
        if flight
            .due
            .is_some_and(|due| due <= tokio::time::Instant::now())
        {
            self.flush(flight);
        }
    }

    /// The source closed (or failed for good): handles what was received
    /// and settles it, until the shutdown.
    pub(super) async fn drain<D: Delivery + 'static>(
        &self,
        flight: &mut Flight<D>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) {
        // A batch past its commit has let its aggregates go while its acks
        // are on their way: it is waited for as well.
        while !flight.lanes.is_idle() || !flight.tasks.is_empty() {
            let (flushable, due) = self.flush_due(flight);
            tokio::select! {
                biased;
                () = &mut *shutdown => {
                    self.finish(std::mem::take(&mut flight.tasks)).await;
                    return;
                }
                Some(next) = flight.tasks.next() => self.went_on(flight, next),
                _ = flight.keep.tick() => self.keep_waiting(flight).await,
                () = tokio::time::sleep_until(due), if flushable => self.flush(flight),
                else => return,
            }
        }
    }

    /// At shutdown: waits for the batches being handled, within the grace.
    pub(super) async fn finish(&self, mut tasks: Handling) {
        let grace = self.parts.options.shutdown_grace;
        let finished = tokio::time::timeout(grace, async {
            while let Some(next) = tasks.next().await {
                if let Next::Joined((_, handled)) = next {
                    log_handled(handled);
                }
            }
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                ?grace,
                "deliveries were still being handled at the end of the shutdown grace; \
                 they finish in their tasks, or the broker delivers them again"
            );
        }
    }

    /// [`run`](Self::run)'s sweeps, in a task of their own, stopped when
    /// the guard drops (a release cut off leaves its message parked, for
    /// the next).
    pub(super) fn sweeper(&self) -> AbortOnDrop
    where
        H: Handler,
    {
        let consumer = self.clone();
        let interval = self.parts.options.release_interval;
        AbortOnDrop(tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if let Err(error) = consumer.sweep().await {
                    tracing::warn!(%error, "could not sweep the stuck aggregates");
                }
            }
        }))
    }
}
