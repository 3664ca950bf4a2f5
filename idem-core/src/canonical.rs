//! The canonical form of JSON, written in one pass over the input bytes.
//!
//! It is RFC 8785 (JSON Canonicalization Scheme) with one departure: a
//! number's canonical form is its exact decimal value, never the nearest
//! IEEE 754 double. RFC 8785 reads numbers as doubles (as JavaScript does),
//! so `9007199254740993` and `9007199254740992`, or two decimals differing
//! past the 17th digit, would share one form, while a Rust handler reading
//! `u64` or a decimal type sees two different requests. Here they differ;
//! `59.9`, `59.90` and `5.99e1` are still one value. The digits are laid
//! out as ECMAScript's `Number.prototype.toString` lays out the digits of a
//! double (plain up to 21 integer digits, `0.000001` down to 1e-6, an
//! exponent beyond), so wherever the double is exact, and wherever the
//! text is the shortest form of its double, the result is RFC 8785's to the
//! byte.
//!
//! Fingerprinting is on every request's path, so the canonical form is
//! written straight from the text: strings without escapes, integers and
//! plain decimals are copied as they stand (they are already canonical),
//! and only the members of each object are buffered, to be sorted.
//! Everything else (escapes, exponents, trailing zeros) takes the slow path:
//! decode, then write as above.

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
        // An integer of up to 21 digits, or a plain decimal, is already
        // written as its canonical form would write it (but -0 as 0).
        if integer && int_digits <= 21 {
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
        write_exact(literal, out)
    }
}

/// Whether an unsigned number literal is already its canonical form:
/// `int.frac` with no exponent and no trailing zero, at most 21 integer
/// digits, and at least 1e-6 (below that the canonical form is an
/// exponent).
fn is_canonical_decimal(literal: &[u8]) -> bool {
    let Some(dot) = literal.iter().position(|&b| b == b'.') else {
        return false;
    };
    let (int, frac) = (&literal[..dot], &literal[dot + 1..]);
    if frac.is_empty() || !frac.iter().all(u8::is_ascii_digit) || frac.last() == Some(&b'0') {
        return false;
    }
    if int == b"0" {
        frac.iter().take_while(|&&b| b == b'0').count() <= 5
    } else {
        int.len() <= 21
    }
}

/// Exponents with more digits than this are refused (a non-zero number
/// that large or small is no one's order).
const MAX_EXPONENT_DIGITS: usize = 15;

/// Writes the canonical form of a valid JSON number literal: its exact
/// decimal value, in the layout ECMAScript's `Number.prototype.toString`
/// gives a number with those significant digits.
fn write_exact(literal: &[u8], out: &mut Vec<u8>) -> Result<(), InvalidInput> {
    let (negative, unsigned) = match literal.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, literal),
    };
    let mantissa_end = unsigned
        .iter()
        .position(|&b| b == b'e' || b == b'E')
        .unwrap_or(unsigned.len());
    let (mantissa, exponent) = unsigned.split_at(mantissa_end);
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(dot) => (&mantissa[..dot], &mantissa[dot + 1..]),
        None => (mantissa, &mantissa[mantissa.len()..]),
    };
    let all = || int.iter().chain(frac).copied();
    let total = int.len() + frac.len();
    let leading = all().take_while(|&b| b == b'0').count();
    if leading == total {
        out.push(b'0'); // zero, whatever its sign and exponent
        return Ok(());
    }
    let trailing = all().rev().take_while(|&b| b == b'0').count();
    let digits: Vec<u8> = all()
        .skip(leading)
        .take(total - leading - trailing)
        .collect();
    let exponent = parse_exponent(exponent)?;
    // value = 0.d1d2..dk x 10^point
    let k = digits.len() as i64;
    let point = exponent - frac.len() as i64 + trailing as i64 + k;
    if negative {
        out.push(b'-');
    }
    if k <= point && point <= 21 {
        out.extend_from_slice(&digits);
        out.resize(out.len() + (point - k) as usize, b'0');
    } else if 0 < point && point <= 21 {
        let (whole, rest) = digits.split_at(point as usize);
        out.extend_from_slice(whole);
        out.push(b'.');
        out.extend_from_slice(rest);
    } else if -6 < point && point <= 0 {
        out.extend_from_slice(b"0.");
        out.resize(out.len() + point.unsigned_abs() as usize, b'0');
        out.extend_from_slice(&digits);
    } else {
        if let Some((first, rest)) = digits.split_first() {
            out.push(*first);
            if !rest.is_empty() {
                out.push(b'.');
                out.extend_from_slice(rest);
            }
        }
        let shown = point - 1;
        out.extend_from_slice(if shown < 0 { b"e-" } else { b"e+" });
        out.extend_from_slice(shown.unsigned_abs().to_string().as_bytes());
    }
    Ok(())
}

