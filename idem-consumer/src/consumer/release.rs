//! What waits behind an applied event: the parked later versions of its
//! aggregate replayed while they apply, the aggregates stuck behind a gap
//! (listed, swept), and the operators' replay and drop.

use super::settle::Attempt;
use super::*;

/// How a version gap's reason begins: the consumer writes it when it parks
/// a gap, and reads it to tell a parked gap from a failure.
pub(super) const GAP: &str = "version gap: the aggregate is at ";

pub(super) fn gap(current: u64, message: &InboundMessage) -> String {
    format!(
        "{GAP}{current}, the event at {}",
        message.version().unwrap_or_default()
    )
}

/// An aggregate whose oldest parked version is a version gap
/// ([`Consumer::stuck`]): it waits for a version that no parked message
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stuck {
    /// The aggregate.
    pub aggregate: String,
    /// The version it was at when its oldest parked version was parked.
    pub at: u64,
    /// The version its parked messages wait for: the one after
    /// [`at`](Self::at).
    pub waiting_for: u64,
    /// Its oldest parked version.
    pub oldest_parked: u64,
    /// How many of its messages are parked (up to
    /// [`MAX_OUTBOX_BATCH`](idem_core::store::MAX_OUTBOX_BATCH)).
    pub parked: usize,
    /// When its oldest parked version was (last) parked.
    pub since: idem_core::store::Timestamp,
}

impl Stuck {
    /// The stuck aggregates of `consumer` in `parking`, as
    /// [`Consumer::stuck`] finds them (for a tool that has the parking
    /// store and not the consumer): among its `limit` oldest parked
    /// messages, one listing, then one per aggregate found.
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn find(
        parking: &dyn ParkingStore,
        consumer: &ConsumerName,
        limit: usize,
    ) -> Result<Vec<Self>, StoreError> {
        let oldest = parking
            .parked(&ParkedQuery::new(consumer.clone()).limit(limit))
            .await?;
        let mut seen = std::collections::HashSet::new();
        let mut stuck = Vec::new();
        for entry in &oldest {
            let message = &entry.parked.message;
            let (Some(aggregate), Some(_)) = (message.aggregate(), message.version()) else {
                continue;
            };
            if !seen.insert(aggregate) {
                continue;
            }
            let query = ParkedQuery::new(consumer.clone())
                .of_aggregate(aggregate)
                .limit(idem_core::store::MAX_OUTBOX_BATCH);
            let own = parking.parked(&query).await?;
            let Some(first) = own.first() else { continue };
            let (Some(at), Some(version)) = (
                gap_behind(&first.parked.reason),
                first.parked.message.version(),
            ) else {
                continue;
            };
            stuck.push(Self {
                aggregate: aggregate.to_string(),
                at,
                waiting_for: at.saturating_add(1),
                oldest_parked: version,
                parked: own.len(),
                since: first.parked_at,
            });
        }
        Ok(stuck)
    }
}

/// The version a parked gap's aggregate was at, if `reason` is a gap's.
fn gap_behind(reason: &str) -> Option<u64> {
    let rest = reason.strip_prefix(GAP)?;
    rest.split(',').next()?.parse().ok()
}

impl<H: Handler> Consumer<H> {
    /// After `message` applied (or parked as a gap): releases its
    /// aggregate ([`release`](Self::release)); a failure is logged, and
    /// left to the next release of the aggregate or to the sweep
    /// ([`ConsumerOptions::release_interval`]).
    pub(super) async fn release_behind(&self, message: &InboundMessage) {
        let (Some(aggregate), Some(_)) = (message.aggregate(), message.version()) else {
            return;
        };
        if let Err(error) = self.release(aggregate).await {
            tracing::warn!(%error, "could not release what waits behind an event");
        }
    }

    /// Whether the consumer has any message parked: one listing of at
    /// most one entry (a failed listing answers yes). Asked after a
    /// batch's commit, a "no" misses nothing that releasing each of its
    /// aggregates would have found: an entry parked after it is a failure
    /// (whose predecessor applied before it was tried) or a gap, which
    /// releases its aggregate itself once parked.
    pub(super) async fn anything_parked(&self) -> bool {
        let query = ParkedQuery::new(self.parts.name.clone()).limit(1);
        match self.parts.parking.parked(&query).await {
            Ok(found) => !found.is_empty(),
            Err(_) => true,
        }
    }

    /// Replays `aggregate`'s parked messages in version order while they
    /// apply (or turn out stale or applied before), listing them again
    /// until none is left or one does not apply (a gap still, or a
    /// failure): what an applied event does for the later versions parked
    /// behind it, and what a parked gap does for itself, so that a gap
    /// parked while its predecessor was being applied and released is
    /// never missed by both. A parked message that another delivery or
    /// replay holds is waited for (it may have read the aggregate before
    /// the version this release follows), up to twice the inbox lease.
    /// Answers how many it replayed.
    ///
    /// Run by the consumer after each applied event and parked gap, and
    /// for every aggregate whose oldest parked version is a gap by
    /// [`run`](Self::run)'s sweep; call it to release an aggregate whose
    /// missing version you applied by hand.
    ///
    /// # Errors
    ///
    /// The parking store's or the inbox's failure (what is left stays
    /// parked, for the next release).
    pub async fn release(&self, aggregate: &str) -> Result<usize, ConsumerError> {
        let mut replayed = 0;
        loop {
            let query = ParkedQuery::new(self.parts.name.clone())
                .of_aggregate(aggregate)
                .limit(self.parts.options.release_batch);
            let waiting = self.parts.parking.parked(&query).await?;
            let before = replayed;
            for entry in &waiting {
                match self.replay_waiting(entry).await? {
                    // Resolved meanwhile by another release: on to the next.
                    None => {}
                    Some(Settled::Applied | Settled::Stale | Settled::Duplicate) => {
                        replayed += 1;
                    }
                    Some(_) => return Ok(replayed),
                }
            }
            // Every one replayed: more may wait (past the listing's limit,
            // or parked since). None (or none left): done.
            if replayed == before {
                return Ok(replayed);
            }
        }
    }

