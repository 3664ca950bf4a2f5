//! The console's guards, through a real server on loopback: no route
//! answers without the service's authorization check, no form post from
//! another site (or without the operator's token) changes anything, and
//! every action is traced with the operator and the key's hash, never the
//! key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::{Arc, Mutex};

use common::{Api, stuck};
use idem_admin::{Admin, ConsumerParking};
use idem_core::Idempotency;
use idem_core::store::{MessageState, ParkingStore};
use idem_memory::{MemoryJournal, MemoryOutbox, MemoryParking, MemoryStore};

/// A console over the memory stores with one parked outbox message, and
/// its outbox and parking.
async fn console() -> (String, Arc<MemoryOutbox>, Arc<MemoryParking>, String) {
    let outbox = Arc::new(MemoryOutbox::new());
    let parking = Arc::new(MemoryParking::new());
    let parked = stuck::parked_outbox(&*outbox, &["order-1"]).await;
    stuck::parked_message(&*parking, "shipping", "m-1", "order-1", "x").await;
    let admin = Admin::new()
        .records(Idempotency::new(Arc::new(MemoryStore::new())))
        .outbox(outbox.clone())
        .consumer(ConsumerParking::new("shipping", parking.clone()).unwrap())
        .journal(idem_journal::Journal::new(Arc::new(MemoryJournal::new()), "billing").unwrap());
    let base = common::serve(admin).await;
    (base, outbox, parking, parked[0].to_string())
}

/// Every route of the console, with a body that would act if let in.
fn routes(id: &str) -> Vec<(&'static str, String, String)> {
    let form = format!("action=outbox.drop&id={id}&reason=r&confirm=yes&csrf=x");
    let json = r#"{"id":"m-1","reason":"r","tenant":"t","key":"k","subject":"s","effect":"charge","outcome":"failed","note":"n"}"#.to_string();
    vec![
        ("GET", String::new(), String::new()),
        ("GET", "/outbox".into(), String::new()),
        ("GET", "/consumers/shipping".into(), String::new()),
        ("GET", "/journals/billing".into(), String::new()),
        ("POST", "/records".into(), "tenant=t&key=k&csrf=x".into()),
        ("POST", "/act".into(), form),
        ("GET", "/api/openapi.json".into(), String::new()),
        ("GET", "/api/summary".into(), String::new()),
        ("POST", "/api/records/read".into(), json.clone()),
        ("POST", "/api/records/delete".into(), json.clone()),
        ("GET", "/api/outbox".into(), String::new()),
        ("GET", "/api/outbox/parked".into(), String::new()),
        ("GET", format!("/api/outbox/messages/{id}"), String::new()),
        (
            "POST",
            format!("/api/outbox/messages/{id}/retry"),
            json.clone(),
        ),
        (
            "POST",
            format!("/api/outbox/messages/{id}/drop"),
            json.clone(),
        ),
        (
            "GET",
            "/api/consumers/shipping/parked".into(),
            String::new(),
        ),
        ("GET", "/api/consumers/shipping/stuck".into(), String::new()),
        (
            "POST",
            "/api/consumers/shipping/replay".into(),
            json.clone(),
        ),
        ("POST", "/api/consumers/shipping/drop".into(), json.clone()),
        (
            "GET",
            "/api/journals/billing/attention".into(),
            String::new(),
        ),
        ("POST", "/api/journals/billing/settle".into(), json),
    ]
}

