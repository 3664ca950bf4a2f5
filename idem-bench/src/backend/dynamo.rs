//! DynamoDB: the store over an SDK client on a table of the run's own; raw,
//! the store's own update expressions sent with the SDK. The endpoint
//! (`scripts/moto_server.py`) counts the requests each table served.

use std::collections::HashMap;
use std::sync::Arc;

use idem_bench::Outcome;
use idem_core::Scope;
use idem_core::store::{encode_headers, storage_key};
use idem_dynamo::aws_sdk_dynamodb::Client;
use idem_dynamo::aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use idem_dynamo::aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use idem_dynamo::expressions::{CLAIM_CONDITION, CLAIM_UPDATE, COMPLETE_UPDATE, FENCE};
use idem_dynamo::{DynamoOptions, DynamoStore};

use super::{BenchError, Call, LEASE, Parts, RawBaseline, ServerCounter, Settings, env, now};

/// The store's attribute names and values that a refusal is read from.
mod item {
    /// The fingerprint (B).
    pub(super) const FINGERPRINT: &str = "fp";
    /// The state (S): in flight or completed.
    pub(super) const STATE: &str = "st";
    /// The state of a completed record.
    pub(super) const COMPLETED: &str = "c";
    /// The state of a record in flight.
    pub(super) const IN_FLIGHT: &str = "f";
}

/// Connects to `IDEM_DYNAMO_ENDPOINT` with fixed credentials; with `setup`,
/// creates the run's table.
pub(super) async fn connect(settings: &Settings<'_>) -> Result<Parts<Raw, Counter>, BenchError> {
    let endpoint = env("IDEM_DYNAMO_ENDPOINT")?;
    let client = client(&endpoint);
    let store = DynamoStore::with_options(
        client.clone(),
        DynamoOptions::default().table(settings.table),
    )?;
    if settings.setup {
        store.create_table().await?;
    }
    Ok(Parts {
        store: Arc::new(store),
        raw: Raw {
            client: client.clone(),
            table: settings.table.to_string(),
        },
        counter: Counter {
            endpoint,
            table: settings.table.to_string(),
            client,
        },
    })
}

fn client(endpoint: &str) -> Client {
    Client::from_conf(idem_bench::dynamo_config(endpoint).build())
}

fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_string())
}

fn n(value: i64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// The raw baseline: the store's claim and completion `UpdateItem`s.
pub(super) struct Raw {
    client: Client,
    table: String,
}

impl RawBaseline for Raw {
    async fn execute(&self, call: &Call<'_>) -> Result<Outcome, BenchError> {
        let (tenant, op, retention, body) = (call.tenant, call.op, call.retention, &call.response);
        let pk = storage_key(&Scope::parse(tenant, &op.key)?);
        let owner = uuid::Uuid::new_v4().to_string();
        let now = now();
        // A claim keeps the record for its lease at least, as the store's does.
        let claim_until = now + retention.max(LEASE);
        let claimed = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&pk))
            .update_expression(CLAIM_UPDATE)
            .condition_expression(CLAIM_CONDITION)
            .expression_attribute_names("#exp", "exp")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":fp", AttributeValue::B(op.fingerprint.to_vec().into()))
            .expression_attribute_values(":own", s(&owner))
            .expression_attribute_values(":f", s(item::IN_FLIGHT))
            .expression_attribute_values(":lease", n((now + LEASE).as_unix_millis()))
            .expression_attribute_values(":exp", n(claim_until.as_unix_millis()))
            .expression_attribute_values(":ttl", n(claim_until.as_unix_secs_ceil()))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":tenant", s(tenant))
            .expression_attribute_values(":k", s(&op.key))
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match claimed {
            Ok(_) => {}
            Err(error) => {
                return match error.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(failed)) => {
                        refusal(failed.item(), &op.fingerprint)
                    }
                    _ => Err(error.into()),
                };
            }
        }
        let retained_until = now + retention;
        self.client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&pk))
            .update_expression(COMPLETE_UPDATE)
            .condition_expression(FENCE)
            .expression_attribute_names("#exp", "exp")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":own", s(&owner))
            .expression_attribute_values(":f", s(item::IN_FLIGHT))
            .expression_attribute_values(":now", n(now.as_unix_millis()))
            .expression_attribute_values(":c", s(item::COMPLETED))
            .expression_attribute_values(":rs", n(i64::from(body.status())))
            .expression_attribute_values(":rh", AttributeValue::B(encode_headers(body).into()))
            .expression_attribute_values(":rb", AttributeValue::B(body.body().to_vec().into()))
            .expression_attribute_values(":exp", n(retained_until.as_unix_millis()))
            .expression_attribute_values(":ttl", n(retained_until.as_unix_secs_ceil()))
            .expression_attribute_values(":att", n(1))
            .send()
            .await?;
        Ok(Outcome::Executed)
    }
}

