//! The layer and what it is configured with.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, StatusCode};
use idem_core::store::{IdempotencyStore, Transaction};
use idem_core::{Idempotency, NoTransaction};
use tower::Layer;

use crate::config::{Config, StatusAction};
use crate::service::IdempotencyService;
use crate::tenant::TenantSource;
use crate::transaction::Begin;

/// A tower [`Layer`] giving routes the `Idempotency-Key` header's semantics
/// over an idem store.
///
/// For the methods it covers (default `POST` and `PATCH`), a request with an
/// `Idempotency-Key` header (one RFC 9651 sf-string) runs the inner service
/// once per tenant, key and request fingerprint; a retry gets the stored
/// status, headers and body back with `Idempotent-Replayed: true`; a
/// duplicate in flight gets 409 with `Retry-After`, a key reused for
/// another request 422, a missing (when required), invalid or repeated
/// header 400, a request body over the limit 413 — all as
/// `application/problem+json` (RFC 9457). Other methods, and requests
/// without a key where it is optional, pass through untouched.
///
/// Once a request is claimed, it runs to completion in a task of its own:
/// a client that hangs up does not stop the handler, and its response is
/// stored (or the claim released) all the same.
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, routing::post};
/// use idem_core::{Idempotency, NoTransaction};
/// use idem_core::store::IdempotencyStore;
/// use idem_http::{IdempotencyLayer, TenantSource};
///
/// async fn create_order(body: String) -> (http::StatusCode, String) {
///     (http::StatusCode::CREATED, format!("order for {body}"))
/// }
///
/// let store: Arc<dyn IdempotencyStore> = Arc::new(idem_memory::MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/orders", post(create_order))
///     .layer(
///         IdempotencyLayer::new(Idempotency::new(store))
///             .require_key()
///             .tenant(TenantSource::header("X-Tenant-Id")?),
///     );
/// # let _ = app;
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
pub struct IdempotencyLayer<S: ?Sized, T = NoTransaction> {
    idem: Idempotency<S>,
    config: Arc<Config>,
    begin: Option<Begin<T>>,
}

impl<S: ?Sized, T> Clone for IdempotencyLayer<S, T> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            config: Arc::clone(&self.config),
            begin: self.begin.clone(),
        }
    }
}

