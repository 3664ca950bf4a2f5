//! Each case is written once, as a function in `cases.rs`, and listed once,
//! in the macro: a case that exists but is not in the list would never run.

use std::collections::BTreeSet;

use idem_core::store::IdempotencyStore;

#[test]
fn every_case_function_is_in_the_suite_and_nothing_else_is() {
    let source = include_str!("../src/cases.rs");
    let defined: BTreeSet<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter_map(|rest| rest.split(['<', '(']).next())
        .collect();
    let listed: BTreeSet<&str> = idem_conformance::all_cases::<dyn IdempotencyStore>()
        .into_iter()
        .map(|(name, _)| name)
        .chain(
            idem_conformance::all_pair_cases::<dyn IdempotencyStore>()
                .into_iter()
                .map(|(name, _)| name),
        )
        .collect();
    assert!(!defined.is_empty(), "no case found in cases.rs");
    assert_eq!(
        defined, listed,
        "cases.rs and the macro's list disagree: every `pub async fn` in cases.rs is a case"
    );
}

/// The same for the outbox suite: `outbox.rs` and its macro's list agree.
#[test]
fn every_outbox_case_function_is_in_the_outbox_suite() {
    let source = include_str!("../src/outbox.rs");
    let defined: BTreeSet<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter_map(|rest| rest.split(['<', '(']).next())
        .collect();
    let listed: BTreeSet<&str> =
        idem_conformance::all_outbox_cases::<dyn idem_core::store::OutboxStore>()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
    assert!(!defined.is_empty(), "no case found in outbox.rs");
    assert_eq!(defined, listed, "outbox.rs and the macro's list disagree");
}
