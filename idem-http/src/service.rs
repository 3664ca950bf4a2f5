//! The service: what happens to one request.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode, response};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use idem_core::store::{AsDynStore, IdempotencyStore, Transaction};
use idem_core::{
    BoxError, Fingerprint, HandlerError, Idempotency, NoTransaction, RunContext, RunError,
    RunOutcome, Scope, Storable, StoredResponse, Verdict,
};
use tower::{Service, ServiceExt};

use crate::body::ResponseBody;
use crate::config::{Config, StatusAction, connection_options};
use crate::future::ResponseFuture;
use crate::problem::{self, Problem};
use crate::replay::replay;
use crate::transaction::{Begin, IdempotencyTransaction};
use crate::{key, tenant::TenantRejection};

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around a
/// route; [`new`](Self::new) builds one with the layer's defaults.
pub struct IdempotencyService<S: ?Sized, T, Inner> {
    idem: Idempotency<S>,
    config: Arc<Config>,
    begin: Option<Begin<T>>,
    inner: Inner,
}

impl<S: IdempotencyStore + ?Sized, Inner> IdempotencyService<S, NoTransaction, Inner> {
    /// `inner` behind `idem` with the defaults of
    /// [`IdempotencyLayer::new`](crate::IdempotencyLayer::new).
    pub fn new(inner: Inner, idem: Idempotency<S>) -> Self {
        Self::configured(inner, idem, Arc::new(Config::default()), None)
    }
}

impl<S: ?Sized, T, Inner> IdempotencyService<S, T, Inner> {
    pub(crate) fn configured(
        inner: Inner,
        idem: Idempotency<S>,
        config: Arc<Config>,
        begin: Option<Begin<T>>,
    ) -> Self {
        Self {
            idem,
            config,
            begin,
            inner,
        }
    }
}

impl<S: ?Sized, T, Inner: Clone> Clone for IdempotencyService<S, T, Inner> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            config: Arc::clone(&self.config),
            begin: self.begin.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<S: IdempotencyStore + ?Sized, T, Inner> fmt::Debug for IdempotencyService<S, T, Inner> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("idem", &self.idem)
            .field("header", &self.config.header)
            .field("transactional", &self.begin.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, T, Inner, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S, T, Inner>
where
    S: AsDynStore + ?Sized,
    T: Transaction,
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = Inner::Error;
    type Future = ResponseFuture<ResBody, Inner::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        if !config.methods.contains(request.method()) {
            return passed(inner, request);
        }
        let key = match key::from_headers(request.headers(), &config.header, config.bare_keys) {
            Ok(Some(key)) => key,
            Ok(None) if !config.required => return passed(inner, request),
            Ok(None) => {
                let detail = format!(
                    "This operation is idempotent and it requires correct usage of Idempotency Key: send an {} header.",
                    config.header
                );
                return ready(config.problem(
                    Problem::MissingKey,
                    StatusCode::BAD_REQUEST,
                    &detail,
                ));
            }
            Err(error) => {
                return ready(config.problem(
                    Problem::InvalidKey,
                    StatusCode::BAD_REQUEST,
                    &error.detail(&config.header),
                ));
            }
        };
        // A body declared too large is refused before any of it is read:
        // hyper sends `100 Continue` only once the body is polled.
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > config.max_request_bytes as u64) {
            return ready(too_large_body(&config));
        }
        let (parts, body) = request.into_parts();
        let tenant = match config.tenant.tenant(&parts) {
            Ok(tenant) => tenant,
            Err(TenantRejection { status, detail }) => {
                return ready(config.problem(Problem::NoTenant, status, &detail));
            }
        };
        let job = Job {
            idem: self.idem.clone(),
            begin: self.begin.clone(),
            config: Arc::clone(&config),
            scope: Scope::new(tenant, key),
            service: PhantomData,
        };
        // Claimed work runs to its end whatever the client does: in place
        // while it needs no waiting (a replay from memory), and in a task of
        // its own from its first wait on, spawned within the poll that
        // waited, so no hang-up can stop it once it started. Boxed: its
        // future is kilobytes, which the spawn would otherwise copy.
        let mut job = Some(Box::pin(job.run(inner, parts, body)));
        ResponseFuture::new(async move {
            let failed = |why: &dyn fmt::Display| {
                let (response, incident) = internal_error(&config);
                tracing::error!(error = %why, %incident, "the idempotent request's task failed");
                Ok(response.map(ResponseBody::buffered))
            };
            let first = std::future::poll_fn(|cx| {
                let Some(running) = job.as_mut() else {
                    return Poll::Ready(None);
                };
                Poll::Ready(
                    match panic::catch_unwind(AssertUnwindSafe(|| running.as_mut().poll(cx))) {
                        Ok(Poll::Ready(result)) => Some(Ok(result)),
                        Ok(Poll::Pending) => None,
                        Err(panicked) => Some(Err(panicked)),
                    },
                )
            })
            .await;
            match first {
                Some(Ok(result)) => result,
                Some(Err(panicked)) => failed(&Panicked(panicked)),
                None => match job.take() {
                    // Polled by its task at once, with that task's waker.
                    Some(waiting) => match tokio::spawn(waiting).await {
                        Ok(result) => result,
                        Err(join) => failed(&join),
                    },
                    None => failed(&"the request's job was lost"),
                },
            }
        })
    }
}

