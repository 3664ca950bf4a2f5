//! A background task that purges records past retention on an interval, for any store.

use crate::inbound::store::IdempotencyStore;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A background task that runs [`purge_expired`](IdempotencyStore::purge_expired)
/// on an interval, for any store. Records past retention already count as
/// absent; a sweep only reclaims their space. [`stop`](Self::stop) ends it
/// after the sweep in progress; dropping it aborts it.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem_core::Sweeper;
/// use idem_memory::MemoryStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let sweeper = Sweeper::spawn(Arc::new(MemoryStore::new()), Duration::from_secs(60));
/// sweeper.stop().await;
/// # });
/// ```
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Spawns the sweeper on the current tokio runtime; the first sweep runs
    /// at once, then one every `every`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn spawn<S: IdempotencyStore + ?Sized>(store: Arc<S>, every: Duration) -> Self {
        let every = every.max(Duration::from_millis(1));
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    _ = ticks.tick() => match store.purge_expired().await {
                        Ok(0) => {}
                        Ok(deleted) => tracing::debug!(deleted, ?store, "purged expired idempotency records"),
                        Err(error) => tracing::warn!(%error, ?store, "idempotency purge failed; will retry"),
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
