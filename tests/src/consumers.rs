//! The broker-independent half of a consumer's end-to-end tests (as
//! `idem-rabbitmq`, `idem-nats` and `idem-kafka` run them, and as a broker adapter of
//! your own can): a shop whose writes and inbox records commit together,
//! and the scenarios every adapter must pass against its real broker: a
//! duplicate delivery acknowledged with no effect, a consumer killed
//! between its commit and its ack whose redelivery has no second effect, a
//! poison message parked and replayed.
//!
//! Each scenario takes a broker ([`ConsumerBroker`]) and a backend
//! ([`ConsumerBackend`]: the inbox, the parking store and the shop's
//! [`Books`]), so one body runs on every pair: [`MemoryBackend`] here,
//! `idem-dynamo`'s tests bring DynamoDB's.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_consumer::{
    Consumer, ConsumerOptions, Delivery, Handled, Handler, Permanent, Settled, Source, async_trait,
};
use idem_core::store::{
    InboundMessage, NewMessage, OutboxMessage, OutboxStore, ParkingStore, Transaction, VersionCheck,
};
use idem_core::{HandlerError, StoreError};
use idem_memory::{MemoryOutbox, MemoryParking, MemoryStore, MemoryTransaction};
use idem_outbox::{Published, Publisher};
use tokio::sync::Notify;

use crate::relays::wait_until;

/// What the memory shop committed: one effect per applied message, and
/// each aggregate's version.
#[derive(Debug, Default)]
pub struct Domain {
    /// Each applied message's payload, in commit order.
    pub effects: Vec<String>,
    /// Each aggregate's version.
    pub versions: HashMap<String, u64>,
}

/// Where a [`Shop`] keeps what it applies: the transaction its writes and
/// the inbox record share, the version check and the effect written
/// through it, and what committed. [`MemoryBooks`] here; a store's tests
/// bring their own (a DynamoDB table written through its transaction), and
/// every scenario runs on them unchanged.
#[async_trait]
pub trait Books: Clone + Send + Sync + 'static {
    /// The transaction the shop's writes and the inbox record share.
    type Tx: Transaction;

    /// Opens one.
    async fn begin(&self) -> Result<Self::Tx, StoreError>;

    /// Checks `version` (the aggregate's and the event's), if the message
    /// carries one, and on [`VersionCheck::Apply`] writes `effect` through
    /// `tx`; a message without a version always applies.
    async fn apply(
        &self,
        tx: &mut Self::Tx,
        effect: &str,
        version: Option<(&str, u64)>,
    ) -> Result<VersionCheck, HandlerError>;

    /// The effects committed, in commit order.
    async fn effects(&self) -> Vec<String>;
}

/// The memory shop's books: a [`Domain`] beside a memory inbox, written
/// together through the inbox's [`MemoryTransaction`] (which batches).
#[derive(Clone)]
pub struct MemoryBooks {
    /// The inbox the shop's transactions commit in.
    pub store: MemoryStore,
    /// What committed.
    pub domain: Arc<Mutex<Domain>>,
}

impl MemoryBooks {
    fn domain(&self) -> std::sync::MutexGuard<'_, Domain> {
        self.domain.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Books for MemoryBooks {
    type Tx = MemoryTransaction;

    async fn begin(&self) -> Result<MemoryTransaction, StoreError> {
        Ok(self.store.begin())
    }

    async fn apply(
        &self,
        tx: &mut MemoryTransaction,
        effect: &str,
        version: Option<(&str, u64)>,
    ) -> Result<VersionCheck, HandlerError> {
        if let Some((aggregate, event)) = version {
            let current = self.domain().versions.get(aggregate).copied().unwrap_or(0);
            let check = VersionCheck::of(event, current);
            if check != VersionCheck::Apply {
                return Ok(check);
            }
        }
        let (books, effect) = (self.clone(), effect.to_string());
        let version = version.map(|(aggregate, event)| (aggregate.to_string(), event));
        tx.on_commit(move || {
            let mut domain = books.domain();
            domain.effects.push(effect);
            if let Some((aggregate, version)) = version {
                domain.versions.insert(aggregate, version);
            }
        });
        Ok(VersionCheck::Apply)
    }

    async fn effects(&self) -> Vec<String> {
        self.domain().effects.clone()
    }
}

/// A held handler's gates: it notifies the first on entry, waits for the second.
pub type Gates = (Arc<Notify>, Arc<Notify>);

/// Applies each message as one effect in its [`Books`], checking versions;
/// fails a message as many times as asked; can hold a message until
/// released.
#[derive(Clone)]
pub struct Shop<B = MemoryBooks> {
    /// Where it writes.
    pub books: B,
    failures: Arc<Mutex<HashMap<String, u32>>>,
    /// Messages it fails for good ([`Permanent`]).
    permanent: Arc<Mutex<HashSet<String>>>,
    hold: Arc<Mutex<Option<Gates>>>,
    held: Arc<Mutex<HashMap<String, Gates>>>,
    /// The aggregates being handled now.
    handling: Arc<Mutex<HashSet<String>>>,
    /// How often a message entered the handler while another of its
    /// aggregate was inside.
    overlaps: Arc<AtomicU64>,
    /// How often a version check found a gap.
    gaps: Arc<AtomicU64>,
    /// How long each message stays in the handler, marked as handled.
    dwell: Arc<Mutex<Duration>>,
    /// How many transactions it opened.
    begun: Arc<AtomicU64>,
}

impl Shop {
    /// A shop completing its inbox records in `store`.
    pub fn new(store: MemoryStore) -> Self {
        Self::with_books(MemoryBooks {
            store,
            domain: Arc::default(),
        })
    }
}

impl<B: Books> Shop<B> {
    /// A shop writing in `books`.
    pub fn with_books(books: B) -> Self {
        Self {
            books,
            failures: Arc::default(),
            permanent: Arc::default(),
            hold: Arc::default(),
            held: Arc::default(),
            handling: Arc::default(),
            overlaps: Arc::default(),
            gaps: Arc::default(),
            dwell: Arc::default(),
            begun: Arc::default(),
        }
    }

