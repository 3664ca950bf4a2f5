//! A batch of deliveries through one transaction: at once where
//! savepoints cost a round trip, else (or once a message must be undone
//! alone) one message at a time under savepoints; then settled together.

use super::release::gap;
use super::settle::{Attempt, handler_failed};
use super::*;

/// Whether a message is in the batch twice.
pub(super) fn repeats(messages: &[&InboundMessage]) -> bool {
    let mut seen = std::collections::HashSet::with_capacity(messages.len());
    !messages.iter().all(|message| seen.insert(message.id()))
}

/// A store that answered another count of outcomes than it was asked for.
pub(super) fn miscounted(operation: &'static str) -> StoreError {
    StoreError::backend(
        "transaction",
        idem_core::Operation::Claim,
        format!("{operation} answered another count of outcomes than of requests"),
    )
}

/// How one pass of a batch through its transaction ended.
pub(super) enum Round {
    /// Committed: the messages it took are settled; those that did not fit
    /// ([`Transaction::fits`]) go on in the next transaction.
    Committed,
    /// A handler failed, taking the transaction with it: its message's
    /// attempt is settled, and the batch begins again without it.
    HandlerFailed,
    /// The transaction was refused (begun, claimed in, rolled back to a
    /// savepoint, or committed): each message on its own instead.
    Refused(StoreError),
    /// The handler's transaction does not batch.
    Unbatched,
    /// A message must be undone alone, and the pass took no savepoints:
    /// the batch begins again with one per message.
    Undo,
}

/// The refusal of a batch whose first message alone does not fit one
/// transaction: it is handled on its own instead, where its commit says why.
pub(super) fn alone_too_large() -> StoreError {
    idem_core::InvalidInput::OutOfRange {
        field: "transaction",
        reason: "one message's writes do not fit the batch's transaction",
    }
    .into()
}

/// How one message of a batch went in the batch's transaction.
pub(super) enum Step<Tx> {
    /// Done (or rolled back to its savepoint): the transaction goes on.
    Kept(Tx, Attempt),
    /// The handler failed and dropped the transaction: its message's
    /// attempt ([`Attempt::Failed`], or [`Attempt::Poison`] when
    /// [`Permanent`](crate::Permanent)).
    HandlerFailed(Attempt),
    /// The transaction is no longer to be trusted.
    Refused(StoreError),
    /// The message's writes made the transaction too large
    /// ([`Transaction::fits`]); they were rolled back to its savepoint.
    Full(Tx),
}

impl<H: Handler> Consumer<H> {
    /// Consumes a batch of deliveries (of one source, in its order, no two
    /// of one aggregate) with one commit, and settles each: every message
    /// is claimed in one transaction of the handler's
    /// ([`Transaction::claim`]) and handled under a savepoint of its own,
    /// then the transaction commits once and the deliveries are
    /// acknowledged together ([`Delivery::ack_all`]). Where a savepoint
    /// costs a round trip ([`Transaction::free_savepoints`] is false:
    /// Postgres) the batch first goes at once, with no savepoint: one
    /// claim of its messages that records each it takes as consumed
    /// ([`Transaction::claim_completed_all`]: on Postgres, one write per
    /// message), one call of [`Handler::handle_batch`], one commit; only
    /// if a message must be undone alone (a handler error, a gap, a
    /// refused claim) does
    /// it begin again one message at a time, as below. A message twice in
    /// the batch sends it one at a time from the start.
    ///
    /// - A message whose handler returns a gap, whose claim finds it
    ///   applied, held or consumed with another payload, or whose
    ///   completion is refused is rolled back to its savepoint; its
    ///   batch-mates go on.
    /// - A handler error drops the transaction it was given (the handler
    ///   owns it): the batch begins again without that message, which is
    ///   delivered again, then parked, as on its own.
    /// - A refused commit (a serialization failure, a deferred constraint,
    ///   an outcome unknown) or a refused savepoint or claim hands each
    ///   message to [`consume`](Self::consume)'s path, one transaction
    ///   each, so one bad message never keeps its batch-mates from
    ///   applying (one whose commit landed is then a duplicate).
    /// - A duplicate inside the batch applies once: its claim finds the
    ///   first completed in the same transaction. A message claimed in two
    ///   batches at once applies once: the store makes the second claim
    ///   wait for the first transaction, then find it applied (Postgres, on
    ///   the record's primary key), or answer it held.
    ///
    /// After the commit the parking store is listed once: with nothing of
    /// the consumer's parked (as a rule) no aggregate of the batch has
    /// anything waiting behind its event, and only a gap the batch itself
    /// parks is released; else each aggregate an event applied to is
    /// released ([`release`](Self::release)) as on its own.
    ///
    /// A malformed delivery ([`Delivery::malformed`]) is parked at once
    /// with its reason; a batch holding one is settled one delivery at a
    /// time. A handler transaction that does not batch ([`Transaction::batches`])
    /// has each delivery consumed on its own, all at once. Results are in
    /// the batch's order. The batch is an INFO span, `idem.consume_batch`,
    /// with `consumer`, `size` and `commits`; each delivery's settlement
    /// an `idem.consume` span as [`consume`](Self::consume)'s.
    pub async fn consume_batch<D: Delivery>(
        &self,
        batch: &[D],
    ) -> Vec<Result<Settled, ConsumerError>> {
        self.consume_batch_saying(batch, |_| ()).await
    }

