//! Connections to the test servers named by `IDEM_REDIS_URL` and
//! `IDEM_REDIS_CLUSTER_URLS`, and private servers for tests that restart,
//! misconfigure or count one.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::expect_used,
    clippy::panic,
    clippy::unwrap_used
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use idem_redis::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use idem_redis::redis::cluster::ClusterClientBuilder;
use idem_redis::{RedisOptions, RedisStore, redis};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: point it at the Redis test server(s) (scripts/test sets it)")
    })
}

pub fn url() -> String {
    var("IDEM_REDIS_URL")
}

pub async fn manager(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad redis url {url}: {e}"));
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_with_config(client, config)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to redis at {url}: {e}"))
}

/// The test servers keep nothing on disk: stores over them opt in.
pub fn volatile() -> RedisOptions {
    RedisOptions::default().accept_volatility()
}

pub async fn single_store() -> RedisStore {
    RedisStore::with_options(manager(&url()).await, volatile())
        .await
        .expect("store over IDEM_REDIS_URL")
}

/// A connection to the cluster named by `IDEM_REDIS_CLUSTER_URLS`.
pub async fn cluster_connection() -> redis::cluster_async::ClusterConnection {
    let urls = var("IDEM_REDIS_CLUSTER_URLS");
    let client = ClusterClientBuilder::new(urls.split(',').map(str::trim).collect::<Vec<_>>())
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5))
        .build()
        .expect("cluster client");
    client.get_async_connection().await.unwrap_or_else(|e| {
        panic!("cannot connect to the cluster at IDEM_REDIS_CLUSTER_URLS={urls}: {e}")
    })
}

pub async fn cluster_store() -> RedisStore {
    RedisStore::with_options(cluster_connection().await, volatile())
        .await
        .expect("store over the cluster")
}

/// A redis-server of the test's own, on a free loopback port, in a fresh
/// directory of its own (where an append-only file, if `extra` asks for
/// one, survives [`restart`](Self::restart)); killed and its directory
/// removed on drop.
pub struct PrivateServer {
    pub port: u16,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // SIGKILL ends a paused (SIGSTOP) server too.
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateServer {
    pub async fn start(extra: &[&str]) -> Self {
        let port = idem_conformance::faults::free_port();
        let dir = idem_conformance::faults::private_dir(&format!("idem-redis-{port}"));
        let mut server = Self {
            port,
            args: extra.iter().map(|s| s.to_string()).collect(),
            dir,
            child: None,
        };
        server.spawn().await;
        server
    }

    /// A server that keeps every acknowledged write: an append-only file
    /// synced on every write (`--appendonly yes --appendfsync always`).
    pub async fn start_durable() -> Self {
        Self::start(&["--appendonly", "yes", "--appendfsync", "always"]).await
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let binary = std::env::var("IDEM_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = tokio::process::Command::new(&binary)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--dir", &self.dir.to_string_lossy()])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {binary} (set IDEM_REDIS_SERVER): {e}"));
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("private redis-server on port {} did not start", self.port);
    }

    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    /// Kills the server (SIGKILL: no shutdown, no final save) and starts it
    /// again on the same port and directory, once it answers PING.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.spawn().await;
    }

    /// Pauses the server (SIGSTOP): connections stay open, and nothing is
    /// answered until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(tokio::process::Child::id)
            .expect("a running server");
        let status = std::process::Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill -{name}: {e}"));
        assert!(status.success(), "kill -{name} {pid} failed: {status}");
    }
}
