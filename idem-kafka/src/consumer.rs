//! The consuming side: a Kafka consumer group member as an
//! `idem_consumer::Source`, each message an `idem_consumer::Delivery`,
//! offsets committed only past settled messages.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use idem_consumer::{BrokerError, Delivery, RawMessage, RedeliveryHorizon, Source, async_trait};
use idem_core::store::{InboundMessage, Timestamp};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{AGGREGATE_HEADER, BROKER, ID_HEADER, KafkaSetupError, SEQUENCE_HEADER, TYPE_HEADER};

/// librdkafka's `max.poll.interval.ms` unless the configuration sets it.
const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// librdkafka's `session.timeout.ms` unless the configuration sets it.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);

/// How much longer than the member's session timeout [`KafkaSource::close`]
/// waits for it to leave (librdkafka bounds a close by about that timeout
/// while its broker answers).
const CLOSE_MARGIN: Duration = Duration::from_secs(5);

/// How long after a commit asked in the background the source commits
/// the same offsets again, waiting for the broker's answer. librdkafka
/// reports nothing of a commit asked in the background, and one lost on
/// its way (its retries spent while the broker restarts) is otherwise
/// never made again once no later delivery of its partition settles: the
/// group's committed offset stays behind what was applied, and every
/// message after it is delivered again to the partition's next owner.
const RECOMMIT_AFTER: Duration = Duration::from_secs(2);

/// A partition of a topic.
type Place = (String, i32);

/// What the source, its deliveries and the rebalance callbacks share.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// A retry was scheduled: a waiting `next` looks at its time.
    retried: Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
struct State {
    /// The partitions this member holds now.
    partitions: HashMap<Place, Partition>,
    /// The assignment a partition's entry was made in: a delivery of an
    /// earlier one settles nothing.
    epochs: u64,
    /// Retries waiting for their time, by time and then order scheduled.
    retries: BTreeMap<(Instant, u64), Retry>,
    scheduled: u64,
    /// When the commits not yet confirmed are made again, while any may
    /// be outstanding.
    recommit_at: Option<Instant>,
    /// A commit made again is waiting for the broker's answer.
    recommitting: bool,
}

impl State {
    fn assign(&mut self, place: Place) -> u64 {
        self.epochs += 1;
        let epoch = self.epochs;
        self.partitions.insert(
            place,
            Partition {
                epoch,
                handed: BTreeMap::new(),
                committing: None,
                committed: None,
            },
        );
        epoch
    }

    /// The epoch of `place`'s assignment, made now if it has none.
    fn epoch_of(&mut self, place: &Place) -> u64 {
        match self.partitions.get(place) {
            Some(partition) => partition.epoch,
            None => self.assign(place.clone()),
        }
    }

    fn current(&self, place: &Place, epoch: u64) -> Option<&Partition> {
        self.partitions.get(place).filter(|p| p.epoch == epoch)
    }

    /// Settles the delivery at `offset` of `place` in `epoch` and adds the
    /// offset its partition may now commit, if that moved, to `commits`.
    fn settle(
        &mut self,
        place: &Place,
        epoch: u64,
        offset: i64,
        commits: &mut HashMap<Place, i64>,
    ) {
        let Some(partition) = self.partitions.get_mut(place).filter(|p| p.epoch == epoch) else {
            // The partition went to another member: it delivers the
            // message again, and the inbox makes that a duplicate.
            return;
        };
        if let Some(settled) = partition.handed.get_mut(&offset) {
            *settled = true;
        }
        if let Some(next) = partition.release_settled() {
            partition.committing = Some(next);
            commits.insert(place.clone(), next);
            self.recommit_at
                .get_or_insert_with(|| Instant::now() + RECOMMIT_AFTER);
        }
    }

    /// The broker confirmed `offset` as `place`'s committed offset (a
    /// commit made again, answered).
    fn confirmed(&mut self, place: &Place, offset: i64) {
        if let Some(partition) = self.partitions.get_mut(place) {
            partition.committed = partition.committed.max(Some(offset));
        }
    }

    /// The commits asked and not confirmed, when their time to be made
    /// again has come and no commit made again is still unanswered; the
    /// next such time is set while any is left.
    fn due_recommits(&mut self, now: Instant) -> Vec<(Place, i64)> {
        if self.recommitting || self.recommit_at.is_none_or(|at| at > now) {
            return Vec::new();
        }
        let due: Vec<(Place, i64)> = self
            .partitions
            .iter()
            .filter_map(|(place, partition)| {
                let asked = partition.committing?;
                (partition.committed < Some(asked)).then(|| (place.clone(), asked))
            })
            .collect();
        self.recommit_at = (!due.is_empty()).then(|| now + RECOMMIT_AFTER);
        self.recommitting = !due.is_empty();
        due
    }

