//! The writer in use against the reference writer (`reference.rs`) on
//! generated texts: valid ones with every kind of token, whitespace,
//! member order and nesting the writer treats apart, and the same texts cut
//! or spliced into invalid ones.

use super::reference;
use crate::Fingerprint;

/// A deterministic source of choices (SplitMix64).
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// Names that sort apart only past their first 8 bytes, only by UTF-16
/// (U+FB33 after U+1F600 in UTF-16, before it in UTF-8), only once
/// decoded (escapes spelling another member's name), or not at all.
const NAMES: &[&str] = &[
    "a",
    "b",
    "ab",
    "",
    "sku",
    "qty",
    "price",
    "note",
    "aaaaaaaa",
    "aaaaaaaab",
    "aaaaaaaac",
    "aaaaaaa",
    "é",
    "€",
    "😀",
    "\u{fb33}",
    "\u{e000}",
    "\u{ffff}",
    "a😀",
    "a\u{fb33}",
    "\\u0061",
    "\\u0062b",
    "\\ud83d\\ude00",
    "\\ufb33",
    "a\\u0000",
    "a\\n",
    "\\\"",
    "\\\\",
    "\\/",
    "customer",
    "currency",
    "lines",
];

const WHITESPACE: &[&str] = &[" ", "\n", "\t", "\r\n  ", "  "];

/// String bodies: verbatim, escaped, longer than a word, and invalid.
const BODIES: &[&str] = &[
    "",
    "x",
    "gift wrap ü",
    "SKU-00001",
    "a long string with more than eight bytes",
    "😀€é",
    "\\n\\t\\r\\b\\f",
    "\\u00e9\\u20ac",
    "\\ud83d\\ude00",
    "\\u001f\\u007f",
    "\\\"quoted\\\"",
    "back\\\\slash",
    "sl\\/ash",
    "\u{7f}\u{80}\u{ffff}",
    "12345678\\n",
    "1234567\\u0041",
];

const BAD_BODIES: &[&str] = &["\\ud800", "\\x", "\\u12", "tab\tin", "nl\nin", "\\"];

fn whitespace(c: &mut Choices, out: &mut String) {
    if c.one_in(6) {
        out.push_str(c.pick(WHITESPACE));
    }
}

fn digits(c: &mut Choices, out: &mut String, n: usize) {
    for _ in 0..n {
        out.push(char::from(b'0' + c.below(10) as u8));
    }
}

fn number(c: &mut Choices, out: &mut String) {
    if c.one_in(2) {
        // The payloads' kind: a few digits, maybe two decimals.
        out.push_str(&c.below(1000).to_string());
        if c.one_in(2) {
            out.push('.');
            let n = 1 + c.below(3);
            digits(c, out, n);
        }
        return;
    }
    if c.one_in(3) {
        out.push('-');
    }
    match c.below(4) {
        0 => out.push('0'),
        1 => {
            out.push(char::from(b'1' + c.below(9) as u8));
            let n = c.below(25);
            digits(c, out, n);
        }
        _ => {
            out.push(char::from(b'1' + c.below(9) as u8));
            let n = c.below(4);
            digits(c, out, n);
        }
    }
    if c.one_in(2) {
        out.push('.');
        for _ in 0..c.below(8) {
            out.push('0');
        }

        let n = 1 + c.below(6);
        digits(c, out, n);
        for _ in 0..c.below(3) {
            out.push('0');
        }
    }
    if c.one_in(3) {
        out.push(if c.one_in(2) { 'e' } else { 'E' });
        match c.below(3) {
            0 => out.push('+'),
            1 => out.push('-'),
            _ => {}
        }
        let n = if c.one_in(20) {
            15 + c.below(4)
        } else {
            1 + c.below(3)
        };
        digits(c, out, n);
    }
}

fn string(c: &mut Choices, out: &mut String, bad: bool) {
    out.push('"');
    for _ in 0..1 + c.below(2) {
        let bodies = if bad && c.one_in(2) {
            BAD_BODIES
        } else {
            BODIES
        };
        out.push_str(c.pick(bodies));
    }
    out.push('"');
}

