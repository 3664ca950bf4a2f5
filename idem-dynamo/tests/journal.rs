//! The journal store on DynamoDB: the public journal suite (one test per
//! sentence of the contract, on one shared table), what is DynamoDB's own
//! (the caller's transaction item, one request per operation, `updated_at`
//! under a clock behind, the list index read again), and one script run
//! against the in-memory reference journal, answer for answer. Every test
//! works in a random namespace of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_core::store::{
    Acquired, Clock, Finish, JournalStore, ListQuery, NewOperation, OperationId, OperationKey,
    OperationState, OwnerToken, SystemClock,
};
use idem_core::{ManualClock, Tenant};
use idem_dynamo::DynamoJournalOptions;
use idem_dynamo::aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idem_dynamo::{DynamoJournal, aws_sdk_dynamodb};
use idem_memory::MemoryJournal;
use serde_json::json;

idem_conformance::journal_suite!(common::shared_journal());

fn namespace() -> Tenant {
    Tenant::new(format!("journal-{}", uuid::Uuid::new_v4())).unwrap()
}

fn key_in(namespace: &Tenant, subject: &str) -> OperationKey {
    OperationKey::new(
        namespace.clone(),
        OperationId::new(subject, "charge").unwrap(),
    )
}

fn charge(key: &OperationKey, amount: u64) -> NewOperation {
    NewOperation::new(key.clone(), json!({ "amount": amount, "currency": "EUR" }))
}

