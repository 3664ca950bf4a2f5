//! The journal against a fake provider that behaves like a real idempotency
//! layer (the first result per key replayed, a key reused with other
//! parameters refused, keys pruned after the window, search lagging), on
//! every journal store: every business effect converges to exactly one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{FakeProvider, Fault, Time};
use idem_core::store::JournalStore;
use idem_journal::{Delivery, Journal, JournalError, OperationId, OperationState, Step};
use serde_json::json;

/// How time runs for one store: leases and the short window that the
/// "past the window" tests wait out.
#[derive(Clone)]
struct Env {
    time: Time,
    lease: Duration,
    short_window: Duration,
}

impl Env {
    fn manual() -> Self {
        Self {
            time: Time::manual(),
            lease: Duration::from_secs(30),
            short_window: Duration::from_secs(24 * 3600),
        }
    }

    /// For stores whose server's clock judges: real time, waited out; the
    /// lease long enough that a loaded machine still checks within it.
    fn real() -> Self {
        Self {
            time: Time::Real,
            lease: Duration::from_secs(5),
            short_window: Duration::from_millis(1_200),
        }
    }

    /// The same on an emulator (moto: one request at a time, shared by two
    /// tests at once on a loaded machine): a case's few calls took over 5 s
    /// there (CI: `LostLease` at a case's third call, the probe having
    /// measured a quiet moment), so the lease starts at 15 s.
    fn emulated() -> Self {
        Self {
            lease: Duration::from_secs(15),
            ..Self::real()
        }
    }

    /// The same, its real-time lease and window stretched to `store`'s
    /// measured latency: an emulator under load (moto serves one request
    /// at a time) answers in hundreds of milliseconds, and a case must
    /// still make its calls within a lease, and before a window passes.
    async fn fitted<S: JournalStore + ?Sized>(mut self, store: &Arc<S>) -> Self {
        if !matches!(self.time, Time::Real) {
            return self;
        }
        let journal = Journal::new(Arc::clone(store), "journal-latency-probe").unwrap();
        let mut slowest = Duration::ZERO;
        for _ in 0..3 {
            let started = std::time::Instant::now();
            journal.get(&operation("probe")).await.unwrap();
            slowest = slowest.max(started.elapsed());
        }
        self.lease = self.lease.max(slowest * 50);
        self.short_window = self.short_window.max(slowest * 15);
        self
    }

    /// A journal in a namespace of the test's own, and a provider whose
    /// keys live a day.
    fn setup<S: JournalStore + ?Sized>(&self, store: Arc<S>) -> (Journal<S>, FakeProvider) {
        let namespace = format!("journal-test-{}", uuid::Uuid::new_v4());
        let journal = Journal::new(store, &namespace)
            .unwrap()
            .with_lease(self.lease)
            .unwrap();
        (journal, FakeProvider::new(self.time.clock()))
    }

    /// A provider whose keys live the short window, searching without lag.
    fn forgetful(&self) -> FakeProvider {
        let mut provider = FakeProvider::new(self.time.clock());
        provider.window = self.short_window;
        provider.search_lag = Duration::ZERO;
        provider
    }

    /// Lets the short window (and the provider's memory of keys) pass.
    async fn past_the_window(&self) {
        self.time
            .pass(self.short_window + self.short_window / 2)
            .await;
    }
}

fn operation(effect: &str) -> OperationId {
    OperationId::new(&format!("order-{}", uuid::Uuid::new_v4()), effect).unwrap()
}

async fn recorded<S: JournalStore + ?Sized>(journal: &Journal<S>, id: &OperationId) {
    journal.record(id, json!({"amount": 1000})).await.unwrap();
}

async fn a_lost_response_then_a_retry_gives_one_effect_and_succeeded<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, provider) = env.setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    let first = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(
        first.state(),
        OperationState::Unknown,
        "ambiguity rounded off"
    );
    let second = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(second.state(), OperationState::Succeeded);
    assert_eq!(
        second.parts().sends,
        2,
        "the retry is a resend with the same key"
    );
    assert_eq!(provider.charges().len(), 1, "charged twice");
    assert_eq!(second.parts().provider_id.as_deref(), Some("ch_1"));
}

