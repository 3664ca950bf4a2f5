//! The outbox suite is itself tested: a correct outbox store of one's own
//! passes every case, and each deliberately broken variant fails exactly
//! the cases of the sentence it breaks.

use std::sync::Arc;

use idem_conformance::support::{SKEW, SkewedClock};
use idem_core::ManualClock;
use idem_core::store::Timestamp;
use idem_own_store::{OutboxDefect, OwnOutbox};

mod common;

fn failing(defect: OutboxDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_outbox_cases(|| async move {
        OwnOutbox::with_defect(defect)
    }))
}

/// The cases `defect` fails with the store's clock hours ahead of the
/// process's.
fn failing_skewed(defect: OutboxDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_outbox_cases(|| async move {
        OwnOutbox::with_defect(defect).on_clock(SkewedClock::ahead(SKEW))
    }))
}

/// The cases `defect` fails with the store's clock hours behind the
/// process's: what a clock ahead hides (an age by the wrong clock floors at
/// zero there) shows here.
fn failing_behind(defect: OutboxDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_outbox_cases(|| async move {
        OwnOutbox::with_defect(defect).on_clock(SkewedClock::behind(SKEW))
    }))
}

/// Each defect with the cases of the one sentence it breaks (a sentence
/// several cases lean on fails each of them).
const DEFECTS: &[(OutboxDefect, &[&str])] = &[
    (
        OutboxDefect::GlobalSequence,
        &["enqueue_stores_a_pending_message_with_its_aggregates_next_sequence"],
    ),
    (
        OutboxDefect::DuplicateIds,
        &["enqueue_delivered_twice_stores_once"],
    ),
    (
        OutboxDefect::SequenceRestartsAfterPurge,
        &["an_aggregates_sequence_keeps_counting_after_a_purge"],
    ),
    (
        OutboxDefect::PartitionByLength,
        &["a_message_lands_in_its_aggregates_partition"],
    ),
    (
        OutboxDefect::ReadByAggregate,
        &[
            "a_read_answers_the_log_after_a_position_in_order",
            "a_reader_racing_enqueues_skips_none",
            "an_advance_and_read_reads_the_log_as_the_advance_left_it",
        ],
    ),
    (
        // A reader going on from its last message reads it again.
        OutboxDefect::ReadIncludesAfter,
        &[
            "a_read_answers_the_log_after_a_position_in_order",
            "a_reader_racing_enqueues_skips_none",
        ],
    ),
    (
        OutboxDefect::ReadsTheLane,
        &[
            "a_read_names_the_blocked_aggregates_and_skips_the_lane",
            "an_advance_and_read_reads_the_log_as_the_advance_left_it",
            "the_last_failure_parks_the_message_and_its_aggregate_only",
        ],
    ),
    (
        OutboxDefect::NoBlocked,
        &[
            "a_read_names_the_blocked_aggregates_and_skips_the_lane",
            "an_advance_and_read_reads_the_log_as_the_advance_left_it",
            "a_parked_message_blocks_its_aggregate_in_a_read_until_dropped",
        ],
    ),
    (
        OutboxDefect::AcquireHeld,
        &["acquire_takes_the_lowest_free_partition"],
    ),
    (
        OutboxDefect::AcquireHighest,
        &["acquire_takes_the_lowest_free_partition"],
    ),
    (
        OutboxDefect::NoTakeover,
        &[
            "a_lapsed_partition_is_acquired_again_at_its_cursor",
            "a_lost_lease_advances_and_reads_nothing",
            "a_taken_over_relay_advances_nothing",
        ],
    ),
    (
        OutboxDefect::CursorForgotten,
        &[
            "a_lapsed_partition_is_acquired_again_at_its_cursor",
            "a_release_frees_the_partition_at_once_keeping_its_cursor",
            "an_advance_moves_the_cursor_never_back",
        ],
    ),
    (
        OutboxDefect::LeaseInWholeSeconds,
        &["a_lease_under_a_second_holds_for_its_length"],
    ),
    (
        OutboxDefect::ReleaseIgnoresOwner,
        &["a_release_frees_the_partition_at_once_keeping_its_cursor"],
    ),
    (
        OutboxDefect::AdvanceIgnoresOwner,
        &[
            "a_taken_over_relay_advances_nothing",
            "a_lost_lease_advances_and_reads_nothing",
        ],
    ),
    (
        OutboxDefect::AdvanceAfterLapse,
        &["a_lapsed_owner_advances_nothing_even_unclaimed"],
    ),
    (
        OutboxDefect::CursorMovesBack,
        &["an_advance_moves_the_cursor_never_back"],
    ),
    (OutboxDefect::NoRenewal, &["an_advance_renews_the_lease"]),
    (
        OutboxDefect::ReadsBeforeAdvance,
        &["an_advance_and_read_reads_the_log_as_the_advance_left_it"],
    ),
    (
        OutboxDefect::ReadsUnderLostLease,
        &["a_lost_lease_advances_and_reads_nothing"],
    ),
    (
        OutboxDefect::NoBackOff,
        &["a_failed_message_waits_its_back_off_in_the_lane"],
    ),
    (
        OutboxDefect::ParkedAggregateFlows,
        &["the_last_failure_parks_the_message_and_its_aggregate_only"],
    ),
    (
        OutboxDefect::HoldCountsAttempt,
        &["held_messages_follow_their_aggregates_first"],
    ),
    (
        OutboxDefect::WholeLaneDue,
        &[
            "held_messages_follow_their_aggregates_first",
            "a_retried_message_keeps_its_place_in_its_aggregate",
            "due_takes_each_aggregates_first_oldest_first",
            "the_last_failure_parks_the_message_and_its_aggregate_only",
        ],
    ),
    (
        OutboxDefect::FailureCountsTwice,
        &["an_advance_delivered_twice_changes_nothing_more"],
    ),
    (
        OutboxDefect::DueBySequence,
        &["due_takes_each_aggregates_first_oldest_first"],
    ),
    (
        OutboxDefect::RetryKeepsAttempts,
        &["a_retried_message_waits_again_with_no_attempts"],
    ),
    (
        OutboxDefect::RetryRequeues,
        &["a_retried_message_keeps_its_place_in_its_aggregate"],
    ),
    (
        OutboxDefect::RetryKeepsBackOff,
        &[
            "a_retried_message_keeps_its_last_error_and_is_due_at_once",
            "a_retried_message_keeps_its_place_in_its_aggregate",
        ],
    ),
    (
        OutboxDefect::RetryClearsError,
        &["a_retried_message_keeps_its_last_error_and_is_due_at_once"],
    ),
    (
        OutboxDefect::DropLosesReason,
        &["a_dropped_message_keeps_its_reason_and_frees_its_aggregate"],
    ),
    (
        OutboxDefect::ParkedPagesByTimeAlone,
        &["parked_messages_of_one_enqueue_time_page_by_id"],
    ),
    (
        OutboxDefect::EnqueueLandsLate,
        &["a_reader_racing_enqueues_skips_none"],
    ),
    (
        OutboxDefect::HoldsAnyMessage,
        &["a_hold_or_a_send_changes_only_a_message_in_its_place"],
    ),
    (
        // A send delivered twice stamps the sent message again.
        OutboxDefect::SendsAnyMessage,
        &[
            "a_hold_or_a_send_changes_only_a_message_in_its_place",
            "an_advance_delivered_twice_changes_nothing_more",
        ],
    ),
    (
        OutboxDefect::DropKeepsBlocking,
        &[
            "a_dropped_message_keeps_its_reason_and_frees_its_aggregate",
            "a_parked_message_blocks_its_aggregate_in_a_read_until_dropped",
        ],
    ),
    (
        OutboxDefect::RenewsPastItsLength,
        &["an_advance_renews_the_lease"],
    ),
    (
        OutboxDefect::ReadsFromCursor,
        &["a_read_starts_after_the_position_asked_not_the_cursor"],
    ),
    (
        OutboxDefect::ParkedDoesNotBlock,
        &["a_parked_message_blocks_its_aggregate_in_a_read_until_dropped"],
    ),
    (
        OutboxDefect::PurgeIgnoresLimit,
        &["purge_deletes_up_to_its_limit"],
    ),
    (
        OutboxDefect::StatsHolderAfterLapse,
        &["a_lapsed_lease_has_no_holder_in_the_stats"],
    ),
    (
        OutboxDefect::OperatorIgnoresState,
        &[
            "only_a_parked_message_is_retried_or_dropped",
            "a_retried_message_waits_again_with_no_attempts",
            "a_dropped_message_keeps_its_reason_and_frees_its_aggregate",
        ],
    ),
    (
        OutboxDefect::ParkedNewestFirst,
        &["parked_messages_are_listed_oldest_first_in_pages"],
    ),
    (
        OutboxDefect::PurgesUnsent,
        &["purge_deletes_only_sent_messages_at_least_as_old_as_asked"],
    ),
    (
        OutboxDefect::PurgeIgnoresAge,
        &[
            "purge_deletes_only_sent_messages_at_least_as_old_as_asked",
            "a_dropped_message_is_purged_aged_from_its_drop",
        ],
    ),
    (
        OutboxDefect::PurgeAgesDropsFromEnqueue,
        &["a_dropped_message_is_purged_aged_from_its_drop"],
    ),
    (
        OutboxDefect::StatsMixParked,
        &[
            "stats_count_each_partitions_backlog",
            "stats_age_only_the_pending_backlog",
            "the_last_failure_parks_the_message_and_its_aggregate_only",
        ],
    ),
    (
        OutboxDefect::StatsAgeCountsParked,
        &["stats_age_only_the_pending_backlog"],
    ),
    (
        OutboxDefect::StatsAgeCountsSent,
        &["stats_age_only_the_pending_backlog"],
    ),
    (
        OutboxDefect::StatsNoHolder,
        &[
            "stats_count_each_partitions_backlog",
            "an_advance_renews_the_lease",
        ],
    ),
    (
        OutboxDefect::LimitUnchecked,
        &["limits_out_of_range_are_invalid_input"],
    ),
    (
        OutboxDefect::NonAtomicAcquire,
        &["concurrent_acquires_never_share_a_partition"],
    ),
];

