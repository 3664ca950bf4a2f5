//! What a client and an operator of the service see: an order, its
//! retry, an order no shipment can be made of, and that one dropped by the
//! operator once the consumer parked it.

use std::time::Duration;

use idem_postgres::sqlx::{self, PgPool};
use serde_json::{Value, json};

/// Drives the service at `base`, whose shipments are in `pool`.
pub(crate) async fn run(base: &str, pool: &PgPool) -> Result<(), Box<dyn std::error::Error>> {
    // A client: an order, its retry, and an order no shipment can be made of.
    let client = reqwest::Client::new();
    for (key, body) in [
        ("k-1", json!({"item": "book", "quantity": 2})),
        ("k-1", json!({"item": "book", "quantity": 2})),
        ("k-2", json!({"item": "pen", "quantity": "many"})),
    ] {
        let post = client
            .post(format!("{base}/orders"))
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", "application/json");
        let answer = post.body(body.to_string()).send().await?;
        let replayed = answer.headers().contains_key("idempotent-replayed");
        let (status, text) = (answer.status(), answer.text().await?);
        println!(
            "{key}: {status} {text}{}",
            if replayed { " (replayed)" } else { "" }
        );
    }

    // Once the good order shipped and the poison one parked, an operator drops it.
    let ops = |request: reqwest::RequestBuilder| request.header("x-operator", "ops").send();
    let api = |path: &str| format!("{base}/admin/api/consumers/shipping/{path}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let parked = loop {
        let list: Value =
            serde_json::from_str(&ops(client.get(api("parked"))).await?.text().await?)?;
        let shipped: i64 = sqlx::query_scalar("SELECT count(*) FROM shipments")
            .fetch_one(pool)
            .await?;
        if (list["total"].as_u64(), shipped) == (Some(1), 1) {
            break list["items"][0].clone();
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("after a minute: {shipped} shipped, {list}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "shipped: 1 order; parked: {} ({})",
        parked["id"], parked["reason"]
    );
    let drop = json!({"id": parked["id"], "reason": "refunded by hand"});
    let json = |r: reqwest::RequestBuilder| r.header("content-type", "application/json");
    let dropped = ops(json(client.post(api("drop"))).body(drop.to_string())).await?;
    println!("dropped by the operator: {}", dropped.status());
    Ok(())
}
