//! # idem-conformance
//!
//! The behaviour suite every idem store passes. One `pub async fn` per
//! behaviour lives in [`cases`], generic over the store; the
//! [`conformance_suite!`] macro expands to one `#[test]` per case, named after
//! the behaviour, so a failing store shows exactly which sentence of the
//! contract it breaks.
//!
//! Run it against your own store from any test file, with no imports:
//!
//! ```ignore
//! // tests/conformance.rs
//! idem_conformance::conformance_suite!(async { my_crate::MyStore::connect("...").await.unwrap() });
//! ```
//!
//! The expression is evaluated once per case, inside that case's tokio
//! runtime (multi-threaded, so races are real). Every case works in a random
//! tenant of its own, so cases run in parallel against one server and never
//! wipe anything. Time-dependent cases use leases of a quarter second and
//! poll to a deadline; the whole suite takes a few seconds.
//!
//! [`all_cases`] lists the same cases as values, and [`failing_cases`] runs
//! them all, each on a fresh store as the macro does, and names those that
//! failed (this crate's own tests use it to prove that deliberately broken
//! stores fail).
#![doc = include_str!("../GUIDE.md")]
// A test suite reports failure by panicking, like `assert!`.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::store::{IdempotencyStore, JournalStore, OutboxStore, ParkingStore};

use crate::batches::BatchingStore;

pub mod batches;
pub mod cases;
pub mod consumers;
pub mod faults;
#[cfg(feature = "nats")]
pub mod jetstream;
pub mod journal;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod outbox;
pub mod parking;
pub mod relays;
pub mod support;

/// The README's examples, compiled (and where they need no server, run) as
/// doctests, so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// A case boxed for a store type `S`.
pub type CaseFn<S> = fn(Arc<S>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// A case of two instances of one store, boxed for a store type `S`.
pub type PairCaseFn<S> = fn(Arc<S>, Arc<S>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs one case on a fresh multi-threaded runtime; what each generated test calls.
#[doc(hidden)]
pub fn __run_case<S, Make, Case, CaseFut>(make: Make, case: Case)
where
    S: Send + Sync + 'static,
    Make: Future<Output = S>,
    Case: FnOnce(Arc<S>) -> CaseFut,
    CaseFut: Future<Output = ()>,
{
    case_runtime().block_on(async move {
        let store = Arc::new(make.await);
        case(store).await;
    });
}

/// The runtime a case runs on: multi-threaded, so races are real.
fn case_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs one case of two instances, each built by its own evaluation of the
/// store's expression, on a fresh multi-threaded runtime.
#[doc(hidden)]
pub fn __run_pair_case<S, First, Second, Case, CaseFut>(first: First, second: Second, case: Case)
where
    S: Send + Sync + 'static,
    First: Future<Output = S>,
    Second: Future<Output = S>,
    Case: FnOnce(Arc<S>, Arc<S>) -> CaseFut,
    CaseFut: Future<Output = ()>,
{
    case_runtime().block_on(async move {
        let first = Arc::new(first.await);
        let second = Arc::new(second.await);
        case(first, second).await;
    });
}

/// Expands to one `#[test]` per conformance case, each building its store
/// with the given `async` expression.
///
/// ```ignore
/// mod memory {
///     idem_conformance::conformance_suite!(async { idem_memory::MemoryStore::new() });
/// }
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr $(,)?) => {
        $crate::__conformance_cases! { tests($make) }
        $crate::__conformance_pair_cases! { pair_tests($make) }
    };
}

/// Expands a list of cases of the module `$module` as tests or as values.
#[doc(hidden)]
#[macro_export]
macro_rules! __expand_cases {
    ($module:ident tests($make:expr) [$($case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                $crate::__run_case($make, $crate::$module::$case);
            }
        )*
    };
    ($module:ident pair_tests($make:expr) [$($case:ident),* $(,)?]) => {
        $(
            #[test]
            fn $case() {
                $crate::__run_pair_case($make, $make, $crate::$module::$case);
            }
        )*
    };
    ($module:ident pair_list() [$($case:ident),* $(,)?]) => {
        vec![$(
            (stringify!($case), {
                let case: $crate::PairCaseFn<S> =
                    |first, second| Box::pin($crate::$module::$case(first, second));
                case
            })
        ),*]
    };
    ($module:ident list() [$($case:ident),* $(,)?]) => {
        vec![$(
            (stringify!($case), {
                let case: $crate::CaseFn<S> = |store| Box::pin($crate::$module::$case(store));
                case
            })
        ),*]
    };
}

