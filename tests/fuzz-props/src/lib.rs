//! Test-only crate, no code: `tests/corrupt_records.rs` throws arbitrary
//! Redis replies and DynamoDB items at the stores' decoders (through their
//! `fuzzing` feature) and proves that whatever a corrupt row, hash or item
//! holds, the answer is `StoreError::Corrupt` or a value, never a panic. The
//! coverage-guided fuzzers for the same decoders are in `fuzz/`.