async fn processing_then_retrieve_settles_without_resending<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, provider) = env.setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::Processing);
    let first = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(first.state(), OperationState::Unknown);
    assert_eq!(first.parts().provider_id.as_deref(), Some("ch_1"));
    let polled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(polled.state(), OperationState::Unknown, "still processing");
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert_eq!(
        provider.sends(),
        1,
        "an id known is retrieved, never resent"
    );
}

async fn past_the_key_window_find_settles_it_without_a_send<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, _) = env.setup(store);
    let provider = env.forgetful();
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    journal.execute(&id, &provider).await.unwrap();
    // The provider has forgotten the key: a send now could charge again.
    env.past_the_window().await;
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert_eq!(provider.sends(), 1, "sent past the window");
    assert_eq!(provider.charges().len(), 1);
}

async fn past_the_window_no_match_or_two_matches_need_review<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, _) = env.setup(store);
    let provider = env.forgetful();
    // Nothing found: the only send was rate limited, then the window passed.
    let none = operation("charge");
    recorded(&journal, &none).await;
    provider.then(Fault::RateLimit);
    let first = journal.execute(&none, &provider).await.unwrap();
    assert_eq!(
        first.state(),
        OperationState::Pending,
        "a rate limit settles nothing"
    );
    // Two found: a lost response, then a duplicate charge made by hand.
    let two = operation("charge");
    recorded(&journal, &two).await;
    provider.then(Fault::LoseResponse);
    let lost = journal.execute(&two, &provider).await.unwrap();
    provider.charge_by_hand(&lost);
    env.past_the_window().await;
    let reviewed = journal.execute(&none, &provider).await.unwrap();
    assert_eq!(reviewed.state(), OperationState::NeedsReview);
    let reviewed = journal.execute(&two, &provider).await.unwrap();
    assert_eq!(reviewed.state(), OperationState::NeedsReview);
    assert!(
        reviewed
            .parts()
            .detail
            .as_deref()
            .unwrap()
            .starts_with("2 effects found")
    );
    // An operator lists them and settles one by hand; it stays settled.
    let waiting: Vec<_> = journal
        .needs_review(100)
        .await
        .unwrap()
        .into_iter()
        .map(|op| op.id().clone())
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
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert!(matches!(
        journal
            .settle(&two, OperationState::Failed, None, "oops")
            .await,
        Err(JournalError::Settled { .. })
    ));
}

/// A search that lags past the window finds the charge on a later pass:
/// an operation parked because nothing was found is searched again for the
/// search period, then rests. The case waits out nine windows in all, each
/// wait as short as its sentence allows (a window fitted to a loaded
/// emulator was 38 s: thirteen took 516 s of the 600 s a test may run).
async fn a_lagging_search_is_made_again_until_it_finds_the_effect<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, _) = env.setup(store);
    let w = env.short_window;
    let journal = journal.with_search_period(w * 3);
    let mut provider = env.forgetful();
    // The search sees a charge only a while after it was made: not yet
    // when the operation is parked, a window and a half after the charge.
    provider.search_lag = w * 3;
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    journal.execute(&id, &provider).await.unwrap();
    env.past_the_window().await;
    let parked = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(parked.state(), OperationState::NeedsReview);
    assert!(parked.parts().search_until.is_some(), "{parked:?}");
    // Past the lag (three and a half windows after the charge), within
    // the period (two of its three windows).
    env.time.pass(w * 2).await;
    let report = journal
        .reconcile(&provider, Duration::ZERO, 100, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        report
            .steps
            .contains(&(id.clone(), Step::Settled(OperationState::Succeeded))),
        "{report:?}"
    );
    assert_eq!(provider.sends(), 1, "sent past the window");
    // One that is never found rests once its period is over.
    let lost = operation("charge");
    recorded(&journal, &lost).await;
    provider.then(Fault::RateLimit);
    journal.execute(&lost, &provider).await.unwrap();
    env.past_the_window().await;
    assert_eq!(
        journal.execute(&lost, &provider).await.unwrap().state(),
        OperationState::NeedsReview
    );
    // Past its period, by a window.
    env.time.pass(w * 4).await;
    journal
        .reconcile(&provider, Duration::ZERO, 100, Duration::ZERO)
        .await
        .unwrap();
    let rests = journal
        .reconcile(&provider, Duration::ZERO, 100, Duration::ZERO)
        .await
        .unwrap();
    assert!(!rests.steps.iter().any(|(op, _)| op == &lost), "{rests:?}");
}

