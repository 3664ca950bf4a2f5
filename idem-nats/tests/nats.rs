//! JetStreamPublisher on the real server: PubAcks, duplicates, the relay
//! end to end (order per aggregate across four relays, a crash between
//! confirm and cursor move, a poison message, the server cut off and back).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::outbox::{
    HoldAfterPublish, LEASE, PATIENCE, Refusing, Running, check_order, drained, fill, logged,
    partitioned, relay_options, sharing_options, wait_until,
};
use common::{TestStream, header, summary};
use idem_conformance::faults::FaultProxy;
use idem_core::ManualClock;
use idem_core::store::{NewMessage, OutboxStore, Timestamp};
use idem_memory::MemoryOutbox;
use idem_nats::{JetStreamOptions, JetStreamPublisher};
use idem_outbox::{Published, Publisher, Relay};

async fn publisher(stream: &TestStream) -> JetStreamPublisher {
    JetStreamPublisher::connect(
        &common::url(),
        JetStreamOptions::new(&stream.prefix).unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_acknowledged_and_consumed_with_its_id_headers_and_payload() {
    let stream = TestStream::new().await;
    let publisher = publisher(&stream).await;
    let outbox = MemoryOutbox::new();
    for n in 0..5 {
        let message = NewMessage::new(
            &format!("order-{n}"),
            "order.placed",
            format!("{{\"n\":{n}}}").into_bytes(),
        )
        .unwrap()
        .with_header("content-type", "application/json")
        .unwrap()
        .with_header("tag", "first")
        .unwrap()
        .with_header("tag", "second")
        .unwrap();
        outbox.enqueue(&message).await.unwrap();
    }
    let batch = logged(&outbox).await;
    assert_eq!(batch.len(), 5);

    let results = publisher.publish(&batch).await;
    assert_eq!(results, vec![Ok(Published::stored()); 5]);

    let messages = stream.read(5, Duration::from_millis(300)).await;
    assert_eq!(messages.len(), 5, "each message once");
    for message in &batch {
        let id = message.id().to_string();
        let got = messages
            .iter()
            .find(|m| header(m, "Nats-Msg-Id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} stored"));
        assert_eq!(got.payload.as_ref(), message.message().payload());
        assert_eq!(
            got.subject.as_str(),
            format!("{}.order.placed", stream.prefix)
        );
        assert_eq!(header(got, "content-type"), Some("application/json"));
        let tags: Vec<&str> = got
            .headers
            .as_ref()
            .unwrap()
            .get_all("tag")
            .map(|v| v.as_str())
            .collect();
        assert_eq!(tags, ["first", "second"]);
        assert_eq!(
            header(got, idem_nats::AGGREGATE_HEADER),
            Some(message.message().aggregate())
        );
        assert_eq!(header(got, idem_nats::SEQUENCE_HEADER), Some("1"));
    }
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_publish_of_one_id_is_dropped_and_reported_duplicate() {
    let stream = TestStream::new().await;
    let publisher = publisher(&stream).await;
    let outbox = MemoryOutbox::new();
    fill(&outbox, "dup", "order.placed", 3, 1).await;
    let batch = logged(&outbox).await;
    assert_eq!(
        publisher.publish(&batch).await,
        vec![Ok(Published::stored()); 3]
    );
    assert_eq!(
        publisher.publish(&batch).await,
        vec![Ok(Published::duplicate()); 3]
    );
    assert_eq!(stream.stored().await, 3);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_no_stream_stores_is_an_error() {
    let stream = TestStream::new().await;
    let elsewhere = JetStreamPublisher::connect(
        &common::url(),
        JetStreamOptions::new(&format!("{}-nowhere", stream.prefix))
            .unwrap()
            .with_timeout(Duration::from_secs(5))
            .unwrap(),
    )
    .await
    .unwrap();
    let outbox = MemoryOutbox::new();
    fill(&outbox, "lost", "order.placed", 1, 1).await;
    let batch = logged(&outbox).await;
    let results = elsewhere.publish(&batch).await;
    let error = results[0].as_ref().expect_err("no stream: an error");
    assert_eq!(error.broker, "nats");
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_sharing_eight_partitions_publish_every_message_once_in_order() {
    let stream = TestStream::new().await;
    let outbox = Arc::new(partitioned());
    let enqueued = fill(&*outbox, "agg", "order.changed", 100, 100).await;
    let first: Arc<dyn Publisher> = Arc::new(publisher(&stream).await);
    let second: Arc<dyn Publisher> = Arc::new(publisher(&stream).await);
    let relays = Running::start(
        &outbox,
        vec![first.clone(), second.clone(), first, second],
        sharing_options(),
    );
    drained(&*outbox).await;
    relays.stop().await;
    let messages = stream
        .read(enqueued.len(), Duration::from_millis(500))
        .await;
    let copies = check_order(&enqueued, &summary(&messages));
    assert!(copies.values().all(|&n| n == 1), "nothing twice");
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_confirm_and_cursor_move_leaves_one_copy_in_the_stream() {
    let stream = TestStream::new().await;
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_700_000_000_000));
    let outbox = Arc::new(MemoryOutbox::with_clock(clock.clone()));
    let enqueued = fill(&*outbox, "crash", "order.changed", 10, 1).await;
    let stalling = Arc::new(HoldAfterPublish::new(publisher(&stream).await));
    let first: Relay<MemoryOutbox, HoldAfterPublish<JetStreamPublisher>> =
        Relay::new(Arc::clone(&outbox), Arc::clone(&stalling), relay_options());
    let second = Relay::new(
        Arc::clone(&outbox),
        Arc::new(publisher(&stream).await),
        relay_options(),
    );

    let stalled = tokio::spawn(async move { first.relay_once().await.unwrap() });
    tokio::time::timeout(PATIENCE, stalling.published.notified())
        .await
        .expect("the first relay published");
    clock.advance(LEASE + Duration::from_secs(1));
    let took_over = second.relay_once().await.unwrap();
    assert_eq!((took_over.published, took_over.duplicates), (10, 10));
    stalling.release.notify_one();
    let crashed = stalled.await.unwrap();
    assert_eq!((crashed.published, crashed.lost), (0, 10));

    assert_eq!(stream.stored().await, 10);
    let messages = stream.read(10, Duration::from_millis(500)).await;
    let copies = check_order(&enqueued, &summary(&messages));
    assert!(copies.values().all(|&n| n == 1), "deduplicated: {copies:?}");
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_parks_its_aggregate_while_the_others_flow() {
    let stream = TestStream::new().await;
    let outbox = Arc::new(MemoryOutbox::new());
    let enqueued = fill(&*outbox, "poison", "order.changed", 10, 20).await;
    let refusing: Arc<dyn Publisher> = Arc::new(Refusing {
        inner: publisher(&stream).await,
        aggregate: "poison-3".to_string(),
    });
    let options = relay_options()
        .with_retries(3, Duration::from_millis(10), Duration::from_millis(20))
        .unwrap();
    let relays = Running::start(&outbox, vec![refusing.clone(), refusing], options);
    wait_until("the others drained and the poison parked", || async {
        let stats = outbox.stats().await.unwrap();
        stats.parked == 1 && stats.pending == 19
    })
    .await;
    relays.stop().await;
    let parked = outbox.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].message().aggregate(), "poison-3");
    assert_eq!(parked[0].parts().sequence, 1);

    let flowing: Vec<_> = enqueued
        .iter()
        .filter(|m| m.message().aggregate() != "poison-3")
        .cloned()
        .collect();
    let messages = stream.read(flowing.len(), Duration::from_millis(500)).await;
    let copies = check_order(&flowing, &summary(&messages));
    assert!(copies.values().all(|&n| n == 1));
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_cut_off_for_two_seconds_then_back_loses_nothing() {
    let stream = TestStream::new().await;
    let proxy = FaultProxy::start(common::address()).await;
    let options = JetStreamOptions::new(&stream.prefix)
        .unwrap()
        .with_timeout(Duration::from_secs(2))
        .unwrap();
    let through_proxy: Arc<dyn Publisher> = Arc::new(
        JetStreamPublisher::connect(&common::url_via(&proxy.address()), options)
            .await
            .unwrap(),
    );
    let outbox = Arc::new(MemoryOutbox::new());
    let enqueued = fill(&*outbox, "cut", "order.changed", 20, 100).await;
    let relays = Running::start(
        &outbox,
        vec![through_proxy.clone(), through_proxy],
        relay_options(),
    );
    wait_until("some messages are out", || async {
        outbox.stats().await.unwrap().pending < 2_000 - 100
    })
    .await;
    proxy.stall();
    proxy.cut_all();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stranded = outbox.stats().await.unwrap().pending;
    assert!(stranded > 0, "the cut came while a backlog was left");
    proxy.resume();
    drained(&*outbox).await;
    relays.stop().await;

    // JetStream dropped every copy a lost PubAck made.
    assert_eq!(stream.stored().await, 2_000);
    let messages = stream
        .read(enqueued.len(), Duration::from_millis(500))
        .await;
    let copies = check_order(&enqueued, &summary(&messages));
    assert!(copies.values().all(|&n| n == 1));
    stream.delete().await;
}