    /// A commit made again was answered: `Ok` with the offsets it
    /// committed.
    fn recommitted(&mut self, committed: Option<&[(Place, i64)]>) {
        self.recommitting = false;
        for (place, offset) in committed.unwrap_or_default() {
            self.confirmed(place, *offset);
        }
    }
}

/// The messages of one partition handed out and not yet committed past.
struct Partition {
    epoch: u64,
    /// Each handed-out offset, and whether it is settled.
    handed: BTreeMap<i64, bool>,
    /// The offset last asked to be committed (in the background).
    committing: Option<i64>,
    /// The offset the broker last confirmed as committed.
    committed: Option<i64>,
}

impl Partition {
    /// Forgets the settled offsets no unsettled one precedes, and answers
    /// the offset to commit (the first unsettled one, or the one after the
    /// last settled), if any was forgotten.
    fn release_settled(&mut self) -> Option<i64> {
        let mut last = None;
        while let Some(entry) = self.handed.first_entry() {
            if !*entry.get() {
                return last.map(|_| *entry.key());
            }
            last = Some(entry.remove_entry().0);
        }
        last.map(|offset| offset + 1)
    }
}

/// A message to deliver again, in the process, at its time.
struct Retry {
    message: OwnedMessage,
    deliveries: u32,
    epoch: u64,
}

/// Keeps the partitions' entries in step with the group's assignment.
struct Tracking {
    shared: Arc<Shared>,
}

impl ClientContext for Tracking {}

impl ConsumerContext for Tracking {
    /// Before partitions go (a rebalance, or the member's close): commits
    /// what is settled of them, waiting for the answer, and forgets them (a
    /// delivery of theirs still held settles nothing).
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let mut commits = TopicPartitionList::new();
        {
            let mut state = self.shared.state();
            for element in revoked.elements() {
                let place = (element.topic().to_string(), element.partition());
                // Again, and waited for: a commit asked in the background may
                // not have reached the broker before the partition goes.
                if let Some(mut partition) = state.partitions.remove(&place)
                    && let Some(next) = partition.release_settled().or(partition.committing)
                {
                    let _ = commits.add_partition_offset(&place.0, place.1, Offset::Offset(next));
                }
            }
        }
        if commits.count() > 0 {
            // A commit that fails here leaves those messages to be
            // delivered again to the next owner: duplicates, never a loss.
            let _ = base.commit(&commits, CommitMode::Sync);
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(assigned) = rebalance else {
            return;
        };
        let mut state = self.shared.state();
        for element in assigned.elements() {
            state.assign((element.topic().to_string(), element.partition()));
        }
    }
}

type Inner = StreamConsumer<Tracking>;