    /// How many transactions it opened: one per batch that committed at
    /// once, one more per message handled on its own.
    pub fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Keeps each message `dwell` in the handler from now on (every clone
    /// of the shop does), so that two messages of one aggregate handled at
    /// once would overlap.
    pub fn dwell(&self, dwell: Duration) {
        *self.dwell.lock().unwrap() = dwell;
    }

    /// Holds the message `id` when it is handled: `entered` is notified
    /// when it is inside the handler, which then waits for `go`.
    pub fn hold(&self, id: &str) -> Gates {
        let gates = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        self.held
            .lock()
            .unwrap()
            .insert(id.to_string(), gates.clone());
        gates
    }

    /// How often a message entered the handler while another message of
    /// its aggregate was inside.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(Ordering::SeqCst)
    }

    /// How often a version check found a gap.
    pub fn gaps(&self) -> u64 {
        self.gaps.load(Ordering::SeqCst)
    }

    /// Fails the message `id` the next `times` times.
    pub fn fail(&self, id: &str, times: u32) {
        self.failures.lock().unwrap().insert(id.to_string(), times);
    }

    /// Fails message `id` with a [`Permanent`] error: no redelivery can
    /// fix it.
    pub fn fail_for_good(&self, id: &str) {
        self.permanent.lock().unwrap().insert(id.to_string());
    }

    /// Holds the next handled message: `entered` is notified when it is
    /// inside the handler, which then waits for `go`.
    pub fn hold_next(&self) -> (Arc<Notify>, Arc<Notify>) {
        let gates = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        *self.hold.lock().unwrap() = Some(gates.clone());
        gates
    }

    /// What committed, in order.
    pub async fn effects(&self) -> Vec<String> {
        self.books.effects().await
    }
}

#[async_trait]
impl<B: Books> Handler for Shop<B> {
    type Tx = B::Tx;

    async fn begin(&self) -> Result<B::Tx, StoreError> {
        self.begun.fetch_add(1, Ordering::SeqCst);
        self.books.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: B::Tx,
    ) -> Result<(B::Tx, Handled), HandlerError> {
        let id = message.id().as_str().to_string();
        let _inside = message
            .aggregate()
            .map(|aggregate| Inside::enter(self, aggregate));
        let gates = self.hold.lock().unwrap().take();
        let gates = gates.or_else(|| self.held.lock().unwrap().remove(&id));
        if let Some((entered, go)) = gates {
            entered.notify_one();
            go.notified().await;
        }
        let dwell = *self.dwell.lock().unwrap();
        if !dwell.is_zero() {
            tokio::time::sleep(dwell).await;
        }
        if self.permanent.lock().unwrap().contains(&id) {
            return Err(Permanent::new(format!("{id} can never apply")).into());
        }
        {
            let mut failures = self.failures.lock().unwrap();
            if let Some(left) = failures.get_mut(&id).filter(|left| **left > 0) {
                *left -= 1;
                return Err(HandlerError::from(format!("{id} is refused")));
            }
        }
        let version = message.aggregate().zip(message.version());
        let effect = String::from_utf8_lossy(message.payload()).into_owned();
        let check = self.books.apply(&mut tx, &effect, version).await?;
        if matches!(check, VersionCheck::Gap { .. }) {
            self.gaps.fetch_add(1, Ordering::SeqCst);
        }
        Ok((tx, check.into()))
    }
}

/// A message of an aggregate inside the handler, until dropped.
struct Inside {
    handling: Arc<Mutex<HashSet<String>>>,
    aggregate: String,
}

impl Inside {
    fn enter<B>(shop: &Shop<B>, aggregate: &str) -> Self {
        if !shop.handling.lock().unwrap().insert(aggregate.to_string()) {
            shop.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        Self {
            handling: shop.handling.clone(),
            aggregate: aggregate.to_string(),
        }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.handling
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.aggregate);
    }
}

/// The stores a consumer scenario runs on: the inbox, the parking store and
/// the shop's [`Books`]. [`MemoryBackend`] here; a store's tests bring
/// theirs, so one scenario body runs on every backend.
#[async_trait]
pub trait ConsumerBackend: Send + Sync {
    /// The shop's books.
    type Books: Books;

    /// A consumer with `options` on this backend's stores (fresh ones, or
    /// tables of the backend's own), its shop and its parking store.
    async fn consumer(&self, options: ConsumerOptions) -> Scenario<Self::Books>;
}

/// A scenario's consumer, its shop and its parking store (gated, so a
/// scenario can hold a park).
pub type Scenario<B> = (Consumer<Shop<B>>, Shop<B>, Arc<GatedParking>);

/// A parking store that can hold the park of a message until told to go,
/// to force what happens between a consumer's attempt and its park.
#[derive(Debug)]
pub struct GatedParking {
    inner: Arc<dyn ParkingStore>,
    held: Mutex<HashMap<String, Gates>>,
    failing_listings: AtomicU64,
    listings: AtomicU64,
}

impl GatedParking {
    /// `inner`, held nowhere yet.
    pub fn new(inner: Arc<dyn ParkingStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            held: Mutex::default(),
            failing_listings: AtomicU64::new(0),
            listings: AtomicU64::new(0),
        })
    }

    /// How many listings ([`ParkingStore::parked`]) were asked of it.
    pub fn listings(&self) -> u64 {
        self.listings.load(Ordering::SeqCst)
    }

    /// Holds the next park of the message `id`: `entered` is notified
    /// when it is called, which then waits for `go` before it parks.
    pub fn hold_park(&self, id: &str) -> Gates {
        let gates = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        self.held
            .lock()
            .unwrap()
            .insert(id.to_string(), gates.clone());
        gates
    }

    /// The next `count` listings fail, as a store that went away (or a
    /// process that died before it listed).
    pub fn fail_listings(&self, count: u64) {
        self.failing_listings.store(count, Ordering::SeqCst);
    }
}

