//! One delivery: its attempt (the inbox claim, the handler and the commit)
//! and its settlement: acknowledged, asked for again after a back-off, or
//! parked at the consumer's own count of failed attempts.

use super::release::gap;
use super::*;

/// Why a message's claim was refused for good.
pub(super) const MISMATCH: &str = "its message id was consumed before with another payload";
/// How a permanent failure's reason begins ([`Permanent`](crate::Permanent)).
pub(super) const PERMANENT: &str = "permanent: ";
/// How a malformed message's reason begins ([`Delivery::malformed`]).
pub(super) const MALFORMED: &str = "malformed: ";

/// What a handler's error makes of its message's attempt: parked at once
/// when it says no redelivery can fix it ([`Permanent`](crate::Permanent)),
/// else a failure that counts toward parking.
pub(super) fn handler_failed(error: idem_core::BoxError) -> Attempt {
    match error.downcast_ref::<crate::Permanent>() {
        Some(permanent) => Attempt::Poison(format!("{PERMANENT}{permanent}")),
        None => Attempt::Failed(error.to_string()),
    }
}

/// How a delivery was settled, short of its ack.
pub(super) struct Settlement {
    pub(super) consumed: Settled,
    /// Whether it is to be acknowledged.
    pub(super) ack: bool,
    /// Whether its aggregate's parked later versions are to be replayed.
    pub(super) release: bool,
}

impl Settlement {
    /// Asked of the broker again: not acknowledged, nothing released.
    fn unacked(consumed: Settled) -> Self {
        Self {
            consumed,
            ack: false,
            release: false,
        }
    }
}

/// How one attempt at a message ended, before the delivery is settled.
pub(super) enum Attempt {
    Done(Settled),
    /// The message's fault: counts toward parking.
    Failed(String),
    /// A version gap: counts toward parking; parked, its aggregate is
    /// released, as its predecessor may have applied meanwhile.
    Gap(String),
    /// Not the message's fault (the store): delivered again, never parked.
    Unavailable(StoreError),
    Busy(Duration),
    /// Never applicable (its id was seen with another payload): parked now.
    Poison(String),
}

impl<H: Handler> Consumer<H> {
    /// Consumes one delivery and settles it.
    ///
    /// Dropped mid-way (as a process dies), its transaction rolls back, its
    /// inbox claim is released (see
    /// [`Idempotency::run_in`](idem_core::Idempotency::run_in)) and the
    /// delivery stays unsettled, so the broker delivers it again; what
    /// committed never lacks its settlement's effect (a redelivery of it is
    /// a duplicate). [`run`](Self::run) runs each delivery in a task of its
    /// own, so dropping `run` never cuts one.
    ///
    /// # Errors
    ///
    /// A store or broker failure: the delivery is then unsettled (or asked
    /// for again) and the broker delivers it again.
    pub async fn consume<D: Delivery + ?Sized>(
        &self,
        delivery: &D,
    ) -> Result<Settled, ConsumerError> {
        let span = self.delivery_span(delivery);
        let result = self.settle(delivery).instrument(span.clone()).await;
        self.settled(&span, delivery, &result);
        result
    }

    pub(super) async fn settle<D: Delivery + ?Sized>(
        &self,
        delivery: &D,
    ) -> Result<Settled, ConsumerError> {
        let attempt = match delivery.malformed() {
            Some(reason) => Attempt::Poison(format!("{MALFORMED}{reason}")),
            None => {
                self.keeping(&[delivery], self.attempt(delivery.message()))
                    .await
            }
        };
        let settlement = self.settle_attempt(delivery, attempt).await?;
        // Released whether or not the ack gets through: what committed (or
        // parked) stands either way.
        let acked = match settlement.ack {
            true => delivery.ack().await,
            false => Ok(()),
        };
        if settlement.release {
            self.release_behind(delivery.message()).await;
        }
        acked?;
        Ok(settlement.consumed)
    }

    /// Settles one attempt short of its ack: what it was, whether it is to
    /// be acknowledged, and whether its aggregate is to be released.
    ///
    /// A failure counts toward parking by the consumer's own count of
    /// failed attempts at the message ([`Failures`](crate::failures::Failures)),
    /// never by the broker's count of deliveries, which also counts copies
    /// no consumer settled.
    pub(super) async fn settle_attempt<D: Delivery + ?Sized>(
        &self,
        delivery: &D,
        attempt: Attempt,
    ) -> Result<Settlement, ConsumerError> {
        let message = delivery.message();
        let failures = &self.parts.failures;
        let parks_at = self.parts.options.max_deliveries;
        let (consumed, release) = match attempt {
            Attempt::Done(consumed) => {
                failures.forget(message.id());
                // A duplicate too: the consumer that applied it may have
                // died before it released what waits behind it.
                let release = matches!(consumed, Settled::Applied | Settled::Duplicate);
                (consumed, release)
            }
            Attempt::Busy(after) => {
                delivery.retry(after).await?;
                return Ok(Settlement::unacked(Settled::InProgress { after }));
            }
            Attempt::Unavailable(error) => {
                // Not the message's fault: paced by the broker's count, as
                // a store that stays away is, never parked for it.
                let after = self.parts.options.delay_after(delivery.deliveries());
                delivery.retry(after).await?;
                let reason = error.to_string();
                return Ok(Settlement::unacked(Settled::Retried { after, reason }));
            }
            Attempt::Failed(reason) | Attempt::Gap(reason)
                if failures.count(message.id()).saturating_add(1) < parks_at =>
            {
                let after = self.parts.options.delay_after(failures.fail(message.id()));
                delivery.retry(after).await?;
                return Ok(Settlement::unacked(Settled::Retried { after, reason }));
            }
            Attempt::Gap(reason) => {
                let tried = failures.count(message.id()).saturating_add(1);
                self.park(message, &reason, tried).await?;
                failures.forget(message.id());
                (Settled::Parked { reason }, true)
            }
            Attempt::Failed(reason) | Attempt::Poison(reason) => {
                let tried = failures.count(message.id()).saturating_add(1);
                self.park(message, &reason, tried).await?;
                failures.forget(message.id());
                (Settled::Parked { reason }, false)
            }
        };
        Ok(Settlement {
            consumed,
            ack: true,
            release,
        })
    }