/// A business write: an order that must not exist yet.
fn order(table: &str, id: &str) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("order#{id}")))
        .item("total", AttributeValue::N("42".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

async fn order_exists(journal: &DynamoJournal, id: &str) -> bool {
    journal
        .client()
        .get_item()
        .table_name(journal.table())
        .key("pk", AttributeValue::S(format!("order#{id}")))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .is_some()
}

/// The cancellation reasons of a cancelled transaction, one per item.
fn reasons<R: std::fmt::Debug>(
    error: &aws_sdk_dynamodb::error::SdkError<TransactWriteItemsError, R>,
) -> Vec<String> {
    match error.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => cancelled
            .cancellation_reasons()
            .iter()
            .map(|r| r.code().unwrap_or("None").to_string())
            .collect(),
        other => panic!("expected a cancelled transaction, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_item_commits_with_the_business_write_and_a_second_record_cancels() {
    let journal = common::shared_journal().await;
    let key = key_in(&namespace(), "order-1");
    let operation = charge(&key, 1000);
    let id = uuid::Uuid::new_v4().to_string();
    journal
        .client()
        .transact_write_items()
        .transact_items(order(journal.table(), &id))
        .transact_items(journal.record_item(&operation).unwrap())
        .send()
        .await
        .unwrap();
    assert!(order_exists(&journal, &id).await);
    let stored = journal.get(&key).await.unwrap().expect("recorded");
    assert_eq!(stored.provider_key(), operation.provider_key());
    assert_eq!(stored.request(), operation.request());
    assert_eq!(stored.state(), OperationState::Pending);
    assert_eq!(journal.record(&charge(&key, 5)).await.unwrap(), stored);

    // Recorded already: the transaction is cancelled at the journal's item,
    // and the business write of it is not made either.
    let other = uuid::Uuid::new_v4().to_string();
    let again = journal
        .client()
        .transact_write_items()
        .transact_items(order(journal.table(), &other))
        .transact_items(journal.record_item(&charge(&key, 2000)).unwrap())
        .send()
        .await
        .unwrap_err();
    assert_eq!(reasons(&again), ["None", "ConditionalCheckFailed"]);
    assert!(!order_exists(&journal, &other).await);
    assert_eq!(journal.get(&key).await.unwrap(), Some(stored));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_business_condition_records_nothing() {
    let journal = common::shared_journal().await;
    let key = key_in(&namespace(), "order-1");
    let id = uuid::Uuid::new_v4().to_string();
    let Some(existing) = order(journal.table(), &id).put().cloned() else {
        unreachable!()
    };
    journal
        .client()
        .put_item()
        .table_name(journal.table())
        .set_item(Some(existing.item().clone()))
        .send()
        .await
        .unwrap();
    let refused = journal
        .client()
        .transact_write_items()
        .transact_items(order(journal.table(), &id))
        .transact_items(journal.record_item(&charge(&key, 1000)).unwrap())
        .send()
        .await
        .unwrap_err();
    assert_eq!(reasons(&refused), ["ConditionalCheckFailed", "None"]);
    assert_eq!(journal.get(&key).await.unwrap(), None);
    let listed = journal
        .list(&ListQuery::new(
            key.namespace().clone(),
            &OperationState::ALL,
        ))
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_is_one_request_and_a_list_one_query_per_state() {
    let journal = common::own_journal("jrt").await;
    let table = journal.table().to_string();
    let key = key_in(&namespace(), "order-1");
    let (owner, other) = (OwnerToken::generate(), OwnerToken::generate());
    let lease = Duration::from_secs(60);
    let settled = Finish::new(OperationState::Succeeded, Some("paid".into()));
    let mut costs = Vec::new();
    macro_rules! cost {
        ($what:expr, $call:expr) => {{
            let before = common::requests(&table).await;
            let answer = $call;
            costs.push(($what, common::requests(&table).await - before));
            answer
        }};
    }
    cost!("record", journal.record(&charge(&key, 1)).await.unwrap());
    cost!(
        "record again",
        journal.record(&charge(&key, 2)).await.unwrap()
    );
    cost!("get", journal.get(&key).await.unwrap());
    let held = cost!(
        "acquire",
        journal.acquire(key.held_by(owner), lease).await.unwrap()
    );
    assert!(matches!(held, Acquired::Held { .. }));
    let busy = cost!(
        "busy",
        journal.acquire(key.held_by(other), lease).await.unwrap()
    );
    assert!(matches!(busy, Acquired::Busy { .. }));
    cost!(
        "mark_sent",
        journal.mark_sent(key.held_by(owner), 0).await.unwrap()
    );
    cost!(
        "mark_sent again",
        journal.mark_sent(key.held_by(owner), 0).await.unwrap()
    );
    cost!(
        "lost send",
        journal.mark_sent(key.held_by(other), 1).await.unwrap_err()
    );
    let open = [OperationState::Pending, OperationState::Unknown];
    let listed = cost!(
        "list of two states",
        journal
            .list(&ListQuery::new(key.namespace().clone(), &open).limit(10))
            .await
            .unwrap()
    );
    assert_eq!(listed.len(), 1);
    cost!(
        "finish",
        journal.finish(key.held_by(owner), &settled).await.unwrap()
    );
    cost!(
        "finish again",
        journal.finish(key.held_by(owner), &settled).await.unwrap()
    );
    let empty = cost!(
        "empty list",
        journal
            .list(&ListQuery::new(key.namespace().clone(), &[OperationState::Pending]).limit(10))
            .await
            .unwrap()
    );
    assert!(empty.is_empty());
    // A list is a query per state and a read of what they found; the test
    // server counts requests by their `TableName`, which a `BatchGetItem`
    // has none of (it names tables as keys of `RequestItems`), so only the
    // queries show here.
    for (what, requests) in &costs {
        let expected = if *what == "list of two states" { 2 } else { 1 };
        assert_eq!(*requests, expected, "{what}: {costs:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_clock_is_behind_never_moves_updated_at_back() {
    let clock = ManualClock::new(SystemClock.now());
    let table = common::own_table("jclock");
    let journal = common::journal_with(
        DynamoJournalOptions::default()
            .table(&table)
            .clock(clock.clone()),
    )
    .await;
    let key = key_in(&namespace(), "order-1");
    let owner = OwnerToken::generate();
    journal.record(&charge(&key, 1)).await.unwrap();
    let Acquired::Held { now: leased_at, .. } = journal
        .acquire(key.held_by(owner), Duration::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("not held")
    };
    clock.set(leased_at - Duration::from_secs(5));
    let before = common::requests(&table).await;
    let sent = journal.mark_sent(key.held_by(owner), 0).await.unwrap();
    assert_eq!(
        common::requests(&table).await - before,
        2,
        "the stamp's refusal, then the write keeping the time"
    );
    assert_eq!(sent.parts().updated_at, leased_at);
    assert_eq!(sent.parts().sends, 1);
    assert_eq!(sent.parts().first_sent_at, Some(clock.now()));
    let finished = journal
        .finish(
            key.held_by(owner),
            &Finish::new(OperationState::Unknown, None),
        )
        .await
        .unwrap();
    assert_eq!(finished.parts().updated_at, leased_at);
    assert_eq!(finished.parts().lease_until, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_every_age_finds_what_a_caller_ahead_changed() {
    let start = SystemClock.now();
    let (behind, ahead) = (
        ManualClock::new(start),
        ManualClock::new(start + Duration::from_secs(2)),
    );
    let table = common::own_table("jahead");
    let on = |clock: &ManualClock| {
        DynamoJournalOptions::default()
            .table(&table)
            .clock(clock.clone())
    };
    let writer = common::journal_with(on(&ahead)).await;
    let reader = common::journal_with(on(&behind)).await;
    let key = key_in(&namespace(), "order-1");
    writer.record(&charge(&key, 1)).await.unwrap();
    let every_age = ListQuery::new(key.namespace().clone(), &OperationState::ALL);
    let listed = reader.list(&every_age).await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.key()).collect::<Vec<_>>(),
        [&key],
        "changed two seconds ahead of the reader, listed whatever its age"
    );
    let aged = every_age.older_than(Duration::from_secs(1));
    assert!(reader.list(&aged).await.unwrap().is_empty());
    behind.advance(Duration::from_secs(3));
    assert_eq!(reader.list(&aged).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_reads_what_it_finds_again_and_drops_what_no_longer_matches() {
    let journal = common::shared_journal().await;
    let ns = namespace();
    let (stale, fresh) = (key_in(&ns, "order-1"), key_in(&ns, "order-2"));
    journal.record(&charge(&stale, 1)).await.unwrap();
    journal.record(&charge(&fresh, 2)).await.unwrap();
    // The index lagging the table, as DynamoDB's may: the item is settled
    // while the index still files it as pending.
    journal
        .client()
        .update_item()
        .table_name(journal.table())
        .key("pk", AttributeValue::S(stale.storage_key()))
        .update_expression("SET st = :s")
        .expression_attribute_values(":s", AttributeValue::S("succeeded".into()))
        .send()
        .await
        .unwrap();
    let pending = journal
        .list(&ListQuery::new(ns.clone(), &[OperationState::Pending]))
        .await
        .unwrap();
    let subjects: Vec<_> = pending.iter().map(|r| r.id().subject()).collect();
    assert_eq!(subjects, ["order-2"]);
}

/// What a script works with: one operation, its two requests, two owners.
struct Cast {
    key: OperationKey,
    first: NewOperation,
    second: NewOperation,
    a: OwnerToken,
    b: OwnerToken,
}

/// Every answer of `journal` to one script, as text, one for each step,
/// the clock moved between them.
async fn script<J: JournalStore>(journal: &J, clock: &ManualClock, cast: &Cast) -> Vec<String> {
    let Cast {
        key,
        first,
        second,
        a,
        b,
    } = cast;
    let (a, b) = (*a, *b);
    let lease = Duration::from_secs(10);
    let mut answers = Vec::new();
    macro_rules! step {
        ($call:expr) => {
            answers.push(format!("{}: {:?}", stringify!($call), $call.await))
        };
    }
    let tick = || clock.advance(Duration::from_millis(7));
    step!(journal.acquire(key.held_by(a), lease));
    step!(journal.mark_sent(key.held_by(a), 0));
    step!(journal.record(first));
    tick();
    step!(journal.record(second));
    step!(journal.mark_sent(key.held_by(a), 0));
    step!(journal.finish(key.held_by(a), &Finish::new(OperationState::Failed, None)));
    step!(journal.acquire(key.held_by(a), Duration::ZERO));
    step!(journal.acquire(key.held_by(a), lease));
    tick();
    step!(journal.acquire(key.held_by(b), lease));
    step!(journal.mark_sent(key.held_by(b), 0));
    step!(journal.mark_sent(key.held_by(a), 0));
    tick();
    step!(journal.mark_sent(key.held_by(a), 0));
    step!(journal.mark_sent(key.held_by(a), 5));
    step!(journal.mark_sent(key.held_by(a), 1));
    step!(journal.acquire(key.held_by(a), lease));
    clock.advance(lease);
    step!(journal.mark_sent(key.held_by(a), 2));
    step!(journal.acquire(key.held_by(b), lease));
    step!(journal.finish(
        key.held_by(a),
        &Finish::new(OperationState::Succeeded, None)
    ));
    let unknown = Finish::new(OperationState::Unknown, Some("timed out".into()))
        .with_provider_id(Some("ch_1".into()))
        .with_search_until(Some(clock.now() + lease));
    tick();
    step!(journal.finish(key.held_by(b), &unknown));
    step!(journal.finish(key.held_by(b), &unknown));
    step!(journal.mark_sent(key.held_by(b), 2));
    step!(journal.acquire(key.held_by(a), lease));
    clock.set(clock.now() - Duration::from_secs(3));
    step!(journal.mark_sent(key.held_by(a), 2));
    let review = Finish::new(OperationState::NeedsReview, None);
    step!(journal.finish(key.held_by(a), &review));
    step!(journal.acquire(key.held_by(b), lease));
    step!(journal.acquire(key.held_by(a), lease));
    tick();
    let paid = Finish::new(OperationState::Succeeded, Some("paid".into()));
    step!(journal.finish(key.held_by(b), &paid));
    step!(journal.finish(key.held_by(b), &paid));
    step!(journal.finish(key.held_by(b), &review));
    step!(journal.acquire(key.held_by(a), lease));
    step!(journal.acquire(key.held_by(b), lease));
    // Past every change, so that a list finds it.
    clock.advance(Duration::from_secs(10));
    step!(journal.get(key));
    for states in [&OperationState::ALL[..], &[OperationState::Pending]] {
        for older_than in [Duration::ZERO, Duration::from_secs(3600)] {
            step!(
                journal
                    .list(&ListQuery::new(key.namespace().clone(), states).older_than(older_than))
            );
        }
    }
    step!(journal.list(&ListQuery::new(key.namespace().clone(), &OperationState::ALL).limit(0)));
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_the_reference_journals() {
    let start = SystemClock.now();
    let (dynamo_clock, memory_clock) = (ManualClock::new(start), ManualClock::new(start));
    let dynamo = common::journal_with(
        DynamoJournalOptions::default()
            .table("idem-journal-conformance")
            .clock(dynamo_clock.clone()),
    )
    .await;
    let memory = MemoryJournal::with_clock(memory_clock.clone());
    let key = key_in(&namespace(), "order-1");
    let cast = Cast {
        first: charge(&key, 1000),
        second: charge(&key, 2000),
        key,
        a: OwnerToken::generate(),
        b: OwnerToken::generate(),
    };
    let ours = script(&dynamo, &dynamo_clock, &cast).await;
    let reference = script(&memory, &memory_clock, &cast).await;
    let all = reference.join("\n");
    for answer in [
        "Absent",
        "Held",
        "Busy",
        "Settled",
        "LostLease",
        "InvalidInput",
        "NeedsReview",
        "Failed",
        "Ok([JournalRecord",
    ] {
        assert!(
            all.contains(answer),
            "the script never answers {answer}:\n{all}"
        );
    }
    assert_eq!(ours.len(), reference.len());
    for (ours, reference) in ours.iter().zip(&reference) {
        assert_eq!(ours, reference);
    }
}
