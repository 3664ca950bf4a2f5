//! The broker-independent half of a publisher's end-to-end tests (as
//! `idem-rabbitmq` and `idem-nats` run them, and as a publisher of your own
//! can): an outbox filled with interleaved aggregates, relays running until
//! told to stop, waits with deadlines, and publisher wrappers that inject a
//! poison message, a stall between confirm and cursor move, or a relay killed
//! there.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{NewMessage, OutboxMessage, OutboxStore};
use idem_memory::MemoryOutbox;
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions, async_trait};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long any wait of these tests may take: generous, for a busy machine.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// Waits until `done` answers true, checking every 50 ms; panics with
/// `what` after [`PATIENCE`].
pub async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Enqueues `per_aggregate` messages for each of `aggregates` aggregates
/// (`<tag>-<n>`), round-robin, so aggregates interleave in commit order;
/// kind `<kind>`, a header `test-index`, the payload `<aggregate>/<index>`.
pub async fn fill<S: OutboxStore + ?Sized>(
    outbox: &S,
    tag: &str,
    kind: &str,
    aggregates: usize,
    per_aggregate: usize,
) -> Vec<OutboxMessage> {
    let mut stored = Vec::with_capacity(aggregates * per_aggregate);
    for index in 0..per_aggregate {
        for aggregate in 0..aggregates {
            let aggregate = format!("{tag}-{aggregate}");
            let message = NewMessage::new(
                &aggregate,
                kind,
                format!("{aggregate}/{index}").into_bytes(),
            )
            .unwrap()
            .with_header("test-index", &index.to_string())
            .unwrap();
            stored.push(enqueued(outbox, &message).await);
        }
    }
    stored
}

/// Enqueues `message`, asking again after an answer that may pass (a store
/// that timed out on a loaded machine), as a client would: an enqueue
/// delivered twice stores once.
async fn enqueued<S: OutboxStore + ?Sized>(outbox: &S, message: &NewMessage) -> OutboxMessage {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match outbox.enqueue(message).await {
            Ok(stored) => return stored,
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("enqueue {}: {error}", message.id()),
        }
    }
}

/// Every message in the logs of `outbox`'s partitions, partition by
/// partition in log order: what a relay would read.
pub async fn logged<S: OutboxStore + ?Sized>(outbox: &S) -> Vec<OutboxMessage> {
    let partitions = outbox.stats().await.unwrap().partitions.len();
    let mut logged = Vec::new();
    for partition in 0..partitions {
        let batch = outbox
            .read(
                u32::try_from(partition).unwrap(),
                idem_core::store::LogPosition::START,
                idem_core::store::MAX_OUTBOX_BATCH,
            )
            .await
            .unwrap();
        logged.extend(batch.messages);
    }
    logged
}

/// An outbox of eight partitions, for relays that share them.
pub fn partitioned() -> MemoryOutbox {
    MemoryOutbox::with_partitions(8, idem_core::store::SystemClock).unwrap()
}

/// Relays that share eight partitions, taking three each at most (room to
/// take over a dead one's).
pub fn sharing_options() -> RelayOptions {
    relay_options().with_max_partitions(3).unwrap()
}

/// The relays' lease.
pub const LEASE: Duration = Duration::from_secs(30);

/// Relays that retry quickly and look often.
pub fn relay_options() -> RelayOptions {
    RelayOptions::default()
        .with_batch(100)
        .unwrap()
        .with_lease(LEASE)
        .unwrap()
        .with_retries(1_000, Duration::from_millis(20), Duration::from_millis(300))
        .unwrap()
        .with_poll_interval(Duration::from_millis(20))
        .unwrap()
}

