//! An in-process broker and a shop whose writes and inbox records commit
//! together, for the consumer's rules on the memory stores.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_consumer::{
    BrokerError, Delivery, Handled, Handler, RedeliveryHorizon, Source, async_trait,
};
use idem_core::store::{
    Clock, IdempotencyStore, InboundMessage, Lease, SystemClock, Timestamp, Transaction,
    VersionCheck,
};
use idem_core::{Checkpoint, HandlerError, StoreError, StoredResponse};
use idem_memory::MemoryStore;
use tokio::sync::Notify;

/// What the shop committed: one effect per applied message, and each
/// aggregate's version.
#[derive(Debug, Default)]
pub struct Domain {
    pub effects: Vec<String>,
    pub versions: HashMap<String, u64>,
}

/// The shop's transaction: its writes and the inbox completion, applied
/// together at commit under the domain's lock.
pub struct Ledger {
    store: MemoryStore,
    domain: Arc<tokio::sync::Mutex<Domain>>,
    effect: Option<(String, Option<(String, u64)>)>,
    completion: Option<(Lease, StoredResponse)>,
}

#[async_trait]
impl Transaction for Ledger {
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        self.completion = Some((lease.clone(), response.clone()));
        Ok(())
    }

    async fn checkpoint(&mut self, _: &Lease, _: &Checkpoint) -> Result<(), StoreError> {
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
        let mut domain = self.domain.lock().await;
        if let Some((lease, response)) = &self.completion {
            self.store.complete(lease, response).await?;
        }
        if let Some((effect, version)) = self.effect {
            domain.effects.push(effect);
            if let Some((aggregate, version)) = version {
                domain.versions.insert(aggregate, version);
            }
        }
        Ok(())
    }
}

/// A held handler's gates: it notifies the first on entry, waits for the second.
pub type Gates = (Arc<Notify>, Arc<Notify>);

/// Applies each message as one effect, checking versions; fails a message
/// as many times as asked; can hold a message until released.
#[derive(Clone)]
pub struct Shop {
    pub store: MemoryStore,
    pub domain: Arc<tokio::sync::Mutex<Domain>>,
    pub failures: Arc<Mutex<HashMap<String, u32>>>,
    pub hold: Arc<Mutex<Option<Gates>>>,
}

impl Shop {
    pub fn new(store: MemoryStore) -> Self {
        Self {
            store,
            domain: Arc::default(),
            failures: Arc::default(),
            hold: Arc::default(),
        }
    }

    /// Fails the message `id` the next `times` times.
    pub fn fail(&self, id: &str, times: u32) {
        self.failures.lock().unwrap().insert(id.to_string(), times);
    }

    /// Holds the next handled message: `entered` is notified when it is
    /// inside the handler, which then waits for `go`.
    pub fn hold_next(&self) -> (Arc<Notify>, Arc<Notify>) {
        let gates = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        *self.hold.lock().unwrap() = Some(gates.clone());
        gates
    }

    pub async fn effects(&self) -> Vec<String> {
        self.domain.lock().await.effects.clone()
    }
}

#[async_trait]
impl Handler for Shop {
    type Tx = Ledger;

    async fn begin(&self) -> Result<Ledger, StoreError> {
        Ok(Ledger {
            store: self.store.clone(),
            domain: self.domain.clone(),
            effect: None,
            completion: None,
        })
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: Ledger,
    ) -> Result<(Ledger, Handled), HandlerError> {
        let gates = self.hold.lock().unwrap().take();
        if let Some((entered, go)) = gates {
            entered.notify_one();
            go.notified().await;
        }
        let id = message.id().as_str().to_string();
        {
            let mut failures = self.failures.lock().unwrap();
            if let Some(left) = failures.get_mut(&id).filter(|left| **left > 0) {
                *left -= 1;
                return Err(HandlerError::from(format!("{id} is refused")));
            }
        }
        let mut version = None;
        if let (Some(aggregate), Some(event)) = (message.aggregate(), message.version()) {
            let current = self
                .domain
                .lock()
                .await
                .versions
                .get(aggregate)
                .copied()
                .unwrap_or(0);
            let check = VersionCheck::of(event, current);
            if check != VersionCheck::Apply {
                return Ok((tx, check.into()));
            }
            version = Some((aggregate.to_string(), event));
        }
        let effect = String::from_utf8_lossy(message.payload()).into_owned();
        tx.effect = Some((effect, version));
        Ok((tx, Handled::Applied))
    }
}

/// One delivery of the in-process broker.
pub struct TestDelivery {
    message: InboundMessage,
    deliveries: u32,
    broker: Broker,
}

/// What the broker saw of a delivery's settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    Acked(String),
    Retried(String, Duration),
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<(InboundMessage, u32)>,
    settled: Vec<Settled>,
    /// Ids whose next ack is lost (the consumer dies before it reaches the broker).
    lose_ack: Vec<String>,
    closed: bool,
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
        })
    }

    /// The next ack of `id` never reaches the broker, which delivers it again.
    pub fn lose_next_ack(&self, id: &str) {
        self.queue.lock().unwrap().lose_ack.push(id.to_string());
    }

    pub fn settled(&self) -> Vec<Settled> {
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
        let id = self.message.id().as_str().to_string();
        let lost = {
            let mut queue = self.broker.queue.lock().unwrap();
            let lost = queue.lose_ack.iter().position(|l| *l == id);
            if let Some(at) = lost {
                queue.lose_ack.remove(at);
            } else {
                queue.settled.push(Settled::Acked(id));
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
        let id = self.message.id().as_str().to_string();
        self.broker
            .queue
            .lock()
            .unwrap()
            .settled
            .push(Settled::Retried(id, delay));
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
