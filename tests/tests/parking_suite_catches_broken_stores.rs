//! The parking suite is itself tested: a correct parking store of one's own
//! passes every case, and each deliberately broken variant fails the cases
//! of the sentence it breaks.

use idem_own_store::{OwnParking, ParkingDefect};

mod common;

fn failing(defect: ParkingDefect) -> Vec<&'static str> {
    common::failing(idem_conformance::failing_parking_cases(|| async move {
        OwnParking::with_defect(defect)
    }))
}

fn assert_caught(defect: ParkingDefect, expected: &[&str]) {
    common::assert_caught(defect, &failing(defect), expected);
}

#[test]
fn parking_suite_has_named_cases_with_unique_names() {
    let cases = idem_conformance::all_parking_cases::<OwnParking>();
    let mut names: Vec<_> = cases.iter().map(|(name, _)| *name).collect();
    assert!(names.len() >= 10, "{} cases", names.len());
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len());
}

#[test]
fn every_parking_case_function_is_in_the_suite() {
    let defined = common::case_functions(include_str!("../src/parking.rs"));
    let mut listed: Vec<&str> = idem_conformance::all_parking_cases::<OwnParking>()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    listed.sort_unstable();
    assert_eq!(defined, listed);
}

#[test]
fn correct_own_parking_passes_every_case() {
    assert_eq!(failing(ParkingDefect::None), Vec::<&str>::new());
}

#[test]
fn each_defect_fails_the_cases_of_its_sentence() {
    let expected: [(ParkingDefect, &[&str]); 15] = [
        (
            ParkingDefect::ParksTwice,
            &["parking_a_message_again_keeps_one_entry_with_the_new_reason"],
        ),
        (
            ParkingDefect::KeepsTheFirstReason,
            &["parking_a_message_again_keeps_one_entry_with_the_new_reason"],
        ),
        (
            ParkingDefect::ResolvedStaysResolved,
            &["parking_a_message_again_keeps_one_entry_with_the_new_reason"],
        ),
        (
            ParkingDefect::ListsOtherConsumers,
            &["list_gives_the_consumers_parked_entries_oldest_first"],
        ),
        (
            ParkingDefect::ListsResolved,
            &["list_gives_the_consumers_parked_entries_oldest_first"],
        ),
        (
            ParkingDefect::IgnoresVersions,
            &["list_of_an_aggregate_orders_it_by_version"],
        ),
        (
            ParkingDefect::NewestFirst,
            &[
                "list_gives_the_consumers_parked_entries_oldest_first",
                "list_of_an_aggregate_orders_it_by_version",
            ],
        ),
        (
            ParkingDefect::IgnoresLimit,
            &["list_holds_at_most_its_limit"],
        ),
        (
            ParkingDefect::ResolvesTwice,
            &["resolve_settles_a_parked_entry_once"],
        ),
        (
            ParkingDefect::ForgetsDropReason,
            &["resolve_settles_a_parked_entry_once"],
        ),
        (
            ParkingDefect::PurgesParked,
            &["purge_deletes_only_resolved_entries_older_than_asked"],
        ),
        (
            ParkingDefect::PurgeIgnoresAge,
            &["purge_deletes_only_resolved_entries_older_than_asked"],
        ),
        (
            ParkingDefect::CountsResolved,
            &["count_counts_a_consumers_parked_entries"],
        ),
        (
            ParkingDefect::LimitUnchecked,
            &["parking_limits_out_of_range_are_invalid_input"],
        ),
        (
            ParkingDefect::IgnoresConsumerInKey,
            &[
                "get_reads_an_entry_in_any_state_and_nothing_else",
                "count_counts_a_consumers_parked_entries",
            ],
        ),
    ];
    for (defect, cases) in expected {
        assert_caught(defect, cases);
    }
}

#[test]
fn a_consumers_listing_by_version_fails_its_case() {
    let defect = ParkingDefect::ListsByVersion;
    common::assert_caught_exactly(
        defect,
        &failing(defect),
        &["list_gives_the_consumers_parked_entries_oldest_first"],
    );
}

#[test]
fn a_purge_past_its_limit_fails_its_case() {
    let defect = ParkingDefect::PurgesPastItsLimit;
    common::assert_caught_exactly(defect, &failing(defect), &["purge_deletes_up_to_its_limit"]);
}

#[test]
fn a_repark_in_two_writes_fails_its_case() {
    let defect = ParkingDefect::ReparkDeletesThenInserts;
    common::assert_caught_exactly(
        defect,
        &failing(defect),
        &["a_dropped_park_leaves_the_entry_whole"],
    );
}

#[test]
fn a_repark_that_keeps_its_first_time_fails_its_case() {
    let defect = ParkingDefect::ReparkKeepsParkedAt;
    common::assert_caught_exactly(
        defect,
        &failing(defect),
        &["parking_a_message_again_moves_it_after_those_parked_since"],
    );
}
