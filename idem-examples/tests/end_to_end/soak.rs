//! The message side soaked with batches on, under faults, on Postgres: four
//! producers commit changes over 60 aggregates (some rolled back, some
//! held open while later ones commit) and a few poisoned ones; two relays
//! over a partitioned outbox, one aborted now and then; two consumer
//! processes sharing one durable consumer (JetStream), queue (RabbitMQ) or
//! consumer group (Kafka), in batches, one of them killed every 1 to 3 s
//! and started again (its task aborted, its connection cut); the broker
//! taken away mid-run (the JetStream server or the private tansu killed and
//! started again on its store, tansu once more after the last kill; every
//! RabbitMQ connection cut). Then, once the producers stop and the
//! consumers catch up: every committed change applied exactly once and in
//! version order per aggregate, nothing rolled back delivered, nothing
//! parked but the poisoned changes, no aggregate stuck, nothing left in the
//! outbox or the broker.
//!
//! `IDEM_SOAK_SECS` (20 by default) sets how long the faults go on and
//! `IDEM_SOAK_CHANGES` (1,500 by default) how many changes are committed
//! over that time; `scripts/soak` runs the harsher form (4,000 changes over
//! 20 s, under load), which failed on both brokers before the consumer
//! counted its own attempts and released the gaps it raced.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_conformance::faults::FaultProxy;
use idem_conformance::relays::wait_until;
use idem_consumer::{Consumer, ConsumerOptions};
use idem_outbox::{Publisher, Relay, RelayOptions};
use idem_postgres::PostgresOutbox;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::brokers::Broker;
use super::postgres::{Postgres, Shipping};
use super::{Backend, DOWN, LEASE, PATIENCE, POISON, env, pending};

const AGGREGATES: usize = 60;
const POISONED: usize = 3;
const PRODUCERS: usize = 4;
/// How long catching up may go without one more change applied: a slow
/// broker on a loaded machine takes its time (tansu on moto applies about
/// 10 changes a second under `scripts/load.sh`, and was seen flat for
/// 10 s), a stuck aggregate or a group that no longer forms applies none.
const STALL: Duration = Duration::from_secs(90);

/// How batches are formed and spread: the consumer's batch and
/// concurrency, the outbox's partitions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) batch: usize,
    pub(crate) concurrency: usize,
    pub(crate) partitions: u32,
}

fn figure(name: &str, default: u64) -> u64 {
    env(name, &default.to_string())
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// The consumer processes' options: a gap is retried twice within about a
/// tenth of a second, then parked (and released once its predecessor
/// applies), so gaps park often and race the releases; the sweep runs
/// every second.
fn options(shape: Shape) -> ConsumerOptions {
    ConsumerOptions::default()
        .max_deliveries(3)
        .backoff(Duration::from_millis(30), Duration::from_millis(300))
        .batch(shape.batch, Duration::from_millis(10))
        .concurrency(shape.concurrency)
        .release_interval(Duration::from_secs(1))
}

/// A consumer process: its `run` task, the stop it heeds, and the proxy
/// its connection goes through (RabbitMQ).
struct Process {
    task: JoinHandle<()>,
    stop: watch::Sender<bool>,
    proxy: Option<FaultProxy>,
}

impl Process {
    /// A consumer of its own (its own count of failed attempts, as a new
    /// process has) over the shared stores and a source of its own.
    async fn start<B: Broker>(broker: &B, backend: &Postgres, shape: Shape) -> Self {
        let consumer: Consumer<Shipping> = backend.shipping_service(options(shape)).await;
        let slots = options(shape).slots();
        let (mut source, proxy) = broker
            .process_source(u16::try_from(slots).unwrap_or(u16::MAX))
            .await;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let ran = consumer
                .run(&mut source, async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                })
                .await;
            if let Err(error) = ran {
                panic!("a consumer process stopped: {error}");
            }
        });
        Self { task, stop, proxy }
    }

    /// Dies: the task aborted, the connection cut.
    fn kill(self) {
        self.task.abort();
        drop(self.proxy);
    }

    /// Stops at its shutdown, then cuts its connection.
    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("a consumer process stops")
            .unwrap();
        drop(self.proxy);
    }
}

/// The relays' options: a short lease, so an aborted relay's partitions
/// are taken over soon, outlasting a batch's time limit at the broker.
fn relay_options(partitions: u32, publish_timeout: Duration) -> RelayOptions {
    RelayOptions::default()
        .with_batch(100)
        .unwrap()
        .with_lease(LEASE.max(publish_timeout * 2))
        .unwrap()
        .with_max_partitions(partitions)
        .unwrap()
        .with_poll_interval(Duration::from_millis(50))
        .unwrap()
        .with_retries(1_000, Duration::from_millis(50), Duration::from_millis(500))
        .unwrap()
}

/// A relay to `broker` running in a task until aborted or stopped.
async fn relay<B: Broker>(
    broker: &B,
    outbox: &Arc<PostgresOutbox>,
    partitions: u32,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let publisher: Arc<dyn Publisher> = broker.publisher().await;
    let options = relay_options(partitions, broker.publish_timeout());
    let relay = Relay::new(outbox.clone(), publisher, options);
    tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stop.wait_for(|stop| *stop).await;
            })
            .await;
    })
}

