//! The consumer's rules on the memory stores and an in-process broker: one
//! effect per message, redelivery with back-off, parking and replay,
//! version gaps that wait and are released, and the retention check.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Broker, BrokerSaw, Interrupted, Shop, TestSource, event, plain};
use idem_conformance::consumers::{self, Books, MemoryBackend, consumer_with};
use idem_consumer::{
    BrokerError, Consumer, ConsumerError, ConsumerOptions, Delivery, RedeliveryHorizon, Settled,
};
use idem_core::IdempotencyKey;
use idem_core::store::{ParkedState, ParkingStore};
use idem_memory::MemoryParking;

const FIRST: Duration = Duration::from_millis(100);

fn consumer() -> (Consumer<Shop>, Shop, MemoryParking) {
    consumer_with(
        ConsumerOptions::default()
            .max_deliveries(4)
            .backoff(FIRST, Duration::from_secs(1)),
    )
}

/// Delivers and consumes what the broker has ready until it has nothing.
async fn drain(consumer: &Consumer<Shop>, broker: &Broker) -> Vec<Result<Settled, String>> {
    let mut outcomes = Vec::new();
    while let Some(delivery) = broker.deliver() {
        outcomes.push(consumer.consume(&delivery).await.map_err(|e| e.to_string()));
    }
    outcomes
}

fn key(id: &str) -> IdempotencyKey {
    IdempotencyKey::new(id).unwrap()
}

#[tokio::test]
async fn a_message_applies_once_and_its_redelivery_is_acked_without_effect() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    broker.publish(plain("m-1", "order 1 placed"));
    broker.publish(plain("m-1", "order 1 placed"));
    let outcomes = drain(&consumer, &broker).await;
    assert_eq!(outcomes, [Ok(Settled::Applied), Ok(Settled::Duplicate)]);
    assert_eq!(shop.effects().await, ["order 1 placed"]);
    assert_eq!(
        broker.settled(),
        [
            BrokerSaw::Acked("m-1".into()),
            BrokerSaw::Acked("m-1".into())
        ]
    );
}

#[tokio::test]
async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    broker.publish(plain("m-1", "order 1 placed"));
    broker.lose_next_ack("m-1");
    let outcomes = drain(&consumer, &broker).await;
    assert_eq!(outcomes.len(), 2, "{outcomes:?}");
    assert!(
        outcomes[0].as_ref().is_err_and(|e| e.contains("ack")),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[1], Ok(Settled::Duplicate));
    assert_eq!(shop.effects().await, ["order 1 placed"]);
}

#[tokio::test]
async fn a_duplicate_delivered_while_the_first_is_handled_waits_for_it() {
    let (consumer, shop, _) = consumer();
    let consumer = Arc::new(consumer);
    let broker = Broker::default();
    broker.publish(plain("m-1", "order 1 placed"));
    broker.publish(plain("m-1", "order 1 placed"));
    let (first, second) = (broker.deliver().unwrap(), broker.deliver().unwrap());
    let (entered, go) = shop.hold_next();
    let handling = tokio::spawn({
        let consumer = consumer.clone();
        async move { consumer.consume(&first).await.unwrap() }
    });
    entered.notified().await;
    let waiting = consumer.consume(&second).await.unwrap();
    assert!(
        matches!(waiting, Settled::InProgress { after } if after > Duration::ZERO),
        "{waiting:?}"
    );
    go.notify_one();
    assert_eq!(handling.await.unwrap(), Settled::Applied);
    // The broker delivers the waiting one again: now a duplicate.
    assert_eq!(drain(&consumer, &broker).await, [Ok(Settled::Duplicate)]);
    assert_eq!(shop.effects().await, ["order 1 placed"]);
}