async fn a_crash_between_the_attempt_record_and_the_send_converges_once<
    S: JournalStore + ?Sized,
>(
    store: Arc<S>,
    env: Env,
) {
    crash_and_take_over(store, env, Fault::HangBeforeCharge).await;
}

async fn a_crash_between_the_send_and_its_result_converges_once<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    crash_and_take_over(store, env, Fault::HangAfterCharge).await;
}

/// An executor dies at `fault`; after its lease another takes over.
async fn crash_and_take_over<S: JournalStore + ?Sized>(store: Arc<S>, env: Env, fault: Fault) {
    let (journal, provider) = env.setup(store);
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
        (op.parts().sends == 1 && provider.sends() == 1).then_some(())
    })
    .await;
    crashing.abort();
    match journal.execute(&id, &provider).await {
        Err(JournalError::Busy { retry_after, .. }) => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= env.lease,
                "{retry_after:?}"
            );
        }
        other => panic!("the crashed executor's lease should hold: {other:?}"),
    }
    let lease = journal.get(&id).await.unwrap().unwrap().parts().lease_until;
    assert!(lease.is_some(), "the lease is visible on the operation");
    env.time.pass(env.lease + Duration::from_millis(500)).await;
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert_eq!(provider.charges().len(), 1, "one effect");
}

async fn concurrent_executors_send_once<S: JournalStore + ?Sized>(store: Arc<S>, env: Env) {
    let (journal, provider) = env.setup(store);
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
            Ok(_) | Err(JournalError::Busy { .. }) => {}
            Err(other) => panic!("an executor failed: {other:?}"),
        }
    }
    assert_eq!(provider.sends(), 1);
    assert_eq!(provider.charges().len(), 1);
}

async fn settled_states_never_change_and_never_call_the_provider<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, provider) = env.setup(store);
    let declined = operation("charge");
    recorded(&journal, &declined).await;
    provider.then(Fault::Decline);
    assert_eq!(
        journal.execute(&declined, &provider).await.unwrap().state(),
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
        .record(&charged, json!({"amount": 1000}))
        .await
        .unwrap();
    assert_eq!(again.state(), OperationState::Succeeded);
    assert!(matches!(
        journal.record(&charged, json!({"amount": 5})).await,
        Err(JournalError::Mismatch(_))
    ));
}

/// An operator cannot settle an operation an executor holds mid-send.
async fn settling_by_hand_waits_for_the_executor_holding_it<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, provider) = env.setup(store);
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::HangAfterCharge);
    let sending = {
        let (journal, provider, id) = (journal.clone(), provider.clone(), id.clone());
        tokio::spawn(async move { journal.execute(&id, &provider).await })
    };
    idem_conformance::support::eventually("the send under way", || async {
        (provider.sends() == 1).then_some(())
    })
    .await;
    match journal
        .settle(&id, OperationState::Failed, None, "looks stuck")
        .await
    {
        Err(JournalError::Busy { retry_after, .. }) => assert!(retry_after <= env.lease),
        other => panic!("settled under an executor's live lease: {other:?}"),
    }
    sending.abort();
    env.time.pass(env.lease + Duration::from_millis(500)).await;
    // Once its lease is over the operator may, and the journal says what
    // the provider did when an executor looks again first.
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert_eq!(provider.charges().len(), 1);
}

