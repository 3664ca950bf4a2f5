//! The console's router: only behind the service's authorization check,
//! every unsafe request checked for where it comes from, every response
//! kept out of caches and frames.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, header};
use idem_core::InvalidInput;
use idem_http::ProblemDetails;

use crate::admin::Admin;
use crate::security::{Authorize, CsrfKey, Refusal, cross_site, is_unsafe};
use crate::shared::{Guard, Shared};

/// A console behind the service's authorization check: the only way to
/// its [`router`](Self::router), so an admin route is never open by
/// accident. Made by [`Admin::authorize`].
///
/// ```
/// use std::sync::Arc;
/// use http::request::Parts;
/// use idem_admin::{Admin, Operator, Refusal};
/// use idem_core::Idempotency;
/// use idem_memory::MemoryStore;
///
/// let admin = Admin::new().records(Idempotency::new(Arc::new(MemoryStore::new())));
/// let console: axum::Router = admin
///     .authorize(|request: &Parts| match request.headers.get("x-ops-user") {
///         Some(user) => Operator::new(user.to_str().unwrap_or("?")).map_err(|_| Refusal::Forbidden),
///         None => Err(Refusal::unauthenticated(None)),
///     })
///     .router();
/// let app: axum::Router = axum::Router::new().nest("/admin", console);
/// # let _ = app;
/// ```
///
/// Without the check there is no router:
///
/// ```compile_fail
/// let open: axum::Router = idem_admin::Admin::new().router();
/// ```
pub struct Console {
    admin: Admin,
    guard: Guard,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("admin", &self.admin)
            .field("trusted_origins", &self.guard.trusted_origins)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// This console behind `check`, the service's authorization check:
    /// every route runs it first, refuses whom it refuses, and traces each
    /// action with the operator it names.
    pub fn authorize(self, check: impl Authorize) -> Console {
        Console {
            admin: self,
            guard: Guard {
                authorize: Box::new(check),
                csrf: CsrfKey::random(),
                trusted_origins: Vec::new(),
            },
        }
    }
}

impl Console {
    /// The key of the forms' cross-site request tokens, shared by the
    /// service's replicas (by default each process draws its own, and a
    /// form served by one replica is refused by another).
    #[must_use]
    pub fn csrf_secret(mut self, secret: [u8; 32]) -> Self {
        self.guard.csrf = CsrfKey::from_secret(secret);
        self
    }

    /// Trusts requests from `origin` (`https://ops.example.com`) beside
    /// those from the request's own `Host`: for a console behind a proxy
    /// that rewrites `Host`.
    ///
    /// ```
    /// use idem_admin::{Admin, Refusal};
    ///
    /// let console = Admin::new().authorize(|_: &http::request::Parts| Err(Refusal::Forbidden));
    /// let console = console.trusted_origin("https://ops.example.com")?;
    /// assert!(console.trusted_origin("ops.example.com/admin").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] for an origin that is not
    /// `http(s)://host[:port]`.
    pub fn trusted_origin(mut self, origin: &str) -> Result<Self, InvalidInput> {
        let host = origin
            .strip_prefix("https://")
            .or_else(|| origin.strip_prefix("http://"));
        if !host.is_some_and(|h| !h.is_empty() && !h.contains('/')) {
            return Err(InvalidInput::Malformed {
                field: "origin",
                reason: "an origin is http(s)://host[:port]".into(),
            });
        }
        self.guard.trusted_origins.push(origin.to_string());
        Ok(self)
    }

    /// The router: the JSON API under `api/` and the page, to mount under
    /// the service's prefix (`Router::nest("/admin", router)`).
    pub fn router(self) -> Router {
        let shared = Shared {
            admin: Arc::new(self.admin),
            guard: Arc::new(self.guard),
        };
        crate::api::routes()
            .merge(crate::page::routes())
            .layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
            .with_state(shared)
    }
}

/// Every request: authorized first, then checked for where it comes from
/// if it changes anything; every answer kept out of caches (records are
/// personal data) and out of other sites' frames.
async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let mut response = match shared.guard.authorize.authorize(&parts).await {
        Err(refusal) => {
            tracing::warn!(
                target: "idem_admin",
                method = %parts.method,
                status = refusal.status().as_u16(),
                "console request refused by the authorization check"
            );
            refused(refusal)
        }
        Ok(operator) => {
            let foreign = is_unsafe(&parts.method)
                .then(|| cross_site(&parts.headers, &shared.guard.trusted_origins))
                .flatten();
            match foreign {
                Some(why) => {
                    tracing::warn!(
                        target: "idem_admin",
                        operator = operator.as_str(),
                        method = %parts.method,
                        "cross-site console request refused: {why}"
                    );
                    ProblemDetails::new(http::StatusCode::FORBIDDEN, why)
                        .with_extension("error", "cross_site")
                        .into_response()
                        .into_response()
                }
                None => {
                    parts.extensions.insert(operator);
                    next.run(Request::from_parts(parts, body)).await
                }
            }
        }
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not `no-referrer`: under it browsers send `Origin: null` with the
        // console's own form posts, which the origin check refuses.
        (header::REFERRER_POLICY, "same-origin"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn refused(refusal: Refusal) -> Response {
    let problem = match &refusal {
        Refusal::Forbidden => "this operator may not use the console",
        _ => "the console needs an operator's credentials",
    };
    let mut response = ProblemDetails::new(refusal.status(), problem)
        .with_extension("error", "unauthorized")
        .into_response()
        .into_response();
    if let Refusal::Unauthenticated {
        challenge: Some(challenge),
    } = refusal
    {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    }
    response
}