/// What the producers committed: each aggregate's versions, and how many
/// transactions they rolled back.
#[derive(Default)]
struct Produced {
    committed: Mutex<HashMap<String, Vec<u64>>>,
    rolled_back: AtomicUsize,
}

/// Commits `changes` changes over the aggregates, paced over `span`, in
/// `PRODUCERS` tasks: one in ten rolled back, one in ten held open a while
/// as later ones commit.
async fn produce(
    backend: Arc<Postgres>,
    outbox: Arc<PostgresOutbox>,
    run: String,
    changes: u64,
    span: Duration,
    produced: Arc<Produced>,
) {
    let each = changes / PRODUCERS as u64;
    let pause = span / u32::try_from(each.max(1)).unwrap_or(u32::MAX);
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (backend, outbox, run, produced) = (
            backend.clone(),
            outbox.clone(),
            run.clone(),
            produced.clone(),
        );
        producers.push(tokio::spawn(async move {
            let mut done = 0;
            while done < each {
                let (aggregate, commit, hold) = {
                    let mut rng = rand::rng();
                    let hold = match rng.random_bool(0.1) {
                        true => Duration::from_millis(rng.random_range(20..200)),
                        false => Duration::ZERO,
                    };
                    let aggregate = format!("agg-{run}-{}", rng.random_range(0..AGGREGATES));
                    (aggregate, !rng.random_bool(0.1), hold)
                };
                let status = format!("status-{done}");
                match backend
                    .change(&outbox, &aggregate, &status, hold, commit)
                    .await
                {
                    Ok(Some(version)) => {
                        produced
                            .committed
                            .lock()
                            .unwrap()
                            .entry(aggregate)
                            .or_default()
                            .push(version);
                        done += 1;
                    }
                    Ok(None) => {
                        produced.rolled_back.fetch_add(1, Ordering::SeqCst);
                    }
                    // A pool busy with the consumers: try again.
                    Err(_) => {}
                }
                tokio::time::sleep(pause).await;
            }
        }));
    }
    for producer in producers {
        producer.await.unwrap();
    }
}

