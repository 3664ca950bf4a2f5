//! Request fingerprints: SHA-256 over a canonical form of the request.
//!
//! A key reused for a different request is refused by comparing fingerprints,
//! so an honest retry must fingerprint alike even when the client serialises
//! differently, and two different requests must never fingerprint alike.
//! JSON is therefore canonicalised before hashing: RFC 8785 (JSON
//! Canonicalization Scheme), except that numbers keep their exact decimal
//! value (see [`canonical_json`]).

use crate::canonical::{Form, canonicalize};
use crate::plumbing::error::InvalidInput;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// The SHA-256 of a canonical request.
///
/// ```
/// use idem_core::Fingerprint;
///
/// let a = Fingerprint::json(r#"{"b":1,"a":[1.0,2]}"#)?;
/// let b = Fingerprint::json(r#"{ "a": [1, 2.0e0], "b": 1 }"#)?;
/// assert_eq!(a, b);
/// assert_ne!(a, Fingerprint::json(r#"{"a":[1,2],"b":2}"#)?);
/// assert_eq!(a.to_string().len(), 64);
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of raw bytes: their SHA-256.
    ///
    /// ```
    /// # use idem_core::Fingerprint;
    /// let fp = Fingerprint::of_bytes(b"abc");
    /// assert_eq!(
    ///     fp.to_string(),
    ///     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    /// );
    /// ```
    pub fn of_bytes(bytes: impl AsRef<[u8]>) -> Self {
        Self(Sha256::digest(bytes.as_ref()).into())
    }

    /// The fingerprint of a JSON text: the SHA-256 of its canonical form
    /// ([`canonical_json`]). Two texts share it exactly when they are the
    /// same JSON value, numbers compared by exact decimal value.
    ///
    /// ```
    /// # use idem_core::Fingerprint;
    /// let fp = |json| Fingerprint::json(json).unwrap();
    /// assert_eq!(fp(r#"{"amount":59.9}"#), fp(r#"{"amount":5.990e1}"#));
    /// // Past 2^53, where a double would take them for one number.
    /// assert_ne!(fp(r#"{"amount":9007199254740993}"#), fp(r#"{"amount":9007199254740992}"#));
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] if `json` is not valid JSON (duplicate
    /// member names included), nests deeper than 128 levels, or has a
    /// non-zero number with an exponent of more than 15 digits.
    pub fn json(json: &str) -> Result<Self, InvalidInput> {
        let mut hasher = Sha256::new();
        Form::read(json)?.hash(&mut hasher);
        Ok(Self(hasher.finalize().into()))
    }

    /// The fingerprint of any serialisable value, canonicalised like [`json`](Self::json).
    ///
    /// Integers keep every digit; a float is written as its shortest
    /// round-tripping decimal, so it fingerprints as that decimal text does.
    ///
    /// ```
    /// # use idem_core::Fingerprint;
    /// #[derive(serde::Serialize)]
    /// struct Order { sku: String, qty: u32 }
    ///
    /// let fp = Fingerprint::of(&Order { sku: "A-1".into(), qty: 2 })?;
    /// assert_eq!(fp, Fingerprint::json(r#"{"qty":2,"sku":"A-1"}"#)?);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] if the value does not serialise to JSON
    /// (a map with non-string keys, for example).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Result<Self, InvalidInput> {
        let json = serde_json::to_string(value).map_err(|e| malformed(&e))?;
        Self::json(&json)
    }

    /// A builder over named request parts (method, path, chosen headers,
    /// body), hashed length-prefixed so that no two different sequences of
    /// parts can collide.
    ///
    /// ```
    /// # use idem_core::Fingerprint;
    /// let fp = Fingerprint::parts()
    ///     .method("post")
    ///     .path("/orders")
    ///     .header("Content-Type", "application/json")
    ///     .json_body(r#"{"sku": "A-1"}"#)?
    ///     .finish();
    /// let same = Fingerprint::parts()
    ///     .method("POST")
    ///     .path("/orders")
    ///     .header("content-type", "application/json")
    ///     .json_body(r#"{"sku":"A-1"}"#)?
    ///     .finish();
    /// assert_eq!(fp, same);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn parts() -> FingerprintBuilder {
        FingerprintBuilder::new()
    }

    /// A fingerprint from its 32 digest bytes, as a store reads it back.
    pub const fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The 32 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest from a byte slice, as a store reads it back.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] unless `bytes` is exactly 32 long.
    pub fn try_from_slice(bytes: &[u8]) -> Result<Self, InvalidInput> {
        <[u8; 32]>::try_from(bytes)
            .map(Self)
            .map_err(|_| InvalidInput::Malformed {
                field: "fingerprint",
                reason: format!("expected 32 bytes, got {}", bytes.len()),
            })
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = InvalidInput;

    /// Parses the 64 hex digits that `Display` writes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(s, &mut digest).map_err(|e| InvalidInput::Malformed {
            field: "fingerprint",
            reason: e.to_string(),
        })?;
        Ok(Self(digest))
    }
}

