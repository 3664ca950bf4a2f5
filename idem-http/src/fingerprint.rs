//! What makes two requests "the same request": method, path and query,
//! chosen headers, and the body — canonical JSON for JSON bodies (so an
//! honest retry from another serialiser matches), raw bytes otherwise, or
//! only chosen parts of a JSON body.

use http::header::{CONTENT_TYPE, HeaderName};
use http::request::Parts;
use idem_core::Fingerprint;
use serde_json::Value;

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
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json" || mime.ends_with("+json")
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
                Some(pointers) => serde_json::from_str::<Value>(text).ok().and_then(|doc| {
                    let picked: Vec<Value> = pointers
                        .iter()
                        .map(|p| doc.pointer(p).cloned().unwrap_or(Value::Null))
                        .collect();
                    let json = serde_json::to_string(&picked).ok()?;
                    builder.clone().json_body(&json).ok()
                }),
            };
            if let Some(builder) = selected {
                return builder.finish();
            }
        }
        builder.body(body).finish()
    }
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
}