/// The one list of cases, expanded as tests or as a list of values.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($mode:ident $args:tt) => {
        $crate::__expand_cases! {cases $mode $args [
            absent_record_is_claimed_at_attempt_one,
            duplicate_while_lease_valid_is_in_progress,
            in_progress_waits_only_the_remaining_lease,
            other_fingerprint_while_in_flight_is_mismatch,
            expired_lease_is_taken_over_with_next_attempt,
            takeover_carries_the_checkpoint,
            other_fingerprint_on_expired_lease_is_mismatch,
            completed_record_replays_its_response,
            other_fingerprint_on_completed_record_is_mismatch,
            record_past_retention_is_claimed_afresh,
            record_past_retention_is_claimed_with_any_fingerprint,
            stale_owner_cannot_complete_after_takeover,
            stale_owner_cannot_renew_after_takeover,
            stale_owner_cannot_release_after_takeover,
            stale_owner_cannot_checkpoint_after_takeover,
            stale_owner_cannot_complete_even_with_the_new_owners_response,
            owner_with_expired_lease_can_still_complete,
            owner_with_expired_lease_can_still_renew_checkpoint_and_release,
            completed_record_cannot_be_completed_again,
            release_lets_the_next_claim_in_at_once,
            released_lease_cannot_complete,
            renew_extends_the_lease,
            renewal_counts_from_now_not_from_the_old_expiry,
            renewal_outside_the_lease_range_is_invalid_input,
            renewal_keeps_the_later_of_retention_and_the_new_lease,
            checkpoint_is_kept_on_the_record,
            checkpoint_after_completion_is_a_lost_lease,
            completion_drops_the_checkpoint,
            fenced_writes_past_retention_are_lost_leases,
            get_shows_in_flight_and_completed_records,
            completed_record_past_retention_counts_as_absent,
            claim_delivered_twice_gets_the_same_lease,
            claim_delivered_again_later_writes_nothing,
            own_claim_delivered_after_its_lease_expired_is_not_a_takeover,
            own_claim_delivered_again_answers_the_lease_as_it_stands_now,
            own_claim_delivered_after_its_lease_expired_keeps_the_checkpoint,
            takeover_delivered_twice_gets_the_same_attempt_and_checkpoint,
            completion_delivered_twice_succeeds_and_stores_once,
            completion_delivered_twice_keeps_the_first_retention,
            renewal_and_checkpoint_delivered_twice_succeed,
            renewal_and_checkpoint_delivered_after_the_expiry_moved_apply_again,
            release_delivered_twice_succeeds,
            purge_expired_removes_only_what_is_past_retention,
            completion_restarts_retention,
            completion_retains_for_the_retention_from_completion_alone,
            claims_and_takeovers_retain_the_record_from_their_own_moment,
            a_takeover_retains_for_its_lease_where_longer_than_the_retention,
            purge_keeps_an_in_flight_record_whose_lease_expired,
            tenants_never_share_a_record,
            separator_laden_scopes_never_collide,
            non_ascii_scopes_round_trip,
            deleted_completed_record_is_claimed_afresh,
            deleted_in_flight_record_fences_out_its_owner,
            delete_reports_whether_a_live_record_was_there,
            delete_leaves_every_other_scope_alone,
            delete_matches_the_key_exactly,
            now_reads_the_clock_that_judges_retention,
            store_name_is_one_short_lowercase_word,
            concurrent_claims_of_one_key_have_one_winner,
            concurrent_takeovers_of_an_expired_lease_have_one_winner,
            concurrent_claims_of_a_record_past_retention_have_one_winner,
            a_completion_racing_a_takeover_never_overwrites_the_new_owner,
            concurrent_retries_of_a_completed_key_all_replay,
            replay_is_byte_exact_for_binary_bodies_and_headers,
            empty_response_round_trips,
            response_at_the_advertised_maximum_is_stored_whole,
            response_over_the_maximum_is_refused_and_nothing_written,
            runner_executes_once_and_replays_retries,
            runner_refuses_a_concurrent_duplicate,
            runner_refuses_a_reused_key_with_another_payload,
            runner_releases_the_claim_when_nothing_started,
            runner_keeps_the_claim_when_the_handler_failed,
            runner_reports_a_lost_lease_instead_of_success,
            runner_gives_a_takeover_the_checkpoint_and_the_same_downstream_key,
            runner_auto_renewal_holds_the_key_past_the_lease,
        ]}
    };
}

