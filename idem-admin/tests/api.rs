//! The JSON API on every backend that has each part, through a real server
//! on loopback and a real HTTP client: what it shows is what the stores
//! hold, every action changes the stores, and a second one answers what
//! the first did.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::{Api, Stores, stuck, unique};
use idem_admin::{Admin, ConsumerParking};
use idem_conformance::consumers::Shop;
use idem_consumer::Consumer;
use idem_core::store::{MessageState, OperationState, ParkedState};
use idem_core::{ConsumerName, Idempotency, IdempotencyKey};
use idem_journal::Journal;
use idem_memory::MemoryStore;
use serde_json::json;

/// What a scenario built, to check the stores after the API's actions.
struct Built {
    tenant: String,
    consumer: Option<(String, Shop)>,
    namespace: String,
}

/// A console over every part `stores` has, with a consumer (its inbox in
/// memory, its parking in the backend's store) and a journal.
fn console(stores: &Stores) -> (Admin, Built) {
    let mut admin = Admin::new();
    let tenant = unique("tenant");
    let namespace = unique("billing");
    if let Some(records) = &stores.records {
        admin = admin.records(Idempotency::new(records.clone()));
    }
    if let Some(outbox) = &stores.outbox {
        admin = admin.outbox(outbox.clone());
    }
    let mut consumer = None;
    if let Some(parking) = &stores.parking {
        let name = unique("shipping");
        let inbox = MemoryStore::new();
        let shop = Shop::new(inbox.clone());
        let handle = Consumer::new(&name, Arc::new(inbox), parking.clone(), shop.clone()).unwrap();
        admin = admin
            .consumer(ConsumerParking::with_consumer(&handle, parking.clone()))
            .consumer(ConsumerParking::new(&format!("{name}-cli"), parking.clone()).unwrap());
        consumer = Some((name, shop));
    }
    if let Some(journal) = &stores.journal {
        admin = admin.journal(Journal::new(journal.clone(), &namespace).unwrap());
    }
    (
        admin,
        Built {
            tenant,
            consumer,
            namespace,
        },
    )
}

async fn records(api: &Api, stores: &Stores, built: &Built) {
    let idem = Idempotency::new(stores.records.clone().unwrap());
    stuck::completed_record(&idem, &built.tenant, "pay-1", "order placed").await;
    let read = api
        .post(
            "/api/records/read",
            json!({"tenant": built.tenant, "key": "pay-1"}),
        )
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.json["state"], "completed");
    assert_eq!(read.json["key"], "pay-1");
    assert_eq!(read.json["response"]["status"], 201);

    let unknown = json!({"tenant": built.tenant, "key": "never-used"});
    api.post("/api/records/read", unknown)
        .await
        .assert_problem(404, "not_found");
    let bad = json!({"tenant": built.tenant, "key": ""});
    api.post("/api/records/read", bad)
        .await
        .assert_problem(400, "invalid_input");

    let target = json!({"tenant": built.tenant, "key": "pay-1"});
    api.post("/api/records/delete", target.clone())
        .await
        .assert_done(true, "deleted");
    api.post("/api/records/delete", target.clone())
        .await
        .assert_done(false, "absent");
    api.post("/api/records/read", target)
        .await
        .assert_problem(404, "not_found");
    let scope = idem_core::Scope::parse(&built.tenant, "pay-1").unwrap();
    assert!(
        idem.get(&scope).await.unwrap().is_none(),
        "the store still has the record"
    );
}