#[async_trait]
impl ParkingStore for GatedParking {
    async fn park(
        &self,
        parked: &idem_core::store::NewParked,
    ) -> Result<idem_core::store::ParkedMessage, StoreError> {
        let gates = self
            .held
            .lock()
            .unwrap()
            .remove(parked.message.id().as_str());
        if let Some((entered, go)) = gates {
            entered.notify_one();
            go.notified().await;
        }
        self.inner.park(parked).await
    }

    async fn get(
        &self,
        consumer: &idem_core::ConsumerName,
        id: &idem_core::IdempotencyKey,
    ) -> Result<Option<idem_core::store::ParkedMessage>, StoreError> {
        self.inner.get(consumer, id).await
    }

    async fn parked(
        &self,
        query: &idem_core::store::ParkedQuery,
    ) -> Result<Vec<idem_core::store::ParkedMessage>, StoreError> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        let failing =
            self.failing_listings
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                });
        if failing.is_ok() {
            return Err(StoreError::unavailable(
                "parking",
                idem_core::Operation::Stats,
                "the listing is made to fail",
            ));
        }
        self.inner.parked(query).await
    }

    async fn resolve(
        &self,
        consumer: &idem_core::ConsumerName,
        id: &idem_core::IdempotencyKey,
        resolution: &idem_core::store::Resolution,
    ) -> Result<bool, StoreError> {
        self.inner.resolve(consumer, id, resolution).await
    }

    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_resolved(older_than, limit).await
    }

    async fn count(&self, consumer: &idem_core::ConsumerName) -> Result<u64, StoreError> {
        self.inner.count(consumer).await
    }

    fn capabilities(&self) -> idem_core::store::Capabilities {
        self.inner.capabilities()
    }
}

/// The memory stores, fresh for each consumer.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryBackend;

#[async_trait]
impl ConsumerBackend for MemoryBackend {
    type Books = MemoryBooks;

    async fn consumer(&self, options: ConsumerOptions) -> Scenario<MemoryBooks> {
        let store = MemoryStore::new();
        let shop = Shop::new(store.clone());
        let parking = GatedParking::new(Arc::new(MemoryParking::new()));
        let consumer = Consumer::with_options(
            "scenario",
            Arc::new(store),
            parking.clone(),
            shop.clone(),
            options,
        )
        .unwrap();
        (consumer, shop, parking)
    }
}

/// The options of the scenarios' consumers: `max_deliveries`, short delays.
pub fn scenario_options(max_deliveries: u32) -> ConsumerOptions {
    ConsumerOptions::default()
        .max_deliveries(max_deliveries)
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
}

/// A broker under test, for the consumer scenarios: its publisher, and
/// sources of one consumer (a durable consumer, a queue) on connections of
/// their own.
#[async_trait]
pub trait ConsumerBroker: Send + Sync {
    /// The adapter's source.
    type Source: Source + 'static;

    /// Publishes to what the sources consume.
    fn publisher(&self) -> Arc<dyn Publisher>;

    /// A source of the one consumer under test, on a connection of its
    /// own; its broker delivers a message until the consumer settles it
    /// (no delivery limit of the broker's).
    async fn source(&self) -> Self::Source;

    /// Ends `source` as a killed process would: its unsettled deliveries
    /// go back to the broker.
    async fn kill(&self, source: Self::Source);

    /// Publishes, as a producer other than idem's might, a message of id
    /// `id` and type `order.placed` about `aggregate` whose version is
    /// `version`, as text (one that is not a number makes it unreadable).
    async fn publish_raw(&self, id: &str, aggregate: &str, version: &str);

    /// How long after a publish the broker still drops a second publish
    /// of the same message (zero for a broker that never does).
    fn duplicate_window(&self) -> Duration;

    /// Whether a message delivered again to another source counts its
    /// earlier deliveries ([`Delivery::deliveries`] above 1): RabbitMQ and
    /// JetStream count them, Kafka keeps no count (a source counts its
    /// own deliveries only).
    fn counts_redeliveries(&self) -> bool {
        true
    }
}

/// Publishes `messages` (enqueued in an outbox of their own) and returns
/// them as the outbox stored them.
pub async fn publish(publisher: &dyn Publisher, messages: &[NewMessage]) -> Vec<OutboxMessage> {
    let outbox = MemoryOutbox::new();
    let mut batch = Vec::new();
    for message in messages {
        batch.push(outbox.enqueue(message).await.unwrap());
    }
    for result in publisher.publish(&batch).await {
        assert!(matches!(result, Ok(Published { .. })), "{result:?}");
    }
    batch
}

/// A consumer over the memory stores with `max_deliveries` and short
/// delays ([`scenario_options`]), and its shop.
pub fn consumer(max_deliveries: u32) -> (Consumer<Shop>, Shop, MemoryParking) {
    consumer_with(scenario_options(max_deliveries))
}

/// A consumer over the memory stores with `options`, and its shop.
pub fn consumer_with(options: ConsumerOptions) -> (Consumer<Shop>, Shop, MemoryParking) {
    let store = MemoryStore::new();
    let shop = Shop::new(store.clone());
    let parking = MemoryParking::new();
    let consumer = Consumer::with_options(
        "scenario",
        Arc::new(store),
        Arc::new(parking.clone()),
        shop.clone(),
        options,
    )
    .unwrap();
    (consumer, shop, parking)
}

fn order(n: usize) -> NewMessage {
    NewMessage::new(
        &format!("order-{n}"),
        "order.placed",
        format!("order {n}").into_bytes(),
    )
    .unwrap()
}