/// The cases of two instances of one store, expanded as tests or as a
/// list of values.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_pair_cases {
    ($mode:ident $args:tt) => {
        $crate::__expand_cases! {cases $mode $args [
            every_instance_of_a_store_reports_one_name,
        ]}
    };
}

/// Every case of two instances of one store, with its name, boxed for
/// the store type `S`.
///
/// ```
/// let cases = idem_conformance::all_pair_cases::<idem_memory::MemoryStore>();
/// assert!(!cases.is_empty());
/// ```
pub fn all_pair_cases<S: IdempotencyStore + ?Sized>() -> Vec<(&'static str, PairCaseFn<S>)> {
    __conformance_pair_cases!(pair_list())
}

/// Every case with its name, boxed for the store type `S`.
///
/// ```
/// let cases = idem_conformance::all_cases::<idem_memory::MemoryStore>();
/// assert!(cases.len() >= 25);
/// ```
pub fn all_cases<S: IdempotencyStore + ?Sized>() -> Vec<(&'static str, CaseFn<S>)> {
    __conformance_cases!(list())
}

/// Runs every case concurrently, each against a fresh store from `make` (as
/// the macro's tests do) and within a time limit, and returns the names of
/// those that failed: for harnesses that want a verdict as a value rather
/// than one test per case.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let failed = idem_conformance::failing_cases(|| async { idem_memory::MemoryStore::new() }).await;
/// assert_eq!(failed, Vec::<&str>::new());
/// # });
/// ```
pub async fn failing_cases<S, F, Fut>(make: F) -> Vec<&'static str>
where
    S: IdempotencyStore,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let mut failed = failing_of(all_cases::<S>(), &make).await;
    let limit = support::DEADLINE * 3;
    let mut running = Vec::new();
    for (name, case) in all_pair_cases::<S>() {
        let work = case(Arc::new(make().await), Arc::new(make().await));
        running.push((name, tokio::spawn(tokio::time::timeout(limit, work))));
    }
    for (name, handle) in running {
        if !matches!(handle.await, Ok(Ok(()))) {
            failed.push(name);
        }
    }
    failed
}

/// Runs `cases` concurrently, each on a fresh store from `make` and within
/// a time limit; the names of those that failed.
async fn failing_of<S, F, Fut>(cases: Vec<(&'static str, CaseFn<S>)>, make: &F) -> Vec<&'static str>
where
    S: Send + Sync + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    let limit = support::DEADLINE * 3;
    let mut running = Vec::new();
    for (name, case) in cases {
        let work = case(Arc::new(make().await));
        running.push((name, tokio::spawn(tokio::time::timeout(limit, work))));
    }
    let mut failed = Vec::new();
    for (name, handle) in running {
        if !matches!(handle.await, Ok(Ok(()))) {
            failed.push(name);
        }
    }
    failed
}

/// Expands to one `#[test]` per case of the journal store's contract
/// ([`journal`]), each building its store with the given `async`
/// expression; every case works in a namespace of its own.
///
/// ```ignore
/// mod memory {
///     idem_conformance::journal_suite!(async { idem_memory::MemoryJournal::new() });
/// }
/// ```
#[macro_export]
macro_rules! journal_suite {
    ($make:expr $(,)?) => {
        $crate::__journal_cases! { tests($make) }
    };
}

/// The one list of journal cases, expanded as tests or as a list of values.
#[doc(hidden)]
#[macro_export]
macro_rules! __journal_cases {
    ($mode:ident $args:tt) => {
        $crate::__expand_cases! {journal $mode $args [
            record_stores_a_new_operation_pending_and_unsent,
            record_of_an_existing_key_returns_the_first_unchanged,
            namespaces_never_share_an_operation,
            acquire_of_an_absent_operation_is_absent,
            acquire_leases_an_open_operation_to_one_owner,
            busy_carries_the_time_left_on_the_holders_lease,
            a_lapsed_lease_is_taken_over,
            the_holder_acquiring_again_keeps_it_with_its_lease_moved,
            a_settled_operation_is_never_leased_again,
            a_lease_out_of_range_is_invalid_input,
            concurrent_acquisitions_have_one_holder,
            mark_sent_without_the_lease_is_lost_and_counts_nothing,
            mark_sent_counts_a_send_and_the_first_starts_the_window,
            mark_sent_delivered_twice_counts_once,
            mark_sent_of_another_count_is_lost_and_counts_nothing,
            finish_without_the_lease_is_lost_and_writes_nothing,
            a_taken_over_owner_cannot_finish_or_send,
            finish_writes_the_outcome_and_releases_the_lease,
            finish_keeps_the_provider_id_and_writes_the_search_deadline,
            finish_delivered_twice_answers_as_the_first,
            a_settled_state_never_changes,
            list_gives_the_states_asked_oldest_change_first,
            list_gives_only_what_is_older_than_asked,
            list_limit_out_of_range_is_invalid_input,
            times_are_the_stores_clock,
            updated_at_never_moves_back,
            journal_store_name_is_one_short_lowercase_word,
        ]}
    };
}

/// Every journal case with its name, boxed for the store type `S`.
///
/// ```
/// let cases = idem_conformance::all_journal_cases::<idem_memory::MemoryJournal>();
/// assert!(cases.len() >= 20);
/// ```
pub fn all_journal_cases<S: JournalStore + ?Sized>() -> Vec<(&'static str, CaseFn<S>)> {
    __journal_cases!(list())
}

/// Runs every journal case concurrently, each against a fresh store from
/// `make` and within a time limit, and returns the names of those that
/// failed.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let failed = idem_conformance::failing_journal_cases(|| async { idem_memory::MemoryJournal::new() }).await;
/// assert_eq!(failed, Vec::<&str>::new());
/// # });
/// ```
pub async fn failing_journal_cases<S, F, Fut>(make: F) -> Vec<&'static str>
where
    S: JournalStore,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    failing_of(all_journal_cases::<S>(), &make).await
}

