//! The whole path on real servers: a Postgres outbox, four relays at once,
//! NATS JetStream. Every message arrives once, each aggregate's in sequence.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use idem_core::store::{NewMessage, OutboxStore};
use idem_nats::{JetStreamOptions, JetStreamPublisher};
use idem_outbox::{Relay, RelayOptions};
use idem_postgres::{PostgresOutbox, PostgresOutboxOptions};
use tokio::time::Instant;

const AGGREGATES: usize = 100;
const PER_AGGREGATE: usize = 100;

fn env_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/test sets it)"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_publish_ten_thousand_messages_once_each_in_order_per_aggregate() {
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let pool = idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&env_var("IDEM_POSTGRES_URL"))
        .await
        .unwrap();
    let outbox = Arc::new(
        PostgresOutbox::with_options(
            pool,
            PostgresOutboxOptions::default().table(&format!("ob_e2e_{run}")),
        )
        .unwrap(),
    );
    outbox.migrate().await.unwrap();
    let context = jetstream::new(async_nats::connect(env_var("IDEM_NATS_URL")).await.unwrap());
    let (stream, prefix) = (format!("IDEM_E2E_{run}"), format!("idem-e2e-{run}"));
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: jetstream::stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    // Enqueued in rounds, so every aggregate has a long queue.
    for n in 1..=PER_AGGREGATE {
        for a in 0..AGGREGATES {
            let message =
                NewMessage::new(&format!("order-{a}"), "event", n.to_string().into_bytes())
                    .unwrap();
            outbox.enqueue(&message).await.unwrap();
        }
    }
    let publisher = Arc::new(JetStreamPublisher::new(
        context.clone(),
        JetStreamOptions::new(&prefix).unwrap(),
    ));
    let options = RelayOptions::default()
        .with_poll_interval(Duration::from_millis(50))
        .unwrap();
    let (stop, _) = tokio::sync::watch::channel(false);
    let relays: Vec<_> = (0..4)
        .map(|_| {
            let relay = Relay::new(outbox.clone(), publisher.clone(), options);
            let mut stopped = stop.subscribe();
            tokio::spawn(async move {
                relay
                    .run(async move {
                        let _ = stopped.wait_for(|stop| *stop).await;
                    })
                    .await;
            })
        })
        .collect();
    let total = AGGREGATES * PER_AGGREGATE;
    let deadline = Instant::now() + Duration::from_secs(300);
    while outbox.stats().await.unwrap().pending > 0 {
        assert!(Instant::now() < deadline, "the backlog did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.send_replace(true);
    for relay in relays {
        relay.await.unwrap();
    }
    // Read the stream back: once each, in sequence within each aggregate.
    let consumer = context
        .get_stream(&stream)
        .await
        .unwrap()
        .create_consumer(pull::Config {
            deliver_policy: jetstream::consumer::DeliverPolicy::All,
            ack_policy: jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut seen = HashSet::new();
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    use futures_util::StreamExt;
    while seen.len() < total {
        let next = tokio::time::timeout_at(deadline, messages.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {total} arrived", seen.len()))
            .unwrap()
            .unwrap();
        let headers = next.headers.as_ref().unwrap();
        let id = headers.get("Nats-Msg-Id").unwrap().as_str().to_string();
        assert!(seen.insert(id.clone()), "{id} arrived twice");
        let aggregate = headers.get(idem_nats::AGGREGATE_HEADER).unwrap().as_str();
        let sequence: u64 = headers
            .get(idem_nats::SEQUENCE_HEADER)
            .unwrap()
            .as_str()
            .parse()
            .unwrap();
        order
            .entry(aggregate.to_string())
            .or_default()
            .push(sequence);
    }
    assert_eq!(order.len(), AGGREGATES);
    for (aggregate, sequences) in order {
        let expected: Vec<u64> = (1..=PER_AGGREGATE as u64).collect();
        assert_eq!(
            sequences, expected,
            "{aggregate} out of order at the broker"
        );
    }
    let stored = context
        .get_stream(&stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(stored, total as u64, "a message stored twice");
    context.delete_stream(&stream).await.unwrap();
}
