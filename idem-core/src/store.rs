#![doc = include_str!("../CONTRACT.md")]
/// Implements [`JournalStore`] for a type by forwarding every operation to
/// a field that is a journal store; see [`Layered`].
pub use crate::__forward_journal_store as forward_journal_store;
/// Implements [`OutboxStore`] for a type by forwarding every operation to a
/// field that is an outbox store; see [`Layered`].
pub use crate::__forward_outbox_store as forward_outbox_store;
/// Implements [`ParkingStore`] for a type by forwarding every operation to
/// a field that is a parking store; see [`Layered`].
pub use crate::__forward_parking_store as forward_parking_store;
/// Implements [`IdempotencyStore`] for a type by forwarding every operation
/// to a field that is a store; see [`Layered`].
pub use crate::__forward_store as forward_store;
pub use crate::backend::{
    Capabilities, ClockSource, Durability, Eviction, IdempotencyStore, Transaction,
    TransactionSharing,
};
pub use crate::claim::{
    ClaimOutcome, ClaimRequest, MAX_LEASE, MAX_RETENTION, MIN_DURATION, validate_lease,
    validate_retention,
};
pub use crate::clock::{Clock, SystemClock, Timestamp};
pub use crate::codec::{
    check_response_size, checkpoint_json, decode_checkpoint, decode_response,
    decode_response_parts, encode_headers, millis, retry_after, retry_after_millis, storage_key,
    storage_key_escaped,
};
pub use crate::decision::{Decision, decide};
#[cfg(feature = "moka")]
pub use crate::expiry::ExpireAfter;
pub use crate::journal::{
    Acquired, Finish, Holder, JournalParts, JournalRecord, JournalStore, ListQuery, MAX_LIST,
    NewOperation, OperationId, OperationKey, OperationState, validate_list_limit,
};
pub use crate::layer::{Layered, OperationLayer};
pub use crate::options::validate_name;
pub use crate::outbox::{
    BatchClaim, MAX_OUTBOX_BATCH, MAX_PAYLOAD_BYTES, MessageId, MessageParts, MessageState,
    NewMessage, OutboxMessage, OutboxStats, OutboxStore, PublishFailure, validate_outbox_batch,
};
pub use crate::parking::{
    InboundMessage, NewParked, ParkedMessage, ParkedQuery, ParkedState, ParkingStore, Resolution,
    VersionCheck, VersionStore, validate_parking_batch,
};
pub use crate::record::{Lease, OwnerToken, Record, RecordState};
