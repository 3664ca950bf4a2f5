//! The journal against a fake provider that behaves like a real idempotency
//! layer, on the memory, Postgres and Redis stores: every business effect
//! converges to exactly one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{FakeProvider, Fault};
use idem_core::ManualClock;
use idem_core::store::Timestamp;
use idem_journal::{Journal, JournalError, JournalStore, OperationId, OperationState, Reconciled};
use serde_json::json;

/// A journal and a provider on one manual clock, starting now.
fn setup<S: JournalStore + ?Sized>(store: Arc<S>) -> (Journal<S>, FakeProvider, ManualClock) {
    let start = Timestamp::from_unix_millis(1_800_000_000_000 + rand_ms());
    let clock = ManualClock::new(start);
    let journal = Journal::new(store)
        .with_clock(clock.clone())
        .with_lease(Duration::from_secs(30));
    (journal, FakeProvider::new(clock.clone()), clock)
}

/// Each test's operations stand apart from others' on shared stores.
fn rand_ms() -> i64 {
    i64::from(uuid::Uuid::new_v4().as_fields().1)
}

fn operation(effect: &str) -> OperationId {
    OperationId::new(&format!("order-{}", uuid::Uuid::new_v4()), effect).unwrap()
}

async fn recorded<S: JournalStore + ?Sized>(journal: &Journal<S>, id: &OperationId) {
    journal
        .record(id, json!({"operation": id.to_string(), "amount": 1000}))
        .await
        .unwrap();
}

async fn a_lost_response_then_a_retry_gives_one_effect_and_succeeded<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let (journal, provider, _) = setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    let first = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(
        first.state,
        OperationState::Unknown,
        "ambiguity rounded off"
    );
    let second = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(second.state, OperationState::Succeeded);
    assert_eq!(second.sends, 2, "the retry is a resend with the same key");
    assert_eq!(provider.charges().len(), 1, "charged twice");
    assert_eq!(second.provider_id.as_deref(), Some("ch_1"));
}

async fn processing_then_retrieve_settles_without_resending<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let (journal, provider, _) = setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::Processing);
    let first = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(first.state, OperationState::Unknown);
    assert_eq!(first.provider_id.as_deref(), Some("ch_1"));
    let polled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(polled.state, OperationState::Unknown, "still processing");
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state, OperationState::Succeeded);
    assert_eq!(
        provider.sends(),
        1,
        "an id known is retrieved, never resent"
    );
}

async fn past_the_key_window_find_settles_it_without_a_send<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let (journal, provider, clock) = setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    journal.execute(&id, &provider).await.unwrap();
    // The provider has forgotten the key: a send now could charge again.
    clock.advance(Duration::from_secs(25 * 3600));
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state, OperationState::Succeeded);
    assert_eq!(provider.sends(), 1, "sent past the window");
    assert_eq!(provider.charges().len(), 1);
}

async fn past_the_window_no_match_or_two_matches_need_review<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let (journal, provider, clock) = setup(store);
    // Nothing found: the only send was rate limited, then the window passed.
    let none = operation("charge");
    recorded(&journal, &none).await;
    provider.then(Fault::RateLimit);
    let first = journal.execute(&none, &provider).await.unwrap();
    assert_eq!(
        first.state,
        OperationState::Pending,
        "a rate limit settles nothing"
    );
    // Two found: a lost response, then a duplicate charge made by hand.
    let two = operation("charge");
    recorded(&journal, &two).await;
    provider.then(Fault::LoseResponse);
    journal.execute(&two, &provider).await.unwrap();
    provider.charge_by_hand(&two);
    clock.advance(Duration::from_secs(25 * 3600));
    let reviewed = journal.execute(&none, &provider).await.unwrap();
    assert_eq!(reviewed.state, OperationState::NeedsReview);
    let reviewed = journal.execute(&two, &provider).await.unwrap();
    assert_eq!(reviewed.state, OperationState::NeedsReview);
    assert!(reviewed.detail.unwrap().starts_with("2 effects found"));
    // An operator lists them and settles one by hand; it stays settled.
    let waiting: Vec<_> = journal
        .needs_review(10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|op| op.id)
        .collect();
    assert!(waiting.contains(&none) && waiting.contains(&two));
    let settled = journal
        .settle(
            &two,
            OperationState::Succeeded,
            Some("ch_2".into()),
            "refunded ch_3",
        )
        .await
        .unwrap();
    assert_eq!(settled.state, OperationState::Succeeded);
    assert!(matches!(
        journal
            .settle(&two, OperationState::Failed, None, "oops")
            .await,
        Err(JournalError::Settled { .. })
    ));
}

