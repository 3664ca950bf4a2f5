//! A corrupt Redis reply or DynamoDB item is `StoreError::Corrupt`, never a
//! panic: arbitrary replies and items, well-formed records with one field
//! taken away or replaced by a value of the wrong shape, thrown at the
//! stores' own decoders (their `fuzzing` feature). Well-formed records decode
//! to exactly the record written.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use idem_core::store::{ClaimRequest, OwnerToken, Record, Timestamp, encode_headers};
use idem_core::{Checkpoint, Fingerprint, Operation, Scope, StoreError, StoredResponse};
use proptest::prelude::*;

/// A record as a store writes it: in flight (with or without a checkpoint)
/// or completed.
#[derive(Debug, Clone)]
struct Written {
    fingerprint: Fingerprint,
    owner: OwnerToken,
    attempt: u32,
    lease_ms: i64,
    retained_ms: i64,
    checkpoint: Option<(String, u64)>,
    response: Option<StoredResponse>,
}

impl Written {
    fn checkpoint(&self) -> Option<Checkpoint> {
        let (name, data) = self.checkpoint.as_ref()?;
        Some(Checkpoint::new(name.clone(), data).unwrap())
    }

    fn checkpoint_json(&self) -> Option<String> {
        self.checkpoint()
            .map(|c| idem_core::store::checkpoint_json(&c))
    }

    /// The record the decoders must read back.
    fn record(&self, scope: &Scope) -> Record {
        let retained = Timestamp::from_unix_millis(self.retained_ms);
        match &self.response {
            None => Record::in_flight(
                scope.clone(),
                self.fingerprint,
                self.owner,
                self.attempt,
                Timestamp::from_unix_millis(self.lease_ms),
                retained,
            )
            .with_checkpoint(self.checkpoint()),
            Some(response) => Record::in_flight(
                scope.clone(),
                self.fingerprint,
                self.owner,
                self.attempt,
                retained,
                retained,
            )
            .completed(response.clone(), retained),
        }
    }
}

fn scope() -> Scope {
    Scope::parse("tenant", "key").unwrap()
}

fn response() -> impl Strategy<Value = StoredResponse> {
    (
        any::<u16>(),
        prop::collection::vec(
            ("[a-zA-Z-]{0,8}", prop::collection::vec(any::<u8>(), 0..8)),
            0..3,
        ),
        prop::collection::vec(any::<u8>(), 0..16),
    )
        .prop_map(|(status, headers, body)| {
            headers
                .into_iter()
                .fold(StoredResponse::new(status, body), |r, (n, v)| {
                    r.with_header(n, v)
                })
        })
}

fn written() -> impl Strategy<Value = Written> {
    (
        any::<[u8; 32]>(),
        any::<[u8; 16]>(),
        any::<u32>(),
        0..i64::MAX / 2,
        0..i64::MAX / 2,
        prop::option::of(("[a-z][a-z0-9-]{0,11}", any::<u64>())),
        prop::option::of(response()),
    )
        .prop_map(
            |(fp, owner, attempt, lease_ms, retained_ms, checkpoint, response)| Written {
                fingerprint: Fingerprint::from_digest(fp),
                owner: OwnerToken::from_slice(&owner).unwrap(),
                attempt,
                lease_ms,
                retained_ms,
                // A completed record reports no checkpoint.
                checkpoint: checkpoint.filter(|_| response.is_none()),
                response,
            },
        )
}