/// Builds a [`Fingerprint`] from named parts; see [`Fingerprint::parts`].
///
/// Parts are hashed in the order they are added.
#[derive(Debug, Clone)]
pub struct FingerprintBuilder {
    hasher: Sha256,
}

impl FingerprintBuilder {
    fn new() -> Self {
        let mut builder = Self {
            hasher: Sha256::new(),
        };
        builder.update(b"idem-parts-v1");
        builder
    }

    fn update(&mut self, bytes: &[u8]) {
        self.update_joined(&[bytes]);
    }

    /// Hashes `pieces` as the one part they make end to end (SHA-256 is a
    /// stream: no need to join them first).
    fn update_joined(&mut self, pieces: &[&[u8]]) {
        let len: usize = pieces.iter().map(|piece| piece.len()).sum();
        self.hasher.update((len as u64).to_be_bytes());
        for piece in pieces {
            self.hasher.update(piece);
        }
    }

    /// Adds a part under any name.
    pub fn part(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        self.update(name.as_bytes());
        self.update(value.as_ref());
        self
    }

    /// Adds the HTTP method, case-insensitively.
    pub fn method(self, method: &str) -> Self {
        // Methods are nearly always upper case already: no copy then.
        if method.bytes().any(|b| b.is_ascii_lowercase()) {
            self.part("method", method.to_ascii_uppercase())
        } else {
            self.part("method", method)
        }
    }

    /// Adds the request path (and query, if it belongs to the intent).
    pub fn path(self, path: &str) -> Self {
        self.part("path", path)
    }

    /// Adds a header; its name is case-insensitive, its value is taken verbatim.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Self {
        // The part's name is `header:` and the name in lower case (as
        // http's `HeaderName` already is: no copy then).
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            let lower = name.to_ascii_lowercase();
            self.update_joined(&[b"header:", lower.as_bytes()]);
        } else {
            self.update_joined(&[b"header:", name.as_bytes()]);
        }
        self.update(value.as_ref());
        self
    }

    /// Adds a body taken byte for byte.
    pub fn body(self, body: impl AsRef<[u8]>) -> Self {
        self.part("body", body)
    }

    /// Adds a JSON body in its RFC 8785 canonical form.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Malformed`] if `json` is not valid JSON.
    pub fn json_body(mut self, json: &str) -> Result<Self, InvalidInput> {
        let form = Form::read(json)?;
        // As `part` hashes it, without gathering the form first.
        self.update(b"json-body");
        self.hasher.update((form.len() as u64).to_be_bytes());
        form.hash(&mut self.hasher);
        Ok(self)
    }

    /// The fingerprint of all parts added.
    pub fn finish(self) -> Fingerprint {
        Fingerprint(self.hasher.finalize().into())
    }
}

fn malformed(e: &serde_json::Error) -> InvalidInput {
    InvalidInput::Malformed {
        field: "json",
        reason: e.to_string(),
    }
}

