//! Tenants, keys, scopes and checkpoint names from any text: never a panic;
//! the three kinds of name accept the same texts, an accepted name is kept
//! exactly, a downstream key is itself a valid key, and the storage key
//! (plain, and with `{` `}` escaped as Redis does) decodes back to its scope,
//! so two different scopes never share one.
//!
//! Input: up to five texts separated by `\n` (tenant, key, second tenant,
//! second key, downstream name); invalid UTF-8 is read lossily.
#![no_main]

use idem_core::store::{storage_key, storage_key_escaped};
use idem_core::{Checkpoint, IdempotencyKey, Scope, Tenant};
use libfuzzer_sys::fuzz_target;

const RESERVED: [char; 2] = ['{', '}'];

/// Tenant and key back out of `<n>:<tenant>:<key>`.
fn split(storage: &str) -> (&str, &str) {
    let (len, rest) = storage.split_once(':').expect("no length prefix");
    let len: usize = len.parse().expect("the length is not a number");
    let (tenant, rest) = rest.split_at(len);
    let key = rest
        .strip_prefix(':')
        .expect("no separator after the tenant");
    (tenant, key)
}

/// Undoes the percent-escapes of `storage_key_escaped`; asserts that no
/// reserved character or bare `%` is left in the escaped text.
fn unescape(part: &str) -> String {
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        assert!(
            !RESERVED.contains(&char::from(first)),
            "unescaped reserved character"
        );
        if first == b'%' {
            let hex = tail.get(..2).expect("truncated escape");
            let hex = std::str::from_utf8(hex).expect("escape not ASCII");
            bytes.push(u8::from_str_radix(hex, 16).expect("escape not hex"));
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    String::from_utf8(bytes).expect("unescaped text is not UTF-8")
}

/// Checks every rule of one name; the scope if tenant and key are both valid.
fn scope(tenant: &str, key: &str) -> Option<Scope> {
    let as_tenant = Tenant::new(tenant);
    let as_key = IdempotencyKey::new(tenant);
    let as_checkpoint = Checkpoint::new(tenant, &());
    assert_eq!(
        as_tenant.is_ok(),
        as_key.is_ok(),
        "tenant and key rules differ"
    );
    assert_eq!(
        as_tenant.is_ok(),
        as_checkpoint.is_ok(),
        "checkpoint name rules differ"
    );
    assert_eq!(
        as_tenant.clone().map_err(|_| ()),
        tenant.parse::<Tenant>().map_err(|_| ())
    );
    if let Ok(t) = &as_tenant {
        assert_eq!(t.as_str(), tenant);
        assert_eq!(as_key.as_ref().map(IdempotencyKey::as_str), Ok(tenant));
        assert_eq!(as_checkpoint.as_ref().map(Checkpoint::name), Ok(tenant));
        assert!(!tenant.is_empty() && tenant.len() <= idem_core::MAX_NAME_BYTES);
    }
    let scope = Scope::parse(tenant, key);
    assert_eq!(
        scope.is_ok(),
        as_tenant.is_ok() && IdempotencyKey::new(key).is_ok(),
        "Scope::parse disagrees with its parts"
    );
    let scope = scope.ok()?;
    assert_eq!(
        (scope.tenant().as_str(), scope.key().as_str()),
        (tenant, key)
    );

    let plain = storage_key(&scope);
    assert_eq!(split(&plain), (tenant, key), "storage key {plain:?}");
    let escaped = storage_key_escaped(&scope, &RESERVED);
    let (t, k) = split(&escaped);
    assert_eq!(
        (unescape(t), unescape(k)),
        (tenant.to_owned(), key.to_owned())
    );
    Some(scope)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(5, '\n');
    let mut next = || parts.next().unwrap_or_default();
    let (t1, k1, t2, k2, name) = (next(), next(), next(), next(), next());
    let first = scope(t1, k1);
    let second = scope(t2, k2);
    if let Some(first) = &first {
        let downstream = first.downstream_key(name);
        assert!(IdempotencyKey::new(downstream.as_str()).is_ok());
        // A scope sharing the tenant: the key part alone must tell them apart.
        if let Ok(other) = Scope::parse(t1, k2) {
            assert_eq!(storage_key(first) == storage_key(&other), k1 == k2);
        }
    }
    if let (Some(a), Some(b)) = (first, second) {
        assert_eq!(a == b, storage_key(&a) == storage_key(&b), "{a:?} {b:?}");
        assert_eq!(
            a == b,
            storage_key_escaped(&a, &RESERVED) == storage_key_escaped(&b, &RESERVED),
            "{a:?} {b:?}"
        );
    }
});
