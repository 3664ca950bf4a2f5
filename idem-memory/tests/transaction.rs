//! `MemoryTransaction` beyond the batch suite: the caller's writes
//! (`on_commit`) commit with the records or not at all, and a completion of
//! a lease claimed outside the transaction is fenced.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, Lease, Timestamp, Transaction,
};
use idem_core::{Fingerprint, ManualClock, Scope, StoreError, StoredResponse};
use idem_memory::{MemoryOptions, MemoryStore, MemoryTransaction};

fn request(key: &str) -> ClaimRequest {
    ClaimRequest::new(
        Scope::parse("tx", key).unwrap(),
        Fingerprint::of_bytes(b"x"),
    )
    .with_lease(Duration::from_secs(10))
    .unwrap()
}

async fn claimed(tx: &mut MemoryTransaction, key: &str) -> Lease {
    match tx.claim(&request(key)).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("expected a claim of {key}, got {other:?}"),
    }
}

/// A log the caller's writes append to.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<&'static str>>>);

impl Log {
    fn write(&self, tx: &mut MemoryTransaction, entry: &'static str) {
        let log = self.clone();
        tx.on_commit(move || log.0.lock().unwrap().push(entry));
    }

    fn entries(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn a_rollback_to_a_savepoint_drops_the_callers_writes_since_and_keeps_those_before() {
    let (store, log) = (MemoryStore::new(), Log::default());
    let mut tx = store.begin();
    log.write(&mut tx, "before");
    tx.savepoint().await.unwrap();
    log.write(&mut tx, "since");
    tx.rollback_to_savepoint().await.unwrap();
    tx.savepoint().await.unwrap();
    log.write(&mut tx, "released");
    tx.release_savepoint().await.unwrap();
    assert!(log.entries().is_empty(), "nothing runs before the commit");
    tx.commit().await.unwrap();
    assert_eq!(log.entries(), ["before", "released"]);
}

#[tokio::test]
async fn a_dropped_transaction_runs_no_write_and_stores_no_record() {
    let (store, log) = (MemoryStore::new(), Log::default());
    let mut tx = store.begin();
    let lease = claimed(&mut tx, "dropped").await;
    tx.complete(&lease, &StoredResponse::new(200, "ok"))
        .await
        .unwrap();
    log.write(&mut tx, "dropped");
    drop(tx);
    assert!(log.entries().is_empty());
    assert!(store.get(lease.scope()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_refused_commit_writes_neither_its_records_nor_the_callers_writes() {
    let (store, log) = (MemoryStore::new(), Log::default());
    let mut first = store.begin();
    let mut second = store.begin();
    let alone = claimed(&mut first, "alone").await;
    let shared = claimed(&mut first, "shared").await;
    for lease in [&alone, &shared] {
        first
            .complete(lease, &StoredResponse::new(200, "first"))
            .await
            .unwrap();
    }
    log.write(&mut first, "first");
    let rival = claimed(&mut second, "shared").await;
    second
        .complete(&rival, &StoredResponse::new(200, "second"))
        .await
        .unwrap();
    log.write(&mut second, "second");
    second.commit().await.unwrap();
    let refused = first.commit().await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::Unavailable { message, .. } if message.contains("write 2")),
        "{refused}"
    );
    assert!(refused.is_retryable());
    assert_eq!(log.entries(), ["second"]);
    assert!(
        store.get(alone.scope()).await.unwrap().is_none(),
        "nothing of the refused commit was written"
    );
    let record = store.get(shared.scope()).await.unwrap().unwrap();
    assert_eq!(record.response().unwrap().body(), b"second");
}

#[tokio::test]
async fn a_lease_claimed_outside_completes_at_the_commit_while_it_holds() {
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000));
    let store = MemoryStore::with_options(MemoryOptions::default().clock(clock.clone())).unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request("held")).await.unwrap() else {
        panic!("the store claims a fresh scope");
    };
    let mut tx = store.begin();
    tx.complete(&lease, &StoredResponse::new(200, "done"))
        .await
        .unwrap();
    assert!(
        store
            .get(lease.scope())
            .await
            .unwrap()
            .unwrap()
            .is_in_flight()
    );
    tx.commit().await.unwrap();
    assert!(
        !store
            .get(lease.scope())
            .await
            .unwrap()
            .unwrap()
            .is_in_flight()
    );

    // A lease that lapsed and was taken over completes nothing.
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request("lapsed")).await.unwrap() else {
        panic!("the store claims a fresh scope");
    };
    clock.advance(Duration::from_secs(10));
    let taken = store.claim(&request("lapsed")).await.unwrap();
    assert!(matches!(taken, ClaimOutcome::Claimed { .. }));
    let mut tx = store.begin();
    assert!(matches!(
        tx.complete(&lease, &StoredResponse::new(200, "late")).await,
        Err(StoreError::LostLease)
    ));
}

#[tokio::test]
async fn a_lease_taken_over_between_its_completion_and_the_commit_refuses_the_commit() {
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000));
    let store = MemoryStore::with_options(MemoryOptions::default().clock(clock.clone())).unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request("k")).await.unwrap() else {
        panic!("the store claims a fresh scope");
    };
    let mut tx = store.begin();
    tx.complete(&lease, &StoredResponse::new(200, "late"))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    let ClaimOutcome::Claimed { lease: next, .. } = store.claim(&request("k")).await.unwrap()
    else {
        panic!("the lapsed lease is taken over");
    };
    assert!(matches!(tx.commit().await, Err(StoreError::LostLease)));
    let record = store.get(lease.scope()).await.unwrap().unwrap();
    assert!(record.is_in_flight(), "the takeover's claim stands");
    assert_eq!(record.owner(), next.owner());
}
