//! The `Idempotency-Key` header: one sf-string (RFC 9651 Structured Field
//! Values), parsed with `sfv`, or where the layer takes bare keys one RFC
//! 9110 token as it is (checked by `http`'s field-name grammar, which is
//! the token's); then held to idem's key rules.

use http::HeaderMap;
use http::header::HeaderName;
use idem_core::IdempotencyKey;

/// Why a request's key header was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// The header appears more than once.
    Duplicated,
    /// The value is not one sf-string item (a token, a list, bad syntax).
    NotAString(String),
    /// Where bare keys are taken: neither one token nor one sf-string.
    NotAStringOrToken(String),
    /// An sf-string that breaks idem's key rules (empty, over 255 bytes).
    Invalid(String),
}

impl KeyError {
    pub(crate) fn detail(&self, header: &HeaderName) -> String {
        match self {
            Self::Duplicated => format!("The {header} header must appear once."),
            Self::NotAString(why) => format!(
                "The {header} header must be one quoted string (an RFC 9651 sf-string): {why}."
            ),
            Self::NotAStringOrToken(why) => format!(
                "The {header} header must be one token or one quoted string (an RFC 9651 sf-string): {why}."
            ),
            Self::Invalid(why) => format!("The {header} header is not a valid key: {why}."),
        }
    }
}

/// The key in `headers`, `None` if there is no such header.
pub(crate) fn from_headers(
    headers: &HeaderMap,
    name: &HeaderName,
    bare: bool,
) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Duplicated);
    }
    let text = match (quoted(value.as_bytes()), bare) {
        (Ok(text), _) => text,
        // A field name is a token (RFC 9110 §5.1): one is the key as sent.
        (Err(_), true) if HeaderName::from_bytes(value.as_bytes()).is_ok() => {
            String::from_utf8_lossy(value.as_bytes()).into_owned()
        }
        (Err(why), true) => return Err(KeyError::NotAStringOrToken(why)),
        (Err(why), false) => return Err(KeyError::NotAString(why)),
    };
    IdempotencyKey::try_from(text.as_str())
        .map(Some)
        .map_err(|e| KeyError::Invalid(e.to_string()))
}

/// The text of one sf-string, or why the value is not one.
fn quoted(value: &[u8]) -> Result<String, String> {
    let item: sfv::Item = sfv::Parser::new(value).parse().map_err(|e| e.to_string())?;
    item.bare_item
        .as_string()
        .map(|text| text.as_str().to_string())
        .ok_or_else(|| "the value is not a string".to_string())
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn parse(values: &[&[u8]]) -> Result<Option<String>, KeyError> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("idempotency-key", HeaderValue::from_bytes(value).unwrap());
        }
        from_headers(&headers, &HeaderName::from_static("idempotency-key"), false)
            .map(|k| k.map(|k| k.as_str().to_string()))
    }

    fn lenient(values: &[&[u8]]) -> Result<Option<String>, KeyError> {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("idempotency-key", HeaderValue::from_bytes(value).unwrap());
        }
        from_headers(&headers, &HeaderName::from_static("idempotency-key"), true)
            .map(|k| k.map(|k| k.as_str().to_string()))
    }

    #[test]
    fn where_bare_keys_are_taken_one_token_is_the_key_as_sent() {
        assert_eq!(
            lenient(&[b"8e03978e-40d5"]),
            Ok(Some("8e03978e-40d5".into()))
        );
        assert_eq!(
            lenient(&[b"Key_A.b~c"]),
            Ok(Some("Key_A.b~c".into())),
            "case kept"
        );
        assert_eq!(lenient(&[b"42"]), Ok(Some("42".into())));
        assert_eq!(
            lenient(&[br#""8e03978e-40d5""#]),
            lenient(&[b"8e03978e-40d5"]),
            "the quoted and the bare form are one key"
        );
        assert_eq!(lenient(&[br#""a b""#]), Ok(Some("a b".into())));
    }

    #[test]
    fn where_bare_keys_are_taken_what_is_neither_token_nor_string_is_refused() {
        for value in [
            &b"a b"[..],
            b"a, b",
            br#""open"#,
            b"a/b",
            b"a:b",
            b"(x)",
            br"k\",
        ] {
            assert!(
                matches!(lenient(&[value]), Err(KeyError::NotAStringOrToken(_))),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        assert_eq!(lenient(&[b"a", b"a"]), Err(KeyError::Duplicated));
        let long = "k".repeat(256);
        assert!(matches!(
            lenient(&[long.as_bytes()]),
            Err(KeyError::Invalid(_))
        ));
    }

    #[test]
    fn a_quoted_string_is_the_key() {
        assert_eq!(
            parse(&[br#""8e03978e-40d5""#]),
            Ok(Some("8e03978e-40d5".into()))
        );
        assert_eq!(parse(&[br#""a \"b\" c""#]), Ok(Some(r#"a "b" c"#.into())));
        assert_eq!(parse(&[]), Ok(None));
    }

    #[test]
    fn tokens_lists_bad_syntax_and_repeats_are_refused() {
        assert!(matches!(
            parse(&[b"unquoted"]),
            Err(KeyError::NotAString(_))
        ));
        assert!(matches!(parse(&[b"42"]), Err(KeyError::NotAString(_))));
        assert!(matches!(
            parse(&[br#""a", "b""#]),
            Err(KeyError::NotAString(_))
        ));
        assert!(matches!(
            parse(&[br#""open"#]),
            Err(KeyError::NotAString(_))
        ));
        assert_eq!(parse(&[br#""a""#, br#""a""#]), Err(KeyError::Duplicated));
    }

    #[test]
    fn empty_and_overlong_keys_are_refused() {
        assert!(matches!(parse(&[br#""""#]), Err(KeyError::Invalid(_))));
        let long = format!("\"{}\"", "k".repeat(256));
        assert!(matches!(
            parse(&[long.as_bytes()]),
            Err(KeyError::Invalid(_))
        ));
        let longest = format!("\"{}\"", "k".repeat(255));
        assert!(parse(&[longest.as_bytes()]).unwrap().is_some());
    }
}
