//! End to end on real servers, once per broker (NATS JetStream on a private
//! `nats-server`, RabbitMQ behind a cutting proxy) and per backend
//! (Postgres; DynamoDB on moto): orders over HTTP
//! (idem-http, each request retried with the same key) → the business
//! transaction with its outbox row → a relay killed for real between the
//! broker's confirmation and its cursor move (its task aborted), and a
//! second relay that takes the batch over once the first one's lease
//! lapsed and publishes it again (JetStream drops the copies within its
//! duplicate window; RabbitMQ delivers them, with their message ids) → the
//! broker → the consumer (inbox, version check; its first delivery's
//! consumer dies between its commit and its ack, and a new one attaches) →
//! the consumer's shipment row. Mid-run the broker goes away while orders
//! keep committing (the JetStream server killed and started again on its
//! store; every RabbitMQ connection cut and nothing forwarded for 2 s), and
//! publisher and sources reconnect by themselves. Counted and printed per
//! broker; asserted: every committed order event has exactly one effect,
//! in version order per order; nothing lost, nothing parked, nothing
//! pending in the outbox or the broker.
//!
//! The flow is written once over a [`Backend`] (the services' stores and
//! what the shipping service committed) and a [`Broker`].

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "end_to_end/brokers.rs"]
mod brokers;
#[path = "end_to_end/dynamo.rs"]
mod dynamo;
/// A client of the DynamoDB-compatible server, shared with idem-dynamo's
/// own tests.
#[path = "../../idem-dynamo/tests/common/mod.rs"]
mod dynamo_common;
#[path = "end_to_end/postgres.rs"]
mod postgres;
/// RabbitMQ's test topology, shared with idem-rabbitmq's own tests.
#[path = "../../idem-rabbitmq/tests/common/mod.rs"]
mod rabbit;
#[path = "end_to_end/soak.rs"]
mod soak;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use brokers::{Broker, Kafka, Nats, Rabbit, answered};
use dynamo::Dynamo;
use http::StatusCode;
use idem_conformance::consumers::KilledBeforeAck;
use idem_conformance::relays::{DiesAfterConfirm, wait_until};
use idem_consumer::{
    Consumer, ConsumerError, ConsumerOptions, Delivery, Handler, Settled, Source, async_trait,
};
use idem_core::store::OutboxStore;
use idem_outbox::{Publisher, Relay, RelayError, RelayOptions, RelayPass};
use postgres::Postgres;
use tokio::sync::watch;
use tokio::time::Instant;

const ORDERS: usize = 12;
const STATUSES: [&str; 3] = ["placed", "paid", "shipped"];
/// How long any phase may take: generous, for moto on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(240);
/// The relays' lease: short, so the second relay takes the killed one's
/// batch over soon; long enough for a loaded machine to claim, publish and
/// mark a batch within it.
const LEASE: Duration = Duration::from_secs(2);
/// A batch's time limit at the broker: under the lease.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a relay looks for messages.
const POLL: Duration = Duration::from_millis(50);
/// How long the broker stays away at least.
const DOWN: Duration = Duration::from_secs(2);
/// Deliveries before a message is parked, and the broker's limit.
const MAX_DELIVERIES: u32 = 10;
/// The shipping service's consumer: its inbox tenant and durable name.
const CONSUMER: &str = "shipping";
/// A change's status that the shipping service can never take.
const POISON: &str = "poison";

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// One effect the shipping service committed: an order's event at its
/// version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Effect {
    order: String,
    version: u64,
}

/// Where both services keep what they write: the order service's HTTP
/// records, orders and outbox, written in one transaction per request; the
/// shipping service's inbox, parking, shipments and one entry per effect,
/// so a second effect would show.
#[async_trait]
trait Backend: Send + Sync + Sized + 'static {
    /// Its name in what the test prints.
    const NAME: &'static str;
    type Outbox: OutboxStore + 'static;
    type Shipping: Handler;

    /// The stores of a run of its own.
    async fn new(run: &str) -> Self;

    /// The order service: a `POST /orders` of `<order> <status>` writes
    /// the order and its event in the request's transaction, behind the
    /// idempotency layer; answers its outbox and base URL.
    async fn order_service(&self) -> (Arc<Self::Outbox>, String);

    /// The shipping service's consumer, with `options`: the event's
    /// version checked, the shipment written at it and the effect
    /// recorded, with the inbox record in one transaction.
    async fn shipping_service(&self, options: ConsumerOptions) -> Consumer<Self::Shipping>;

    /// Every effect committed, in commit order.
    async fn effects(&self) -> Vec<Effect>;

    /// Each order's shipment: its version and status.
    async fn shipments(&self) -> HashMap<String, (u64, String)>;

    /// Removes the run's tables.
    async fn delete(&self);
}

