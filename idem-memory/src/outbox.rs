//! `MemoryOutbox`: the outbox store in process, on the caller's clock.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{
    BatchClaim, Capabilities, Clock, Layered, MessageId, MessageParts, MessageState, NewMessage,
    OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PublishFailure, Timestamp,
    forward_outbox_store, validate_lease, validate_outbox_batch,
};
use idem_core::{StoreError, async_trait};

/// An in-process outbox store: tests, examples and single-process services
/// (a message enqueued here is not in any database transaction). The
/// caller's [`Clock`] judges leases and back-off. Every operation holds one
/// lock, so each is atomic. Cloning is cheap and shares the messages.
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
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct MemoryOutbox {
    messages: Layered<Messages>,
}

forward_outbox_store!(MemoryOutbox => messages);

#[derive(Default)]
struct State {
    messages: BTreeMap<MessageId, OutboxMessage>,
    /// The last sequence of each aggregate.
    sequences: HashMap<String, u64>,
}

#[derive(Clone)]
struct Messages {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for Messages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryOutbox")
            .field("messages", &self.locked().messages.len())
            .field("clock", &self.clock)
            .finish()
    }
}

crate::part::clocked_part!(MemoryOutbox => messages: Messages, "outbox");

impl Messages {
    fn on(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Arc::default(),
            clock,
        }
    }

    fn locked(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave a message half-written: keep using it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `edit` to each of `ids` that `owner` holds at `now` (only a
    /// pending message is held); how many.
    fn edit_held(
        &self,
        owner: OwnerToken,
        ids: &[MessageId],
        now: Timestamp,
        edit: impl Fn(&mut MessageParts),
    ) -> u64 {
        let mut state = self.locked();
        let mut edited = 0;
        for id in ids {
            let Some(message) = state.messages.get(id) else {
                continue;
            };
            if message.state() == MessageState::Pending && message.is_held_by(owner, now) {
                let changed = with_parts(message, &edit);
                state.messages.insert(*id, changed);
                edited += 1;
            }
        }
        edited
    }
}

/// Whether someone holds `message` at `now`.
fn leased(message: &OutboxMessage, now: Timestamp) -> bool {
    message.parts().lease_until.is_some_and(|until| until > now)
}

fn with_parts(message: &OutboxMessage, edit: impl FnOnce(&mut MessageParts)) -> OutboxMessage {
    let mut parts = message.parts().clone();
    edit(&mut parts);
    OutboxMessage::new(message.message().clone(), parts)
}

#[async_trait]
impl OutboxStore for Messages {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        if let Some(existing) = state.messages.get(&message.id()) {
            return Ok(existing.clone());
        }
        let sequence = state
            .sequences
            .entry(message.aggregate().to_string())
            .or_insert(0);
        *sequence += 1;
        let stored = OutboxMessage::new(
            message.clone(),
            MessageParts {
                sequence: *sequence,
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
        state.messages.insert(message.id(), stored.clone());
        Ok(stored)
    }

    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError> {
        let owner = batch.owner;
        let lease = validate_lease(batch.lease)?;
        let limit = validate_outbox_batch(batch.limit)?;
        let now = self.clock.now();
        let mut state = self.locked();
        // Each aggregate's open messages, lowest sequence first.
        let mut open: HashMap<&str, Vec<&OutboxMessage>> = HashMap::new();
        for message in state.messages.values() {
            if matches!(
                message.state(),
                MessageState::Pending | MessageState::Parked
            ) {
                open.entry(message.message().aggregate())
                    .or_default()
                    .push(message);
            }
        }
        // Past what the owner holds, the first message; claimed if it is
        // free and due, under the earliest lease of those it passed.
        let mut due: Vec<(&OutboxMessage, Timestamp)> = Vec::new();
        for messages in open.values_mut() {
            messages.sort_by_key(|m| m.parts().sequence);
            let mut until = now + lease;
            for message in messages.iter() {
                if message.state() == MessageState::Pending
                    && message.is_held_by(owner, now)
                    && let Some(held) = message.parts().lease_until
                {
                    until = until.min(held);
                    continue;
                }
                if message.state() == MessageState::Pending
                    && !leased(message, now)
                    && message.parts().available_at <= now
                {
                    due.push((message, until));
                }
                break;
            }
        }
        due.sort_by_key(|(head, _)| (head.parts().enqueued_at, head.id()));
        let claimed: Vec<OutboxMessage> = due
            .into_iter()
            .take(limit)
            .map(|(head, until)| {
                with_parts(head, |parts| {
                    parts.lease_owner = Some(owner);
                    parts.lease_until = Some(until);
                })
            })
            .collect();
        for message in &claimed {
            state.messages.insert(message.id(), message.clone());
        }
        Ok(claimed)
    }

    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let now = self.clock.now();
        Ok(self.edit_held(owner, ids, now, |parts| {
            parts.state = MessageState::Sent;
            parts.sent_at = Some(now);
            parts.lease_until = None;
        }))
    }

    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        let now = self.clock.now();
        Ok(self.edit_held(owner, ids, now, |parts| parts.lease_until = None))
    }

    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let Some(message) = state.messages.get(&failure.id) else {
            return Err(StoreError::LostLease);
        };
        if message.state() != MessageState::Pending || !message.is_held_by(failure.owner, now) {
            return Err(StoreError::LostLease);
        }
        let failed = message.failed(failure, now);
        let left = failed.state();
        state.messages.insert(failure.id, failed);
        Ok(left)
    }

    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        let mut parked: Vec<OutboxMessage> = self
            .locked()
            .messages
            .values()
            .filter(|m| m.state() == MessageState::Parked)
            .cloned()
            .collect();
        parked.sort_by_key(|m| (m.parts().enqueued_at, m.id()));
        parked.truncate(limit);
        Ok(parked)
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let Some(message) = state.messages.get(&id) else {
            return Ok(false);
        };
        if message.state() != MessageState::Parked {
            return Ok(false);
        }
        let retried = with_parts(message, |parts| {
            parts.state = MessageState::Pending;
            parts.attempts = 0;
            parts.available_at = now;
        });
        state.messages.insert(id, retried);
        Ok(true)
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.locked();
        let Some(message) = state.messages.get(&id) else {
            return Ok(false);
        };
        if !matches!(
            message.state(),
            MessageState::Pending | MessageState::Parked
        ) {
            return Ok(false);
        }
        let dropped = with_parts(message, |parts| {
            parts.state = MessageState::Dropped;
            parts.last_error = Some(reason.to_string());
            parts.lease_until = None;
            parts.sent_at = Some(now);
        });
        state.messages.insert(id, dropped);
        Ok(true)
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        Ok(self.locked().messages.get(&id).cloned())
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        let cutoff = self.clock.now() - older_than;
        let mut state = self.locked();
        let done: Vec<MessageId> = state
            .messages
            .values()
            .filter(|m| {
                matches!(m.state(), MessageState::Sent | MessageState::Dropped)
                    && m.parts().sent_at.unwrap_or(m.parts().enqueued_at) <= cutoff
            })
            .map(OutboxMessage::id)
            .take(limit)
            .collect();
        for id in &done {
            state.messages.remove(id);
        }
        Ok(done.len() as u64)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let now = self.clock.now();
        let state = self.locked();
        let pending = state
            .messages
            .values()
            .filter(|m| m.state() == MessageState::Pending);
        let (count, oldest) = pending.fold((0u64, None::<Timestamp>), |(n, oldest), m| {
            let at = m.parts().enqueued_at;
            (n + 1, Some(oldest.map_or(at, |o| o.min(at))))
        });
        let parked = state
            .messages
            .values()
            .filter(|m| m.state() == MessageState::Parked)
            .count() as u64;
        Ok(OutboxStats::new(
            count,
            parked,
            oldest.map(|at| now.saturating_duration_since(at)),
        ))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
