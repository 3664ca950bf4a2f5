//! The outbox suite is itself tested: a correct outbox store of one's own
//! passes every case, and each deliberately broken variant fails the cases
//! of the sentence it breaks.

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

fn assert_caught(defect: OutboxDefect, expected: &[&str]) {
    common::assert_caught(defect, &failing(defect), expected);
}

fn assert_caught_exactly(defect: OutboxDefect, expected: &[&str]) {
    common::assert_caught_exactly(defect, &failing(defect), expected);
}

#[test]
fn outbox_suite_has_named_cases_with_unique_names() {
    let cases = idem_conformance::all_outbox_cases::<OwnOutbox>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 15, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn correct_own_outbox_passes_every_case() {
    assert_eq!(failing(OutboxDefect::None), Vec::<&str>::new());
}

#[test]
fn numbering_across_aggregates_fails_the_sequence_case() {
    assert_caught(
        OutboxDefect::GlobalSequence,
        &["enqueue_stores_a_pending_message_with_its_aggregates_next_sequence"],
    );
}

#[test]
fn storing_an_id_twice_fails_the_redelivery_case() {
    assert_caught(
        OutboxDefect::DuplicateIds,
        &["enqueue_delivered_twice_stores_once"],
    );
}

#[test]
fn claiming_a_whole_aggregate_fails_the_head_cases() {
    assert_caught(
        OutboxDefect::WholeAggregate,
        &[
            "a_claim_gives_each_aggregate_its_head_only",
            "after_a_message_is_sent_the_next_of_its_aggregate_is_claimed",
            "concurrent_claims_never_share_an_aggregate",
        ],
    );
}

#[test]
fn claiming_over_a_live_lease_fails_the_lease_cases() {
    assert_caught(
        OutboxDefect::IgnoresLeases,
        &["a_claim_gives_each_aggregate_its_head_only"],
    );
}

#[test]
fn never_claiming_ahead_fails_the_claim_ahead_case() {
    assert_caught(
        OutboxDefect::NoClaimAhead,
        &["a_claim_takes_the_next_message_of_an_aggregate_its_owner_holds"],
    );
}

#[test]
fn a_lease_of_its_own_ahead_fails_the_claim_ahead_case() {
    assert_caught(
        OutboxDefect::FreshLeaseAhead,
        &["a_claim_takes_the_next_message_of_an_aggregate_its_owner_holds"],
    );
}

#[test]
fn claiming_past_a_message_let_go_fails_the_let_go_case() {
    assert_caught(
        OutboxDefect::AheadPastFreed,
        &["a_claim_never_takes_a_message_past_one_its_owner_let_go"],
    );
}

#[test]
fn releasing_for_any_relay_fails_the_release_case() {
    assert_caught(
        OutboxDefect::ReleaseIgnoresOwner,
        &["release_frees_only_what_its_owner_holds_counting_nothing"],
    );
}

#[test]
fn a_release_counted_as_an_attempt_fails_the_release_case() {
    assert_caught(
        OutboxDefect::ReleaseCountsAttempt,
        &["release_frees_only_what_its_owner_holds_counting_nothing"],
    );
}

#[test]
fn never_taking_over_fails_the_takeover_cases() {
    assert_caught(
        OutboxDefect::NoTakeover,
        &[
            "a_lapsed_claim_is_claimed_again",
            "a_taken_over_relay_marks_nothing",
        ],
    );
}

#[test]
fn marking_for_any_relay_fails_the_fencing_cases() {
    assert_caught(
        OutboxDefect::SentIgnoresOwner,
        &["mark_sent_marks_only_what_its_owner_holds"],
    );
}

#[test]
fn no_back_off_fails_the_back_off_case() {
    assert_caught(
        OutboxDefect::NoBackOff,
        &["a_failed_message_is_freed_and_waits_its_back_off"],
    );
}

#[test]
fn a_parked_aggregate_that_flows_fails_the_parking_case() {
    assert_caught(
        OutboxDefect::ParkedAggregateFlows,
        &["the_last_failure_parks_the_message_and_its_aggregate_only"],
    );
}

#[test]
fn failing_for_any_relay_fails_the_fencing_cases() {
    assert_caught(
        OutboxDefect::FailureIgnoresOwner,
        &[
            "a_failure_without_the_lease_is_lost",
            "a_taken_over_relay_marks_nothing",
        ],
    );
}

#[test]
fn a_retry_keeping_its_attempts_fails_the_retry_case() {
    assert_caught(
        OutboxDefect::RetryKeepsAttempts,
        &["a_retried_message_is_pending_again"],
    );
}

#[test]
fn a_drop_that_resends_fails_the_drop_case() {
    assert_caught(
        OutboxDefect::DropResends,
        &["a_dropped_message_keeps_its_reason_and_frees_its_aggregate"],
    );
}

#[test]
fn purging_unsent_messages_fails_the_purge_case() {
    assert_caught(
        OutboxDefect::PurgesUnsent,
        &["purge_deletes_only_sent_messages_older_than_asked"],
    );
}

#[test]
fn purging_whatever_its_age_fails_the_purge_case() {
    assert_caught(
        OutboxDefect::PurgeIgnoresAge,
        &["purge_deletes_only_sent_messages_older_than_asked"],
    );
}

#[test]
fn parked_counted_as_pending_fails_the_parking_case() {
    assert_caught(
        OutboxDefect::StatsMixParked,
        &["the_last_failure_parks_the_message_and_its_aggregate_only"],
    );
}

#[test]
fn unchecked_limits_fail_the_limit_case() {
    assert_caught(
        OutboxDefect::LimitUnchecked,
        &["limits_out_of_range_are_invalid_input"],
    );
}

#[test]
fn a_non_atomic_claim_fails_the_race_case_every_run() {
    assert_caught(
        OutboxDefect::NonAtomicClaim,
        &["concurrent_claims_never_share_an_aggregate"],
    );
}

#[test]
fn correct_own_outbox_passes_every_case_on_a_clock_far_from_the_process() {
    assert_eq!(failing_skewed(OutboxDefect::None), Vec::<&str>::new());
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
        &[
            "a_claim_gives_each_aggregate_its_head_only",
            "release_frees_only_what_its_owner_holds_counting_nothing",
        ],
    );
}

