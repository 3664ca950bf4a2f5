//! The console's OpenAPI document matches its router: every route of the
//! JSON API is documented and every documented route is served, and each
//! answer holds every property its schema requires.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::stuck;
use idem_admin::{Admin, ConsumerParking};
use idem_core::Idempotency;
use idem_memory::{MemoryJournal, MemoryOutbox, MemoryParking, MemoryStore};
use serde_json::{Value, json};

fn document() -> Value {
    serde_json::from_str(idem_admin::OPENAPI).expect("the document is JSON")
}

/// The `(method, path)` of every route the API's source declares.
fn routes_in_the_source() -> BTreeSet<(String, String)> {
    let source = include_str!("../src/api.rs");
    source
        .lines()
        .filter_map(|line| line.trim().strip_prefix(".route(\""))
        .map(|rest| {
            let (path, handler) = rest.split_once("\", ").expect("a route and its handler");
            let method = handler.split('(').next().expect("a method router");
            (method.to_uppercase(), path.to_string())
        })
        .collect()
}

fn documented_routes(document: &Value) -> BTreeSet<(String, String)> {
    let paths = document["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("a path item");
            methods
                .keys()
                .filter(|method| {
                    ["get", "post", "put", "delete", "patch"].contains(&method.as_str())
                })
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

#[test]
fn every_route_of_the_api_is_documented_and_nothing_else_is() {
    let source = routes_in_the_source();
    assert!(source.len() >= 14, "{source:?}");
    assert_eq!(documented_routes(&document()), source);
}

/// The schema `name`'s properties that an answer must hold.
fn required(document: &Value, schema: &Value) -> Vec<String> {
    let schema = match schema["$ref"].as_str() {
        Some(reference) => {
            let name = reference.trim_start_matches("#/components/schemas/");
            &document["components"]["schemas"][name]
        }
        None => schema,
    };
    schema["required"]
        .as_array()
        .map(|names| {
            names
                .iter()
                .map(|name| name.as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn answer_schema<'a>(document: &'a Value, method: &str, path: &str) -> &'a Value {
    &document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_answers_what_its_schema_requires() {
    let outbox = Arc::new(MemoryOutbox::new());
    let parking = Arc::new(MemoryParking::new());
    let parked = stuck::parked_outbox(&*outbox, &["order-1"]).await;
    stuck::parked_message(&*parking, "shipping", "m-1", "order-1", "x").await;
    let store = Arc::new(MemoryStore::new());
    let records = Idempotency::new(store.clone());
    let admin = Admin::new()
        .records(records)
        .outbox(outbox.clone())
        .consumer(ConsumerParking::new("shipping", parking.clone()).unwrap())
        .journal(idem_journal::Journal::new(Arc::new(MemoryJournal::new()), "billing").unwrap());
    let api = common::Api::new(common::serve(admin).await);
    let document = document();
    let served: Value = api.get("/api/openapi.json").await.json;
    assert_eq!(served, document, "the router serves the document");

    let id = parked[0].to_string();
    // Each documented route, as a client would call it, with what it needs
    // to answer 200; then the answer against its schema.
    let calls: Vec<(&str, String, String, Option<Value>)> = vec![
        ("get", "/api/summary".into(), "/api/summary".into(), None),
        ("get", "/api/outbox".into(), "/api/outbox".into(), None),
        (
            "get",
            "/api/outbox/parked".into(),
            "/api/outbox/parked".into(),
            None,
        ),
        (
            "get",
            "/api/outbox/messages/{id}".into(),
            format!("/api/outbox/messages/{id}"),
            None,
        ),
        (
            "get",
            "/api/consumers/{name}/parked".into(),
            "/api/consumers/shipping/parked".into(),
            None,
        ),
        (
            "get",
            "/api/consumers/{name}/stuck".into(),
            "/api/consumers/shipping/stuck".into(),
            None,
        ),
        (
            "get",
            "/api/journals/{namespace}/attention".into(),
            "/api/journals/billing/attention".into(),
            None,
        ),
        (
            "post",
            "/api/outbox/messages/{id}/retry".into(),
            format!("/api/outbox/messages/{id}/retry"),
            Some(json!({})),
        ),
        (
            "post",
            "/api/consumers/{name}/drop".into(),
            "/api/consumers/shipping/drop".into(),
            Some(json!({"id": "m-1", "reason": "checked"})),
        ),
        (
            "post",
            "/api/records/delete".into(),
            "/api/records/delete".into(),
            Some(json!({"tenant": "t", "key": "k"})),
        ),
    ];
    let mut checked = BTreeSet::new();
    for (method, documented, path, body) in calls {
        let answer = match body {
            None => api.get(&path).await,
            Some(body) => api.post(&path, body).await,
        };
        assert_eq!(answer.status, 200, "{method} {path}: {answer:?}");
        let schema = answer_schema(&document, method, &documented);
        assert!(
            !schema.is_null(),
            "{method} {documented} has no answer schema"
        );
        for property in required(&document, schema) {
            assert!(
                answer.json.get(&property).is_some(),
                "{method} {path}: no {property} in {}",
                answer.json
            );
        }
        // A listing's items hold what their schema requires too.
        let items = required(&document, schema)
            .contains(&"items".to_string())
            .then(|| answer.json["items"].as_array().cloned())
            .flatten()
            .unwrap_or_default();
        let item_schema = {
            let name = schema["$ref"].as_str().unwrap_or_default();
            let name = name.trim_start_matches("#/components/schemas/");
            document["components"]["schemas"][name]["properties"]["items"]["items"].clone()
        };
        for item in items {
            for property in required(&document, &item_schema) {
                assert!(
                    item.get(&property).is_some(),
                    "{path}: no {property} in {item}"
                );
            }
        }
        checked.insert((method.to_uppercase(), documented));
    }
    // The routes left unchecked here answer only with data not made above
    // (a record to read, a message to replay through a consumer, a journal
    // operation to settle); the API's own tests call each of them.
    let unchecked: BTreeSet<_> = documented_routes(&document)
        .difference(&checked)
        .map(|(method, path)| format!("{method} {path}"))
        .collect();
    assert_eq!(
        unchecked,
        [
            "GET /api/openapi.json",
            "POST /api/consumers/{name}/replay",
            "POST /api/journals/{namespace}/settle",
            "POST /api/outbox/messages/{id}/drop",
            "POST /api/records/read",
        ]
        .map(String::from)
        .into_iter()
        .collect()
    );
}
