//! The relay's rules over the in-process outbox, with publishers that
//! record, refuse or stall: order per aggregate, retries and parking, a
//! relay taken over, wake-ups.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{
    Advance, AdvancedRead, LogBatch, LogPosition, MessageId, NewMessage, OutboxMessage,
    OutboxStats, OutboxStore, OwnerToken, PageAfter, PartitionLease,
};
use idem_memory::MemoryOutbox;
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions, async_trait};

/// Records every message published, refusing the aggregates it is told to.
#[derive(Default)]
struct Recording {
    published: Mutex<Vec<(String, u64, String)>>,
    /// Each publish call's aggregates.
    calls: Mutex<Vec<Vec<String>>>,
    refuse: Mutex<Vec<String>>,
    /// Answers for fewer messages than it was given (a broken publisher).
    short: bool,
}

impl Recording {
    fn per_aggregate(&self) -> HashMap<String, Vec<u64>> {
        let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
        for (aggregate, sequence, _) in self.published.lock().unwrap().iter() {
            seen.entry(aggregate.clone()).or_default().push(*sequence);
        }
        seen
    }
}

#[async_trait]
impl Publisher for Recording {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let refuse = self.refuse.lock().unwrap().clone();
        self.calls.lock().unwrap().push(
            batch
                .iter()
                .map(|m| m.message().aggregate().to_string())
                .collect(),
        );
        let mut answers: Vec<_> = batch
            .iter()
            .map(|m| {
                let aggregate = m.message().aggregate().to_string();
                if refuse.contains(&aggregate) {
                    return Err(PublishError::new("test", "no route"));
                }
                self.published.lock().unwrap().push((
                    aggregate,
                    m.parts().sequence,
                    m.id().to_string(),
                ));
                Ok(Published::stored())
            })
            .collect();
        if self.short {
            answers.pop();
        }
        answers
    }
}

fn message(aggregate: &str, n: u64) -> NewMessage {
    NewMessage::new(aggregate, "event", n.to_string().into_bytes()).unwrap()
}

fn quick() -> RelayOptions {
    RelayOptions::default()
        .with_retries(3, Duration::ZERO, Duration::ZERO)
        .unwrap()
}

#[tokio::test]
async fn a_relay_publishes_each_aggregate_in_sequence_never_two_at_once() {
    let outbox = Arc::new(MemoryOutbox::new());
    for n in 1..=5 {
        for aggregate in ["order-1", "order-2", "order-3"] {
            outbox.enqueue(&message(aggregate, n)).await.unwrap();
        }
        // An aggregate's messages also stand side by side in the log.
        outbox
            .enqueue(&message("order-4", 2 * n - 1))
            .await
            .unwrap();
        outbox.enqueue(&message("order-4", 2 * n)).await.unwrap();
    }
    let publisher = Arc::new(Recording::default());
    let options = quick().with_batch(7).unwrap();
    let relay = Relay::new(outbox.clone(), publisher.clone(), options);
    let drained = relay.drain().await.unwrap();
    assert_eq!(drained.published, 25, "{drained:?}");
    for (aggregate, sequences) in publisher.per_aggregate() {
        let expected: Vec<u64> = (1..=sequences.len() as u64).collect();
        assert_eq!(sequences, expected, "{aggregate} out of order");
    }
    // A batch reaches the broker in waves: never two messages of one
    // aggregate in one publish.
    for call in publisher.calls.lock().unwrap().iter() {
        let mut aggregates = call.clone();
        aggregates.sort();
        aggregates.dedup();
        assert_eq!(aggregates.len(), call.len(), "{call:?}");
    }
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

/// Every field of every event logged, as text.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<HashMap<String, String>>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logged {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields<'a>(&'a mut HashMap<String, String>);
        impl tracing::field::Visit for Fields<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0
                    .insert(field.name().to_string(), format!("{value:?}"));
            }
        }
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
}

/// The warning of a parked message names its aggregate by a hash only: an
/// aggregate's key can be personal data.
#[tokio::test(flavor = "current_thread")]
async fn a_parked_message_is_logged_with_its_aggregates_hash_never_the_aggregate() {
    use tracing_subscriber::layer::SubscriberExt;

    let aggregate = "customer-jane@example.com";
    let outbox = Arc::new(MemoryOutbox::new());
    outbox.enqueue(&message(aggregate, 1)).await.unwrap();
    let publisher = Arc::new(Recording::default());
    publisher.refuse.lock().unwrap().push(aggregate.into());
    let relay = Relay::new(outbox.clone(), publisher, quick());
    let logged = Logged::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(logged.clone()));
    let mut parked = 0;
    for _ in 0..6 {
        parked += relay.relay_once().await.unwrap().parked;
    }
    assert_eq!(parked, 1);
    let events = logged.0.lock().unwrap().clone();
    let warning = events
        .iter()
        .find(|fields| fields.get("message").is_some_and(|m| m.contains("parked")))
        .expect("the parked message's warning");
    assert_eq!(
        warning.get("aggregate_hash"),
        Some(&idem_core::redacted(aggregate))
    );
    for fields in &events {
        assert!(
            fields.values().all(|value| !value.contains("jane")),
            "{fields:?}"
        );
    }
}

