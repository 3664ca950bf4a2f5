//! RFC 8785 (JSON Canonicalization Scheme) in one pass over the input bytes.
//!
//! Fingerprinting is on every request's path, so the canonical form is
//! written straight from the text: strings without escapes and integers that
//! a double holds exactly are copied as they stand (they are already
//! canonical), and only the members of each object are buffered, to be
//! sorted. Everything else (escapes, fractions, exponents) takes the slow,
//! exact path: decode, then write as RFC 8785 says.

use std::fmt::Write as _;

use crate::error::InvalidInput;

/// Nesting deeper than this is refused, so no input can exhaust the stack.
const MAX_DEPTH: usize = 128;

fn malformed(reason: impl Into<String>) -> InvalidInput {
    InvalidInput::Malformed {
        field: "json",
        reason: reason.into(),
    }
}

/// Appends the canonical form of the JSON text `json` to `out`.
pub(crate) fn canonicalize(json: &str, out: &mut Vec<u8>) -> Result<(), InvalidInput> {
    let mut parser = Parser {
        json,
        text: json.as_bytes(),
        at: 0,
        depth: 0,
        spare: Vec::new(),
    };
    parser.skip_whitespace();
    parser.value(out)?;
    parser.skip_whitespace();
    if parser.at != parser.text.len() {
        return Err(malformed(format!(
            "trailing characters at byte {}",
            parser.at
        )));
    }
    Ok(())
}

struct Parser<'a> {
    json: &'a str,
    text: &'a [u8],
    at: usize,
    depth: usize,
    /// Buffers of finished objects, reused by the next ones.
    spare: Vec<(Vec<u8>, Vec<Member<'a>>)>,
}

/// A member of an object being canonicalized: its decoded name (borrowed
/// from the input when it has no escapes), and where its `"name":value`
/// text sits in the object's buffer.
struct Member<'a> {
    name: std::borrow::Cow<'a, str>,
    ascii: bool,
    text: std::ops::Range<usize>,
}