/// Fails unless `defect` fails exactly the cases [`DEFECTS`] gives it.
fn assert_caught_exactly(defect: OutboxDefect) {
    let expected = DEFECTS
        .iter()
        .find(|(listed, _)| *listed == defect)
        .map_or(&[][..], |(_, cases)| *cases);
    common::assert_caught_exactly(defect, &failing(defect), expected);
}

#[test]
fn outbox_suite_has_named_cases_with_unique_names() {
    let cases = idem_conformance::all_outbox_cases::<OwnOutbox>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 25, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn correct_own_outbox_passes_every_case() {
    assert_eq!(failing(OutboxDefect::None), Vec::<&str>::new());
}

#[test]
fn correct_own_outbox_passes_every_case_on_a_clock_far_from_the_process() {
    assert_eq!(failing_skewed(OutboxDefect::None), Vec::<&str>::new());
}

#[test]
fn correct_own_outbox_passes_every_case_on_a_clock_far_behind_the_process() {
    assert_eq!(failing_behind(OutboxDefect::None), Vec::<&str>::new());
}

#[test]
fn ages_by_the_process_clock_pass_on_true_time_and_ahead_and_fail_behind() {
    let defect = OutboxDefect::StatsAgeOnProcessClock;
    assert_eq!(failing(defect), Vec::<&str>::new());
    assert_eq!(
        failing_skewed(defect),
        Vec::<&str>::new(),
        "ages floor at zero"
    );
    common::assert_caught(
        defect,
        &failing_behind(defect),
        &["stats_age_only_the_pending_backlog"],
    );
}

/// Every case is the one sentence of some defect: no case is left that a
/// broken store could not fail.
#[test]
fn every_case_is_proven_by_a_defect() {
    let proven: Vec<&str> = DEFECTS
        .iter()
        .flat_map(|(_, cases)| cases.iter().copied())
        .collect();
    let mut unproven: Vec<&str> = idem_conformance::all_outbox_cases::<OwnOutbox>()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !proven.contains(name))
        .collect();
    unproven.sort_unstable();
    assert_eq!(unproven, Vec::<&str>::new(), "cases no defect fails");
}

