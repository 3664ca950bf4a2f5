//! Refusals as `application/problem+json` (RFC 9457).
//!
//! By default a problem's `type` is `about:blank` and its `title` the status
//! phrase, as RFC 9457 §4.2.1 asks. With a documentation link configured
//! (the Idempotency-Key draft's §2.7), each problem gets a type URI of its
//! own under that link, `{link}#{fragment}` (the fragments are listed on
//! [`IdempotencyLayer::problem_documentation`](crate::IdempotencyLayer::problem_documentation)),
//! with the draft's titles.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// What went wrong, with its fragment and title under a documentation link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    MissingKey,
    InvalidKey,
    NoTenant,
    KeyReused,
    Outstanding,
    BodyTooLarge,
    UnreadableBody,
    TakenOver,
    StoreUnavailable,
    Internal,
}

impl Problem {
    /// Every problem, for the documentation and its test.
    #[cfg(test)]
    const ALL: [Problem; 10] = [
        Problem::MissingKey,
        Problem::InvalidKey,
        Problem::NoTenant,
        Problem::KeyReused,
        Problem::Outstanding,
        Problem::BodyTooLarge,
        Problem::UnreadableBody,
        Problem::TakenOver,
        Problem::StoreUnavailable,
        Problem::Internal,
    ];

    /// The fragment of its type URI under the documentation link.
    pub(crate) fn fragment(self) -> &'static str {
        match self {
            Problem::MissingKey => "idempotency-key-missing",
            Problem::InvalidKey => "idempotency-key-invalid",
            Problem::NoTenant => "tenant-missing",
            Problem::KeyReused => "idempotency-key-reused",
            Problem::Outstanding => "request-outstanding",
            Problem::BodyTooLarge => "request-body-too-large",
            Problem::UnreadableBody => "request-body-unreadable",
            Problem::TakenOver => "request-taken-over",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::Internal => "internal-error",
        }
    }

    /// Its title under a documentation link: the draft's for its three
    /// scenarios.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Problem::MissingKey => "Idempotency-Key is missing",
            Problem::InvalidKey => "Idempotency-Key is invalid",
            Problem::NoTenant => "No tenant",
            Problem::KeyReused => "Idempotency-Key is already used",
            Problem::Outstanding => "A request is outstanding for this Idempotency-Key",
            Problem::BodyTooLarge => "Request body too large",
            Problem::UnreadableBody => "Unreadable request body",
            Problem::TakenOver => "The request was taken over",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::Internal => "Internal error",
        }
    }
}

/// The status's reason phrase as RFC 9110 names it: the `http` crate
/// still has RFC 7231's names for the two it renamed.
fn reason_phrase(status: StatusCode) -> &'static str {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => "Content Too Large",
        StatusCode::UNPROCESSABLE_ENTITY => "Unprocessable Content",
        other => other.canonical_reason().unwrap_or("Error"),
    }
}

/// An RFC 9457 problem (`application/problem+json`), as this crate's layer
/// answers its refusals: by default `about:blank` titled with the status's
/// RFC 9110 phrase; a type URI and title of its own where it has one; any
/// extension members; `Retry-After` where the client should come back.
/// Other crates' routes (`idem-admin`'s) answer through it, so every idem
/// problem reads alike.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use idem_http::ProblemDetails;
///
/// let response = ProblemDetails::new(StatusCode::CONFLICT, "held by an executor")
///     .with_extension("state", "unknown")
///     .with_retry_after(Duration::from_millis(1_500))
///     .into_response();
/// assert_eq!(response.status(), StatusCode::CONFLICT);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert_eq!(response.headers()["retry-after"], "2");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ProblemDetails {
    status: StatusCode,
    kind: Option<(String, String)>,
    detail: String,
    extensions: serde_json::Map<String, serde_json::Value>,
    retry_after: Option<Duration>,
}

impl ProblemDetails {
    /// A problem of `status` with `detail`, `about:blank`.
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            kind: None,
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            retry_after: None,
        }
    }

    /// The same with a type URI of its own and its title.
    #[must_use]
    pub fn with_type(mut self, uri: impl Into<String>, title: impl Into<String>) -> Self {
        self.kind = Some((uri.into(), title.into()));
        self
    }

    /// The same with an extension member (RFC 9457 §3.2); the standard
    /// members' names (`type`, `title`, `status`, `detail`) are kept for
    /// them.
    #[must_use]
    pub fn with_extension(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        if !matches!(name, "type" | "title" | "status" | "detail") {
            self.extensions.insert(name.to_string(), value.into());
        }
        self
    }

    /// The same telling the client when to retry (whole seconds, rounded
    /// up, at least one).
    #[must_use]
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// Its status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Its detail.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The problem as its JSON document.
    pub fn to_json(&self) -> serde_json::Value {
        let (kind, title) = match &self.kind {
            Some((uri, title)) => (uri.as_str(), title.as_str()),
            None => ("about:blank", reason_phrase(self.status)),
        };
        let mut body = self.extensions.clone();
        body.insert("type".into(), kind.into());
        body.insert("title".into(), title.into());
        body.insert("status".into(), self.status.as_u16().into());
        body.insert("detail".into(), self.detail.clone().into());
        serde_json::Value::Object(body)
    }

    /// The response: the status, `Content-Type: application/problem+json`,
    /// `Content-Language: en`, `Retry-After` if given, the JSON document.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(self.to_json().to_string())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(header::CONTENT_LANGUAGE, HeaderValue::from_static("en"));
        if let Some(wait) = self.retry_after {
            headers.insert(header::RETRY_AFTER, seconds(wait));
        }
        response
    }
}

/// A problem response: `kind` of `status`, with `detail`; `documentation`
/// is the configured link, if any.
pub(crate) fn problem(
    documentation: Option<&str>,
    kind: Problem,
    status: StatusCode,
    detail: &str,
) -> Response<Full<Bytes>> {
    let details = ProblemDetails::new(status, detail);
    match documentation {
        Some(link) => details.with_type(format!("{link}#{}", kind.fragment()), kind.title()),
        None => details,
    }
    .into_response()
}

/// The same problem, telling the client when to retry (whole seconds,
/// rounded up, at least one).
pub(crate) fn retry_after(
    mut response: Response<Full<Bytes>>,
    wait: Duration,
) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, seconds(wait));
    response
}

/// A wait as `Retry-After` seconds: rounded up, at least one.
fn seconds(wait: Duration) -> HeaderValue {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    async fn json(response: Response<Full<Bytes>>) -> serde_json::Value {
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    #[tokio::test]
    async fn by_default_problems_are_about_blank_titled_with_the_status_phrase() {
        let response = retry_after(
            problem(None, Problem::Outstanding, StatusCode::CONFLICT, "wait"),
            Duration::from_millis(1_500),
        );
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let json = json(response).await;
        assert_eq!(json["type"], "about:blank");
        assert_eq!(json["title"], "Conflict");
        assert_eq!(json["status"], 409);
        assert_eq!(json["detail"], "wait");
    }

    #[tokio::test]
    async fn with_documentation_each_problem_has_its_own_type_and_title() {
        let link = "https://docs.example.com/idempotency";
        let mut types = Vec::new();
        for kind in Problem::ALL {
            let json = json(problem(Some(link), kind, StatusCode::BAD_REQUEST, "x")).await;
            assert_eq!(json["title"], kind.title());
            types.push(json["type"].as_str().unwrap().to_string());
        }
        assert_eq!(types[0], format!("{link}#idempotency-key-missing"));
        types.sort();
        types.dedup();
        assert_eq!(types.len(), Problem::ALL.len(), "two problems share a type");
    }
}