#[tokio::test]
async fn a_message_that_keeps_failing_is_parked_and_only_its_aggregate_waits() {
    let outbox = Arc::new(MemoryOutbox::new());
    for aggregate in ["poison", "healthy"] {
        for n in 1..=2 {
            outbox.enqueue(&message(aggregate, n)).await.unwrap();
        }
    }
    let publisher = Arc::new(Recording::default());
    publisher.refuse.lock().unwrap().push("poison".into());
    let relay = Relay::new(outbox.clone(), publisher.clone(), quick());
    let mut parked = 0;
    for _ in 0..6 {
        parked += relay.relay_once().await.unwrap().parked;
    }
    assert_eq!(parked, 1, "parked after its third attempt");
    let seen = publisher.per_aggregate();
    assert_eq!(seen.get("healthy").map(Vec::as_slice), Some(&[1, 2][..]));
    assert!(!seen.contains_key("poison"));
    let waiting = outbox.parked(None, 10).await.unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].parts().attempts, 3);
    assert!(
        waiting[0]
            .parts()
            .last_error
            .as_deref()
            .unwrap()
            .contains("no route")
    );
    // The one behind it waits in the lane, unpublished.
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.pending, stats.parked), (1, 1), "{stats:?}");
    // The operator fixes the route and retries: the aggregate flows again,
    // in order.
    publisher.refuse.lock().unwrap().clear();
    assert!(outbox.retry(waiting[0].id()).await.unwrap());
    relay.drain().await.unwrap();
    assert_eq!(
        publisher.per_aggregate().get("poison").map(Vec::as_slice),
        Some(&[1, 2][..])
    );
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn a_failed_publish_waits_its_back_off_before_the_next_attempt() {
    let outbox = Arc::new(MemoryOutbox::new());
    outbox.enqueue(&message("order-1", 1)).await.unwrap();
    let publisher = Arc::new(Recording::default());
    publisher.refuse.lock().unwrap().push("order-1".into());
    let options = RelayOptions::default()
        .with_retries(5, Duration::from_secs(3600), Duration::from_secs(3600))
        .unwrap();
    let relay = Relay::new(outbox.clone(), publisher, options);
    assert_eq!(relay.relay_once().await.unwrap().failed, 1);
    // Within an hour's back-off nothing is read or retried.
    assert_eq!(relay.relay_once().await.unwrap().read, 0);
    assert_eq!(outbox.stats().await.unwrap().pending, 1);
}

#[tokio::test]
async fn a_publisher_that_answers_too_little_fails_the_unanswered_message() {
    let outbox = Arc::new(MemoryOutbox::new());
    outbox.enqueue(&message("order-1", 1)).await.unwrap();
    outbox.enqueue(&message("order-2", 1)).await.unwrap();
    let publisher = Arc::new(Recording {
        short: true,
        ..Recording::default()
    });
    let relay = Relay::new(outbox.clone(), publisher, quick());
    let pass = relay.relay_once().await.unwrap();
    assert_eq!((pass.published, pass.failed), (1, 1), "{pass:?}");
}

/// Publishes, then lets its lease lapse and another relay take the
/// partition over before the first relay settles: the first settles
/// nothing, the second publishes again with the same id (what a broker's or
/// consumer's deduplication is for).
struct Slow {
    inner: Recording,
    hold: Duration,
}

#[async_trait]
impl Publisher for Slow {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let answers = self.inner.publish(batch).await;
        tokio::time::sleep(self.hold).await;
        answers
    }
}