#[tokio::test]
async fn a_failing_message_is_retried_with_back_off_then_parked_and_replayed() {
    let (consumer, shop, parking) = consumer();
    let broker = Broker::default();
    shop.fail("m-1", 10);
    broker.publish(plain("m-1", "order 1 placed"));
    let outcomes = drain(&consumer, &broker).await;
    let delays: Vec<Duration> = outcomes
        .iter()
        .filter_map(|o| match o {
            Ok(Settled::Retried { after, reason }) => {
                assert!(reason.contains("m-1 is refused"), "{reason}");
                Some(*after)
            }
            _ => None,
        })
        .collect();
    assert_eq!(delays, [FIRST, FIRST * 2, FIRST * 4]);
    assert!(
        matches!(outcomes.last(), Some(Ok(Settled::Parked { reason })) if reason.contains("refused")),
        "{outcomes:?}"
    );
    assert_eq!(
        broker.settled().last(),
        Some(&BrokerSaw::Acked("m-1".into()))
    );
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].parked.deliveries, 4);
    assert!(shop.effects().await.is_empty());

    shop.fail("m-1", 1);
    let again = consumer.replay(&key("m-1")).await.unwrap();
    assert!(matches!(again, Some(Settled::Parked { .. })), "{again:?}");
    assert_eq!(
        parking.count(consumer.name()).await.unwrap(),
        1,
        "still parked"
    );

    assert_eq!(
        consumer.replay(&key("m-1")).await.unwrap(),
        Some(Settled::Applied)
    );
    assert_eq!(shop.effects().await, ["order 1 placed"]);
    let entry = parking
        .get(consumer.name(), &key("m-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.state, ParkedState::Replayed);
    assert_eq!(
        consumer.replay(&key("m-1")).await.unwrap(),
        None,
        "resolved"
    );
    broker.publish(plain("m-1", "order 1 placed"));
    assert_eq!(drain(&consumer, &broker).await, [Ok(Settled::Duplicate)]);
}

/// A handler's `Permanent` error parks its message at its first attempt,
/// on its own and in a batch (its batch-mates apply); a plain error would
/// be delivered again three times first.
#[tokio::test]
async fn a_permanent_failure_is_parked_at_once_with_its_reason() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    shop.fail_for_good("m-1");
    broker.publish(plain("m-1", "order 1 placed"));
    let outcomes = drain(&consumer, &broker).await;
    assert!(
        matches!(&outcomes[..], [Ok(Settled::Parked { reason })] if reason == "permanent: m-1 can never apply"),
        "{outcomes:?}"
    );
    assert_eq!(broker.settled(), [BrokerSaw::Acked("m-1".into())]);
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(
        parked[0].parked.deliveries, 1,
        "parked at its first attempt"
    );

    shop.fail_for_good("m-3");
    for (id, text) in [("m-2", "order 2"), ("m-3", "order 3"), ("m-4", "order 4")] {
        broker.publish(plain(id, text));
    }
    let batch: Vec<_> = std::iter::from_fn(|| broker.deliver()).collect();
    let outcomes = consumer.consume_batch(&batch).await;
    assert!(
        matches!(&outcomes[1], Ok(Settled::Parked { reason }) if reason.starts_with("permanent: ")),
        "{outcomes:?}"
    );
    assert!(matches!(outcomes[0], Ok(Settled::Applied)), "{outcomes:?}");
    assert!(matches!(outcomes[2], Ok(Settled::Applied)), "{outcomes:?}");
    assert_eq!(shop.effects().await, ["order 2", "order 4"]);
    assert_eq!(consumer.parked(None, 10).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_dropped_message_keeps_its_reason_and_is_never_replayed() {
    let (consumer, shop, parking) = consumer();
    let broker = Broker::default();
    shop.fail("m-1", 10);
    broker.publish(plain("m-1", "order 1 placed"));
    drain(&consumer, &broker).await;
    assert!(
        consumer
            .drop_parked(&key("m-1"), "refunded by hand")
            .await
            .unwrap()
    );
    let entry = parking
        .get(consumer.name(), &key("m-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.resolution.as_deref(), Some("refunded by hand"));
    assert_eq!(consumer.replay(&key("m-1")).await.unwrap(), None);
    assert!(shop.effects().await.is_empty());
}

#[tokio::test]
async fn an_id_delivered_with_another_payload_is_parked_at_once() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    broker.publish(plain("m-1", "order 1 placed"));
    broker.publish(plain("m-1", "order 1 cancelled"));
    let outcomes = drain(&consumer, &broker).await;
    assert_eq!(outcomes.len(), 2);
    assert!(
        matches!(&outcomes[1], Ok(Settled::Parked { reason }) if reason.contains("another payload")),
        "{outcomes:?}"
    );
    assert_eq!(shop.effects().await, ["order 1 placed"]);
}

#[tokio::test]
async fn a_stale_event_is_acked_without_effect() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    broker.publish(event("e-1", "order-1", 1));
    broker.publish(event("e-2", "order-1", 2));
    // The same event published again under a new id (a producer's retry).
    broker.publish(event("e-1-again", "order-1", 1));
    let outcomes = drain(&consumer, &broker).await;
    assert_eq!(
        outcomes,
        [
            Ok(Settled::Applied),
            Ok(Settled::Applied),
            Ok(Settled::Stale)
        ]
    );
    assert_eq!(shop.effects().await, ["order-1@1", "order-1@2"]);
}

/// A gap made to happen: version 2 is held back while 3 and 4 arrive; they
/// are retried, then parked, and the arrival of 2 releases them in order.
#[tokio::test]
async fn a_gap_is_retried_parked_and_released_in_order_when_it_fills() {
    let (consumer, shop, parking) = consumer();
    let broker = Broker::default();
    broker.publish(event("e-1", "order-1", 1));
    broker.publish(event("e-4", "order-1", 4));
    broker.publish(event("e-3", "order-1", 3));
    broker.publish(event("other", "order-2", 1));
    let outcomes = drain(&consumer, &broker).await;
    let parked: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(Settled::Parked { reason }) if reason.contains("version gap")))
        .collect();
    assert_eq!(parked.len(), 2, "{outcomes:?}");
    assert_eq!(shop.effects().await, ["order-1@1", "order-2@1"]);
    let waiting = consumer.parked(Some("order-1"), 10).await.unwrap();
    let versions: Vec<_> = waiting.iter().map(|e| e.parked.message.version()).collect();
    assert_eq!(versions, [Some(3), Some(4)]);

    broker.publish(event("e-2", "order-1", 2));
    assert_eq!(drain(&consumer, &broker).await, [Ok(Settled::Applied)]);
    assert_eq!(
        shop.effects().await,
        [
            "order-1@1",
            "order-2@1",
            "order-1@2",
            "order-1@3",
            "order-1@4"
        ]
    );
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
    assert_eq!(
        shop.books.domain.lock().unwrap().versions.get("order-1"),
        Some(&4)
    );
}