/// A panic caught from a job's first poll, as a task's `JoinError` shows one.
struct Panicked(Box<dyn std::any::Any + Send>);

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self
            .0
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| self.0.downcast_ref::<String>().map(String::as_str));
        match message {
            Some(message) => write!(f, "panicked with message {message:?}"),
            None => f.write_str("panicked"),
        }
    }
}

/// A request the layer does not cover, to the inner service untouched.
fn passed<Inner, ReqBody, ResBody>(
    mut inner: Inner,
    request: Request<ReqBody>,
) -> ResponseFuture<ResBody, Inner::Error>
where
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    Inner::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    let call = inner.call(request);
    ResponseFuture::new(async move { Ok(call.await?.map(ResponseBody::passed)) })
}

fn ready<B: Send + 'static, E: Send + 'static>(
    response: Response<Full<Bytes>>,
) -> ResponseFuture<B, E> {
    ResponseFuture::new(std::future::ready(Ok(response.map(ResponseBody::buffered))))
}

/// A 500 that says nothing of what failed: a fixed detail and a fresh
/// incident id, which the caller traces beside the error (an error's text
/// can hold row values, constraint names, hosts: it never reaches a
/// client).
fn internal_error(config: &Config) -> (Response<Full<Bytes>>, String) {
    let incident = uuid::Uuid::new_v4().simple().to_string();
    let detail =
        format!("The request failed on the server; the operator finds it as incident {incident}.");
    let response = config.problem(
        Problem::Internal,
        StatusCode::INTERNAL_SERVER_ERROR,
        &detail,
    );
    (response, incident)
}

fn too_large_body(config: &Config) -> Response<Full<Bytes>> {
    config.problem(
        Problem::BodyTooLarge,
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!(
            "Idempotent requests are read whole; the limit is {} bytes.",
            config.max_request_bytes
        ),
    )
}

/// What one call of the inner service produced.
enum Produced<E> {
    /// Its response, read whole.
    Response(Answer),
    /// Its error, for the caller; the key is kept (the call may have done
    /// its work), nothing stored.
    Failed(E),
}

/// An inner response, and the configuration that says what of it is kept.
struct Answer {
    parts: response::Parts,
    body: Bytes,
    config: Arc<Config>,
}

impl<E> Storable for Produced<E> {
    fn to_stored(&self) -> Cow<'_, StoredResponse> {
        let Produced::Response(answer) = self else {
            // A failed call's verdict is always `Keep`: nothing is stored.
            return Cow::Owned(StoredResponse::new(500, Vec::new()));
        };
        let (parts, config) = (&answer.parts, &answer.config);
        let mut stored = StoredResponse::new(parts.status.as_u16(), answer.body.to_vec());
        let hop_by_hop = connection_options(
            parts
                .headers
                .get_all(CONNECTION)
                .iter()
                .map(HeaderValue::as_bytes),
        );
        for (name, value) in &parts.headers {
            if config.is_replayed(name, &hop_by_hop) {
                stored = stored.with_header(name.as_str(), value.as_bytes());
            }
        }
        Cow::Owned(stored)
    }
}