async fn a_crash_between_the_attempt_record_and_the_send_converges_once<
    S: JournalStore + ?Sized,
>(
    store: Arc<S>,
) {
    crash_and_take_over(store, Fault::HangBeforeCharge).await;
}

async fn a_crash_between_the_send_and_its_result_converges_once<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    crash_and_take_over(store, Fault::HangAfterCharge).await;
}

/// An executor dies at `fault`; after its lease another takes over.
async fn crash_and_take_over<S: JournalStore + ?Sized>(store: Arc<S>, fault: Fault) {
    let (journal, provider, clock) = setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(fault);
    let crashing = {
        let (journal, provider, id) = (journal.clone(), provider.clone(), id.clone());
        tokio::spawn(async move { journal.execute(&id, &provider).await })
    };
    // The attempt is recorded before the send.
    idem_conformance::support::eventually("the attempt recorded", || async {
        let op = journal.get(&id).await.unwrap().unwrap();
        (op.sends == 1 && provider.sends() == 1).then_some(())
    })
    .await;
    crashing.abort();
    assert!(matches!(
        journal.execute(&id, &provider).await,
        Err(JournalError::Busy(_))
    ));
    clock.advance(Duration::from_secs(31));
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state, OperationState::Succeeded);
    assert_eq!(provider.charges().len(), 1, "one effect");
}

async fn concurrent_executors_send_once<S: JournalStore + ?Sized>(store: Arc<S>) {
    let (journal, provider, _) = setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    let executors: Vec<_> = (0..8)
        .map(|_| {
            let (journal, provider, id) = (journal.clone(), provider.clone(), id.clone());
            tokio::spawn(async move { journal.execute(&id, &provider).await })
        })
        .collect();
    for executor in executors {
        match executor.await.unwrap() {
            Ok(_) | Err(JournalError::Busy(_)) => {}
            Err(other) => panic!("an executor failed: {other:?}"),
        }
    }
    assert_eq!(provider.sends(), 1);
    assert_eq!(provider.charges().len(), 1);
}

async fn settled_states_never_change_and_never_call_the_provider<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let (journal, provider, _) = setup(store);
    let declined = operation("charge");
    recorded(&journal, &declined).await;
    provider.then(Fault::Decline);
    assert_eq!(
        journal.execute(&declined, &provider).await.unwrap().state,
        OperationState::Failed
    );
    let charged = operation("charge");
    recorded(&journal, &charged).await;
    journal.execute(&charged, &provider).await.unwrap();
    for id in [&declined, &charged] {
        let before = journal.get(id).await.unwrap().unwrap();
        let again = journal.execute(id, &provider).await.unwrap();
        assert_eq!(again, before, "a settled operation changed");
        assert!(matches!(
            journal
                .settle(id, OperationState::Succeeded, None, "no")
                .await,
            Err(JournalError::Settled { .. })
        ));
    }
    assert_eq!(
        provider.sends(),
        2,
        "a settled operation called the provider"
    );
    // Recording it again gives the same operation; another request is refused.
    let again = journal
        .record(
            &charged,
            json!({"operation": charged.to_string(), "amount": 1000}),
        )
        .await
        .unwrap();
    assert_eq!(again.state, OperationState::Succeeded);
    assert!(matches!(
        journal.record(&charged, json!({"amount": 5})).await,
        Err(JournalError::Mismatch(_))
    ));
}

