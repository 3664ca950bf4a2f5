//! An in-process broker, for the consumer's rules on the memory stores
//! (the shop is the conformance crate's).

#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use idem_conformance::consumers::Shop;
use idem_consumer::{BrokerError, Delivery, RedeliveryHorizon, Source, async_trait};
use idem_core::store::{Clock, InboundMessage, SystemClock, Timestamp};
use tokio::sync::Notify;

/// One delivery of the in-process broker.
pub struct TestDelivery {
    message: InboundMessage,
    deliveries: u32,
    broker: Broker,
    settled: std::sync::atomic::AtomicBool,
}

impl Drop for TestDelivery {
    /// A delivery dropped unsettled goes back to the queue, as a broker
    /// requeues what a closed channel held, if the broker was told so.
    fn drop(&mut self) {
        let unsettled = !self.settled.load(std::sync::atomic::Ordering::SeqCst);
        if unsettled && self.broker.queue.lock().unwrap().redeliver_unsettled {
            self.broker.again(self.message.clone(), self.deliveries);
        }
    }
}

/// What the broker saw of a delivery's settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerSaw {
    Acked(String),
    Retried(String, Duration),
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<(InboundMessage, u32)>,
    settled: Vec<BrokerSaw>,
    /// Ids whose next ack is lost (the consumer dies before it reaches the broker).
    lose_ack: Vec<String>,
    closed: bool,
    /// Deliveries dropped unsettled are delivered again.
    redeliver_unsettled: bool,
    /// Ids whose next ack waits: told when it is sent, then for leave.
    held_acks: Vec<(String, Arc<Notify>, Arc<Notify>)>,
}

/// An in-process broker: a queue, redelivery on retry or on a lost ack.
#[derive(Clone, Default)]
pub struct Broker {
    queue: Arc<Mutex<Queue>>,
    ready: Arc<Notify>,
}

impl Broker {
    pub fn publish(&self, message: InboundMessage) {
        self.queue.lock().unwrap().ready.push_back((message, 1));
        self.ready.notify_one();
    }

