//! The console's page in a real headless Chromium (Debian's `chromium`,
//! driven through `chromedriver` by WebDriver), with JavaScript switched
//! off, against Postgres stores with parked messages: what it shows is
//! what the stores hold, and a retry and a drop (through its confirmation)
//! change the stores.
//!
//! `./scripts/test` installs both (`ensure_chromium`) and names them in
//! `IDEM_CHROMIUM` and `IDEM_CHROMEDRIVER`; without them the test fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{stuck, unique};
use fantoccini::{Client, ClientBuilder, Locator};
use idem_admin::{Admin, ConsumerParking};
use idem_conformance::consumers::Shop;
use idem_consumer::Consumer;
use idem_core::store::{MessageState, ParkedState};
use idem_core::{ConsumerName, IdempotencyKey};
use idem_memory::MemoryStore;

/// A program named by `var`, or found on the `PATH` as `name`.
fn program(var: &str, name: &str) -> String {
    if let Ok(path) = std::env::var(var) {
        return path;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
        .map(|path| path.display().to_string())
        .unwrap_or_else(|| {
            panic!("{name} is missing: run ./scripts/test, whose ensure_chromium installs Debian's chromium and chromium-driver and sets {var}")
        })
}

/// A chromedriver of the test's own on a free loopback port, ended with
/// the test.
struct Driver {
    _process: tokio::process::Child,
    url: String,
}

async fn chromedriver() -> Driver {
    let binary = program("IDEM_CHROMEDRIVER", "chromedriver");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let process = tokio::process::Command::new(&binary)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{binary} never listened on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Driver {
        _process: process,
        url,
    }
}

/// A headless Chromium with a fresh profile, no network of its own, and
/// JavaScript switched off (the page must work without it).
async fn browser(driver: &Driver, profile: &std::path::Path) -> Client {
    let options = serde_json::json!({
        "binary": program("IDEM_CHROMIUM", "chromium"),
        "args": [
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", format!("--user-data-dir={}", profile.display()),
        ],
        "prefs": {"profile.managed_default_content_settings.javascript": 2},
    });
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver")
}

async fn attr(client: &Client, css: &str, name: &str) -> String {
    let Ok(element) = found(client, css).await else {
        panic!("no {css} in {}", client.source().await.unwrap());
    };
    element.attr(name).await.unwrap().unwrap_or_default()
}

/// The element at `css`, waited for: the page a click loads may still be
/// coming on a busy machine, and WebDriver's find does not wait.
async fn found(
    client: &Client,
    css: &str,
) -> Result<fantoccini::elements::Element, fantoccini::error::CmdError> {
    client
        .wait()
        .at_most(std::time::Duration::from_secs(30))
        .for_element(Locator::Css(css))
        .await
}

/// The browser shows the confirmation, and the message is still parked.
async fn confirming(
    client: &Client,
    outbox: &dyn idem_core::store::OutboxStore,
    id: idem_core::store::MessageId,
    why: &str,
) {
    found(client, "#confirm").await.expect(why);
    assert_eq!(
        stuck::outbox_state(outbox, id).await.0,
        MessageState::Parked,
        "{why}"
    );
}

async fn text(client: &Client, css: &str) -> String {
    let element = found(client, css)
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    element.text().await.unwrap()
}

async fn click(client: &Client, css: &str) {
    let element = found(client, css)
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    element.click().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_stores_and_its_forms_retry_and_drop_in_chromium() {
    let stores = common::postgres().await;
    let outbox = stores.outbox.clone().unwrap();
    let parking = stores.parking.clone().unwrap();
    let parked = stuck::parked_outbox(&*outbox, &["order-1", "order-2"]).await;
    let name = unique("shipping");
    stuck::parked_message(&*parking, &name, "m-1", "order-1", "shipped order-1").await;
    let inbox = MemoryStore::new();
    let shop = Shop::new(inbox.clone());
    let consumer = Consumer::new(&name, Arc::new(inbox), parking.clone(), shop.clone()).unwrap();
    let admin = Admin::new()
        .outbox(outbox.clone())
        .consumer(ConsumerParking::with_consumer(&consumer, parking.clone()));
    let base = common::serve(admin).await;

    let driver = chromedriver().await;
    let profile = std::env::temp_dir().join(unique("idem-admin-chromium"));
    let client = browser(&driver, &profile).await;
    // The browser signs in at the service, which sets its session cookie.
    client.goto(&base).await.unwrap();
    let refused = client.source().await.unwrap();
    assert!(
        refused.contains("401") && !refused.contains("outbox"),
        "{refused}"
    );
    client
        .goto(&base.replace("/admin", "/sign-in"))
        .await
        .unwrap();

    // The summary: the figures and the chart are the stores'.
    client.goto(&base).await.unwrap();
    let who = text(&client, "header .who").await;
    assert_eq!(who, format!("operator: {}", common::BROWSER_OPERATOR));
    let outbox_text = text(&client, "#outbox").await;
    assert!(outbox_text.contains("2\nparked"), "{outbox_text}");
    assert_eq!(
        attr(
            &client,
            "svg.chart g.bar[data-label='outbox parked']",
            "data-value"
        )
        .await,
        "2"
    );
    let bar = format!("svg.chart g.bar[data-label='{name} parked']");
    assert_eq!(attr(&client, &bar, "data-value").await, "1");

    // The outbox's list: one row per parked message.
    click(&client, "#outbox a").await;
    let rows = client
        .find_all(Locator::Css("#outbox-parked tr[data-id]"))
        .await
        .unwrap();
    let mut shown = Vec::new();
    for row in rows {
        shown.push(row.attr("data-id").await.unwrap().unwrap());
    }
    shown.sort();
    let mut stored: Vec<_> = parked.iter().map(ToString::to_string).collect();
    stored.sort();
    assert_eq!(shown, stored);

    // Retry the first: the store has it waiting again, due at once.
    click(
        &client,
        &format!("tr[data-id='{}'] button[value='outbox.retry']", parked[0]),
    )
    .await;
    assert_eq!(attr(&client, "#done", "data-state").await, "waiting");
    assert_eq!(attr(&client, "#done", "data-changed").await, "true");
    assert_eq!(
        stuck::outbox_state(&*outbox, parked[0]).await.0,
        MessageState::Waiting
    );

    // Drop the second: a confirmation first, which will not go without its
    // box ticked; then the store has it dropped with the reason.
    click(&client, "#done a").await;
    click(
        &client,
        &format!("tr[data-id='{}'] button[value='outbox.drop']", parked[1]),
    )
    .await;
    confirming(&client, &*outbox, parked[1], "a confirmation page").await;
    let reason = client
        .find(Locator::Css("#confirm textarea[name='reason']"))
        .await
        .unwrap();
    reason.send_keys("refunded by hand").await.unwrap();
    click(&client, "#confirm button[type='submit']").await;
    confirming(
        &client,
        &*outbox,
        parked[1],
        "still the confirmation: the box is not ticked",
    )
    .await;
    click(&client, "#confirm input[name='confirm']").await;
    click(&client, "#confirm button[type='submit']").await;
    assert_eq!(attr(&client, "#done", "data-state").await, "dropped");
    assert_eq!(
        stuck::outbox_state(&*outbox, parked[1]).await,
        (MessageState::Dropped, Some("refunded by hand".to_string()))
    );

    // The consumer's parked message, replayed through its handler.
    client
        .goto(&format!("{base}/consumers/{name}"))
        .await
        .unwrap();
    click(&client, "#consumer-parked button[value='consumer.replay']").await;
    assert_eq!(attr(&client, "#done", "data-state").await, "replayed");
    assert_eq!(shop.effects().await, ["shipped order-1"]);
    let entry = parking
        .get(
            &ConsumerName::new(&name).unwrap(),
            &IdempotencyKey::new("m-1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.state, ParkedState::Replayed);

    client.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&profile);
}