    /// A message's inbox claim.
    pub(super) fn claim_request(
        &self,
        message: &InboundMessage,
    ) -> Result<ClaimRequest, StoreError> {
        let scope = Scope::new(self.parts.name.inbox_tenant(), message.id().clone());
        ClaimRequest::new(scope, Fingerprint::of_bytes(message.payload()))
            .with_lease(self.parts.options.lease)
            .and_then(|request| request.with_retention(self.parts.options.retention))
            .map_err(StoreError::from)
    }

    /// What a claim that did not claim makes of its message.
    pub(super) fn unclaimed(&self, outcome: ClaimOutcome) -> Attempt {
        match outcome {
            ClaimOutcome::Completed(_) => Attempt::Done(Settled::Duplicate),
            ClaimOutcome::InProgress { retry_after } => Attempt::Busy(retry_after),
            ClaimOutcome::Mismatch => Attempt::Poison(MISMATCH.to_string()),
            _ => Attempt::Busy(self.parts.options.first_backoff),
        }
    }

    /// A delivery's span, `idem.consume`.
    pub(super) fn delivery_span<D: Delivery + ?Sized>(&self, delivery: &D) -> tracing::Span {
        let message = delivery.message();
        tracing::info_span!(
            "idem.consume",
            consumer = %self.parts.name,
            message_hash = %message.id().redacted(),
            kind = message.kind(),
            deliveries = delivery.deliveries(),
            outcome = field::Empty,
        )
    }

    /// Records a settled delivery on its span and in the metrics.
    pub(super) fn settled<D: Delivery + ?Sized>(
        &self,
        span: &tracing::Span,
        delivery: &D,
        result: &Result<Settled, ConsumerError>,
    ) {
        match result {
            Ok(consumed) => {
                span.record("outcome", consumed.as_str());
                crate::record(&self.parts.name, consumed, delivery.published_at());
            }
            Err(_) => {
                span.record("outcome", "error");
            }
        }
    }

    pub(super) async fn park(
        &self,
        message: &InboundMessage,
        reason: &str,
        deliveries: u32,
    ) -> Result<(), StoreError> {
        let parked = NewParked {
            consumer: self.parts.name.clone(),
            message: message.clone(),
            reason: reason.to_string(),
            deliveries,
        };
        self.parts.parking.park(&parked).await.map(drop)
    }

    /// One attempt: the inbox claim, the handler and the commit.
    pub(super) async fn attempt(&self, message: &InboundMessage) -> Attempt {
        let scope = Scope::new(self.parts.name.inbox_tenant(), message.id().clone());
        let fingerprint = Fingerprint::of_bytes(message.payload());
        let handler = &self.parts.handler;
        let run = self
            .parts
            .idem
            .run_in(scope, fingerprint, handler.begin(), |_ctx, tx| async move {
                let (tx, handled) = handler.handle(message, tx).await?;
                let verdict = match handled {
                    // A gap writes nothing and frees the claim for the
                    // next delivery.
                    Handled::Gap { .. } => Verdict::Release(handled),
                    _ => Verdict::Store(handled),
                };
                Ok((tx, verdict))
            })
            .await;
        match run {
            Ok(RunOutcome::Executed(Handled::Gap { current })) => {
                Attempt::Gap(gap(current, message))
            }
            Ok(RunOutcome::Executed(Handled::Stale { .. })) => Attempt::Done(Settled::Stale),
            Ok(RunOutcome::Executed(_)) => Attempt::Done(Settled::Applied),
            Ok(RunOutcome::Replayed(_)) => Attempt::Done(Settled::Duplicate),
            Err(RunError::InProgress { retry_after }) => Attempt::Busy(retry_after),
            Err(RunError::Mismatch) => Attempt::Poison(MISMATCH.to_string()),
            Err(RunError::NotStarted(error) | RunError::Failed(error)) => handler_failed(error),
            Err(RunError::LostLease) => Attempt::Busy(self.parts.options.first_backoff),
            Err(RunError::Store(error)) => match error {
                // The handler's own writes refused at commit: the message's fault.
                StoreError::Rejected { .. } => Attempt::Failed(error.to_string()),
                other => Attempt::Unavailable(other),
            },
            Err(other) => Attempt::Unavailable(StoreError::backend(
                "consumer",
                idem_core::Operation::Claim,
                other.to_string(),
            )),
        }
    }
}