impl<E> Produced<E> {
    /// What becomes of it, by the status policy.
    fn verdict(self) -> Verdict<Self> {
        let action = match &self {
            Produced::Response(answer) => (answer.config.status_policy)(answer.parts.status),
            Produced::Failed(_) => StatusAction::Keep,
        };
        match action {
            StatusAction::Store => Verdict::Store(self),
            StatusAction::Release => Verdict::Release(self),
            StatusAction::Keep => Verdict::Keep(self),
        }
    }
}

/// One covered request, with everything it needs in its own task.
struct Job<S: ?Sized, T, Inner, ReqBody> {
    idem: Idempotency<S>,
    begin: Option<Begin<T>>,
    config: Arc<Config>,
    scope: Scope,
    // Job is shared across awaits by reference: no `Inner` in it (a
    // service is Send, not Sync).
    service: PhantomData<fn(Inner, ReqBody)>,
}

impl<S, T, Inner, ReqBody, ResBody> Job<S, T, Inner, ReqBody>
where
    S: AsDynStore + ?Sized,
    T: Transaction,
    Inner: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    Inner::Future: Send + 'static,
    Inner::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    async fn run(
        self,
        inner: Inner,
        parts: Parts,
        body: ReqBody,
    ) -> Result<Response<ResponseBody<ResBody>>, Inner::Error> {
        let config = Arc::clone(&self.config);
        let bytes = match Limited::new(body, config.max_request_bytes).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                let too_large = error
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some();
                let response = if too_large {
                    too_large_body(&config)
                } else {
                    config.problem(
                        Problem::UnreadableBody,
                        StatusCode::BAD_REQUEST,
                        &error.to_string(),
                    )
                };
                return Ok(response.map(ResponseBody::buffered));
            }
        };
        let fingerprint = config.fingerprint.fingerprint(&parts, &bytes);
        let deadline = config.wait.map(|wait| tokio::time::Instant::now() + wait);
        // The inner service is called at most once, with the request itself:
        // a later lap only happens after an in-progress answer, which did
        // not use it.
        let mut request = Some((inner, parts, bytes));
        loop {
            let attempt = Attempt {
                config: Arc::clone(&config),
                request: &mut request,
            };
            let outcome = match &self.begin {
                None => self.standalone(fingerprint, attempt).await,
                Some(begin) => self.transactional(fingerprint, begin, attempt).await,
            };
            match outcome {
                Err(RunError::InProgress { retry_after }) => {
                    let wait = retry_after.min(Duration::from_millis(50));
                    if let Some(deadline) = deadline
                        && tokio::time::Instant::now() + wait < deadline
                    {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    let detail = "A request with the same Idempotency-Key for the same operation is being processed or is outstanding.";
                    let response =
                        config.problem(Problem::Outstanding, StatusCode::CONFLICT, detail);
                    return Ok(
                        problem::retry_after(response, retry_after).map(ResponseBody::buffered)
                    );
                }
                outcome => return self.respond(outcome),
            }
        }
    }

    async fn standalone(
        &self,
        fingerprint: Fingerprint,
        mut attempt: Attempt<'_, Inner>,
    ) -> Result<RunOutcome<Produced<Inner::Error>>, RunError> {
        self.idem
            .run(self.scope.clone(), fingerprint, |ctx| async move {
                let produced = attempt.call(ctx, None::<IdempotencyTransaction<T>>).await?;
                Ok(produced.verdict())
            })
            .await
    }

    async fn transactional(
        &self,
        fingerprint: Fingerprint,
        begin: &Begin<T>,
        mut attempt: Attempt<'_, Inner>,
    ) -> Result<RunOutcome<Produced<Inner::Error>>, RunError> {
        self.idem
            .run_in(
                self.scope.clone(),
                fingerprint,
                begin(),
                |ctx, tx| async move {
                    let slot = IdempotencyTransaction::new(tx);
                    let produced = attempt.call(ctx, Some(slot.clone())).await?;
                    // Whatever the verdict, the runner gets the transaction
                    // back: to commit, or to drop (a rollback).
                    let tx = slot.take().ok_or_else(|| {
                        HandlerError::not_started(
                            "the handler still held the idempotency transaction when it returned",
                        )
                    })?;
                    Ok((tx, produced.verdict()))
                },
            )
            .await
    }

    fn respond(
        &self,
        outcome: Result<RunOutcome<Produced<Inner::Error>>, RunError>,
    ) -> Result<Response<ResponseBody<ResBody>>, Inner::Error> {
        let config = &self.config;
        // Hashed only where a warning names it.
        let key = || self.scope.key().redacted();
        let response = match outcome {
            Ok(RunOutcome::Executed(Produced::Response(answer))) => {
                Response::from_parts(answer.parts, Full::new(answer.body))
            }
            Ok(RunOutcome::Executed(Produced::Failed(error))) => return Err(error),
            Ok(RunOutcome::Replayed(stored)) => replay(stored, config),
            Err(RunError::Mismatch) => config.problem(
                Problem::KeyReused,
                StatusCode::UNPROCESSABLE_ENTITY,
                "This operation is idempotent and it requires correct usage of Idempotency Key. Idempotency Key MUST not be reused across different payloads of this operation.",
            ),
            Err(RunError::NotStarted(error) | RunError::Failed(error)) => {
                let (response, incident) = internal_error(config);
                tracing::warn!(%error, %incident, key = key(), "idempotent request failed");
                response
            }
            Err(RunError::LostLease) => {
                tracing::warn!(key = key(), "idempotency lease lost before completion");
                problem::retry_after(
                    config.problem(
                        Problem::TakenOver,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Another request with this Idempotency-Key took over before this one completed; retry with the same key to get its result.",
                    ),
                    Duration::from_secs(1),
                )
            }
            Err(RunError::Store(error)) if error.is_retryable() => {
                tracing::warn!(%error, key = key(), "idempotency store unavailable");
                problem::retry_after(
                    config.problem(
                        Problem::StoreUnavailable,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The request may or may not have been processed; retry with the same Idempotency-Key.",
                    ),
                    Duration::from_secs(1),
                )
            }
            Err(error) => {
                let (response, incident) = internal_error(config);
                tracing::error!(%error, %incident, key = key(), "idempotency store failed");
                response
            }
        };
        Ok(response.map(ResponseBody::buffered))
    }
}