/// A consumer that parks only after billions of attempts: its horizon
/// is summed at once (every gap past the doublings is the longest), not
/// delivery by delivery, which held `run` for minutes before.
#[test]
fn the_horizon_of_a_huge_delivery_limit_is_computed_at_once() {
    let (consumer, _, _) = consumer_with(
        ConsumerOptions::default()
            .max_deliveries(u32::MAX)
            .backoff(Duration::from_secs(1), Duration::from_secs(60)),
    );
    let broker = RedeliveryHorizon::new("test", Duration::from_secs(30))
        .with_backoff(vec![Duration::from_secs(5)]);
    let started = std::time::Instant::now();
    let horizon = consumer.horizon(&broker).unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    // Gaps of 30 s (the ack wait) until the doubling delay passes it (at
    // the 6th delivery: 32 s), then 32 s, then 60 s from the 7th on.
    let gaps: u64 = 30 * 5 + 32 + 60 * (u64::from(u32::MAX) - 1 - 6);
    assert_eq!(horizon, Duration::from_secs(gaps + 30));
}

#[tokio::test]
async fn retention_shorter_than_the_brokers_horizon_is_misconfigured() {
    let day = Duration::from_secs(24 * 3600);
    let (consumer, _, _) = consumer_with(
        ConsumerOptions::default()
            .max_deliveries(5)
            .backoff(Duration::from_secs(1), Duration::from_secs(60))
            .retention(day),
    );
    let figure = |horizon: &RedeliveryHorizon| match consumer.check(horizon) {
        Err(ConsumerError::Misconfigured { figure, message }) => Some((figure, message)),
        Ok(()) => None,
        Err(other) => panic!("{other}"),
    };
    let ack_wait = Duration::from_secs(30);
    // A broker limit is refused whatever it is: the broker counts copies
    // no consumer settled, and drops the message at it.
    for limit in [3, 5, 1_000] {
        let limited = RedeliveryHorizon::new("nats", ack_wait).with_max_deliveries(limit);
        let (name, message) = figure(&limited).unwrap();
        assert_eq!(name, "max deliveries");
        assert!(
            message.contains(&format!("after {limit} deliveries")),
            "{message}"
        );
    }
    let fine =
        RedeliveryHorizon::new("nats", ack_wait).with_duplicate_window(Duration::from_secs(120));
    assert_eq!(figure(&fine), None);
    // 4 gaps of at least the ack wait, the consumer's delays and the
    // broker's back-off, and the last ack wait.
    let backoff = vec![Duration::from_secs(60), Duration::from_secs(600)];
    let slow = RedeliveryHorizon::new("nats", ack_wait).with_backoff(backoff);
    assert_eq!(
        consumer.horizon(&slow).unwrap(),
        Duration::from_secs(60 + 600 * 3 + 30)
    );
    let long = RedeliveryHorizon::new("rabbitmq", Duration::from_secs(7 * 3600));
    let (name, message) = figure(&long).unwrap();
    assert_eq!(name, "inbox retention");
    assert!(message.contains("redelivery horizon"), "{message}");
    let window = RedeliveryHorizon::new("nats", ack_wait).with_duplicate_window(day * 2);
    assert!(figure(&window).unwrap().1.contains("duplicate window"));
}

