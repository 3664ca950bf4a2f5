//! Two JSON texts share a fingerprint exactly when they are the same JSON
//! value, numbers compared by exact decimal value. The reference is an
//! exact-decimal reading of both texts, independent of idem's canonical
//! form: serde_json with `arbitrary_precision` keeps every number's text,
//! and `bigdecimal` compares those texts as decimals.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::str::FromStr;

use bigdecimal::BigDecimal;
use idem_core::Fingerprint;
use proptest::prelude::*;
use serde_json::Value;

/// A non-zero decimal `0.digits x 10^point`, or zero.
#[derive(Debug, Clone)]
struct Decimal {
    negative: bool,
    /// Significant digits, no leading or trailing zero; empty for zero.
    digits: String,
    point: i64,
}

/// A JSON value whose numbers can be spelled in many ways.
#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    Number(Decimal),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

fn decimal() -> impl Strategy<Value = Decimal> {
    let significant = prop_oneof![
        // Short ones, as most payloads have.
        "[1-9]([0-9]{0,5}[1-9])?",
        // Past a double's 17 digits: integers beyond 2^53, long decimals.
        "[1-9][0-9]{15,35}[1-9]",
    ];
    let point = prop_oneof![-8i64..24, -400i64..400];
    prop_oneof![
        1 => any::<bool>().prop_map(|negative| Decimal { negative, digits: String::new(), point: 0 }),
        12 => (any::<bool>(), significant, point).prop_map(|(negative, digits, point)| Decimal {
            negative,
            digits,
            point,
        }),
    ]
}

fn json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        decimal().prop_map(Json::Number),
        decimal().prop_map(Json::Number),
        "[a-z0-9 é€😀]{0,6}".prop_map(Json::String),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
            prop::collection::btree_map("[a-c€]{0,2}", inner, 0..5)
                .prop_map(|members| Json::Object(members.into_iter().collect())),
        ]
    })
}

/// A small deterministic source of choices for spelling.
struct Choices(u64);

impl Choices {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

/// Writes a decimal as one of its many JSON spellings: the exponent, the
/// place of the point, trailing zeros and the exponent's form all vary.
fn spell(number: &Decimal, choices: &mut Choices, out: &mut String) {
    if number.digits.is_empty() {
        let zeros = ["0", "-0", "0.0", "0e5", "-0.000E-3"];
        out.push_str(zeros[choices.next(zeros.len() as u64) as usize]);
        return;
    }
    if number.negative {
        out.push('-');
    }
    let k = number.digits.len() as i64;
    // value = digits x 10^(point - k) = mantissa x 10^exponent
    let exponent = match choices.next(3) {
        0 => 0,
        1 => number.point - k,
        _ => number.point - k + choices.next(9) as i64 - 4,
    };
    let shift = number.point - k - exponent;
    let (int, frac) = if shift >= 0 {
        (
            format!("{}{}", number.digits, "0".repeat(shift as usize)),
            String::new(),
        )
    } else {
        let at = k + shift;
        if at > 0 {
            let (int, frac) = number.digits.split_at(at as usize);
            (int.to_string(), frac.to_string())
        } else {
            (
                "0".to_string(),
                format!(
                    "{}{}",
                    "0".repeat(at.unsigned_abs() as usize),
                    number.digits
                ),
            )
        }
    };
    out.push_str(&int);
    let padding = "0".repeat(choices.next(3) as usize);
    if !frac.is_empty() || !padding.is_empty() {
        out.push('.');
        out.push_str(&frac);
        out.push_str(&padding);
    }
    if exponent != 0 || choices.next(4) == 0 {
        out.push(if choices.next(2) == 0 { 'e' } else { 'E' });
        let sign = match (exponent < 0, choices.next(2)) {
            (true, _) => "-",
            (false, 0) => "+",
            (false, _) => "",
        };
        out.push_str(sign);
        out.push_str(&"0".repeat(choices.next(2) as usize));
        out.push_str(&exponent.unsigned_abs().to_string());
    }
}

/// Writes `value` as JSON text, members in a shuffled order.
fn write(value: &Json, choices: &mut Choices, out: &mut String) {
    let space = [" ", "", "\n\t"];
    out.push_str(space[choices.next(3) as usize]);
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(number) => spell(number, choices, out),
        Json::String(s) => out.push_str(&serde_json::to_string(s).unwrap()),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, choices, out);
            }
            out.push(']');
        }
        Json::Object(members) => {
            let mut order: Vec<_> = members.iter().collect();
            for i in (1..order.len()).rev() {
                order.swap(i, choices.next(i as u64 + 1) as usize);
            }
            out.push('{');
            for (i, (name, item)) in order.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(name).unwrap());
                out.push(':');
                write(item, choices, out);
            }
            out.push('}');
        }
    }
}