async fn the_reconciler_drives_old_open_operations_in_bounded_batches<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, provider) = env.setup(store);
    let ids: Vec<_> = (0..3).map(|_| operation("charge")).collect();
    for id in &ids {
        recorded(&journal, id).await;
        provider.then(Fault::LoseResponse);
        journal.execute(id, &provider).await.unwrap();
    }
    // Fresh ones are left alone: the caller may still be on them.
    let report = journal
        .reconcile(&provider, Duration::from_secs(3600), 100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(report.examined(), 0, "{report:?}");
    let first = journal
        .reconcile(&provider, Duration::ZERO, 2, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(first.examined(), 2, "the batch bound");
    // One settled meanwhile by someone else is reported, not an error.
    journal.execute(&ids[2], &provider).await.unwrap();
    let rest = journal
        .reconcile(&provider, Duration::ZERO, 100, Duration::ZERO)
        .await
        .unwrap();
    assert!(
        rest.steps
            .iter()
            .all(|(_, step)| matches!(step, Step::Settled(_))),
        "{rest:?}"
    );
    for id in &ids {
        let op = journal.get(id).await.unwrap().unwrap();
        assert_eq!(op.state(), OperationState::Succeeded, "{id}");
    }
    assert_eq!(provider.charges().len(), 3);
    for batch in [0, usize::MAX] {
        assert!(matches!(
            journal
                .reconcile(&provider, Duration::ZERO, batch, Duration::ZERO)
                .await,
            Err(JournalError::InvalidInput(_))
        ));
        assert!(matches!(
            journal.needs_review(batch).await,
            Err(JournalError::InvalidInput(_))
        ));
    }
}

/// Two journals (two tenants, two services) record one identity with two
/// requests: two keys, two charges, each journal on its own.
async fn two_namespaces_never_send_one_key<S: JournalStore + ?Sized>(store: Arc<S>, env: Env) {
    let (tenant_a, provider) = env.setup(Arc::clone(&store));
    let (tenant_b, _) = env.setup(store);
    let id = OperationId::new(&format!("order-{}", uuid::Uuid::new_v4()), "charge").unwrap();
    let a = tenant_a.record(&id, json!({"amount": 1000})).await.unwrap();
    let b = tenant_b.record(&id, json!({"amount": 2500})).await.unwrap();
    assert_ne!(a.provider_key(), b.provider_key());
    let a = tenant_a.execute(&id, &provider).await.unwrap();
    let b = tenant_b.execute(&id, &provider).await.unwrap();
    assert_eq!(
        (a.state(), b.state()),
        (OperationState::Succeeded, OperationState::Succeeded)
    );
    assert_ne!(
        a.parts().provider_id,
        b.parts().provider_id,
        "B settled on A's charge"
    );
    assert_eq!(provider.charges().len(), 2);
}

/// A store recreated after a reset: the same namespace and identity get a
/// new key, never the old store's charge.
async fn a_recreated_store_never_reuses_a_key<S: JournalStore + ?Sized>(
    store: Arc<S>,
    fresh: Arc<S>,
    env: Env,
) {
    let (before, provider) = env.setup(store);
    let after = Journal::new(fresh, before.namespace().as_str())
        .unwrap()
        .with_lease(env.lease)
        .unwrap();
    let id = operation("charge");
    before.record(&id, json!({"amount": 1000})).await.unwrap();
    before.execute(&id, &provider).await.unwrap();
    after.record(&id, json!({"amount": 4000})).await.unwrap();
    let charged = after.execute(&id, &provider).await.unwrap();
    assert_eq!(charged.state(), OperationState::Succeeded, "{charged:?}");
    assert_eq!(provider.charges().len(), 2);
}

/// A key the provider refuses as reused with other parameters goes to
/// review with the reason, and is never sent again.
async fn a_key_refused_as_reused_goes_to_review<S: JournalStore + ?Sized>(store: Arc<S>, env: Env) {
    let (journal, provider) = env.setup(Arc::clone(&store));
    let id = operation("charge");
    let first = journal.record(&id, json!({"amount": 1000})).await.unwrap();
    // Someone else sent this very key with another request first.
    let other = journal
        .store()
        .record(&idem_core::store::NewOperation::from_stored(
            journal.key(&operation("charge")),
            json!({"amount": 9}),
            first.provider_key().to_string(),
        ))
        .await
        .unwrap();
    idem_journal::Provider::send(&provider, &other).await;
    let reviewed = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(reviewed.state(), OperationState::NeedsReview);
    assert!(
        reviewed
            .parts()
            .detail
            .as_deref()
            .unwrap()
            .contains("reused"),
        "{reviewed:?}"
    );
    assert_eq!(
        journal.execute(&id, &provider).await.unwrap().parts().sends,
        1
    );
    assert_eq!(provider.sends(), 2, "sent again after the refusal");
}

/// Without idempotency keys, at most once: a send whose outcome is unknown
/// is never repeated; it goes to review.
async fn at_most_once_never_resends_an_unknown_send<S: JournalStore + ?Sized>(
    store: Arc<S>,
    env: Env,
) {
    let (journal, mut provider) = env.setup(store);
    provider.delivery = Some(Delivery::AtMostOnce);
    let id = operation("notify");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    let first = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(first.state(), OperationState::NeedsReview, "{first:?}");
    assert_eq!(
        journal.execute(&id, &provider).await.unwrap().parts().sends,
        1
    );
    // A crash after the send was counted leaves it to a person, too.
    let crashed = operation("notify");
    recorded(&journal, &crashed).await;
    provider.then(Fault::HangAfterCharge);
    let sending = {
        let (journal, provider, id) = (journal.clone(), provider.clone(), crashed.clone());
        tokio::spawn(async move { journal.execute(&id, &provider).await })
    };
    idem_conformance::support::eventually("the send", || async {
        (provider.sends() == 2).then_some(())
    })
    .await;
    sending.abort();
    env.time.pass(env.lease + Duration::from_millis(500)).await;
    let after = journal.execute(&crashed, &provider).await.unwrap();
    assert_eq!(after.state(), OperationState::NeedsReview);
    assert_eq!(provider.sends(), 2, "resent at most once");
}

macro_rules! journal_tests {
    ($name:ident, $env:expr, $make:ident) => {
        journal_tests!($name, $env, $make, [
            a_lost_response_then_a_retry_gives_one_effect_and_succeeded,
            processing_then_retrieve_settles_without_resending,
            past_the_key_window_find_settles_it_without_a_send,
            past_the_window_no_match_or_two_matches_need_review,
            a_lagging_search_is_made_again_until_it_finds_the_effect,
            a_crash_between_the_attempt_record_and_the_send_converges_once,
            a_crash_between_the_send_and_its_result_converges_once,
            concurrent_executors_send_once,
            settled_states_never_change_and_never_call_the_provider,
            settling_by_hand_waits_for_the_executor_holding_it,
            the_reconciler_drives_old_open_operations_in_bounded_batches,
            two_namespaces_never_send_one_key,
            a_key_refused_as_reused_goes_to_review,
            at_most_once_never_resends_an_unknown_send,
        ]);
    };
    ($name:ident, $env:expr, $make:ident, [$($case:ident),* $(,)?]) => {
        mod $name {
            use super::*;

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let env = $env;
                    let store = super::$make(&env).await;
                    let env = env.fitted(&store).await;
                    super::$case(store, env).await;
                }
            )*

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_recreated_store_never_reuses_a_key() {
                let env = $env;
                let (before, after) = (super::$make(&env).await, super::$make(&env).await);
                let env = env.fitted(&before).await;
                super::a_recreated_store_never_reuses_a_key(before, after, env).await;
            }
        }
    };
}