    /// [`consume_batch`](Self::consume_batch), saying once, between the
    /// commit and the settlements, which deliveries (by their positions in
    /// `batch`) the commit took, when nothing of the consumer's is parked:
    /// their aggregates may go on while the batch is settled (its acks,
    /// which a later version's handling never depends on). With anything
    /// parked, applying an event releases what waits behind it first, so
    /// the batch says nothing and its aggregates go on once it is settled.
    pub(super) async fn consume_batch_saying<D: Delivery>(
        &self,
        batch: &[D],
        committed_by: impl FnOnce(Vec<usize>),
    ) -> Vec<Result<Settled, ConsumerError>> {
        if batch.is_empty() {
            return Vec::new();
        }
        let span = tracing::info_span!(
            "idem.consume_batch",
            consumer = %self.parts.name,
            size = batch.len(),
            commits = field::Empty,
        );
        let _in_flight = crate::InFlight::new(&self.parts.name, batch.len());
        async {
            // A malformed message is parked, never handled: such a rare
            // batch goes one delivery at a time.
            if batch.iter().any(|delivery| delivery.malformed().is_some()) {
                let each = batch.iter().map(|delivery| self.consume(delivery));
                return futures_util::future::join_all(each).await;
            }
            let messages: Vec<&InboundMessage> = batch.iter().map(Delivery::message).collect();
            let held: Vec<&D> = batch.iter().collect();
            let attempted = self.keeping(&held, self.attempt_batch(&messages)).await;
            let Some(attempts) = attempted else {
                let each = batch.iter().map(|delivery| self.consume(delivery));
                return futures_util::future::join_all(each).await;
            };
            let committed: Vec<usize> = (0..attempts.len())
                .filter(|at| matches!(attempts[*at], Attempt::Done(_)))
                .collect();
            // One listing answers for every aggregate of the batch.
            let parked = committed.is_empty() || self.anything_parked().await;
            if !parked {
                committed_by(committed);
            }
            self.settle_batch(batch, attempts, parked).await
        }
        .instrument(span)
        .await
    }

    /// Each message's attempt in one transaction; `None` when the
    /// handler's transaction does not batch.
    pub(super) async fn attempt_batch(&self, messages: &[&InboundMessage]) -> Option<Vec<Attempt>> {
        let mut settled: Vec<Option<Attempt>> = messages.iter().map(|_| None).collect();
        let mut commits = 0u64;
        // At once until a message has to be undone alone; one by one from
        // the start if a message is in the batch twice (its second claim
        // must find the first completed).
        let mut careful = repeats(messages);
        // Each pass settles at least one message (a handler error settles
        // its message; a commit at least the first it took), but for the
        // one pass that turns careful, so at most as many passes as the
        // batch has messages, and two more.
        let refused = loop {
            commits += 1;
            match self.batch_round(messages, &mut settled, careful).await {
                Round::Committed if settled.iter().all(Option::is_some) => {
                    tracing::Span::current().record("commits", commits);
                    return Some(settled.into_iter().flatten().collect());
                }
                Round::Committed | Round::HandlerFailed => {}
                Round::Undo => careful = true,
                Round::Unbatched => return None,
                Round::Refused(error) => break error,
            }
        };
        tracing::warn!(
            error = %refused,
            size = messages.len(),
            "a batch's transaction was refused; its messages are handled one by one"
        );
        let mut attempts = Vec::with_capacity(messages.len());
        for (message, settled) in messages.iter().zip(settled) {
            let attempt = match settled {
                Some(attempt) => attempt,
                None => {
                    commits += 1;
                    self.attempt(message).await
                }
            };
            attempts.push(attempt);
        }
        tracing::Span::current().record("commits", commits);
        Some(attempts)
    }

