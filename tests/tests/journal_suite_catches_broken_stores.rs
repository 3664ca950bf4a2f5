//! The journal suite is itself tested: a correct journal store of one's own
//! passes every case, and each deliberately broken variant fails the cases
//! of the sentence it breaks.

use idem_own_store::{JournalDefect, OwnJournal};

mod common;

fn failing(defect: JournalDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_journal_cases(|| async move {
        OwnJournal::with_defect(defect)
    }))
}

fn assert_caught(defect: JournalDefect, expected: &[&str]) {
    common::assert_caught(defect, &failing(defect), expected);
}

#[test]
fn journal_suite_has_named_cases_with_unique_names() {
    let cases = idem_conformance::all_journal_cases::<OwnJournal>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 20, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn correct_own_journal_passes_every_case() {
    assert_eq!(failing(JournalDefect::None), Vec::<&str>::new());
}

#[test]
fn a_second_record_replacing_the_first_fails_the_record_case() {
    assert_caught(
        JournalDefect::RecordOverwrites,
        &["record_of_an_existing_key_returns_the_first_unchanged"],
    );
}

#[test]
fn keys_without_the_namespace_fail_the_namespace_case() {
    assert_caught(
        JournalDefect::NamespaceIgnored,
        &["namespaces_never_share_an_operation"],
    );
}

#[test]
fn leasing_over_a_live_lease_fails_the_lease_and_race_cases() {
    assert_caught(
        JournalDefect::AcquireIgnoresLiveLease,
        &[
            "acquire_leases_an_open_operation_to_one_owner",
            "concurrent_acquisitions_have_one_holder",
        ],
    );
}

#[test]
fn never_taking_over_fails_the_takeover_cases() {
    assert_caught(
        JournalDefect::NoTakeover,
        &[
            "a_lapsed_lease_is_taken_over",
            "a_taken_over_owner_cannot_finish_or_send",
        ],
    );
}

#[test]
fn a_holder_told_busy_fails_the_redelivery_case() {
    assert_caught(
        JournalDefect::HolderIsBusy,
        &["the_holder_acquiring_again_keeps_it_with_its_lease_moved"],
    );
}

#[test]
fn leasing_settled_operations_fails_the_settled_case() {
    assert_caught(
        JournalDefect::LeasesSettled,
        &["a_settled_operation_is_never_leased_again"],
    );
}

#[test]
fn unchecked_leases_fail_the_range_case() {
    assert_caught(
        JournalDefect::LeaseUnchecked,
        &["a_lease_out_of_range_is_invalid_input"],
    );
}

#[test]
fn a_non_atomic_acquisition_fails_the_race_case_every_run() {
    assert_caught(
        JournalDefect::NonAtomicAcquire,
        &["concurrent_acquisitions_have_one_holder"],
    );
}

#[test]
fn a_send_counted_twice_fails_the_redelivery_case() {
    assert_caught(
        JournalDefect::SendCountedTwice,
        &["mark_sent_delivered_twice_counts_once"],
    );
}

#[test]
fn an_unfenced_send_fails_the_fencing_cases() {
    assert_caught(
        JournalDefect::SendIgnoresOwner,
        &[
            "mark_sent_without_the_lease_is_lost_and_counts_nothing",
            "a_taken_over_owner_cannot_finish_or_send",
            "a_settled_state_never_changes",
        ],
    );
}

#[test]
fn a_window_that_restarts_fails_the_window_case() {
    assert_caught(
        JournalDefect::WindowRestarts,
        &["mark_sent_counts_a_send_and_the_first_starts_the_window"],
    );
}

#[test]
fn an_unfenced_finish_fails_the_fencing_cases() {
    assert_caught(
        JournalDefect::FinishIgnoresOwner,
        &[
            "finish_without_the_lease_is_lost_and_writes_nothing",
            "a_taken_over_owner_cannot_finish_or_send",
            "a_settled_state_never_changes",
        ],
    );
}

#[test]
fn a_finish_keeping_its_lease_fails_the_release_case() {
    assert_caught(
        JournalDefect::FinishKeepsLease,
        &["finish_writes_the_outcome_and_releases_the_lease"],
    );
}

#[test]
fn a_finish_erasing_the_provider_id_fails_its_case() {
    assert_caught(
        JournalDefect::FinishErasesProviderId,
        &["finish_keeps_the_provider_id_and_writes_the_search_deadline"],
    );
}

#[test]
fn a_dropped_search_deadline_fails_its_case() {
    assert_caught(
        JournalDefect::SearchDeadlineDropped,
        &["finish_keeps_the_provider_id_and_writes_the_search_deadline"],
    );
}

#[test]
fn a_finish_redelivery_answered_lost_fails_its_case() {
    assert_caught(
        JournalDefect::FinishRedeliveryLost,
        &["finish_delivered_twice_answers_as_the_first"],
    );
}

#[test]
fn overwriting_a_settled_state_fails_its_case() {
    assert_caught(
        JournalDefect::SettledOverwritten,
        &["a_settled_state_never_changes"],
    );
}

#[test]
fn listing_every_namespace_fails_the_namespace_case() {
    assert_caught(
        JournalDefect::ListAnyNamespace,
        &["namespaces_never_share_an_operation"],
    );
}

#[test]
fn listing_newest_first_fails_the_order_case() {
    assert_caught(
        JournalDefect::ListNewestFirst,
        &["list_gives_the_states_asked_oldest_change_first"],
    );
}

#[test]
fn listing_whatever_its_age_fails_the_age_case() {
    assert_caught(
        JournalDefect::ListIgnoresAge,
        &["list_gives_only_what_is_older_than_asked"],
    );
}

#[test]
fn unchecked_list_limits_fail_the_limit_case() {
    assert_caught(
        JournalDefect::ListLimitUnchecked,
        &["list_limit_out_of_range_is_invalid_input"],
    );
}

#[test]
fn a_lease_ending_early_fails_the_time_cases() {
    assert_caught(
        JournalDefect::LeaseEndsEarly,
        &[
            "acquire_leases_an_open_operation_to_one_owner",
            "times_are_the_stores_clock",
        ],
    );
}

#[test]
fn a_store_that_rekeys_fails_the_record_case() {
    assert_caught(
        JournalDefect::RecordRekeys,
        &["record_stores_a_new_operation_pending_and_unsent"],
    );
}

#[test]
fn acquiring_what_nobody_recorded_fails_the_absent_case() {
    assert_caught(
        JournalDefect::AcquireCreates,
        &["acquire_of_an_absent_operation_is_absent"],
    );
}

#[test]
fn an_unlabelled_name_fails_the_name_case() {
    assert_caught(
        JournalDefect::UnlabelledName,
        &["journal_store_name_is_one_short_lowercase_word"],
    );
}

#[test]
fn busy_with_the_whole_lease_fails_its_case() {
    let defect = JournalDefect::BusyGivesTheWholeLease;
    common::assert_caught_exactly(
        defect,
        &failing(defect),
        &["busy_carries_the_time_left_on_the_holders_lease"],
    );
}

#[test]
fn a_later_send_stamped_with_the_window_fails_its_case() {
    let defect = JournalDefect::LaterSendStampsTheWindow;
    common::assert_caught_exactly(defect, &failing(defect), &["updated_at_never_moves_back"]);
}

#[test]
fn a_send_counted_from_the_callers_count_fails_its_case() {
    let defect = JournalDefect::SendTrustsTheCallersCount;
    common::assert_caught_exactly(
        defect,
        &failing(defect),
        &["mark_sent_of_another_count_is_lost_and_counts_nothing"],
    );
}

#[test]
fn a_send_after_any_lower_count_taken_for_one_delivered_again_fails_its_case() {
    let defect = JournalDefect::SendBelowIsDeliveredAgain;
    common::assert_caught_exactly(
        defect,
        &failing(defect),
        &["mark_sent_of_another_count_is_lost_and_counts_nothing"],
    );
}
