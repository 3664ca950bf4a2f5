//! The claim: one `EVALSHA` of `lua/claim.lua`, one round trip for every outcome.

use std::sync::LazyLock;
use std::time::Duration;

use idem_core::{
    Checkpoint, ClaimOutcome, ClaimRequest, Lease, OwnerToken, StoreError, StoredResponse,
    Timestamp,
};
use redis::{Script, Value};

use crate::error::{classify, corrupt};
use crate::store::RedisConnection;

const NOW: &str = include_str!("../lua/now.lua");
const FENCE: &str = include_str!("../lua/fence.lua");

/// Every script, with its preludes, hashed once.
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) renew: Script,
    pub(crate) release: Script,
    pub(crate) checkpoint: Script,
    pub(crate) get: Script,
}

fn script(preludes: &[&str], body: &str) -> Script {
    Script::new(&format!("{}\n{body}", preludes.concat()))
}

pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: script(&[NOW], include_str!("../lua/claim.lua")),
    complete: script(&[NOW, FENCE], include_str!("../lua/complete.lua")),
    renew: script(&[NOW, FENCE], include_str!("../lua/renew.lua")),
    release: script(&[NOW, FENCE], include_str!("../lua/release.lua")),
    checkpoint: script(&[NOW, FENCE], include_str!("../lua/checkpoint.lua")),
    get: script(&[NOW], include_str!("../lua/get.lua")),
});

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Claims `request` under the record key `key`.
pub(crate) async fn claim(
    conn: &RedisConnection,
    key: &str,
    request: &ClaimRequest,
) -> Result<ClaimOutcome, StoreError> {
    let owner = OwnerToken::generate();
    let reply: Vec<Value> = SCRIPTS
        .claim
        .key(key)
        .arg(request.fingerprint().as_bytes().as_slice())
        .arg(owner.to_string())
        .arg(millis(request.lease_ttl()))
        .arg(millis(request.retention()))
        .invoke_async(&mut conn.clone())
        .await
        .map_err(|e| classify("claim", e))?;
    decode(&reply, request, owner).ok_or_else(|| corrupt("claim reply"))
}

fn decode(reply: &[Value], request: &ClaimRequest, owner: OwnerToken) -> Option<ClaimOutcome> {
    let outcome = bytes(reply.first()?)?;
    Some(match outcome.as_slice() {
        b"claimed" => {
            let attempt = u32::try_from(int(reply.get(1)?)?).ok()?;
            let expires = Timestamp::from_unix_millis(int(reply.get(2)?)?);
            let checkpoint =
                decode_checkpoint(reply.get(3).and_then(bytes), reply.get(4).and_then(bytes))?;
            let lease = Lease::issued(
                request.scope().clone(),
                owner,
                attempt,
                expires,
                request.retention(),
            );
            ClaimOutcome::Claimed { lease, checkpoint }
        }
        b"in_progress" => ClaimOutcome::InProgress {
            retry_after: Duration::from_millis(u64::try_from(int(reply.get(1)?)?).ok()?.max(1)),
        },
        b"completed" => ClaimOutcome::Completed(decode_response(
            int(reply.get(1)?)?,
            &bytes(reply.get(2)?)?,
            bytes(reply.get(3)?)?,
        )?),
        b"mismatch" => ClaimOutcome::Mismatch,
        _ => return None,
    })
}

/// A bulk or simple string; `None` for nil or anything else.
pub(crate) fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

/// An integer, or a string holding one.
pub(crate) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        other => std::str::from_utf8(&bytes(other)?).ok()?.parse().ok(),
    }
}

/// A checkpoint from its stored name and JSON data: `Some(None)` when there
/// is none, `None` when what is stored is not one.
pub(crate) fn decode_checkpoint(
    name: Option<Vec<u8>>,
    data: Option<Vec<u8>>,
) -> Option<Option<Checkpoint>> {
    match (name, data) {
        (Some(name), Some(data)) => Checkpoint::from_json(
            String::from_utf8(name).ok()?,
            std::str::from_utf8(&data).ok()?,
        )
        .ok()
        .map(Some),
        _ => Some(None),
    }
}

/// A stored response from its status, encoded headers and body.
pub(crate) fn decode_response(
    status: i64,
    headers: &[u8],
    body: Vec<u8>,
) -> Option<StoredResponse> {
    StoredResponse::new(u16::try_from(status).ok()?, body)
        .with_encoded_headers(headers)
        .ok()
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
        let encoded = response.encoded_headers();
        assert_eq!(
            decode_response(200, &encoded, b"b".to_vec()),
            Some(response)
        );
    }

    #[test]
    fn truncated_headers_are_refused() {
        let encoded = StoredResponse::new(200, "")
            .with_header("name", "value")
            .encoded_headers();
        for cut in 1..encoded.len() {
            assert_eq!(
                decode_response(200, &encoded[..cut], Vec::new()),
                None,
                "cut {cut}"
            );
        }
        assert_eq!(decode_response(70_000, &[], Vec::new()), None);
    }
}
