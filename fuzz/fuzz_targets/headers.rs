//! The response encoding stores share (`encode_headers` / `decode_response`):
//! any status and header bytes decode to a response or `None`, never a panic;
//! a decoded response encodes back to exactly the bytes read; and any
//! response built from the input survives encode then decode unchanged.
//!
//! Input: 8 bytes of status (big-endian i64), then the encoded headers; the
//! same bytes also drive `arbitrary` to build a response.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use idem_core::StoredResponse;
use idem_core::store::{decode_response, decode_response_parts, encode_headers};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

fuzz_target!(|data: &[u8]| {
    let (status, headers) = match data.split_first_chunk::<8>() {
        Some((status, rest)) => (i64::from_be_bytes(*status), rest),
        None => (200, data),
    };
    if let Some(decoded) = decode_response(status, headers, b"body".to_vec()) {
        assert_eq!(i64::from(decoded.status()), status);
        assert_eq!(decoded.body(), b"body");
        assert_eq!(encode_headers(&decoded), headers, "decoding is not exact");
        let parts = decoded
            .headers()
            .iter()
            .map(|(n, v)| (n.clone().into_bytes(), v.clone()));
        assert_eq!(
            decode_response_parts(status, parts, b"body".to_vec()).as_ref(),
            Some(&decoded)
        );
    } else {
        assert!(u16::try_from(status).is_err() || !headers.is_empty());
    }

    let Ok(built) = Response::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let response = built.headers.into_iter().fold(
        StoredResponse::new(built.status, built.body),
        |r, (n, v)| r.with_header(n, v),
    );
    let encoded = encode_headers(&response);
    let back = decode_response(
        i64::from(response.status()),
        &encoded,
        response.body().to_vec(),
    );
    assert_eq!(back.as_ref(), Some(&response));
});