    /// The next delivery, if one is ready.
    pub fn deliver(&self) -> Option<TestDelivery> {
        let (message, deliveries) = self.queue.lock().unwrap().ready.pop_front()?;
        Some(TestDelivery {
            message,
            deliveries,
            broker: self.clone(),
            settled: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// From now on a delivery dropped unsettled is delivered again.
    pub fn redeliver_unsettled(&self) {
        self.queue.lock().unwrap().redeliver_unsettled = true;
    }

    /// The next ack of `id` waits, once it is sent, until the second
    /// notify is told; the first is told when it is sent.
    pub fn hold_next_ack(&self, id: &str) -> (Arc<Notify>, Arc<Notify>) {
        let (sent, leave) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        self.queue
            .lock()
            .unwrap()
            .held_acks
            .push((id.to_string(), sent.clone(), leave.clone()));
        (sent, leave)
    }

    /// The next ack of `id` never reaches the broker, which delivers it again.
    pub fn lose_next_ack(&self, id: &str) {
        self.queue.lock().unwrap().lose_ack.push(id.to_string());
    }

    pub fn settled(&self) -> Vec<BrokerSaw> {
        self.queue.lock().unwrap().settled.clone()
    }

    pub fn close(&self) {
        self.queue.lock().unwrap().closed = true;
        self.ready.notify_one();
    }

    fn again(&self, message: InboundMessage, deliveries: u32) {
        self.queue
            .lock()
            .unwrap()
            .ready
            .push_back((message, deliveries + 1));
        self.ready.notify_one();
    }
}

#[async_trait]
impl Delivery for TestDelivery {
    fn message(&self) -> &InboundMessage {
        &self.message
    }

    fn deliveries(&self) -> u32 {
        self.deliveries
    }

    fn published_at(&self) -> Option<Timestamp> {
        Some(SystemClock.now())
    }

    async fn ack(&self) -> Result<(), BrokerError> {
        self.settled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let id = self.message.id().as_str().to_string();
        let held = {
            let mut queue = self.broker.queue.lock().unwrap();
            let at = queue.held_acks.iter().position(|(held, ..)| *held == id);
            at.map(|at| queue.held_acks.remove(at))
        };
        if let Some((_, sent, leave)) = held {
            sent.notify_one();
            leave.notified().await;
        }
        let lost = {
            let mut queue = self.broker.queue.lock().unwrap();
            let lost = queue.lose_ack.iter().position(|l| *l == id);
            if let Some(at) = lost {
                queue.lose_ack.remove(at);
            } else {
                queue.settled.push(BrokerSaw::Acked(id));
            }
            lost.is_some()
        };
        if lost {
            self.broker.again(self.message.clone(), self.deliveries);
            return Err(BrokerError::unavailable(
                "test",
                "ack",
                "the connection died",
            ));
        }
        Ok(())
    }

    async fn retry(&self, delay: Duration) -> Result<(), BrokerError> {
        self.settled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let id = self.message.id().as_str().to_string();
        self.broker
            .queue
            .lock()
            .unwrap()
            .settled
            .push(BrokerSaw::Retried(id, delay));
        self.broker.again(self.message.clone(), self.deliveries);
        Ok(())
    }
}

/// The broker as a source, with a horizon of the test's choosing.
pub struct TestSource {
    pub broker: Broker,
    pub horizon: RedeliveryHorizon,
}

#[async_trait]
impl Source for TestSource {
    type Delivery = TestDelivery;

    async fn next(&mut self) -> Result<Option<TestDelivery>, BrokerError> {
        loop {
            if let Some(delivery) = self.broker.deliver() {
                return Ok(Some(delivery));
            }
            if self.broker.queue.lock().unwrap().closed {
                return Ok(None);
            }
            self.broker.ready.notified().await;
        }
    }

    fn horizon(&self) -> RedeliveryHorizon {
        self.horizon.clone()
    }
}

/// A source whose first receives fail with `errors`, in order (a broker
/// connection lost and found again), then the broker's deliveries.
pub struct Interrupted {
    pub source: TestSource,
    pub errors: VecDeque<BrokerError>,
    /// Receives asked of it, failed ones included.
    pub asked: usize,
}

#[async_trait]
impl Source for Interrupted {
    type Delivery = TestDelivery;

    async fn next(&mut self) -> Result<Option<TestDelivery>, BrokerError> {
        self.asked += 1;
        match self.errors.pop_front() {
            Some(error) => Err(error),
            None => self.source.next().await,
        }
    }

    fn horizon(&self) -> RedeliveryHorizon {
        self.source.horizon()
    }
}

/// A message of `aggregate` at `version`, its payload its effect.
pub fn event(id: &str, aggregate: &str, version: u64) -> InboundMessage {
    InboundMessage::new(
        id,
        "order.changed",
        format!("{aggregate}@{version}").into_bytes(),
    )
    .and_then(|m| m.with_aggregate(aggregate, Some(version)))
    .unwrap()
}

/// A message without a version.
pub fn plain(id: &str, payload: &str) -> InboundMessage {
    InboundMessage::new(id, "order.placed", payload.as_bytes().to_vec()).unwrap()
}

/// The deliveries of `messages`, each delivered once by a broker of its
/// own: a batch to consume.
pub fn deliveries(messages: Vec<InboundMessage>) -> Vec<TestDelivery> {
    let broker = Broker::default();
    for message in messages {
        broker.publish(message);
    }
    std::iter::from_fn(|| broker.deliver()).collect()
}

/// What a batch's deliveries came to, each of which must have settled.
pub fn outcomes(
    settled: Vec<Result<idem_consumer::Settled, idem_consumer::ConsumerError>>,
) -> Vec<idem_consumer::Settled> {
    settled.into_iter().map(Result::unwrap).collect()
}