/// Takes the source's next delivery, within the tests' patience, asking
/// again after a retryable error (a broker being reconnected to), as
/// `Consumer::run` does.
pub async fn next<S: Source>(source: &mut S) -> S::Delivery {
    let deadline = tokio::time::Instant::now() + crate::relays::PATIENCE;
    loop {
        let next = tokio::time::timeout_at(deadline, source.next())
            .await
            .expect("a delivery within the patience");
        match next {
            Ok(delivery) => return delivery.expect("the source is open"),
            Err(error) if error.is_retryable() => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(error) => panic!("the broker refused: {error}"),
        }
    }
}

/// A message published twice (a relay that stopped between the broker's
/// confirmation and its mark) is delivered twice; the second is
/// acknowledged with no effect.
pub async fn a_duplicate_delivery_is_acked_without_effect<B: ConsumerBroker, K: ConsumerBackend>(
    broker: &B,
    backend: &K,
) {
    let (consumer, shop, _) = backend.consumer(scenario_options(5)).await;
    let mut source = broker.source().await;
    consumer.check(&source.horizon()).unwrap();
    let publisher = broker.publisher();
    let sent = publish(&*publisher, &[order(1)]).await;
    tokio::time::sleep(broker.duplicate_window()).await;
    for result in publisher.publish(&sent).await {
        assert!(result.is_ok(), "{result:?}");
    }
    let first = next(&mut source).await;
    assert_eq!(first.message().id().as_str(), sent[0].id().to_string());
    assert_eq!(first.message().aggregate(), Some("order-1"));
    assert_eq!(first.message().version(), Some(1));
    assert_eq!(consumer.consume(&first).await.unwrap(), Settled::Applied);
    let second = next(&mut source).await;
    assert_eq!(second.message().id(), first.message().id());
    assert_eq!(consumer.consume(&second).await.unwrap(), Settled::Duplicate);
    assert_eq!(shop.effects().await, ["order 1"]);
    broker.kill(source).await;
}

/// Acknowledging a batch ([`Delivery::ack_all`]) settles its deliveries
/// and no other: with the first delivery left out (a RabbitMQ `multiple`
/// ack past it would settle it too), it alone comes back once the source
/// is killed; acknowledged with the next message, nothing does.
pub async fn acking_a_batch_settles_exactly_its_deliveries<B: ConsumerBroker>(broker: &B) {
    let mut source = broker.source().await;
    let orders: Vec<NewMessage> = (10..16).map(order).collect();
    let sent = publish(&*broker.publisher(), &orders).await;
    let mut received = Vec::new();
    for _ in 0..sent.len() {
        received.push(next(&mut source).await);
    }
    let batch: Vec<&<B::Source as Source>::Delivery> = received[1..].iter().collect();
    <B::Source as Source>::Delivery::ack_all(&batch)
        .await
        .unwrap();
    let left_out = received[0].message().id().clone();
    drop(received);
    broker.kill(source).await;
    let marker = publish(&*broker.publisher(), &[order(16)]).await;
    let mut source = broker.source().await;
    let again = [next(&mut source).await, next(&mut source).await];
    let mut ids: Vec<String> = again
        .iter()
        .map(|delivery| delivery.message().id().as_str().to_string())
        .collect();
    ids.sort();
    let mut expected = vec![left_out.as_str().to_string(), marker[0].id().to_string()];
    expected.sort();
    assert_eq!(ids, expected, "only the delivery left out came back");
    let both: Vec<&<B::Source as Source>::Delivery> = again.iter().collect();
    <B::Source as Source>::Delivery::ack_all(&both)
        .await
        .unwrap();
    drop(again);
    broker.kill(source).await;
    let last = publish(&*broker.publisher(), &[order(17)]).await;
    let mut source = broker.source().await;
    let delivery = next(&mut source).await;
    assert_eq!(delivery.message().id().as_str(), last[0].id().to_string());
    delivery.ack().await.unwrap();
    broker.kill(source).await;
}

/// A delivery whose consumer dies after its commit and before its ack:
/// every other settlement goes to the delivery inside.
pub struct KilledBeforeAck<D>(pub D);

#[async_trait]
impl<D: Delivery> Delivery for KilledBeforeAck<D> {
    fn message(&self) -> &InboundMessage {
        self.0.message()
    }
    fn deliveries(&self) -> u32 {
        self.0.deliveries()
    }
    fn published_at(&self) -> Option<idem_core::store::Timestamp> {
        self.0.published_at()
    }
    async fn ack(&self) -> Result<(), idem_consumer::BrokerError> {
        Err(idem_consumer::BrokerError::unavailable(
            "test",
            "ack",
            "killed before the ack",
        ))
    }
    async fn retry(&self, delay: Duration) -> Result<(), idem_consumer::BrokerError> {
        self.0.retry(delay).await
    }
}

/// The consumer commits, then dies before its ack: the broker delivers
/// the message again (to a consumer on another connection), which
/// acknowledges it with no second effect.
pub async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect<
    B: ConsumerBroker,
    K: ConsumerBackend,
>(
    broker: &B,
    backend: &K,
) {
    let (consumer, shop, _) = backend.consumer(scenario_options(5)).await;
    let mut doomed = broker.source().await;
    let sent = publish(&*broker.publisher(), &[order(2)]).await;
    let first = next(&mut doomed).await;
    let killed = consumer.consume(&KilledBeforeAck(first)).await;
    assert!(killed.is_err(), "{killed:?}");
    assert_eq!(
        shop.effects().await,
        ["order 2"],
        "committed before the ack"
    );
    broker.kill(doomed).await;
    let mut survivor = broker.source().await;
    let again = next(&mut survivor).await;
    assert_eq!(again.message().id().as_str(), sent[0].id().to_string());
    if broker.counts_redeliveries() {
        assert!(
            again.deliveries() >= 2,
            "a redelivery counts {}",
            again.deliveries()
        );
    }
    assert_eq!(consumer.consume(&again).await.unwrap(), Settled::Duplicate);
    assert_eq!(shop.effects().await, ["order 2"]);
    broker.kill(survivor).await;
}