impl<S: IdempotencyStore + ?Sized, T> fmt::Debug for IdempotencyLayer<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idem", &self.idem)
            .field("header", &self.config.header)
            .field("methods", &self.config.methods)
            .field("required", &self.config.required)
            .field("transactional", &self.begin.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: IdempotencyStore + ?Sized> IdempotencyLayer<S> {
    /// A layer over `idem` (its lease, retention, lease renewal and
    /// too-large fallback apply),
    /// with the defaults: `POST` and `PATCH`, key optional, one tenant
    /// (`default`), 1 MiB request bodies, 2xx–4xx stored, 5xx released.
    pub fn new(idem: Idempotency<S>) -> Self {
        Self {
            idem,
            config: Arc::new(Config::default()),
            begin: None,
        }
    }

    /// Completes inside a transaction that `begin` opens per request (for
    /// example `move || store.begin()` on Postgres): the handler finds it in
    /// its request's extensions as [`IdempotencyTransaction<T>`](crate::IdempotencyTransaction),
    /// writes through it, and the stored response commits with those writes.
    /// A response the policy does not store rolls the transaction back.
    #[must_use]
    pub fn in_transaction<T, F, Fut>(self, begin: F) -> IdempotencyLayer<S, T>
    where
        T: Transaction,
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, idem_core::StoreError>> + Send + 'static,
    {
        IdempotencyLayer {
            idem: self.idem,
            config: self.config,
            begin: Some(Arc::new(move || Box::pin(begin()))),
        }
    }
}

impl<S: ?Sized, T> IdempotencyLayer<S, T> {
    fn configure(mut self, change: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::clone(&self.config);
        change(&mut config);
        self.config = Arc::new(config);
        self
    }

    /// The methods the layer covers (default `POST` and `PATCH`); others
    /// pass through untouched.
    #[must_use]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.configure(|c| c.methods = methods)
    }

    /// Also takes a key sent bare, as most clients in the wild send it
    /// (`Idempotency-Key: 8e03978e-40d5`, Stripe's form): one RFC 9110
    /// token (letters, digits and `!#$%&'*+-.^_`|~`) is the key as it is.
    /// By default only the draft's form is taken, one RFC 9651 sf-string
    /// (`Idempotency-Key: "8e03978e-40d5"`), and a bare value is refused
    /// with 400.
    ///
    /// The trade-off: the quoted and the bare form of the same characters
    /// are one key (a client switching forms keeps its keys), while a key
    /// with characters outside a token (a space, a `/`, a `:`) must still
    /// be quoted; a value that is neither (a list, a broken quote) is
    /// refused as before. Keys are never guessed from malformed input.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use idem_core::Idempotency;
    /// use idem_http::IdempotencyLayer;
    ///
    /// let idem = Idempotency::new(Arc::new(idem_memory::MemoryStore::new()));
    /// let layer = IdempotencyLayer::new(idem).accept_bare_keys();
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn accept_bare_keys(self) -> Self {
        self.configure(|c| c.bare_keys = true)
    }

    /// Refuses a covered request without a key with 400 (by default a
    /// request without one passes through untouched).
    #[must_use]
    pub fn require_key(self) -> Self {
        self.configure(|c| c.required = true)
    }

    /// Where the tenant comes from (default: one tenant, `default`).
    #[must_use]
    pub fn tenant(self, source: TenantSource) -> Self {
        self.configure(|c| c.tenant = source)
    }

    /// Request headers that are part of the fingerprint, besides the
    /// method, the path and query, and the body.
    #[must_use]
    pub fn fingerprint_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.configure(|c| c.fingerprint.headers = names)
    }

    /// Fingerprints only these parts of a JSON body (RFC 6901 JSON
    /// pointers, such as `/amount`): fields a client may vary between
    /// retries (a trace id, a timestamp) then do not make a mismatch.
    #[must_use]
    pub fn fingerprint_json_pointers(
        self,
        pointers: impl IntoIterator<Item = &'static str>,
    ) -> Self {
        let pointers = pointers.into_iter().map(str::to_string).collect();
        self.configure(|c| c.fingerprint.json_pointers = Some(pointers))
    }

    /// The largest request body read (default 1 MiB); a larger one is
    /// refused with 413 before anything is claimed, and one whose declared
    /// `Content-Length` is larger at once, before any of it is read (so a
    /// client sending `Expect: 100-continue` gets 413, not `100 Continue`).
    #[must_use]
    pub fn max_request_bytes(self, max: usize) -> Self {
        self.configure(|c| c.max_request_bytes = max)
    }

    /// What to do with a response, by its status (default
    /// [`default_status_policy`](crate::default_status_policy)).
    #[must_use]
    pub fn status_policy(self, policy: fn(StatusCode) -> StatusAction) -> Self {
        self.configure(|c| c.status_policy = policy)
    }

    /// Another response header never stored nor replayed, besides
    /// [`NEVER_REPLAYED`](crate::NEVER_REPLAYED).
    #[must_use]
    pub fn never_replay(self, name: HeaderName) -> Self {
        self.configure(|c| c.never_replayed.push(name))
    }

    /// The header that marks a replay (default `Idempotent-Replayed: true`).
    #[must_use]
    pub fn replay_header(self, name: HeaderName) -> Self {
        self.configure(|c| c.replay_header = name)
    }

    /// A link to the documentation of your idempotency rules, as the
    /// Idempotency-Key draft (§2.7) asks problem responses to carry.
    ///
    /// Without one, every problem's `type` is `about:blank` and its `title`
    /// the status phrase (RFC 9457 §4.2.1). With one, each problem gets a
    /// type URI of its own, the link with a fragment, and the draft's
    /// titles; document each of these at your link:
    ///
    /// | fragment | status | title |
    /// |---|---|---|
    /// | `idempotency-key-missing` | 400 | Idempotency-Key is missing |
    /// | `idempotency-key-invalid` | 400 | Idempotency-Key is invalid |
    /// | `tenant-missing` | 400, 401 or 500 | No tenant |
    /// | `idempotency-key-reused` | 422 | Idempotency-Key is already used |
    /// | `request-outstanding` | 409 | A request is outstanding for this Idempotency-Key |
    /// | `request-body-too-large` | 413 | Request body too large |
    /// | `request-body-unreadable` | 400 | Unreadable request body |
    /// | `request-taken-over` | 503 | The request was taken over |
    /// | `store-unavailable` | 503 | Idempotency store unavailable |
    /// | `internal-error` | 500 | Internal error |
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use idem_core::{Idempotency, NoTransaction};
    /// # use idem_http::IdempotencyLayer;
    /// # let idem = Idempotency::new(Arc::new(idem_memory::MemoryStore::new()));
    /// // A key reused for another payload: 422 with
    /// // "type": "https://docs.example.com/idempotency#idempotency-key-reused".
    /// let layer = IdempotencyLayer::new(idem)
    ///     .problem_documentation("https://docs.example.com/idempotency");
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn problem_documentation(self, link: impl Into<String>) -> Self {
        let link = link.into();
        self.configure(|c| c.documentation = Some(link))
    }

    /// A duplicate of a request in flight waits up to `max` for its result
    /// (and gets the replay) instead of a 409 at once.
    #[must_use]
    pub fn wait_for_result(self, max: Duration) -> Self {
        self.configure(|c| c.wait = Some(max))
    }
}

impl<S: ?Sized, T, Inner> Layer<Inner> for IdempotencyLayer<S, T> {
    type Service = IdempotencyService<S, T, Inner>;

    fn layer(&self, inner: Inner) -> Self::Service {
        IdempotencyService::configured(
            inner,
            self.idem.clone(),
            Arc::clone(&self.config),
            self.begin.clone(),
        )
    }
}