async fn memory(env: &Env) -> Arc<idem_memory::MemoryJournal> {
    let Time::Manual(clock) = &env.time else {
        panic!("the memory journal runs on a manual clock here");
    };
    Arc::new(idem_memory::MemoryJournal::with_clock(clock.clone()))
}

journal_tests!(memory, Env::manual(), memory);

fn env_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/test sets it)"))
}

async fn postgres_pool() -> idem_postgres::sqlx::PgPool {
    idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&env_var("IDEM_POSTGRES_URL"))
        .await
        .expect("connect to IDEM_POSTGRES_URL")
}

/// A table of the test's own: the reconciler lists a namespace, and a
/// recreated store is a table of its own.
async fn postgres(_: &Env) -> Arc<idem_postgres::PostgresJournal> {
    let table = format!(
        "journal_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    );
    let options = idem_postgres::PostgresJournalOptions::default().table(&table);
    let store =
        idem_postgres::PostgresJournal::with_options(postgres_pool().await, options).unwrap();
    store.migrate().await.unwrap();
    Arc::new(store)
}

async fn redis(_: &Env) -> Arc<idem_redis::RedisJournal> {
    let client = idem_redis::redis::Client::open(env_var("IDEM_REDIS_URL")).unwrap();
    let conn = idem_redis::redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect to IDEM_REDIS_URL");
    let prefix = format!("journal-{}", uuid::Uuid::new_v4().simple());
    let options = idem_redis::RedisJournalOptions::default().prefix(&prefix);
    Arc::new(idem_redis::RedisJournal::with_options(conn, options).unwrap())
}

async fn dynamo(_: &Env) -> Arc<idem_dynamo::DynamoJournal> {
    use idem_dynamo::aws_sdk_dynamodb::config::{Credentials, Region};
    let config = idem_dynamo::aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .endpoint_url(
            idem_conformance::support::dynamo_endpoint().unwrap_or_else(|| {
                panic!("IDEM_DYNAMO_ENDPOINT is not set (scripts/test sets it)")
            }),
        )
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .build();
    let client = idem_dynamo::aws_sdk_dynamodb::Client::from_conf(config);
    // moto serves one request at a time: generous limits.
    let shared = idem_core::StoreOptions::default().with_operation_timeout(Duration::from_secs(20));
    let table = format!("journal-{}", uuid::Uuid::new_v4().simple());
    let options = idem_dynamo::DynamoJournalOptions::default()
        .table(&table)
        .store_options(shared);
    let store = idem_dynamo::DynamoJournal::with_options(client, options).unwrap();
    store.create_table().await.unwrap();
    Arc::new(store)
}

journal_tests!(postgres, Env::real(), postgres);
journal_tests!(redis, Env::real(), redis);
journal_tests!(dynamo, Env::emulated(), dynamo);

/// An executor whose clock is hours behind cannot resend past the window:
/// the journal reads no clock of its own, and the server's says the first
/// send was 25 hours ago.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_clock_judges_the_window_whatever_an_executors_clock_says() {
    use idem_postgres::sqlx::{self, AssertSqlSafe};
    let env = Env::real();
    let store = postgres(&env).await;
    let (journal, mut provider) = env.setup(Arc::clone(&store));
    provider.search_lag = Duration::ZERO;
    let id = operation("charge");
    recorded(&journal, &id).await;
    provider.then(Fault::LoseResponse);
    journal.execute(&id, &provider).await.unwrap();
    // By the server's clock the first send is now 25 hours old.
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {} SET first_sent_at = first_sent_at - $1 WHERE namespace = $2",
        store.table()
    )))
    .bind(25 * 3_600_000_i64)
    .bind(journal.namespace().as_str())
    .execute(store.pool())
    .await
    .unwrap();
    let settled = journal.execute(&id, &provider).await.unwrap();
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert_eq!(provider.sends(), 1, "resent past the server's window");
    assert_eq!(settled.parts().sends, 1);
}

/// On Postgres the operation can be recorded inside the business
/// transaction: the order and its charge commit, or vanish, together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_recorded_in_a_business_transaction_commits_with_it() {
    use idem_postgres::sqlx::{self, AssertSqlSafe};
    let env = Env::real();
    let store = postgres(&env).await;
    let pool = store.pool().clone();
    let (journal, provider) = env.setup(Arc::clone(&store));
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
        let new = journal.new_operation(&id, json!({"amount": 1000}));
        let stored = store.record_in(&mut tx, &new).await.unwrap();
        journal.recorded(&new, stored).unwrap();
        if commit {
            tx.commit().await.unwrap();
            let charged = journal.execute(&id, &provider).await.unwrap();
            assert_eq!(charged.state(), OperationState::Succeeded);
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