    /// One pass of the batch's messages not yet settled through one
    /// transaction: one by one under savepoints if `careful` or where
    /// savepoints are free ([`Transaction::free_savepoints`]), else at
    /// once.
    pub(super) async fn batch_round(
        &self,
        messages: &[&InboundMessage],
        settled: &mut [Option<Attempt>],
        careful: bool,
    ) -> Round {
        let tx = match self.parts.handler.begin().await {
            Ok(tx) => tx,
            Err(error) => return Round::Refused(error),
        };
        if !tx.batches() {
            return Round::Unbatched;
        }
        if careful || tx.free_savepoints() {
            self.one_by_one(messages, settled, tx).await
        } else {
            self.at_once(messages, settled, tx).await
        }
    }

    /// The messages not yet settled, each under a savepoint of its own.
    pub(super) async fn one_by_one(
        &self,
        messages: &[&InboundMessage],
        settled: &mut [Option<Attempt>],
        mut tx: H::Tx,
    ) -> Round {
        let mut done: Vec<(usize, Attempt)> = Vec::new();
        for (at, message) in messages.iter().enumerate() {
            if settled[at].is_some() {
                continue;
            }
            match self.batch_step(message, tx).await {
                Step::Kept(kept, attempt) => {
                    tx = kept;
                    done.push((at, attempt));
                }
                Step::Full(kept) if !done.is_empty() => {
                    tx = kept;
                    break;
                }
                Step::Full(_) => return Round::Refused(alone_too_large()),
                Step::HandlerFailed(attempt) => {
                    settled[at] = Some(attempt);
                    return Round::HandlerFailed;
                }
                Step::Refused(error) => return Round::Refused(error),
            }
        }
        Self::commit_round(tx, done, settled).await
    }

    /// The messages not yet settled at once, with no savepoint: one claim
    /// of them all that records each it takes as consumed
    /// ([`Transaction::claim_completed_all`]: one write per message), one
    /// call of the handler ([`Handler::handle_batch`]), one commit. A
    /// message that has to be undone alone (a handler error, a gap, a
    /// transaction grown too large) drops it all: [`Round::Undo`].
    pub(super) async fn at_once(
        &self,
        messages: &[&InboundMessage],
        settled: &mut [Option<Attempt>],
        mut tx: H::Tx,
    ) -> Round {
        let open: Vec<usize> = (0..messages.len())
            .filter(|at| settled[*at].is_none())
            .collect();
        let mut requests = Vec::with_capacity(open.len());
        for at in &open {
            match self.claim_request(messages[*at]) {
                Ok(request) => requests.push(request),
                Err(error) => return Round::Refused(error),
            }
        }
        let answers = match tx
            .claim_completed_all(&requests, &consumed_response())
            .await
        {
            Ok(answers) if answers.len() == requests.len() => answers,
            Ok(_) => return Round::Refused(miscounted("claim_completed_all")),
            Err(
                StoreError::LostLease
                | StoreError::Rejected { .. }
                | StoreError::TooLarge { .. }
                | StoreError::InvalidInput(_),
            ) => return Round::Undo,
            Err(error) => return Round::Refused(error),
        };
        let mut done: Vec<(usize, Attempt)> = Vec::new();
        let mut taken: Vec<usize> = Vec::new();
        for (at, answer) in open.into_iter().zip(answers) {
            match answer {
                None => taken.push(at),
                // The claim wrote nothing to keep.
                Some(other) => done.push((at, self.unclaimed(other))),
            }
        }
        if !taken.is_empty() {
            let batch: Vec<&InboundMessage> = taken.iter().map(|at| messages[*at]).collect();
            let handled = match self.parts.handler.handle_batch(&batch, tx).await {
                Ok((next, handled)) if handled.len() == batch.len() => {
                    tx = next;
                    handled
                }
                // Which message failed is found one by one.
                _ => return Round::Undo,
            };
            if handled.iter().any(|h| matches!(h, Handled::Gap { .. })) || !tx.fits() {
                return Round::Undo;
            }
            for (at, handled) in taken.into_iter().zip(handled) {
                let consumed = match handled {
                    Handled::Applied => Settled::Applied,
                    _ => Settled::Stale,
                };
                done.push((at, Attempt::Done(consumed)));
            }
        }
        Self::commit_round(tx, done, settled).await
    }

    /// Commits a round's transaction, then settles what it took.
    pub(super) async fn commit_round(
        tx: H::Tx,
        done: Vec<(usize, Attempt)>,
        settled: &mut [Option<Attempt>],
    ) -> Round {
        match tx.commit().await {
            Ok(()) => {
                for (at, attempt) in done {
                    settled[at] = Some(attempt);
                }
                Round::Committed
            }
            Err(error) => Round::Refused(error),
        }
    }

