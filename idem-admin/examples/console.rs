//! The operator's console over the in-memory stores, with a few stuck
//! items to look at: a completed record, parked outbox messages, a
//! consumer's parked messages (one its handler now applies, one it still
//! refuses), and journal operations whose outcome is unknown or that need
//! review.
//!
//! ```sh
//! cargo run -p idem-admin --example console    # prints the console's URL
//! ```
//!
//! Its authorization check lets in requests from this machine only (a
//! service checks its own sign-in instead). `IDEM_CONSOLE_ADDR` picks the
//! address (127.0.0.1 and a free port by default).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/stuck.rs"]
mod stuck;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::request::Parts;
use idem_admin::{Admin, ConsumerParking, Operator, Refusal};
use idem_conformance::consumers::Shop;
use idem_consumer::Consumer;
use idem_core::Idempotency;
use idem_core::store::OperationState;
use idem_journal::Journal;
use idem_memory::{MemoryJournal, MemoryOutbox, MemoryParking, MemoryStore};

/// This example's check: the request comes from this machine.
fn local_only(request: &Parts) -> Result<Operator, Refusal> {
    match request.extensions.get::<ConnectInfo<SocketAddr>>() {
        Some(ConnectInfo(peer)) if peer.ip().is_loopback() => {
            Operator::new(format!("local operator ({peer})")).map_err(|_| Refusal::Forbidden)
        }
        _ => Err(Refusal::Forbidden),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let records = Idempotency::new(Arc::new(MemoryStore::new()));
    stuck::completed_record(&records, "acme", "checkout-7f3a", "{\"order\":7}").await;

    let outbox = Arc::new(MemoryOutbox::new());
    stuck::parked_outbox(&*outbox, &["order-17", "order-18", "order-21"]).await;
    for order in ["order-30", "order-31"] {
        stuck::pending_outbox(&*outbox, order).await;
    }

    let (inbox, parking) = (MemoryStore::new(), Arc::new(MemoryParking::new()));
    let shop = Shop::new(inbox.clone());
    let shipping = Consumer::new("shipping", Arc::new(inbox), parking.clone(), shop.clone())?;
    stuck::parked_message(
        &*parking,
        "shipping",
        "msg-1001",
        "order-17",
        "ship order-17",
    )
    .await;
    stuck::parked_message(
        &*parking,
        "shipping",
        "msg-1002",
        "order-18",
        "ship order-18",
    )
    .await;
    // Its handler still refuses this one: a replay parks it again.
    shop.fail("msg-1002", u32::MAX);

    let journal = Arc::new(MemoryJournal::new());
    let unknown = OperationState::Unknown;
    stuck::operation(
        &*journal,
        "billing",
        "order-17",
        unknown,
        "timed out after 30s",
    )
    .await;
    let review = OperationState::NeedsReview;
    stuck::operation(
        &*journal,
        "billing",
        "order-19",
        review,
        "no charge found under the key",
    )
    .await;

    let console = Admin::new()
        .records(records)
        .outbox(outbox)
        .consumer(ConsumerParking::with_consumer(&shipping, parking))
        .journal(Journal::new(journal, "billing")?)
        .authorize(local_only)
        .router();
    let app = axum::Router::new().nest("/admin", console);

    let address = std::env::var("IDEM_CONSOLE_ADDR").unwrap_or_else(|_| "127.0.0.1:0".into());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("console: http://{}/admin", listener.local_addr()?);
    println!(
        "stuck: 3 parked outbox messages (2 pending), 2 parked messages of consumer shipping, 2 billing operations needing a person, a record acme/checkout-7f3a"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
