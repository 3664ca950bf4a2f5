//! The canonical writer as it stood before canonical form was hashed as it
//! is written (commit 4e7ec94), kept verbatim as the reference that
//! `canonical_differential` compares the writer in use against: the same
//! bytes, or the same error, for every text.

use crate::plumbing::error::InvalidInput;
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt::Write as _;
use std::ops::Range;

/// Nesting deeper than this is refused, so no input can exhaust the stack.
const MAX_DEPTH: usize = 128;

fn malformed(reason: impl Into<String>) -> InvalidInput {
    InvalidInput::Malformed {
        field: "json",
        reason: reason.into(),
    }
}

/// The canonical form of the JSON text `json`: `json` itself where it is
/// already canonical.
pub(super) fn canonical(json: &str) -> Result<Cow<'_, [u8]>, InvalidInput> {
    let text = json.as_bytes();
    let mut parser = Parser {
        json,
        text,
        at: 0,
        run: 0,
        depth: 0,
        written: Vec::new(),
        open: Vec::new(),
        sorted: Vec::new(),
        objects: Vec::new(),
    };
    parser.skip_whitespace();
    parser.value()?;
    let end = parser.at;
    let trailing = text[end..]
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    if end + trailing != text.len() {
        return Err(malformed(format!(
            "trailing characters at byte {}",
            end + trailing
        )));
    }
    let Parser {
        run,
        mut written,
        sorted,
        objects,
        ..
    } = parser;
    // The text in the input's member order: what was written, and the run
    // still pending.
    let in_order: Cow<'_, [u8]> = if written.is_empty() {
        Cow::Borrowed(&text[run..end])
    } else {
        written.extend_from_slice(&text[run..end]);
        Cow::Owned(written)
    };
    if sorted.is_empty() {
        return Ok(in_order);
    }
    let mut out = Vec::with_capacity(in_order.len());
    let reordered = Reordered {
        text: &in_order,
        objects: &objects,
        sorted: &sorted,
    };
    reordered.emit(0, in_order.len(), 0, &mut out);
    Ok(Cow::Owned(out))
}

struct Parser<'a> {
    json: &'a str,
    text: &'a [u8],
    at: usize,
    /// Where the run of canonical text not yet copied to `written` starts:
    /// the canonical form so far is `written` then `text[run..at]`.
    run: usize,
    depth: usize,
    /// The canonical form of what was read, objects' members in the text's
    /// order, up to `run`.
    written: Vec<u8>,
    /// The members of the objects being read, innermost last.
    open: Vec<Member<'a>>,
    /// The members of every reordered object, in order, one run per object.
    sorted: Vec<Span>,
    /// Every non-empty object, in the order they open.
    objects: Vec<Object>,
}

/// Where a piece of the canonical form sits (counted in the canonical form
/// with members in the text's order), and the first object that may open
/// inside it.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    first_object: usize,
}

/// A non-empty object: where it sits, the index just past its nested
/// objects, and its members in order if the text had them out of order.
struct Object {
    start: usize,
    end: usize,
    next: usize,
    sorted: Option<Range<usize>>,
}

/// A member of an object being read: its decoded name (borrowed from the
/// input when it has no escapes), the name's first 8 bytes as a number
/// (most comparisons of ASCII names end there), and where its
/// `"name":value` sits.
struct Member<'a> {
    name: Cow<'a, str>,
    prefix: u64,
    ascii: bool,
    span: Span,
}

impl Member<'_> {
    /// RFC 8785 member order: UTF-16 code units, which for ASCII names is
    /// plain byte order.
    #[inline]
    fn order(&self, other: &Self) -> Ordering {
        if self.ascii && other.ascii {
            self.prefix
                .cmp(&other.prefix)
                .then_with(|| self.name.as_bytes().cmp(other.name.as_bytes()))
        } else {
            self.name.encode_utf16().cmp(other.name.encode_utf16())
        }
    }

    fn same_name(&self, other: &Self) -> bool {
        self.prefix == other.prefix && self.name == other.name
    }
}