/// A Kafka consumer group member with automatic offset commits off, as a
/// source of deliveries for an `idem_consumer::Consumer`.
///
/// - The message id is the [`ID_HEADER`] header (the outbox message id
///   when `idem-outbox` published it), or `<topic>:<partition>:<offset>`
///   for a record without one; the type is [`TYPE_HEADER`] (or the
///   topic); the aggregate and its version are [`AGGREGATE_HEADER`] and
///   [`SEQUENCE_HEADER`]. Header values that are not UTF-8 are read with
///   U+FFFD in place of their bad bytes.
/// - An ack settles the delivery; the partition's offset is committed (in
///   the background) up to its first message still unsettled, so a
///   consumer that dies, or a partition that moves to another member,
///   redelivers from there: what was settled after it comes again as
///   duplicates, never is anything skipped. [`Delivery::ack_all`] commits
///   once per partition for its batch. 2 s after a commit asked in the
///   background the source makes it again, waiting for the broker's
///   answer on a thread of its own, and again every 2 s while the source is
///   read until one is answered or the partition goes: a commit lost on
///   its way (in a broker's restart, say) is made again, and the group's
///   committed offsets catch up with what was settled even when nothing
///   more arrives.
/// - Kafka has no negative acknowledgement: a retry keeps the message in
///   this source, which delivers it again after the delay (its
///   [`deliveries`](Delivery::deliveries) one more), while the partition's
///   later messages flow on and its commit waits behind it; the consumer
///   parks it at its own count. A retry of a partition that moved to
///   another member meanwhile is dropped here: the new owner delivers it.
/// - [`deliveries`](Delivery::deliveries) counts this source's own
///   deliveries of a message: a message read again after a restart or a
///   rebalance starts at 1 (Kafka keeps no count).
/// - The horizon's ack wait is `max.poll.interval.ms` (5 minutes by
///   default): a member that does not ask for its next message for that
///   long leaves the group, and its partitions are delivered again by
///   another. It is also how long a rebalance waits for a member that
///   died without leaving (a process killed): the group's other members
///   get no partitions meanwhile, so keep it as short as the longest
///   pause between two calls of [`next`](Source::next) allows.
/// - [`close`](Self::close) leaves the group and waits until it has, for
///   at most the session timeout and 5 s more; dropping the source leaves
///   without waiting. librdkafka's close and a commit waiting for its
///   answer block until the broker answers: they run on threads of their
///   own, which nothing waits for, so a broker gone for good holds up no
///   caller and no runtime's shutdown.
///
/// ```no_run
/// use idem_kafka::KafkaSource;
///
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config = KafkaSource::config("127.0.0.1:9092", "billing");
/// let source = KafkaSource::subscribe(&config, &["orders"])?;
/// println!("{:?}", idem_consumer::Source::horizon(&source));
/// # Ok(()) }
/// ```
pub struct KafkaSource {
    /// `None` once closed.
    consumer: Option<Arc<Inner>>,
    shared: Arc<Shared>,
    horizon: RedeliveryHorizon,
    /// How long [`close`](Self::close) waits for the member to leave.
    close_limit: Duration,
}

/// librdkafka's close blocks until the member has left its group: a
/// dropped source closes on a thread of its own, which nothing waits for
/// (a runtime shutting down included), never on the caller's.
impl Drop for KafkaSource {
    fn drop(&mut self) {
        if let Some(consumer) = self.consumer.take() {
            detached("idem-kafka-close", move || drop(consumer));
        }
    }
}

/// Runs `work` on a thread of its own that nothing waits for; `false` when
/// no thread could be started (then `work` is dropped unrun, and what it
/// owned with it, on the caller's thread). librdkafka's close and a commit
/// waiting for its answer block until the broker answers, which is never
/// once the broker is gone for good: on Tokio's blocking pool such a call
/// would hold up the runtime's shutdown for ever (a service's, or a test's
/// whose broker was removed first).
fn detached(name: &str, work: impl FnOnce() + Send + 'static) -> bool {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(work)
        .is_ok()
}

/// A duration setting of `config` in milliseconds, or librdkafka's
/// `default` when it is not set (librdkafka refuses one it cannot read).
fn millis(config: &ClientConfig, key: &str, default: Duration) -> Duration {
    config
        .get(key)
        .and_then(|ms| ms.parse().ok())
        .map_or(default, Duration::from_millis)
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("horizon", &self.horizon)
            .finish_non_exhaustive()
    }
}

fn unavailable(operation: &'static str) -> impl Fn(String) -> BrokerError {
    move |message| BrokerError::unavailable(BROKER, operation, message)
}

impl KafkaSource {
    /// The configuration of a member of consumer group `group` on `brokers`
    /// (a comma-separated `host:port` list): automatic commits off, a new
    /// group starting at each partition's earliest message. Set more on it
    /// (TLS, SASL, `session.timeout.ms`) as needed, never
    /// `enable.auto.commit`.
    ///
    /// ```
    /// let config = idem_kafka::KafkaSource::config("127.0.0.1:9092", "billing");
    /// assert_eq!(config.get("enable.auto.commit"), Some("false"));
    /// assert_eq!(config.get("group.id"), Some("billing"));
    /// ```
    pub fn config(brokers: &str, group: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("socket.connection.setup.timeout.ms", "5000");
        config
    }