fn request(
    client: &reqwest::Client,
    base: &str,
    (method, path, body): &(&'static str, String, String),
) -> reqwest::RequestBuilder {
    let url = format!("{base}{path}");
    let content_type = if path.starts_with("/api/") {
        "application/json"
    } else {
        "application/x-www-form-urlencoded"
    };
    match *method {
        "GET" => client.get(url),
        _ => client
            .post(url)
            .header("content-type", content_type)
            .body(body.clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_request_the_check_refuses() {
    let (base, _, _, id) = console().await;
    let client = reqwest::Client::new();
    for route in routes(&id) {
        let anonymous = request(&client, &base, &route).send().await.unwrap();
        assert_eq!(anonymous.status(), 401, "{route:?}");
        assert_eq!(
            anonymous.headers()["www-authenticate"],
            "Bearer",
            "{route:?}"
        );
        assert_eq!(
            anonymous.headers()["content-type"],
            "application/problem+json"
        );
        let wrong = request(&client, &base, &route)
            .bearer_auth("not-the-token")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 403, "{route:?}");
        if route.0 == "GET" {
            // The check lets the operator in: the refusals are the check's.
            let allowed = request(&client, &base, &route)
                .bearer_auth(common::TOKEN)
                .send()
                .await
                .unwrap();
            assert_eq!(allowed.status(), 200, "{route:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_change_nothing() {
    let (base, outbox, parking, id) = console().await;
    let client = reqwest::Client::new();
    for route in routes(&id).iter().filter(|r| r.0 == "POST") {
        for token in [None, Some("not-the-token")] {
            let mut refused = request(&client, &base, route);
            if let Some(token) = token {
                refused = refused.bearer_auth(token);
            }
            assert!([401, 403].contains(&refused.send().await.unwrap().status().as_u16()));
        }
    }
    let message = id
        .parse::<uuid::Uuid>()
        .map(idem_core::store::MessageId::from_uuid)
        .unwrap();
    assert_eq!(
        stuck::outbox_state(&*outbox, message).await.0,
        MessageState::Parked
    );
    assert_eq!(
        parking
            .count(&idem_core::ConsumerName::new("shipping").unwrap())
            .await
            .unwrap(),
        1
    );
}

/// The token in a page's forms.
fn token_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a token")
        + 19;
    page[at..].split('"').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cross_site_form_post_is_refused_and_changes_nothing() {
    let (base, outbox, _, id) = console().await;
    let client = reqwest::Client::new();
    let page = client
        .get(format!("{base}/outbox"))
        .header("cookie", common::COOKIE)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let token = token_of(&page.text().await.unwrap());
    let host = base
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let form =
        |token: &str| format!("action=outbox.drop&id={id}&reason=forged&confirm=yes&csrf={token}");
    let post = |body: String| {
        client
            .post(format!("{base}/act"))
            .header("cookie", common::COOKIE)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
    };
    let message = id
        .parse::<uuid::Uuid>()
        .map(idem_core::store::MessageId::from_uuid)
        .unwrap();

    // Another site's page posting with the operator's cookie, and its token
    // even (had it stolen one): refused by where it comes from.
    let cross = post(form(&token))
        .header("origin", "http://evil.test")
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), 403);
    let origin_only = post(form(&token))
        .header("origin", "http://evil.test")
        .send()
        .await
        .unwrap();
    assert_eq!(origin_only.status(), 403);
    // From the console's own origin, but without the operator's token, or
    // with a made-up one, or with another operator's: refused.
    // The real token with its tag's last digit changed: always another
    // token (a replaced letter might not occur in it).
    let altered = {
        let (head, last) = token.split_at(token.len() - 1);
        format!("{head}{}", if last == "0" { "1" } else { "0" })
    };
    assert_ne!(altered, token);
    for forged in [String::new(), "1.00".to_string(), altered] {
        let refused = post(form(&forged))
            .header("origin", format!("http://{host}"))
            .header("sec-fetch-site", "same-origin")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 403, "token {forged:?}");
    }
    let someone_else = client
        .get(format!("{base}/outbox"))
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .unwrap();
    let their_token = token_of(&someone_else.text().await.unwrap());
    let refused = post(form(&their_token)).send().await.unwrap();
    assert_eq!(refused.status(), 403, "another operator's token");
    // A JSON call from another site: refused too.
    let json = client
        .post(format!("{base}/api/outbox/messages/{id}/drop"))
        .bearer_auth(common::TOKEN)
        .header("origin", "http://evil.test")
        .header("content-type", "application/json")
        .body(r#"{"reason":"forged"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 403);
    assert_eq!(
        stuck::outbox_state(&*outbox, message).await.0,
        MessageState::Parked
    );

    // The same post from the console's own page goes through.
    let own = post(form(&token))
        .header("origin", format!("http://{host}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    assert_eq!(
        stuck::outbox_state(&*outbox, message).await.0,
        MessageState::Dropped
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_kept_out_of_caches_and_frames() {
    let (base, ..) = console().await;
    let page = reqwest::Client::new()
        .get(base.clone())
        .header("cookie", common::COOKIE)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["cache-control"], "no-store");
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
}

/// Every field of every event and span, as `name=value`.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<String>>>);

struct Fields<'a>(&'a mut Vec<String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={value:?}", field.name()));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push(format!("{}={value}", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = vec![format!("target={}", event.metadata().target())];
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields.join(" "));
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = vec![format!("span={}", attrs.metadata().name())];
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(fields.join(" "));
    }
}

#[tokio::test]
async fn actions_are_traced_with_the_operator_and_the_keys_hash_never_the_key() {
    use tracing_subscriber::layer::SubscriberExt;
    let recorded = Recorded::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorded.clone()));
    let key = "jane.doe@example.com-checkout";
    let message = "msg-of-jane.doe@example.com";
    let records = Idempotency::new(Arc::new(MemoryStore::new()));
    stuck::completed_record(&records, "acme", key, "ok").await;
    let parking = Arc::new(MemoryParking::new());
    stuck::parked_message(&*parking, "shipping", message, "order-1", "x").await;
    let admin = Admin::new()
        .records(records)
        .consumer(ConsumerParking::new("shipping", parking).unwrap());
    let api = Api::new(common::serve(admin).await);
    let target = serde_json::json!({"tenant": "acme", "key": key});
    api.post("/api/records/read", target.clone()).await;
    api.post("/api/records/delete", target)
        .await
        .assert_done(true, "deleted");
    let drop = serde_json::json!({"id": message, "reason": "customer asked"});
    api.post("/api/consumers/shipping/drop", drop.clone())
        .await
        .assert_done(true, "dropped");
    api.post("/api/consumers/shipping/drop", drop)
        .await
        .assert_done(false, "dropped");

    let lines = recorded.0.lock().unwrap().clone();
    let actions: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("target=idem_admin"))
        .collect();
    assert_eq!(actions.len(), 4, "one event per action: {actions:#?}");
    let delete = actions
        .iter()
        .find(|l| l.contains("action=record.delete"))
        .unwrap();
    assert!(
        delete.contains(&format!("target_hash={}", idem_core::redacted(key))),
        "{delete}"
    );
    assert!(
        delete.contains(&format!("operator={}", common::OPERATOR)),
        "{delete}"
    );
    assert!(
        delete.contains("changed=true") && delete.contains("state=deleted"),
        "{delete}"
    );
    assert!(
        actions.iter().any(|l| l.contains("action=record.read")),
        "reads of a key are traced too"
    );
    let drops: Vec<_> = actions
        .iter()
        .filter(|l| l.contains("action=consumer.drop"))
        .collect();
    assert_eq!(drops.len(), 2);
    assert!(
        drops
            .iter()
            .all(|l| l.contains("reason=customer asked")
                && l.contains(&idem_core::redacted(message))),
        "{drops:#?}"
    );
    assert!(
        drops[1].contains("changed=false"),
        "the repeat says it changed nothing"
    );
    for line in &lines {
        assert!(
            !line.contains("jane.doe"),
            "a key reached the traces: {line}"
        );
    }
}
