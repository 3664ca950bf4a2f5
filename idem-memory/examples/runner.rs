//! A checkout endpoint made idempotent on the in-memory store.
//!
//! It shows the four things a client can meet: a first execution, a retry
//! that replays the stored response, a duplicate that arrives while the first
//! request is still running, and a key reused for a different order.
//!
//! Run with `cargo run -p idem-memory --example runner`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::store::IdempotencyStore;
use idem_core::{Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoredResponse};
use idem_memory::MemoryStore;
use tokio::sync::oneshot;

type Checkout = Idempotency<dyn IdempotencyStore>;

/// The handler: charges the card once and answers with an order number.
async fn checkout(
    idem: &Checkout,
    key: &str,
    body: &str,
    charges: &Arc<AtomicU32>,
    slow: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>,
) -> String {
    let scope = match Scope::parse("shop-eu", key) {
        Ok(scope) => scope,
        Err(e) => return format!("400 {e}"),
    };
    let fingerprint = match Fingerprint::json(body) {
        Ok(fp) => fp,
        Err(e) => return format!("400 {e}"),
    };
    let charges = Arc::clone(charges);
    let result = idem
        .run(scope, fingerprint, |ctx| async move {
            // The payment provider gets a key that is the same on every attempt.
            let _provider_key = ctx.downstream_key("charge");
            let order = charges.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some((started, finish)) = slow {
                // A slow payment provider.
                let _ = started.send(());
                let _ = finish.await;
            }
            Ok(StoredResponse::new(201, format!("order #{order} placed")))
        })
        .await;
    match result {
        Ok(RunOutcome::Executed(r)) => format!("{} {} (executed)", r.status(), text(&r)),
        Ok(RunOutcome::Replayed(r)) => format!("{} {} (replayed)", r.status(), text(&r)),
        Err(RunError::InProgress { retry_after }) => format!(
            "409 in progress, Retry-After: {}s",
            retry_after.as_secs().max(1)
        ),
        Err(RunError::Mismatch) => "422 key reused with a different request".to_string(),
        Err(e) => format!("500 {e}"),
    }
}

fn text(response: &StoredResponse) -> String {
    String::from_utf8_lossy(response.body()).into_owned()
}

#[tokio::main]
async fn main() {
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let idem: Arc<Checkout> = Arc::new(Idempotency::new(store));
    let charges = Arc::new(AtomicU32::new(0));
    let cart = r#"{"cart": ["book", "lamp"], "total": 59.9}"#;

    println!(
        "first attempt:        {}",
        checkout(&idem, "a1b2", cart, &charges, None).await
    );
    // The client timed out and retries, its JSON serialised another way.
    let same_cart = r#"{ "total": 59.90, "cart": ["book", "lamp"] }"#;
    println!(
        "retry:                {}",
        checkout(&idem, "a1b2", same_cart, &charges, None).await
    );

    // A double click: the second request arrives while the first still runs.
    let (started_tx, started) = oneshot::channel();
    let (finish, finish_rx) = oneshot::channel();
    let slow = {
        let (idem, charges) = (Arc::clone(&idem), Arc::clone(&charges));
        let hold = Some((started_tx, finish_rx));
        tokio::spawn(async move { checkout(&idem, "c3d4", cart, &charges, hold).await })
    };
    let _ = started.await;
    println!(
        "concurrent duplicate: {}",
        checkout(&idem, "c3d4", cart, &charges, None).await
    );
    let _ = finish.send(());
    let first = slow.await.unwrap_or_else(|e| format!("500 {e}"));
    println!("  (the slow one:      {first})");

    let other_cart = r#"{"cart": ["sofa"], "total": 899}"#;
    println!(
        "key reused:           {}",
        checkout(&idem, "a1b2", other_cart, &charges, None).await
    );
    println!("cards charged:        {}", charges.load(Ordering::SeqCst));
}
