//! The outbox suite is itself tested: a correct outbox store of one's own
//! passes every case, and each deliberately broken variant fails the cases
//! of the sentence it breaks.

use idem_own_store::{OutboxDefect, OwnOutbox};

mod common;

fn failing(defect: OutboxDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_outbox_cases(|| async move {
        OwnOutbox::with_defect(defect)
    }))
}

fn assert_caught(defect: OutboxDefect, expected: &[&str]) {
    common::assert_caught(defect, &failing(defect), expected);
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
