//! An outbox store of one's own, written against [`idem_core::store`]
//! alone, with the realistic bugs the public outbox suite must catch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    Advance, AdvancedRead, Capabilities, Clock, ClockSource, Durability, LogBatch, LogPosition,
    MessageId, MessageParts, MessageState, NewMessage, OutboxMessage, OutboxStats, OutboxStore,
    OwnerToken, PageAfter, PartitionLease, PartitionStats, SystemClock, Timestamp,
    TransactionSharing, partition_of, validate_lease, validate_outbox_batch,
};
use idem_core::{InvalidInput, StoreError, async_trait};

use crate::Rivals;

/// How many partitions the store has.
const OWN_PARTITIONS: u32 = 4;

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
    /// Numbers an aggregate from the messages it still stores, so a purge
    /// starts its sequence again.
    SequenceRestartsAfterPurge,
    /// Places an aggregate by the length of its name, not its hash.
    PartitionByLength,
    /// Reads a log by aggregate name, not in log order.
    ReadByAggregate,
    /// Reads the message at the position asked too.
    ReadIncludesAfter,
    /// Reads the messages of the retry lane with the log.
    ReadsTheLane,
    /// Never names a blocked aggregate.
    NoBlocked,
    /// Acquires partitions that another relay holds.
    AcquireHeld,
    /// Acquires the highest free partition first.
    AcquireHighest,
    /// Never acquires a partition whose lease lapsed.
    NoTakeover,
    /// Answers an acquire with a cursor at the start of the log.
    CursorForgotten,
    /// Keeps leases in whole seconds, so a lease under a second is none.
    LeaseInWholeSeconds,
    /// Releases a partition for whatever relay asks.
    ReleaseIgnoresOwner,
    /// Settles an advance for whatever relay asks.
    AdvanceIgnoresOwner,
    /// Lets a lapsed owner advance while nobody acquired its partition.
    AdvanceAfterLapse,
    /// Moves a cursor back when asked.
    CursorMovesBack,
    /// Answers an advance with a renewed lease but keeps the old one.
    NoRenewal,
    /// Renews a lease by an advance for twice its length.
    RenewsPastItsLength,
    /// Reads after the partition's cursor when it is past the position
    /// asked.
    ReadsFromCursor,
    /// Blocks an aggregate in a read only behind a waiting message, not a
    /// parked one.
    ParkedDoesNotBlock,
    /// Purges every message old enough, whatever the limit.
    PurgeIgnoresLimit,
    /// Reports a partition's holder after its lease lapsed.
    StatsHolderAfterLapse,
    /// Ages the backlog by the process's clock, not the store's.
    StatsAgeOnProcessClock,
    /// Reads before it advances, in an advance and read.
    ReadsBeforeAdvance,
    /// Reads and answers in an advance and read whose lease was lost.
    ReadsUnderLostLease,
    /// Makes a failed message due at once, whatever its back-off.
    NoBackOff,
    /// Lets the messages behind a parked one flow.
    ParkedAggregateFlows,
    /// Counts a hold as an attempt.
    HoldCountsAttempt,
    /// Makes every waiting message due, not each aggregate's first.
    WholeLaneDue,
    /// Counts a failure again, and stamps a send again, when an advance is
    /// delivered twice.
    FailureCountsTwice,
    /// Takes the lane's heads by sequence, not the oldest first.
    DueBySequence,
    /// Keeps the attempts of a retried message.
    RetryKeepsAttempts,
    /// Gives a retried message its aggregate's next sequence, as if new.
    RetryRequeues,
    /// Leaves a retried message waiting out its back-off.
    RetryKeepsBackOff,
    /// Clears the last error when a message is retried.
    RetryClearsError,
    /// Drops a message without keeping the reason.
    DropLosesReason,
    /// Gives every other message its place in the log at once but lets it
    /// be read only later, so a read racing it passes its place.
    EnqueueLandsLate,
    /// Holds a message whatever its state, as if it were in the log.
    HoldsAnyMessage,
    /// Marks a message sent whatever its state.
    SendsAnyMessage,
    /// Drops the message but leaves its aggregate blocked behind it.
    DropKeepsBlocking,
    /// Drops and retries messages that are not parked.
    OperatorIgnoresState,
    /// Lists parked messages newest first.
    ParkedNewestFirst,
    /// Pages parked messages by their enqueue time alone, skipping the
    /// rest of a page's last time.
    ParkedPagesByTimeAlone,
    /// Purges whatever is old, sent or not.
    PurgesUnsent,
    /// Ignores `older_than` when purging.
    PurgeIgnoresAge,
    /// Ages a dropped message from its enqueue, not from its drop.
    PurgeAgesDropsFromEnqueue,
    /// Purges only messages strictly older than asked.
    PurgeStrictlyOlder,
    /// Counts parked messages as pending.
    StatsMixParked,
    /// Ages the backlog from parked messages too.
    StatsAgeCountsParked,
    /// Ages the backlog from sent messages too.
    StatsAgeCountsSent,
    /// Reports no partition's holder.
    StatsNoHolder,
    /// Accepts any batch limit.
    LimitUnchecked,
    /// Reads and writes an acquire under two acquisitions of the lock, a
    /// rival's read between them.
    NonAtomicAcquire,
    /// Ends leases by the process's clock and judges them by the store's.
    LeaseOnProcessClock,
}

