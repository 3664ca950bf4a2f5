//! A service's parts start together and stop together.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Service, ServiceError};
use tokio::sync::oneshot;

/// A part that waits for its shutdown, then counts itself stopped.
fn waiting(
    stopped: &Arc<AtomicUsize>,
) -> impl FnOnce(
    idem_core::Shutdown,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), std::io::Error>> + Send>> {
    let stopped = stopped.clone();
    move |stop| {
        Box::pin(async move {
            stop.await;
            // Winding down takes a while: `run` waits for it.
            tokio::time::sleep(Duration::from_millis(20)).await;
            stopped.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
}

#[tokio::test]
async fn the_signal_stops_every_part_and_run_waits_for_each() {
    let stopped = Arc::new(AtomicUsize::new(0));
    let mut service = Service::new();
    service
        .add("relay", waiting(&stopped))
        .add("consumer", waiting(&stopped));
    let (signal, stop) = oneshot::channel::<()>();
    let running = tokio::spawn(service.run(async move {
        let _ = stop.await;
    }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        stopped.load(Ordering::SeqCst),
        0,
        "nothing stops before the signal"
    );
    signal.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(stopped.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_part_that_fails_stops_the_others_and_is_named() {
    let stopped = Arc::new(AtomicUsize::new(0));
    let mut service = Service::new();
    service
        .add("consumer", waiting(&stopped))
        .add("relay", |_stop| async {
            Err::<(), _>(std::io::Error::other("the broker is gone"))
        });
    let answer = service.run(std::future::pending()).await;
    match answer {
        Err(ServiceError::Failed { part, error }) => {
            assert_eq!(part, "relay");
            assert_eq!(error.to_string(), "the broker is gone");
        }
        other => panic!("the failing part: {other:?}"),
    }
    assert_eq!(stopped.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_part_that_panics_stops_the_others_and_is_named() {
    let stopped = Arc::new(AtomicUsize::new(0));
    let mut service = Service::new();
    service
        .add("sweeper", |_stop| async {
            if stopped_early() {
                panic!("a bug in a part");
            }
            Ok::<(), std::io::Error>(())
        })
        .add("consumer", waiting(&stopped));
    let answer = service.run(std::future::pending()).await;
    assert!(
        matches!(answer, Err(ServiceError::Panicked { part: "sweeper" })),
        "{answer:?}"
    );
    assert_eq!(stopped.load(Ordering::SeqCst), 1);
}

/// Always true, so the panic is reached without the compiler seeing a
/// part that never returns.
fn stopped_early() -> bool {
    std::hint::black_box(true)
}

#[tokio::test]
async fn a_part_that_returns_on_its_own_stops_the_service_without_error() {
    let stopped = Arc::new(AtomicUsize::new(0));
    let mut service = Service::new();
    service
        .add("server", |_stop| async { Ok::<(), std::io::Error>(()) })
        .add("relay", waiting(&stopped));
    service.run(std::future::pending()).await.unwrap();
    assert_eq!(stopped.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_service_of_no_part_ends_on_its_signal() {
    Service::new().run(async {}).await.unwrap();
}