/// The exponent part (`e`, a sign, digits) of a valid number, or 0.
fn parse_exponent(part: &[u8]) -> Result<i64, InvalidInput> {
    let Some((_, rest)) = part.split_first() else {
        return Ok(0);
    };
    let (negative, digits) = match rest.split_first() {
        Some((b'-', digits)) => (true, digits),
        Some((b'+', digits)) => (false, digits),
        _ => (false, rest),
    };
    let significant = &digits[digits.iter().take_while(|&&b| b == b'0').count()..];
    if significant.len() > MAX_EXPONENT_DIGITS {
        return Err(malformed(format!(
            "an exponent of more than {MAX_EXPONENT_DIGITS} digits"
        )));
    }
    let magnitude = significant
        .iter()
        .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
    Ok(if negative { -magnitude } else { magnitude })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(json: &str) -> String {
        let mut out = Vec::new();
        canonicalize(json, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn numbers_are_written_by_their_exact_decimal_value() {
        for (input, want) in [
            ("12.34", "12.34"),
            ("-0.5", "-0.5"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("1.50", "1.5"),
            ("0.0", "0"),
            ("-0", "0"),
            ("-0.0e7", "0"),
            ("0e999999999999999999999", "0"),
            ("1e2", "100"),
            ("59.90", "59.9"),
            ("5.99e1", "59.9"),
            ("599e-1", "59.9"),
            ("123456789012.345", "123456789012.345"),
            ("9007199254740993", "9007199254740993"),
            ("12345678901234567890", "12345678901234567890"),
            ("1.0000000000000001", "1.0000000000000001"),
            (
                "0.1234567890123456789012345678901",
                "0.1234567890123456789012345678901",
            ),
            ("123456789012345678901", "123456789012345678901"),
            ("1234567890123456789012", "1.234567890123456789012e+21"),
            ("1000000000000000000000", "1e+21"),
            ("100000000000000000000", "100000000000000000000"),
            ("1e400", "1e+400"),
            ("-2.5E-400", "-2.5e-400"),
            ("0.00000123", "0.00000123"),
            ("0.000000123", "1.23e-7"),
            ("1E+30", "1e+30"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
        ] {
            assert_eq!(canonical(input), want, "{input}");
        }
    }

    #[test]
    fn distinct_values_keep_distinct_forms_past_a_doubles_precision() {
        for (a, b) in [
            ("9007199254740993", "9007199254740992"),
            ("12345678901234567890", "12345678901234567891"),
            (
                "0.100000000000000000000000000001",
                "0.100000000000000000000000000002",
            ),
            ("1e400", "1e401"),
        ] {
            assert_ne!(canonical(a), canonical(b), "{a} and {b}");
        }
    }

    #[test]
    fn an_exponent_beyond_fifteen_digits_is_refused_unless_the_number_is_zero() {
        assert!(canonicalize("1e1234567890123456", &mut Vec::new()).is_err());
        assert!(canonicalize("1e-1234567890123456", &mut Vec::new()).is_err());
        assert_eq!(canonical("1e000000000000000000001"), "10");
    }

    #[test]
    fn escaped_names_sort_by_what_they_decode_to() {
        assert_eq!(canonical(r#"{"\u0062":1,"a":2}"#), r#"{"a":2,"b":1}"#);
        assert!(canonicalize(r#"{"\u0061":1,"a":2}"#, &mut Vec::new()).is_err());
    }
}
