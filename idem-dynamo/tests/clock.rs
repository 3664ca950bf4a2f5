//! The service's clock: DynamoDB parts judge by DynamoDB's time, read from
//! its responses, so two callers whose own clocks are hours apart (test
//! clocks moving with real time from either side of it) never take each
//! other's leases early; on the callers' own clocks, the same two do.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::support::SkewedClock;
use idem_core::store::{
    Acquired, ClaimOutcome, ClaimRequest, Clock, IdempotencyStore, JournalStore, NewOperation,
    OperationId, OperationKey, OutboxStore, OwnerToken, PartitionLease, SystemClock,
};
use idem_core::{Fingerprint, Scope, Tenant};
use idem_dynamo::{DynamoJournalOptions, DynamoOptions, DynamoOutboxOptions, ServiceClock};
use serde_json::json;

/// How far apart the two callers' clocks are: each is this far from the
/// true time, one ahead and one behind.
const APART: Duration = Duration::from_secs(3600);

fn behind() -> SkewedClock {
    SkewedClock::behind(APART)
}

fn ahead() -> SkewedClock {
    SkewedClock::ahead(APART)
}

fn fresh_table(part: &str) -> String {
    format!(
        "clock-{part}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The gap between two clocks' readings now, either way.
fn apart(a: &impl Clock, b: &impl Clock) -> Duration {
    let (a, b) = (a.now(), b.now());
    a.saturating_duration_since(b)
        .max(b.saturating_duration_since(a))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_an_hour_either_side_read_one_time_within_a_few_seconds() {
    let table = fresh_table("records");
    let (early, late) = (
        ServiceClock::on_base(behind()),
        ServiceClock::on_base(ahead()),
    );
    assert!(apart(&early, &late) >= APART * 2 - Duration::from_secs(1));
    // Each clock lags the service by under a second (the header's
    // precision) plus its response's time in transit: at most the time its
    // store's set-up took, measured.
    let mut slowest = Duration::ZERO;
    for clock in [&early, &late] {
        let started = std::time::Instant::now();
        let options = DynamoOptions::default().table(&table);
        common::store_with(options.service_clock(clock.clone())).await;
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        early.is_synced() && late.is_synced(),
        "creating a table read the time"
    );
    let bound = Duration::from_secs(1) + slowest + Duration::from_millis(100);
    assert!(
        apart(&early, &late) < bound,
        "{:?} apart",
        apart(&early, &late)
    );
    // moto runs on this machine: its time is the system's.
    assert!(apart(&early, &SystemClock) < bound);
}

/// A record claimed by the caller an hour behind is not taken over by the
/// caller an hour ahead while its lease lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_hours_ahead_never_takes_a_live_claim_on_the_service_clock() {
    let table = fresh_table("claims");
    let early = common::store_with(
        DynamoOptions::default()
            .table(&table)
            .service_clock(ServiceClock::on_base(behind())),
    )
    .await;
    let late = common::store_with(
        DynamoOptions::default()
            .table(&table)
            .service_clock(ServiceClock::on_base(ahead())),
    )
    .await;
    let (first, second) = claim_twice(&early, &late).await;
    assert!(matches!(first, ClaimOutcome::Claimed { .. }), "{first:?}");
    assert!(
        matches!(second, ClaimOutcome::InProgress { .. }),
        "a live claim was taken over: {second:?}"
    );
}

/// The same two callers on their own clocks: the one ahead takes the claim
/// over at once, which is what the service's clock prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_callers_clocks_the_caller_ahead_takes_a_live_claim() {
    let table = fresh_table("claims-caller");
    let early = common::store_with(DynamoOptions::default().table(&table).clock(behind())).await;
    let late = common::store_with(DynamoOptions::default().table(&table).clock(ahead())).await;
    let (first, second) = claim_twice(&early, &late).await;
    assert!(matches!(first, ClaimOutcome::Claimed { .. }), "{first:?}");
    assert!(matches!(second, ClaimOutcome::Claimed { .. }), "{second:?}");
}

async fn claim_twice(
    first: &impl IdempotencyStore,
    second: &impl IdempotencyStore,
) -> (ClaimOutcome, ClaimOutcome) {
    let tenant = Tenant::new(format!("clock-{}", uuid::Uuid::new_v4())).unwrap();
    let scope = Scope::parse(tenant.as_str(), "order-1").unwrap();
    let request = ClaimRequest::new(scope, Fingerprint::of_bytes("pay 10"))
        .with_lease(Duration::from_secs(60))
        .unwrap();
    let a = first
        .claim(&request.clone().with_new_owner())
        .await
        .unwrap();
    let b = second.claim(&request.with_new_owner()).await.unwrap();
    (a, b)
}

/// A charge begun by the caller an hour behind: the caller an hour ahead
/// finds it held and sends nothing, so the card is charged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_operation_held_by_one_caller_is_busy_for_a_caller_hours_ahead() {
    let table = fresh_table("journal");
    let early = common::journal_with(
        DynamoJournalOptions::default()
            .table(&table)
            .service_clock(ServiceClock::on_base(behind())),
    )
    .await;
    let late = common::journal_with(
        DynamoJournalOptions::default()
            .table(&table)
            .service_clock(ServiceClock::on_base(ahead())),
    )
    .await;
    let second = acquire_twice(&early, &late).await;
    assert!(
        matches!(second, Acquired::Busy { .. }),
        "the caller ahead took the charge over: {second:?}"
    );
}