/// Serves `app` on a port of its own on loopback; answers its base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// Orders shipped: at their last version.
async fn shipped<K: Backend>(backend: &K) -> usize {
    backend
        .shipments()
        .await
        .values()
        .filter(|(version, _)| *version == STATUSES.len() as u64)
        .count()
}

/// What the outbox still has to publish; a store call that timed out on a
/// loaded machine is asked again.
/// The relays' lease, fitted to the outbox store's measured latency: at
/// least [`LEASE`], and twenty of its slowest of three reads. A relay must
/// read, publish and mark a batch within its lease; moto serves one
/// request at a time and answers in hundreds of milliseconds on a loaded
/// machine, where a 2 s lease lapsed between a relay's calls and two
/// relays took the partition from each other in turn, each publishing it
/// again.
async fn fitted_lease<O: OutboxStore>(outbox: &O) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..3 {
        let started = Instant::now();
        pending(outbox).await;
        slowest = slowest.max(started.elapsed());
    }
    LEASE.max(slowest * 20)
}

async fn pending<O: OutboxStore>(outbox: &O) -> u64 {
    answered("the outbox's stats", || outbox.stats())
        .await
        .pending
}

/// Posts `status` for every order, each request twice (a client's retry
/// with the same key); answers how many answers were replays.
async fn post_all(client: &reqwest::Client, base: &str, run: &str, status: &str) -> usize {
    let mut replays = 0;
    for n in 0..ORDERS {
        for _attempt in 0..2 {
            let answer = client
                .post(format!("{base}/orders"))
                .header("idempotency-key", format!("\"order-{n}-{status}-{run}\""))
                .body(format!("order-{n} {status}"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), StatusCode::CREATED);
            replays += usize::from(answer.headers().contains_key("idempotent-replayed"));
        }
    }
    replays
}

/// Relays until told to stop, as `Relay::run` does: a store error that
/// may pass is retried (anything else fails the test); a broker's is the
/// message's, retried with back-off by the relay itself. Adds up what the
/// passes did in `done`.
async fn relay<O: OutboxStore + 'static>(
    relay: Relay<O, dyn Publisher>,
    done: Arc<Mutex<RelayPass>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match relay.drain().await {
            Ok(pass) => {
                let mut done = done.lock().unwrap();
                done.published += pass.published;
                done.duplicates += pass.duplicates;
                done.failed += pass.failed;
                done.parked += pass.parked;
                done.lost += pass.lost;
            }
            Err(RelayError::Store(error)) => assert!(error.is_retryable(), "{error}"),
            Err(error) => panic!("{error}"),
        }
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// What the consumer saw.
#[derive(Debug)]
struct Tally {
    /// Deliveries by outcome.
    outcomes: BTreeMap<&'static str, usize>,
    /// Deliveries per message id.
    deliveries: HashMap<String, usize>,
    /// Errors the source answered (then asked again).
    source_errors: usize,
    /// Sources attached after the first: the killed consumer's successor.
    attached: usize,
    /// The message whose consumer died between its commit and its ack.
    killed: Option<String>,
}

impl Tally {
    fn new() -> Self {
        let outcomes = [
            "applied",
            "duplicate",
            "stale",
            "retried",
            "in_progress",
            "parked",
            KILLED,
            FAILED,
        ];
        Self {
            outcomes: outcomes.into_iter().map(|o| (o, 0)).collect(),
            deliveries: HashMap::new(),
            source_errors: 0,
            attached: 0,
            killed: None,
        }
    }

    fn count(&mut self, outcome: &'static str) {
        *self.outcomes.entry(outcome).or_default() += 1;
    }

    /// A consume that failed, left to the broker's redelivery: a store
    /// call that timed out, an ack on a connection that was cut.
    fn failed(&mut self, error: &ConsumerError) {
        let retryable = match error {
            ConsumerError::Store(error) => error.is_retryable(),
            ConsumerError::Broker(error) => error.is_retryable(),
            _ => false,
        };
        assert!(retryable, "{error}");
        self.count(FAILED);
    }
}

const KILLED: &str = "killed before its ack";
const FAILED: &str = "failed, left to redelivery";