async fn outbox(api: &Api, stores: &Stores) {
    let store = stores.outbox.clone().unwrap();
    let parked = stuck::parked_outbox(&*store, &["order-1", "order-2", "order-3"]).await;
    stuck::pending_outbox(&*store, "order-9").await;

    let summary = api.get("/api/outbox").await;
    assert_eq!(summary.status, 200, "{summary:?}");
    assert_eq!(summary.json["parked"], 3);
    assert_eq!(summary.json["pending"], 1);
    assert!(
        summary.json["oldest_pending_age_ms"].is_u64(),
        "{summary:?}"
    );
    assert!(summary.json["partitions"].is_array(), "{summary:?}");

    let first = api.get("/api/outbox/parked?limit=2").await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.json["total"], 3);
    assert_eq!(first.json["next_offset"], 2);
    let second = api.get("/api/outbox/parked?offset=2&limit=2").await;
    assert_eq!(
        second.json["items"][0]["last_error"],
        "broker refused: no route"
    );
    assert!(second.json["next_offset"].is_null(), "{second:?}");
    let mut ids: Vec<_> = [&first, &second]
        .iter()
        .flat_map(|page| page.json["items"].as_array().unwrap().clone())
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want: Vec<_> = parked.iter().map(ToString::to_string).collect();
    want.sort();
    assert_eq!(ids, want, "the two pages hold every parked message once");
    api.get("/api/outbox/parked?offset=999&limit=2")
        .await
        .assert_problem(400, "invalid_input");

    let retry = format!("/api/outbox/messages/{}/retry", parked[0]);
    api.post(&retry, json!({}))
        .await
        .assert_done(true, "waiting");
    api.post(&retry, json!({}))
        .await
        .assert_done(false, "waiting");
    assert_eq!(
        stuck::outbox_state(&*store, parked[0]).await.0,
        MessageState::Waiting
    );

    let drop = format!("/api/outbox/messages/{}/drop", parked[1]);
    api.post(&drop, json!({"reason": ""}))
        .await
        .assert_problem(400, "invalid_input");
    assert_eq!(
        stuck::outbox_state(&*store, parked[1]).await.0,
        MessageState::Parked
    );
    let first_drop = api.post(&drop, json!({"reason": "refunded by hand"})).await;
    first_drop.assert_done(true, "dropped");
    let again = api.post(&drop, json!({"reason": "another reason"})).await;
    again.assert_done(false, "dropped");
    assert_eq!(
        again.json["detail"], "refunded by hand",
        "the repeat answers the first drop"
    );
    assert_eq!(
        stuck::outbox_state(&*store, parked[1]).await,
        (MessageState::Dropped, Some("refunded by hand".to_string()))
    );
    let retry_dropped = format!("/api/outbox/messages/{}/retry", parked[1]);
    api.post(&retry_dropped, json!({}))
        .await
        .assert_problem(409, "conflict");

    let one = api
        .get(&format!("/api/outbox/messages/{}", parked[2]))
        .await;
    assert_eq!(one.json["state"], "parked", "{one:?}");
    assert_eq!(one.json["payload"]["data"], "{\"order\":\"order-3\"}");
    let nobody = uuid::Uuid::new_v4();
    api.get(&format!("/api/outbox/messages/{nobody}"))
        .await
        .assert_problem(404, "not_found");
    api.post(&format!("/api/outbox/messages/{nobody}/retry"), json!({}))
        .await
        .assert_problem(404, "not_found");
    api.post("/api/outbox/messages/not-a-uuid/retry", json!({}))
        .await
        .assert_problem(400, "invalid_input");
}