/// Waits until `count` reaches `target` for as long as it keeps rising:
/// panics with `what` once it has not risen for [`STALL`].
async fn wait_while_rising<F, Fut>(what: &str, target: usize, mut count: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = usize>,
{
    let (mut reached, mut rose) = (count().await, Instant::now());
    while reached < target {
        assert!(
            rose.elapsed() < STALL,
            "{what}: {reached} of {target}, none more for {STALL:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = count().await;
        if now > reached {
            (reached, rose) = (now, Instant::now());
        }
    }
}

/// The whole soak on `broker` with `shape`; prints what it counted.
pub(crate) async fn every_committed_change_applies_once_in_order<B: Broker>(
    broker: B,
    run: &str,
    shape: Shape,
) {
    let span = Duration::from_secs(figure("IDEM_SOAK_SECS", 20));
    let changes = figure("IDEM_SOAK_CHANGES", 1_500);
    let name = format!("{} {shape:?}", B::NAME);
    let broker = Arc::new(broker);
    // Two processes of `concurrency` batches, the relays, the producers.
    let connections = u32::try_from(shape.concurrency * 2 + 12).unwrap();
    let backend = Arc::new(Postgres::with_connections(run, connections).await);
    let outbox = backend.outbox(shape.partitions).await;

    // The poisoned changes: one per aggregate of their own, so nothing
    // waits behind them.
    let mut poisoned = HashSet::new();
    for k in 0..POISONED {
        let aggregate = format!("poison-{run}-{k}");
        backend
            .change(&outbox, &aggregate, POISON, Duration::ZERO, true)
            .await
            .unwrap();
        poisoned.insert(aggregate);
    }

    let (stop_relays, relays_stopped) = watch::channel(false);
    let mut relays = Vec::new();
    for _ in 0..2 {
        relays.push(relay(&*broker, &outbox, shape.partitions, relays_stopped.clone()).await);
    }
    let mut processes = Vec::new();
    for _ in 0..2 {
        processes.push(Process::start(&*broker, &backend, shape).await);
    }
    let produced = Arc::new(Produced::default());
    let producing = tokio::spawn(produce(
        backend.clone(),
        outbox.clone(),
        run.to_string(),
        changes,
        span,
        produced.clone(),
    ));

    // The faults, for the span: a consumer process killed every 1 to 3 s
    // and started again, a relay aborted every third kill, the broker
    // taken away once, half way.
    let started = Instant::now();
    let (mut kills, mut relay_aborts, mut down) = (0, 0, false);
    while started.elapsed() < span {
        let wait = Duration::from_millis(rand::rng().random_range(1_000..3_000));
        tokio::time::sleep(wait).await;
        if !down && started.elapsed() >= span / 2 {
            down = true;
            broker.go_down().await;
            for process in &processes {
                if let Some(proxy) = &process.proxy {
                    proxy.cut_all();
                }
            }
            tokio::time::sleep(DOWN).await;
            broker.come_back().await;
            continue;
        }
        let victim = rand::rng().random_range(0..processes.len());
        processes.swap_remove(victim).kill();
        processes.push(Process::start(&*broker, &backend, shape).await);
        kills += 1;
        if kills % 3 == 0 {
            let victim = rand::rng().random_range(0..relays.len());
            relays.swap_remove(victim).abort();
            relays.push(relay(&*broker, &outbox, shape.partitions, relays_stopped.clone()).await);
            relay_aborts += 1;
        }
    }
    tokio::time::timeout(PATIENCE, producing)
        .await
        .expect("the producers finish")
        .unwrap();
    let committed: HashMap<String, Vec<u64>> = produced.committed.lock().unwrap().clone();
    let committed_total: usize = committed.values().map(Vec::len).sum();
    let faults_for = started.elapsed();
    let mut restarts = usize::from(down);
    // Where a kill can leave a forming group without a leader for good,
    // a restart after the last one lets the group form again.
    if broker.loses_a_forming_leader() {
        broker.go_down().await;
        tokio::time::sleep(DOWN).await;
        broker.come_back().await;
        restarts += 1;
    }
    // Where the broker keeps a dead member's partitions assigned to it
    // until another member joins: one joins once every dead one expired.
    if let Some(expiry) = broker.member_expiry() {
        tokio::time::sleep(expiry).await;
        processes.push(Process::start(&*broker, &backend, shape).await);
    }

    // Caught up: every change applied, the poisoned ones parked.
    let watcher = backend.shipping_service(options(shape)).await;
    wait_until("the outbox is drained", || async {
        pending(&*outbox).await == 0
    })
    .await;
    let caught_up = Instant::now();
    // Every 10 s while catching up, what is applied, parked and stuck: a
    // wait that times out then tells slowness from an aggregate stuck.
    let progress = tokio::spawn({
        let (backend, watcher, name) = (backend.clone(), watcher.clone(), name.clone());
        let broker = broker.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let parked = watcher.parked(None, 100).await.unwrap_or_default();
                let stuck = watcher.stuck(100).await.unwrap_or_default();
                eprintln!(
                    "[{name}] catching up: {} of {committed_total} applied, {} parked, {} stuck, \
                     {} outstanding in the broker",
                    backend.effects().await.len(),
                    parked.len(),
                    stuck.len(),
                    broker.outstanding().await,
                );
            }
        }
    });
    wait_while_rising(
        "every committed change applied",
        committed_total,
        || async { backend.effects().await.len() },
    )
    .await;
    wait_until("the poisoned changes parked", || async {
        watcher.parked(None, 100).await.unwrap().len() >= POISONED
    })
    .await;
    wait_until("nothing left in the broker", || async {
        broker.outstanding().await == 0
    })
    .await;
    let catch_up = caught_up.elapsed();
    progress.abort();
    for process in processes {
        process.stop().await;
    }
    stop_relays.send(true).unwrap();
    for relay in relays {
        tokio::time::timeout(PATIENCE, relay)
            .await
            .expect("a relay stops")
            .unwrap();
    }

    let effects = backend.effects().await;
    let distinct: HashSet<_> = effects.iter().collect();
    let mut applied: HashMap<String, Vec<u64>> = HashMap::new();
    for effect in &effects {
        applied
            .entry(effect.order.clone())
            .or_default()
            .push(effect.version);
    }
    let out_of_order: Vec<&String> = committed
        .iter()
        .filter(|(aggregate, versions)| {
            let expected: Vec<u64> = (1..=versions.len() as u64).collect();
            applied.get(*aggregate) != Some(&expected)
        })
        .map(|(aggregate, _)| aggregate)
        .collect();
    let parked: HashSet<String> = watcher
        .parked(None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| {
            entry
                .parked
                .message
                .aggregate()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let stuck = watcher.stuck(100).await.unwrap();
    println!(
        "[{name}] committed {committed_total} changes over {} aggregates ({} rolled back), \
         {POISONED} poisoned; faults for {faults_for:.1?}: {kills} consumer processes killed, \
         {relay_aborts} relays aborted, the broker away {restarts} times; caught up {catch_up:.1?} after \
         the outbox drained; effects {}, distinct {}; aggregates out of order or incomplete: \
         {}; parked: {}; stuck: {}",
        committed.len(),
        produced.rolled_back.load(Ordering::SeqCst),
        effects.len(),
        distinct.len(),
        out_of_order.len(),
        parked.len(),
        stuck.len(),
    );
    assert_eq!(
        effects.len(),
        committed_total,
        "one effect per committed change"
    );
    assert_eq!(distinct.len(), effects.len(), "no change applied twice");
    assert!(
        out_of_order.is_empty(),
        "every aggregate's committed versions applied once, in order: {out_of_order:?}"
    );
    assert_eq!(parked, poisoned, "nothing parked but the poisoned changes");
    assert!(stuck.is_empty(), "no aggregate stuck: {stuck:?}");
    assert_eq!(pending(&*outbox).await, 0, "nothing left in the outbox");

    broker.delete().await;
    backend.delete().await;
}
