//! What makes two requests "the same request": method, path and query,
//! chosen headers, and the body — canonical JSON for JSON bodies (so an
//! honest retry from another serialiser matches), raw bytes otherwise, or
//! only chosen parts of a JSON body.

use http::header::{CONTENT_TYPE, HeaderName};
use http::request::Parts;
use std::collections::HashMap;

use idem_core::{Fingerprint, canonical_json};
use serde_json::value::RawValue;

/// How requests are fingerprinted.
#[derive(Debug, Clone, Default)]
pub(crate) struct FingerprintRules {
    /// Headers whose values count, in this order.
    pub(crate) headers: Vec<HeaderName>,
    /// RFC 6901 JSON pointers: only these parts of a JSON body count.
    pub(crate) json_pointers: Option<Vec<String>>,
}

fn is_json(parts: &Parts) -> bool {
    parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| {
            let mime = mime.trim().as_bytes();
            mime.eq_ignore_ascii_case(b"application/json")
                || mime
                    .len()
                    .checked_sub(5)
                    .is_some_and(|at| mime[at..].eq_ignore_ascii_case(b"+json"))
        })
        .unwrap_or(false)
}

impl FingerprintRules {
    /// The fingerprint of a request.
    pub(crate) fn fingerprint(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
        let mut builder = Fingerprint::parts()
            .method(parts.method.as_str())
            .path(path);
        for name in &self.headers {
            for value in parts.headers.get_all(name) {
                builder = builder.header(name.as_str(), value.as_bytes());
            }
        }
        // A body that is not JSON after all counts as its bytes.
        if is_json(parts)
            && let Ok(text) = std::str::from_utf8(body)
        {
            let selected = match &self.json_pointers {
                None => builder.clone().json_body(text).ok(),
                Some(pointers) => canonical_json(text).ok().and_then(|doc| {
                    // The canonical text: exact numbers, no duplicate names.
                    let mut picked = String::from("[");
                    for (i, pointer) in pointers.iter().enumerate() {
                        if i > 0 {
                            picked.push(',');
                        }
                        picked.push_str(select(&doc, pointer).unwrap_or("null"));
                    }
                    picked.push(']');
                    builder.clone().json_body(&picked).ok()
                }),
            };
            if let Some(builder) = selected {
                return builder.finish();
            }
        }
        builder.body(body).finish()
    }
}

/// The text of the value an RFC 6901 JSON pointer selects in `doc`, read
/// without numbers ever passing through a double.
fn select<'a>(doc: &'a str, pointer: &str) -> Option<&'a str> {
    let mut at: &'a RawValue = serde_json::from_str(doc).ok()?;
    if pointer.is_empty() {
        return Some(at.get());
    }
    let mut tokens = pointer.split('/');
    if tokens.next() != Some("") {
        return None;
    }
    for token in tokens {
        let token = token.replace("~1", "/").replace("~0", "~");
        at = match at.get().as_bytes().first() {
            Some(b'{') => *serde_json::from_str::<HashMap<String, &RawValue>>(at.get())
                .ok()?
                .get(&token)?,
            Some(b'[') => {
                // RFC 6901: an index is 0 or digits without a leading zero.
                if token.len() > 1 && token.starts_with('0') {
                    return None;
                }
                let index: usize = token.parse().ok()?;
                *serde_json::from_str::<Vec<&RawValue>>(at.get())
                    .ok()?
                    .get(index)?
            }
            _ => return None,
        };
    }
    Some(at.get())
}

#[cfg(test)]
mod tests {
    use http::{Method, Request};

    use super::*;