/// One partition: its holder and cursor.
#[derive(Debug, Clone, Copy, Default)]
struct Partition {
    holder: Option<(OwnerToken, Timestamp)>,
    cursor: LogPosition,
}

#[derive(Default)]
struct State {
    /// Every message; one in a log is kept pending, and sent once its
    /// partition's cursor passed it.
    messages: Vec<OutboxMessage>,
    partitions: Vec<Partition>,
    last_sequence: u64,
    last_position: u64,
    /// Each aggregate's last sequence.
    sequences: HashMap<String, u64>,
}

impl State {
    /// `m` as it stands: a log message at or before its cursor sent.
    fn shown(&self, m: &OutboxMessage) -> OutboxMessage {
        let cursor = self
            .partitions
            .get(m.parts().partition as usize)
            .map(|p| p.cursor)
            .unwrap_or_default();
        if m.state() == MessageState::Pending && m.parts().position <= cursor {
            edited(m, |p| p.state = MessageState::Sent)
        } else {
            m.clone()
        }
    }

    fn find(&mut self, id: MessageId) -> Option<&mut OutboxMessage> {
        self.messages.iter_mut().find(|m| m.id() == id)
    }
}

fn edited(m: &OutboxMessage, edit: impl FnOnce(&mut MessageParts)) -> OutboxMessage {
    m.edited(edit)
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
        let state = State {
            partitions: vec![Partition::default(); OWN_PARTITIONS as usize],
            ..State::default()
        };
        Self {
            state: Mutex::new(state),
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

    /// `message` placed in the log, and whether it lands late (written
    /// by the caller after a while; [`OutboxDefect::EnqueueLandsLate`]).
    fn place(&self, message: &NewMessage) -> (OutboxMessage, bool) {
        let now = self.clock.now();
        let mut state = self.locked();
        if !self.is(OutboxDefect::DuplicateIds)
            && let Some(existing) = state.messages.iter().find(|m| m.id() == message.id())
        {
            return (state.shown(existing), false);
        }
        let aggregate = message.aggregate().to_string();
        let sequence = if self.is(OutboxDefect::GlobalSequence) {
            state.last_sequence += 1;
            state.last_sequence
        } else if self.is(OutboxDefect::SequenceRestartsAfterPurge) {
            let stored = state
                .messages
                .iter()
                .filter(|m| m.message().aggregate() == aggregate)
                .count();
            stored as u64 + 1
        } else {
            let last = state.sequences.entry(aggregate.clone()).or_insert(0);
            *last += 1;
            *last
        };
        let partition = if self.is(OutboxDefect::PartitionByLength) {
            (aggregate.len() as u32) % OWN_PARTITIONS
        } else {
            partition_of(&aggregate, OWN_PARTITIONS)
        };
        state.last_position += 1;
        let stored = OutboxMessage::new(
            message.clone(),
            MessageParts {
                sequence,
                partition,
                position: LogPosition::new(state.last_position, 0),
                state: MessageState::Pending,
                attempts: 0,
                last_error: None,
                enqueued_at: now,
                available_at: now,
                sent_at: None,
            },
        );
        let late = self.is(OutboxDefect::EnqueueLandsLate) && state.last_position % 2 == 1;
        if !late {
            state.messages.push(stored.clone());
        }
        (stored, late)
    }

    fn limit(&self, limit: usize) -> Result<usize, StoreError> {
        if self.is(OutboxDefect::LimitUnchecked) {
            return Ok(limit.max(1));
        }
        Ok(validate_outbox_batch(limit)?)
    }

    fn partition(&self, state: &State, partition: u32) -> Result<usize, StoreError> {
        let index = partition as usize;
        if index < state.partitions.len() {
            Ok(index)
        } else {
            Err(InvalidInput::OutOfRange {
                field: "partition",
                reason: "no such partition",
            }
            .into())
        }
    }

    /// When a lease of `lease` taken now ends.
    fn lease_end(&self, now: Timestamp, lease: Duration) -> Timestamp {
        if self.is(OutboxDefect::LeaseInWholeSeconds) {
            return now + Duration::from_secs(lease.as_secs());
        }
        if self.is(OutboxDefect::LeaseOnProcessClock) {
            return SystemClock.now() + lease;
        }
        now + lease
    }

    /// Whether `owner` holds `partition` at `now`.
    fn holds(&self, partition: &Partition, owner: OwnerToken, now: Timestamp) -> bool {
        match partition.holder {
            Some((holder, until)) => {
                (holder == owner || self.is(OutboxDefect::AdvanceIgnoresOwner))
                    && (until > now || self.is(OutboxDefect::AdvanceAfterLapse))
            }
            None => false,
        }
    }

    /// Whether `partition` is free at `now` for an acquire.
    fn free(&self, partition: &Partition, now: Timestamp) -> bool {
        match partition.holder {
            None => true,
            Some(_) if self.is(OutboxDefect::AcquireHeld) => true,
            Some((_, until)) => until <= now && !self.is(OutboxDefect::NoTakeover),
        }
    }

    /// The lane of `partition`: each aggregate's waiting or parked
    /// messages, in sequence order.
    fn lane(&self, state: &State, partition: u32) -> BTreeMap<String, Vec<OutboxMessage>> {
        let mut lane: BTreeMap<String, Vec<OutboxMessage>> = BTreeMap::new();
        for m in &state.messages {
            let blocking = match m.state() {
                MessageState::Waiting | MessageState::Parked => true,
                MessageState::Dropped => self.is(OutboxDefect::DropKeepsBlocking),
                _ => false,
            };
            if m.parts().partition == partition && blocking {
                lane.entry(m.message().aggregate().to_string())
                    .or_default()
                    .push(m.clone());
            }
        }
        for waiting in lane.values_mut() {
            waiting.sort_by_key(|m| m.parts().sequence);
        }
        lane
    }
}

#[async_trait]
impl OutboxStore for OwnOutbox {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        let (stored, late) = self.place(message);
        if late {
            // Placed in the log now, visible later: what a log ordered by a
            // sequence taken before the commit does.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            self.locked().messages.push(stored.clone());
        }
        Ok(stored)
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        let lease = validate_lease(lease)?;
        let mut now = self.clock.now();
        let pick = |state: &State, now: Timestamp| -> Option<usize> {
            let free = |(_, p): &(usize, &Partition)| self.free(p, now);
            if self.is(OutboxDefect::AcquireHighest) {
                state.partitions.iter().enumerate().rev().find(free)
            } else {
                state.partitions.iter().enumerate().find(free)
            }
            .map(|(i, _)| i)
        };
        let picked = if self.is(OutboxDefect::NonAtomicAcquire) {
            let picked = pick(&self.locked(), now);
            let _reading = self.rivals.meet(&()).await;
            // The lease counts from after the wait, so only the race shows.
            now = self.clock.now();
            picked
        } else {
            None
        };
        let mut state = self.locked();
        let Some(index) = picked.or_else(|| pick(&state, now)) else {
            return Ok(None);
        };
        let until = self.lease_end(now, lease);
        let partition = &mut state.partitions[index];
        partition.holder = Some((owner, until));
        let cursor = if self.is(OutboxDefect::CursorForgotten) {
            LogPosition::START
        } else {
            partition.cursor
        };
        Ok(Some(PartitionLease::issued(
            index as u32,
            owner,
            lease,
            until,
            cursor,
        )))
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        let limit = self.limit(limit)?;
        let state = self.locked();
        self.partition(&state, partition)?;
        let mut log: Vec<OutboxMessage> = state
            .messages
            .iter()
            .filter(|m| m.parts().partition == partition)
            .filter(|m| {
                m.state() == MessageState::Pending
                    || (self.is(OutboxDefect::ReadsTheLane) && m.state() == MessageState::Waiting)
            })
            .filter(|m| {
                let cursor = state.partitions[partition as usize].cursor;
                let after = match self.is(OutboxDefect::ReadsFromCursor) {
                    true => after.max(cursor),
                    false => after,
                };
                m.parts().position > after
                    || (self.is(OutboxDefect::ReadIncludesAfter) && m.parts().position == after)
            })
            .map(|m| state.shown(m))
            .collect();
        if self.is(OutboxDefect::ReadByAggregate) {
            log.sort_by(|a, b| a.message().aggregate().cmp(b.message().aggregate()));
        } else {
            log.sort_by_key(|m| m.parts().position);
        }
        log.truncate(limit);
        let lane = self.lane(&state, partition);
        let blocked: BTreeSet<String> = if self.is(OutboxDefect::NoBlocked) {
            BTreeSet::new()
        } else {
            let blocks = |waiting: &Vec<OutboxMessage>| {
                !self.is(OutboxDefect::ParkedDoesNotBlock)
                    || waiting.iter().any(|m| m.state() == MessageState::Waiting)
            };
            log.iter()
                .map(|m| m.message().aggregate().to_string())
                .filter(|a| lane.get(a).is_some_and(blocks))
                .collect()
        };
        Ok(LogBatch::new(log, blocked))
    }

    async fn advance_and_read(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
        after: LogPosition,
        limit: usize,
    ) -> Result<AdvancedRead, StoreError> {
        let partition = lease.partition();
        if self.is(OutboxDefect::ReadsBeforeAdvance) {
            let batch = self.read(partition, after, limit).await;
            let renewed = self.advance(lease, advance).await?;
            return Ok(AdvancedRead::new(renewed, batch));
        }
        let renewed = match self.advance(lease, advance).await {
            Err(StoreError::LostLease) if self.is(OutboxDefect::ReadsUnderLostLease) => *lease,
            settled => settled?,
        };
        Ok(AdvancedRead::new(
            renewed,
            self.read(partition, after, limit).await,
        ))
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let index = self.partition(&state, lease.partition())?;
        if !self.holds(&state.partitions[index], lease.owner(), now) {
            return Err(StoreError::LostLease);
        }
        let length = match self.is(OutboxDefect::RenewsPastItsLength) {
            true => lease.lease() * 2,
            false => lease.lease(),
        };
        let until = self.lease_end(now, length);
        let partition = &mut state.partitions[index];
        if !self.is(OutboxDefect::NoRenewal) {
            partition.holder = Some((lease.owner(), until));
        }
        if let Some(to) = advance.to {
            partition.cursor = if self.is(OutboxDefect::CursorMovesBack) {
                to
            } else {
                partition.cursor.max(to)
            };
        }
        let cursor = partition.cursor;
        let ours = |m: &OutboxMessage| m.parts().partition == lease.partition();
        for failure in &advance.failed {
            let counts_twice = self.is(OutboxDefect::FailureCountsTwice);
            if let Some(m) = state.find(failure.id)
                && ours(m)
                && (m.parts().attempts == failure.attempts || counts_twice)
                && matches!(m.state(), MessageState::Pending | MessageState::Waiting)
            {
                *m = m.failed(failure, now);
                if self.is(OutboxDefect::NoBackOff) {
                    *m = edited(m, |p| p.available_at = now);
                }
            }
        }
        for id in &advance.held {
            let counts = self.is(OutboxDefect::HoldCountsAttempt);
            if let Some(m) = state.find(*id)
                && ours(m)
                && (m.state() == MessageState::Pending || self.is(OutboxDefect::HoldsAnyMessage))
            {
                *m = edited(m, |p| {
                    p.state = MessageState::Waiting;
                    p.available_at = now;
                    if counts {
                        p.attempts += 1;
                    }
                });
            }
        }
        for id in &advance.sent {
            let restamps = self.is(OutboxDefect::FailureCountsTwice);
            if let Some(m) = state.find(*id)
                && ours(m)
                && (m.state() == MessageState::Waiting
                    || (restamps && m.state() == MessageState::Sent)
                    || self.is(OutboxDefect::SendsAnyMessage))
            {
                *m = edited(m, |p| {
                    p.state = MessageState::Sent;
                    p.sent_at = Some(now);
                });
            }
        }
        Ok(lease.renewed(until, cursor))
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = self.limit(limit)?;
        let now = self.clock.now();
        let state = self.locked();
        self.partition(&state, partition)?;
        let lane = self.lane(&state, partition);
        let mut due: Vec<OutboxMessage> = Vec::new();
        for waiting in lane.values() {
            let candidates: Vec<&OutboxMessage> = if self.is(OutboxDefect::WholeLaneDue) {
                waiting.iter().collect()
            } else if self.is(OutboxDefect::ParkedAggregateFlows) {
                waiting
                    .iter()
                    .filter(|m| m.state() != MessageState::Parked)
                    .take(1)
                    .collect()
            } else {
                waiting.iter().take(1).collect()
            };
            due.extend(
                candidates
                    .into_iter()
                    .filter(|m| m.state() == MessageState::Waiting)
                    .filter(|m| m.parts().available_at <= now)
                    .cloned(),
            );
        }
        if self.is(OutboxDefect::DueBySequence) {
            due.sort_by_key(|m| (m.parts().sequence, m.id()));
        } else {
            due.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        }
        due.truncate(limit);
        Ok(due)
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let index = self.partition(&state, lease.partition())?;
        let partition = &mut state.partitions[index];
        let held = match partition.holder {
            Some((holder, until)) => {
                (holder == lease.owner() || self.is(OutboxDefect::ReleaseIgnoresOwner))
                    && until > now
            }
            None => false,
        };
        if held {
            partition.holder = None;
        }
        Ok(held)
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = self.limit(limit)?;
        let state = self.locked();
        let mut parked: Vec<OutboxMessage> = state
            .messages
            .iter()
            .filter(|m| m.state() == MessageState::Parked)
            .filter(|m| {
                after.is_none_or(
                    |after| match self.is(OutboxDefect::ParkedPagesByTimeAlone) {
                        true => after.enqueued_at < m.parts().enqueued_at,
                        false => after.precedes(m),
                    },
                )
            })
            .cloned()
            .collect();
        parked.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        if self.is(OutboxDefect::ParkedNewestFirst) {
            parked.reverse();
        }
        parked.truncate(limit);
        Ok(parked)
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let next = state.last_sequence + 1_000_000;
        let any = self.is(OutboxDefect::OperatorIgnoresState);
        let Some(m) = state.find(id) else {
            return Ok(false);
        };
        if m.state() != MessageState::Parked && !any {
            return Ok(false);
        }
        *m = edited(m, |p| {
            p.state = MessageState::Waiting;
            if !self.is(OutboxDefect::RetryKeepsAttempts) {
                p.attempts = 0;
            }
            if !self.is(OutboxDefect::RetryKeepsBackOff) {
                p.available_at = now;
            }
            if self.is(OutboxDefect::RetryClearsError) {
                p.last_error = None;
            }
            if self.is(OutboxDefect::RetryRequeues) {
                p.sequence = next;
            }
        });
        Ok(true)
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let any = self.is(OutboxDefect::OperatorIgnoresState);
        let Some(m) = state.find(id) else {
            return Ok(false);
        };
        if m.state() != MessageState::Parked && !any {
            return Ok(false);
        }
        *m = edited(m, |p| {
            p.state = MessageState::Dropped;
            if !self.is(OutboxDefect::DropLosesReason) {
                p.last_error = Some(reason.to_string());
            }
            p.sent_at = Some(now);
        });
        Ok(true)
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        let state = self.locked();
        Ok(state
            .messages
            .iter()
            .find(|m| m.id() == id)
            .map(|m| state.shown(m)))
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = self.limit(limit)?;
        let cutoff = self.clock.now() - older_than;
        let old_enough = |at: Timestamp| {
            self.is(OutboxDefect::PurgeIgnoresAge)
                || at < cutoff
                || (at == cutoff && !self.is(OutboxDefect::PurgeStrictlyOlder))
        };
        let mut state = self.locked();
        let shown: Vec<OutboxMessage> = state.messages.iter().map(|m| state.shown(m)).collect();
        let mut doomed = Vec::new();
        for m in &shown {
            let parts = m.parts();
            let aged_from = match (m.state(), parts.sent_at) {
                (MessageState::Dropped, _) if self.is(OutboxDefect::PurgeAgesDropsFromEnqueue) => {
                    Some(parts.enqueued_at)
                }
                (MessageState::Sent | MessageState::Dropped, Some(at)) => Some(at),
                (MessageState::Sent, None) => Some(parts.enqueued_at),
                _ if self.is(OutboxDefect::PurgesUnsent) => Some(parts.enqueued_at),
                _ => None,
            };
            let room = doomed.len() < limit || self.is(OutboxDefect::PurgeIgnoresLimit);
            if aged_from.is_some_and(old_enough) && room {
                doomed.push(m.id());
            }
        }
        state.messages.retain(|m| !doomed.contains(&m.id()));
        Ok(doomed.len() as u64)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let now = self.clock.now();
        let state = self.locked();
        let mut partitions: Vec<PartitionStats> = (0..state.partitions.len())
            .map(|i| {
                let mut stats = PartitionStats::new(i as u32);
                let partition = state.partitions[i];
                stats.cursor = partition.cursor;
                let lapsed_too = self.is(OutboxDefect::StatsHolderAfterLapse);
                if let Some((holder, until)) =
                    partition.holder.filter(|(_, u)| *u > now || lapsed_too)
                    && !self.is(OutboxDefect::StatsNoHolder)
                {
                    stats.holder = Some(holder);
                    stats.held_until = Some(until);
                }
                stats
            })
            .collect();
        for m in state.messages.iter().map(|m| state.shown(m)) {
            let Some(stats) = partitions.get_mut(m.parts().partition as usize) else {
                continue;
            };
            let pending = matches!(m.state(), MessageState::Pending | MessageState::Waiting);
            let parked = m.state() == MessageState::Parked;
            if pending || (parked && self.is(OutboxDefect::StatsMixParked)) {
                stats.pending += 1;
            } else if parked {
                stats.parked += 1;
            }
            let aged = pending
                || (parked && self.is(OutboxDefect::StatsAgeCountsParked))
                || (m.state() == MessageState::Sent && self.is(OutboxDefect::StatsAgeCountsSent));
            if aged {
                let aged_at = match self.is(OutboxDefect::StatsAgeOnProcessClock) {
                    true => SystemClock.now(),
                    false => now,
                };
                let age = aged_at.saturating_duration_since(m.parts().enqueued_at);
                stats.oldest_pending_age = stats.oldest_pending_age.max(Some(age));
            }
        }
        Ok(OutboxStats::of_partitions(partitions))
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
