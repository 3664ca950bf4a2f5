//! The service: what happens to one request.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, CONTENT_LENGTH, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode, response};
use http_body::Body;
use http_body_util::{BodyExt, Full, Limited};
use idem_core::store::{IdempotencyStore, Transaction};
use idem_core::{
    BoxError, Context, Fingerprint, HandlerError, Idempotency, RunError, RunOutcome, Scope,
    StoredResponse,
};
use tower::{Service, ServiceExt};

use crate::body::ResponseBody;
use crate::config::{Config, StatusAction, connection_options};
use crate::future::ResponseFuture;
use crate::problem::{self, Problem};
use crate::replay::replay;
use crate::transaction::{Begin, IdempotencyTransaction, NoTransaction};
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
    S: IdempotencyStore + ?Sized,
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

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
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
        let key = match key::from_headers(request.headers(), &config.header) {
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
        // Claimed work runs to the end in a task of its own: a client that
        // hangs up drops this future, not the handler or the completion.
        let task = tokio::spawn(job.run(inner, parts, body));
        ResponseFuture::new(async move {
            match task.await {
                Ok(result) => result,
                Err(join) => {
                    tracing::error!(error = %join, "the idempotent request's task failed");
                    Ok(internal_error(&config, "the request's task failed")
                        .map(ResponseBody::buffered))
                }
            }
        })
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

fn internal_error(config: &Config, detail: &str) -> Response<Full<Bytes>> {
    config.problem(Problem::Internal, StatusCode::INTERNAL_SERVER_ERROR, detail)
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

/// A response that is not stored: the client gets it, the record does not.
#[derive(Debug)]
struct Unstored(response::Parts, Bytes);

impl fmt::Display for Unstored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} response that is not stored", self.0.status)
    }
}

impl std::error::Error for Unstored {}

/// The inner service failed; its error is kept aside for the caller.
#[derive(Debug)]
struct InnerFailed;

impl fmt::Display for InnerFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the inner service failed")
    }
}

impl std::error::Error for InnerFailed {}

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

/// What the handler produced, for the caller; the record gets a copy.
type Produced = Arc<Mutex<Option<(response::Parts, Bytes)>>>;

impl<S, T, Inner, ReqBody, ResBody> Job<S, T, Inner, ReqBody>
where
    S: IdempotencyStore + ?Sized,
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
        let bytes = match Limited::new(body, self.config.max_request_bytes)
            .collect()
            .await
        {
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
        let fingerprint = self.config.fingerprint.fingerprint(&parts, &bytes);
        let deadline = self
            .config
            .wait
            .map(|wait| tokio::time::Instant::now() + wait);
        let inner_error = Arc::new(Mutex::new(None));
        let mut inner = Some(inner);
        loop {
            let produced: Produced = Arc::new(Mutex::new(None));
            // The inner service is called at most once: a later lap only
            // happens after an in-progress answer, which did not use it.
            let attempt = Attempt {
                config: Arc::clone(&self.config),
                inner: &mut inner,
                produced: Arc::clone(&produced),
                inner_error: Arc::clone(&inner_error),
                parts: parts.clone(),
                body: bytes.clone(),
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
                outcome => {
                    return self.respond(outcome, &produced, &inner_error);
                }
            }
        }
    }

    async fn standalone(
        &self,
        fingerprint: Fingerprint,
        attempt: Attempt<'_, Inner, Inner::Error>,
    ) -> Result<RunOutcome, RunError> {
        self.idem
            .run(self.scope.clone(), fingerprint, |ctx| async move {
                let mut attempt = attempt;
                let response = attempt.call(ctx, None::<IdempotencyTransaction<T>>).await?;
                match attempt.verdict(response) {
                    Verdict::Store(stored) => Ok(stored),
                    Verdict::Refuse(error) => Err(error),
                }
            })
            .await
    }

    async fn transactional(
        &self,
        fingerprint: Fingerprint,
        begin: &Begin<T>,
        attempt: Attempt<'_, Inner, Inner::Error>,
    ) -> Result<RunOutcome, RunError> {
        self.idem
            .run_in(
                self.scope.clone(),
                fingerprint,
                begin(),
                |ctx, tx| async move {
                    let mut attempt = attempt;
                    let slot = IdempotencyTransaction::new(tx);
                    let response = attempt.call(ctx, Some(slot.clone())).await?;
                    let stored = match attempt.verdict(response) {
                        Verdict::Store(stored) => stored,
                        // Dropping the transaction rolls the handler's writes back.
                        Verdict::Refuse(error) => return Err(error),
                    };
                    let tx = slot.take().ok_or_else(|| {
                        HandlerError::not_started(
                            "the handler still held the idempotency transaction when it returned",
                        )
                    })?;
                    Ok((tx, stored))
                },
            )
            .await
    }

    fn respond(
        &self,
        outcome: Result<RunOutcome, RunError>,
        produced: &Produced,
        inner_error: &Arc<Mutex<Option<Inner::Error>>>,
    ) -> Result<Response<ResponseBody<ResBody>>, Inner::Error> {
        let config = &self.config;
        let key = self.scope.key().redacted();
        let response = match outcome {
            Ok(RunOutcome::Executed(_)) => match take(produced) {
                Some((parts, body)) => Response::from_parts(parts, Full::new(body)),
                None => internal_error(config, "the executed response went missing"),
            },
            Ok(RunOutcome::Replayed(stored)) => replay(&stored, config),
            Err(RunError::Mismatch) => config.problem(
                Problem::KeyReused,
                StatusCode::UNPROCESSABLE_ENTITY,
                "This operation is idempotent and it requires correct usage of Idempotency Key. Idempotency Key MUST not be reused across different payloads of this operation.",
            ),
            Err(RunError::NotStarted(error) | RunError::Failed(error)) => {
                match error.downcast::<Unstored>() {
                    Ok(unstored) => Response::from_parts(unstored.0, Full::new(unstored.1)),
                    Err(error) if error.is::<InnerFailed>() => {
                        let taken = inner_error.lock().unwrap_or_else(|e| e.into_inner()).take();
                        if let Some(inner) = taken {
                            return Err(inner);
                        }
                        internal_error(config, "the inner service failed")
                    }
                    Err(error) => {
                        tracing::warn!(%error, key, "idempotent request failed");
                        internal_error(config, &error.to_string())
                    }
                }
            }
            Err(RunError::LostLease) => {
                tracing::warn!(key, "idempotency lease lost before completion");
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
                tracing::warn!(%error, key, "idempotency store unavailable");
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
                tracing::error!(%error, key, "idempotency store failed");
                internal_error(config, &error.to_string())
            }
        };
        Ok(response.map(ResponseBody::buffered))
    }
}

