//! A background task that purges records past retention on an interval.

use std::time::Duration;

use idem_core::IdempotencyStore;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::store::PostgresStore;

/// A running sweeper. [`stop`](Self::stop) ends it after the batch in
/// progress; dropping it aborts it.
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Sweeper {
    pub(crate) fn spawn(store: PostgresStore, every: Duration) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    _ = ticks.tick() => match store.purge_expired().await {
                        Ok(0) => {}
                        Ok(deleted) => tracing::debug!(deleted, table = %store.table(), "purged expired idempotency records"),
                        Err(error) => tracing::warn!(%error, table = %store.table(), "idempotency purge failed; will retry"),
                    },
                }
            }
        });
        Self {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the sweeper and waits for it to finish its current batch.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl PostgresStore {
    /// Spawns a task on the current tokio runtime that runs
    /// [`purge_expired`](IdempotencyStore::purge_expired) every `every`
    /// (the first run at once). Rows past retention already count as absent;
    /// the sweeper only reclaims their space.
    pub fn spawn_sweeper(&self, every: Duration) -> Sweeper {
        Sweeper::spawn(self.clone(), every.max(Duration::from_millis(1)))
    }
}