#[tokio::test]
async fn a_relay_whose_lease_was_taken_over_moves_no_cursor() {
    let outbox = Arc::new(MemoryOutbox::new());
    let placed = outbox.enqueue(&message("order-1", 1)).await.unwrap();
    let slow = Arc::new(Slow {
        inner: Recording::default(),
        hold: Duration::from_millis(600),
    });
    let short_lease = quick().with_lease(Duration::from_millis(100)).unwrap();
    let stale = Relay::new(outbox.clone(), slow.clone(), short_lease);
    let fresh_publisher = Arc::new(Recording::default());
    let fresh = Relay::new(outbox.clone(), fresh_publisher.clone(), quick());
    let stalled = tokio::spawn({
        let stale = stale.clone();
        async move { stale.relay_once().await }
    });
    // The stale relay has read and published; now it waits on its broker
    // while its lease lapses.
    while slow.inner.published.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let taken = loop {
        let pass = fresh.relay_once().await.unwrap();
        if pass.published == 1 {
            break pass;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(taken.partitions, 1);
    let pass = stalled.await.unwrap().unwrap();
    assert_eq!((pass.published, pass.lost), (0, 1), "{pass:?}");
    assert!(
        stale.partitions().is_empty(),
        "it forgot the lost partition"
    );
    let twice: Vec<String> = slow
        .inner
        .published
        .lock()
        .unwrap()
        .iter()
        .chain(fresh_publisher.published.lock().unwrap().iter())
        .map(|(_, _, id)| id.clone())
        .collect();
    assert_eq!(twice, [placed.id().to_string(), placed.id().to_string()]);
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn a_loop_of_drains_keeps_its_idle_partition_past_the_lease() {
    let outbox = Arc::new(MemoryOutbox::new());
    let publisher = Arc::new(Recording::default());
    // Passes come more often than a third of the lease (plenty of room
    // for a slow machine), and go on for longer than the lease. Holding
    // all it may, the relay acquires nothing more in a pass.
    let lease = Duration::from_secs(3);
    let options = quick().with_lease(lease).unwrap().with_max_partitions(1);
    let relay = Relay::new(outbox.clone(), publisher.clone(), options.unwrap());
    relay.drain().await.unwrap();
    assert_eq!(relay.partitions(), [0]);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        relay.drain().await.unwrap();
    }
    // Still its own: nobody else takes it, and what comes is published and
    // settled under the lease it kept.
    let other = Relay::new(outbox.clone(), publisher.clone(), quick());
    other.relay_once().await.unwrap();
    assert!(other.partitions().is_empty(), "the idle lease lapsed");
    outbox.enqueue(&message("order-1", 1)).await.unwrap();
    let pass = relay.drain().await.unwrap();
    assert_eq!((pass.published, pass.lost), (1, 0), "{pass:?}");
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn relays_share_the_partitions_and_take_over_a_dead_ones_after_its_lease() {
    let outbox = Arc::new(MemoryOutbox::with_partitions(4, idem_core::store::SystemClock).unwrap());
    for n in 1..=3 {
        for aggregate in 0..20 {
            outbox
                .enqueue(&message(&format!("order-{aggregate}"), n))
                .await
                .unwrap();
        }
    }
    let publisher = Arc::new(Recording::default());
    let two = quick().with_max_partitions(2).unwrap();
    let short = two.with_lease(Duration::from_millis(300)).unwrap();
    let first = Relay::new(outbox.clone(), publisher.clone(), short);
    let second = Relay::new(outbox.clone(), publisher.clone(), two);
    first.relay_once().await.unwrap();
    second.relay_once().await.unwrap();
    let (mut a, b) = (first.partitions(), second.partitions());
    assert_eq!((a.len(), b.len()), (2, 2), "{a:?} {b:?}");
    a.extend(&b);
    a.sort_unstable();
    assert_eq!(a, [0, 1, 2, 3], "a partition held twice");
    // The first relay dies; once its leases lapse a relay with room takes
    // its partitions over and publishes everything, in order.
    drop(first);
    let survivor = Relay::new(outbox.clone(), publisher.clone(), quick());
    tokio::time::sleep(Duration::from_millis(400)).await;
    survivor.drain().await.unwrap();
    second.drain().await.unwrap();
    assert_eq!(survivor.partitions().len(), 2);
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
    for (aggregate, sequences) in publisher.per_aggregate() {
        let mut firsts = sequences.clone();
        firsts.dedup();
        assert_eq!(firsts, [1, 2, 3], "{aggregate} out of order: {sequences:?}");
    }
    // At shutdown a relay gives its partitions back at once.
    second.release().await;
    assert!(second.partitions().is_empty());
    let taker = Relay::new(outbox.clone(), publisher, quick());
    taker.relay_once().await.unwrap();
    assert_eq!(taker.partitions().len(), 2);
}

#[tokio::test]
async fn a_wake_up_publishes_without_waiting_for_the_poll_interval() {
    let outbox = Arc::new(MemoryOutbox::new());
    let publisher = Arc::new(Recording::default());
    let options = quick()
        .with_poll_interval(Duration::from_secs(3600))
        .unwrap();
    // Relays may share one waker (one listener for a process).
    let waker = Arc::new(tokio::sync::Notify::new());
    let relay = Relay::new(outbox.clone(), publisher.clone(), options).with_waker(waker.clone());
    assert!(Arc::ptr_eq(&relay.waker(), &waker));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        }
    });
    // Let the relay go idle first, then commit and wake it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    outbox.enqueue(&message("order-1", 1)).await.unwrap();
    waker.notify_one();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while publisher.published.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "not woken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    running.await.unwrap();
    // Its shutdown gave the partition back.
    assert_eq!(outbox.stats().await.unwrap().partitions[0].holder, None);
}

