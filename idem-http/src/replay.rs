//! A stored response as the HTTP response a retry gets.

use bytes::Bytes;
use http::header::{CONNECTION, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;
use idem_core::StoredResponse;

use crate::config::{Config, connection_options};

/// A stored response as an HTTP response, marked as a replay.
pub(crate) fn replay(stored: &StoredResponse, config: &Config) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(stored.body())));
    *response.status_mut() =
        StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // A record written under another configuration (or by another writer)
    // may hold fields this one never replays.
    let hop_by_hop = connection_options(
        stored
            .headers()
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(CONNECTION.as_str()))
            .map(|(_, value)| value.as_slice()),
    );
    for (name, value) in stored.headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) && config.is_replayed(&name, &hop_by_hop)
        {
            response.headers_mut().append(name, value);
        }
    }

    response.headers_mut().insert(
        config.replay_header.clone(),
        HeaderValue::from_static("true"),
    );
    response
}