fn take(produced: &Produced) -> Option<(response::Parts, Bytes)> {
    produced.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// What to do with what the handler produced.
enum Verdict {
    Store(StoredResponse),
    Refuse(HandlerError),
}

/// One call of the inner service within a claim; `E` is its error.
struct Attempt<'a, Inner, E> {
    config: Arc<Config>,
    inner: &'a mut Option<Inner>,
    produced: Produced,
    inner_error: Arc<Mutex<Option<E>>>,
    parts: Parts,
    body: Bytes,
}

impl<Inner, E> Attempt<'_, Inner, E> {
    /// Calls the inner service with the request, the run's context (and the
    /// transaction) in its extensions, and reads its whole response.
    async fn call<S, T, ReqBody, ResBody>(
        &mut self,
        ctx: Context<S>,
        tx: Option<IdempotencyTransaction<T>>,
    ) -> Result<(response::Parts, Bytes), HandlerError>
    where
        S: ?Sized + Send + Sync + 'static,
        T: Send + 'static,
        Inner: Service<Request<ReqBody>, Response = Response<ResBody>, Error = E>,
        ReqBody: From<Bytes>,
        ResBody: Body<Data = Bytes>,
        ResBody::Error: Into<BoxError>,
    {
        let Some(inner) = self.inner.take() else {
            return Err(HandlerError::not_started(
                "the inner service was already called",
            ));
        };
        let mut request = Request::from_parts(self.parts.clone(), ReqBody::from(self.body.clone()));
        request.extensions_mut().insert(ctx);
        if let Some(tx) = tx {
            request.extensions_mut().insert(tx);
        }
        let response = match inner.oneshot(request).await {
            Ok(response) => response,
            Err(error) => {
                *self.inner_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                return Err(HandlerError::started(InnerFailed));
            }
        };
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| HandlerError::started(e.into()))?
            .to_bytes();
        Ok((parts, body))
    }

    /// Keeps the response for the caller, and says whether the record
    /// stores it, by the status policy. (One too large to store is the
    /// runner's to replace with its fallback.)
    fn verdict(&self, (parts, body): (response::Parts, Bytes)) -> Verdict {
        let mut stored = StoredResponse::new(parts.status.as_u16(), body.to_vec());
        let hop_by_hop = connection_options(
            parts
                .headers
                .get_all(CONNECTION)
                .iter()
                .map(HeaderValue::as_bytes),
        );
        for (name, value) in &parts.headers {
            if self.config.is_replayed(name, &hop_by_hop) {
                stored = stored.with_header(name.as_str(), value.as_bytes());
            }
        }
        let action = (self.config.status_policy)(parts.status);
        let unstored = Unstored(parts.clone(), body.clone());
        *self.produced.lock().unwrap_or_else(|e| e.into_inner()) = Some((parts, body));
        match action {
            StatusAction::Store => Verdict::Store(stored),
            StatusAction::Release => Verdict::Refuse(HandlerError::not_started(unstored)),
            StatusAction::Keep => Verdict::Refuse(HandlerError::started(unstored)),
        }
    }
}
