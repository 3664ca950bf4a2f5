//! A TCP proxy on loopback that puts faults between a store and its server:
//! a reply lost after the request was served, a stalled network, cut
//! connections. Backend tests start one in front of their own server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// What the proxy does to traffic now.
#[derive(Debug, Default)]
struct Faults {
    /// Drop the next chunk the server sends and cut that connection: the
    /// request was served, its reply never arrives.
    drop_next_reply: AtomicBool,
    /// Forward nothing in either direction until resumed.
    stalled: AtomicBool,
    /// Bumped to cut every open connection.
    cut_generation: AtomicU64,
    /// Replies dropped so far.
    dropped: AtomicU64,
    changed: Notify,
}

/// A fault-injecting proxy; stops accepting when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// The loopback port clients connect to.
    pub port: u16,
    faults: Arc<Faults>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`
    /// (`host:port`).
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn start(upstream: impl Into<String>) -> Self {
        Self::start_on(0, upstream).await
    }

    /// [`start`](Self::start) on a given loopback port (0: any free one), for
    /// servers that must be told the proxy's port before it starts.
    ///
    /// # Panics
    ///
    /// If the port cannot be bound.
    pub async fn start_on(port: u16, upstream: impl Into<String>) -> Self {
        let upstream = upstream.into();
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        let faults = Arc::new(Faults::default());
        let accepting = Arc::clone(&faults);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let faults = Arc::clone(&accepting);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, faults).await;
                    }
                });
            }
        });
        Self {
            port,
            faults,
            accept,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The next reply from the server is lost, and its connection cut.
    pub fn drop_next_reply(&self) {
        self.faults.drop_next_reply.store(true, Ordering::SeqCst);
    }

    /// How many replies were dropped so far.
    pub fn dropped_replies(&self) -> u64 {
        self.faults.dropped.load(Ordering::SeqCst)
    }

    /// Stops forwarding in both directions, as a network that stalls.
    pub fn stall(&self) {
        self.faults.stalled.store(true, Ordering::SeqCst);
    }

    /// Forwards again after [`stall`](Self::stall).
    pub fn resume(&self) {
        self.faults.stalled.store(false, Ordering::SeqCst);
        self.faults.changed.notify_waiters();
    }

    /// Cuts every open connection (new ones are accepted).
    pub fn cut_all(&self) {
        self.faults.cut_generation.fetch_add(1, Ordering::SeqCst);
        self.faults.changed.notify_waiters();
    }
}

/// Copies both ways until either side closes or a fault cuts the connection.
async fn relay(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let generation = faults.cut_generation.load(Ordering::SeqCst);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = pump(
        &mut client_read,
        &mut server_write,
        &faults,
        generation,
        false,
    );
    let down = pump(
        &mut server_read,
        &mut client_write,
        &faults,
        generation,
        true,
    );
    // Whichever direction ends first ends the connection: both halves drop.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    faults: &Faults,
    generation: u64,
    replies: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let cut = || faults.cut_generation.load(Ordering::SeqCst) != generation;
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = faults.changed.notified() => {
                if cut() { return; }
                continue;
            }
        };
        // A stall holds what was read until resumed (or cut).
        while faults.stalled.load(Ordering::SeqCst) {
            if cut() {
                return;
            }
            tokio::select! {
                () = faults.changed.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if cut() {
            return;
        }
        if replies && faults.drop_next_reply.swap(false, Ordering::SeqCst) {
            faults.dropped.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