#[tokio::test]
async fn run_refuses_a_short_retention_before_any_delivery() {
    let (consumer, shop, _) =
        consumer_with(ConsumerOptions::default().retention(Duration::from_secs(60)));
    let broker = Broker::default();
    broker.publish(plain("m-1", "order 1 placed"));
    let mut source = TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(30)),
    };
    let refused = consumer.run(&mut source, std::future::pending()).await;
    assert!(
        matches!(refused, Err(ConsumerError::Misconfigured { .. })),
        "{refused:?}"
    );
    assert!(shop.effects().await.is_empty());
    assert!(
        broker.deliver().is_some(),
        "the delivery is still the broker's"
    );
}

#[tokio::test]
async fn run_consumes_until_the_source_closes() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    shop.fail("m-2", 1);
    for (id, text) in [("m-1", "one"), ("m-2", "two"), ("m-1", "one")] {
        broker.publish(plain(id, text));
    }
    let mut source = TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(1)),
    };
    let closer = tokio::spawn({
        let (broker, shop) = (broker.clone(), shop.clone());
        async move {
            while shop.effects().await.len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            broker.close();
        }
    });
    consumer
        .run(&mut source, std::future::pending())
        .await
        .unwrap();
    closer.await.unwrap();
    let mut effects = shop.effects().await;
    effects.sort();
    assert_eq!(effects, ["one", "two"]);
}

