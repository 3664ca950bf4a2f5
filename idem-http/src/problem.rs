//! Refusals as `application/problem+json` (RFC 9457), with the titles of
//! the Idempotency-Key draft for its three scenarios.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

/// The draft's title for a missing key.
pub(crate) const MISSING: &str = "Idempotency-Key is missing";
/// The draft's title for a key reused with another request.
pub(crate) const REUSED: &str = "Idempotency-Key is already used";
/// The draft's title for a request still in flight.
pub(crate) const OUTSTANDING: &str = "A request is outstanding for this Idempotency-Key";

/// A problem response of `status` with `title` and `detail`; `kind` is the
/// problem type URI.
pub(crate) fn problem(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> Response<Full<Bytes>> {
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

    #[tokio::test]
    async fn problems_are_json_with_type_title_status_and_detail() {
        let response = retry_after(
            problem(StatusCode::CONFLICT, "about:blank", OUTSTANDING, "wait"),
            Duration::from_millis(1_500),
        );
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["title"], OUTSTANDING);
        assert_eq!(json["status"], 409);
        assert_eq!(json["type"], "about:blank");
        assert_eq!(json["detail"], "wait");
    }
}