    fn parts(method: Method, uri: &str, content_type: Option<&str>) -> Parts {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            request = request.header(CONTENT_TYPE, ct);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn json_bodies_match_across_serialisers_and_raw_bodies_by_bytes() {
        let rules = FingerprintRules::default();
        let json = parts(
            Method::POST,
            "/orders",
            Some("application/json; charset=utf-8"),
        );
        assert_eq!(
            rules.fingerprint(&json, br#"{"a":1,"b":[1.0,2]}"#),
            rules.fingerprint(&json, br#"{ "b": [1, 2.0], "a": 1.0 }"#)
        );
        let text = parts(Method::POST, "/orders", Some("text/plain"));
        assert_ne!(
            rules.fingerprint(&text, br#"{"a":1}"#),
            rules.fingerprint(&text, br#"{ "a": 1 }"#)
        );
    }

    #[test]
    fn method_path_query_and_chosen_headers_count() {
        let rules = FingerprintRules {
            headers: vec![HeaderName::from_static("x-account")],
            json_pointers: None,
        };
        let a = parts(Method::POST, "/orders?x=1", None);
        let b = parts(Method::POST, "/orders?x=2", None);
        let c = parts(Method::PATCH, "/orders?x=1", None);
        let d = parts(Method::POST, "/payments?x=1", None);
        let fp = |p: &Parts| rules.fingerprint(p, b"same");
        assert_ne!(fp(&a), fp(&b));
        assert_ne!(fp(&a), fp(&c));
        assert_ne!(fp(&a), fp(&d));
        let mut e = a.clone();
        e.headers.insert("x-account", "7".parse().unwrap());
        assert_ne!(fp(&a), fp(&e));
        e.headers.insert("x-other", "ignored".parse().unwrap());
        let mut f = a.clone();
        f.headers.insert("x-account", "7".parse().unwrap());
        assert_eq!(fp(&e), fp(&f));
    }

    #[test]
    fn json_pointers_fingerprint_only_the_chosen_parts() {
        let rules = FingerprintRules {
            headers: Vec::new(),
            json_pointers: Some(vec!["/amount".into(), "/currency".into()]),
        };
        let json = parts(Method::POST, "/pay", Some("application/json"));
        let fp = |body: &str| rules.fingerprint(&json, body.as_bytes());
        assert_eq!(
            fp(r#"{"amount":10,"currency":"EUR","trace":"a"}"#),
            fp(r#"{"trace":"b","currency":"EUR","amount":10.0}"#)
        );
        assert_ne!(
            fp(r#"{"amount":10,"currency":"EUR"}"#),
            fp(r#"{"amount":11,"currency":"EUR"}"#)
        );
    }

    #[test]
    fn json_pointers_compare_numbers_exactly() {
        let rules = FingerprintRules {
            headers: Vec::new(),
            json_pointers: Some(vec!["/order/amount".into(), "/items/1".into()]),
        };
        let json = parts(Method::POST, "/pay", Some("application/json"));
        let fp = |body: &str| rules.fingerprint(&json, body.as_bytes());
        assert_ne!(
            fp(r#"{"order":{"amount":9007199254740993},"items":[0,1]}"#),
            fp(r#"{"order":{"amount":9007199254740992},"items":[0,1]}"#)
        );
        assert_ne!(
            fp(r#"{"order":{"amount":1},"items":[0,0.100000000000000000000000000001]}"#),
            fp(r#"{"order":{"amount":1},"items":[0,0.100000000000000000000000000002]}"#)
        );
        assert_eq!(
            fp(r#"{"order":{"amount":59.9,"note":"a"},"items":[7,1]}"#),
            fp(r#"{"items":[8,1.0],"order":{"note":"b","amount":5.990e1}}"#)
        );
    }

    #[test]
    fn json_pointers_follow_rfc_6901() {
        let doc = r#"{"a/b":{"m~n":[10,20]},"":1}"#;
        assert_eq!(select(doc, "/a~1b/m~0n/1"), Some("20"));
        assert_eq!(select(doc, "/"), Some("1"));
        assert_eq!(select(doc, ""), Some(doc));
        assert_eq!(select(doc, "/a~1b/m~0n/01"), None);
        assert_eq!(select(doc, "/a~1b/m~0n/2"), None);
        assert_eq!(select(doc, "/missing"), None);
        assert_eq!(select(doc, "no-slash"), None);
    }
}