/// The shipping service's loop: its first delivery's consumer dies between
/// its commit and its ack, and a new one attaches; a source error is asked
/// again (the sources reconnect by themselves). It ends once every order is
/// at its last version, the killed delivery came again as a duplicate and
/// the broker has nothing left for it.
async fn consume<B: Broker, K: Backend>(
    broker: Arc<B>,
    backend: Arc<K>,
    consumer: Consumer<K::Shipping>,
) -> (Tally, Consumer<K::Shipping>) {
    let mut tally = Tally::new();
    let mut source = broker.source().await;
    consumer.check(&source.horizon()).unwrap();
    let mut redelivered = false;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let finishing = redelivered && shipped(&*backend).await == ORDERS;
        assert!(
            Instant::now() < deadline,
            "not done within the patience: {tally:?}"
        );
        // At the end, the copies may still come: done after a quiet second
        // once the broker has nothing ready either (a delivery the source
        // has received and not handed out yet is not ready at the broker,
        // and it comes out of `next` at once).
        let wait = match finishing {
            true => Duration::from_secs(1),
            false => deadline.saturating_duration_since(Instant::now()),
        };
        let Ok(next) = tokio::time::timeout(wait, source.next()).await else {
            if finishing && broker.outstanding().await == 0 {
                return (tally, consumer);
            }
            continue;
        };
        let delivery = match next {
            Ok(Some(delivery)) => delivery,
            Ok(None) => panic!("the source closed"),
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                tally.source_errors += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = delivery.message().id().as_str().to_string();
        *tally.deliveries.entry(id.clone()).or_default() += 1;
        if tally.killed.is_none() {
            match consumer.consume(&KilledBeforeAck(delivery)).await {
                Err(ConsumerError::Broker(error)) if error.operation == "ack" => {
                    tally.count(KILLED);
                    tally.killed = Some(id);
                    broker.kill(source).await;
                    source = broker.source().await;
                    tally.attached += 1;
                }
                Ok(outcome) => tally.count(outcome.as_str()),
                Err(error) => tally.failed(&error),
            }
            continue;
        }
        match consumer.consume(&delivery).await {
            Ok(outcome) => {
                assert!(!matches!(outcome, Settled::Parked { .. }), "{outcome:?}");
                // Seen before: Kafka counts no redelivery, so the tally does.
                if tally.killed.as_ref() == Some(&id) && tally.deliveries[&id] > 1 {
                    assert_eq!(outcome, Settled::Duplicate, "the redelivery after the kill");
                    redelivered = true;
                }
                tally.count(outcome.as_str());
            }
            Err(error) => tally.failed(&error),
        }
    }
}

/// The shipping consumer's options: a version gap (a later event
/// delivered while its predecessor is still with the killed consumer,
/// where the broker hands out more than one delivery at a time, or on
/// Kafka a rebalance that gives its partition to the next member) is retried for about 22 s before it would park (0.1 s doubling
/// to 4 s over ten deliveries; at most 1 s, it was 7.5 s, which a
/// rebalance on a loaded machine outlasted); four deliveries at once (of
/// four aggregates), as a consumer that keeps up with its broker runs.
fn shipping_options() -> ConsumerOptions {
    ConsumerOptions::default()
        .max_deliveries(MAX_DELIVERIES)
        .backoff(Duration::from_millis(100), Duration::from_secs(4))
        .concurrency(4)
}