/// Appends a value; `budget` bounds the members and items still to write.
fn value(c: &mut Choices, out: &mut String, depth: usize, budget: &mut usize) {
    whitespace(c, out);
    let kind = if depth > 7 || *budget == 0 {
        c.below(5)
    } else {
        c.below(9)
    };
    match kind {
        0 => out.push_str(c.pick(&["null", "true", "false"])),
        1 | 2 => number(c, out),
        3 | 4 => {
            let bad = c.one_in(200);
            string(c, out, bad);
        }
        5 | 6 => {
            out.push('{');
            let n = members(c);
            let mut names: Vec<&str> = Vec::new();
            for i in 0..n {
                if *budget == 0 {
                    break;
                }
                *budget -= 1;
                if i > 0 {
                    out.push(',');
                }
                whitespace(c, out);
                out.push('"');
                let name = loop {
                    let name = if c.one_in(4) {
                        c.pick(NAMES)
                    } else {
                        ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"][c.below(10)]
                    };
                    // Mostly distinct names: a duplicate is refused, so it
                    // would end the comparison early.
                    if !names.contains(&name) || c.one_in(50) {
                        break name;
                    }
                };
                names.push(name);
                out.push_str(name);
                if n > 10 {
                    out.push_str(&i.to_string());
                }
                out.push('"');
                whitespace(c, out);
                out.push(':');
                value(c, out, depth + 1, budget);
            }
            whitespace(c, out);
            out.push('}');
        }
        _ => {
            out.push('[');
            let n = members(c);
            for i in 0..n {
                if *budget == 0 {
                    break;
                }
                *budget -= 1;
                if i > 0 {
                    out.push(',');
                }
                value(c, out, depth + 1, budget);
            }
            whitespace(c, out);
            out.push(']');
        }
    }
    whitespace(c, out);
}

fn members(c: &mut Choices) -> usize {
    match c.below(20) {
        0 => 0,
        1 => 12 + c.below(60),
        _ => 1 + c.below(5),
    }
}

/// An array of records that mostly share their names and the names'
/// order (as an order's lines do), some another order, some another name
/// or a name twice.
fn records(c: &mut Choices, out: &mut String) {
    // Names of one length, escaped or not, in the same place of two
    // records: the second must not be read as the first was.
    const FIELDS: &[&str] = &[
        "sku",
        "qty",
        "price",
        "note",
        "aaaaaaaab",
        "aaaaaaaac",
        "é",
        "\\u0071ty",
        "a\\n",
        "ab",
        "\\\"",
        "\\\\",
        "qtyx",
    ];
    let mut fields: Vec<&str> = (0..1 + c.below(5)).map(|_| c.pick(FIELDS)).collect();
    fields.dedup();
    out.push('[');
    for i in 0..1 + c.below(6) {
        if i > 0 {
            out.push(',');
        }
        if c.one_in(4) {
            let at = c.below(fields.len());
            fields.swap(0, at);
        }
        if c.one_in(8) {
            let at = c.below(fields.len());
            fields[at] = c.pick(FIELDS);
        }
        out.push('{');
        for (j, field) in fields.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(field);
            out.push_str("\":");
            number(c, out);
        }
        out.push('}');
    }
    out.push(']');
}

/// A text: mostly one generated value, sometimes deep nesting, sometimes
/// a valid text cut short or with a character dropped or added.
fn text(c: &mut Choices) -> String {
    let mut out = String::new();
    if c.one_in(100) {
        // Around the depth limit, objects out of order at every level.
        let depth = 120 + c.below(15);
        for _ in 0..depth {
            out.push_str(if c.one_in(2) { "{\"b\":" } else { "[" });
        }
        out.push('0');
        for _ in 0..depth {
            out.push_str(if out.ends_with('0') || c.one_in(2) {
                "]"
            } else {
                ",\"a\":1}"
            });
        }
        return out;
    }
    if c.one_in(10) {
        records(c, &mut out);
        return out;
    }
    let mut budget = if c.one_in(25) { 300 } else { 16 };
    value(c, &mut out, 0, &mut budget);
    if c.one_in(8) {
        let chars: Vec<char> = out.chars().collect();
        let at = c.below(chars.len() + 1);
        let mut mutated: String = chars[..at].iter().collect();
        match c.below(3) {
            0 => {}
            1 => mutated.extend(chars.iter().skip(at + 1)),
            _ => {
                mutated.push_str(c.pick(&[",", "}", "]", "\"", "\\", ":", "0", "e", ".", "\u{1}"]));
                mutated.extend(chars.iter().skip(at));
            }
        }
        return mutated;
    }
    out
}

#[test]
fn canonical_form_and_errors_match_the_reference_writer_on_generated_texts() {
    let mut c = Choices(0x1de3_f1a9_0000_8785);
    let (mut valid, mut reordered) = (0, 0);
    for case in 0..200_000 {
        let text = text(&mut c);
        let expected = reference::canonical(&text).map(|form| form.into_owned());
        let got = super::canonical(&text).map(|form| form.into_owned());
        assert_eq!(got, expected, "case {case}: {text}");
        assert_eq!(
            Fingerprint::json(&text),
            expected
                .as_ref()
                .map(Fingerprint::of_bytes)
                .map_err(Clone::clone),
            "case {case}: {text}"
        );
        assert_eq!(
            Fingerprint::parts()
                .json_body(&text)
                .map(|parts| parts.finish()),
            expected
                .as_ref()
                .map(|form| Fingerprint::parts().part("json-body", form).finish())
                .map_err(Clone::clone),
            "case {case}: {text}"
        );
        if let Ok(form) = &expected {
            valid += 1;
            reordered += usize::from(form.as_slice() != text.as_bytes());
        }
    }
    // The generator reaches both kinds of text.
    assert!(
        valid > 100_000 && reordered > 50_000,
        "{valid} valid, {reordered} rewritten"
    );
}