#[tokio::test]
async fn run_asks_again_after_a_retryable_receive_error_and_stops_on_any_other() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    broker.publish(plain("m-1", "one"));
    broker.close();
    let horizon = RedeliveryHorizon::new("test", Duration::from_secs(1));
    let lost = || BrokerError::unavailable("test", "receive", "connection lost");
    let mut source = Interrupted {
        source: TestSource {
            broker: broker.clone(),
            horizon: horizon.clone(),
        },
        errors: [lost(), lost()].into(),
        asked: 0,
    };
    consumer
        .run(&mut source, std::future::pending())
        .await
        .unwrap();
    // Two failed receives, the delivery, and the closed source's None.
    assert_eq!(source.asked, 4);
    assert_eq!(shop.effects().await, ["one"]);

    let mut refused = Interrupted {
        source: TestSource {
            broker: Broker::default(),
            horizon,
        },
        errors: [
            lost(),
            BrokerError::rejected("test", "receive", "no such queue"),
        ]
        .into(),
        asked: 0,
    };
    let stopped = consumer.run(&mut refused, std::future::pending()).await;
    assert!(
        matches!(&stopped, Err(ConsumerError::Broker(error)) if !error.is_retryable()),
        "{stopped:?}"
    );
    assert_eq!(refused.asked, 2);
}

#[test]
fn outcomes_are_counted_by_consumer_and_outcome() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (consumer, _, _) = consumer();
    let broker = Broker::default();
    broker.publish(plain("m-1", "one"));
    broker.publish(plain("m-1", "one"));
    let counted = metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(drain(&consumer, &broker))
    });
    assert_eq!(counted.len(), 2);
    let mut seen = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() == idem_consumer::MESSAGES {
            let outcome = key
                .key()
                .labels()
                .find(|l| l.key() == "outcome")
                .map(|l| l.value().to_string());
            seen.push((outcome, value));
        }
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        [
            (Some("applied".to_string()), DebugValue::Counter(1)),
            (Some("duplicate".to_string()), DebugValue::Counter(1)),
        ]
    );
}

/// Runs `consumer` over `broker` in a task of its own until `shutdown`.
fn run_in_task(
    consumer: &Consumer<Shop>,
    broker: &Broker,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<Result<(), ConsumerError>> {
    let mut source = TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(1)),
    };
    let consumer = consumer.clone();
    tokio::spawn(async move { consumer.run(&mut source, shutdown).await })
}

/// Waits until the broker has seen `count` settlements.
async fn settled(broker: &Broker, count: usize) -> Vec<BrokerSaw> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let settled = broker.settled();
        if settled.len() >= count {
            return settled;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "settled: {settled:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The task running the consumer is aborted while a delivery is inside
/// its handler: the delivery still commits whole and is acknowledged once,
/// and the broker has nothing to deliver again.
#[tokio::test]
async fn aborting_runs_task_mid_delivery_lets_the_delivery_commit_and_settle() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    broker.redeliver_unsettled();
    let (entered, go) = shop.hold_next();
    broker.publish(plain("m-1", "one"));
    let running = run_in_task(&consumer, &broker, std::future::pending());
    entered.notified().await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    go.notify_one();
    assert_eq!(settled(&broker, 1).await, [BrokerSaw::Acked("m-1".into())]);
    assert_eq!(shop.effects().await, ["one"]);
    assert!(broker.deliver().is_none(), "nothing left to deliver again");
}

