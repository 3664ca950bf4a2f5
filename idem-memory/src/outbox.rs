//! `MemoryOutbox`: the outbox store in process, on the caller's clock.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    Advance, Capabilities, Clock, Layered, LogBatch, LogPosition, MessageId, MessageParts,
    MessageState, NewMessage, OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PageAfter,
    PartitionLease, PartitionStats, Timestamp, forward_outbox_store, partition_of, validate_lease,
    validate_outbox_batch, validate_partitions,
};
use idem_core::{InvalidInput, StoreError, async_trait};

/// An in-process outbox store: tests, examples and single-process services
/// (a message enqueued here is not in any database transaction). One log
/// per partition (one by default), numbered in enqueue order; the caller's
/// [`Clock`] judges leases and back-off. Every operation holds one lock, so
/// each is atomic. Cloning is cheap and shares the messages.
///
/// ```
/// use idem_core::store::{NewMessage, OutboxStore};
/// use idem_memory::MemoryOutbox;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let outbox = MemoryOutbox::new();
/// let first = outbox.enqueue(&NewMessage::new("order-1", "order.placed", b"{}".to_vec())?).await?;
/// let second = outbox.enqueue(&NewMessage::new("order-1", "order.paid", b"{}".to_vec())?).await?;
/// assert_eq!((first.parts().sequence, second.parts().sequence), (1, 2));
/// assert!(first.parts().position < second.parts().position);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct MemoryOutbox {
    messages: Layered<Messages>,
}

forward_outbox_store!(MemoryOutbox => messages);

impl Default for MemoryOutbox {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryOutbox {
    /// An empty outbox of one partition on the system clock.
    pub fn new() -> Self {
        Self::with_clock(idem_core::store::SystemClock)
    }

    /// An empty outbox of one partition on `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::on(Arc::new(clock), 1)
    }

    /// An empty outbox of `partitions` partitions on `clock`: relays share
    /// them, one relay a partition at a time.
    ///
    /// ```
    /// use idem_core::store::{NewMessage, OutboxStore, partition_of};
    /// use idem_memory::MemoryOutbox;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let outbox = MemoryOutbox::with_partitions(4, idem_core::store::SystemClock)?;
    /// let placed = outbox.enqueue(&NewMessage::new("order-1", "order.placed", b"{}".to_vec())?).await?;
    /// assert_eq!(placed.parts().partition, partition_of("order-1", 4));
    /// assert_eq!(outbox.stats().await?.partitions.len(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] outside 1 to
    /// [`MAX_PARTITIONS`](idem_core::store::MAX_PARTITIONS).
    pub fn with_partitions(partitions: u32, clock: impl Clock) -> Result<Self, InvalidInput> {
        Ok(Self::on(Arc::new(clock), validate_partitions(partitions)?))
    }

    fn on(clock: Arc<dyn Clock>, partitions: u32) -> Self {
        let state = State {
            logs: (0..partitions).map(|_| Log::default()).collect(),
            ..State::default()
        };
        Self {
            messages: crate::part::layered(Messages {
                state: Arc::new(Mutex::new(state)),
                clock,
            }),
        }
    }
}

/// One partition: the messages still in its log, by position, its cursor
/// and its holder.
#[derive(Default)]
struct Log {
    entries: BTreeMap<LogPosition, MessageId>,
    cursor: LogPosition,
    holder: Option<(OwnerToken, Timestamp)>,
}

impl Log {
    fn held_by(&self, owner: OwnerToken, now: Timestamp) -> bool {
        self.holder
            .is_some_and(|(holder, until)| holder == owner && until > now)
    }

    fn is_free(&self, now: Timestamp) -> bool {
        self.holder.is_none_or(|(_, until)| until <= now)
    }
}

#[derive(Default)]
struct State {
    /// Every stored message; one in a log is kept `Pending`, and shown
    /// `Sent` once its partition's cursor passed it.
    messages: HashMap<MessageId, OutboxMessage>,
    logs: Vec<Log>,
    /// The last sequence of each aggregate.
    sequences: HashMap<String, u64>,
    /// The last position given.
    last_position: u64,
}

impl State {
    /// `message` as it stands: a log message at or before its cursor sent.
    fn shown(&self, message: &OutboxMessage) -> OutboxMessage {
        let parts = message.parts();
        let passed = self
            .logs
            .get(parts.partition as usize)
            .is_some_and(|log| parts.position <= log.cursor);
        if parts.state == MessageState::Pending && passed {
            message.edited(|parts| parts.state = MessageState::Sent)
        } else {
            message.clone()
        }
    }