async fn consumers(api: &Api, stores: &Stores, built: &Built) {
    let parking = stores.parking.clone().unwrap();
    let (name, shop) = built.consumer.as_ref().unwrap();
    stuck::parked_message(&*parking, name, "m-1", "order-1", "shipped order-1").await;
    stuck::parked_message(&*parking, name, "m-2", "order-2", "shipped order-2").await;

    let listed = api.get(&format!("/api/consumers/{name}/parked")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(listed.json["total"], 2);
    let none = api.get(&format!("/api/consumers/{name}/stuck")).await;
    assert_eq!(none.json["total"], 0, "{none:?}");
    assert_eq!(listed.json["items"][0]["id"], "m-1");
    assert_eq!(
        listed.json["items"][0]["reason"],
        "no carrier ships a lost order"
    );

    let replay = format!("/api/consumers/{name}/replay");
    let replayed = api.post(&replay, json!({"id": "m-1"})).await;
    replayed.assert_done(true, "replayed");
    assert_eq!(replayed.json["detail"], "applied");
    api.post(&replay, json!({"id": "m-1"}))
        .await
        .assert_done(false, "replayed");
    assert_eq!(
        shop.effects().await,
        ["shipped order-1"],
        "the handler ran once"
    );

    let drop = format!("/api/consumers/{name}/drop");
    api.post(&drop, json!({"id": "m-2"}))
        .await
        .assert_problem(400, "invalid_input");
    api.post(&drop, json!({"id": "m-2", "reason": "order cancelled"}))
        .await
        .assert_done(true, "dropped");
    let again = api
        .post(&drop, json!({"id": "m-2", "reason": "twice"}))
        .await;
    again.assert_done(false, "dropped");
    assert_eq!(again.json["detail"], "order cancelled");
    api.post(&replay, json!({"id": "m-2"}))
        .await
        .assert_problem(409, "conflict");

    // Versions 3 and 4 of order-9 parked behind the aggregate at 1: stuck,
    // waiting for version 2, which no parked message holds.
    stuck::parked_gap(&*parking, name, "m-9-4", "order-9", (1, 4)).await;
    stuck::parked_gap(&*parking, name, "m-9-3", "order-9", (1, 3)).await;
    let found = api.get(&format!("/api/consumers/{name}/stuck")).await;
    assert_eq!(found.status, 200, "{found:?}");
    assert_eq!(found.json["total"], 1, "{found:?}");
    let order = &found.json["items"][0];
    assert_eq!(
        (
            &order["aggregate"],
            &order["waiting_for"],
            &order["oldest_parked"],
            &order["parked"]
        ),
        (&json!("order-9"), &json!(2), &json!(3), &json!(2)),
        "{found:?}"
    );
    api.get("/api/consumers/nobody/stuck")
        .await
        .assert_problem(404, "absent");
    // Version 2 is lost for good: the operator drops what waits for it.
    for id in ["m-9-3", "m-9-4"] {
        api.post(&drop, json!({"id": id, "reason": "version 2 was lost"}))
            .await
            .assert_done(true, "dropped");
    }
    let none = api.get(&format!("/api/consumers/{name}/stuck")).await;
    assert_eq!(none.json["total"], 0, "{none:?}");
    api.post(&drop, json!({"id": "m-1", "reason": "late"}))
        .await
        .assert_problem(409, "conflict");
    let consumer = ConsumerName::new(name).unwrap();
    let entry = parking
        .get(&consumer, &IdempotencyKey::new("m-2").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.state, ParkedState::Dropped);
    assert_eq!(entry.resolution.as_deref(), Some("order cancelled"));
    let entry = parking
        .get(&consumer, &IdempotencyKey::new("m-1").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.state, ParkedState::Replayed);
    api.post(&replay, json!({"id": "m-404"}))
        .await
        .assert_problem(404, "not_found");

    // Parking alone, as the command line has it: a replay is refused.
    let cli = format!("{name}-cli");
    stuck::parked_message(&*parking, &cli, "m-3", "order-3", "x").await;
    let refused = api
        .post(
            &format!("/api/consumers/{cli}/replay"),
            json!({"id": "m-3"}),
        )
        .await;
    refused.assert_problem(501, "replay_needs_handler");
    api.get("/api/consumers/nobody/parked")
        .await
        .assert_problem(404, "absent");
}

async fn journal(api: &Api, stores: &Stores, built: &Built) {
    let store = stores.journal.clone().unwrap();
    let ns = &built.namespace;
    stuck::operation(&*store, ns, "order-1", OperationState::Unknown, "timed out").await;
    stuck::operation(
        &*store,
        ns,
        "order-2",
        OperationState::NeedsReview,
        "no match",
    )
    .await;
    stuck::operation(&*store, ns, "order-3", OperationState::Pending, "").await;
    // Another namespace's never shows.
    stuck::operation(
        &*store,
        &unique("other"),
        "order-4",
        OperationState::Unknown,
        "x",
    )
    .await;

    let listed = api.get(&format!("/api/journals/{ns}/attention")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let subjects: Vec<_> = listed
        .json
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["subject"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(subjects.len(), 2, "{listed:?}");
    assert!(subjects.contains(&"order-1".to_string()) && subjects.contains(&"order-2".to_string()));

    let settle = format!("/api/journals/{ns}/settle");
    let answer = json!({"subject": "order-1", "effect": "charge", "outcome": "succeeded", "provider_id": "ch_1", "note": "seen in the dashboard"});
    api.post(
        &settle,
        json!({"subject": "order-1", "effect": "charge", "outcome": "succeeded", "note": " "}),
    )
    .await
    .assert_problem(400, "invalid_input");
    api.post(&settle, answer.clone())
        .await
        .assert_done(true, "succeeded");
    let again = api.post(&settle, answer).await;
    again.assert_done(false, "succeeded");
    assert!(
        again.json["detail"]
            .as_str()
            .unwrap()
            .contains("seen in the dashboard"),
        "{again:?}"
    );
    let otherwise =
        json!({"subject": "order-1", "effect": "charge", "outcome": "failed", "note": "no"});
    api.post(&settle, otherwise)
        .await
        .assert_problem(409, "conflict");
    let nobody =
        json!({"subject": "order-404", "effect": "charge", "outcome": "failed", "note": "no"});
    api.post(&settle, nobody)
        .await
        .assert_problem(404, "not_found");
    let journal = Journal::new(store, ns).unwrap();
    let id = idem_journal::OperationId::new("order-1", "charge").unwrap();
    let settled = journal.get(&id).await.unwrap().unwrap();
    assert_eq!(settled.state(), OperationState::Succeeded);
    assert_eq!(settled.parts().provider_id.as_deref(), Some("ch_1"));
}

async fn scenario(stores: Stores) {
    let (admin, built) = console(&stores);
    let api = Api::new(common::serve(admin).await);
    if stores.records.is_some() {
        records(&api, &stores, &built).await;
    } else {
        api.post("/api/records/read", json!({"tenant": "t", "key": "k"}))
            .await
            .assert_problem(404, "absent");
    }
    if stores.outbox.is_some() {
        outbox(&api, &stores).await;
    } else {
        api.get("/api/outbox").await.assert_problem(404, "absent");
    }
    if stores.parking.is_some() {
        consumers(&api, &stores, &built).await;
    }
    if stores.journal.is_some() {
        journal(&api, &stores, &built).await;
    }
    let summary = api.get("/api/summary").await;
    assert_eq!(summary.status, 200, "{summary:?}");
    assert_eq!(summary.json["records"], stores.records.is_some());
    if stores.outbox.is_some() {
        assert_eq!(summary.json["outbox"]["parked"], 1, "{summary:?}");
    }
    if let Some((name, _)) = &built.consumer {
        let consumers = summary.json["consumers"].as_array().unwrap();
        let this = consumers
            .iter()
            .find(|c| c["name"] == name.as_str())
            .unwrap();
        assert_eq!(this["parked"]["count"], 0, "{summary:?}");
        assert_eq!(this["replays"], true);
    }
    if stores.journal.is_some() {
        assert_eq!(
            summary.json["journals"][0]["attention"]["needs_review"], 1,
            "{summary:?}"
        );
        assert_eq!(
            summary.json["journals"][0]["attention"]["unknown"], 0,
            "{summary:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_api_mends_every_part_on_memory() {
    scenario(common::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_api_mends_every_part_on_postgres() {
    scenario(common::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_api_mends_records_and_journals_on_redis() {
    scenario(common::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_api_mends_records_parking_and_journals_on_dynamodb() {
    scenario(common::dynamo().await).await;
}

/// A store failure answers a fixed detail naming an incident, never the
/// store's text (a Postgres message names a row's values). (The console's
/// problem carried the store's message.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_answers_an_incident_never_the_stores_text() {
    use idem_conformance::support::{LEAKY_SECRET, LeakyStore};

    let admin = Admin::new().records(Idempotency::new(Arc::new(LeakyStore)));
    let api = Api::new(common::serve(admin).await);
    let read = api
        .post(
            "/api/records/read",
            json!({"tenant": unique("tenant"), "key": "pay-1"}),
        )
        .await;
    read.assert_problem(500, "store_failed");
    let text = read.json.to_string();
    assert!(!text.contains("jane@example.com"), "{text}");
    assert!(!text.contains(LEAKY_SECRET), "{text}");
    let detail = read.json["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("The records store failed; the operator finds it as incident "),
        "{detail}"
    );
}