    /// A member made from `config` (start from [`config`](Self::config)),
    /// subscribed to `topics`. It joins its group in the background: the
    /// first [`next`](Source::next) waits for its partitions.
    ///
    /// # Errors
    ///
    /// [`KafkaSetupError::Refused`] when `config` commits by itself
    /// (`enable.auto.commit` not `false`: librdkafka would commit past
    /// messages no one settled); [`KafkaSetupError::Config`] when
    /// librdkafka refuses it or the subscription.
    pub fn subscribe(config: &ClientConfig, topics: &[&str]) -> Result<Self, KafkaSetupError> {
        if config.get("enable.auto.commit") != Some("false") {
            return Err(KafkaSetupError::Refused {
                setting: "enable.auto.commit",
                reason: "must be false".to_string(),
            });
        }
        let ack_wait = millis(config, "max.poll.interval.ms", DEFAULT_MAX_POLL_INTERVAL);
        let session_timeout = millis(config, "session.timeout.ms", DEFAULT_SESSION_TIMEOUT);
        let shared = Arc::new(Shared::default());
        let consumer: Inner = config
            .create_with_context(Tracking {
                shared: Arc::clone(&shared),
            })
            .map_err(KafkaSetupError::Config)?;
        consumer
            .subscribe(topics)
            .map_err(KafkaSetupError::Config)?;
        Ok(Self {
            consumer: Some(Arc::new(consumer)),
            shared,
            horizon: RedeliveryHorizon::new(BROKER, ack_wait),
            close_limit: session_timeout.saturating_add(CLOSE_MARGIN),
        })
    }

    /// Leaves the group and waits until the member has left (librdkafka's
    /// close, on a thread of its own), for at most the member's
    /// `session.timeout.ms` and 5 s more: what it never settled goes to
    /// the group's next owner of its partitions. A broker gone for good
    /// never answers the close; it goes on in the background, and nothing
    /// waits for it (a runtime shutting down included). Dropping the source
    /// leaves too, without waiting.
    ///
    /// ```no_run
    /// # async fn run(source: idem_kafka::KafkaSource) {
    /// source.close().await;
    /// # }
    /// ```
    pub async fn close(mut self) {
        if let Some(consumer) = self.consumer.take() {
            let (left, leaving) = tokio::sync::oneshot::channel();
            detached("idem-kafka-close", move || {
                drop(consumer);
                let _ = left.send(());
            });
            let _ = tokio::time::timeout(self.close_limit, leaving).await;
        }
    }

    fn delivery(&self, message: OwnedMessage, deliveries: u32, epoch: u64) -> KafkaDelivery {
        let (inbound, malformed) = inbound(&message);
        let published_at = message
            .timestamp()
            .to_millis()
            .map(Timestamp::from_unix_millis);
        KafkaDelivery {
            consumer: self
                .consumer
                .as_ref()
                .map_or_else(Weak::new, Arc::downgrade),
            shared: Arc::clone(&self.shared),
            message,
            inbound,
            malformed,
            deliveries,
            published_at,
            epoch,
        }
    }

    /// Commits `offsets` again on a thread of its own (see [`detached`]),
    /// waiting for the broker's answer (librdkafka's commit blocks), and
    /// records what it confirmed; a failed one is made again at the next
    /// time.
    fn recommit(&self, offsets: Vec<(Place, i64)>) {
        let shared = Arc::clone(&self.shared);
        let consumer = self
            .consumer
            .as_ref()
            .map_or_else(Weak::new, Arc::downgrade);
        let started = detached("idem-kafka-commit", move || {
            let committed = consumer.upgrade().is_some_and(|consumer| {
                commit(
                    &consumer,
                    offsets.iter().cloned(),
                    CommitMode::Sync,
                    "commit",
                )
                .is_ok()
            });
            shared
                .state()
                .recommitted(committed.then_some(offsets.as_slice()));
        });
        if !started {
            self.shared.state().recommitted(None);
        }
    }

    /// A retry whose time has come and whose partition is still this
    /// member's, or else when the next one is due.
    fn due_retry(&self) -> Result<KafkaDelivery, Option<Instant>> {
        let mut state = self.shared.state();
        loop {
            let Some(entry) = state.retries.first_entry() else {
                return Err(None);
            };
            let due = entry.key().0;
            if due > Instant::now() {
                return Err(Some(due));
            }
            let retry = entry.remove();
            let place = place_of(&retry.message);
            if state.current(&place, retry.epoch).is_some() {
                drop(state);
                return Ok(self.delivery(retry.message, retry.deliveries, retry.epoch));
            }
        }
    }
}

fn place_of(message: &OwnedMessage) -> Place {
    (message.topic().to_string(), message.partition())
}

/// One delivery of a Kafka record.
pub struct KafkaDelivery {
    consumer: Weak<Inner>,
    shared: Arc<Shared>,
    message: OwnedMessage,
    inbound: InboundMessage,
    /// Why it cannot be applied, if it could not be read.
    malformed: Option<String>,
    deliveries: u32,
    published_at: Option<Timestamp>,
    epoch: u64,
}

