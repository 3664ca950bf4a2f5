//! A stored response as the HTTP response a retry gets.

use bytes::Bytes;
use http::header::{CONNECTION, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use idem_core::StoredResponse;

use crate::config::{Config, connection_options};

/// A stored response as an HTTP response, marked as a replay. Taken by
/// value: its body and header values become the response's without a copy.
pub(crate) fn replay(mut stored: StoredResponse, config: &Config) -> Response<Full<Bytes>> {
    let headers = stored.take_headers();
    let status = StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Full::new(Bytes::from(stored.into_body())));
    *response.status_mut() = status;
    // A record written under another configuration (or by another writer)
    // may hold fields this one never replays, or bytes no header may hold.
    let hop_by_hop = connection_options(
        headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(CONNECTION.as_str()))
            .map(|(_, value)| value.as_slice()),
    );
    let replayed = response.headers_mut();
    replayed.reserve(headers.len() + 1);
    for (name, value) in headers {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        if config.is_replayed(&name, &hop_by_hop)
            && let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value))
        {
            replayed.append(name, value);
        }
    }
    replayed.insert(
        config.replay_header.clone(),
        HeaderValue::from_static("true"),
    );
    response
}