/// Runs `consumer` in a task and stops it (its shutdown completes) while a
/// delivery is inside its handler, held there until the gate returned is
/// opened.
async fn stopped_while_handling(
    consumer: &Consumer<Shop>,
    shop: &Shop,
    broker: &Broker,
) -> (
    tokio::task::JoinHandle<Result<(), ConsumerError>>,
    Arc<tokio::sync::Notify>,
) {
    let (entered, go) = shop.hold_next();
    broker.publish(plain("m-1", "one"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = run_in_task(consumer, broker, async move {
        let _ = stopped.await;
    });
    tokio::time::timeout(Duration::from_secs(30), entered.notified())
        .await
        .expect("the delivery reached its handler");
    stop.send(()).unwrap();
    (running, go)
}

/// At shutdown, `run` waits for the delivery being handled to commit and
/// be acknowledged before it returns.
#[tokio::test]
async fn shutdown_waits_for_the_delivery_being_handled() {
    let (consumer, shop, _) = consumer();
    let broker = Broker::default();
    let (running, go) = stopped_while_handling(&consumer, &shop, &broker).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !running.is_finished(),
        "run returned with a delivery inside its handler"
    );
    go.notify_one();
    running.await.unwrap().unwrap();
    assert_eq!(broker.settled(), [BrokerSaw::Acked("m-1".into())]);
    assert_eq!(shop.effects().await, ["one"]);
}

/// Runs `consumer` on `order-1`'s versions 1 (`o-1`) and `next`
/// (`o-<next>`), once version 1 has committed and its ack is sent and
/// held: the task, and the notify that lets the ack through.
fn run_with_the_first_ack_held(
    consumer: &Consumer<Shop>,
    broker: &Broker,
    next: u64,
) -> impl std::future::Future<
    Output = (
        tokio::task::JoinHandle<Result<(), ConsumerError>>,
        Arc<tokio::sync::Notify>,
    ),
> {
    let (sent, leave) = broker.hold_next_ack("o-1");
    broker.publish(event("o-1", "order-1", 1));
    broker.publish(event(&format!("o-{next}"), "order-1", next));
    let running = run_in_task(consumer, broker, std::future::pending());
    async move {
        tokio::time::timeout(Duration::from_secs(30), sent.notified())
            .await
            .expect("the first version committed and its ack was sent");
        (running, leave)
    }
}

/// A batch's aggregates go on once it has committed, while its acks are
/// still on their way: with nothing of the consumer's parked, the next
/// version of an aggregate is handled and acked while the ack of the
/// version before it is held.
#[tokio::test]
async fn an_aggregates_next_version_is_handled_while_the_ack_of_the_last_is_on_its_way() {
    let (consumer, shop, _) = consumer_with(ConsumerOptions::default().batch(1, Duration::ZERO));
    let broker = Broker::default();
    let (running, leave) = run_with_the_first_ack_held(&consumer, &broker, 2).await;
    assert_eq!(
        settled(&broker, 1).await,
        [BrokerSaw::Acked("o-2".into())],
        "the second version settled with the first's ack held"
    );
    assert_eq!(shop.effects().await, ["order-1@1", "order-1@2"]);
    leave.notify_one();
    assert_eq!(
        settled(&broker, 2).await,
        [
            BrokerSaw::Acked("o-2".into()),
            BrokerSaw::Acked("o-1".into())
        ]
    );
    running.abort();
}

/// When the source closes, `run` returns once what it received is
/// settled: a batch whose aggregates went on at its commit is waited for
/// until its acks are sent.
#[tokio::test]
async fn run_returns_after_the_acks_of_its_last_batch() {
    let (consumer, _, _) = consumer_with(ConsumerOptions::default().batch(1, Duration::ZERO));
    let broker = Broker::default();
    let (sent, leave) = broker.hold_next_ack("o-1");
    broker.publish(event("o-1", "order-1", 1));
    broker.close();
    let running = run_in_task(&consumer, &broker, std::future::pending());
    tokio::time::timeout(Duration::from_secs(30), sent.notified())
        .await
        .expect("the batch committed and its ack was sent");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !running.is_finished(),
        "run returned with an ack on its way"
    );
    leave.notify_one();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("run returns once the ack is through")
        .unwrap()
        .unwrap();
    assert_eq!(broker.settled(), [BrokerSaw::Acked("o-1".into())]);
}