impl std::fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDelivery")
            .field("message", &self.inbound)
            .field("partition", &self.message.partition())
            .field("offset", &self.message.offset())
            .field("deliveries", &self.deliveries)
            .finish_non_exhaustive()
    }
}

impl KafkaDelivery {
    /// The record's partition and offset.
    ///
    /// ```no_run
    /// # fn show(delivery: &idem_kafka::KafkaDelivery) {
    /// let (partition, offset) = delivery.position();
    /// println!("partition {partition} at {offset}");
    /// # }
    /// ```
    pub fn position(&self) -> (i32, i64) {
        (self.message.partition(), self.message.offset())
    }

    fn place(&self) -> Place {
        place_of(&self.message)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The message as the consumer reads it: whole, or why it cannot be and
/// what of it can be kept.
fn inbound(message: &OwnedMessage) -> (InboundMessage, Option<String>) {
    let mut id = None;
    let mut kind = None;
    let mut aggregate = None;
    let mut sequence = None;
    let mut others = Vec::new();
    if let Some(headers) = message.headers() {
        for header in headers.iter() {
            let value = header.value.map(text);
            match header.key {
                ID_HEADER => id = value,
                TYPE_HEADER => kind = value,
                AGGREGATE_HEADER => aggregate = value,
                SEQUENCE_HEADER => sequence = value,
                name => others.push((name.to_string(), value.unwrap_or_default())),
            }
        }
    }
    let id = id.unwrap_or_else(|| {
        format!(
            "{}:{}:{}",
            message.topic(),
            message.partition(),
            message.offset()
        )
    });
    let kind = kind.unwrap_or_else(|| message.topic().to_string());
    let payload = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
    let mut raw = RawMessage::new(Some(&id), &kind, payload);
    if let Some(aggregate) = &aggregate {
        raw = raw.with_aggregate(aggregate, sequence.as_deref());
    }
    for (name, value) in &others {
        raw = raw.with_header(name, value);
    }
    raw.read_or_salvage()
}

/// Settles `batch` and commits, once per partition, what that lets each
/// commit.
fn settle(batch: &[&KafkaDelivery]) -> Result<(), BrokerError> {
    let Some(first) = batch.first() else {
        return Ok(());
    };
    let mut commits = HashMap::new();
    {
        let mut state = first.shared.state();
        for delivery in batch {
            state.settle(
                &delivery.place(),
                delivery.epoch,
                delivery.message.offset(),
                &mut commits,
            );
        }
    }
    if commits.is_empty() {
        return Ok(());
    }
    let consumer = first
        .consumer
        .upgrade()
        .ok_or_else(|| unavailable("ack")("the source is closed".to_string()))?;
    // In the background: a commit lost with the process leaves its
    // messages to be delivered again, as duplicates; one lost on the way
    // is made again (`RECOMMIT_AFTER`).
    commit(&consumer, commits, CommitMode::Async, "ack")
}

/// Commits each partition's offset: in the background (`Async`), or
/// waiting for the broker's answer (`Sync`, which blocks).
fn commit(
    consumer: &Inner,
    commits: impl IntoIterator<Item = (Place, i64)>,
    mode: CommitMode,
    operation: &'static str,
) -> Result<(), BrokerError> {
    let mut offsets = TopicPartitionList::new();
    for ((topic, partition), next) in commits {
        offsets
            .add_partition_offset(&topic, partition, Offset::Offset(next))
            .map_err(|e| unavailable(operation)(e.to_string()))?;
    }
    consumer
        .commit(&offsets, mode)
        .map_err(|e| unavailable(operation)(format!("commit: {e}")))
}

#[async_trait]
impl Delivery for KafkaDelivery {
    fn message(&self) -> &InboundMessage {
        &self.inbound
    }

    fn deliveries(&self) -> u32 {
        self.deliveries
    }

    fn malformed(&self) -> Option<&str> {
        self.malformed.as_deref()
    }

    fn published_at(&self) -> Option<Timestamp> {
        self.published_at
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        settle(&[self])
    }

    /// Settles the batch; one commit per partition it moved.
    async fn ack_all(batch: &[&Self]) -> Result<(), BrokerError> {
        settle(batch)
    }

    /// Holds the message in its source, which delivers it again after
    /// `delay`.
    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        let mut state = self.shared.state();
        if state.current(&self.place(), self.epoch).is_none() {
            return Ok(());
        }
        state.scheduled += 1;
        let key = (Instant::now() + delay, state.scheduled);
        state.retries.insert(
            key,
            Retry {
                message: self.message.clone(),
                deliveries: self.deliveries.saturating_add(1),
                epoch: self.epoch,
            },
        );
        drop(state);
        self.shared.retried.notify_one();
        Ok(())
    }
}

#[async_trait]
impl Source for KafkaSource {
    type Delivery = KafkaDelivery;