/// Changes one number of `value` slightly, if it has one: its last digit
/// or its point (the result may, rarely, be the same value: the reference
/// decides).
fn nudge(value: &mut Json, pick: &mut usize) -> bool {
    match value {
        Json::Array(items) => items.iter_mut().any(|v| nudge(v, pick)),
        Json::Object(members) => members.iter_mut().any(|(_, v)| nudge(v, pick)),
        Json::Number(number) if *pick == 0 => {
            if number.digits.is_empty() {
                number.digits = "1".to_string();
            } else if number.point % 2 == 0 {
                number.point += 1;
            } else {
                let last = number.digits.pop().unwrap();
                let bumped = (last as u8 - b'0') % 9 + 1;
                number.digits.push((b'0' + bumped) as char);
            }
            true
        }
        Json::Number(_) => {
            *pick -= 1;
            false
        }
        _ => false,
    }
}

/// The same JSON value, numbers compared by exact decimal value.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            BigDecimal::from_str(&x.to_string()).unwrap()
                == BigDecimal::from_str(&y.to_string()).unwrap()
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(name, item)| y.get(name).is_some_and(|other| same_value(item, other)))
        }
        (x, y) => x == y,
    }
}

fn exact_reading(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn two_texts_share_a_fingerprint_exactly_when_they_are_the_same_value(
        value in json(),
        seeds in (any::<u64>(), any::<u64>()),
        change in any::<bool>(),
        pick in 0usize..16,
    ) {
        let mut other = value.clone();
        if change {
            nudge(&mut other, &mut pick.clone());
        }
        let (mut a, mut b) = (String::new(), String::new());
        write(&value, &mut Choices(seeds.0), &mut a);
        write(&other, &mut Choices(seeds.1), &mut b);
        let same = same_value(&exact_reading(&a), &exact_reading(&b));
        let shared = Fingerprint::json(&a).unwrap() == Fingerprint::json(&b).unwrap();
        prop_assert_eq!(shared, same, "{} and {}", a, b);
    }

    #[test]
    fn every_spelling_of_a_number_has_one_fingerprint_and_a_nudge_another(
        number in decimal(),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let (mut a, mut b) = (String::new(), String::new());
        spell(&number, &mut Choices(seeds.0), &mut a);
        spell(&number, &mut Choices(seeds.1), &mut b);
        prop_assert_eq!(Fingerprint::json(&a).unwrap(), Fingerprint::json(&b).unwrap(), "{} and {}", a, b);
        let mut nudged = Json::Number(number);
        nudge(&mut nudged, &mut 0);
        let mut c = String::new();
        write(&nudged, &mut Choices(seeds.1), &mut c);
        prop_assert_eq!(
            Fingerprint::json(&a).unwrap() == Fingerprint::json(&c).unwrap(),
            same_value(&exact_reading(&a), &exact_reading(&c)),
            "{} and {}", a, c
        );
    }
}

#[test]
fn the_issue_pairs_are_told_apart_and_equal_decimals_are_not() {
    let fp = |json: &str| Fingerprint::json(json).unwrap();
    assert_ne!(
        fp(r#"{"amount":9007199254740993}"#),
        fp(r#"{"amount":9007199254740992}"#)
    );
    assert_ne!(
        fp(r#"{"id":12345678901234567890}"#),
        fp(r#"{"id":12345678901234567891}"#)
    );
    assert_ne!(
        fp("0.100000000000000000000000000001"),
        fp("0.100000000000000000000000000002")
    );
    assert_eq!(fp("59.9"), fp("59.90"));
    assert_eq!(fp("59.9"), fp("5.99e1"));
}