#[test]
fn options_out_of_range_are_refused() {
    assert!(RelayOptions::default().with_batch(0).is_err());
    assert!(RelayOptions::default().with_batch(1001).is_err());
    assert!(RelayOptions::default().with_lease(Duration::ZERO).is_err());
    assert!(
        RelayOptions::default()
            .with_retries(0, Duration::ZERO, Duration::ZERO)
            .is_err()
    );
    assert!(
        RelayOptions::default()
            .with_retries(3, Duration::from_secs(2), Duration::from_secs(1))
            .is_err()
    );
    assert!(
        RelayOptions::default()
            .with_poll_interval(Duration::ZERO)
            .is_err()
    );
    assert!(RelayOptions::default().with_in_flight(0).is_err());
    assert!(
        RelayOptions::default()
            .with_in_flight(idem_outbox::MAX_IN_FLIGHT + 1)
            .is_err()
    );
    assert!(RelayOptions::default().with_max_partitions(0).is_err());
    assert!(RelayOptions::default().with_max_partitions(1025).is_err());
}

/// Each stage of a relay reported to the test as it starts, and held there
/// until the test lets it go (or let through at once, when open).
struct Gate {
    arrived: tokio::sync::mpsc::UnboundedSender<Vec<(String, u64)>>,
    permits: tokio::sync::Semaphore,
}

/// The test's end of a [`Gate`].
struct GateControl {
    arrivals: tokio::sync::mpsc::UnboundedReceiver<Vec<(String, u64)>>,
    gate: Arc<Gate>,
}