/// The whole path on `broker` over `K`'s stores, with its faults; prints
/// what it counted.
async fn every_committed_order_event_has_one_effect<B: Broker, K: Backend>(broker: B, run: &str) {
    let broker = Arc::new(broker);
    let name = format!("{} over {}", B::NAME, K::NAME);
    let backend = Arc::new(K::new(run).await);
    let (outbox, base) = backend.order_service().await;
    let consumer = backend.shipping_service(shipping_options()).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // Every order placed; the first relay publishes them, the broker
    // confirms, and the relay is killed before its cursor moves.
    let mut replays = post_all(&client, &base, run, "placed").await;
    let options = RelayOptions::default()
        .with_batch(100)
        .unwrap()
        .with_lease(
            fitted_lease(&*outbox)
                .await
                .max(broker.publish_timeout() * 2),
        )
        .unwrap()
        .with_retries(1_000, Duration::from_millis(50), Duration::from_millis(500))
        .unwrap();
    let (stop, stopped) = watch::channel(false);
    let dying = Arc::new(DiesAfterConfirm::new(broker.publisher().await));
    let publisher: Arc<dyn Publisher> = dying.clone();
    let killed_relay = tokio::spawn(relay(
        Relay::new(outbox.clone(), publisher, options),
        Arc::default(),
        stopped.clone(),
    ));
    tokio::time::timeout(PATIENCE, dying.confirmed.notified())
        .await
        .expect("the first relay published");
    killed_relay.abort();
    assert!(killed_relay.await.unwrap_err().is_cancelled());
    let killed_at = Instant::now();
    let killed_batch = dying.confirmed_ids();
    assert!(!killed_batch.is_empty(), "the broker confirmed its batch");

    // The second relay takes the batch over once the lease lapsed; the
    // consumer runs.
    let survivor = Arc::new(Mutex::new(RelayPass::default()));
    let relaying = tokio::spawn(relay(
        Relay::new(outbox.clone(), broker.publisher().await, options),
        survivor.clone(),
        stopped,
    ));
    let consuming = tokio::spawn(consume(broker.clone(), backend.clone(), consumer));
    wait_until(
        "the second relay took the killed one's batch over",
        || async { pending(&*outbox).await == 0 },
    )
    .await;
    let takeover = killed_at.elapsed();

    // Every order paid; once they flow, the broker goes away, and every
    // order ships while it is away: the relay retries, the sources
    // reconnect.
    replays += post_all(&client, &base, run, "paid").await;
    wait_until("a paid order reaches the consumer", || async {
        backend
            .shipments()
            .await
            .values()
            .any(|(version, _)| *version >= 2)
    })
    .await;
    broker.go_down().await;
    let down_at = Instant::now();
    replays += post_all(&client, &base, run, "shipped").await;
    tokio::time::sleep(DOWN.saturating_sub(down_at.elapsed())).await;
    broker.come_back().await;
    let down_for = down_at.elapsed();

    // Once the outbox has settled everything, no relay publishes again (a
    // relay publishes a message again only when it could not settle it,
    // its lease lost): the relays stop, and what the broker holds for the
    // consumer is all it will get.
    wait_until("the outbox is drained", || async {
        pending(&*outbox).await == 0
    })
    .await;
    stop.send(true).unwrap();
    relaying.await.unwrap();
    let (tally, consumer) = tokio::time::timeout(PATIENCE, consuming)
        .await
        .expect("the consumer is done within the patience")
        .unwrap();
    let survivor = survivor.lock().unwrap().clone();

    let committed = ORDERS * STATUSES.len();
    let stored = broker.stored().await;
    let outstanding = broker.outstanding().await;
    let effects = backend.effects().await;
    let effects_total = effects.len();
    let distinct = effects.iter().collect::<HashSet<_>>().len();
    let mut applied_per_order: HashMap<&str, Vec<u64>> = HashMap::new();
    for effect in &effects {
        applied_per_order
            .entry(&effect.order)
            .or_default()
            .push(effect.version);
    }
    let in_order = applied_per_order
        .values()
        .filter(|applied| **applied == [1, 2, 3])
        .count();
    let shipped = backend
        .shipments()
        .await
        .values()
        .filter(|(version, status)| *version == 3 && status == "shipped")
        .count();
    let parked = consumer.parked(None, 10).await.unwrap().len();
    let left = pending(&*outbox).await;
    let delivered: usize = tally.deliveries.values().sum();
    let copies_delivered = killed_batch
        .iter()
        .filter(|id| tally.deliveries.get(*id).copied().unwrap_or(0) >= 2)
        .count();
    println!("[{name}] committed order events: {committed} ({replays} HTTP retries replayed)");
    println!(
        "[{name}] relays: the killed one's batch of {} was confirmed; the second took it over \
         {takeover:.1?} after the kill and marked {} sent ({} of them duplicates the broker \
         dropped), {} failed attempts (the broker away for {down_for:.1?}), {} lost leases, \
         {} parked",
        killed_batch.len(),
        survivor.published,
        survivor.duplicates,
        survivor.failed,
        survivor.lost,
        survivor.parked,
    );
    println!(
        "[{name}] broker: stored {}, delivered {delivered} deliveries of {} messages \
         ({copies_delivered} of the killed relay's {} delivered twice or more)",
        stored.map_or("-".to_string(), |s| s.to_string()),
        tally.deliveries.len(),
        killed_batch.len(),
    );
    println!(
        "[{name}] deliveries: {:?}; source errors asked again: {}, sources attached after the \
         kill: {}",
        tally.outcomes, tally.source_errors, tally.attached
    );
    println!(
        "[{name}] effects: {effects_total}, distinct: {distinct}; orders applied 1, 2, 3: \
         {in_order}, shipped: {shipped}; parked: {parked}; pending at the end: {left} in the \
         outbox, {outstanding} in the broker"
    );

    assert_eq!(effects_total, committed, "one effect per committed event");
    assert_eq!(distinct, effects_total, "no event applied twice");
    assert_eq!(in_order, ORDERS, "each order's versions applied 1, 2, 3");
    assert_eq!(shipped, ORDERS, "every order at its last version");
    assert_eq!(tally.deliveries.len(), committed, "every event delivered");
    assert_eq!(tally.outcomes[KILLED], 1);
    // The killed consumer's commit stood; so may that of a consume whose
    // ack was cut off.
    let applied = tally.outcomes["applied"] + tally.outcomes[KILLED];
    assert!(
        applied <= committed && committed <= applied + tally.outcomes[FAILED],
        "each event applied once: {tally:?}"
    );
    if broker.deduplicates() {
        assert_eq!(stored, Some(committed as u64), "one copy of each stored");
        assert!(
            survivor.duplicates >= killed_batch.len(),
            "the killed relay's batch, published again, was dropped: {survivor:?}"
        );
    } else {
        assert_eq!(
            copies_delivered,
            killed_batch.len(),
            "the killed relay's batch was delivered again"
        );
        assert!(
            tally.outcomes["duplicate"] > killed_batch.len(),
            "its copies and the killed consumer's redelivery are duplicates: {tally:?}"
        );
    }
    assert_eq!(parked, 0, "nothing parked");
    assert_eq!(left, 0, "nothing pending in the outbox");
    assert_eq!(outstanding, 0, "nothing left in the broker");

    broker.delete().await;
    backend.delete().await;
}

