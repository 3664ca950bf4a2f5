//! DynamoDB-specific behaviour: runs whose completion shares the caller's
//! `TransactWriteItems`, the item size limit, lingering items past retention,
//! and one request per operation, counted by the server on a table of each
//! test's own. Every test works in a random tenant of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::support::{
    cost_of_each_operation, fresh_scope, long, must_claim, request, runner, wait_for_claim,
};
use idem_core::store::{ClaimOutcome, IdempotencyStore, Lease, OwnerToken, Timestamp, Transaction};
use idem_core::{
    Checkpoint, Fingerprint, HandlerError, Idempotency, Operation, RunError, RunOutcome, Scope,
    StoreError, StoredResponse,
};
use idem_core::{ManualClock, StoreOptions};
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idem_dynamo::{DynamoOptions, DynamoStore, DynamoTransaction};

/// The fingerprint of the request body `a`, as `support::request(.., "a", ..)` claims it.
fn fp_a() -> Fingerprint {
    Fingerprint::of_bytes("a")
}

/// A business item for the caller's side of a transaction: an order that
/// must not exist yet.
fn order(table: &str, id: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item("pk", AttributeValue::S(format!("order#{id}")))
                .item("total", AttributeValue::N("42".into()))
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .unwrap(),
        )
        .build()
}

async fn order_exists(store: &DynamoStore, id: &str) -> bool {
    common::order_item(store, id).await.is_some()
}