#[test]
fn global_sequence_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::GlobalSequence);
}

#[test]
fn duplicate_ids_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::DuplicateIds);
}

#[test]
fn sequence_restarts_after_purge_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::SequenceRestartsAfterPurge);
}

/// Placing aggregates by another rule breaks its case, and every case that
/// picks two aggregates of one partition by the contract's rule.
#[test]
fn partition_by_length_fails_at_least_its_sentence() {
    let defect = OutboxDefect::PartitionByLength;
    common::assert_caught(
        defect,
        &failing(defect),
        &["a_message_lands_in_its_aggregates_partition"],
    );
}

#[test]
fn read_by_aggregate_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReadByAggregate);
}

#[test]
fn read_includes_after_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReadIncludesAfter);
}

#[test]
fn reads_the_lane_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReadsTheLane);
}

#[test]
fn no_blocked_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::NoBlocked);
}

/// Leasing held partitions breaks its case, and every case that holds a
/// partition to settle under it.
#[test]
fn acquire_held_fails_at_least_its_sentence() {
    let defect = OutboxDefect::AcquireHeld;
    common::assert_caught(
        defect,
        &failing(defect),
        &[
            "acquire_takes_the_lowest_free_partition",
            "concurrent_acquires_never_share_a_partition",
        ],
    );
}

#[test]
fn acquire_highest_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::AcquireHighest);
}

#[test]
fn no_takeover_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::NoTakeover);
}

#[test]
fn cursor_forgotten_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::CursorForgotten);
}