/// A run's own name: its tables, streams and keys.
fn run() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_every_committed_order_event_has_one_effect_through_kills_and_a_server_restart()
 {
    let run = run();
    every_committed_order_event_has_one_effect::<_, Postgres>(Nats::new(&run).await, &run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_every_committed_order_event_has_one_effect_through_kills_and_a_cut_off_broker()
{
    every_committed_order_event_has_one_effect::<_, Postgres>(Rabbit::new().await, &run()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_dynamodb_and_jetstream_every_committed_order_event_has_one_effect_through_kills_and_a_server_restart()
 {
    let run = run();
    every_committed_order_event_has_one_effect::<_, Dynamo>(Nats::new(&run).await, &run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_dynamodb_and_rabbitmq_every_committed_order_event_has_one_effect_through_kills_and_a_cut_off_broker()
 {
    every_committed_order_event_has_one_effect::<_, Dynamo>(Rabbit::new().await, &run()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_every_committed_order_event_has_one_effect_through_kills_and_a_broker_restart() {
    let run = run();
    every_committed_order_event_has_one_effect::<_, Postgres>(Kafka::new(&run).await, &run).await;
}

fn soak_shape(batch: usize, concurrency: usize, partitions: u32) -> soak::Shape {
    soak::Shape {
        batch,
        concurrency,
        partitions,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_in_batches_of_64_every_committed_change_applies_once_in_order_through_kills_and_a_restart()
 {
    let run = run();
    let broker = Nats::new(&run).await;
    soak::every_committed_change_applies_once_in_order(broker, &run, soak_shape(64, 4, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_in_batches_of_100_every_committed_change_applies_once_in_order_through_kills_and_a_restart()
 {
    let run = run();
    let broker = Nats::new(&run).await;
    soak::every_committed_change_applies_once_in_order(broker, &run, soak_shape(100, 8, 4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_in_batches_of_100_every_committed_change_applies_once_in_order_through_kills_rebalances_and_a_restart()
 {
    let run = run();
    let broker = Kafka::new(&run).await;
    soak::every_committed_change_applies_once_in_order(broker, &run, soak_shape(100, 8, 4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_in_batches_of_64_every_committed_change_applies_once_in_order_through_kills_and_cuts()
 {
    let broker = Rabbit::new().await;
    soak::every_committed_change_applies_once_in_order(broker, &run(), soak_shape(64, 4, 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_in_batches_of_100_every_committed_change_applies_once_in_order_through_kills_and_cuts()
 {
    let broker = Rabbit::new().await;
    soak::every_committed_change_applies_once_in_order(broker, &run(), soak_shape(100, 8, 4)).await;
}