mod redis_replies {
    use idem_redis::fuzzing::{claim_reply, record_hash};
    use idem_redis::redis::Value;

    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// Words and numbers the scripts write, and anything else.
    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::sample::select(vec![
                "claimed",
                "in_progress",
                "completed",
                "mismatch",
                "fp",
                "own",
                "att",
                "st",
                "lease",
                "exp",
                "cpn",
                "cpd",
                "rs",
                "rh",
                "rb",
                "f",
                "c",
                "0",
                "1",
                "-1",
                "200",
                "70000",
                "4294967296",
                "{}",
                "[1]",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            any::<[u8; 16]>()
                .prop_map(|b| OwnerToken::from_slice(&b).unwrap().to_string().into_bytes()),
            prop::collection::vec(any::<u8>(), 0..40),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            Just(Value::Okay),
            any::<i64>().prop_map(Value::Int),
            (-2i64..70_000).prop_map(Value::Int),
            bytes().prop_map(Value::BulkString),
            bytes().prop_map(|b| Value::SimpleString(String::from_utf8_lossy(&b).into_owned())),
            any::<f64>().prop_map(Value::Double),
            any::<bool>().prop_map(Value::Boolean),
        ];
        leaf.prop_recursive(2, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
                prop::collection::vec((inner.clone(), inner), 0..3).prop_map(Value::Map),
            ]
        })
    }

    /// A reply shaped like `lua/claim.lua`'s: an outcome word, then anything.
    fn claim_shaped() -> impl Strategy<Value = Vec<Value>> {
        (bytes(), prop::collection::vec(value(), 0..6)).prop_map(|(word, rest)| {
            let mut reply = vec![Value::BulkString(word)];
            reply.extend(rest);
            reply
        })
    }

    /// A reply shaped like `lua/get.lua`'s: field names and values in turn.
    fn hash_shaped() -> impl Strategy<Value = Vec<Value>> {
        prop::collection::vec((bytes(), value()), 0..12).prop_map(|pairs| {
            pairs
                .into_iter()
                .flat_map(|(name, value)| [Value::BulkString(name), value])
                .collect()
        })
    }

    /// The hash `lua/*.lua` writes for `written`, field by field; numbers as
    /// integers or as text, as a script may reply either.
    fn hash(written: &Written, numbers_as_text: bool) -> Vec<(&'static str, Value)> {
        let number = |n: i64| {
            if numbers_as_text {
                text(&n.to_string())
            } else {
                Value::Int(n)
            }
        };
        let mut fields = vec![
            (
                "fp",
                Value::BulkString(written.fingerprint.as_bytes().to_vec()),
            ),
            ("own", text(&written.owner.to_string())),
            ("att", number(i64::from(written.attempt))),
            ("exp", number(written.retained_ms)),
        ];
        match &written.response {
            None => {
                fields.push(("st", text("f")));
                fields.push(("lease", number(written.lease_ms)));
                if let (Some((name, _)), Some(json)) =
                    (&written.checkpoint, written.checkpoint_json())
                {
                    fields.push(("cpn", text(name)));
                    fields.push(("cpd", text(&json)));
                }
            }
            Some(response) => {
                fields.push(("st", text("c")));
                fields.push(("rs", number(i64::from(response.status()))));
                fields.push(("rh", Value::BulkString(encode_headers(response))));
                fields.push(("rb", Value::BulkString(response.body().to_vec())));
            }
        }
        fields
    }

    fn reply(fields: &[(&str, Value)]) -> Vec<Value> {
        fields
            .iter()
            .flat_map(|(name, value)| [text(name), value.clone()])
            .collect()
    }

    /// A value no script writes for `field`.
    fn garbage(field: &str, pick: u8) -> Value {
        match (field, pick % 3) {
            (_, 0) => Value::Nil,
            ("fp", _) => Value::BulkString(vec![7; 31]),
            ("own", _) => text("not-a-uuid"),
            ("att", 1) => Value::Int(-1),
            ("att", _) => Value::Int(i64::from(u32::MAX) + 1),
            ("st", _) => text("x"),
            ("rs", 1) => Value::Int(70_000),
            ("rh", _) => Value::BulkString(vec![0, 0, 0, 9, b'a']),
            ("rb", _) => Value::Int(1),
            (_, _) => text("12a"),
        }
    }

    fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>, operation: Operation) {
        match result {
            Err(StoreError::Corrupt {
                store: "redis",
                operation: op,
                ..
            }) if op == operation => {}
            other => panic!("expected a Corrupt of {operation:?}, got {other:?}"),
        }
    }

    fn assert_decodes_or_corrupt<T>(result: Result<T, StoreError>, operation: Operation) {
        if let Err(e) = result {
            assert_corrupt::<()>(Err(e), operation);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_claim_reply_decodes_or_is_corrupt_never_a_panic(
            reply in prop_oneof![claim_shaped(), prop::collection::vec(value(), 0..6)],
        ) {
            let request = ClaimRequest::new(scope(), Fingerprint::of_bytes(b"request"));
            assert_decodes_or_corrupt(claim_reply(&reply, &request), Operation::Claim);
        }

        #[test]
        fn any_record_hash_decodes_or_is_corrupt_never_a_panic(
            reply in prop_oneof![hash_shaped(), prop::collection::vec(value(), 0..12)],
        ) {
            match record_hash(&scope(), &reply) {
                Ok(Some(record)) => prop_assert_eq!(record.scope(), &scope()),
                Ok(None) => prop_assert!(reply.is_empty()),
                Err(e) => assert_corrupt::<()>(Err(e), Operation::Get),
            }
        }

        #[test]
        fn a_written_record_hash_decodes_to_its_record_in_any_field_order(
            (written, fields) in (written(), any::<bool>()).prop_flat_map(|(written, as_text)| {
                // Any order: a hash has none.
                let fields = hash(&written, as_text);
                (Just(written), Just(fields).prop_shuffle())
            }),
        ) {
            let decoded = record_hash(&scope(), &reply(&fields)).unwrap();
            prop_assert_eq!(decoded, Some(written.record(&scope())));
        }

        #[test]
        fn a_record_hash_missing_a_field_its_state_needs_is_corrupt(
            written in written(),
            pick in any::<prop::sample::Index>(),
        ) {
            let mut fields = hash(&written, false);
            let required = fields.iter().filter(|(name, _)| *name != "cpd").count();
            let drop = pick.index(required);
            // `cpn` without `cpd` (or the reverse) is as corrupt as a missing field.
            let name = fields.iter().filter(|(name, _)| *name != "cpd").nth(drop).unwrap().0;
            fields.retain(|(n, _)| *n != name);
            assert_corrupt(record_hash(&scope(), &reply(&fields)), Operation::Get);
        }

        #[test]
        fn a_record_hash_field_of_the_wrong_shape_is_corrupt(
            written in written(),
            pick in any::<prop::sample::Index>(),
            shape in any::<u8>(),
        ) {
            let mut fields = hash(&written, false);
            let at = pick.index(fields.len());
            let name = fields[at].0;
            fields[at].1 = garbage(name, shape);
            let decoded = record_hash(&scope(), &reply(&fields));
            if matches!(name, "cpn" | "cpd") && matches!(fields[at].1, Value::BulkString(_)) {
                // Checkpoint text of any shape is a name or JSON text to check.
                assert_decodes_or_corrupt(decoded, Operation::Get);
            } else {
                assert_corrupt(decoded, Operation::Get);
            }
        }
    }
}