/// Expands to one `#[test]` per case of the outbox store's contract
/// ([`outbox`]). A read or an acquire sees the whole outbox, so the expression must
/// build an empty store of the case's own (a fresh table, a fresh process
/// store) each time it is evaluated.
///
/// ```ignore
/// mod memory {
///     idem_conformance::outbox_suite!(async { idem_memory::MemoryOutbox::new() });
/// }
/// ```
#[macro_export]
macro_rules! outbox_suite {
    ($make:expr $(,)?) => {
        $crate::__outbox_cases! { tests($make) }
    };
}

/// The one list of outbox cases, expanded as tests or as a list of values.
#[doc(hidden)]
#[macro_export]
macro_rules! __outbox_cases {
    ($mode:ident $args:tt) => {
        $crate::__expand_cases! {outbox $mode $args [
            enqueue_stores_a_pending_message_with_its_aggregates_next_sequence,
            a_message_lands_in_its_aggregates_partition,
            enqueue_delivered_twice_stores_once,
            an_aggregates_sequence_keeps_counting_after_a_purge,
            a_read_answers_the_log_after_a_position_in_order,
            a_read_names_the_blocked_aggregates_and_skips_the_lane,
            a_read_starts_after_the_position_asked_not_the_cursor,
            a_reader_racing_enqueues_skips_none,
            a_parked_message_blocks_its_aggregate_in_a_read_until_dropped,
            acquire_takes_the_lowest_free_partition,
            a_lapsed_partition_is_acquired_again_at_its_cursor,
            a_lease_under_a_second_holds_for_its_length,
            a_release_frees_the_partition_at_once_keeping_its_cursor,
            an_advance_moves_the_cursor_never_back,
            a_taken_over_relay_advances_nothing,
            a_lapsed_owner_advances_nothing_even_unclaimed,
            an_advance_renews_the_lease,
            a_failed_message_waits_its_back_off_in_the_lane,
            the_last_failure_parks_the_message_and_its_aggregate_only,
            held_messages_follow_their_aggregates_first,
            an_advance_delivered_twice_changes_nothing_more,
            a_hold_or_a_send_changes_only_a_message_in_its_place,
            an_advance_and_read_reads_the_log_as_the_advance_left_it,
            a_lost_lease_advances_and_reads_nothing,
            due_takes_each_aggregates_first_oldest_first,
            a_retried_message_waits_again_with_no_attempts,
            a_retried_message_keeps_its_place_in_its_aggregate,
            a_retried_message_keeps_its_last_error_and_is_due_at_once,
            a_dropped_message_keeps_its_reason_and_frees_its_aggregate,
            only_a_parked_message_is_retried_or_dropped,
            parked_messages_are_listed_oldest_first_in_pages,
            parked_messages_of_one_enqueue_time_page_by_id,
            purge_deletes_only_sent_messages_at_least_as_old_as_asked,
            purge_deletes_up_to_its_limit,
            a_dropped_message_is_purged_aged_from_its_drop,
            stats_count_each_partitions_backlog,
            a_lapsed_lease_has_no_holder_in_the_stats,
            stats_age_only_the_pending_backlog,
            limits_out_of_range_are_invalid_input,
            concurrent_acquires_never_share_a_partition,
        ]}
    };
}

