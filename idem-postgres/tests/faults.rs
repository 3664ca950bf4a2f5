//! Faults under a storm of callers: a private Postgres restarted (fast and
//! immediate shutdown), and connections to the test server cut at random by
//! a proxy. After each, no call failed in a way a client cannot retry, no
//! call hung, a call succeeded soon after the fault, and every key a caller
//! was told `Executed` replays its bytes.
//!
//! The restarts run on a Postgres of the test's own (never the shared
//! server): `initdb` in a fresh temporary directory, a free loopback port, a
//! private socket directory, trust authentication; run as the `postgres`
//! user when the tests run as root (initdb refuses root); stopped
//! (immediate) and removed when the test ends, also on a panic.
//!
//! Each test prints one row of the faults table (fault, backend, longest
//! call, errors by type, recovery time, data lost).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_conformance::faults::{STRIKE, Storm, connections_cut_at_random};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use idem_postgres::{PostgresOptions, PostgresStore};

/// Each operation's limit in the store, and the pool's for a connection.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(1);
/// How soon after the fault's end a call must succeed.
const RECOVERY: Duration = Duration::from_secs(10);
/// How long the replay check may take.
const CHECK: Duration = Duration::from_secs(10);
/// How long the server stays down between stop and start.
const DOWN: Duration = Duration::from_millis(300);

/// A Postgres server of the test's own; stopped (immediate) and its
/// directory removed on drop.
struct PrivatePostgres {
    base: PathBuf,
    bin: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    /// initdb, then start; blocking (run it off the runtime's workers).
    fn start() -> Self {
        let bin = postgres_bin();
        let port = idem_conformance::faults::free_port();
        let base = idem_conformance::faults::private_dir("idem-pg-faults");
        std::fs::create_dir_all(base.join("socket")).unwrap();
        let server = Self { base, bin, port };
        if running_as_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.base));
        }
        let data = server.data();
        run(server
            .as_owner(&server.bin.join("initdb"))
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "--no-locale",
                "-E",
                "UTF8",
            ])
            .arg("-D")
            .arg(&data));
        server.pg_ctl(&["start"]);
        server
    }

    fn data(&self) -> PathBuf {
        self.base.join("data")
    }

    fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
            .ssl_mode(PgSslMode::Disable)
    }

    /// A command that runs `program` as the owner of the data directory.
    fn as_owner(&self, program: &Path) -> Command {
        if running_as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }

    /// `pg_ctl <args>` on this server, waiting for it to finish.
    fn pg_ctl(&self, args: &[&str]) {
        let server_options = format!(
            "-p {} -h 127.0.0.1 -k {} -c shared_buffers=16MB -c max_connections=40",
            self.port,
            self.base.join("socket").display()
        );
        run(self
            .as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.base.join("server.log"))
            .args(["-w", "-t", "60", "-o", &server_options])
            .args(args));
    }

    /// Stops the server with shutdown `mode` (`fast`, `immediate`), leaves
    /// it down for [`DOWN`], and starts it again; blocking.
    fn restart(&self, mode: &str) {
        self.pg_ctl(&["stop", "-m", mode]);
        std::thread::sleep(DOWN);
        self.pg_ctl(&["start"]);
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// The newest server binaries under /usr/lib/postgresql (Debian's layout),
/// or `IDEM_POSTGRES_BIN`.
fn postgres_bin() -> PathBuf {
    if let Ok(bin) = std::env::var("IDEM_POSTGRES_BIN") {
        return PathBuf::from(bin);
    }
    let versions = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap_or_else(|e| panic!("no /usr/lib/postgresql ({e}): set IDEM_POSTGRES_BIN"));
    versions
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let version: u32 = path.file_name()?.to_str()?.parse().ok()?;
            path.join("bin/initdb")
                .exists()
                .then_some((version, path.join("bin")))
        })
        .max()
        .map(|(_, bin)| bin)
        .expect("no Postgres server binaries under /usr/lib/postgresql: set IDEM_POSTGRES_BIN")
}

fn running_as_root() -> bool {
    let id = Command::new("id").arg("-u").output().expect("run id -u");
    String::from_utf8_lossy(&id.stdout).trim() == "0"
}

/// Runs `command`, failing the test with its output unless it succeeds.
fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A migrated store over `options`, whose calls end promptly when the
/// server does not answer. The pool does not ping before use, as idem-postgres's guide
/// recommends: a connection broken by the fault fails its next statement.
async fn store_with(options: PgConnectOptions) -> Arc<PostgresStore> {
    let pool = idem_postgres::guarded(PgPoolOptions::new())
        .max_connections(8)
        .acquire_timeout(OPERATION_TIMEOUT)
        .connect_with(options)
        .await
        .expect("connect");
    let store = PostgresStore::with_options(
        pool,
        PostgresOptions::default().store_options(
            idem_core::StoreOptions::default().with_operation_timeout(OPERATION_TIMEOUT),
        ),
    )
    .unwrap();
    store.migrate().await.unwrap();
    Arc::new(store)
}

/// A storm (four callers for 3 s, a 1 s lease) through a restart of a
/// private server with shutdown `mode`.
async fn restart_storm(mode: &'static str) {
    let server = Arc::new(
        tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .unwrap(),
    );
    let store = store_with(server.options()).await;
    let restarting = Arc::clone(&server);
    let run = Storm::default()
        .run_and_check("postgres", Arc::clone(&store), CHECK, || async move {
            tokio::time::sleep(STRIKE).await;
            tokio::task::spawn_blocking(move || restarting.restart(mode))
                .await
                .unwrap();
            format!("restarted ({mode} shutdown, down 0.3 s)")
        })
        .await;
    store.pool().close().await;
    run.assert_nothing_lost(RECOVERY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_restart_loses_nothing() {
    restart_storm("fast").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_restart_loses_nothing() {
    restart_storm("immediate").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_at_random_lose_nothing() {
    let (proxy, options) = common::through_proxy().await;
    let store = store_with(options).await;
    let run = Storm::default()
        .run_and_check("postgres", Arc::clone(&store), CHECK, || {
            connections_cut_at_random(&proxy)
        })
        .await;
    store.pool().close().await;
    run.assert_nothing_lost(RECOVERY);
}