mod dynamo_items {
    use idem_dynamo::aws_sdk_dynamodb::primitives::Blob;
    use idem_dynamo::aws_sdk_dynamodb::types::AttributeValue;
    use idem_dynamo::fuzzing::{Item, record, refused_item, takeover_checkpoint};

    use super::*;

    const NAMES: &[&str] = &[
        "pk", "fp", "own", "att", "datt", "st", "lease", "exp", "ttl", "cpn", "cpd", "rs", "rh",
        "rb",
    ];

    fn s(text: impl Into<String>) -> AttributeValue {
        AttributeValue::S(text.into())
    }

    fn n(number: impl ToString) -> AttributeValue {
        AttributeValue::N(number.to_string())
    }

    fn b(bytes: impl Into<Vec<u8>>) -> AttributeValue {
        AttributeValue::B(Blob::new(bytes))
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "f",
                "c",
                "0",
                "1",
                "-1",
                "200",
                "9000",
                "4294967296",
                "1e3",
                " 1",
                "{}",
                "[1]",
                "null",
            ])
            .prop_map(str::to_owned),
            any::<[u8; 16]>().prop_map(|b| OwnerToken::from_slice(&b).unwrap().to_string()),
            any::<String>(),
        ]
    }

    fn value() -> impl Strategy<Value = AttributeValue> {
        let leaf = prop_oneof![
            text().prop_map(AttributeValue::S),
            text().prop_map(AttributeValue::N),
            any::<i64>().prop_map(n),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(b),
            any::<[u8; 32]>().prop_map(|fp| b(fp.to_vec())),
            any::<bool>().prop_map(AttributeValue::Bool),
            any::<bool>().prop_map(AttributeValue::Null),
            prop::collection::vec(text(), 0..3).prop_map(AttributeValue::Ss),
            prop::collection::vec(text(), 0..3).prop_map(AttributeValue::Ns),
        ];
        leaf.prop_recursive(2, 12, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(AttributeValue::L),
                prop::collection::hash_map("[a-z]{1,4}", inner, 0..3).prop_map(AttributeValue::M),
            ]
        })
    }

    /// Items whose attribute names are mostly the store's own.
    fn any_item() -> impl Strategy<Value = Item> {
        let name = prop_oneof![
            4 => prop::sample::select(NAMES).prop_map(str::to_owned),
            1 => any::<String>(),
        ];
        prop::collection::hash_map(name, value(), 0..14)
    }

    /// The item the store writes for `written`.
    fn item(written: &Written) -> Item {
        let mut item = Item::from([
            ("pk".to_owned(), s("6:tenant:key")),
            ("fp".to_owned(), b(written.fingerprint.as_bytes().to_vec())),
            ("own".to_owned(), s(written.owner.to_string())),
            ("exp".to_owned(), n(written.retained_ms)),
            ("ttl".to_owned(), n(written.retained_ms / 1000 + 1)),
        ]);
        match &written.response {
            None => {
                item.insert("st".into(), s("f"));
                item.insert("att".into(), n(written.attempt));
                item.insert("lease".into(), n(written.lease_ms));
                if let (Some((name, _)), Some(json)) =
                    (&written.checkpoint, written.checkpoint_json())
                {
                    item.insert("cpn".into(), s(name.clone()));
                    item.insert("cpd".into(), s(json));
                }
            }
            Some(response) => {
                item.insert("st".into(), s("c"));
                item.insert("datt".into(), n(written.attempt));
                item.insert("rs".into(), n(response.status()));
                item.insert("rh".into(), b(encode_headers(response)));
                item.insert("rb".into(), b(response.body().to_vec()));
            }
        }
        item
    }

    /// The attributes a decoder needs for `written`'s state.
    fn required(written: &Written) -> Vec<&'static str> {
        let mut names = vec!["fp", "own", "exp", "st"];
        match written.response {
            None => {
                names.extend(["att", "lease"]);
                if written.checkpoint.is_some() {
                    names.push("cpn");
                }
            }
            Some(_) => names.extend(["datt", "rs", "rh", "rb"]),
        }
        names
    }

    /// The same attribute under another type, or unreadable under its own.
    fn misshapen(value: &AttributeValue, pick: u8) -> AttributeValue {
        match (value, pick % 3) {
            (_, 0) => AttributeValue::Null(true),
            (AttributeValue::S(text), 1) => AttributeValue::Ss(vec![text.clone()]),
            (AttributeValue::S(text), _) => b(text.as_bytes().to_vec()),
            (AttributeValue::N(number), 1) => s(number.clone()),
            (AttributeValue::N(_), _) => n("1.5e"),
            (AttributeValue::B(blob), 1) => s(String::from_utf8_lossy(blob.as_ref())),
            (AttributeValue::B(_), _) => AttributeValue::Bs(Vec::new()),
            (_, _) => AttributeValue::Bool(true),
        }
    }

    fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>, operation: Operation) {
        match result {
            Err(StoreError::Corrupt {
                store: "dynamodb",
                operation: op,
                ..
            }) if op == operation => {}
            other => panic!("expected a Corrupt of {operation:?}, got {other:?}"),
        }
    }

    fn assert_decodes_or_corrupt<T>(result: Result<T, StoreError>, operation: Operation) {
        if let Err(e) = result {
            assert_corrupt::<()>(Err(e), operation);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_item_decodes_or_is_corrupt_never_a_panic(item in any_item()) {
            match record(&scope(), &item) {
                Ok(record) => prop_assert_eq!(record.scope(), &scope()),
                Err(e) => assert_corrupt::<()>(Err(e), Operation::Get),
            }
            assert_decodes_or_corrupt(refused_item(&scope(), &item), Operation::Claim);
            assert_decodes_or_corrupt(takeover_checkpoint(&item), Operation::Claim);
        }

        #[test]
        fn a_written_item_decodes_to_its_record(written in written()) {
            let item = item(&written);
            prop_assert_eq!(record(&scope(), &item).unwrap(), written.record(&scope()));
            prop_assert_eq!(
                refused_item(&scope(), &item).unwrap(),
                written.record(&scope())
            );
            prop_assert_eq!(takeover_checkpoint(&item).unwrap(), written.checkpoint());
        }

        #[test]
        fn an_item_missing_an_attribute_its_state_needs_is_corrupt(
            written in written(),
            pick in any::<prop::sample::Index>(),
        ) {
            let mut item = item(&written);
            let names = required(&written);
            item.remove(names[pick.index(names.len())]);
            assert_corrupt(record(&scope(), &item), Operation::Get);
            assert_corrupt(refused_item(&scope(), &item), Operation::Claim);
        }

        #[test]
        fn an_attribute_of_the_wrong_type_or_shape_is_corrupt(
            written in written(),
            pick in any::<prop::sample::Index>(),
            shape in any::<u8>(),
        ) {
            let mut item = item(&written);
            let names = required(&written);
            let name = names[pick.index(names.len())];
            let changed = misshapen(&item[name], shape);
            item.insert(name.to_owned(), changed);
            assert_corrupt(record(&scope(), &item), Operation::Get);
            assert_corrupt(refused_item(&scope(), &item), Operation::Claim);
        }
    }
}