/// The same on the callers' own clocks: the caller ahead takes the charge
/// over at once and would send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_callers_clocks_the_caller_ahead_takes_a_held_charge_over() {
    let table = fresh_table("journal-caller");
    let early = common::journal_with(
        DynamoJournalOptions::default()
            .table(&table)
            .clock(behind()),
    )
    .await;
    let late =
        common::journal_with(DynamoJournalOptions::default().table(&table).clock(ahead())).await;
    let second = acquire_twice(&early, &late).await;
    assert!(matches!(second, Acquired::Held { .. }), "{second:?}");
}

/// Records a charge and acquires it on `first` for a minute, then on
/// `second`: what the second acquire answered.
async fn acquire_twice(first: &impl JournalStore, second: &impl JournalStore) -> Acquired {
    let namespace = Tenant::new(format!("clock-{}", uuid::Uuid::new_v4())).unwrap();
    let key = OperationKey::new(namespace, OperationId::new("order-1", "charge").unwrap());
    first
        .record(&NewOperation::new(key.clone(), json!({ "amount": 1000 })))
        .await
        .unwrap();
    let lease = Duration::from_secs(60);
    let held = first
        .acquire(key.held_by(OwnerToken::generate()), lease)
        .await
        .unwrap();
    assert!(matches!(held, Acquired::Held { .. }), "{held:?}");
    second
        .acquire(key.held_by(OwnerToken::generate()), lease)
        .await
        .unwrap()
}

/// A partition held by the relay an hour behind is not taken by the relay
/// an hour ahead while its lease lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_hours_ahead_never_takes_a_held_partition_on_the_service_clock() {
    let table = fresh_table("outbox");
    let on = |clock: SkewedClock| {
        DynamoOutboxOptions::default()
            .table(&table)
            .partitions(1)
            .service_clock(ServiceClock::on_base(clock))
    };
    let early = common::outbox_with(on(behind())).await;
    let late = common::outbox_with(on(ahead())).await;
    let (first, second) = take_partition_twice(&early, &late).await;
    assert!(first.is_some(), "the only partition was free");
    assert!(second.is_none(), "a held partition was taken: {second:?}");
}

/// The same two relays on their own clocks: the one ahead takes the
/// partition at once, which is what the service's clock prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_callers_clocks_the_relay_ahead_takes_a_held_partition() {
    let table = fresh_table("outbox-caller");
    let on = |clock: SkewedClock| {
        DynamoOutboxOptions::default()
            .table(&table)
            .partitions(1)
            .clock(clock)
    };
    let early = common::outbox_with(on(behind())).await;
    let late = common::outbox_with(on(ahead())).await;
    let (first, second) = take_partition_twice(&early, &late).await;
    assert!(first.is_some(), "the only partition was free");
    assert!(second.is_some(), "the lease lapsed by the clock ahead");
}

async fn take_partition_twice(
    first: &impl OutboxStore,
    second: &impl OutboxStore,
) -> (Option<PartitionLease>, Option<PartitionLease>) {
    let lease = Duration::from_secs(60);
    let held = first.acquire(OwnerToken::generate(), lease).await.unwrap();
    let taken = second.acquire(OwnerToken::generate(), lease).await.unwrap();
    (held, taken)
}
