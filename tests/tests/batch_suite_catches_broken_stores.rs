//! The batch suite is itself tested: the own store's transactions pass
//! every case, and each deliberately broken variant fails the cases of the
//! sentence it breaks.

use idem_conformance::batches::Batching;
use idem_own_store::{BatchDefect, OwnStore, OwnTransaction};

mod common;

fn failing(defect: BatchDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_batch_cases(|| async move {
        Batching::new(OwnStore::new().with_batch_defect(defect), |store| {
            let tx = store.begin();
            async move { Ok(tx) }
        })
    }))
}

#[test]
fn batch_suite_has_named_cases_with_unique_names() {
    let cases = idem_conformance::all_batch_cases::<Batching<OwnStore, OwnTransaction>>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 7, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn every_batch_case_function_is_in_the_suite() {
    let defined = common::case_functions(include_str!("../src/batches.rs"));
    let mut listed: Vec<&str> =
        idem_conformance::all_batch_cases::<Batching<OwnStore, OwnTransaction>>()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
    listed.sort_unstable();
    assert_eq!(defined, listed);
}

#[test]
fn correct_own_transactions_pass_every_case() {
    assert_eq!(failing(BatchDefect::None), Vec::<&str>::new());
}

#[test]
fn each_defect_fails_exactly_the_cases_of_its_sentence() {
    let expected: [(BatchDefect, &[&str]); 21] = [
        (
            // A claim written at once is there before the commit, and
            // after a rollback (of the transaction or to a savepoint, or a
            // refused commit).
            BatchDefect::ClaimWritesAtOnce,
            &[
                "a_claim_in_a_transaction_takes_effect_only_if_it_commits",
                "a_lease_completed_elsewhere_before_the_commit_refuses_the_commit",
                "a_rollback_to_a_savepoint_undoes_only_what_was_written_since",
                "claiming_and_completing_all_at_once_takes_effect_only_if_it_commits",
                "savepoints_nest_and_each_operation_names_the_latest_open",
            ],
        ),
        (
            // Its fenced writes too: over a completion made meanwhile.
            BatchDefect::CommitOverwritesARacingClaim,
            &[
                "a_lease_completed_elsewhere_before_the_commit_refuses_the_commit",
                "two_transactions_claiming_one_scope_never_both_apply",
            ],
        ),
        (
            // Claiming many at once claims each in turn, seeing the earlier.
            BatchDefect::ClaimIgnoresItsOwnWrites,
            &[
                "within_one_transaction_a_scope_claimed_and_completed_answers_completed",
                "within_one_transaction_a_claim_delivered_again_answers_as_the_first",
                "claiming_all_at_once_answers_as_claiming_each_in_turn",
            ],
        ),
        (
            BatchDefect::ClaimRefusesItsOwnAgain,
            &["within_one_transaction_a_claim_delivered_again_answers_as_the_first"],
        ),
        (
            BatchDefect::ClaimIgnoresFingerprint,
            &[
                "a_claim_in_a_transaction_is_decided_as_the_stores_claim",
                "claiming_and_completing_all_at_once_records_each_free_scope_with_the_response",
            ],
        ),
        (
            BatchDefect::RollsBackToTheFirstSavepoint,
            &["savepoints_nest_and_each_operation_names_the_latest_open"],
        ),
        (
            // Nesting is seen through a rollback too.
            BatchDefect::RollbackKeepsWrites,
            &[
                "a_rollback_to_a_savepoint_undoes_only_what_was_written_since",
                "savepoints_nest_and_each_operation_names_the_latest_open",
            ],
        ),
        (
            // Nesting is seen through a release too.
            BatchDefect::ReleaseUndoesWrites,
            &[
                "a_released_savepoint_is_closed",
                "a_released_savepoint_keeps_what_was_written_since",
                "savepoints_nest_and_each_operation_names_the_latest_open",
            ],
        ),
        (
            BatchDefect::ClaimAllAnswersReversed,
            &["claiming_all_at_once_answers_as_claiming_each_in_turn"],
        ),
        (
            BatchDefect::CompleteAllOnlyTheFirst,
            &[
                "a_lease_completed_elsewhere_before_the_commit_refuses_the_commit",
                "completing_all_at_once_completes_each_when_the_transaction_commits",
            ],
        ),
        (
            BatchDefect::CommitRefusesItsOwnRenewal,
            &["a_holders_own_renewal_while_its_write_waits_in_a_transaction_keeps_the_commit"],
        ),
        (
            BatchDefect::CommitWritesTheLeaseBack,
            &["a_holders_own_renewal_while_its_write_waits_in_a_transaction_keeps_the_commit"],
        ),
        (
            BatchDefect::RollbackKeepsBareClaims,
            &["a_rollback_to_a_savepoint_undoes_only_what_was_written_since"],
        ),
        (
            BatchDefect::ClaimAllIgnoresItsOwn,
            &["claiming_all_at_once_answers_as_claiming_each_in_turn"],
        ),
        (
            BatchDefect::ReleaseLeavesItOpen,
            &["a_released_savepoint_is_closed"],
        ),
        (
            BatchDefect::CompletesItsCompletionAgain,
            &["a_completion_in_a_transaction_is_never_replaced_by_a_second"],
        ),
        (
            BatchDefect::CommitFencesByOwnerAlone,
            &["a_lease_completed_elsewhere_before_the_commit_refuses_the_commit"],
        ),
        (
            BatchDefect::ClaimCompletedLeavesItInFlight,
            &["claiming_and_completing_all_at_once_records_each_free_scope_with_the_response"],
        ),
        (
            BatchDefect::ClaimCompletedHidesWhatItFound,
            &["claiming_and_completing_all_at_once_records_each_free_scope_with_the_response"],
        ),
        (
            BatchDefect::ClaimCompletedTakesAScopeTwice,
            &["claiming_and_completing_all_at_once_refuses_a_scope_twice"],
        ),
        (
            BatchDefect::ClaimCompletedStoresAnotherResponse,
            &["claiming_and_completing_all_at_once_records_each_free_scope_with_the_response"],
        ),
    ];
    for (defect, cases) in expected {
        common::assert_caught_exactly(defect, &failing(defect), cases);
    }
}