    /// The messages of `partition`'s retry lane, each aggregate's in
    /// sequence order.
    fn lane(&self, partition: u32) -> BTreeMap<&str, Vec<&OutboxMessage>> {
        let mut lane: BTreeMap<&str, Vec<&OutboxMessage>> = BTreeMap::new();
        for message in self.messages.values() {
            let parts = message.parts();
            if parts.partition == partition
                && matches!(parts.state, MessageState::Waiting | MessageState::Parked)
            {
                lane.entry(message.message().aggregate())
                    .or_default()
                    .push(message);
            }
        }
        for waiting in lane.values_mut() {
            waiting.sort_by_key(|m| m.parts().sequence);
        }
        lane
    }

    fn log(&mut self, partition: u32) -> Result<&mut Log, StoreError> {
        self.logs
            .get_mut(partition as usize)
            .ok_or_else(|| no_such_partition().into())
    }

    /// Replaces the stored `id` by `edit` of it, where `applies` to it.
    fn edit(
        &mut self,
        id: MessageId,
        applies: impl FnOnce(&OutboxMessage) -> bool,
        edit: impl FnOnce(&OutboxMessage) -> OutboxMessage,
    ) -> bool {
        match self.messages.get(&id) {
            Some(message) if applies(message) => {
                let edited = edit(message);
                self.messages.insert(id, edited);
                true
            }
            _ => false,
        }
    }
}

fn no_such_partition() -> InvalidInput {
    InvalidInput::OutOfRange {
        field: "partition",
        reason: "the outbox has no such partition",
    }
}

