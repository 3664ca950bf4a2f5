//! Stuck items made through the store traits alone, as the parts get stuck
//! in a service: a completed record, parked outbox messages, a consumer's
//! parked messages, journal operations whose outcome is unknown or that
//! need review. Shared by the console's tests, its example and the command
//! line's tests (by path), so each is made one way.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use idem_core::store::{
    Acquired, Advance, Finish, IdempotencyStore, InboundMessage, JournalStore, MessageState,
    NewMessage, NewOperation, NewParked, OperationId, OperationKey, OperationState, OutboxStore,
    OwnerToken, ParkingStore, PublishFailure,
};
use idem_core::{ConsumerName, Fingerprint, Idempotency, Scope, StoredResponse, Tenant};

/// A completed record of `key` in `tenant`, its response `body`.
pub async fn completed_record<S: IdempotencyStore + ?Sized>(
    idem: &Idempotency<S>,
    tenant: &str,
    key: &str,
    body: &str,
) {
    let scope = Scope::parse(tenant, key).unwrap();
    let body = body.to_string();
    idem.run(scope, Fingerprint::json("{}").unwrap(), |_| async move {
        Ok(StoredResponse::new(201, body))
    })
    .await
    .unwrap();
}

/// Enqueues one message of each of `aggregates` and parks them all, as a
/// relay does at the last failed publish; the messages, in order.
pub async fn parked_outbox(
    outbox: &dyn OutboxStore,
    aggregates: &[&str],
) -> Vec<idem_core::store::MessageId> {
    let mut ids = Vec::new();
    let mut stored = Vec::new();
    for aggregate in aggregates {
        let message = NewMessage::new(
            aggregate,
            "order.placed",
            format!("{{\"order\":\"{aggregate}\"}}").into_bytes(),
        )
        .unwrap();
        let enqueued = outbox.enqueue(&message).await.unwrap();
        ids.push(enqueued.id());
        stored.push((enqueued.id(), enqueued.parts().partition));
    }
    // A relay holding every partition counts each one's failure, the
    // last: out of the log and parked, whatever else the log holds.
    let owner = OwnerToken::generate();
    let mut leases = Vec::new();
    while let Some(lease) = outbox
        .acquire(owner, Duration::from_secs(60))
        .await
        .unwrap()
    {
        leases.push(lease);
    }
    for lease in &leases {
        let mut settled = Advance::default();
        for (id, partition) in &stored {
            if *partition == lease.partition() {
                settled = settled.failed(
                    PublishFailure::new(*id, 0, "broker refused: no route").max_attempts(1),
                );
            }
        }
        outbox.advance(lease, &settled).await.unwrap();
        outbox.release(lease).await.unwrap();
    }
    for id in &ids {
        assert_eq!(outbox_state(outbox, *id).await.0, MessageState::Parked);
    }
    ids
}

/// One pending message of `aggregate`.
pub async fn pending_outbox(
    outbox: &dyn OutboxStore,
    aggregate: &str,
) -> idem_core::store::MessageId {
    let message = NewMessage::new(aggregate, "order.paid", b"{}".to_vec()).unwrap();
    outbox.enqueue(&message).await.unwrap().id()
}

/// The state and last error of an outbox message.
pub async fn outbox_state(
    outbox: &dyn OutboxStore,
    id: idem_core::store::MessageId,
) -> (MessageState, Option<String>) {
    let message = outbox
        .message(id)
        .await
        .unwrap()
        .expect("the message is stored");
    (message.state(), message.parts().last_error.clone())
}

/// Parks the message `id` (of `aggregate`, with `payload`) for `consumer`.
pub async fn parked_message(
    parking: &dyn ParkingStore,
    consumer: &str,
    id: &str,
    aggregate: &str,
    payload: &str,
) {
    let message = InboundMessage::new(id, "order.placed", payload.as_bytes().to_vec())
        .unwrap()
        .with_aggregate(aggregate, None)
        .unwrap();
    let parked = NewParked {
        consumer: ConsumerName::new(consumer).unwrap(),
        message,
        reason: "no carrier ships a lost order".into(),
        deliveries: 5,
    };
    parking.park(&parked).await.unwrap();
}

/// A version gap parked by `consumer` as the consumer parks one: `id`, the
/// event of `aggregate` at `version`, found the aggregate at `at`.
pub async fn parked_gap(
    parking: &dyn ParkingStore,
    consumer: &str,
    id: &str,
    aggregate: &str,
    (at, version): (u64, u64),
) {
    let message = InboundMessage::new(id, "order.changed", b"late".to_vec())
        .unwrap()
        .with_aggregate(aggregate, Some(version))
        .unwrap();
    let parked = NewParked {
        consumer: ConsumerName::new(consumer).unwrap(),
        message,
        reason: format!("version gap: the aggregate is at {at}, the event at {version}"),
        deliveries: 5,
    };
    parking.park(&parked).await.unwrap();
}

/// The operation `subject`/`charge` of `namespace`, recorded and left in
/// `state` with `detail`, as an executor leaves it.
pub async fn operation(
    journal: &dyn JournalStore,
    namespace: &str,
    subject: &str,
    state: OperationState,
    detail: &str,
) -> OperationKey {
    let key = OperationKey::new(
        Tenant::new(namespace).unwrap(),
        OperationId::new(subject, "charge").unwrap(),
    );
    let new = NewOperation::new(key.clone(), serde_json::json!({"amount": 5990}));
    journal.record(&new).await.unwrap();
    if state != OperationState::Pending {
        let owner = OwnerToken::generate();
        let held = journal
            .acquire(key.held_by(owner), Duration::from_secs(30))
            .await
            .unwrap();
        assert!(matches!(held, Acquired::Held { .. }), "{held:?}");
        let finish = Finish::new(state, Some(detail.to_string()));
        journal.finish(key.held_by(owner), &finish).await.unwrap();
    }
    key
}
