//! The limits every part checks the same way: a message's type, payload
//! and headers, and the size of a batch.

use crate::plumbing::error::InvalidInput;
use crate::plumbing::scope::check_name;

/// The most messages one claim or listing returns.
pub const MAX_OUTBOX_BATCH: usize = 1_000;

/// The largest payload a message carries, in bytes: brokers' defaults sit
/// near 1 MiB (NATS) to 128 MiB (RabbitMQ); a larger event belongs in a
/// store, referenced.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;

/// A message's type and payload as every store keeps them: a valid name, at
/// most [`MAX_PAYLOAD_BYTES`].
pub(crate) fn typed_payload(kind: &str, payload: &[u8]) -> Result<(), InvalidInput> {
    check_name("message type", kind)?;
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(InvalidInput::TooLong {
            field: "payload",
            len: payload.len(),
            max: MAX_PAYLOAD_BYTES,
        });
    }
    Ok(())
}

/// A message header as every store keeps it: a valid name, a value
/// without control characters.
pub(crate) fn header(name: &str, value: &str) -> Result<(String, String), InvalidInput> {
    check_name("header name", name)?;
    if let Some((position, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidInput::ControlCharacter {
            field: "header value",
            position,
        });
    }
    Ok((name.to_string(), value.to_string()))
}

/// Checks a claim, listing or purge limit: 1 to [`MAX_OUTBOX_BATCH`].
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside it.
pub fn validate_outbox_batch(limit: usize) -> Result<usize, InvalidInput> {
    if (1..=MAX_OUTBOX_BATCH).contains(&limit) {
        Ok(limit)
    } else {
        Err(InvalidInput::OutOfRange {
            field: "batch",
            reason: "must be 1 to 1000",
        })
    }
}

/// The most partitions an outbox has: each is read by one relay at a
/// time, so this bounds how far a backlog is spread.
pub const MAX_PARTITIONS: u32 = 1_024;

/// Checks an outbox's partition count: 1 to [`MAX_PARTITIONS`].
///
/// ```
/// use idem_core::store::validate_partitions;
///
/// assert_eq!(validate_partitions(16)?, 16);
/// assert!(validate_partitions(0).is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside it.
pub fn validate_partitions(count: u32) -> Result<u32, InvalidInput> {
    if (1..=MAX_PARTITIONS).contains(&count) {
        Ok(count)
    } else {
        Err(InvalidInput::OutOfRange {
            field: "partitions",
            reason: "must be 1 to 1024",
        })
    }
}
