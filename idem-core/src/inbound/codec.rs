//! What every store does the same way: storage keys, the response and
//! checkpoint encodings, millisecond conversions, the size check and the
//! in-progress wait. Written once here so no two stores disagree.

use crate::inbound::record::{Checkpoint, StoredResponse};
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::{InvalidInput, StoreError};
use crate::plumbing::scope::Scope;
use serde_json::Value;
use std::time::Duration;

/// The storage key of a scope: `<n>:<tenant>:<key>`, `n` the byte length of
/// the tenant as written. The length prefix makes it injective whatever the
/// parts hold, so no two scopes ever share storage.
///
/// ```
/// use idem_core::Scope;
/// use idem_core::store::storage_key;
///
/// let key = |t, k| storage_key(&Scope::parse(t, k).unwrap());
/// assert_eq!(key("a:b", "c"), "3:a:b:c");
/// assert_eq!(key("a", "b:c"), "1:a:b:c");
/// ```
pub fn storage_key(scope: &Scope) -> String {
    storage_key_escaped(scope, &[])
}

/// [`storage_key`] with `%` and each of `reserved` percent-escaped in the
/// tenant and the key (for stores whose key syntax gives characters a
/// meaning, such as Redis hash tags); `n` counts the escaped tenant.
///
/// ```
/// use idem_core::Scope;
/// use idem_core::store::storage_key_escaped;
///
/// let scope = Scope::parse("a{b}", "50%").unwrap();
/// assert_eq!(storage_key_escaped(&scope, &['{', '}']), "8:a%7Bb%7D:50%25");
/// ```
pub fn storage_key_escaped(scope: &Scope, reserved: &[char]) -> String {
    let mut tenant = String::with_capacity(scope.tenant().as_str().len());
    escape_into(scope.tenant().as_str(), reserved, &mut tenant);
    let mut out = String::with_capacity(tenant.len() + scope.key().as_str().len() + 8);
    out.push_str(&tenant.len().to_string());
    out.push(':');
    out.push_str(&tenant);
    out.push(':');
    escape_into(scope.key().as_str(), reserved, &mut out);
    out
}

