#![doc = include_str!("../CONTRACT.md")]
pub use crate::backend::{
    Capabilities, ClockSource, Durability, Eviction, IdempotencyStore, Transaction,
    TransactionSharing,
};
pub use crate::claim::{
    ClaimOutcome, ClaimRequest, MAX_LEASE, MAX_RETENTION, MIN_DURATION, validate_lease,
    validate_retention,
};
pub use crate::clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use crate::codec::{
    check_response_size, checkpoint_json, decode_checkpoint, decode_response,
    decode_response_parts, encode_headers, millis, retry_after, retry_after_millis, storage_key,
    storage_key_escaped,
};
pub use crate::decision::{Decision, decide};
pub use crate::record::{Lease, OwnerToken, Record, RecordState};
pub use crate::timeout::{validate_operation_timeout, with_timeout};