/// A message the handler always refuses is delivered `max_deliveries`
/// times with back-off (by the consumer's own count), then parked and
/// acknowledged; replayed once the
/// handler accepts it, it has its one effect.
pub async fn a_poison_message_is_parked_and_replayed<B: ConsumerBroker, K: ConsumerBackend>(
    broker: &B,
    backend: &K,
) {
    let max = 3;
    let (consumer, shop, parking) = backend.consumer(scenario_options(max)).await;
    let mut source = broker.source().await;
    let sent = publish(&*broker.publisher(), &[order(3)]).await;
    let id = sent[0].id().to_string();
    shop.fail(&id, u32::MAX);
    let mut outcomes = Vec::new();
    while !matches!(outcomes.last(), Some(Settled::Parked { .. })) {
        let delivery = next(&mut source).await;
        // The broker's count is for traces: the consumer parks by its own.
        assert!(delivery.deliveries() >= 1);
        outcomes.push(consumer.consume(&delivery).await.unwrap());
    }
    assert_eq!(outcomes.len(), max as usize, "{outcomes:?}");
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].parked.deliveries, max);
    assert!(parked[0].parked.reason.contains("refused"));
    assert!(shop.effects().await.is_empty());
    shop.fail(&id, 0);
    let key = idem_core::IdempotencyKey::new(id).unwrap();
    assert_eq!(consumer.replay(&key).await.unwrap(), Some(Settled::Applied));
    assert_eq!(shop.effects().await, ["order 3"]);
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
    broker.kill(source).await;
}

/// A message no handler can read (its version is not a number) is not
/// the broker's to drop, nor a handler's to see: the consumer parks what
/// can be kept of it at once (its id, type and payload, its aggregate and
/// version as headers) with the reason, acknowledges it, and the rest of
/// its aggregate flows. (The sources terminated or rejected it before: it
/// was gone, with a warning in a log.)
pub async fn a_message_no_handler_can_read_is_parked_at_once<
    B: ConsumerBroker,
    K: ConsumerBackend,
>(
    broker: &B,
    backend: &K,
) {
    let (consumer, shop, parking) = backend.consumer(scenario_options(3)).await;
    let mut source = broker.source().await;
    let id = format!("unreadable-{}", uuid::Uuid::new_v4().simple());
    let aggregate = format!("order-{}", uuid::Uuid::new_v4().simple());
    broker.publish_raw(&id, &aggregate, "three").await;
    let delivery = next(&mut source).await;
    let reason = delivery.malformed().map(str::to_string);
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("\"three\"")),
        "{reason:?}"
    );
    assert_eq!(delivery.message().id().as_str(), id);
    assert_eq!(
        delivery.message().aggregate(),
        None,
        "never replayed behind one"
    );
    let consumed = consumer.consume(&delivery).await.unwrap();
    assert!(
        matches!(&consumed, Settled::Parked { reason } if reason.starts_with("malformed: ")),
        "{consumed:?}"
    );
    assert!(shop.effects().await.is_empty(), "no handler saw it");
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    let kept = &parked[0].parked.message;
    assert_eq!(kept.id().as_str(), id);
    assert!(
        kept.headers()
            .contains(&("aggregate".to_string(), aggregate.clone()))
    );
    assert!(
        kept.headers()
            .contains(&("version".to_string(), "three".to_string()))
    );
    assert_eq!(parked[0].parked.deliveries, 1, "parked at its first");
    // Acknowledged: what comes next is the next message, not a copy.
    let sent = publish(&*broker.publisher(), &[order(5)]).await;
    let following = next(&mut source).await;
    assert_eq!(following.message().id().as_str(), sent[0].id().to_string());
    assert_eq!(
        consumer.consume(&following).await.unwrap(),
        Settled::Applied
    );
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 1);
    broker.kill(source).await;
}

/// A delivery that no consumer settled (its consumer died holding it)
/// neither ends the message nor counts toward parking: the broker
/// delivers it again without limit, and the consumer counts only its own
/// failed attempts. The message fails twice and parks at its third
/// failure: its first delivery fails, its second dies unsettled with its
/// source, its third fails, its fourth applies. (A broker limit of three
/// dropped it after the dead copy; a count by the broker's deliveries
/// parked it at its third delivery.)
pub async fn a_delivery_no_consumer_settled_is_delivered_again_and_never_counted<
    B: ConsumerBroker,
    K: ConsumerBackend,
>(
    broker: &B,
    backend: &K,
) {
    let (consumer, shop, parking) = backend.consumer(scenario_options(3)).await;
    let mut doomed = broker.source().await;
    consumer.check(&doomed.horizon()).unwrap();
    let sent = publish(&*broker.publisher(), &[order(4)]).await;
    let id = sent[0].id().to_string();
    shop.fail(&id, 2);
    let first = next(&mut doomed).await;
    assert!(
        matches!(
            consumer.consume(&first).await.unwrap(),
            Settled::Retried { .. }
        ),
        "the first attempt fails"
    );
    drop(first);
    let unsettled = next(&mut doomed).await;
    assert_eq!(unsettled.message().id().as_str(), id);
    drop(unsettled);
    broker.kill(doomed).await;

    let mut survivor = broker.source().await;
    let mut outcomes = Vec::new();
    while !matches!(
        outcomes.last(),
        Some(Settled::Applied | Settled::Parked { .. })
    ) {
        let delivery = next(&mut survivor).await;
        assert_eq!(delivery.message().id().as_str(), id);
        outcomes.push(consumer.consume(&delivery).await.unwrap());
    }
    assert!(
        matches!(outcomes[..], [Settled::Retried { .. }, Settled::Applied]),
        "{outcomes:?}"
    );
    assert_eq!(shop.effects().await, ["order 4"]);
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
    broker.kill(survivor).await;
}

/// Waits until `consumer`'s parking holds `count` messages.
pub async fn wait_for_parked(parking: &MemoryParking, consumer: &Consumer<Shop>, count: u64) {
    wait_until("the message is parked", || async {
        parking.count(consumer.name()).await.unwrap() == count
    })
    .await;
}

