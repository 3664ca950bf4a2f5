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

/// A problem response: `kind` of `status`, with `detail`; `documentation`
/// is the configured link, if any.
pub(crate) fn problem(
    documentation: Option<&str>,
    kind: Problem,
    status: StatusCode,
    detail: &str,
) -> Response<Full<Bytes>> {
    let (kind, title) = match documentation {
        Some(link) => (format!("{link}#{}", kind.fragment()), kind.title()),
        None => ("about:blank".to_string(), reason_phrase(status)),
    };
    let body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
        .headers_mut()
        .insert(header::CONTENT_LANGUAGE, HeaderValue::from_static("en"));
    response
}

/// The same problem, telling the client when to retry (whole seconds,
/// rounded up, at least one).
pub(crate) fn retry_after(
    mut response: Response<Full<Bytes>>,
    wait: Duration,
) -> Response<Full<Bytes>> {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    response
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