#[test]
fn lease_in_whole_seconds_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::LeaseInWholeSeconds);
}

#[test]
fn release_ignores_owner_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReleaseIgnoresOwner);
}

#[test]
fn advance_ignores_owner_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::AdvanceIgnoresOwner);
}

#[test]
fn advance_after_lapse_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::AdvanceAfterLapse);
}

#[test]
fn cursor_moves_back_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::CursorMovesBack);
}

#[test]
fn no_renewal_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::NoRenewal);
}

#[test]
fn reads_before_advance_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReadsBeforeAdvance);
}

#[test]
fn reads_under_lost_lease_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReadsUnderLostLease);
}

#[test]
fn no_back_off_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::NoBackOff);
}

#[test]
fn parked_aggregate_flows_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ParkedAggregateFlows);
}

#[test]
fn hold_counts_attempt_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::HoldCountsAttempt);
}

#[test]
fn whole_lane_due_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::WholeLaneDue);
}

#[test]
fn failure_counts_twice_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::FailureCountsTwice);
}

#[test]
fn due_by_sequence_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::DueBySequence);
}

#[test]
fn retry_keeps_attempts_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::RetryKeepsAttempts);
}

#[test]
fn retry_requeues_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::RetryRequeues);
}

#[test]
fn retry_keeps_back_off_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::RetryKeepsBackOff);
}

#[test]
fn retry_clears_error_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::RetryClearsError);
}

#[test]
fn drop_loses_reason_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::DropLosesReason);
}

#[test]
fn parked_pages_by_time_alone_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ParkedPagesByTimeAlone);
}

#[test]
fn enqueue_lands_late_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::EnqueueLandsLate);
}

#[test]
fn holds_any_message_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::HoldsAnyMessage);
}

#[test]
fn sends_any_message_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::SendsAnyMessage);
}

#[test]
fn drop_keeps_blocking_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::DropKeepsBlocking);
}

#[test]
fn renews_past_its_length_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::RenewsPastItsLength);
}

#[test]
fn reads_from_cursor_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ReadsFromCursor);
}

#[test]
fn parked_does_not_block_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ParkedDoesNotBlock);
}

#[test]
fn purge_ignores_limit_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::PurgeIgnoresLimit);
}

#[test]
fn stats_holder_after_lapse_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::StatsHolderAfterLapse);
}

#[test]
fn operator_ignores_state_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::OperatorIgnoresState);
}

#[test]
fn parked_newest_first_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::ParkedNewestFirst);
}

#[test]
fn purges_unsent_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::PurgesUnsent);
}

#[test]
fn purge_ignores_age_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::PurgeIgnoresAge);
}

#[test]
fn purge_ages_drops_from_enqueue_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::PurgeAgesDropsFromEnqueue);
}

#[test]
fn stats_mix_parked_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::StatsMixParked);
}

#[test]
fn stats_age_counts_parked_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::StatsAgeCountsParked);
}

#[test]
fn stats_age_counts_sent_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::StatsAgeCountsSent);
}

#[test]
fn stats_no_holder_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::StatsNoHolder);
}

#[test]
fn limit_unchecked_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::LimitUnchecked);
}

#[test]
fn non_atomic_acquire_fails_exactly_its_sentence() {
    assert_caught_exactly(OutboxDefect::NonAtomicAcquire);
}

#[test]
fn leases_ended_by_the_process_clock_pass_on_true_time_and_fail_on_a_far_clock() {
    assert_eq!(
        failing(OutboxDefect::LeaseOnProcessClock),
        Vec::<&str>::new()
    );
    common::assert_caught(
        OutboxDefect::LeaseOnProcessClock,
        &failing_skewed(OutboxDefect::LeaseOnProcessClock),
        &["acquire_takes_the_lowest_free_partition"],
    );
}

/// Whether the purge case passes on `defect` with the store's clock
/// stopped, so a message sent is exactly as old as the purge asks.
fn purge_case_passes_on_a_stopped_clock(defect: OutboxDefect) -> bool {
    let store = OwnOutbox::with_defect(defect).on_clock(ManualClock::new(
        Timestamp::from_unix_millis(1_700_000_000_000),
    ));
    common::passes(
        idem_conformance::outbox::purge_deletes_only_sent_messages_at_least_as_old_as_asked(
            Arc::new(store),
        ),
    )
}

#[test]
fn purging_only_strictly_older_fails_the_purge_case_at_equal_age() {
    assert!(purge_case_passes_on_a_stopped_clock(OutboxDefect::None));
    assert!(!purge_case_passes_on_a_stopped_clock(
        OutboxDefect::PurgeStrictlyOlder
    ));
}