/// The first 8 bytes of `name`, zero-padded, as a big-endian number: for
/// ASCII names its order is the names' order wherever the two differ.
fn prefix(name: &str) -> u64 {
    // In registers: bytes stored one by one and read back as one word
    // would stall the load.
    match name.as_bytes().first_chunk::<8>() {
        Some(first) => u64::from_be_bytes(*first),
        None => name
            .bytes()
            .zip((0..8).rev())
            .fold(0, |prefix, (byte, place)| {
                prefix | u64::from(byte) << (8 * place)
            }),
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `chunk` (little-endian) that ends a
/// string's verbatim stretch: a quote, a backslash, a control character.
/// The lowest set bit marks the first such byte exactly.
#[inline]
fn specials(chunk: u64) -> u64 {
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x;
    let quote = chunk ^ (ONES * u64::from(b'"'));
    let backslash = chunk ^ (ONES * u64::from(b'\\'));
    let control = chunk.wrapping_sub(ONES * 0x20) & !chunk;
    (zero_byte(quote) | zero_byte(backslash) | control) & HIGHS
}

impl<'a> Parser<'a> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// Where the next canonical byte goes, counted in the canonical form
    /// with members in the text's order.
    #[inline]
    fn position(&self) -> usize {
        self.written.len() + (self.at - self.run)
    }

    /// Copies the pending run to `written`: before whitespace, or before a
    /// token written otherwise than it stands.
    #[inline]
    fn flush(&mut self) {
        self.written
            .extend_from_slice(&self.text[self.run..self.at]);
        self.run = self.at;
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        if let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.flush();
            self.at += 1;
            while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
                self.at += 1;
            }
            self.run = self.at;
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

    fn value(&mut self) -> Result<(), InvalidInput> {
        match self.peek() {
            Some(b'{') => {
                self.enter()?;
                self.object()?;
                self.depth -= 1;
                Ok(())
            }
            Some(b'[') => {
                self.enter()?;
                self.array()?;
                self.depth -= 1;
                Ok(())
            }
            Some(b'"') => self.string().map(|_| ()),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(other) => Err(malformed(format!(
                "unexpected '{}' at byte {}",
                other.escape_ascii(),
                self.at
            ))),
            None => Err(malformed("unexpected end of input")),
        }
    }

    fn enter(&mut self) -> Result<(), InvalidInput> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(malformed(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), InvalidInput> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(malformed(format!("invalid literal at byte {}", self.at)))
        }
    }

    fn array(&mut self) -> Result<(), InvalidInput> {
        self.expect(b'[')?;
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.skip_whitespace();
            self.value()?;
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
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

    fn object(&mut self) -> Result<(), InvalidInput> {
        let start = self.position();
        self.expect(b'{')?;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        if self.objects.capacity() == 0 {
            // Room for what an order of a few lines per KiB needs, so most
            // texts never grow these.
            let room = (self.text.len() / 64 + 4).min(1024);
            self.objects.reserve(room);
            self.open.reserve(room.min(64));
            self.sorted.reserve(room * 4);
        }
        let index = self.objects.len();
        self.objects.push(Object {
            start,
            end: start,
            next: index + 1,
            sorted: None,
        });
        let base = self.open.len();
        let mut in_order = true;
        loop {
            self.skip_whitespace();
            if self.peek() != Some(b'"') {
                return Err(malformed(format!(
                    "expected a member name at byte {}",
                    self.at
                )));
            }
            let member_start = self.position();
            let quoted = self.at;
            let (decoded, ascii) = self.string()?;
            let name = match decoded {
                // Between two ASCII quotes of a &str: a str, checked in O(1).
                None => Cow::Borrowed(self.json.get(quoted + 1..self.at - 1).unwrap_or_default()),
                Some(decoded) => Cow::Owned(decoded),
            };
            self.skip_whitespace();
            self.expect(b':')?;
            self.skip_whitespace();
            let first_object = self.objects.len();
            self.value()?;
            let member = Member {
                prefix: prefix(&name),
                name,
                ascii,
                span: Span {
                    start: member_start,
                    end: self.position(),
                    first_object,
                },
            };
            if in_order
                && let Some(previous) = self.open[base..].last()
                && previous.order(&member) != Ordering::Less
            {
                in_order = false;
            }
            self.open.push(member);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    break;
                }
                _ => {
                    return Err(malformed(format!(
                        "expected ',' or '}}' at byte {}",
                        self.at
                    )));
                }
            }
        }
        let sorted = if in_order {
            // Strictly increasing names: no two alike.
            None
        } else {
            let members = &mut self.open[base..];
            members.sort_unstable_by(Member::order);
            if members.windows(2).any(|pair| pair[0].same_name(&pair[1])) {
                return Err(malformed("an object has two members of the same name"));
            }
            let from = self.sorted.len();
            self.sorted.extend(members.iter().map(|member| member.span));
            Some(from..self.sorted.len())
        };
        self.open.truncate(base);
        let (end, next) = (self.position(), self.objects.len());
        if let Some(object) = self.objects.get_mut(index) {
            *object = Object {
                start,
                end,
                next,
                sorted,
            };
        }
        Ok(())
    }

    /// Reads a string, written as its canonical form. Returns its decoded
    /// text if it had escapes (`None`: it stands as it is canonical), and
    /// whether it is all ASCII.
    fn string(&mut self) -> Result<(Option<String>, bool), InvalidInput> {
        let start = self.at;
        self.expect(b'"')?;
        // Fast path: no escapes means the input is already canonical.
        // Eight bytes at a time while there are eight.
        let text = self.text;
        let mut at = self.at;
        let mut seen = 0u64;
        while let Some(chunk) = text.get(at..at + 8) {
            let Ok(bytes) = <[u8; 8]>::try_from(chunk) else {
                break;
            };
            let chunk = u64::from_le_bytes(bytes);
            let special = specials(chunk);
            if special == 0 {
                seen |= chunk;
                at += 8;
                continue;
            }
            let before = special.trailing_zeros() as usize / 8;
            seen |= chunk & ((1u64 << (8 * before)) - 1);
            at += before;
            break;
        }
        while let Some(&byte) = text.get(at) {
            if matches!(byte, b'"' | b'\\' | 0x00..=0x1f) {
                break;
            }
            seen |= u64::from(byte);
            at += 1;
        }
        match text.get(at) {
            Some(b'"') => {
                self.at = at + 1;
                return Ok((None, seen & HIGHS == 0));
            }
            Some(0x00..=0x1f) => {
                return Err(malformed(format!(
                    "control character in a string at byte {at}"
                )));
            }
            _ => {}
        }
        // Slow path: decode with serde_json, then escape as RFC 8785 says.
        let end = self.string_end(self.at)?;
        let literal = &self.text[start..end];
        let text = std::str::from_utf8(literal).map_err(|e| malformed(e.to_string()))?;
        let decoded: String = serde_json::from_str(text).map_err(|e| malformed(e.to_string()))?;
        self.at = start;
        self.flush();
        write_string(&decoded, &mut self.written);
        self.at = end;
        self.run = end;
        let ascii = decoded.is_ascii();
        Ok((Some(decoded), ascii))
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

    fn number(&mut self) -> Result<(), InvalidInput> {
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
        let end = self.at;
        let literal = &self.text[start..end];
        // An integer of up to 21 digits, or a plain decimal, is already
        // written as its canonical form would write it (but -0 as 0).
        if (integer && int_digits <= 21 && literal != b"-0")
            || (!integer && is_canonical_decimal(&self.text[int_start..end]))
        {
            return Ok(());
        }
        self.at = start;
        self.flush();
        self.at = end;
        self.run = end;
        if integer && int_digits <= 21 {
            self.written.push(b'0'); // -0
            Ok(())
        } else {
            write_exact(literal, &mut self.written)
        }
    }
}