#[test]
fn leases_in_whole_seconds_fail_the_short_lease_case() {
    assert_caught_exactly(
        OutboxDefect::LeaseInWholeSeconds,
        &["a_lease_under_a_second_holds_for_its_length"],
    );
}

#[test]
fn a_lapsed_owner_marking_sent_fails_the_lapse_case() {
    assert_caught_exactly(
        OutboxDefect::SentAfterLapse,
        &["a_lapsed_owner_marks_nothing_even_unclaimed"],
    );
}

#[test]
fn a_retry_that_requeues_fails_the_place_case() {
    assert_caught_exactly(
        OutboxDefect::RetryRequeues,
        &["a_retried_message_keeps_its_place_in_its_aggregate"],
    );
}

#[test]
fn dropping_a_sent_message_fails_the_sent_drop_case() {
    assert_caught_exactly(
        OutboxDefect::DropsSent,
        &["dropping_a_sent_message_changes_nothing"],
    );
}

#[test]
fn a_drop_without_its_reason_fails_the_drop_case() {
    assert_caught_exactly(
        OutboxDefect::DropLosesReason,
        &["a_dropped_message_keeps_its_reason_and_frees_its_aggregate"],
    );
}

#[test]
fn drops_aged_from_their_enqueue_fail_the_dropped_purge_case() {
    assert_caught_exactly(
        OutboxDefect::PurgeAgesDropsFromEnqueue,
        &["a_dropped_message_is_purged_aged_from_its_drop"],
    );
}

#[test]
fn a_sequence_restarting_after_a_purge_fails_the_counting_case() {
    assert_caught_exactly(
        OutboxDefect::SequenceRestartsAfterPurge,
        &["an_aggregates_sequence_keeps_counting_after_a_purge"],
    );
}

#[test]
fn a_backlog_aged_from_parked_or_sent_messages_fails_the_age_case() {
    for defect in [
        OutboxDefect::StatsAgeCountsParked,
        OutboxDefect::StatsAgeCountsSent,
    ] {
        assert_caught_exactly(defect, &["stats_age_only_the_pending_backlog"]);
    }
}

#[test]
fn heads_by_sequence_fail_the_oldest_first_case() {
    assert_caught_exactly(
        OutboxDefect::HeadsBySequence,
        &["a_claim_takes_the_oldest_heads_first"],
    );
}

#[test]
fn a_release_clearing_the_error_fails_the_release_case() {
    assert_caught_exactly(
        OutboxDefect::ReleaseClearsError,
        &["a_release_keeps_the_last_failure_and_frees_at_once"],
    );
}

#[test]
fn a_retry_that_waits_or_forgets_fails_the_due_at_once_case() {
    for defect in [
        OutboxDefect::RetryKeepsBackOff,
        OutboxDefect::RetryClearsError,
    ] {
        assert_caught_exactly(
            defect,
            &["a_retried_message_keeps_its_last_error_and_is_due_at_once"],
        );
    }
}

/// Whether the purge case passes on `defect` with the store's clock
/// stopped, so a message sent is exactly as old as the purge asks.
fn purge_case_passes_on_a_stopped_clock(defect: OutboxDefect) -> bool {
    let store = OwnOutbox::with_defect(defect).on_clock(ManualClock::new(
        Timestamp::from_unix_millis(1_700_000_000_000),
    ));
    common::passes(
        idem_conformance::outbox::purge_deletes_only_sent_messages_older_than_asked(Arc::new(
            store,
        )),
    )
}

#[test]
fn purging_only_strictly_older_fails_the_purge_case_at_equal_age() {
    assert!(purge_case_passes_on_a_stopped_clock(OutboxDefect::None));
    assert!(!purge_case_passes_on_a_stopped_clock(
        OutboxDefect::PurgeStrictlyOlder
    ));
}