/// What a refused claim got, from the item that refused it: the claim's
/// condition refuses only a live item, so its fingerprint and state decide
/// as the store's decision table does (mismatch before replay).
fn refusal(
    old: Option<&HashMap<String, AttributeValue>>,
    fingerprint: &[u8; 32],
) -> Result<Outcome, BenchError> {
    let old = old.ok_or("the claim's condition failed without the item")?;
    let same = matches!(
        old.get(item::FINGERPRINT),
        Some(AttributeValue::B(fp)) if fp.as_ref() == fingerprint.as_slice()
    );
    let completed =
        matches!(old.get(item::STATE), Some(AttributeValue::S(st)) if st == item::COMPLETED);
    Ok(match (same, completed) {
        (false, _) => Outcome::Mismatch,
        (true, true) => Outcome::Replayed,
        (true, false) => Outcome::InProgress,
    })
}

/// Reads the endpoint's request count for the run's table.
pub(super) struct Counter {
    endpoint: String,
    table: String,
    /// Deletes the table after the run.
    client: Client,
}

impl ServerCounter for Counter {
    async fn round_trips(&self) -> Result<u64, BenchError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self
            .endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let mut stream = tokio::net::TcpStream::connect(&addr).await?;
        stream
            .write_all(
                format!(
                    "GET /__idem/requests?table={} HTTP/1.0\r\nHost: {addr}\r\n\r\n",
                    self.table
                )
                .as_bytes(),
            )
            .await?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await?;
        let body = reply
            .split("\r\n\r\n")
            .nth(1)
            .ok_or("no body from the request counter")?;
        let value: serde_json::Value = serde_json::from_str(body)?;
        value["requests"].as_u64().ok_or_else(|| {
            "the DynamoDB endpoint does not count requests (use scripts/moto_server.py)".into()
        })
    }

    async fn clean_up(&self, _tenant: &str) -> Result<(), BenchError> {
        // The table is the run's own: dropping it drops everything the run wrote.
        self.client
            .delete_table()
            .table_name(&self.table)
            .send()
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(fp: &[u8; 32], st: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([
            ("fp".to_string(), AttributeValue::B(fp.to_vec().into())),
            ("st".to_string(), s(st)),
        ])
    }

    #[test]
    fn a_refusal_by_a_completed_item_with_the_same_fingerprint_is_a_replay() {
        let ours = [1; 32];
        assert_eq!(
            refusal(Some(&item(&ours, "c")), &ours).unwrap(),
            Outcome::Replayed
        );
    }

    #[test]
    fn a_refusal_by_an_item_in_flight_with_the_same_fingerprint_is_in_progress() {
        let ours = [1; 32];
        assert_eq!(
            refusal(Some(&item(&ours, "f")), &ours).unwrap(),
            Outcome::InProgress
        );
    }

    #[test]
    fn a_refusal_by_another_fingerprint_is_a_mismatch_whatever_the_state() {
        let ours = [1; 32];
        for st in ["c", "f"] {
            assert_eq!(
                refusal(Some(&item(&[2; 32], st)), &ours).unwrap(),
                Outcome::Mismatch
            );
        }
    }

    #[test]
    fn a_refusal_without_the_item_is_an_error() {
        assert!(refusal(None, &[1; 32]).is_err());
    }
}