fn gate(open: bool) -> (Arc<Gate>, GateControl) {
    let (arrived, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let permits = if open {
        tokio::sync::Semaphore::MAX_PERMITS
    } else {
        0
    };
    let gate = Arc::new(Gate {
        arrived,
        permits: tokio::sync::Semaphore::new(permits),
    });
    (gate.clone(), GateControl { arrivals, gate })
}

impl Gate {
    async fn pass(&self, what: Vec<(String, u64)>) {
        let _ = self.arrived.send(what);
        self.permits.acquire().await.unwrap().forget();
    }
}

impl GateControl {
    /// The next arrival, waiting for it (generously: a busy machine).
    async fn next(&mut self) -> Vec<(String, u64)> {
        tokio::time::timeout(Duration::from_secs(60), self.arrivals.recv())
            .await
            .expect("the relay reached the stage")
            .expect("the gate is alive")
    }

    /// Whether nothing arrived that was not received yet.
    fn quiet(&mut self) -> bool {
        self.arrivals.try_recv().is_err()
    }

    fn release(&self, times: usize) {
        self.gate.permits.add_permits(times);
    }

    fn open(&self) {
        self.release(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }
}

fn heads(batch: &[OutboxMessage]) -> Vec<(String, u64)> {
    batch
        .iter()
        .map(|m| (m.message().aggregate().to_string(), m.parts().sequence))
        .collect()
}

fn named(heads: &[(&str, u64)]) -> Vec<(String, u64)> {
    heads.iter().map(|(a, s)| (a.to_string(), *s)).collect()
}

/// The in-process outbox with its reads reported, its advances held at a
/// gate, the reads it is told to fail, and a count of what purges delete.
/// Its clock moves only when told, so enqueue times are the test's.
#[derive(Debug)]
struct Staged {
    inner: MemoryOutbox,
    clock: idem_core::ManualClock,
    reads: Option<Arc<Gate>>,
    advances: Option<Arc<Gate>>,
    /// The reads (counted from 1) that fail as unavailable.
    fail_reads: Vec<usize>,
    read: std::sync::atomic::AtomicUsize,
    /// Every advance, alone or with a read.
    advanced: std::sync::atomic::AtomicUsize,
    /// The advances that carried a read.
    combined: std::sync::atomic::AtomicUsize,
    purged: std::sync::atomic::AtomicU64,
}

impl Staged {
    /// The store's round trips for the log so far: each read and each
    /// advance, an advance with its read counting once.
    fn round_trips(&self) -> usize {
        use std::sync::atomic::Ordering::SeqCst;
        self.read.load(SeqCst) + self.advanced.load(SeqCst) - self.combined.load(SeqCst)
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl Default for Staged {
    fn default() -> Self {
        let clock =
            idem_core::ManualClock::new(idem_core::store::Timestamp::from_unix_millis(1_000_000));
        Self {
            inner: MemoryOutbox::with_clock(clock.clone()),
            clock,
            reads: None,
            advances: None,
            fail_reads: Vec::new(),
            read: Default::default(),
            advanced: Default::default(),
            combined: Default::default(),
            purged: Default::default(),
        }
    }
}

#[async_trait]
impl OutboxStore for Staged {
    async fn enqueue(&self, m: &NewMessage) -> Result<OutboxMessage, idem_core::StoreError> {
        self.inner.enqueue(m).await
    }
    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, idem_core::StoreError> {
        self.inner.acquire(owner, lease).await
    }
    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, idem_core::StoreError> {
        let n = self.read.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if self.fail_reads.contains(&n) {
            return Err(idem_core::StoreError::unavailable(
                "memory",
                idem_core::Operation::Read,
                "injected",
            ));
        }
        let batch = self.inner.read(partition, after, limit).await?;
        if let Some(gate) = &self.reads {
            gate.pass(heads(&batch.messages)).await;
        }
        Ok(batch)
    }
    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, idem_core::StoreError> {
        if let Some(gate) = &self.advances
            && !advance.is_empty()
        {
            gate.pass(Vec::new()).await;
        }
        self.advanced
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.advance(lease, advance).await
    }
    async fn advance_and_read(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
        after: LogPosition,
        limit: usize,
    ) -> Result<AdvancedRead, idem_core::StoreError> {
        self.combined
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let renewed = self.advance(lease, advance).await?;
        let batch = self.read(lease.partition(), after, limit).await;
        Ok(AdvancedRead::new(renewed, batch))
    }
    async fn due(
        &self,
        partition: u32,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, idem_core::StoreError> {
        self.inner.due(partition, limit).await
    }
    async fn release(&self, lease: &PartitionLease) -> Result<bool, idem_core::StoreError> {
        self.inner.release(lease).await
    }
    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, idem_core::StoreError> {
        self.inner.parked(after, limit).await
    }
    async fn retry(&self, id: MessageId) -> Result<bool, idem_core::StoreError> {
        self.inner.retry(id).await
    }
    async fn drop_message(
        &self,
        id: MessageId,
        reason: &str,
    ) -> Result<bool, idem_core::StoreError> {
        self.inner.drop_message(id, reason).await
    }
    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, idem_core::StoreError> {
        self.inner.message(id).await
    }
    async fn purge_sent(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<u64, idem_core::StoreError> {
        let purged = self.inner.purge_sent(older_than, limit).await?;
        self.purged
            .fetch_add(purged, std::sync::atomic::Ordering::SeqCst);
        Ok(purged)
    }
    async fn stats(&self) -> Result<OutboxStats, idem_core::StoreError> {
        self.inner.stats().await
    }
    fn capabilities(&self) -> idem_core::store::Capabilities {
        self.inner.capabilities()
    }
}

/// A publisher held at a gate on every call, refusing each aggregate it is
/// told to once, recording every attempt and how many calls it ever held
/// at once.
struct Held {
    gate: Arc<Gate>,
    refuse_once: Mutex<Vec<String>>,
    attempts: Mutex<Vec<(String, u64, bool)>>,
    holding: std::sync::atomic::AtomicUsize,
    most_held: std::sync::atomic::AtomicUsize,
}

impl Held {
    fn new(gate: Arc<Gate>) -> Self {
        Self {
            gate,
            refuse_once: Mutex::new(Vec::new()),
            attempts: Mutex::new(Vec::new()),
            holding: Default::default(),
            most_held: Default::default(),
        }
    }

    /// The sequences each aggregate was published in.
    fn published(&self) -> HashMap<String, Vec<u64>> {
        let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
        for (aggregate, sequence, ok) in self.attempts.lock().unwrap().iter() {
            if *ok {
                seen.entry(aggregate.clone()).or_default().push(*sequence);
            }
        }
        seen
    }
}

#[async_trait]
impl Publisher for Held {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.holding.fetch_add(1, SeqCst) + 1;
        self.most_held.fetch_max(now, SeqCst);
        self.gate.pass(heads(batch)).await;
        let answers = batch
            .iter()
            .map(|m| {
                let aggregate = m.message().aggregate().to_string();
                let mut refuse = self.refuse_once.lock().unwrap();
                let refused = refuse.contains(&aggregate);
                refuse.retain(|a| *a != aggregate);
                self.attempts
                    .lock()
                    .unwrap()
                    .push((aggregate, m.parts().sequence, !refused));
                if refused {
                    Err(PublishError::new("test", "refused once"))
                } else {
                    Ok(Published::stored())
                }
            })
            .collect();
        self.holding.fetch_sub(1, SeqCst);
        answers
    }
}

/// `aggregates` with `per_aggregate` messages each, enqueued round-robin a
/// millisecond apart.
async fn interleaved(outbox: &Staged, aggregates: &[&str], per_aggregate: u64) {
    for n in 1..=per_aggregate {
        for aggregate in aggregates {
            outbox.enqueue(&message(aggregate, n)).await.unwrap();
            outbox.clock.advance(Duration::from_millis(1));
        }
    }
}

/// The relay of `drain_in_pairs`.
type Pairs = Relay<Staged, Held>;

/// A drain of `outbox` through `publisher`, two messages a batch, with
/// `in_flight` batches in flight, in a task of its own; and the relay, for
/// the drains after it.
fn drain_in_pairs(
    outbox: &Arc<Staged>,
    publisher: &Arc<Held>,
    in_flight: usize,
) -> (
    Pairs,
    tokio::task::JoinHandle<Result<idem_outbox::RelayPass, idem_outbox::RelayError>>,
) {
    let options = quick()
        .with_batch(2)
        .unwrap()
        .with_in_flight(in_flight)
        .unwrap();
    let relay = Relay::new(outbox.clone(), publisher.clone(), options);
    let draining = tokio::spawn({
        let relay = relay.clone();
        async move { relay.drain().await }
    });
    (relay, draining)
}

/// A batch the broker confirmed while the settlement before it (with its
/// read) was still out goes, once that settlement is back, with the next
/// read too: the window stays one store round trip per batch.
#[tokio::test]
async fn a_batch_confirmed_during_a_settlement_settles_with_the_next_read() {
    let (advances, mut advancing) = gate(false);
    let (publishes, mut publishing) = gate(false);
    let outbox = Arc::new(Staged {
        advances: Some(advances),
        ..Staged::default()
    });
    interleaved(&outbox, &["a", "b", "c", "d", "e", "f", "g", "h"], 1).await;
    let publisher = Arc::new(Held::new(publishes));
    let (_, draining) = drain_in_pairs(&outbox, &publisher, 2);
    let combined = || outbox.combined.load(std::sync::atomic::Ordering::SeqCst);

    // Two batches read fill the window; the first one's settlement carries
    // the third read, and is held while the second batch is confirmed.
    assert_eq!(publishing.next().await, named(&[("a", 1), ("b", 1)]));
    publishing.release(1);
    advancing.next().await;
    assert_eq!(combined(), 1);
    assert_eq!(publishing.next().await, named(&[("c", 1), ("d", 1)]));
    publishing.release(1);
    // On this single-threaded runtime the relay, woken, runs before the
    // test goes on, until it waits again: the second batch's confirm is in
    // before the first settlement goes on.
    tokio::task::yield_now().await;
    advancing.release(1);
    advancing.next().await;
    assert_eq!(combined(), 2, "the second settlement went without a read");
    publishing.open();
    advancing.open();
    let drained = draining.await.unwrap().unwrap();
    assert_eq!((drained.published, drained.batches), (8, 4), "{drained:?}");
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn batches_in_flight_are_read_ahead_published_one_at_a_time_and_settled_in_order() {
    let (reads, mut read) = gate(true);
    let (advances, mut advancing) = gate(false);
    let (publishes, mut publishing) = gate(false);
    let outbox = Arc::new(Staged {
        reads: Some(reads),
        advances: Some(advances),
        ..Staged::default()
    });
    interleaved(&outbox, &["a", "b", "c", "d", "e", "f"], 2).await;
    let publisher = Arc::new(Held::new(publishes));
    let (_, draining) = drain_in_pairs(&outbox, &publisher, 4);

    // The first batch is held at the broker; three more reads fill the
    // window, nothing settled yet.
    assert_eq!(read.next().await, named(&[("a", 1), ("b", 1)]));
    assert_eq!(publishing.next().await, named(&[("a", 1), ("b", 1)]));
    assert_eq!(read.next().await, named(&[("c", 1), ("d", 1)]));
    assert_eq!(read.next().await, named(&[("e", 1), ("f", 1)]));
    assert_eq!(read.next().await, named(&[("a", 2), ("b", 2)]));
    // The broker confirms the first batch; its settlement is held while
    // the second batch publishes: one batch at the broker at a time, and
    // the window stays full until a settlement.
    publishing.release(1);
    assert_eq!(advancing.next().await.len(), 0);
    assert_eq!(publishing.next().await, named(&[("c", 1), ("d", 1)]));
    assert!(read.quiet(), "read past a full window");
    // Once the first batch is settled, the next read goes out.
    advancing.release(1);
    assert_eq!(read.next().await, named(&[("c", 2), ("d", 2)]));

    advancing.open();
    publishing.open();
    let drained = draining.await.unwrap().unwrap();
    assert_eq!((drained.published, drained.batches), (12, 6), "{drained:?}");
    assert_eq!(
        publisher
            .most_held
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let published = publisher.published();
    assert_eq!(published.len(), 6);
    for (aggregate, sequences) in published {
        assert_eq!(sequences, [1, 2], "{aggregate} out of order");
    }
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

/// With one batch in flight, every read after a partition's first goes
/// with the settlement of the batch before it: the store answers one round
/// trip per batch, and one more per partition (its first read, or its last
/// that finds nothing).
#[tokio::test]
async fn a_drain_reads_each_next_batch_with_the_last_ones_settlement() {
    let outbox = Arc::new(Staged::default());
    for n in 0..50 {
        let message = NewMessage::new(&format!("order-{n}"), "placed", vec![]).unwrap();
        outbox.enqueue(&message).await.unwrap();
    }
    let options = RelayOptions::default()
        .with_batch(10)
        .unwrap()
        .with_in_flight(1)
        .unwrap();
    let publisher = Arc::new(Recording::default());
    let relay = Relay::new(outbox.clone(), publisher.clone(), options);
    let drained = relay.drain().await.unwrap();
    assert_eq!(drained.published, 50, "{drained:?}");
    assert_eq!(
        outbox.round_trips(),
        drained.batches + drained.partitions,
        "{drained:?}"
    );
    assert_eq!(
        outbox.combined.load(std::sync::atomic::Ordering::SeqCst),
        drained.batches,
        "a settlement went without the next read"
    );
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn a_message_read_ahead_of_a_failure_is_held_unpublished_and_follows_the_retry() {
    let (publishes, mut publishing) = gate(false);
    let outbox = Arc::new(Staged::default());
    interleaved(&outbox, &["a", "b", "c", "d"], 2).await;
    let publisher = Arc::new(Held::new(publishes));
    publisher.refuse_once.lock().unwrap().push("a".into());
    let (relay, draining) = drain_in_pairs(&outbox, &publisher, 3);

    // a1 fails while a2, read ahead, waits: a2 never reaches the broker in
    // this drain; it is held behind a1, in the retry lane.
    assert_eq!(publishing.next().await, named(&[("a", 1), ("b", 1)]));
    publishing.release(1);
    assert_eq!(publishing.next().await, named(&[("c", 1), ("d", 1)]));
    publishing.release(1);
    assert_eq!(publishing.next().await, named(&[("b", 2)]));
    publishing.release(1);
    assert_eq!(publishing.next().await, named(&[("c", 2), ("d", 2)]));
    publishing.release(1);
    let drained = draining.await.unwrap().unwrap();
    assert_eq!(
        (drained.published, drained.failed, drained.held),
        (6, 1, 1),
        "{drained:?}"
    );
    // The next drain retries a1 (no back-off here), then a2 behind it.
    publishing.open();
    let retried = relay.drain().await.unwrap();
    assert_eq!(retried.published, 2, "{retried:?}");
    let attempts: Vec<(u64, bool)> = publisher
        .attempts
        .lock()
        .unwrap()
        .iter()
        .filter(|(aggregate, _, _)| aggregate == "a")
        .map(|(_, sequence, ok)| (*sequence, *ok))
        .collect();
    assert_eq!(attempts, [(1, false), (1, true), (2, true)]);
    for (aggregate, sequences) in publisher.published() {
        assert_eq!(sequences, [1, 2], "{aggregate} out of order");
    }
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn a_store_failure_mid_drain_reads_nothing_more_but_settles_what_it_read() {
    let (publishes, mut publishing) = gate(false);
    let outbox = Arc::new(Staged {
        fail_reads: vec![2],
        ..Staged::default()
    });
    interleaved(&outbox, &["a", "b", "c", "d"], 1).await;
    let publisher = Arc::new(Held::new(publishes));
    let (relay, draining) = drain_in_pairs(&outbox, &publisher, 3);

    assert_eq!(publishing.next().await, named(&[("a", 1), ("b", 1)]));
    // The second read fails while the first batch is at the broker.
    tokio::time::timeout(Duration::from_secs(60), async {
        while outbox.read.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the second read was made");
    publishing.release(1);
    let error = draining.await.unwrap().unwrap_err();
    assert!(error.to_string().contains("injected"), "{error}");
    assert_eq!(outbox.read.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The first batch was published and settled; the rest waits past the
    // cursor, for the next drain.
    assert_eq!(outbox.stats().await.unwrap().pending, 2);
    publishing.open();
    assert_eq!(relay.drain().await.unwrap().published, 2);
}

#[tokio::test]
async fn a_blocked_aggregates_new_messages_wait_behind_its_parked_one() {
    let outbox = Arc::new(MemoryOutbox::new());
    outbox.enqueue(&message("poison", 1)).await.unwrap();
    let publisher = Arc::new(Recording::default());
    publisher.refuse.lock().unwrap().push("poison".into());
    let once = RelayOptions::default()
        .with_retries(1, Duration::ZERO, Duration::ZERO)
        .unwrap();
    let relay = Relay::new(outbox.clone(), publisher.clone(), once);
    assert_eq!(relay.drain().await.unwrap().parked, 1);
    // Later messages of the parked aggregate wait behind it; another
    // aggregate flows.
    publisher.refuse.lock().unwrap().clear();
    outbox.enqueue(&message("poison", 2)).await.unwrap();
    outbox.enqueue(&message("healthy", 1)).await.unwrap();
    let pass = relay.drain().await.unwrap();
    assert_eq!((pass.published, pass.held), (1, 1), "{pass:?}");
    assert!(!publisher.per_aggregate().contains_key("poison"));
    let parked = outbox.parked(None, 10).await.unwrap();
    assert!(outbox.retry(parked[0].id()).await.unwrap());
    relay.drain().await.unwrap();
    assert_eq!(
        publisher.per_aggregate().get("poison").map(Vec::as_slice),
        Some(&[1, 2][..])
    );
}

#[tokio::test]
async fn an_idle_relay_purges_sent_messages_past_their_retention() {
    let outbox = Arc::new(Staged::default());
    outbox.enqueue(&message("order-1", 1)).await.unwrap();
    outbox.enqueue(&message("order-2", 1)).await.unwrap();
    let publisher = Arc::new(Recording::default());
    publisher.refuse.lock().unwrap().push("order-2".into());
    let options = RelayOptions::default()
        .with_retries(100, Duration::from_secs(3600), Duration::from_secs(3600))
        .unwrap()
        .with_retention(Duration::ZERO, Duration::from_millis(10))
        .unwrap()
        .with_poll_interval(Duration::from_millis(10))
        .unwrap();
    let relay = Relay::new(outbox.clone(), publisher, options);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let relay = relay.clone();
        async move {
            relay
                .run(async {
                    let _ = stopped.await;
                })
                .await;
        }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while outbox.purged.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "nothing purged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = stop.send(());
    running.await.unwrap();
    // The sent message went; the one waiting for its retry stayed.
    assert_eq!(outbox.purged.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(outbox.stats().await.unwrap().pending, 1);
}

#[test]
fn a_pass_is_counted_and_measured_through_the_metrics_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let outbox = Arc::new(MemoryOutbox::new());
                outbox.enqueue(&message("order-1", 1)).await.unwrap();
                outbox.enqueue(&message("poison", 1)).await.unwrap();
                let publisher = Arc::new(Recording::default());
                publisher.refuse.lock().unwrap().push("poison".into());
                let options = RelayOptions::default()
                    .with_retries(1, Duration::ZERO, Duration::ZERO)
                    .unwrap()
                    .with_poll_interval(Duration::from_millis(5))
                    .unwrap();
                let relay = Relay::new(outbox, publisher, options);
                let pass = relay.relay_once().await.unwrap();
                assert_eq!((pass.published, pass.parked), (1, 1));
                // An idle run refreshes the gauges, then stops.
                relay
                    .run(tokio::time::sleep(Duration::from_millis(50)))
                    .await;
            });
    });
    let mut seen = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.len() as f64,
        };
        seen.insert(key.key().name().to_string(), value);
    }
    assert_eq!(seen.get(idem_outbox::PUBLISHED), Some(&1.0), "{seen:?}");
    assert_eq!(seen.get(idem_outbox::PARKED), Some(&1.0), "{seen:?}");
    assert_eq!(seen.get(idem_outbox::FAILED), Some(&1.0), "{seen:?}");
    assert_eq!(
        seen.get(idem_outbox::PUBLISH_DURATION),
        Some(&1.0),
        "{seen:?}"
    );
    assert_eq!(seen.get(idem_outbox::PENDING), Some(&0.0), "{seen:?}");
    assert!(seen.contains_key(idem_outbox::OLDEST_PENDING), "{seen:?}");
    assert_eq!(seen.get(idem_outbox::PARTITION_LAG), Some(&0.0), "{seen:?}");
}