    /// Replays a parked message, waiting out whoever holds its inbox
    /// claim (with a doubling pause, up to twice the inbox lease).
    pub(super) async fn replay_waiting(
        &self,
        entry: &ParkedMessage,
    ) -> Result<Option<Settled>, ConsumerError> {
        let patience = tokio::time::Instant::now() + self.parts.options.lease.saturating_mul(2);
        let mut pause = Duration::from_millis(10);
        loop {
            let consumed = self.replay_entry(entry).await?;
            let Some(Settled::InProgress { after }) = consumed else {
                return Ok(consumed);
            };
            let now = tokio::time::Instant::now();
            if now >= patience {
                return Ok(Some(Settled::InProgress { after }));
            }
            tokio::time::sleep(pause.min(after).min(patience - now)).await;
            pause = pause.saturating_mul(2).min(Duration::from_secs(1));
        }
    }

    /// The aggregates whose oldest parked version is a version gap, found
    /// among this consumer's `limit` oldest parked messages (one listing,
    /// then one per aggregate found): each waits for a version that no
    /// parked message holds. Most are released as soon as that version
    /// applies; one still listed after a sweep
    /// ([`ConsumerOptions::release_interval`]) waits for a message that
    /// never came, or that a consumer could not apply. An operator applies
    /// or publishes it again, then [`release`](Self::release)s the
    /// aggregate, or drops ([`drop_parked`](Self::drop_parked)) what waits.
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn stuck(&self, limit: usize) -> Result<Vec<Stuck>, StoreError> {
        Stuck::find(&*self.parts.parking, &self.parts.name, limit).await
    }

    /// One sweep: releases every stuck aggregate, and records how many
    /// stay stuck ([`STUCK`](crate::STUCK)).
    pub(super) async fn sweep(&self) -> Result<usize, ConsumerError> {
        let limit = self.parts.options.release_batch;
        for stuck in self.stuck(limit).await? {
            self.release(&stuck.aggregate).await?;
        }
        let left = self.stuck(limit).await?.len();
        crate::record_stuck(&self.parts.name, left);
        Ok(left)
    }

    /// This consumer's parked messages, oldest first (of one aggregate by
    /// version, if given).
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn parked(
        &self,
        aggregate: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ParkedMessage>, StoreError> {
        let mut query = ParkedQuery::new(self.parts.name.clone()).limit(limit);
        query.aggregate = aggregate.map(str::to_string);
        self.parts.parking.parked(&query).await
    }

    /// Replays a parked message through the handler, as a delivery would:
    /// applied (or found stale or applied before), it is resolved
    /// replayed; failing, it stays parked with the new reason. `None` when
    /// no such message is parked.
    ///
    /// # Errors
    ///
    /// A store failure (the message stays parked).
    pub async fn replay(&self, id: &IdempotencyKey) -> Result<Option<Settled>, ConsumerError> {
        let Some(entry) = self.parts.parking.get(&self.parts.name, id).await? else {
            return Ok(None);
        };
        let consumed = self.replay_entry(&entry).await?;
        if consumed == Some(Settled::Applied) {
            self.release_behind(&entry.parked.message).await;
        }
        Ok(consumed)
    }

    pub(super) async fn replay_entry(
        &self,
        entry: &ParkedMessage,
    ) -> Result<Option<Settled>, ConsumerError> {
        if entry.state != idem_core::store::ParkedState::Parked {
            return Ok(None);
        }
        let message = &entry.parked.message;
        let consumed = match self.attempt(message).await {
            Attempt::Done(consumed) => {
                self.parts
                    .parking
                    .resolve(&self.parts.name, message.id(), &Resolution::Replayed)
                    .await?;
                consumed
            }
            Attempt::Busy(after) => Settled::InProgress { after },
            Attempt::Unavailable(error) => return Err(error.into()),
            Attempt::Failed(reason) | Attempt::Gap(reason) | Attempt::Poison(reason) => {
                let deliveries = entry.parked.deliveries.saturating_add(1);
                self.park(message, &reason, deliveries).await?;
                Settled::Parked { reason }
            }
        };
        Ok(Some(consumed))
    }

    /// Drops a parked message with `reason` (kept); whether it was parked.
    ///
    /// # Errors
    ///
    /// The parking store's.
    pub async fn drop_parked(&self, id: &IdempotencyKey, reason: &str) -> Result<bool, StoreError> {
        let dropped = Resolution::Dropped(reason.to_string());
        self.parts
            .parking
            .resolve(&self.parts.name, id, &dropped)
            .await
    }
}
