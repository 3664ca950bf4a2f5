//! The suite is itself tested: a simple correct store passes every case, and
//! each deliberately broken variant of it fails the cases that describe its
//! defect. A suite that passes a broken store proves nothing.

use idem_own_store::{Defect, OwnStore};

mod common;

fn failing(defect: Defect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_cases(|| async move {
        OwnStore::with_defect(defect)
    }))
}

fn assert_caught(defect: Defect, expected: &[&str]) {
    common::assert_caught(defect, &failing(defect), expected);
}

#[test]
fn suite_has_at_least_25_named_cases_with_unique_names() {
    let cases = idem_conformance::all_cases::<OwnStore>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 25, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn correct_own_store_passes_every_case() {
    assert_eq!(failing(Defect::None), Vec::<&str>::new());
}

#[test]
fn non_atomic_claim_fails_the_race_cases() {
    assert_caught(
        Defect::NonAtomicClaim,
        &[
            "concurrent_claims_of_one_key_have_one_winner",
            "concurrent_takeovers_of_an_expired_lease_have_one_winner",
        ],
    );
}

#[test]
fn complete_ignoring_the_owner_fails_the_fencing_cases() {
    assert_caught(
        Defect::CompleteIgnoresOwner,
        &[
            "stale_owner_cannot_complete_after_takeover",
            "completed_record_cannot_be_completed_again",
            "runner_reports_a_lost_lease_instead_of_success",
        ],
    );
}

#[test]
fn ignored_fingerprint_fails_the_mismatch_cases() {
    assert_caught(
        Defect::FingerprintIgnored,
        &[
            "other_fingerprint_while_in_flight_is_mismatch",
            "other_fingerprint_on_expired_lease_is_mismatch",
            "other_fingerprint_on_completed_record_is_mismatch",
            "runner_refuses_a_reused_key_with_another_payload",
        ],
    );
}

#[test]
fn renew_ignoring_the_owner_fails_the_stale_renew_case() {
    assert_caught(
        Defect::RenewIgnoresOwner,
        &["stale_owner_cannot_renew_after_takeover"],
    );
}

#[test]
fn ignored_retention_fails_the_retention_cases() {
    assert_caught(
        Defect::IgnoresRetention,
        &[
            "completed_record_past_retention_counts_as_absent",
            "record_past_retention_is_claimed_afresh",
            "purge_expired_removes_only_what_is_past_retention",
        ],
    );
}

#[test]
fn dropped_checkpoint_fails_the_takeover_cases() {
    assert_caught(
        Defect::CheckpointNotCarried,
        &[
            "takeover_carries_the_checkpoint",
            "runner_gives_a_takeover_the_checkpoint_and_the_same_downstream_key",
        ],
    );
}

#[test]
fn lossy_bodies_fail_the_byte_exact_case() {
    assert_caught(
        Defect::TextOnlyBodies,
        &["replay_is_byte_exact_for_binary_bodies_and_headers"],
    );
}

#[test]
fn retention_kept_from_the_claim_fails_the_late_completion_case() {
    assert_caught(
        Defect::CompletionKeepsClaimRetention,
        &["completion_restarts_retention"],
    );
}

#[test]
fn renewal_that_keeps_retention_fails_the_retention_stretch_case() {
    assert_caught(
        Defect::RenewKeepsRetention,
        &["renewal_keeps_the_later_of_retention_and_the_new_lease"],
    );
}

#[test]
fn renewal_from_the_old_expiry_fails_the_from_now_case() {
    assert_caught(
        Defect::RenewFromOldExpiry,
        &["renewal_counts_from_now_not_from_the_old_expiry"],
    );
}

#[test]
fn unchecked_renewal_fails_the_range_case() {
    assert_caught(
        Defect::RenewUnchecked,
        &["renewal_outside_the_lease_range_is_invalid_input"],
    );
}

#[test]
fn sweeping_expired_leases_fails_the_purge_case() {
    assert_caught(
        Defect::PurgeExpiredLeases,
        &["purge_keeps_an_in_flight_record_whose_lease_expired"],
    );
}

#[test]
fn fencing_without_retention_fails_the_past_retention_case() {
    assert_caught(
        Defect::FencedWritesIgnoreRetention,
        &["fenced_writes_past_retention_are_lost_leases"],
    );
}

#[test]
fn checkpoint_on_a_completed_record_fails_its_case() {
    assert_caught(
        Defect::CheckpointAfterCompletion,
        &["checkpoint_after_completion_is_a_lost_lease"],
    );
}

#[test]
fn full_lease_wait_fails_the_remaining_lease_case() {
    assert_caught(
        Defect::RetryAfterFullLease,
        &["in_progress_waits_only_the_remaining_lease"],
    );
}

#[test]
fn check_then_insert_fails_the_race_case_every_run() {
    assert_caught(
        Defect::CheckThenInsert,
        &["concurrent_claims_of_one_key_have_one_winner"],
    );
}

#[test]
fn a_store_without_a_size_limit_passes_the_size_cases() {
    let failed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(idem_conformance::failing_cases(|| async {
            OwnStore::new().with_max_response_bytes(usize::MAX)
        }));
    assert_eq!(failed, Vec::<&str>::new());
}

#[test]
fn a_claim_that_forgets_its_own_delivery_fails_the_redelivery_cases() {
    assert_caught(
        Defect::ClaimRedeliveryIsInProgress,
        &[
            "claim_delivered_twice_gets_the_same_lease",
            "takeover_delivered_twice_gets_the_same_attempt_and_checkpoint",
        ],
    );
}

#[test]
fn a_completion_that_forgets_its_own_delivery_fails_its_case() {
    assert_caught(
        Defect::CompleteRedeliveryIsLost,
        &["completion_delivered_twice_succeeds_and_stores_once"],
    );
}

#[test]
fn a_release_that_forgets_its_own_delivery_fails_its_cases() {
    assert_caught(
        Defect::ReleaseRedeliveryIsLost,
        &[
            "release_delivered_twice_succeeds",
            "released_lease_cannot_complete",
        ],
    );
}

#[test]
fn a_delete_that_spares_completed_records_fails_the_completed_case() {
    assert_caught(
        Defect::DeleteOnlyInFlight,
        &["deleted_completed_record_is_claimed_afresh"],
    );
}

#[test]
fn a_delete_that_only_expires_the_lease_fails_the_fencing_case() {
    assert_caught(
        Defect::DeleteExpiresLease,
        &[
            "deleted_in_flight_record_fences_out_its_owner",
            "deleted_completed_record_is_claimed_afresh",
        ],
    );
}

#[test]
fn a_delete_that_counts_records_past_retention_fails_its_answer_case() {
    assert_caught(
        Defect::DeleteCountsExpired,
        &["delete_reports_whether_a_live_record_was_there"],
    );
}

#[test]
fn a_delete_that_ignores_the_tenant_fails_the_isolation_case() {
    assert_caught(
        Defect::DeleteIgnoresTenant,
        &["delete_leaves_every_other_scope_alone"],
    );
}

#[test]
fn a_clock_other_than_the_one_that_judges_records_fails_the_now_case() {
    assert_caught(
        Defect::NowFromAnotherClock,
        &["now_reads_the_clock_that_judges_retention"],
    );
}

#[test]
fn a_claim_delivered_again_that_restarts_the_lease_fails_the_writes_nothing_case() {
    assert_caught(
        Defect::ClaimRedeliveryRestartsLease,
        &["claim_delivered_again_later_writes_nothing"],
    );
}

#[test]
fn a_claim_delivered_again_after_expiry_taken_as_a_takeover_fails_its_case() {
    assert_caught(
        Defect::ClaimRedeliveryAfterExpiryTakesOver,
        &["own_claim_delivered_after_its_lease_expired_is_not_a_takeover"],
    );
}

#[test]
fn fencing_that_needs_a_valid_lease_fails_the_expired_owner_case() {
    assert_caught(
        Defect::FencingNeedsAValidLease,
        &["owner_with_expired_lease_can_still_renew_checkpoint_and_release"],
    );
}

#[test]
fn a_completion_delivered_again_whoever_the_owner_fails_the_stale_owner_case() {
    assert_caught(
        Defect::CompleteRedeliveryIgnoresOwner,
        &["stale_owner_cannot_complete_even_with_the_new_owners_response"],
    );
}

#[test]
fn fencing_on_the_lease_expiry_fails_the_moved_expiry_redelivery_case() {
    assert_caught(
        Defect::FencesOnLeaseExpiry,
        &["renewal_and_checkpoint_delivered_after_the_expiry_moved_apply_again"],
    );
}

#[test]
fn completion_keeping_the_later_retention_fails_the_from_completion_case() {
    assert_caught(
        Defect::CompletionKeepsTheLaterRetention,
        &["completion_retains_for_the_retention_from_completion_alone"],
    );
}

#[test]
fn a_takeover_keeping_the_old_retention_fails_the_claim_retention_case() {
    assert_caught(
        Defect::TakeoverKeepsRetention,
        &["claims_and_takeovers_retain_the_record_from_their_own_moment"],
    );
}

#[test]
fn a_completion_keeping_the_checkpoint_fails_its_case() {
    assert_caught(
        Defect::CompletionKeepsCheckpoint,
        &["completion_drops_the_checkpoint"],
    );
}

#[test]
fn a_delete_by_key_prefix_fails_the_isolation_case() {
    assert_caught(
        Defect::DeleteByKeyPrefix,
        &["delete_leaves_every_other_scope_alone"],
    );
}

#[test]
fn check_then_insert_on_takeovers_alone_fails_the_takeover_race_case_every_run() {
    let failed = failing(Defect::TakeoverCheckThenInsert);
    assert!(
        failed.contains(&"concurrent_takeovers_of_an_expired_lease_have_one_winner"),
        "{failed:?}"
    );
    // Fresh claims are atomic: the escape is the takeover path alone.
    assert!(
        !failed.contains(&"concurrent_claims_of_one_key_have_one_winner"),
        "{failed:?}"
    );
}

#[test]
fn a_store_named_after_its_type_fails_the_name_case() {
    assert_caught(
        Defect::StoreNamedAfterItsType,
        &["store_name_is_one_short_lowercase_word"],
    );
}

/// A defect that breaks one sentence fails that sentence's case and no
/// other.
fn assert_caught_exactly(defect: Defect, expected: &[&str]) {
    common::assert_caught_exactly(defect, &failing(defect), expected);
}

#[test]
fn a_claim_delivered_again_answered_as_the_first_fails_its_case() {
    assert_caught_exactly(
        Defect::ClaimRedeliveryAnswersTheFirstClaim,
        &["own_claim_delivered_again_answers_the_lease_as_it_stands_now"],
    );
}

#[test]
fn a_claim_delivered_again_after_expiry_that_drops_the_checkpoint_fails_its_case() {
    assert_caught_exactly(
        Defect::ClaimRedeliveryAfterExpiryDropsCheckpoint,
        &["own_claim_delivered_after_its_lease_expired_keeps_the_checkpoint"],
    );
}

#[test]
fn a_completion_delivered_again_that_restarts_retention_fails_its_case() {
    assert_caught_exactly(
        Defect::CompleteRedeliveryRestartsRetention,
        &["completion_delivered_twice_keeps_the_first_retention"],
    );
}

#[test]
fn a_takeover_retained_for_its_retention_alone_fails_its_case() {
    assert_caught_exactly(
        Defect::TakeoverRetainsForTheRetentionAlone,
        &["a_takeover_retains_for_its_lease_where_longer_than_the_retention"],
    );
}

#[test]
fn a_delete_that_ignores_case_fails_its_case() {
    assert_caught_exactly(
        Defect::DeleteIgnoresCase,
        &["delete_matches_the_key_exactly"],
    );
}

#[test]
fn a_racy_claim_of_a_record_past_retention_fails_its_case() {
    assert_caught_exactly(
        Defect::ExpiredRecordCheckThenInsert,
        &["concurrent_claims_of_a_record_past_retention_have_one_winner"],
    );
}

#[test]
fn a_name_that_counts_instances_fails_its_case() {
    assert_caught_exactly(
        Defect::NameCountsInstances,
        &["every_instance_of_a_store_reports_one_name"],
    );
}

#[test]
fn a_completion_that_checks_then_writes_fails_its_case() {
    assert_caught_exactly(
        Defect::CompleteCheckThenWrite,
        &["a_completion_racing_a_takeover_never_overwrites_the_new_owner"],
    );
}