impl Member<'_> {
    /// RFC 8785 member order: UTF-16 code units, which for ASCII names is
    /// plain byte order.
    fn order(&self, other: &Self) -> std::cmp::Ordering {
        if self.ascii && other.ascii {
            self.name.as_bytes().cmp(other.name.as_bytes())
        } else {
            self.name.encode_utf16().cmp(other.name.encode_utf16())
        }
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), InvalidInput> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(malformed(format!(
                "expected '{}' at byte {}",
                byte as char, self.at
            )))
        }
    }

    fn value(&mut self, out: &mut Vec<u8>) -> Result<(), InvalidInput> {
        match self.peek() {
            Some(b'{') => self.nested(|p| p.object(out)),
            Some(b'[') => self.nested(|p| p.array(out)),
            Some(b'"') => self.string(out).map(|_| ()),
            Some(b't') => self.literal(b"true", out),
            Some(b'f') => self.literal(b"false", out),
            Some(b'n') => self.literal(b"null", out),
            Some(b'-' | b'0'..=b'9') => self.number(out),
            Some(other) => Err(malformed(format!(
                "unexpected '{}' at byte {}",
                other.escape_ascii(),
                self.at
            ))),
            None => Err(malformed("unexpected end of input")),
        }
    }

    fn nested(
        &mut self,
        inner: impl FnOnce(&mut Self) -> Result<(), InvalidInput>,
    ) -> Result<(), InvalidInput> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(malformed(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let result = inner(self);
        self.depth -= 1;
        result
    }

    fn literal(&mut self, word: &[u8], out: &mut Vec<u8>) -> Result<(), InvalidInput> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            out.extend_from_slice(word);
            Ok(())
        } else {
            Err(malformed(format!("invalid literal at byte {}", self.at)))
        }
    }

    fn array(&mut self, out: &mut Vec<u8>) -> Result<(), InvalidInput> {
        self.expect(b'[')?;
        out.push(b'[');
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            out.push(b']');
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            self.value(out)?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => {
                    self.at += 1;
                    out.push(b',');
                }
                Some(b']') => {
                    self.at += 1;
                    out.push(b']');
                    return Ok(());
                }
                _ => {
                    return Err(malformed(format!(
                        "expected ',' or ']' at byte {}",
                        self.at
                    )));
                }
            }
        }
    }

    fn object(&mut self, out: &mut Vec<u8>) -> Result<(), InvalidInput> {
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            out.extend_from_slice(b"{}");
            return Ok(());
        }
        let (mut buffer, mut members) = self.spare.pop().unwrap_or_default();
        let result = self.members(&mut buffer, &mut members).and_then(|()| {
            members.sort_by(Member::order);
            if members.windows(2).any(|pair| pair[0].name == pair[1].name) {
                return Err(malformed("an object has two members of the same name"));
            }
            out.push(b'{');
            for (i, member) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&buffer[member.text.clone()]);
            }
            out.push(b'}');
            Ok(())
        });
        buffer.clear();
        members.clear();
        self.spare.push((buffer, members));
        result
    }

    /// Reads the members of an object into `buffer`, each as `"name":value`.
    fn members(
        &mut self,
        buffer: &mut Vec<u8>,
        members: &mut Vec<Member<'a>>,
    ) -> Result<(), InvalidInput> {
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(malformed(format!(
                    "expected a member name at byte {}",
                    self.at
                )));
            }
            let start = buffer.len();
            let quoted = self.at;
            let name = if self.string(buffer)? {
                // Between two ASCII quotes of a &str: a str, checked in O(1).
                let text = self.json.get(quoted + 1..self.at - 1).unwrap_or_default();
                std::borrow::Cow::Borrowed(text)
            } else {
                let canonical =
                    std::str::from_utf8(&buffer[start..]).map_err(|e| malformed(e.to_string()))?;
                std::borrow::Cow::Owned(
                    serde_json::from_str(canonical).map_err(|e| malformed(e.to_string()))?,
                )
            };
            let ascii = name.is_ascii();
            self.skip_whitespace();
            self.expect(b':')?;
            buffer.push(b':');
            self.skip_whitespace();
            self.value(buffer)?;
            members.push(Member {
                name,
                ascii,
                text: start..buffer.len(),
            });
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => {
                    return Err(malformed(format!(
                        "expected ',' or '}}' at byte {}",
                        self.at
                    )));
                }
            }
        }
    }

    /// Writes a string's canonical form; `true` if it was copied verbatim.
    fn string(&mut self, out: &mut Vec<u8>) -> Result<bool, InvalidInput> {
        let start = self.at;
        self.expect(b'"')?;
        let body = self.at;
        // Fast path: no escapes means the input is already canonical.
        while let Some(byte) = self.peek() {
            match byte {
                b'"' => {
                    self.at += 1;
                    out.extend_from_slice(&self.text[start..self.at]);
                    return Ok(true);
                }
                b'\\' => break,
                0x00..=0x1f => {
                    return Err(malformed(format!(
                        "control character in a string at byte {}",
                        self.at
                    )));
                }
                _ => self.at += 1,
            }
        }
        // Slow path: decode with serde_json, then escape as RFC 8785 says.
        let end = self.string_end(body)?;
        let literal = &self.text[start..end];
        let text = std::str::from_utf8(literal).map_err(|e| malformed(e.to_string()))?;
        let decoded: String = serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
        self.at = end;
        write_string(&decoded, out);
        Ok(false)
    }

    /// The index just past the closing quote of a string whose body starts at `from`.
    fn string_end(&self, from: usize) -> Result<usize, InvalidInput> {
        let mut i = from;
        while let Some(&byte) = self.text.get(i) {
            match byte {
                b'"' => return Ok(i + 1),
                b'\\' => i += 2,
                _ => i += 1,
            }
        }
        Err(malformed("unterminated string"))
    }

    fn number(&mut self, out: &mut Vec<u8>) -> Result<(), InvalidInput> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let from = p.at;
            while let Some(b'0'..=b'9') = p.peek() {
                p.at += 1;
            }
            p.at - from
        };
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let int_start = self.at;
        let int_digits = digits(self);
        if int_digits == 0 || (int_digits > 1 && self.text[int_start] == b'0') {
            return Err(malformed(format!("invalid number at byte {start}")));
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            integer = false;
            if digits(self) == 0 {
                return Err(malformed(format!("invalid number at byte {start}")));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if digits(self) == 0 {
                return Err(malformed(format!("invalid number at byte {start}")));
            }
        }
        let literal = &self.text[start..self.at];
        // Up to 15 digits a double holds exactly, and ECMAScript writes
        // such an integer as it stands (but -0 as 0).
        if integer && int_digits <= 15 {
            if literal == b"-0" {
                out.push(b'0');
            } else {
                out.extend_from_slice(literal);
            }
            return Ok(());
        }
        if is_canonical_decimal(&self.text[int_start..self.at]) {
            out.extend_from_slice(literal);
            return Ok(());
        }
        let text = std::str::from_utf8(literal).map_err(|e| malformed(e.to_string()))?;
        let value: f64 = text
            .parse()
            .map_err(|_| malformed(format!("invalid number {text}")))?;
        write_number(value, out)
    }
}

