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
pub use crate::inbound::claim::{
    ClaimOutcome, ClaimRequest, MAX_LEASE, MAX_RETENTION, MIN_DURATION, validate_lease,
    validate_retention,
};
pub use crate::inbound::codec::{
    check_response_size, checkpoint_json, decode_checkpoint, decode_response,
    decode_response_parts, encode_headers, millis, retry_after, retry_after_millis, storage_key,
    storage_key_escaped,
};
pub use crate::inbound::decision::{Decision, decide};
pub use crate::inbound::record::{Lease, Record, RecordState};
pub use crate::inbound::store::{AsDynStore, IdempotencyStore, Transaction, once_each};
pub use crate::journal::operation::{
    Holder, JournalParts, JournalRecord, MAX_LIST, NewOperation, OperationId, OperationKey,
    OperationState,
};
pub use crate::journal::store::{Acquired, Finish, JournalStore, ListQuery, validate_list_limit};
pub use crate::outbox::message::{
    LogPosition, MessageId, MessageParts, MessageState, NewMessage, OutboxMessage, partition_hash,
    partition_of,
};
pub use crate::outbox::store::{
    Advance, AdvancedRead, LogBatch, OutboxStats, OutboxStore, PageAfter, PartitionLease,
    PartitionStats, PublishFailure,
};
pub use crate::parking::message::InboundMessage;
pub use crate::parking::store::{
    NewParked, ParkedMessage, ParkedQuery, ParkedState, ParkingStore, Resolution,
    validate_parking_batch,
};
pub use crate::parking::versions::{VersionCheck, VersionStore};
pub use crate::plumbing::capabilities::{
    Capabilities, ClockSource, Durability, Eviction, TransactionSharing,
};
pub use crate::plumbing::clock::{Clock, SystemClock, Timestamp};
#[cfg(feature = "moka")]
pub use crate::plumbing::expiry::ExpireAfter;
pub use crate::plumbing::fencing::OwnerToken;
pub use crate::plumbing::layer::{Layered, OperationLayer};
pub use crate::plumbing::limits::{
    MAX_OUTBOX_BATCH, MAX_PARTITIONS, MAX_PAYLOAD_BYTES, validate_outbox_batch, validate_partitions,
};
pub use crate::plumbing::options::validate_name;
