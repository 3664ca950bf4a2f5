//! A loopback TCP proxy that counts Postgres round trips on the wire.
//!
//! Every round trip of the protocol ends in one ReadyForQuery from the
//! server, answering one Sync (extended protocol) or one Query (simple
//! protocol) from the client. A Sync sent on its own, with no statement
//! before it, is a ping: sqlx's pool pings each connection as it returns to
//! the pool, in the background, after the caller has its answer. A Sync
//! after a Parse and a Describe with no Execute prepares a statement (sqlx
//! does at a statement's first use on each connection). The proxy counts
//! statements, prepares and pings apart. Started with a delay, it also holds
//! every byte that long each way, as a server that far away would.

#![allow(unreachable_pub, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

#[derive(Default)]
pub struct Counts {
    /// ReadyForQuery messages from the server: every round trip.
    pub ready: AtomicU64,
    /// Round trips that carried a statement.
    pub statements: AtomicU64,
    /// Round trips that prepared a statement without running one (sqlx's
    /// Parse and Describe, at a statement's first use on a connection).
    pub prepares: AtomicU64,
    /// Round trips that carried nothing but a Sync.
    pub pings: AtomicU64,
    /// Release checks of a guarded pool (`idem_postgres::guarded`): a
    /// simple query of its probe, in the background as a connection
    /// returns to the pool, like the ping.
    pub checks: AtomicU64,
}

/// What the guard's probe carries: it is told apart from statements.
const PROBE_MARK: &[u8] = b"idem: released inside a transaction block?";

pub struct CountingProxy {
    pub port: u16,
    pub counts: Arc<Counts>,
}

impl CountingProxy {
    /// Listens on a free loopback port and forwards to `upstream` (host:port).
    /// Clients must not ask for TLS (`sslmode=disable`).
    pub async fn start(upstream: String) -> Self {
        Self::start_delayed(upstream, Duration::ZERO).await
    }

    /// [`start`](Self::start), each byte forwarded `delay` after it came,
    /// either way, without holding back what follows it (Nagle's algorithm
    /// off then, as it would be over a real network's latency).
    pub async fn start_delayed(upstream: String, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream)
                    .await
                    .expect("connect upstream");
                if !delay.is_zero() {
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                }
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(forward(
                    client_read,
                    Sink::new(server_write, delay),
                    Arc::clone(&shared),
                    true,
                ));
                tokio::spawn(forward(
                    server_read,
                    Sink::new(client_write, delay),
                    Arc::clone(&shared),
                    false,
                ));
            }
        });
        Self { port, counts }
    }

    pub fn statements(&self) -> u64 {
        self.counts.statements.load(Ordering::SeqCst)
    }

    pub fn ready(&self) -> u64 {
        self.counts.ready.load(Ordering::SeqCst)
    }
}

/// Where a direction's bytes go: at once, or through a task that writes
/// each chunk once its delay has passed.
enum Sink {
    Now(OwnedWriteHalf),
    Later(Duration, mpsc::UnboundedSender<(Instant, Vec<u8>)>),
}

impl Sink {
    fn new(mut to: OwnedWriteHalf, delay: Duration) -> Self {
        if delay.is_zero() {
            return Self::Now(to);
        }
        let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        tokio::spawn(async move {
            while let Some((at, chunk)) = due.recv().await {
                tokio::time::sleep_until(at).await;
                if to.write_all(&chunk).await.is_err() {
                    break;
                }
            }
        });
        Self::Later(delay, chunks)
    }

    /// Whether the bytes went (or will go).
    async fn send(&mut self, bytes: &[u8]) -> bool {
        match self {
            Self::Now(to) => to.write_all(bytes).await.is_ok(),
            Self::Later(delay, chunks) => chunks
                .send((Instant::now() + *delay, bytes.to_vec()))
                .is_ok(),
        }
    }
}

async fn forward(mut from: OwnedReadHalf, mut to: Sink, counts: Arc<Counts>, client: bool) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // The client's startup message has no type byte: skip it.
    let mut startup = client;
    // What the client sent since its last Sync: nothing (None), or
    // messages, with an Execute among them or not.
    let mut since_sync: Option<bool> = None;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            let (kind, header) = if startup {
                (0u8, 0usize)
            } else {
                (pending.first().copied().unwrap_or(0), 1)
            };
            if pending.len() < header + 4 {
                break;
            }
            let len = u32::from_be_bytes([
                pending[header],
                pending[header + 1],
                pending[header + 2],
                pending[header + 3],
            ]) as usize;
            if pending.len() < header + len {
                break;
            }
            let probe = client
                && kind == b'Q'
                && pending[header + 4..header + len]
                    .windows(PROBE_MARK.len())
                    .any(|w| w == PROBE_MARK);
            pending.drain(..header + len);
            if startup {
                startup = false;
                continue;
            }
            match (client, kind) {
                (false, b'Z') => {
                    counts.ready.fetch_add(1, Ordering::SeqCst);
                }
                (true, b'S') => {
                    let counter = match since_sync.take() {
                        Some(true) => &counts.statements,
                        Some(false) => &counts.prepares,
                        None => &counts.pings,
                    };
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                (true, b'Q') if probe => {
                    counts.checks.fetch_add(1, Ordering::SeqCst);
                }
                (true, b'Q') => {
                    counts.statements.fetch_add(1, Ordering::SeqCst);
                }
                (true, kind) => {
                    let executed = since_sync.unwrap_or(false) || kind == b'E';
                    since_sync = Some(executed);
                }
                (false, _) => {}
            }
        }
        if !to.send(&buf[..n]).await {
            break;
        }
    }
}
