//! The long-running parts of a service run together under one shutdown.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::plumbing::error::BoxError;

type Part = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// The long-running parts of a service (a relay, a consumer, a sweeper, an
/// HTTP server) run together: [`run`](Self::run) starts them all, and one
/// signal stops them all. Each part gets a [`Shutdown`] to end on; when
/// the signal comes, or when any part ends (an error, or a return of its
/// own), every other part is told to stop, and `run` waits for all of them
/// before it answers. Each part stays usable on its own: a `Service` only
/// spawns what it is given.
///
/// ```
/// use std::time::Duration;
/// use idem_core::Service;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let mut service = Service::new();
/// service.add("ticker", |stop| async move {
///     // A part ends when its shutdown resolves (a relay's or a consumer's
///     // `run` takes it as its shutdown future).
///     stop.await;
///     Ok::<(), std::io::Error>(())
/// });
/// // One signal for all (tokio::signal::ctrl_c() in a service).
/// service.run(tokio::time::sleep(Duration::from_millis(10))).await?;
/// # Ok::<(), idem_core::ServiceError>(())
/// # }).unwrap();
/// ```
#[derive(Default)]
pub struct Service {
    stop: Option<watch::Sender<bool>>,
    parts: Vec<(&'static str, Part)>,
}

impl fmt::Debug for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.parts.iter().map(|(name, _)| *name).collect();
        f.debug_struct("Service").field("parts", &names).finish()
    }
}

impl Service {
    /// A service with no part yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the part `name`: `part` gets the service's [`Shutdown`] and
    /// answers the future that runs the part until it resolves. Nothing
    /// runs before [`run`](Self::run).
    pub fn add<F, Fut>(&mut self, name: &'static str, part: F) -> &mut Self
    where
        F: FnOnce(Shutdown) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: PartOutput,
    {
        let stop = self
            .stop
            .get_or_insert_with(|| watch::channel(false).0)
            .subscribe();
        let running = part(Shutdown::on(stop));
        self.parts
            .push((name, Box::pin(async move { running.await.into_result() })));
        self
    }

    /// Runs every part until `signal` resolves or a part ends, then tells
    /// every part to stop and waits for all of them.
    ///
    /// # Errors
    ///
    /// The first part to fail, by its name: [`ServiceError::Failed`] with
    /// its error, or [`ServiceError::Panicked`]. A part that returned
    /// `Ok` before the signal stopped the service too, and is no error.
    pub async fn run(mut self, signal: impl Future<Output = ()>) -> Result<(), ServiceError> {
        let stop = self.stop.take();
        let mut running = JoinSet::new();
        let mut names = Vec::with_capacity(self.parts.len());
        for (name, part) in self.parts.drain(..) {
            names.push((running.spawn(part).id(), name));
        }
        let name_of = |id: tokio::task::Id| {
            names
                .iter()
                .find(|(task, _)| *task == id)
                .map_or("unnamed", |(_, name)| *name)
        };
        let mut first: Option<ServiceError> = None;
        let mut note = |ended: Result<
            (tokio::task::Id, Result<(), BoxError>),
            tokio::task::JoinError,
        >| {
            let error = match ended {
                Ok((_, Ok(()))) => return,
                Ok((id, Err(error))) => ServiceError::Failed {
                    part: name_of(id),
                    error,
                },
                Err(join) => ServiceError::Panicked {
                    part: name_of(join.id()),
                },
            };
            tracing::error!(error = %error, source = ?std::error::Error::source(&error), "a part of the service ended");
            first.get_or_insert(error);
        };
        tokio::select! {
            () = signal => {}
            Some(ended) = running.join_next_with_id() => note(ended),
        }
        if let Some(stop) = &stop {
            stop.send_replace(true);
        }
        while let Some(ended) = running.join_next_with_id().await {
            note(ended);
        }
        first.map_or(Ok(()), Err)
    }
}

/// What a part of a [`Service`] answers when it ends: nothing (a relay's
/// `run`), or a `Result` whose error the service reports.
pub trait PartOutput: Send + 'static {
    /// The part's end as the service sees it.
    fn into_result(self) -> Result<(), BoxError>;
}

impl PartOutput for () {
    fn into_result(self) -> Result<(), BoxError> {
        Ok(())
    }
}

impl<E: Into<BoxError> + Send + 'static> PartOutput for Result<(), E> {
    fn into_result(self) -> Result<(), BoxError> {
        self.map_err(Into::into)
    }
}

/// Resolves once its [`Service`] stops: the shutdown future a part runs
/// until (a relay's and a consumer's `run` take one).
pub struct Shutdown(Pin<Box<dyn Future<Output = ()> + Send>>);

impl Shutdown {
    fn on(mut stop: watch::Receiver<bool>) -> Self {
        // A service dropped without running stops its parts too.
        Self(Box::pin(async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        }))
    }
}

impl fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Shutdown")
    }
}

impl Future for Shutdown {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// A part of a [`Service`] that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The part answered an error.
    #[error("the service's part {part} failed")]
    Failed {
        /// The part's name.
        part: &'static str,
        /// What it answered.
        #[source]
        error: BoxError,
    },
    /// The part panicked.
    #[error("the service's part {part} panicked")]
    Panicked {
        /// The part's name.
        part: &'static str,
    },
}