/// With a message of the consumer's parked, an aggregate goes on only
/// once its batch is settled and has replayed what was parked behind its
/// event: the next version finds the parked one applied, never a gap.
#[tokio::test]
async fn with_a_version_parked_the_next_waits_until_its_batch_released_it() {
    // No sweep within the test: only the batch's own release may replay
    // the parked version, however slow the machine.
    let (consumer, shop, parking) = consumer_with(
        ConsumerOptions::default()
            .max_deliveries(1)
            .batch(1, Duration::ZERO)
            .release_interval(Duration::from_secs(3600)),
    );
    let broker = Broker::default();
    broker.publish(event("o-2", "order-1", 2));
    assert!(matches!(
        drain(&consumer, &broker).await[..],
        [Ok(Settled::Parked { .. })]
    ));
    let gaps = shop.gaps();
    let (running, leave) = run_with_the_first_ack_held(&consumer, &broker, 3).await;
    // Room for the third version to be handled, were it let go now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(shop.effects().await, ["order-1@1"]);
    leave.notify_one();
    idem_conformance::relays::wait_until("the third version applied", || async {
        shop.effects().await.len() == 3
    })
    .await;
    assert_eq!(
        shop.effects().await,
        ["order-1@1", "order-1@2", "order-1@3"]
    );
    assert_eq!(shop.gaps(), gaps, "no version found a gap");
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
    running.abort();
}

/// A delivery that outlasts the shutdown grace does not keep `run` from
/// returning; it still finishes in its task.
#[tokio::test]
async fn shutdown_returns_after_its_grace_and_the_delivery_finishes_in_its_task() {
    let (consumer, shop, _) = consumer_with(
        ConsumerOptions::default()
            .max_deliveries(4)
            .shutdown_grace(Duration::from_millis(100)),
    );
    let broker = Broker::default();
    let (running, go) = stopped_while_handling(&consumer, &shop, &broker).await;
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("run returned after its grace")
        .unwrap()
        .unwrap();
    assert!(broker.settled().is_empty(), "the delivery is still held");
    go.notify_one();
    assert_eq!(settled(&broker, 1).await, [BrokerSaw::Acked("m-1".into())]);
    assert_eq!(shop.effects().await, ["one"]);
}

/// With four deliveries in flight, the task running the consumer is
/// aborted while three are inside their handlers: each still commits
/// whole and is acknowledged once.
#[tokio::test]
async fn aborting_run_with_deliveries_in_flight_lets_each_commit_and_settle() {
    // One delivery a batch, so that the three are in their handlers at once.
    let options = ConsumerOptions::default()
        .max_deliveries(4)
        .concurrency(4)
        .batch(1, Duration::ZERO);
    let (consumer, shop, _) = consumer_with(options);
    let broker = Broker::default();
    broker.redeliver_unsettled();
    let ids = ["m-1", "m-2", "m-3"];
    let gates: Vec<_> = ids.iter().map(|id| shop.hold(id)).collect();
    for id in ids {
        broker.publish(plain(id, id));
    }
    let running = run_in_task(&consumer, &broker, std::future::pending());
    for (entered, _) in &gates {
        tokio::time::timeout(Duration::from_secs(30), entered.notified())
            .await
            .expect("every delivery reached its handler at once");
    }
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    for (_, go) in &gates {
        go.notify_one();
    }
    let mut acked = settled(&broker, 3).await;
    acked.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(
        acked,
        ids.map(|id| BrokerSaw::Acked(id.into())),
        "each delivery acknowledged once"
    );
    let mut effects = shop.effects().await;
    effects.sort();
    assert_eq!(effects, ids);
    assert!(broker.deliver().is_none(), "nothing left to deliver again");
}

#[test]
fn a_concurrency_of_none_or_past_the_most_is_refused() {
    for concurrency in [0, ConsumerOptions::MAX_CONCURRENCY + 1] {
        let refused = Consumer::with_options(
            "orders",
            Arc::new(idem_memory::MemoryStore::new()),
            Arc::new(MemoryParking::new()),
            common::Shop::new(idem_memory::MemoryStore::new()),
            ConsumerOptions::default().concurrency(concurrency),
        );
        assert!(refused.is_err(), "{concurrency} was taken");
    }
}