/// Relays running in the background until [`Running::stop`].
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Runs one relay per publisher in `publishers` over `outbox`.
    pub fn start<S: OutboxStore + ?Sized>(
        outbox: &Arc<S>,
        publishers: Vec<Arc<dyn Publisher>>,
        options: RelayOptions,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let tasks = publishers
            .into_iter()
            .map(|publisher| {
                let relay: Relay<S, dyn Publisher> =
                    Relay::new(Arc::clone(outbox), publisher, options);
                let mut stopped = stopped.clone();
                tokio::spawn(async move {
                    relay
                        .run(async move {
                            let _ = stopped.wait_for(|stop| *stop).await;
                        })
                        .await;
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops every relay and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("a relay stops")
                .expect("a relay does not panic");
        }
    }
}

/// Waits until nothing is pending in `outbox`.
pub async fn drained<S: OutboxStore + ?Sized>(outbox: &S) {
    wait_until("the outbox is drained", || async {
        outbox.stats().await.unwrap().pending == 0
    })
    .await;
}

/// Checks what a consumer read, as `(message id, aggregate, sequence,
/// payload)` in the order the broker delivered it, against what was
/// enqueued: every message there, each aggregate's in sequence order (by
/// first copy), every copy identical; answers how many copies each message
/// had.
pub fn check_order(
    enqueued: &[OutboxMessage],
    delivered: &[(String, String, u64, Vec<u8>)],
) -> BTreeMap<String, usize> {
    let expected: BTreeMap<String, &OutboxMessage> =
        enqueued.iter().map(|m| (m.id().to_string(), m)).collect();
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (id, aggregate, sequence, payload) in delivered {
        let message = expected
            .get(id)
            .unwrap_or_else(|| panic!("delivered {id}, never enqueued"));
        assert_eq!(
            aggregate,
            message.message().aggregate(),
            "aggregate of {id}"
        );
        assert_eq!(*sequence, message.parts().sequence, "sequence of {id}");
        assert_eq!(
            payload.as_slice(),
            message.message().payload(),
            "payload of {id}"
        );
        let count = copies.entry(id.clone()).or_insert(0);
        *count += 1;
        if *count == 1 {
            let previous = last.entry(message.message().aggregate()).or_insert(0);
            assert_eq!(
                *sequence,
                *previous + 1,
                "aggregate {aggregate}: sequence {sequence} delivered after {previous}"
            );
            *previous = *sequence;
        }
    }
    assert_eq!(
        copies.len(),
        expected.len(),
        "every enqueued message is delivered"
    );
    copies
}

/// A poison message: refuses every message of one aggregate, publishes the
/// others through the inner publisher.
pub struct Refusing<P> {
    /// The publisher of everything else.
    pub inner: P,
    /// The aggregate refused.
    pub aggregate: String,
}

#[async_trait]
impl<P: Publisher> Publisher for Refusing<P> {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let passed: Vec<OutboxMessage> = batch
            .iter()
            .filter(|m| m.message().aggregate() != self.aggregate)
            .cloned()
            .collect();
        let mut answers = self.inner.publish(&passed).await.into_iter();
        batch
            .iter()
            .map(|m| {
                if m.message().aggregate() == self.aggregate {
                    Err(PublishError::new("test", "poison: refused"))
                } else {
                    answers
                        .next()
                        .unwrap_or_else(|| Err(PublishError::new("test", "no answer")))
                }
            })
            .collect()
    }
}

/// A relay that stalls between the broker's confirm and its cursor move:
/// publishes, says so, then holds the answers until released.
pub struct HoldAfterPublish<P> {
    /// The publisher that publishes.
    pub inner: P,
    /// Notified once a batch is published.
    pub published: Notify,
    /// Lets the held answers go.
    pub release: Notify,
}

impl<P> HoldAfterPublish<P> {
    /// A stalling wrapper of `inner`.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            published: Notify::new(),
            release: Notify::new(),
        }
    }
}

#[async_trait]
impl<P: Publisher> Publisher for HoldAfterPublish<P> {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let answers = self.inner.publish(batch).await;
        self.published.notify_one();
        self.release.notified().await;
        answers
    }
}

/// A relay killed between the broker's confirm and its cursor move: its
/// first batch is published, what the broker confirmed is kept,
/// [`confirmed`](Self::confirmed) is notified, and the call never returns,
/// so the test can abort the relay's task there (`JoinHandle::abort`) as a
/// process dies. Later batches (of another relay sharing it) go through.
pub struct DiesAfterConfirm {
    inner: Arc<dyn Publisher>,
    /// Notified once the first batch is published and confirmed.
    pub confirmed: Notify,
    died: AtomicBool,
    ids: Mutex<Vec<String>>,
}

impl DiesAfterConfirm {
    /// A dying wrapper of `inner`.
    pub fn new(inner: Arc<dyn Publisher>) -> Self {
        Self {
            inner,
            confirmed: Notify::new(),
            died: AtomicBool::new(false),
            ids: Mutex::default(),
        }
    }

    /// The ids of the first batch's messages the broker confirmed.
    pub fn confirmed_ids(&self) -> Vec<String> {
        self.ids.lock().unwrap().clone()
    }
}

#[async_trait]
impl Publisher for DiesAfterConfirm {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let answers = self.inner.publish(batch).await;
        if self.died.swap(true, Ordering::SeqCst) {
            return answers;
        }
        *self.ids.lock().unwrap() = batch
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_ok())
            .map(|(message, _)| message.id().to_string())
            .collect();
        self.confirmed.notify_one();
        std::future::pending().await
    }
}
