//! How a [`Record`] and a [`StoredResponse`] serialise, for a service's
//! admin routes: JSON-friendly, with every byte string as standard base64
//! (padded), since bodies and header values are bytes, not text.
//!
//! Serialisation only: records are written by stores, never read back from
//! an admin's JSON.

use crate::inbound::record::{Checkpoint, Record, RecordState, StoredResponse};
use crate::plumbing::clock::Timestamp;
use crate::plumbing::fencing::OwnerToken;
use base64::display::Base64Display;
use base64::engine::general_purpose::STANDARD;
use serde::ser::{SerializeSeq, SerializeStruct, SerializeTuple};
use serde::{Serialize, Serializer};

/// Bytes as a standard base64 string, written without an intermediate copy.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&Base64Display::new(self.0, &STANDARD))
    }
}

/// Headers as `[name, base64 value]` pairs, in their order.
struct Headers<'a>(&'a [(String, Vec<u8>)]);

impl Serialize for Headers<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for (name, value) in self.0 {
            seq.serialize_element(&HeaderPair(name, value))?;
        }
        seq.end()
    }
}

struct HeaderPair<'a>(&'a str, &'a [u8]);

impl Serialize for HeaderPair<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut pair = serializer.serialize_tuple(2)?;
        pair.serialize_element(self.0)?;
        pair.serialize_element(&Base64(self.1))?;
        pair.end()
    }
}

impl Serialize for StoredResponse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct("StoredResponse", 3)?;
        out.serialize_field("status", &self.status)?;
        out.serialize_field("headers", &Headers(&self.headers))?;
        out.serialize_field("body", &Base64(&self.body))?;
        out.end()
    }
}

/// Unix milliseconds, as every store keeps them.
impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(self.as_unix_millis())
    }
}

/// The UUID's hyphenated text.
impl Serialize for OwnerToken {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Serialize for Checkpoint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct("Checkpoint", 2)?;
        out.serialize_field("name", &self.name)?;
        out.serialize_field("data", &self.data)?;
        out.end()
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (state, lease_expires_at, response) = match self.state() {
            RecordState::InFlight { lease_expires_at } => {
                ("in_flight", Some(*lease_expires_at), None)
            }
            RecordState::Completed { response } => ("completed", None, Some(response)),
        };
        let mut out = serializer.serialize_struct("Record", 10)?;
        out.serialize_field("tenant", self.scope().tenant().as_str())?;
        out.serialize_field("key", self.scope().key().as_str())?;
        out.serialize_field("fingerprint", &self.fingerprint().to_string())?;
        out.serialize_field("owner", &self.owner())?;
        out.serialize_field("attempt", &self.attempt())?;
        out.serialize_field("state", state)?;
        out.serialize_field("lease_expires_at", &lease_expires_at)?;
        out.serialize_field("retained_until", &self.retained_until())?;
        out.serialize_field("checkpoint", &self.checkpoint())?;
        out.serialize_field("response", &response)?;
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use base64::Engine as _;
    use serde_json::json;

    use super::*;
    use crate::{Fingerprint, Scope};

    fn decode(text: &str) -> Vec<u8> {
        STANDARD.decode(text).unwrap()
    }

    #[test]
    fn a_response_serialises_its_bytes_as_base64_in_order() {
        let response = StoredResponse::new(201, vec![0u8, 159, 146, 150])
            .with_header("content-type", "application/json")
            .with_header("x-raw", vec![0xff, 0x00]);
        let value = serde_json::to_value(&response).unwrap();
        assert_eq!(
            value,
            json!({
                "status": 201,
                "headers": [["content-type", "YXBwbGljYXRpb24vanNvbg=="], ["x-raw", "/wA="]],
                "body": "AJ+Slg==",
            })
        );
        assert_eq!(decode(value["body"].as_str().unwrap()), response.body());
    }

    #[test]
    fn a_record_serialises_its_state_times_and_checkpoint() {
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let owner = OwnerToken::generate();
        let fingerprint = Fingerprint::of_bytes(b"req");
        let in_flight = Record::in_flight(
            Scope::parse("acme", "order-1").unwrap(),
            fingerprint,
            owner,
            2,
            now + Duration::from_secs(30),
            now + Duration::from_secs(3600),
        )
        .with_checkpoint(Some(Checkpoint::new("charged", &json!({"id": 7})).unwrap()));
        assert_eq!(
            serde_json::to_value(&in_flight).unwrap(),
            json!({
                "tenant": "acme",
                "key": "order-1",
                "fingerprint": fingerprint.to_string(),
                "owner": owner.to_string(),
                "attempt": 2,
                "state": "in_flight",
                "lease_expires_at": 1_700_000_030_000i64,
                "retained_until": 1_700_003_600_000i64,
                "checkpoint": {"name": "charged", "data": {"id": 7}},
                "response": null,
            })
        );
        let done = in_flight.completed(StoredResponse::new(200, "ok"), now);
        let value = serde_json::to_value(&done).unwrap();
        assert_eq!(value["state"], "completed");
        assert_eq!(value["lease_expires_at"], json!(null));
        assert_eq!(value["checkpoint"], json!(null));
        assert_eq!(
            value["response"],
            json!({"status": 200, "headers": [], "body": "b2s="})
        );
    }
}
