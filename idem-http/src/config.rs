//! What a layer is configured with: plain data that the layer builds and
//! the service reads.

use std::time::Duration;

use http::header::HeaderName;
use http::{Method, StatusCode};

use crate::fingerprint::FingerprintRules;
use crate::problem::{Problem, problem};
use crate::tenant::TenantSource;

/// What the layer does with a response, by its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatusAction {
    /// Store it: every retry replays it.
    Store,
    /// Store nothing and release the key: a retry runs the handler again at
    /// once (for failures that changed nothing).
    Release,
    /// Store nothing and keep the key until its lease expires: retries get
    /// 409 until then, and the one after takes over (for failures after
    /// which work may have happened).
    Keep,
}

/// The default policy: 2xx, 3xx and 4xx are stored (a retry gets the same
/// answer, errors included); 5xx releases the key, so a retry may succeed.
pub fn default_status_policy(status: StatusCode) -> StatusAction {
    if status.is_server_error() {
        StatusAction::Release
    } else {
        StatusAction::Store
    }
}

/// Response headers never stored or replayed: hop-by-hop headers, and
/// those that describe the moment or the connection rather than the answer.
/// Every field a response's `Connection` header names is hop-by-hop too
/// (RFC 9110 §7.6.1), and neither stored nor replayed either.
pub const NEVER_REPLAYED: [&str; 12] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "date",
    "content-length",
    "set-cookie",
];

/// The default header marking a replayed response.
pub const REPLAY_HEADER: &str = "idempotent-replayed";

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) header: HeaderName,
    /// Whether a bare token is a key too ([`KeyForm::Lenient`]).
    pub(crate) bare_keys: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) required: bool,
    pub(crate) tenant: TenantSource,
    pub(crate) fingerprint: FingerprintRules,
    pub(crate) max_request_bytes: usize,
    pub(crate) status_policy: fn(StatusCode) -> StatusAction,
    pub(crate) never_replayed: Vec<HeaderName>,
    pub(crate) replay_header: HeaderName,
    pub(crate) documentation: Option<String>,
    pub(crate) wait: Option<Duration>,
}

impl Config {
    /// Whether a response field is stored and replayed: not one of
    /// `never_replayed`, nor one its `Connection` header names.
    pub(crate) fn is_replayed(&self, name: &HeaderName, hop_by_hop: &[HeaderName]) -> bool {
        !self.never_replayed.contains(name) && !hop_by_hop.contains(name)
    }

    /// A problem response as this layer is configured to write them.
    pub(crate) fn problem(
        &self,
        kind: Problem,
        status: StatusCode,
        detail: &str,
    ) -> http::Response<http_body_util::Full<bytes::Bytes>> {
        problem(self.documentation.as_deref(), kind, status, detail)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            header: HeaderName::from_static("idempotency-key"),
            bare_keys: false,
            methods: vec![Method::POST, Method::PATCH],
            required: false,
            tenant: TenantSource::default(),
            fingerprint: FingerprintRules::default(),
            max_request_bytes: 1 << 20,
            status_policy: default_status_policy,
            never_replayed: NEVER_REPLAYED
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            replay_header: HeaderName::from_static(REPLAY_HEADER),
            documentation: None,
            wait: None,
        }
    }
}

/// The fields a `Connection` header names: hop-by-hop, for this connection
/// only (RFC 9110 §7.6.1). Its value is a comma-separated list of tokens.
pub(crate) fn connection_options<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<HeaderName> {
    values
        .flat_map(|value| value.split(|&b| b == b','))
        .filter_map(|option| HeaderName::from_bytes(option.trim_ascii()).ok())
        .collect()
}
