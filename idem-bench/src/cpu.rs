//! CPU time of the processes a measurement runs on: this benchmark's own,
//! the broker's and Postgres's, read from Linux's per-thread scheduler
//! statistics (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds on a CPU).
//!
//! On two cores the relay, Postgres and the broker share the CPUs, so a
//! relay's throughput next to a raw publisher's is bounded by what each
//! spends per message: this says where the time went.

use std::fs;
use std::path::Path;

/// Nanoseconds on a CPU so far, by who spent them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSample {
    /// This process.
    pub own: u64,
    /// Processes whose command name is one of the broker's.
    pub broker: u64,
    /// Processes named `postgres` (the server and every backend).
    pub postgres: u64,
}

/// Command names (`/proc/<pid>/comm`) of the brokers' server processes.
pub const RABBITMQ: &[&str] = &["beam.smp"];
/// See [`RABBITMQ`].
pub const NATS: &[&str] = &["nats-server"];
/// See [`RABBITMQ`]: tansu, the Kafka-protocol broker the tests run.
pub const KAFKA: &[&str] = &["tansu"];

impl CpuSample {
    /// Now, with `broker` the broker's command names. Processes that cannot
    /// be read (gone, or another user's) count as nothing.
    pub fn now(broker: &[&str]) -> Self {
        let own = std::process::id();
        let mut sample = Self::default();
        let Ok(entries) = fs::read_dir("/proc") else {
            return sample;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path();
            let Ok(comm) = fs::read_to_string(path.join("comm")) else {
                continue;
            };
            let comm = comm.trim_end();
            let slot = if pid == own {
                &mut sample.own
            } else if comm == "postgres" {
                &mut sample.postgres
            } else if broker.contains(&comm) {
                &mut sample.broker
            } else {
                continue;
            };
            *slot += threads_ns(&path);
        }
        sample
    }

    /// What was spent from `earlier` to `self`, in microseconds per one of
    /// `units` (messages).
    pub fn per_unit_since(&self, earlier: &Self, units: usize) -> CpuPerUnit {
        let per =
            |now: u64, then: u64| now.saturating_sub(then) as f64 / 1000.0 / units.max(1) as f64;
        CpuPerUnit {
            own_us: per(self.own, earlier.own),
            broker_us: per(self.broker, earlier.broker),
            postgres_us: per(self.postgres, earlier.postgres),
        }
    }
}

/// Microseconds of CPU per message, by who spent them.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct CpuPerUnit {
    /// This process's.
    pub own_us: f64,
    /// The broker's server's.
    pub broker_us: f64,
    /// Postgres's server's and backends'.
    pub postgres_us: f64,
}

impl CpuPerUnit {
    /// Everyone's.
    pub fn total_us(&self) -> f64 {
        self.own_us + self.broker_us + self.postgres_us
    }
}

/// The first field of each thread's schedstat: its time on a CPU.
fn threads_ns(process: &Path) -> u64 {
    let Ok(tasks) = fs::read_dir(process.join("task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_seen_spending_what_it_spins() {
        let before = CpuSample::now(NATS);
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = CpuSample::now(NATS);
        // At least some of the 50 ms spun were on a CPU, however busy the machine.
        assert!(after.own > before.own, "{before:?} then {after:?}");
        assert!(after.per_unit_since(&before, 1).own_us > 0.0);
    }
}