/// The canonical form with members in the text's order, and what reorders it.
struct Reordered<'t> {
    text: &'t [u8],
    objects: &'t [Object],
    sorted: &'t [Span],
}

impl Reordered<'_> {
    /// Appends to `out` the canonical form of `text[pos..end]`, whose
    /// objects are `objects[object..]` from the first that opens there on:
    /// each reordered object's members in order.
    fn emit(&self, mut pos: usize, end: usize, mut object: usize, out: &mut Vec<u8>) {
        while let Some(next) = self.objects.get(object).filter(|o| o.start < end) {
            out.extend_from_slice(&self.text[pos..next.start]);
            match &next.sorted {
                None => self.emit(next.start, next.end, object + 1, out),
                Some(members) => {
                    out.push(b'{');
                    for (i, member) in self.sorted[members.clone()].iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        let nested = self.objects.get(member.first_object);
                        if nested.is_some_and(|o| o.start < member.end) {
                            self.emit(member.start, member.end, member.first_object, out);
                        } else {
                            out.extend_from_slice(&self.text[member.start..member.end]);
                        }
                    }
                    out.push(b'}');
                }
            }
            pos = next.end;
            object = next.next;
        }
        out.extend_from_slice(&self.text[pos..end]);
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
fn write_string(s: &str, out: &mut Vec<u8>) {
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