async fn the_reconciler_drives_old_open_operations_in_bounded_batches<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let (journal, provider, clock) = setup(store);
    let ids: Vec<_> = (0..3).map(|_| operation("charge")).collect();
    for id in &ids {
        recorded(&journal, id).await;
        provider.then(Fault::LoseResponse);
        journal.execute(id, &provider).await.unwrap();
    }
    // Fresh ones are left alone: the caller may still be on them.
    let report = journal
        .reconcile(&provider, Duration::from_secs(60), 100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(report.examined, 0, "{report:?}");
    clock.advance(Duration::from_secs(120));
    let first = journal
        .reconcile(
            &provider,
            Duration::from_secs(60),
            2,
            Duration::from_millis(1),
        )
        .await
        .unwrap();
    assert_eq!(first.examined, 2, "the batch bound");
    let rest = journal
        .reconcile(&provider, Duration::from_secs(60), 100, Duration::ZERO)
        .await
        .unwrap();
    assert!(rest.settled >= 1, "{rest:?}");
    for id in &ids {
        let op = journal.get(id).await.unwrap().unwrap();
        assert_eq!(op.state, OperationState::Succeeded, "{id}");
    }
    assert_eq!(provider.charges().len(), 3);
    let _: Reconciled = rest;
}

macro_rules! journal_tests {
    ($name:ident, $make:expr) => {
        journal_tests!($name, $make, [
            a_lost_response_then_a_retry_gives_one_effect_and_succeeded,
            processing_then_retrieve_settles_without_resending,
            past_the_key_window_find_settles_it_without_a_send,
            past_the_window_no_match_or_two_matches_need_review,
            a_crash_between_the_attempt_record_and_the_send_converges_once,
            a_crash_between_the_send_and_its_result_converges_once,
            concurrent_executors_send_once,
            settled_states_never_change_and_never_call_the_provider,
            the_reconciler_drives_old_open_operations_in_bounded_batches,
        ]);
    };
    ($name:ident, $make:expr, [$($case:ident),* $(,)?]) => {
        mod $name {
            use super::*;

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($make).await;
                }
            )*
        }
    };
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/test sets it)"))
}

async fn postgres_pool() -> idem_postgres::sqlx::PgPool {
    idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&env("IDEM_POSTGRES_URL"))
        .await
        .expect("connect to IDEM_POSTGRES_URL")
}

/// A table of the test's own: the reconciler lists every open operation.
async fn postgres() -> Arc<idem_journal::PostgresJournal> {
    let table = format!("journal_{}", uuid::Uuid::new_v4().simple());
    let store =
        idem_journal::PostgresJournal::with_table(postgres_pool().await, &table[..40]).unwrap();
    store.migrate().await.unwrap();
    Arc::new(store)
}

async fn redis() -> Arc<idem_journal::RedisJournal> {
    let client = idem_redis::redis::Client::open(env("IDEM_REDIS_URL")).unwrap();
    let conn = idem_redis::redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect to IDEM_REDIS_URL");
    let prefix = format!("journal-{}", uuid::Uuid::new_v4().simple());
    Arc::new(idem_journal::RedisJournal::with_prefix(conn, &prefix))
}

journal_tests!(memory, Arc::new(idem_journal::MemoryJournal::new()));
journal_tests!(postgres, postgres().await);
journal_tests!(redis, redis().await);

/// On Postgres the operation can be recorded inside the business
/// transaction: the order and its charge commit, or vanish, together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_recorded_in_a_business_transaction_commits_with_it() {
    use idem_postgres::sqlx::{self, AssertSqlSafe};
    let store = postgres().await;
    let pool = postgres_pool().await;
    let (journal, provider, _) = setup(Arc::clone(&store));
    let orders = format!("jorders_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {orders} (id text NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    for commit in [false, true] {
        let id = operation("charge");
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!("INSERT INTO {orders} VALUES ($1)")))
            .bind(id.subject())
            .execute(&mut *tx)
            .await
            .unwrap();
        journal
            .record_in(&mut tx, &id, json!({"operation": id.to_string()}))
            .await
            .unwrap();
        if commit {
            tx.commit().await.unwrap();
            let charged = journal.execute(&id, &provider).await.unwrap();
            assert_eq!(charged.state, OperationState::Succeeded);
        } else {
            tx.rollback().await.unwrap();
            assert_eq!(
                journal.get(&id).await.unwrap(),
                None,
                "the charge outlived its order"
            );
        }
    }
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {orders}")))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(provider.charges().len(), 1);
}
