//! An outbox store of one's own, written against [`idem_core::store`]
//! alone, with the realistic bugs the public outbox suite must catch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    BatchClaim, Capabilities, Clock, ClockSource, Durability, MessageId, MessageParts,
    MessageState, NewMessage, OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PublishFailure,
    SystemClock, Timestamp, TransactionSharing, validate_lease, validate_outbox_batch,
};
use idem_core::{StoreError, async_trait};

use crate::Rivals;

/// A deliberate bug of an outbox store, for proving that the outbox suite
/// catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutboxDefect {
    /// No bug: the store keeps the whole contract.
    None,
    /// Numbers messages across the whole outbox, not per aggregate.
    GlobalSequence,
    /// Stores a message again when its id is enqueued twice.
    DuplicateIds,
    /// Claims every pending message of an aggregate, not its head alone.
    WholeAggregate,
    /// Claims aggregates that another relay holds.
    IgnoresLeases,
    /// Never lets a lapsed claim go to another relay.
    NoTakeover,
    /// Marks sent whatever relay asks.
    SentIgnoresOwner,
    /// Makes a failed message available at once, whatever its back-off.
    NoBackOff,
    /// Parks the message but lets the rest of its aggregate flow.
    ParkedAggregateFlows,
    /// Fails whoever asks.
    FailureIgnoresOwner,
    /// Keeps the attempts of a retried message.
    RetryKeepsAttempts,
    /// Drops the message but forgets it was dropped: it flows again.
    DropResends,
    /// Purges whatever is old, sent or not.
    PurgesUnsent,
    /// Ignores `older_than` when purging.
    PurgeIgnoresAge,
    /// Counts parked messages as pending.
    StatsMixParked,
    /// Accepts any batch limit.
    LimitUnchecked,
    /// Reads and writes a claim under two acquisitions of the lock, a
    /// rival's read between them.
    NonAtomicClaim,
    /// Never claims past what the claiming owner holds.
    NoClaimAhead,
    /// Gives a message claimed ahead a lease of its own.
    FreshLeaseAhead,
    /// Claims past a message its owner's lease left (freed or lapsed), as
    /// if the owner still held it.
    AheadPastFreed,
    /// Frees whatever relay asks.
    ReleaseIgnoresOwner,
    /// Counts a release as a failed attempt.
    ReleaseCountsAttempt,
    /// Keeps leases in whole seconds, so a lease under a second is none.
    LeaseInWholeSeconds,
    /// Lets a lapsed owner mark its message sent while nobody claimed it.
    SentAfterLapse,
    /// Gives a retried message its aggregate's next sequence, as if new.
    RetryRequeues,
    /// Drops sent messages too.
    DropsSent,
    /// Drops a message without keeping the reason.
    DropLosesReason,
    /// Ages a dropped message from its enqueue, not from its drop.
    PurgeAgesDropsFromEnqueue,
    /// Numbers an aggregate from the messages it still stores, so a purge
    /// starts its sequence again.
    SequenceRestartsAfterPurge,
    /// Ends leases by the process's clock and judges them by the store's.
    LeaseOnProcessClock,
    /// Ages the backlog from parked messages too.
    StatsAgeCountsParked,
    /// Ages the backlog from sent messages too.
    StatsAgeCountsSent,
    /// Takes the heads of the lowest sequences first, not the oldest.
    HeadsBySequence,
    /// Purges only messages strictly older than asked.
    PurgeStrictlyOlder,
    /// Clears the last error when a message is released.
    ReleaseClearsError,
    /// Leaves a retried message waiting out its back-off.
    RetryKeepsBackOff,
    /// Clears the last error when a message is retried.
    RetryClearsError,
}

#[derive(Default)]
struct State {
    messages: Vec<OutboxMessage>,
    last_sequence: u64,
    /// Each aggregate's last sequence.
    sequences: HashMap<String, u64>,
}

/// The outbox store: a list under one lock, on the system clock.
pub struct OwnOutbox {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    defect: OutboxDefect,
    rivals: Rivals<()>,
}

impl std::fmt::Debug for OwnOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnOutbox")
            .field("defect", &self.defect)
            .finish_non_exhaustive()
    }
}

impl Default for OwnOutbox {
    fn default() -> Self {
        Self::with_defect(OutboxDefect::None)
    }
}