/// The canonical form of a JSON text: what a fingerprint hashes.
///
/// It is RFC 8785's (JSON Canonicalization Scheme) but for numbers: object
/// members are sorted by the UTF-16 code units of their names (two members
/// of one name are refused), no insignificant whitespace is kept, strings
/// use the minimal escapes and compare by code point, and a number is
/// written by its **exact decimal value**, never through a double.
///
/// That is the one departure from RFC 8785, which reads every number as an
/// IEEE 754 double: there `9007199254740993` and `9007199254740992` (or two
/// decimals differing in the 30th digit) are one number, so two different
/// orders would share a fingerprint while a Rust handler reading `u64` or a
/// decimal type tells them apart. Here the digits are kept, without leading
/// or trailing zeros, and laid out as ECMAScript lays out a double's: plain
/// up to 21 integer digits, plain down to `0.000001`, otherwise one digit,
/// the rest after a point, and `e+N` or `e-N`. Where the text is a double's
/// shortest form (what JavaScript, serde_json and most serialisers write),
/// the result is RFC 8785's byte for byte; `-0` is `0`.
///
/// ```
/// use idem_core::canonical_json;
///
/// assert_eq!(
///     canonical_json(r#"{ "b": [1e3, 0.10, -0, 5.99e1], "a": "\u00e9\n" }"#)?,
///     "{\"a\":\"é\\n\",\"b\":[1000,0.1,0,59.9]}"
/// );
/// assert_eq!(canonical_json("12345678901234567890123")?, "1.2345678901234567890123e+22");
/// assert_eq!(canonical_json("9007199254740993")?, "9007199254740993");
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
///
/// # Errors
///
/// [`InvalidInput::Malformed`] for invalid JSON (including lone surrogates
/// and objects with two members of one name), nesting deeper than 128
/// levels, and a non-zero number with an exponent of more than 15 digits.
pub fn canonical_json(json: &str) -> Result<String, InvalidInput> {
    let mut out = Vec::new();
    canonicalize(json, &mut out)?;
    String::from_utf8(out).map_err(|e| InvalidInput::Malformed {
        field: "json",
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::write_string;
    use proptest::prelude::*;
    use serde_json::Value;

    /// ECMAScript's text for a finite double (an implementation of its
    /// own): the canonical form of a number written as its shortest double.
    fn write_number(x: f64, out: &mut Vec<u8>) {
        if x == 0.0 {
            out.push(b'0');
        } else {
            out.extend_from_slice(ryu_js::Buffer::new().format_finite(x).as_bytes());
        }
    }

    /// The canonical form built from a parsed document: the reference the
    /// one-pass canonicalizer must agree with.
    fn reference(value: &Value, out: &mut Vec<u8>) {
        match value {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::Number(n) => write_number(n.as_f64().unwrap(), out),
            Value::String(s) => write_string(s, out),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    reference(item, out);
                }
                out.push(b']');
            }
            Value::Object(members) => {
                let mut sorted: Vec<_> = members.iter().collect();
                sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
                out.push(b'{');
                for (i, (name, item)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_string(name, out);
                    out.push(b':');
                    reference(item, out);
                }
                out.push(b'}');
            }
        }
    }

    /// RFC 8785 appendix B: IEEE 754 bit patterns and their canonical text.
    /// Each text is the exact decimal of what it writes, laid out as
    /// ECMAScript does: also its canonical form here.
    #[test]
    fn rfc8785_number_examples() {
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for (bits, want) in cases {
            let mut text = Vec::new();
            write_number(f64::from_bits(*bits), &mut text);
            assert_eq!(text, want.as_bytes(), "bits {bits:#018x}");
            assert_eq!(canonical_json(want).unwrap(), *want);
        }
    }

    /// RFC 8785 section 3.2.2: the example object and its canonical form,
    /// but for its first number, which has more digits than a double holds:
    /// kept exact, where RFC 8785 rounds it to `333333333.3333333`.
    #[test]
    fn rfc8785_canonical_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let want = concat!(
            r#"{"literals":[null,true,false],"numbers":[333333333.33333329,1e+30,4.5,0.002,1e-27],"#,
            r#""string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        assert_eq!(canonical_json(input).unwrap(), want);
    }

    /// RFC 8785 section 3.2.3: members sorted by UTF-16 code units.
    #[test]
    fn rfc8785_sorting_example() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let canonical = canonical_json(input).unwrap();
        let values: Vec<&str> = canonical
            .split('"')
            .filter(|s| s.chars().next().is_some_and(char::is_uppercase))
            .collect();
        assert_eq!(
            values,
            [
                "Carriage Return",
                "One",
                "Control",
                "Latin Small Letter O With Diaeresis",
                "Euro Sign",
                "Emoji: Grinning Face",
                "Hebrew Letter Dalet With Dagesh"
            ]
        );
    }

    #[test]
    fn issue_example_fingerprints_alike() {
        assert_eq!(
            Fingerprint::json(r#"{"b":1,"a":[1.0,2]}"#).unwrap(),
            Fingerprint::json(r#"{ "a": [1, 2.0e0], "b": 1 }"#).unwrap()
        );
    }

    #[test]
    fn invalid_json_is_a_typed_error() {
        let deep = "[".repeat(200) + &"]".repeat(200);
        for bad in [
            "{",
            r#"{"a":}"#,
            r#""\ud800""#,
            "1e99999999999999999",
            "",
            "[1,]",
            "01",
            "1.",
            "-",
            ".5",
            "+1",
            "tru",
            "nul",
            "[1 2]",
            r#"{"a" 1}"#,
            r#"{"a":1,}"#,
            r#"{"a":1,"a":2}"#,
            "\"tab\tin\"",
            "\"unterminated",
            "[1]]",
            deep.as_str(),
        ] {
            assert!(
                matches!(canonical_json(bad), Err(InvalidInput::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn hex_round_trips() {
        let fp = Fingerprint::of_bytes(b"x");
        assert_eq!(fp.to_string().parse::<Fingerprint>().unwrap(), fp);
        assert!("zz".parse::<Fingerprint>().is_err());
        assert!(Fingerprint::try_from_slice(&[0; 31]).is_err());
    }

    #[test]
    fn parts_are_length_prefixed() {
        let a = Fingerprint::parts().path("/ab").body("c").finish();
        let b = Fingerprint::parts().path("/a").body("bc").finish();
        let c = Fingerprint::parts().part("path", "/abc").finish();
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(Fingerprint::parts().finish(), Fingerprint::of_bytes(b""));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-1_000_000i64..1_000_000).prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            "[a-zA-Z0-9 é€😀\"\\\\\n]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z€😀]{0,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes `value` as JSON with members in a permuted order and random whitespace.
    fn next(seed: &mut u64) -> usize {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as usize
    }

    fn scrambled(value: &Value, seed: &mut u64, out: &mut String) {
        let ws = [" ", "", "\n  ", "\t"];
        out.push_str(ws[next(seed) % ws.len()]);
        match value {
            Value::Object(members) => {
                let mut entries: Vec<_> = members.iter().collect();
                let len = entries.len();
                for i in (1..len).rev() {
                    entries.swap(i, next(seed) % (i + 1));
                }
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push_str(ws[next(seed) % ws.len()]);
                    out.push(':');
                    scrambled(v, seed, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    scrambled(v, seed, out);
                }
                out.push(']');
            }
            Value::Number(n) if n.is_i64() && next(seed).is_multiple_of(2) => {
                // Same value, another spelling.
                out.push_str(&format!("{}.0e0", n));
            }
            other => out.push_str(&serde_json::to_string(other).unwrap()),
        }
        out.push_str(ws[next(seed) % ws.len()]);
    }

    fn leaves(value: &Value) -> usize {
        match value {
            Value::Array(items) => items.iter().map(leaves).sum(),
            Value::Object(members) => members.values().map(leaves).sum(),
            _ => 1,
        }
    }

    /// Changes the `pick`-th leaf of `value` to a different value.
    fn mutate(value: &mut Value, pick: &mut usize) -> bool {
        match value {
            Value::Array(items) => items.iter_mut().any(|v| mutate(v, pick)),
            Value::Object(members) => members.values_mut().any(|v| mutate(v, pick)),
            leaf => {
                if *pick > 0 {
                    *pick -= 1;
                    return false;
                }
                *leaf = match leaf {
                    Value::Null => Value::Bool(false),
                    Value::Bool(b) => Value::Bool(!*b),
                    Value::Number(n) => Value::from(n.as_f64().unwrap_or(0.0) + 1.0),
                    Value::String(s) => Value::String(format!("{s}x")),
                    _ => Value::Null,
                };
                true
            }
        }
    }

    proptest! {
        #[test]
        fn shuffled_members_and_whitespace_never_change_a_fingerprint(
            value in json_value(),
            seed in any::<u64>(),
        ) {
            let plain = serde_json::to_string(&value).unwrap();
            let mut seed = seed;
            let mut other = String::new();
            scrambled(&value, &mut seed, &mut other);
            prop_assert_eq!(Fingerprint::json(&plain).unwrap(), Fingerprint::json(&other).unwrap());
            prop_assert_eq!(Fingerprint::of(&value).unwrap(), Fingerprint::json(&other).unwrap());
        }

        #[test]
        fn one_pass_canonical_form_matches_the_parsed_reference(
            value in json_value(),
            seed in any::<u64>(),
        ) {
            let mut seed = seed;
            let mut text = String::new();
            scrambled(&value, &mut seed, &mut text);
            let mut expected = Vec::new();
            reference(&value, &mut expected);
            prop_assert_eq!(canonical_json(&text).unwrap().into_bytes(), expected);
        }

        #[test]
        fn any_change_of_a_value_changes_the_fingerprint(
            value in json_value(),
            pick in 0usize..64,
        ) {
            let count = leaves(&value);
            prop_assume!(count > 0);
            let mut changed = value.clone();
            prop_assert!(mutate(&mut changed, &mut (pick % count)));
            prop_assume!(changed != value);
            prop_assert_ne!(Fingerprint::of(&value).unwrap(), Fingerprint::of(&changed).unwrap());
        }
    }
}