#[tokio::test]
async fn a_gap_parked_while_its_predecessor_is_released_is_released_too() {
    consumers::a_gap_parked_while_its_predecessor_is_released_is_released_too(&MemoryBackend).await;
}

#[tokio::test]
async fn a_stuck_aggregate_is_listed_and_released() {
    consumers::a_stuck_aggregate_is_listed_and_released(&MemoryBackend).await;
}

/// A message whose copies the broker delivered and no consumer settled
/// (dropped unsettled, as with a consumer that died) parks at the
/// consumer's own count of failed attempts: the broker's count, which
/// counts the dropped copies, would have parked it at its third delivery.
#[tokio::test]
async fn copies_no_consumer_settled_do_not_count_toward_parking() {
    let (consumer, shop, parking) = consumer_with(
        ConsumerOptions::default()
            .max_deliveries(3)
            .backoff(FIRST, Duration::from_secs(1)),
    );
    let broker = Broker::default();
    broker.redeliver_unsettled();
    shop.fail("m-1", 2);
    broker.publish(plain("m-1", "order 1 placed"));
    let first = broker.deliver().unwrap();
    assert!(matches!(
        consumer.consume(&first).await.unwrap(),
        Settled::Retried { .. }
    ));
    drop(first);
    for _ in 0..3 {
        drop(broker.deliver().unwrap());
    }
    let fifth = broker.deliver().unwrap();
    assert_eq!(fifth.deliveries(), 5);
    assert!(matches!(
        consumer.consume(&fifth).await.unwrap(),
        Settled::Retried { .. }
    ));
    drop(fifth);
    assert_eq!(drain(&consumer, &broker).await, [Ok(Settled::Applied)]);
    assert_eq!(shop.effects().await, ["order 1 placed"]);
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
}

/// `run`'s sweep releases an aggregate whose missing version applied with
/// no release (by hand here; a consumer that died between its commit and
/// its release in life).
#[tokio::test]
async fn runs_sweep_releases_a_stuck_aggregate() {
    let (consumer, shop, _) = consumer_with(
        ConsumerOptions::default()
            .max_deliveries(1)
            .release_interval(Duration::from_millis(50)),
    );
    let broker = Broker::default();
    broker.publish(event("e-2", "order-1", 2));
    assert!(matches!(
        drain(&consumer, &broker).await[..],
        [Ok(Settled::Parked { .. })]
    ));
    assert_eq!(consumer.stuck(10).await.unwrap().len(), 1);
    let mut tx = shop.books.begin().await.unwrap();
    shop.books
        .apply(&mut tx, "order-1@1", Some(("order-1", 1)))
        .await
        .unwrap();
    idem_core::store::Transaction::commit(tx).await.unwrap();
    let mut source = TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(1)),
    };
    let running = tokio::spawn({
        let consumer = consumer.clone();
        async move { consumer.run(&mut source, std::future::pending()).await }
    });
    idem_conformance::relays::wait_until("the sweep released order-1", || async {
        shop.effects().await.len() == 2
    })
    .await;
    running.abort();
    assert_eq!(shop.effects().await, ["order-1@1", "order-1@2"]);
    assert!(consumer.stuck(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_gap_parked_after_its_predecessors_release_releases_itself() {
    consumers::a_gap_parked_after_its_predecessors_release_releases_itself(&MemoryBackend).await;
}

#[tokio::test]
async fn a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself() {
    consumers::a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself(
        &MemoryBackend,
    )
    .await;
}

#[tokio::test]
async fn a_duplicate_releases_what_its_first_apply_did_not() {
    consumers::a_duplicate_releases_what_its_first_apply_did_not(&MemoryBackend).await;
}