/// Every outbox case with its name, boxed for the store type `S`.
///
/// ```
/// let cases = idem_conformance::all_outbox_cases::<idem_memory::MemoryOutbox>();
/// assert!(cases.len() >= 15);
/// ```
pub fn all_outbox_cases<S: OutboxStore + ?Sized>() -> Vec<(&'static str, CaseFn<S>)> {
    __outbox_cases!(list())
}

/// Runs every outbox case concurrently, each against a fresh store from
/// `make` and within a time limit, and returns the names of those that
/// failed.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let failed = idem_conformance::failing_outbox_cases(|| async { idem_memory::MemoryOutbox::new() }).await;
/// assert_eq!(failed, Vec::<&str>::new());
/// # });
/// ```
pub async fn failing_outbox_cases<S, F, Fut>(make: F) -> Vec<&'static str>
where
    S: OutboxStore,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    failing_of(all_outbox_cases::<S>(), &make).await
}

/// Expands to one `#[test]` per case of the parking store's contract
/// ([`parking`]). A purge sees every consumer's entries, so the expression
/// must build an empty store of the case's own (a fresh table, a fresh
/// process store) each time it is evaluated.
///
/// ```ignore
/// mod memory {
///     idem_conformance::parking_suite!(async { idem_memory::MemoryParking::new() });
/// }
/// ```
#[macro_export]
macro_rules! parking_suite {
    ($make:expr $(,)?) => {
        $crate::__parking_cases! { tests($make) }
    };
}

/// The one list of parking cases, expanded as tests or as a list of values.
#[doc(hidden)]
#[macro_export]
macro_rules! __parking_cases {
    ($mode:ident $args:tt) => {
        $crate::__expand_cases! {parking $mode $args [
            park_keeps_the_message_its_reason_and_deliveries,
            parking_a_message_again_keeps_one_entry_with_the_new_reason,
            parking_a_message_again_moves_it_after_those_parked_since,
            a_dropped_park_leaves_the_entry_whole,
            get_reads_an_entry_in_any_state_and_nothing_else,
            list_gives_the_consumers_parked_entries_oldest_first,
            list_of_an_aggregate_orders_it_by_version,
            list_holds_at_most_its_limit,
            resolve_settles_a_parked_entry_once,
            purge_deletes_only_resolved_entries_older_than_asked,
            purge_deletes_up_to_its_limit,
            count_counts_a_consumers_parked_entries,
            parking_limits_out_of_range_are_invalid_input,
        ]}
    };
}

/// Every parking case with its name, boxed for the store type `S`.
///
/// ```
/// let cases = idem_conformance::all_parking_cases::<idem_memory::MemoryParking>();
/// assert!(cases.len() >= 10);
/// ```
pub fn all_parking_cases<S: ParkingStore + ?Sized>() -> Vec<(&'static str, CaseFn<S>)> {
    __parking_cases!(list())
}

/// Runs every parking case concurrently, each against a fresh store from
/// `make` and within a time limit, and returns the names of those that
/// failed.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let failed = idem_conformance::failing_parking_cases(|| async { idem_memory::MemoryParking::new() }).await;
/// assert_eq!(failed, Vec::<&str>::new());
/// # });
/// ```
pub async fn failing_parking_cases<S, F, Fut>(make: F) -> Vec<&'static str>
where
    S: ParkingStore,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    failing_of(all_parking_cases::<S>(), &make).await
}