    async fn next(&mut self) -> Result<Option<KafkaDelivery>, BrokerError> {
        let Some(consumer) = self.consumer.clone() else {
            return Ok(None);
        };
        loop {
            let due = match self.due_retry() {
                Ok(delivery) => return Ok(Some(delivery)),
                Err(due) => due,
            };
            let recommits = self.shared.state().due_recommits(Instant::now());
            if !recommits.is_empty() {
                self.recommit(recommits);
            }
            let wake = due.into_iter().chain(self.shared.state().recommit_at).min();
            let later = tokio::time::sleep_until(
                wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
            );
            tokio::select! {
                received = consumer.recv() => {
                    let message = received.map_err(|e| unavailable("receive")(e.to_string()))?.detach();
                    let epoch = {
                        let mut state = self.shared.state();
                        let place = place_of(&message);
                        let epoch = state.epoch_of(&place);
                        if let Some(partition) = state.partitions.get_mut(&place) {
                            partition.handed.insert(message.offset(), false);
                        }
                        epoch
                    };
                    return Ok(Some(self.delivery(message, 1, epoch)));
                }
                () = later, if wake.is_some() => {}
                () = self.shared.retried.notified() => {}
            }
        }
    }

    fn horizon(&self) -> RedeliveryHorizon {
        self.horizon.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code fails loudly

    use super::*;

    fn place(partition: i32) -> Place {
        ("orders".to_string(), partition)
    }

    /// A partition handed `offsets`, all settled: the commit it asks for.
    fn settled(state: &mut State, partition: i32, offsets: std::ops::Range<i64>) -> i64 {
        let epoch = state.epoch_of(&place(partition));
        let mut commits = HashMap::new();
        for offset in offsets.clone() {
            state
                .partitions
                .get_mut(&place(partition))
                .unwrap()
                .handed
                .insert(offset, false);
        }
        for offset in offsets {
            state.settle(&place(partition), epoch, offset, &mut commits);
        }
        commits[&place(partition)]
    }

    fn past(at: Instant) -> Instant {
        at + RECOMMIT_AFTER + Duration::from_millis(1)
    }

    #[test]
    fn a_commit_is_made_again_after_its_time_until_one_is_answered() {
        let mut state = State::default();
        assert_eq!(settled(&mut state, 0, 0..3), 3);
        let now = Instant::now();
        assert_eq!(state.due_recommits(now), Vec::new(), "not before its time");
        let later = past(now);
        assert_eq!(state.due_recommits(later), vec![(place(0), 3)]);
        assert_eq!(
            state.due_recommits(past(later)),
            Vec::new(),
            "not again while one is unanswered"
        );
        state.recommitted(None);
        let again = past(past(later));
        assert_eq!(
            state.due_recommits(again),
            vec![(place(0), 3)],
            "a failed one"
        );
        state.recommitted(Some(&[(place(0), 3)]));
        assert_eq!(state.due_recommits(past(again)), Vec::new());
        assert_eq!(state.recommit_at, None, "nothing left to make again");
    }

    #[test]
    fn only_partitions_whose_last_commit_is_unanswered_are_committed_again() {
        let mut state = State::default();
        settled(&mut state, 0, 0..2);
        settled(&mut state, 1, 0..5);
        // An older answer does not cover the later commit.
        state.confirmed(&place(0), 1);
        state.confirmed(&place(1), 5);
        assert_eq!(
            state.due_recommits(past(Instant::now())),
            vec![(place(0), 2)]
        );
    }

    #[test]
    fn a_partition_gone_is_not_committed_again() {
        let mut state = State::default();
        settled(&mut state, 0, 0..2);
        state.partitions.remove(&place(0));
        assert_eq!(state.due_recommits(past(Instant::now())), Vec::new());
        assert_eq!(state.recommit_at, None);
    }
}