/// One call of the inner service within a claim.
struct Attempt<'a, Inner> {
    config: Arc<Config>,
    /// The inner service and the request, until the one call takes them.
    request: &'a mut Option<(Inner, Parts, Bytes)>,
}

impl<Inner> Attempt<'_, Inner> {
    /// Calls the inner service with the request, the run's context (over
    /// `dyn IdempotencyStore`, whatever the store: one type for handlers to
    /// ask for) and the transaction in its extensions, and reads its whole
    /// response.
    async fn call<S, T, ReqBody, ResBody>(
        &mut self,
        ctx: RunContext<S>,
        tx: Option<IdempotencyTransaction<T>>,
    ) -> Result<Produced<Inner::Error>, HandlerError>
    where
        S: AsDynStore + ?Sized,
        T: Send + 'static,
        Inner: Service<Request<ReqBody>, Response = Response<ResBody>>,
        ReqBody: From<Bytes>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let Some((inner, parts, body)) = self.request.take() else {
            return Err(HandlerError::not_started(
                "the inner service was already called",
            ));
        };
        let mut request = Request::from_parts(parts, ReqBody::from(body));
        request.extensions_mut().insert(ctx.erased());
        if let Some(tx) = tx {
            request.extensions_mut().insert(tx);
        }
        let response = match inner.oneshot(request).await {
            Ok(response) => response,
            Err(error) => return Ok(Produced::Failed(error)),
        };
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| HandlerError::started(e.into()))?
            .to_bytes();
        Ok(Produced::Response(Answer {
            parts,
            body,
            config: Arc::clone(&self.config),
        }))
    }
}