/// Runs a transactional handler that writes `orders` and answers `body`.
async fn place(
    idem: &Idempotency<dyn IdempotencyStore>,
    store: &DynamoStore,
    scope: &Scope,
    orders: &[&str],
    body: &'static str,
) -> Result<RunOutcome, RunError> {
    let items: Vec<_> = orders.iter().map(|id| order(store.table(), id)).collect();
    idem.run_in(
        scope.clone(),
        fp_a(),
        store.begin(),
        |_ctx, mut tx| async move {
            for item in items {
                tx.push(item);
            }
            Ok((tx, StoredResponse::new(201, body)))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_items_commit_with_the_completion_and_a_retry_replays() {
    let store = common::own_store("tx").await;
    let idem = runner(&store);
    let scope = fresh_scope();
    let items = [order(store.table(), "1"), order(store.table(), "1b")];
    let outcome = idem
        .run_in(
            scope.clone(),
            fp_a(),
            store.begin(),
            |ctx, mut tx| async move {
                for item in items {
                    tx.push(item);
                }
                // A checkpoint and the completion of one record in one
                // transaction: the completion replaces the checkpoint.
                ctx.checkpoint_in(&mut tx, "ordered", &1).await?;
                Ok((tx, StoredResponse::new(201, "placed")))
            },
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        RunOutcome::Executed(StoredResponse::new(201, "placed"))
    );
    assert!(order_exists(&store, "1").await && order_exists(&store, "1b").await);
    let record = store.get(&scope).await.unwrap().unwrap();
    assert_eq!(
        (record.response(), record.checkpoint()),
        (Some(&StoredResponse::new(201, "placed")), None)
    );
    let retry = idem
        .run_in(scope, fp_a(), store.begin(), |_ctx, _tx| async move {
            unreachable!("a completed key ran again") as Result<(_, StoredResponse), _>
        })
        .await
        .unwrap();
    assert_eq!(
        retry,
        RunOutcome::Replayed(StoredResponse::new(201, "placed"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_cancels_the_transaction_and_leaves_no_business_item() {
    let store = common::own_store("tx").await;
    // Without renewal: the rival takes the lease over mid-handler.
    let idem = runner(&store)
        .with_lease(Duration::from_millis(300))
        .unwrap()
        .without_auto_renew();
    let scope = fresh_scope();
    let (rival, item) = (store.clone(), order(store.table(), "2"));
    let takeover = scope.clone();
    let result = idem
        .run_in(
            scope.clone(),
            fp_a(),
            store.begin(),
            |_ctx, mut tx| async move {
                tx.push(item);
                // The handler outlives its lease and another claim takes over.
                let (lease, _) = wait_for_claim(&rival, &long(&takeover, "a")).await;
                assert_eq!(lease.attempt(), 2);
                Ok((tx, StoredResponse::new(201, "stale")))
            },
        )
        .await;
    assert!(matches!(result, Err(RunError::LostLease)), "{result:?}");
    assert!(
        !order_exists(&store, "2").await,
        "a business item landed under a lost lease"
    );
    let record = store.get(&scope).await.unwrap().unwrap();
    assert!(record.is_in_flight() && record.attempt() == 2, "{record:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_business_item_writes_nothing_and_releases_the_claim() {
    let store = common::own_store("tx").await;
    let idem = runner(&store);
    let setup = fresh_scope();
    place(&idem, &store, &setup, &["3"], "setup").await.unwrap();
    let scope = fresh_scope();
    // Order 3 exists already, so its conditional put cancels the transaction.
    let result = place(&idem, &store, &scope, &["3-new", "3"], "placed").await;
    match result {
        Err(RunError::Store(StoreError::Rejected {
            store: "dynamodb",
            operation: Operation::Transaction,
            message,
            source: Some(_),
        })) => assert!(message.contains("#1 (ConditionalCheckFailed)"), "{message}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(!order_exists(&store, "3-new").await);
    assert_eq!(
        store.get(&scope).await.unwrap(),
        None,
        "the claim was released"
    );
    let retry = place(&idem, &store, &scope, &["3-retry"], "placed").await;
    assert_eq!(
        retry.unwrap(),
        RunOutcome::Executed(StoredResponse::new(201, "placed"))
    );
    assert!(order_exists(&store, "3-retry").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_in_a_transaction_is_written_only_by_its_commit() {
    let store = common::own_store("tx").await;
    let point = Checkpoint::new("charged", &7).unwrap();

    // Through the runner: the handler fails after its checkpoint, keeping the
    // claim; its transaction was dropped, so no checkpoint was written.
    let idem = runner(&store);
    let scope = fresh_scope();
    let result = idem
        .run_in(
            scope.clone(),
            fp_a(),
            store.begin(),
            |ctx, mut tx: DynamoTransaction| async move {
                ctx.checkpoint_in(&mut tx, "charged", &7).await?;
                Err::<(_, StoredResponse), _>(HandlerError::started("the provider timed out"))
            },
        )
        .await;
    assert!(matches!(result, Err(RunError::Failed(_))), "{result:?}");
    let record = store.get(&scope).await.unwrap().unwrap();
    assert!(
        record.is_in_flight() && record.checkpoint().is_none(),
        "{record:?}"
    );

    // By hand: the checkpoint and an item land together at the commit.
    let scope = fresh_scope();
    let (lease, _) = must_claim(&store, &long(&scope, "a")).await;
    let mut tx = store.begin().await.unwrap();
    tx.push(order(store.table(), "4"));
    tx.checkpoint(&lease, &point).await.unwrap();
    assert_eq!(store.get(&scope).await.unwrap().unwrap().checkpoint(), None);
    tx.commit().await.unwrap();
    assert_eq!(
        store.get(&scope).await.unwrap().unwrap().checkpoint(),
        Some(&point)
    );
    assert!(order_exists(&store, "4").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renewal_keeps_the_key_through_a_slow_transactional_handler() {
    let store = common::own_store("tx").await;
    let idem = runner(&store)
        .with_lease(Duration::from_millis(600))
        .unwrap()
        .with_max_run_time(Duration::from_secs(10))
        .unwrap();
    let scope = fresh_scope();
    let slow = {
        let (idem, store, scope) = (idem.clone(), store.clone(), scope.clone());
        let item = order(store.table(), "5");
        tokio::spawn(async move {
            idem.run_in(scope, fp_a(), store.begin(), |_ctx, mut tx| async move {
                tx.push(item);
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                Ok((tx, StoredResponse::new(201, "slow")))
            })
            .await
        })
    };
    // Past the first lease: only renewals keep the key.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let duplicate = idem
        .run(scope, fp_a(), |_ctx| async move {
            unreachable!("a duplicate ran while the first run held the key")
                as Result<StoredResponse, _>
        })
        .await;
    assert!(
        matches!(duplicate, Err(RunError::InProgress { .. })),
        "{duplicate:?}"
    );
    assert_eq!(
        slow.await.unwrap().unwrap(),
        RunOutcome::Executed(StoredResponse::new(201, "slow"))
    );
    assert!(order_exists(&store, "5").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_too_large_for_an_item_is_refused_before_any_request() {
    let store = common::own_store("size").await;
    let table = store.table().to_string();
    let scope = fresh_scope();
    let (lease, _) = must_claim(&store, &long(&scope, "a")).await;
    let max = store.capabilities().max_response_bytes;
    let before = common::requests(&table).await;
    let too_big = StoredResponse::new(200, vec![7u8; max + 1]);
    assert!(matches!(
        store.complete(&lease, &too_big).await,
        Err(StoreError::TooLarge { .. })
    ));
    let mut tx = store.begin().await.unwrap();
    tx.push(order(&table, "big"));
    assert!(matches!(
        tx.complete(&lease, &too_big).await,
        Err(StoreError::TooLarge { .. })
    ));
    drop(tx);
    assert_eq!(common::requests(&table).await, before, "a request was sent");
    assert!(store.get(&scope).await.unwrap().unwrap().is_in_flight());
}

/// A lease on a record no server holds, for checks made before any request.
fn offline_lease() -> Lease {
    Lease::issued(
        Scope::parse(&"t".repeat(255), &"k".repeat(255)).unwrap(),
        OwnerToken::generate(),
        1,
        Timestamp::from_unix_millis(0),
        Duration::from_secs(1),
    )
}

#[tokio::test]
async fn default_limit_fits_a_real_dynamodb_item_and_many_headers_count() {
    let store = DynamoStore::new(common::client());
    let max = store.capabilities().max_response_bytes;
    assert!(max > 400_000 && max < idem_dynamo::ITEM_LIMIT, "{max}");
    let lease = offline_lease();
    let mut tx = store.begin().await.unwrap();
    let at_max = StoredResponse::new(200, vec![0u8; max - 10]).with_header("x-h", "1234567");
    assert!(tx.complete(&lease, &at_max).await.is_ok());
    // Under the response limit, but 8 bytes of framing per header overflow the item.
    let mut many = StoredResponse::new(200, vec![0u8; max - 20_000]);
    for _ in 0..5_000 {
        many = many.with_header("", "ab");
    }
    assert!(many.size() <= max);
    let mut tx = store.begin().await.unwrap();
    assert!(matches!(
        tx.complete(&lease, &many).await,
        Err(StoreError::TooLarge { .. })
    ));
}

#[tokio::test]
async fn transaction_refuses_a_second_write_after_the_completion_of_its_record() {
    let store = DynamoStore::new(common::client());
    let lease = offline_lease();
    let mut tx = store.begin().await.unwrap();
    let point = Checkpoint::new("p", &1).unwrap();
    tx.checkpoint(&lease, &point).await.unwrap();
    tx.checkpoint(&lease, &point).await.unwrap();
    tx.complete(&lease, &StoredResponse::new(200, ""))
        .await
        .unwrap();
    assert!(matches!(
        tx.checkpoint(&lease, &point).await,
        Err(StoreError::LostLease)
    ));
    assert!(matches!(
        tx.complete(&lease, &StoredResponse::new(200, "")).await,
        Err(StoreError::LostLease)
    ));
}

#[tokio::test]
async fn options_are_checked_once_when_the_store_is_made() {
    let with = |options: DynamoOptions| DynamoStore::with_options(common::client(), options);
    assert_eq!(DynamoStore::new(common::client()).table(), "idem-records");
    assert!(with(DynamoOptions::default().table("orders.idem_1")).is_ok());
    assert!(with(DynamoOptions::default().table("no spaces")).is_err());
    let max = |bytes| {
        DynamoOptions::default()
            .store_options(StoreOptions::default().with_max_response_bytes(bytes))
    };
    assert!(with(max(0)).is_err());
    assert!(with(max(idem_dynamo::ITEM_LIMIT)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_item_past_retention_is_claimed_afresh_without_its_checkpoint() {
    // A manual clock stands in for an item that TTL has not deleted yet.
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000_000));
    let store = common::store_with(
        DynamoOptions::default()
            .table(&common::own_table("ttl"))
            .clock(clock.clone()),
    )
    .await;
    let scope = fresh_scope();
    let old = request(&scope, "a", Duration::from_secs(1))
        .with_retention(Duration::from_secs(60))
        .unwrap();
    let (lease, _) = must_claim(&store, &old).await;
    store
        .checkpoint(&lease, &Checkpoint::new("half", &1).unwrap())
        .await
        .unwrap();
    clock.advance(Duration::from_secs(61));
    assert_eq!(
        store.get(&scope).await.unwrap(),
        None,
        "past retention counts as absent"
    );
    let ClaimOutcome::Claimed { lease, checkpoint } =
        store.claim(&long(&scope, "other")).await.unwrap()
    else {
        panic!("past retention must be claimable with any fingerprint");
    };
    assert_eq!((lease.attempt(), checkpoint), (1, None));
    let record = store.get(&scope).await.unwrap().unwrap();
    assert_eq!((record.attempt(), record.checkpoint()), (1, None));
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    clock.advance(Duration::from_secs(3600 * 25));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
}

/// Callers agree on the time only within a bound (about a second on the
/// service's clock, their hosts' skew on their own): a sweep by the caller
/// ahead leaves a record it sees half a second past retention, which the
/// caller a second behind still holds live (and a replay cache in front of
/// it still answers), and deletes it once it is past by the sweep's margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_never_deletes_what_a_caller_a_second_behind_still_holds_live() {
    let table = common::own_table("sweep");
    let start = Timestamp::from_unix_millis(1_000_000_000);
    let behind = ManualClock::new(start);
    let ahead = ManualClock::new(start + Duration::from_secs(1));
    let on = |clock: &ManualClock| DynamoOptions::default().table(&table).clock(clock.clone());
    let store = common::store_with(on(&behind)).await;
    let sweeper = common::store_with(on(&ahead)).await;
    let scope = fresh_scope();
    let done = request(&scope, "a", Duration::from_secs(1))
        .with_retention(Duration::from_secs(60))
        .unwrap();
    let (lease, _) = must_claim(&store, &done).await;
    store
        .complete(&lease, &StoredResponse::new(200, "kept"))
        .await
        .unwrap();
    let both = |by: Duration| {
        behind.advance(by);
        ahead.advance(by);
    };
    both(Duration::from_millis(59_500));
    assert_eq!(
        sweeper.get(&scope).await.unwrap(),
        None,
        "past retention ahead"
    );
    assert_eq!(sweeper.purge_expired().await.unwrap(), 0);
    assert!(
        store.get(&scope).await.unwrap().is_some(),
        "the caller behind still holds it live"
    );
    both(Duration::from_secs(6));
    assert_eq!(sweeper.purge_expired().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_claim_outcome_and_commit_is_one_request() {
    let store = common::own_store("rt").await;
    let table = store.table().to_string();
    let mut costs = cost_of_each_operation(&store, || common::requests(&table)).await;
    let (lease, _) = must_claim(&store, &long(&fresh_scope(), "a")).await;
    let before = common::requests(&table).await;
    let mut tx = store.begin().await.unwrap();
    tx.push(order(&table, "rt"));
    tx.checkpoint(&lease, &Checkpoint::new("p", &1).unwrap())
        .await
        .unwrap();
    tx.complete(&lease, &StoredResponse::new(200, ""))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    costs.push((
        "begin, push, checkpoint, complete, commit",
        common::requests(&table).await - before,
    ));
    for (what, n) in &costs {
        assert_eq!(*n, 1, "{what} took {n} requests: {costs:?}");
    }
    let before = common::requests(&table).await;
    store.begin().await.unwrap().commit().await.unwrap();
    assert_eq!(
        common::requests(&table).await,
        before,
        "an empty commit sent a request"
    );
}