impl OwnOutbox {
    /// A correct store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store with `defect`.
    pub fn with_defect(defect: OutboxDefect) -> Self {
        Self {
            state: Mutex::default(),
            clock: Arc::new(SystemClock),
            defect,
            rivals: Rivals::default(),
        }
    }

    /// The same store on `clock`, the store's own.
    #[must_use]
    pub fn on_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn locked(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is(&self, defect: OutboxDefect) -> bool {
        self.defect == defect
    }

    /// The messages a claim by `owner` at `now` takes, by index, each with
    /// its lease's end (`until`, or the earliest of the owner's leases it
    /// was claimed past).
    fn due(
        &self,
        messages: &[OutboxMessage],
        owner: OwnerToken,
        now: Timestamp,
        until: Timestamp,
        limit: usize,
    ) -> Vec<(usize, Timestamp)> {
        let mut due = Vec::new();
        // Per aggregate seen: the lease a message past the owner's run
        // takes, or None once its claimable message was found.
        let mut runs: Vec<(&str, Option<Timestamp>)> = Vec::new();
        let mut order: Vec<usize> = (0..messages.len()).collect();
        order.sort_by_key(|&i| {
            (
                messages[i].parts().sequence,
                messages[i].parts().enqueued_at,
            )
        });
        for i in order {
            let m = &messages[i];
            let aggregate = m.message().aggregate();
            if matches!(m.state(), MessageState::Sent | MessageState::Dropped) {
                continue;
            }
            if m.state() == MessageState::Parked && self.is(OutboxDefect::ParkedAggregateFlows) {
                continue;
            }
            let run = match runs.iter().position(|(a, _)| *a == aggregate) {
                Some(k) => k,
                None => {
                    runs.push((aggregate, Some(until)));
                    runs.len() - 1
                }
            };
            let passing = runs[run].1;
            if passing.is_none() && !self.is(OutboxDefect::WholeAggregate) {
                continue;
            }
            let lease_until = passing.unwrap_or(until);
            let held = if self.is(OutboxDefect::AheadPastFreed) {
                m.parts().lease_owner == Some(owner)
            } else {
                m.is_held_by(owner, now)
            };
            if m.state() == MessageState::Pending && held && !self.is(OutboxDefect::NoClaimAhead) {
                let earliest = m
                    .parts()
                    .lease_until
                    .map_or(lease_until, |u| u.min(lease_until));
                runs[run].1 = Some(if self.is(OutboxDefect::FreshLeaseAhead) {
                    until
                } else {
                    earliest
                });
                continue;
            }
            runs[run].1 = None;
            let leased = m
                .parts()
                .lease_until
                .is_some_and(|until| until > now || self.is(OutboxDefect::NoTakeover));
            if m.state() == MessageState::Pending
                && (!leased || self.is(OutboxDefect::IgnoresLeases))
                && m.parts().available_at <= now
            {
                due.push((i, lease_until));
            }
        }
        if !self.is(OutboxDefect::HeadsBySequence) {
            due.sort_by_key(|&(i, _)| (messages[i].parts().enqueued_at, messages[i].id()));
        }
        due.truncate(limit);
        due
    }
}

fn edited(message: &OutboxMessage, edit: impl FnOnce(&mut MessageParts)) -> OutboxMessage {
    let mut parts = message.parts().clone();
    edit(&mut parts);
    OutboxMessage::new(message.message().clone(), parts)
}

#[async_trait]
impl OutboxStore for OwnOutbox {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        if !self.is(OutboxDefect::DuplicateIds)
            && let Some(existing) = state.messages.iter().find(|m| m.id() == message.id())
        {
            return Ok(existing.clone());
        }
        let sequence = if self.is(OutboxDefect::GlobalSequence) {
            state.last_sequence += 1;
            state.last_sequence
        } else if self.is(OutboxDefect::SequenceRestartsAfterPurge) {
            1 + state
                .messages
                .iter()
                .filter(|m| m.message().aggregate() == message.aggregate())
                .map(|m| m.parts().sequence)
                .max()
                .unwrap_or(0)
        } else {
            next_sequence(&mut state, message.aggregate())
        };
        let stored = OutboxMessage::new(
            message.clone(),
            MessageParts {
                sequence,
                state: MessageState::Pending,
                attempts: 0,
                last_error: None,
                enqueued_at: now,
                available_at: now,
                lease_owner: None,
                lease_until: None,
                sent_at: None,
            },
        );
        state.messages.push(stored.clone());
        Ok(stored)
    }

    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError> {
        let BatchClaim {
            owner,
            lease,
            limit,
            ..
        } = *batch;
        let mut lease = validate_lease(lease)?;
        if self.is(OutboxDefect::LeaseInWholeSeconds) {
            lease = Duration::from_secs(lease.as_secs());
        }
        let limit = if self.is(OutboxDefect::LimitUnchecked) {
            limit.max(1)
        } else {
            validate_outbox_batch(limit)?
        };
        let now = self.clock.now();
        let until = if self.is(OutboxDefect::LeaseOnProcessClock) {
            SystemClock.now() + lease
        } else {
            now + lease
        };
        if self.is(OutboxDefect::NonAtomicClaim) {
            // Decided under one acquisition of the lock, written under
            // another, held between them until a rival claim has read too.
            let due = self.due(&self.locked().messages, owner, now, until, limit);
            let _reading = self.rivals.meet(&()).await;
            return Ok(take(&mut self.locked(), &due, owner));
        }
        let mut state = self.locked();
        let due = self.due(&state.messages, owner, now, until, limit);
        Ok(take(&mut state, &due, owner))
    }

    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let mut marked = 0;
        for m in state.messages.iter_mut() {
            let held = m.parts().lease_owner == Some(owner)
                && (m.parts().lease_until.is_some_and(|u| u > now)
                    || self.is(OutboxDefect::SentAfterLapse));
            if ids.contains(&m.id())
                && m.state() == MessageState::Pending
                && (held || self.is(OutboxDefect::SentIgnoresOwner))
            {
                *m = edited(m, |p| {
                    p.state = MessageState::Sent;
                    p.sent_at = Some(now);
                    p.lease_until = None;
                });
                marked += 1;
            }
        }
        Ok(marked)
    }

    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let mut released = 0;
        for m in state.messages.iter_mut() {
            let held = m.is_held_by(owner, now)
                || (self.is(OutboxDefect::ReleaseIgnoresOwner)
                    && m.parts().lease_until > Some(now));
            if ids.contains(&m.id()) && m.state() == MessageState::Pending && held {
                let counted = self.is(OutboxDefect::ReleaseCountsAttempt);
                let cleared = self.is(OutboxDefect::ReleaseClearsError);
                *m = edited(m, |p| {
                    p.lease_until = None;
                    if counted {
                        p.attempts += 1;
                    }
                    if cleared {
                        p.last_error = None;
                    }
                });
                released += 1;
            }
        }
        Ok(released)
    }

    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let Some(m) = state.messages.iter_mut().find(|m| m.id() == failure.id) else {
            return Err(StoreError::LostLease);
        };
        let held = m.is_held_by(failure.owner, now);
        if m.state() != MessageState::Pending
            || !(held || self.is(OutboxDefect::FailureIgnoresOwner))
        {
            return Err(StoreError::LostLease);
        }
        let mut counted = failure.clone();
        if self.is(OutboxDefect::NoBackOff) {
            counted.retry_after = Duration::ZERO;
        }
        *m = m.failed(&counted, now);
        Ok(m.state())
    }

    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = if self.is(OutboxDefect::LimitUnchecked) {
            limit.max(1)
        } else {
            validate_outbox_batch(limit)?
        };
        let state = self.locked();
        Ok(state
            .messages
            .iter()
            .filter(|m| m.state() == MessageState::Parked)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let Some(m) = state.messages.iter_mut().find(|m| m.id() == id) else {
            return Ok(false);
        };
        if m.state() != MessageState::Parked {
            return Ok(false);
        }
        let keep = self.is(OutboxDefect::RetryKeepsAttempts);
        let waits = self.is(OutboxDefect::RetryKeepsBackOff);
        let clears = self.is(OutboxDefect::RetryClearsError);
        *m = edited(m, |p| {
            p.state = MessageState::Pending;
            if !keep {
                p.attempts = 0;
            }
            if !waits {
                p.available_at = now;
            }
            if clears {
                p.last_error = None;
            }
        });
        if self.is(OutboxDefect::RetryRequeues) {
            let aggregate = m.message().aggregate().to_string();
            let sequence = next_sequence(&mut state, &aggregate);
            if let Some(m) = state.messages.iter_mut().find(|m| m.id() == id) {
                *m = edited(m, |p| {
                    p.sequence = sequence;
                    p.enqueued_at = now;
                });
            }
        }
        Ok(true)
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let Some(m) = state.messages.iter_mut().find(|m| m.id() == id) else {
            return Ok(false);
        };
        let droppable = matches!(m.state(), MessageState::Pending | MessageState::Parked)
            || (self.is(OutboxDefect::DropsSent) && m.state() == MessageState::Sent);
        if !droppable {
            return Ok(false);
        }
        let resend = self.is(OutboxDefect::DropResends);
        let forget = self.is(OutboxDefect::DropLosesReason);
        *m = edited(m, |p| {
            p.state = if resend {
                MessageState::Pending
            } else {
                MessageState::Dropped
            };
            if !forget {
                p.last_error = Some(reason.to_string());
            }
            p.lease_until = None;
            p.sent_at = Some(now);
        });
        Ok(true)
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        Ok(self
            .locked()
            .messages
            .iter()
            .find(|m| m.id() == id)
            .cloned())
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = if self.is(OutboxDefect::LimitUnchecked) {
            limit.max(1)
        } else {
            validate_outbox_batch(limit)?
        };
        let older_than = if self.is(OutboxDefect::PurgeIgnoresAge) {
            Duration::ZERO
        } else {
            older_than
        };
        let cutoff = self.clock.now() - older_than;
        let mut state = self.locked();
        let mut purged = 0;
        state.messages.retain(|m| {
            let done = matches!(m.state(), MessageState::Sent | MessageState::Dropped)
                || self.is(OutboxDefect::PurgesUnsent);
            let at = if m.state() == MessageState::Dropped
                && self.is(OutboxDefect::PurgeAgesDropsFromEnqueue)
            {
                m.parts().enqueued_at
            } else {
                m.parts().sent_at.unwrap_or(m.parts().enqueued_at)
            };
            let old = if self.is(OutboxDefect::PurgeStrictlyOlder) {
                at < cutoff
            } else {
                at <= cutoff
            };
            if done && old && purged < limit {
                purged += 1;
                false
            } else {
                true
            }
        });
        Ok(purged as u64)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let now = self.clock.now();
        let state = self.locked();
        let counted = |m: &&OutboxMessage| {
            m.state() == MessageState::Pending
                || (self.is(OutboxDefect::StatsMixParked) && m.state() == MessageState::Parked)
        };
        let pending: Vec<&OutboxMessage> = state.messages.iter().filter(counted).collect();
        let parked = state
            .messages
            .iter()
            .filter(|m| m.state() == MessageState::Parked)
            .count() as u64;
        let aged = |m: &&OutboxMessage| match m.state() {
            MessageState::Pending => true,
            MessageState::Parked => self.is(OutboxDefect::StatsAgeCountsParked),
            MessageState::Sent => self.is(OutboxDefect::StatsAgeCountsSent),
            _ => false,
        };
        let oldest = state
            .messages
            .iter()
            .filter(aged)
            .map(|m| m.parts().enqueued_at)
            .min();
        Ok(OutboxStats::new(
            pending.len() as u64,
            parked,
            oldest.map(|at| now.saturating_duration_since(at)),
        ))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            "ownoutbox",
            TransactionSharing::None,
            Durability::Volatile,
            ClockSource::Caller,
            usize::MAX,
        )
    }
}

/// The next sequence of `aggregate`, counted.
fn next_sequence(state: &mut State, aggregate: &str) -> u64 {
    let last = state.sequences.entry(aggregate.to_string()).or_insert(0);
    *last += 1;
    *last
}

/// Leases the messages at `due` to `owner` until `until`; what it took.
fn take(state: &mut State, due: &[(usize, Timestamp)], owner: OwnerToken) -> Vec<OutboxMessage> {
    due.iter()
        .filter_map(|&(i, until)| {
            let m = state.messages.get_mut(i)?;
            *m = edited(m, |p| {
                p.lease_owner = Some(owner);
                p.lease_until = Some(until);
            });
            Some(m.clone())
        })
        .collect()
}