/// Whether an unsigned number literal is already what ECMAScript would write
/// for it: `int.frac` with no exponent and no trailing zero, at most 15
/// significant digits (so the nearest double prints back as exactly these
/// digits, and no shorter decimal maps to it), and at least 1e-6 (below
/// that ECMAScript switches to an exponent).
fn is_canonical_decimal(literal: &[u8]) -> bool {
    let Some(dot) = literal.iter().position(|&b| b == b'.') else {
        return false;
    };
    let (int, frac) = (&literal[..dot], &literal[dot + 1..]);
    if frac.is_empty() || !frac.iter().all(u8::is_ascii_digit) || frac.last() == Some(&b'0') {
        return false;
    }
    let significant = if int == b"0" {
        let zeros = frac.iter().take_while(|&&b| b == b'0').count();
        if zeros > 5 {
            return false;
        }
        frac.len() - zeros
    } else {
        int.len() + frac.len()
    };
    significant <= 15
}

/// A string with RFC 8785's minimal escapes.
pub(crate) fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\r' => out.extend_from_slice(b"\\r"),
            c if c < ' ' => {
                let mut escaped = String::with_capacity(6);
                let _ = write!(escaped, "\\u{:04x}", c as u32);
                out.extend_from_slice(escaped.as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// ECMAScript `Number.prototype.toString` for a finite double, which RFC 8785
/// prescribes (ties between two shortest forms go to the even digit).
pub(crate) fn write_number(x: f64, out: &mut Vec<u8>) -> Result<(), InvalidInput> {
    if !x.is_finite() {
        return Err(malformed("a number beyond the range of a double"));
    }
    if x == 0.0 {
        out.push(b'0'); // -0 too
    } else {
        out.extend_from_slice(ryu_js::Buffer::new().format_finite(x).as_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(json: &str) -> String {
        let mut out = Vec::new();
        canonicalize(json, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn short_decimals_are_copied_and_the_rest_reformatted() {
        for (input, want) in [
            ("12.34", "12.34"),
            ("-0.5", "-0.5"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("1.50", "1.5"),
            ("0.0", "0"),
            ("123456789012.345", "123456789012.345"),
            ("1.0000000000000001", "1"),
            ("0.1234567890123456", "0.1234567890123456"),
            ("1e2", "100"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("9007199254740993", "9007199254740992"),
        ] {
            assert_eq!(canonical(input), want, "{input}");
        }
    }

    #[test]
    fn decimal_fast_path_agrees_with_the_exact_path() {
        for literal in [
            "0.1",
            "0.2",
            "2.675",
            "1.005",
            "99999999999999.9",
            "0.000123456789012",
            "5.551115123125783",
        ] {
            let mut exact = Vec::new();
            write_number(literal.parse().unwrap(), &mut exact).unwrap();
            assert_eq!(canonical(literal).as_bytes(), exact.as_slice(), "{literal}");
        }
    }

    #[test]
    fn escaped_names_sort_by_what_they_decode_to() {
        assert_eq!(canonical(r#"{"\u0062":1,"a":2}"#), r#"{"a":2,"b":1}"#);
        assert!(canonicalize(r#"{"\u0061":1,"a":2}"#, &mut Vec::new()).is_err());
    }
}