/// A consumer running in a task: what `run` answered, and its source back.
type Running<S> = tokio::task::JoinHandle<(Result<(), idem_consumer::ConsumerError>, S)>;

/// Runs `consumer` over `source` in a task until the returned sender fires.
fn running<B: Books, S: Source + 'static>(
    consumer: Consumer<Shop<B>>,
    mut source: S,
) -> (tokio::sync::oneshot::Sender<()>, Running<S>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(async move {
        let ran = consumer
            .run(&mut source, async {
                let _ = stopped.await;
            })
            .await;
        (ran, source)
    });
    (stop, run)
}

/// Publishes `messages` in one outbox, in order, in batches of 500, so
/// each aggregate's sequences follow the order given.
async fn publish_in_order(publisher: &dyn Publisher, messages: Vec<NewMessage>) {
    let outbox = MemoryOutbox::new();
    let mut stored = Vec::new();
    for message in &messages {
        stored.push(outbox.enqueue(message).await.unwrap());
    }
    for batch in stored.chunks(500) {
        for result in publisher.publish(batch).await {
            assert!(matches!(result, Ok(Published { .. })), "{result:?}");
        }
    }
}

fn version(aggregate: &str, version: usize) -> NewMessage {
    NewMessage::new(
        aggregate,
        "order.changed",
        format!("{aggregate}:{version}").into_bytes(),
    )
    .unwrap()
}

/// Sixteen deliveries at once over 100 aggregates of 50 versions each,
/// published five versions of an aggregate at a time (so a window of
/// sixteen always holds several of one aggregate): every version of every
/// aggregate applies once, in order, with no gap, and no two messages of
/// one aggregate are ever in the handler together.
pub async fn concurrent_deliveries_apply_every_aggregate_in_order<
    B: ConsumerBroker,
    K: ConsumerBackend,
>(
    broker: &B,
    backend: &K,
) {
    const AGGREGATES: usize = 100;
    const VERSIONS: usize = 50;
    let options = scenario_options(5).concurrency(16);
    let (consumer, shop, _) = backend.consumer(options).await;
    shop.dwell(Duration::from_millis(1));
    let source = broker.source().await;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let name = |a: usize| format!("agg-{run_id}-{a}");
    let mut messages = Vec::new();
    for round in 0..VERSIONS / 5 {
        for a in 0..AGGREGATES {
            for v in 1..=5 {
                messages.push(version(&name(a), round * 5 + v));
            }
        }
    }
    let (stop, run) = running(consumer, source);
    publish_in_order(&*broker.publisher(), messages).await;
    wait_until("every version applied", || async {
        shop.effects().await.len() >= AGGREGATES * VERSIONS
    })
    .await;
    stop.send(()).unwrap();
    let (ran, source) = run.await.unwrap();
    ran.unwrap();
    let effects = shop.effects().await;
    assert_eq!(
        effects.len(),
        AGGREGATES * VERSIONS,
        "a version applied twice"
    );
    let mut applied: HashMap<String, Vec<usize>> = HashMap::new();
    for effect in &effects {
        let (aggregate, v) = effect.rsplit_once(':').unwrap();
        applied
            .entry(aggregate.to_string())
            .or_default()
            .push(v.parse().unwrap());
    }
    let in_order: Vec<usize> = (1..=VERSIONS).collect();
    for a in 0..AGGREGATES {
        assert_eq!(
            applied.get(&name(a)),
            Some(&in_order),
            "aggregate {a} applied out of order or with a gap"
        );
    }
    assert_eq!(shop.overlaps(), 0, "two messages of one aggregate at once");
    assert_eq!(
        shop.gaps(),
        0,
        "a version was handled before its predecessor"
    );
    broker.kill(source).await;
}

/// One aggregate's message held in its handler holds up its own later
/// messages only: ten other aggregates apply meanwhile; released, its two
/// apply in order.
pub async fn a_slow_aggregate_holds_up_only_its_own<B: ConsumerBroker, K: ConsumerBackend>(
    broker: &B,
    backend: &K,
) {
    let (consumer, shop, _) = backend.consumer(scenario_options(5).concurrency(4)).await;
    let source = broker.source().await;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let slow = format!("slow-{run_id}");
    let mut messages = vec![version(&slow, 1), version(&slow, 2)];
    for n in 0..10 {
        messages.push(version(&format!("fast-{run_id}-{n}"), 1));
    }
    let outbox = MemoryOutbox::new();
    let mut stored = Vec::new();
    for message in &messages {
        stored.push(outbox.enqueue(message).await.unwrap());
    }
    let (entered, go) = shop.hold(&stored[0].id().to_string());
    let (stop, run) = running(consumer, source);
    // The slow message first and alone: the messages of a batch commit
    // together, so one held holds up its batch-mates too.
    let (slow_first, rest) = stored.split_at(1);
    for result in broker.publisher().publish(slow_first).await {
        assert!(result.is_ok(), "{result:?}");
    }
    tokio::time::timeout(crate::relays::PATIENCE, entered.notified())
        .await
        .expect("the slow message reached its handler");
    for result in broker.publisher().publish(rest).await {
        assert!(result.is_ok(), "{result:?}");
    }
    wait_until("the other aggregates applied", || async {
        shop.effects().await.len() >= 10
    })
    .await;
    let effects = shop.effects().await;
    assert!(
        effects.iter().all(|e| e.starts_with("fast-")),
        "the held aggregate moved on: {effects:?}"
    );
    go.notify_one();
    wait_until("the slow aggregate applied", || async {
        shop.effects().await.len() >= 12
    })
    .await;
    let effects = shop.effects().await;
    let slow_effects: Vec<&String> = effects.iter().filter(|e| e.starts_with("slow-")).collect();
    assert_eq!(slow_effects, [&format!("{slow}:1"), &format!("{slow}:2")]);
    stop.send(()).unwrap();
    let (ran, source) = run.await.unwrap();
    ran.unwrap();
    assert_eq!(shop.overlaps(), 0);
    broker.kill(source).await;
}