fn escape_into(part: &str, reserved: &[char], out: &mut String) {
    if reserved.is_empty() {
        out.push_str(part);
        return;
    }
    let mut rest = part;
    // Copy runs that need no escape whole; most keys have none at all.
    while let Some(at) = rest.find(|c: char| c == '%' || reserved.contains(&c)) {
        out.push_str(&rest[..at]);
        let c = rest[at..].chars().next().unwrap_or('%');
        let mut buf = [0u8; 4];
        for byte in c.encode_utf8(&mut buf).bytes() {
            out.push_str(&format!("%{byte:02X}"));
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.push_str(rest);
}

/// A duration in whole milliseconds, saturating, as stores keep them.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The wait an in-progress answer gives: the lease's remaining time, at
/// least 1 ms (a lease expiring this instant still holds).
pub fn retry_after(lease_expires_at: Timestamp, now: Timestamp) -> Duration {
    lease_expires_at
        .saturating_duration_since(now)
        .max(Duration::from_millis(1))
}

/// [`retry_after`] from the remaining milliseconds a server computed.
pub fn retry_after_millis(remaining: i64) -> Duration {
    Duration::from_millis(u64::try_from(remaining).unwrap_or(0).max(1))
}

/// Refuses a response over `max` bytes (as [`StoredResponse::size`] counts),
/// before anything is written.
///
/// # Errors
///
/// [`StoreError::TooLarge`].
pub fn check_response_size(response: &StoredResponse, max: usize) -> Result<(), StoreError> {
    let size = response.size();
    if size > max {
        return Err(StoreError::TooLarge { size, max });
    }
    Ok(())
}

/// The headers as one byte string, for stores that keep them in one value:
/// for each header a 4-byte big-endian length and the name, then the same
/// for the value. [`decode_response`] reads it back.
///
/// ```
/// use idem_core::StoredResponse;
/// use idem_core::store::{decode_response, encode_headers};
///
/// let response = StoredResponse::new(200, "ok").with_header("x-a", vec![0, 255]);
/// let back = decode_response(200, &encode_headers(&response), b"ok".to_vec());
/// assert_eq!(back, Some(response));
/// ```
pub fn encode_headers(response: &StoredResponse) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(response.headers.len() * 8 + response.size() - response.body.len());
    for (name, value) in &response.headers {
        for part in [name.as_bytes(), value.as_slice()] {
            // A part over 4 GiB cannot be stored anywhere; saturate rather than wrap.
            out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

/// A stored response from its status, the headers [`encode_headers`] wrote
/// and its body; `None` if they do not form one (a status outside `u16`, a
/// truncated header, a name that is not UTF-8).
pub fn decode_response(status: i64, headers: &[u8], body: Vec<u8>) -> Option<StoredResponse> {
    let mut rest = headers;
    let mut take = || -> Option<Option<Vec<u8>>> {
        if rest.is_empty() {
            return Some(None);
        }
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        let part = tail.get(..len)?.to_vec();
        rest = tail.get(len..)?;
        Some(Some(part))
    };
    let mut pairs = Vec::new();
    while let Some(name) = take()? {
        let value = take()??;
        pairs.push((name, value));
    }
    decode_response_parts(status, pairs, body)
}

/// A stored response from its status, header names and values as separate
/// byte strings, and its body; `None` if they do not form one.
pub fn decode_response_parts(
    status: i64,
    headers: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
) -> Option<StoredResponse> {
    let mut response = StoredResponse::new(u16::try_from(status).ok()?, body);
    for (name, value) in headers {
        response
            .headers
            .push((String::from_utf8(name).ok()?, value));
    }
    Some(response)
}

/// A checkpoint's data as compact JSON text, for stores.
pub fn checkpoint_json(checkpoint: &Checkpoint) -> String {
    checkpoint.data.to_string()
}

/// A checkpoint from its stored name and JSON data: `Ok(None)` when neither
/// is stored.
///
/// # Errors
///
/// [`InvalidInput`] when only one part is stored, the JSON does not parse, or
/// the name or data break the checkpoint rules: a store maps it to
/// [`StoreError::Corrupt`].
///
/// ```
/// use idem_core::Checkpoint;
/// use idem_core::store::{checkpoint_json, decode_checkpoint};
///
/// let point = Checkpoint::new("charged", &serde_json::json!({"id": 7}))?;
/// let json = checkpoint_json(&point);
/// assert_eq!(decode_checkpoint(Some("charged"), Some(&json))?, Some(point));
/// assert_eq!(decode_checkpoint(None, None)?, None);
/// assert!(decode_checkpoint(Some("charged"), Some("{")).is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
pub fn decode_checkpoint(
    name: Option<&str>,
    data: Option<&str>,
) -> Result<Option<Checkpoint>, InvalidInput> {
    let malformed = |reason: String| InvalidInput::Malformed {
        field: "checkpoint",
        reason,
    };
    match (name, data) {
        (None, None) => Ok(None),
        (Some(name), Some(json)) => {
            let data: Value = serde_json::from_str(json).map_err(|e| malformed(e.to_string()))?;
            Checkpoint::new(name, &data).map(Some)
        }
        _ => Err(malformed(
            "a name without data, or data without a name".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_their_encoding() {
        let response = StoredResponse::new(200, "b")
            .with_header("a", vec![0, 1, 2])
            .with_header("", Vec::new())
            .with_header("ü", "v");
        let encoded = encode_headers(&response);
        assert_eq!(
            decode_response(200, &encoded, b"b".to_vec()),
            Some(response)
        );
    }

    #[test]
    fn truncated_headers_are_refused() {
        let encoded = encode_headers(&StoredResponse::new(200, "").with_header("name", "value"));
        for cut in 1..encoded.len() {
            assert_eq!(
                decode_response(200, &encoded[..cut], Vec::new()),
                None,
                "cut {cut}"
            );
        }
        assert_eq!(decode_response(70_000, &[], Vec::new()), None);
    }

    #[test]
    fn escaped_storage_keys_cannot_make_two_scopes_meet() {
        let key = |t: &str, k: &str| storage_key_escaped(&Scope::parse(t, k).unwrap(), &['{', '}']);
        assert_ne!(key("a%7B", "b"), key("a{", "b"));
        assert_ne!(key("a:b", "c"), key("a", "b:c"));
        assert_eq!(key("ü", "k"), "2:ü:k");
    }

    #[test]
    fn retry_after_is_never_zero() {
        let now = Timestamp::from_unix_millis(10);
        assert_eq!(retry_after(now, now), Duration::from_millis(1));
        assert_eq!(retry_after_millis(-5), Duration::from_millis(1));
        assert_eq!(
            retry_after(now + Duration::from_secs(2), now),
            Duration::from_secs(2)
        );
    }
}