/// Expands to one `#[test]` per case of a record store's transactions
/// that batch ([`batches`]: a claim inside a transaction, many claims and
/// completions at once, savepoints), each
/// building its [`BatchingStore`] with the given `async` expression; every
/// case works in scopes of its own.
///
/// ```ignore
/// mod batches {
///     idem_conformance::batch_suite!(async {
///         let store = my_crate::MyStore::connect("...").await.unwrap();
///         idem_conformance::batches::Batching::new(store, |store| store.clone().begin_owned())
///     });
/// }
/// ```
#[macro_export]
macro_rules! batch_suite {
    ($make:expr $(,)?) => {
        $crate::__batch_cases! { tests($make) }
    };
}

/// The one list of batch cases, expanded as tests or as a list of values.
#[doc(hidden)]
#[macro_export]
macro_rules! __batch_cases {
    ($mode:ident $args:tt) => {
        $crate::__expand_cases! {batches $mode $args [
            a_claim_in_a_transaction_is_decided_as_the_stores_claim,
            a_claim_in_a_transaction_takes_effect_only_if_it_commits,
            two_transactions_claiming_one_scope_never_both_apply,
            within_one_transaction_a_scope_claimed_and_completed_answers_completed,
            within_one_transaction_a_claim_delivered_again_answers_as_the_first,
            a_rollback_to_a_savepoint_undoes_only_what_was_written_since,
            savepoints_nest_and_each_operation_names_the_latest_open,
            a_released_savepoint_keeps_what_was_written_since,
            a_released_savepoint_is_closed,
            claiming_all_at_once_answers_as_claiming_each_in_turn,
            completing_all_at_once_completes_each_when_the_transaction_commits,
            a_holders_own_renewal_while_its_write_waits_in_a_transaction_keeps_the_commit,
            a_completion_in_a_transaction_is_never_replaced_by_a_second,
            a_lease_completed_elsewhere_before_the_commit_refuses_the_commit,
            claiming_and_completing_all_at_once_records_each_free_scope_with_the_response,
            claiming_and_completing_all_at_once_takes_effect_only_if_it_commits,
            claiming_and_completing_all_at_once_refuses_a_scope_twice,
        ]}
    };
}

/// Every batch case with its name, boxed for the [`BatchingStore`] `S`.
///
/// ```
/// use idem_conformance::batches::Batching;
/// # use idem_core::store::{Lease, Transaction};
/// # use idem_core::{Checkpoint, StoreError, StoredResponse, async_trait};
/// # struct Tx;
/// # #[async_trait]
/// # impl Transaction for Tx {
/// #     async fn complete(&mut self, _: &Lease, _: &StoredResponse) -> Result<(), StoreError> { Ok(()) }
/// #     async fn checkpoint(&mut self, _: &Lease, _: &Checkpoint) -> Result<(), StoreError> { Ok(()) }
/// #     async fn commit(self) -> Result<(), StoreError> { Ok(()) }
/// # }
///
/// let cases = idem_conformance::all_batch_cases::<Batching<idem_memory::MemoryStore, Tx>>();
/// assert!(cases.len() >= 7);
/// ```
pub fn all_batch_cases<S: BatchingStore>() -> Vec<(&'static str, CaseFn<S>)> {
    __batch_cases!(list())
}

/// Runs every batch case concurrently, each against a fresh
/// [`BatchingStore`] from `make` and within a time limit, and returns the
/// names of those that failed.
///
/// ```
/// use idem_conformance::batches::Batching;
/// use idem_memory::MemoryStore;
/// # use idem_core::store::{Lease, Transaction};
/// # use idem_core::{Checkpoint, StoreError, StoredResponse, async_trait};
/// // A transaction that does not batch.
/// struct Tx;
/// # #[async_trait]
/// # impl Transaction for Tx {
/// #     async fn complete(&mut self, _: &Lease, _: &StoredResponse) -> Result<(), StoreError> { Ok(()) }
/// #     async fn checkpoint(&mut self, _: &Lease, _: &Checkpoint) -> Result<(), StoreError> { Ok(()) }
/// #     async fn commit(self) -> Result<(), StoreError> { Ok(()) }
/// # }
///
/// # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
/// let failed = idem_conformance::failing_batch_cases(|| async {
///     Batching::new(MemoryStore::new(), |_store| async { Ok(Tx) })
/// })
/// .await;
/// assert_eq!(failed.len(), idem_conformance::all_batch_cases::<Batching<MemoryStore, Tx>>().len());
/// # });
/// ```
pub async fn failing_batch_cases<S, F, Fut>(make: F) -> Vec<&'static str>
where
    S: BatchingStore,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    failing_of(all_batch_cases::<S>(), &make).await
}