/// A delivery handed to the consumer directly, with no broker: what it
/// was settled with is kept in [`Handed::settled`].
pub struct Handed {
    message: InboundMessage,
    settled: Arc<Mutex<Vec<String>>>,
}

impl Handed {
    /// A first delivery of `message`.
    pub fn new(message: InboundMessage) -> Self {
        Self {
            message,
            settled: Arc::default(),
        }
    }

    /// How it was settled: `ack`, or `retry` with its delay.
    pub fn settled(&self) -> Vec<String> {
        self.settled.lock().unwrap().clone()
    }
}

#[async_trait]
impl Delivery for Handed {
    fn message(&self) -> &InboundMessage {
        &self.message
    }
    fn deliveries(&self) -> u32 {
        1
    }
    fn published_at(&self) -> Option<idem_core::store::Timestamp> {
        None
    }
    async fn ack(&self) -> Result<(), idem_consumer::BrokerError> {
        self.settled.lock().unwrap().push("ack".to_string());
        Ok(())
    }
    async fn retry(&self, delay: Duration) -> Result<(), idem_consumer::BrokerError> {
        self.settled
            .lock()
            .unwrap()
            .push(format!("retry {delay:?}"));
        Ok(())
    }
}

/// An event of `aggregate` at `version`, its payload `<aggregate>:<version>`
/// and its id of the run's own.
pub fn event(run: &str, aggregate: &str, version: u64) -> InboundMessage {
    InboundMessage::new(
        &format!("{run}-{aggregate}-{version}"),
        "order.changed",
        format!("{aggregate}:{version}").into_bytes(),
    )
    .and_then(|message| message.with_aggregate(aggregate, Some(version)))
    .unwrap()
}

/// Asserts that `aggregate`'s versions 1 to `last` applied once each, in
/// order, and that none of its messages is left parked.
async fn applied_in_order<B: Books>(
    consumer: &Consumer<Shop<B>>,
    shop: &Shop<B>,
    aggregate: &str,
    last: u64,
    why: &str,
) {
    let effects: Vec<String> = shop
        .effects()
        .await
        .into_iter()
        .filter(|effect| effect.starts_with(aggregate))
        .collect();
    let expected: Vec<String> = (1..=last).map(|v| format!("{aggregate}:{v}")).collect();
    assert_eq!(effects, expected, "{why}");
    let left = consumer.parked(Some(aggregate), 10).await.unwrap();
    assert!(left.is_empty(), "still parked: {left:?}");
}

/// A version gap parked while its predecessor is being applied and
/// released is released too, the interleaving forced: v2 arrives first
/// and parks as a gap; v1 applies, and its release replays v2, held in
/// its handler before its commit; meanwhile v3 arrives, sees the
/// aggregate at 1 and parks as a gap; then v2 commits. Every version
/// applies, in order, and nothing stays parked (a release that listed
/// the parked versions once, before v3 parked, left v3 parked for ever).
pub async fn a_gap_parked_while_its_predecessor_is_released_is_released_too<K: ConsumerBackend>(
    backend: &K,
) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let aggregate = format!("race-{run}");
    // Parked at the first gap: the race needs no redelivery.
    let (consumer, shop, parking) = backend.consumer(scenario_options(1)).await;
    let [v1, v2, v3] = [1, 2, 3].map(|version| event(&run, &aggregate, version));
    let parked = consumer.consume(&Handed::new(v2.clone())).await.unwrap();
    assert!(
        matches!(&parked, Settled::Parked { reason } if reason.contains("version gap")),
        "{parked:?}"
    );

    let (entered, go) = shop.hold(v2.id().as_str());
    let applying = tokio::spawn({
        let consumer = consumer.clone();
        async move { consumer.consume(&Handed::new(v1)).await }
    });
    tokio::time::timeout(crate::relays::PATIENCE, entered.notified())
        .await
        .expect("v1's release replays v2");
    let parking_v3 = tokio::spawn({
        let consumer = consumer.clone();
        let v3 = v3.clone();
        async move { consumer.consume(&Handed::new(v3)).await }
    });
    wait_until("v3 parked behind the aggregate at v1", || async {
        let entry = parking.get(consumer.name(), v3.id()).await.unwrap();
        entry.is_some_and(|entry| entry.parked.reason.contains("version gap"))
    })
    .await;
    go.notify_one();

    let applied = tokio::time::timeout(crate::relays::PATIENCE, applying)
        .await
        .expect("v1's consume ends")
        .unwrap();
    assert_eq!(applied.unwrap(), Settled::Applied);
    let v3_parked = tokio::time::timeout(crate::relays::PATIENCE, parking_v3)
        .await
        .expect("v3's consume ends")
        .unwrap();
    assert!(
        matches!(&v3_parked, Ok(Settled::Parked { .. })),
        "{v3_parked:?}"
    );
    applied_in_order(
        &consumer,
        &shop,
        &aggregate,
        3,
        "every version applied once, in order",
    )
    .await;
    assert!(consumer.stuck(100).await.unwrap().is_empty());
}