    /// One message of a batch under its own savepoint: its claim, its
    /// handler, its completion.
    pub(super) async fn batch_step(&self, message: &InboundMessage, mut tx: H::Tx) -> Step<H::Tx> {
        if let Err(error) = tx.savepoint().await {
            return Step::Refused(error);
        }
        let request = match self.claim_request(message) {
            Ok(request) => request,
            Err(error) => return Step::Refused(error),
        };
        let lease = match tx.claim(&request).await {
            Ok(ClaimOutcome::Claimed { lease, .. }) => lease,
            Ok(other) => {
                let attempt = self.unclaimed(other);
                // The claim wrote nothing to keep.
                return match tx.release_savepoint().await {
                    Ok(()) => Step::Kept(tx, attempt),
                    Err(error) => Step::Refused(error),
                };
            }
            Err(error) => return Step::Refused(error),
        };
        let (mut tx, handled) = match self.parts.handler.handle(message, tx).await {
            Ok(handled) => handled,
            Err(error) => return Step::HandlerFailed(handler_failed(error.into_inner())),
        };
        let attempt = match handled {
            // A gap writes nothing and leaves no claim behind.
            Handled::Gap { current } => Err(Attempt::Gap(gap(current, message))),
            handled => match tx.complete(&lease, &handled.to_stored()).await {
                Ok(()) if handled == Handled::Applied => Ok(Attempt::Done(Settled::Applied)),
                Ok(()) => Ok(Attempt::Done(Settled::Stale)),
                Err(StoreError::LostLease) => Err(Attempt::Busy(self.parts.options.first_backoff)),
                Err(
                    error @ (StoreError::Rejected { .. }
                    | StoreError::TooLarge { .. }
                    | StoreError::InvalidInput(_)),
                ) => Err(Attempt::Failed(error.to_string())),
                Err(error) => return Step::Refused(error),
            },
        };
        // Whatever the message came to (a version check that found its
        // aggregate written already in this transaction answers a gap),
        // a transaction it made too large goes on without it.
        if !tx.fits() {
            return match tx.rollback_to_savepoint().await {
                Ok(()) => Step::Full(tx),
                Err(error) => Step::Refused(error),
            };
        }
        let (closed, attempt) = match attempt {
            Ok(attempt) => (tx.release_savepoint().await, attempt),
            Err(attempt) => (tx.rollback_to_savepoint().await, attempt),
        };
        match closed {
            Ok(()) => Step::Kept(tx, attempt),
            Err(error) => Step::Refused(error),
        }
    }

    /// Settles a batch's deliveries after its commit: those to deliver
    /// again first, then the parked, then every acknowledgement at once.
    pub(super) async fn settle_batch<D: Delivery>(
        &self,
        batch: &[D],
        attempts: Vec<Attempt>,
        parked: bool,
    ) -> Vec<Result<Settled, ConsumerError>> {
        let mut settled = Vec::with_capacity(batch.len());
        let mut acks = Vec::new();
        let mut releases = Vec::new();
        for (at, (delivery, attempt)) in batch.iter().zip(attempts).enumerate() {
            let span = self.delivery_span(delivery);
            let result = self
                .settle_attempt(delivery, attempt)
                .instrument(span.clone())
                .await;
            if let Ok(settlement) = &result {
                if settlement.ack {
                    acks.push(at);
                }
                // With nothing parked before, only a gap this batch parked
                // has anything behind it (itself) to release.
                if settlement.release
                    && (parked || matches!(settlement.consumed, Settled::Parked { .. }))
                {
                    releases.push(at);
                }
            }
            settled.push((span, result.map(|settlement| settlement.consumed)));
        }
        let acked: Vec<&D> = acks.iter().map(|at| &batch[*at]).collect();
        let broker = D::ack_all(&acked).await.err();
        let mut results = Vec::with_capacity(batch.len());
        for (at, (span, result)) in settled.into_iter().enumerate() {
            let result = match (result, &broker) {
                (Ok(_), Some(error)) if acks.contains(&at) => {
                    Err(ConsumerError::Broker(error.copied()))
                }
                (result, _) => result,
            };
            self.settled(&span, &batch[at], &result);
            results.push(result);
        }
        // Whether or not the acks got through: what committed or parked
        // stands either way.
        for at in releases {
            self.release_behind(batch[at].message()).await;
        }
        results
    }
}
