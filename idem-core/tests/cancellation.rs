//! What a dropped run leaves behind: a plain run keeps its key to its
//! lease (its work may have happened); a transactional run dropped before
//! its commit answered frees its key at once if nothing committed, and
//! keeps its record if the commit landed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Ledger;
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore};
use idem_core::{Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoredResponse};
use idem_memory::MemoryStore;
use tokio::sync::Notify;

/// Generous: the machine running these is busy.
const PATIENCE: Duration = Duration::from_secs(30);
/// Far longer than any test here: whatever frees a key, it is not its lease.
const LEASE: Duration = Duration::from_secs(600);

fn scope() -> Scope {
    Scope::parse("cancellation", &uuid::Uuid::new_v4().to_string()).unwrap()
}

fn runner(store: &MemoryStore) -> Idempotency {
    Idempotency::new(Arc::new(store.clone()) as Arc<dyn IdempotencyStore>)
        .with_lease(LEASE)
        .unwrap()
}

/// What a fresh claim of `scope` is answered, until it is not `InProgress`.
async fn claimed_again(store: &MemoryStore, scope: &Scope) -> ClaimOutcome {
    let request = ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(b"order"))
        .with_lease(LEASE)
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let outcome = store.claim(&request).await.unwrap();
        if !matches!(outcome, ClaimOutcome::InProgress { .. }) {
            return outcome;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still in progress, {PATIENCE:?} into a {LEASE:?} lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_run_dropped_inside_its_handler_frees_its_key_at_once() {
    let store = MemoryStore::new();
    let idem = runner(&store);
    let scope = scope();
    let entered = Arc::new(Notify::new());
    let running = tokio::spawn({
        let (store, scope, entered) = (store.clone(), scope.clone(), Arc::clone(&entered));
        async move {
            let begin = async move { Ok(Ledger::new(store)) };
            idem.run_in(
                scope,
                Fingerprint::of_bytes(b"order"),
                begin,
                |_ctx, tx| async move {
                    entered.notify_one();
                    std::future::pending::<()>().await;
                    Ok((tx, StoredResponse::new(201, "never")))
                },
            )
            .await
        }
    });
    entered.notified().await;
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    assert!(matches!(
        claimed_again(&store, &scope).await,
        ClaimOutcome::Claimed { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_run_dropped_after_its_commit_landed_keeps_its_record() {
    let store = MemoryStore::new();
    let idem = runner(&store);
    let scope = scope();
    let begin = {
        let store = store.clone();
        async move {
            Ok(Ledger {
                hang_after_commit: true,
                ..Ledger::new(store)
            })
        }
    };
    let run = idem.run_in(
        scope.clone(),
        Fingerprint::of_bytes(b"order"),
        begin,
        |_ctx, tx| async move { Ok((tx, StoredResponse::new(201, "placed"))) },
    );
    // The commit landed; its answer never comes, and the caller gives up.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), run)
            .await
            .is_err()
    );
    // The background release is fenced: it cannot undo a completion.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let replay = idem
        .run(scope, Fingerprint::of_bytes(b"order"), |_ctx| async {
            unreachable!("ran twice") as Result<StoredResponse, _>
        })
        .await
        .unwrap();
    assert_eq!(
        replay,
        RunOutcome::Replayed(StoredResponse::new(201, "placed"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_run_dropped_inside_its_handler_keeps_its_key_to_its_lease() {
    let store = MemoryStore::new();
    let idem = runner(&store);
    let scope = scope();
    let run = idem.run(
        scope.clone(),
        Fingerprint::of_bytes(b"order"),
        |_ctx| async {
            // Work outside any transaction, which may have happened.
            std::future::pending::<Result<StoredResponse, idem_core::HandlerError>>().await
        },
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(100), run)
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let retry = idem
        .run(scope, Fingerprint::of_bytes(b"order"), |_ctx| async {
            unreachable!("ran while the first may still be running") as Result<StoredResponse, _>
        })
        .await;
    assert!(
        matches!(retry, Err(RunError::InProgress { .. })),
        "{retry:?}"
    );
}