/// A version gap that parks after its predecessor applied and released
/// (it read the aggregate before), the interleaving forced: v1 applies; v3
/// finds the aggregate at 1, and its park is held; v2 applies, and its
/// release finds nothing parked; then v3 parks. Its park releases its own
/// aggregate, so v3 applies (parked with no release, it stayed so).
pub async fn a_gap_parked_after_its_predecessors_release_releases_itself<K: ConsumerBackend>(
    backend: &K,
) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let aggregate = format!("late-{run}");
    let (consumer, shop, parking) = backend.consumer(scenario_options(1)).await;
    let [v1, v2, v3] = [1, 2, 3].map(|version| event(&run, &aggregate, version));
    let applied = consumer.consume(&Handed::new(v1)).await.unwrap();
    assert_eq!(applied, Settled::Applied);
    let (parking_now, go) = parking.hold_park(v3.id().as_str());
    let parking_v3 = tokio::spawn({
        let consumer = consumer.clone();
        async move { consumer.consume(&Handed::new(v3)).await }
    });
    tokio::time::timeout(crate::relays::PATIENCE, parking_now.notified())
        .await
        .expect("v3 found the aggregate at 1 and parks");
    let applied = consumer.consume(&Handed::new(v2)).await.unwrap();
    assert_eq!(applied, Settled::Applied);
    go.notify_one();
    let v3_parked = tokio::time::timeout(crate::relays::PATIENCE, parking_v3)
        .await
        .expect("v3's consume ends")
        .unwrap();
    assert!(
        matches!(&v3_parked, Ok(Settled::Parked { reason }) if reason.contains("version gap")),
        "{v3_parked:?}"
    );
    applied_in_order(&consumer, &shop, &aggregate, 3, "v3 released itself").await;
}

/// The same with v3 in a batch beside an event that applies: the batch's
/// one listing of the parking store, after its commit, finds nothing
/// parked (v3's park is held, v2 not yet applied), so only v3's own park
/// can release its aggregate, and does.
pub async fn a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself<
    K: ConsumerBackend,
>(
    backend: &K,
) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let aggregate = format!("late-batch-{run}");
    let (consumer, shop, parking) = backend.consumer(scenario_options(1)).await;
    let [v1, v2, v3] = [1, 2, 3].map(|version| event(&run, &aggregate, version));
    let applied = consumer.consume(&Handed::new(v1)).await.unwrap();
    assert_eq!(applied, Settled::Applied);
    let (parking_now, go) = parking.hold_park(v3.id().as_str());
    let batch = tokio::spawn({
        let consumer = consumer.clone();
        let mate = event(&run, &format!("mate-{run}"), 1);
        async move {
            let batch = [Handed::new(mate), Handed::new(v3)];
            consumer.consume_batch(&batch).await
        }
    });
    tokio::time::timeout(crate::relays::PATIENCE, parking_now.notified())
        .await
        .expect("the batch committed its mate, and v3 found the aggregate at 1 and parks");
    let applied = consumer.consume(&Handed::new(v2)).await.unwrap();
    assert_eq!(applied, Settled::Applied);
    go.notify_one();
    let settled = tokio::time::timeout(crate::relays::PATIENCE, batch)
        .await
        .expect("the batch ends")
        .unwrap();
    assert!(
        matches!(
            &settled[..],
            [Ok(Settled::Applied), Ok(Settled::Parked { reason })] if reason.contains("version gap")
        ),
        "{settled:?}"
    );
    applied_in_order(&consumer, &shop, &aggregate, 3, "v3 released itself").await;
}

/// An applied event whose release never ran (its listing failed, as a
/// process dying after its commit would leave it) has it run by its
/// redelivery: the duplicate releases what waits behind it.
pub async fn a_duplicate_releases_what_its_first_apply_did_not<K: ConsumerBackend>(backend: &K) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let aggregate = format!("dup-{run}");
    let (consumer, shop, parking) = backend.consumer(scenario_options(1)).await;
    let [v1, v2] = [1, 2].map(|version| event(&run, &aggregate, version));
    let parked = consumer.consume(&Handed::new(v2)).await.unwrap();
    assert!(matches!(parked, Settled::Parked { .. }), "{parked:?}");
    parking.fail_listings(1);
    let applied = consumer.consume(&Handed::new(v1.clone())).await.unwrap();
    assert_eq!(applied, Settled::Applied);
    assert_eq!(
        consumer.parked(Some(&aggregate), 10).await.unwrap().len(),
        1,
        "the release did not run"
    );
    let again = consumer.consume(&Handed::new(v1)).await.unwrap();
    assert_eq!(again, Settled::Duplicate);
    applied_in_order(&consumer, &shop, &aggregate, 2, "the duplicate released v2").await;
}

/// An aggregate whose predecessor applied while nothing released it (its
/// consumer died between the commit and the release) is listed stuck
/// while its missing version is missing, and a release after the version
/// came applies what waited.
pub async fn a_stuck_aggregate_is_listed_and_released<K: ConsumerBackend>(backend: &K) {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let aggregate = format!("stuck-{run}");
    let (consumer, shop, _) = backend.consumer(scenario_options(1)).await;
    let [v2, v3] = [2, 3].map(|version| event(&run, &aggregate, version));
    for gap in [&v3, &v2] {
        let parked = consumer.consume(&Handed::new(gap.clone())).await.unwrap();
        assert!(matches!(parked, Settled::Parked { .. }), "{parked:?}");
    }
    let stuck = consumer.stuck(100).await.unwrap();
    let ours: Vec<_> = stuck.iter().filter(|s| s.aggregate == aggregate).collect();
    assert_eq!(ours.len(), 1, "{stuck:?}");
    assert_eq!(
        (
            ours[0].at,
            ours[0].waiting_for,
            ours[0].oldest_parked,
            ours[0].parked
        ),
        (0, 1, 2, 2)
    );
    // v1 applied by hand, outside the consumer: nothing released it.
    let mut tx = shop.books.begin().await.unwrap();
    let check = shop
        .books
        .apply(&mut tx, &format!("{aggregate}:1"), Some((&aggregate, 1)))
        .await
        .unwrap();
    assert_eq!(check, VersionCheck::Apply);
    tx.commit().await.unwrap();
    assert_eq!(consumer.release(&aggregate).await.unwrap(), 2);
    assert!(
        consumer
            .stuck(100)
            .await
            .unwrap()
            .iter()
            .all(|s| s.aggregate != aggregate)
    );
    applied_in_order(
        &consumer,
        &shop,
        &aggregate,
        3,
        "the release applied what waited",
    )
    .await;
}
