//! What the three "suite catches broken stores" tests share: running a
//! suite's harness on a fresh runtime, and checking a defect was caught.

#![allow(clippy::unwrap_used)] // test code: a failed runtime should fail loudly

use std::fmt::Debug;
use std::future::Future;

/// The names `failing` (a suite's `failing_*cases` harness) returns, run on
/// a multi-threaded runtime of its own, as the generated tests run.
pub(crate) fn failing<F: Future<Output = Vec<&'static str>>>(failing: F) -> Vec<&'static str> {
    runtime().block_on(failing)
}

/// A multi-threaded runtime of its own, as the generated tests run on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

/// Fails unless every one of `expected` is among `failed`.
#[allow(dead_code)] // not every test file checks a defect this loosely
pub(crate) fn assert_caught(defect: impl Debug, failed: &[&str], expected: &[&str]) {
    for name in expected {
        assert!(
            failed.contains(name),
            "{defect:?} should fail {name}; it failed {failed:?}"
        );
    }
}

/// Fails unless `failed` is exactly `expected`: the defect breaks one
/// sentence, and only that sentence's cases see it.
pub(crate) fn assert_caught_exactly(defect: impl Debug, failed: &[&str], expected: &[&str]) {
    let mut failed = failed.to_vec();
    let mut expected = expected.to_vec();
    failed.sort_unstable();
    expected.sort_unstable();
    assert_eq!(
        failed, expected,
        "{defect:?} should fail exactly {expected:?}"
    );
}

/// The case functions a suite's source defines (every `pub async fn`),
/// sorted: each must be in the suite's list.
#[allow(dead_code)] // not every test file checks its suite's list
pub(crate) fn case_functions(source: &str) -> Vec<&str> {
    let mut defined: Vec<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter_map(|rest| rest.split(['<', '(']).next())
        .collect();
    defined.sort_unstable();
    defined
}

/// Whether `case` (one case's future) passes, run on a multi-threaded
/// runtime of its own as the generated tests run it.
#[allow(dead_code)] // not every test file runs a case alone
pub(crate) fn passes<F: Future<Output = ()> + Send + 'static>(case: F) -> bool {
    runtime().block_on(async { tokio::spawn(case).await.is_ok() })
}
