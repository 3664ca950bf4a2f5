//! What the runner does without being asked: it renews a running handler's
//! lease (up to its maximum run time), and it completes a response too
//! large to store with a small stored answer, so work that happened never
//! runs again for its key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Ledger;
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore};
use idem_core::{Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoredResponse};
use idem_memory::{MemoryOptions, MemoryStore};

fn scope() -> Scope {
    Scope::parse("runner-defaults", &uuid::Uuid::new_v4().to_string()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_handler_keeps_its_key_past_its_lease_until_its_max_run_time() {
    // Renewal every third of the lease leaves two thirds of it as slack
    // for a loaded machine.
    let (lease, max) = (Duration::from_secs(2), Duration::from_secs(4));
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotency::new(Arc::clone(&store))
        .with_lease(lease)
        .unwrap()
        .with_max_run_time(max)
        .unwrap();
    let (scope, fp) = (scope(), Fingerprint::of_bytes(b"slow"));
    let started = Instant::now();
    let outcome = idem
        .run(scope.clone(), fp, |_ctx| {
            let store = Arc::clone(&store);
            async move {
                // A retry every 100 ms, until one takes the key over.
                let retry = ClaimRequest::new(scope, fp).with_lease(lease).unwrap();
                loop {
                    match store.claim(&retry).await.unwrap() {
                        ClaimOutcome::Claimed { .. } => break,
                        ClaimOutcome::InProgress { .. } => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                Ok(StoredResponse::new(200, "after a takeover"))
            }
        })
        .await;
    let held = started.elapsed();
    assert!(
        held >= max,
        "a retry took the key over after {held:?}, within the maximum run time"
    );
    assert!(matches!(outcome, Err(RunError::LostLease)), "{outcome:?}");
}

#[tokio::test]
async fn a_response_too_large_to_store_completes_with_its_fallback_in_both_runners() {
    let store =
        MemoryStore::with_options(MemoryOptions::default().max_response_bytes(1024)).unwrap();
    let idem = Idempotency::new(Arc::new(store.clone()));
    let big = StoredResponse::new(201, vec![b'x'; 4096]).with_header("x-order", "7");

    let (scope, fp) = (scope(), Fingerprint::of_bytes(b"big"));
    let first = idem
        .run(scope.clone(), fp, |_| async { Ok(big.clone()) })
        .await
        .unwrap();
    assert_eq!(
        first,
        RunOutcome::Executed(big.clone()),
        "the caller gets it whole"
    );
    let retry = idem
        .run(scope, fp, |_| async {
            panic!("ran twice") as Result<StoredResponse, _>
        })
        .await
        .unwrap();
    let RunOutcome::Replayed(stored) = retry else {
        panic!("{retry:?}")
    };
    assert_eq!(stored.status(), 201);
    assert_eq!(
        stored.header("content-type"),
        Some(&b"application/problem+json"[..])
    );
    let problem: serde_json::Value = serde_json::from_slice(stored.body()).unwrap();
    assert_eq!(problem["status"], 201);
    assert!(
        problem["detail"].as_str().unwrap().contains("4104 bytes"),
        "{problem}"
    );

    let (scope, fp) = (scope_in_tx(), Fingerprint::of_bytes(b"big"));
    let begin = || async {
        Ok(Ledger {
            limit: Some(1024),
            ..Ledger::new(store.clone())
        })
    };
    let first = idem
        .run_in(scope.clone(), fp, begin(), |_, tx| async {
            Ok((tx, big.clone()))
        })
        .await
        .unwrap();
    assert_eq!(first, RunOutcome::Executed(big.clone()));
    let retry = idem
        .run_in(scope, fp, begin(), |_, _| async {
            panic!("ran twice") as Result<(_, StoredResponse), _>
        })
        .await
        .unwrap();
    assert!(
        matches!(&retry, RunOutcome::Replayed(r) if r.status() == 201 && r.size() <= 1024),
        "{retry:?}"
    );
}

fn scope_in_tx() -> Scope {
    scope()
}

#[tokio::test]
async fn a_fallback_too_large_itself_stores_the_status_alone() {
    let store = MemoryStore::with_options(MemoryOptions::default().max_response_bytes(16)).unwrap();
    let idem = Idempotency::new(Arc::new(store))
        .with_too_large_response(|_, _| StoredResponse::new(200, vec![b'y'; 100]));
    let (scope, fp) = (scope(), Fingerprint::of_bytes(b"big"));
    idem.run(scope.clone(), fp, |_| async {
        Ok(StoredResponse::new(200, vec![b'x'; 100]))
    })
    .await
    .unwrap();
    let retry = idem
        .run(scope, fp, |_| async {
            panic!("ran twice") as Result<StoredResponse, _>
        })
        .await
        .unwrap();
    assert_eq!(retry, RunOutcome::Replayed(StoredResponse::new(200, "")));
}
