//! The relay's rules over the in-process outbox, with publishers that
//! record, refuse or stall: order per aggregate, retries and parking, a
//! relay taken over, wake-ups.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{NewMessage, OutboxMessage, OutboxStore};
use idem_memory::MemoryOutbox;
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions, async_trait};

/// Records every message published, refusing the aggregates it is told to.
#[derive(Default)]
struct Recording {
    published: Mutex<Vec<(String, u64, String)>>,
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
async fn a_relay_publishes_each_aggregate_in_sequence_one_at_a_time() {
    let outbox = Arc::new(MemoryOutbox::new());
    for n in 1..=5 {
        for aggregate in ["order-1", "order-2", "order-3"] {
            outbox.enqueue(&message(aggregate, n)).await.unwrap();
        }
    }
    let publisher = Arc::new(Recording::default());
    let relay = Relay::new(outbox.clone(), publisher.clone(), quick());
    let mut passes = 0;
    loop {
        let pass = relay.relay_once().await.unwrap();
        if pass.claimed == 0 {
            break;
        }
        // One message per aggregate in flight: a pass holds three at most.
        assert!(pass.claimed <= 3, "{pass:?}");
        passes += 1;
    }
    assert_eq!(passes, 5);
    for (aggregate, sequences) in publisher.per_aggregate() {
        assert_eq!(sequences, [1, 2, 3, 4, 5], "{aggregate} out of order");
    }
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
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
    let waiting = outbox.parked(10).await.unwrap();
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
    // The operator fixes the route and retries: the aggregate flows again.
    publisher.refuse.lock().unwrap().clear();
    assert!(outbox.retry(waiting[0].id()).await.unwrap());
    relay.relay_once().await.unwrap();
    relay.relay_once().await.unwrap();
    assert_eq!(
        publisher.per_aggregate().get("poison").map(Vec::as_slice),
        Some(&[1, 2][..])
    );
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
    // Within an hour's back-off nothing is claimed again.
    assert_eq!(relay.relay_once().await.unwrap().claimed, 0);
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

/// Publishes, then lets its lease lapse and another relay take over before
/// the first relay marks: the first marks nothing, the second publishes
/// again with the same id (what a broker's or consumer's deduplication is
/// for).
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
async fn a_relay_whose_lease_was_taken_over_marks_nothing() {
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
    let stalled = tokio::spawn(async move { stale.relay_once().await });
    // The stale relay has claimed and published; now it waits on its broker
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
    assert_eq!(taken.published, 1);
    let pass = stalled.await.unwrap().unwrap();
    assert_eq!((pass.published, pass.lost), (0, 1), "{pass:?}");
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
    assert!(outbox.parked(10).await.unwrap().is_empty());
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
}

/// The in-process outbox, counting what purges delete.
#[derive(Debug, Default)]
struct PurgeCounting {
    inner: MemoryOutbox,
    purged: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl OutboxStore for PurgeCounting {
    async fn enqueue(&self, m: &NewMessage) -> Result<OutboxMessage, idem_core::StoreError> {
        self.inner.enqueue(m).await
    }
    async fn claim(
        &self,
        batch: &idem_core::store::BatchClaim,
    ) -> Result<Vec<OutboxMessage>, idem_core::StoreError> {
        self.inner.claim(batch).await
    }
    async fn mark_sent(
        &self,
        owner: idem_core::store::OwnerToken,
        ids: &[idem_core::store::MessageId],
    ) -> Result<u64, idem_core::StoreError> {
        self.inner.mark_sent(owner, ids).await
    }
    async fn mark_failed(
        &self,
        failure: &idem_core::store::PublishFailure,
    ) -> Result<idem_core::store::MessageState, idem_core::StoreError> {
        self.inner.mark_failed(failure).await
    }
    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, idem_core::StoreError> {
        self.inner.parked(limit).await
    }
    async fn retry(&self, id: idem_core::store::MessageId) -> Result<bool, idem_core::StoreError> {
        self.inner.retry(id).await
    }
    async fn drop_message(
        &self,
        id: idem_core::store::MessageId,
        reason: &str,
    ) -> Result<bool, idem_core::StoreError> {
        self.inner.drop_message(id, reason).await
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
    async fn stats(&self) -> Result<idem_core::store::OutboxStats, idem_core::StoreError> {
        self.inner.stats().await
    }
    fn capabilities(&self) -> idem_core::store::Capabilities {
        self.inner.capabilities()
    }
}

#[tokio::test]
async fn an_idle_relay_purges_sent_messages_past_their_retention() {
    let outbox = Arc::new(PurgeCounting::default());
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
}