#[derive(Clone)]
struct Messages {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Messages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.locked();
        f.debug_struct("MemoryOutbox")
            .field("messages", &state.messages.len())
            .field("partitions", &state.logs.len())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Messages {
    fn locked(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave a message half-written: keep using it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl OutboxStore for Messages {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        if let Some(existing) = state.messages.get(&message.id()) {
            return Ok(state.shown(existing));
        }
        let partitions = u32::try_from(state.logs.len()).unwrap_or(u32::MAX);
        let partition = partition_of(message.aggregate(), partitions);
        let sequence = state
            .sequences
            .entry(message.aggregate().to_string())
            .or_insert(0);
        *sequence += 1;
        let sequence = *sequence;
        state.last_position += 1;
        let position = LogPosition::new(state.last_position, 0);
        let stored = OutboxMessage::new(
            message.clone(),
            MessageParts {
                sequence,
                partition,
                position,
                state: MessageState::Pending,
                attempts: 0,
                last_error: None,
                enqueued_at: now,
                available_at: now,
                sent_at: None,
            },
        );
        state.log(partition)?.entries.insert(position, message.id());
        state.messages.insert(message.id(), stored.clone());
        Ok(stored)
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        let lease = validate_lease(lease)?;
        let now = self.clock.now();
        let mut state = self.locked();
        let free = state
            .logs
            .iter_mut()
            .enumerate()
            .find(|(_, log)| log.is_free(now));
        Ok(free.map(|(partition, log)| {
            let until = now + lease;
            log.holder = Some((owner, until));
            let partition = u32::try_from(partition).unwrap_or(u32::MAX);
            PartitionLease::issued(partition, owner, lease, until, log.cursor)
        }))
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        let mut state = self.locked();
        let ids: Vec<MessageId> = state
            .log(partition)?
            .entries
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(_, id)| *id)
            .collect();
        let lane = state.lane(partition);
        let messages: Vec<OutboxMessage> = ids
            .iter()
            .filter_map(|id| state.messages.get(id))
            .map(|message| state.shown(message))
            .collect();
        Ok(LogBatch::among(messages, |aggregate| {
            lane.contains_key(aggregate)
        }))
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let partition = lease.partition();
        let log = state.log(partition)?;
        if !log.held_by(lease.owner(), now) {
            return Err(StoreError::LostLease);
        }
        let until = now + lease.lease();
        log.holder = Some((lease.owner(), until));
        if let Some(to) = advance.to {
            log.cursor = log.cursor.max(to);
        }
        let cursor = log.cursor;
        let in_lane = |m: &OutboxMessage| m.parts().partition == partition;
        let mut left_log = Vec::new();
        for failure in &advance.failed {
            let counts = |m: &OutboxMessage| {
                in_lane(m)
                    && m.parts().attempts == failure.attempts
                    && matches!(m.state(), MessageState::Pending | MessageState::Waiting)
            };
            if state.edit(failure.id, counts, |m| m.failed(failure, now)) {
                left_log.push(failure.id);
            }
        }
        for id in &advance.held {
            let in_log = |m: &OutboxMessage| in_lane(m) && m.state() == MessageState::Pending;
            let waits = |m: &OutboxMessage| {
                m.edited(|parts| {
                    parts.state = MessageState::Waiting;
                    parts.available_at = now;
                })
            };
            if state.edit(*id, in_log, waits) {
                left_log.push(*id);
            }
        }
        for id in &advance.sent {
            let waiting = |m: &OutboxMessage| in_lane(m) && m.state() == MessageState::Waiting;
            state.edit(*id, waiting, |m| {
                m.edited(|parts| {
                    parts.state = MessageState::Sent;
                    parts.sent_at = Some(now);
                })
            });
        }
        for id in left_log {
            if let Some(position) = state.messages.get(&id).map(|m| m.parts().position) {
                state.log(partition)?.entries.remove(&position);
            }
        }
        Ok(lease.renewed(until, cursor))
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        let now = self.clock.now();
        let mut state = self.locked();
        state.log(partition)?;
        let mut due: Vec<OutboxMessage> = state
            .lane(partition)
            .values()
            .filter_map(|waiting| waiting.first())
            .filter(|head| {
                head.state() == MessageState::Waiting && head.parts().available_at <= now
            })
            .map(|head| (*head).clone())
            .collect();
        due.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        due.truncate(limit);
        Ok(due)
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let log = state.log(lease.partition())?;
        if !log.held_by(lease.owner(), now) {
            return Ok(false);
        }
        log.holder = None;
        Ok(true)
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        let mut parked: Vec<OutboxMessage> = self
            .locked()
            .messages
            .values()
            .filter(|m| m.state() == MessageState::Parked)
            .filter(|m| after.is_none_or(|after| after.precedes(m)))
            .cloned()
            .collect();
        parked.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        parked.truncate(limit);
        Ok(parked)
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let parked = |m: &OutboxMessage| m.state() == MessageState::Parked;
        Ok(self.locked().edit(id, parked, |m| {
            m.edited(|parts| {
                parts.state = MessageState::Waiting;
                parts.attempts = 0;
                parts.available_at = now;
            })
        }))
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let parked = |m: &OutboxMessage| m.state() == MessageState::Parked;
        Ok(self.locked().edit(id, parked, |m| {
            m.edited(|parts| {
                parts.state = MessageState::Dropped;
                parts.last_error = Some(reason.to_string());
                parts.sent_at = Some(now);
            })
        }))
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        let state = self.locked();
        Ok(state.messages.get(&id).map(|m| state.shown(m)))
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        let cutoff = self.clock.now() - older_than;
        let mut state = self.locked();
        let done: Vec<(MessageId, u32, LogPosition)> = state
            .messages
            .values()
            .map(|m| state.shown(m))
            .filter(|m| match m.state() {
                // Sent from the log: aged from its enqueue.
                MessageState::Sent if m.parts().sent_at.is_none() => {
                    m.parts().enqueued_at <= cutoff
                }
                MessageState::Sent | MessageState::Dropped => {
                    m.parts().sent_at.is_some_and(|at| at <= cutoff)
                }
                _ => false,
            })
            .take(limit)
            .map(|m| (m.id(), m.parts().partition, m.parts().position))
            .collect();
        for (id, partition, position) in &done {
            state.messages.remove(id);
            state.log(*partition)?.entries.remove(position);
        }
        Ok(done.len() as u64)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let now = self.clock.now();
        let state = self.locked();
        let mut partitions: Vec<PartitionStats> = state
            .logs
            .iter()
            .enumerate()
            .map(|(partition, log)| {
                let mut stats = PartitionStats::new(u32::try_from(partition).unwrap_or(u32::MAX));
                stats.cursor = log.cursor;
                if let Some((holder, until)) = log.holder.filter(|(_, until)| *until > now) {
                    stats.holder = Some(holder);
                    stats.held_until = Some(until);
                }
                stats
            })
            .collect();
        for message in state.messages.values().map(|m| state.shown(m)) {
            let parts = message.parts();
            let Some(stats) = partitions.get_mut(parts.partition as usize) else {
                continue;
            };
            match parts.state {
                MessageState::Pending | MessageState::Waiting => {
                    stats.pending += 1;
                    let age = now.saturating_duration_since(parts.enqueued_at);
                    stats.oldest_pending_age = stats.oldest_pending_age.max(Some(age));
                }
                MessageState::Parked => stats.parked += 1,
                _ => {}
            }
        }
        Ok(OutboxStats::of_partitions(partitions))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
