//! Options, and the Redis key of a record.

use idem_core::{InvalidInput, Scope};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idem";
/// The default [`Capabilities::max_response_bytes`](idem_core::Capabilities): 8 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 << 20;
/// The largest response limit accepted: a Redis string holds 512 MiB, and
/// the response travels as one script argument.
pub const MAX_RESPONSE_BYTES_LIMIT: usize = 256 << 20;

/// How a [`RedisStore`](crate::RedisStore) is set up.
///
/// ```
/// use idem_redis::RedisOptions;
///
/// let options = RedisOptions::default()
///     .with_prefix("billing-idem")?
///     .with_max_response_bytes(1 << 20)?;
/// assert!(RedisOptions::default().with_prefix("bad{prefix}").is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) max_response_bytes: usize,
    pub(crate) accept_eviction_risk: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            accept_eviction_risk: false,
        }
    }
}

impl RedisOptions {
    /// Sets the prefix of every key: 1 to 64 bytes, no braces, colons or
    /// control characters.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] naming the broken rule.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, InvalidInput> {
        let field = "key prefix";
        if prefix.is_empty() {
            return Err(InvalidInput::Empty { field });
        }
        if prefix.len() > 64 {
            return Err(InvalidInput::TooLong {
                field,
                len: prefix.len(),
                max: 64,
            });
        }
        if let Some(position) = prefix.find(|c: char| c.is_control()) {
            return Err(InvalidInput::ControlCharacter { field, position });
        }
        if prefix.contains(['{', '}', ':']) {
            return Err(InvalidInput::Malformed {
                field,
                reason: "must not contain '{', '}' or ':'".into(),
            });
        }
        self.prefix = prefix.to_string();
        Ok(self)
    }

    /// Sets the largest response accepted (default 8 MiB).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] above 256 MiB.
    pub fn with_max_response_bytes(mut self, max: usize) -> Result<Self, InvalidInput> {
        if max > MAX_RESPONSE_BYTES_LIMIT {
            return Err(InvalidInput::OutOfRange {
                field: "max response bytes",
                reason: "Redis strings hold 512 MiB; the limit is 256 MiB",
            });
        }
        self.max_response_bytes = max;
        Ok(self)
    }

    /// Runs on a server whose `maxmemory-policy` may evict records.
    ///
    /// An evicted record is a forgotten key: the next retry runs the work a
    /// second time. Only for caches of idempotency, never for guarantees.
    pub fn accept_eviction_risk(mut self) -> Self {
        self.accept_eviction_risk = true;
        self
    }
}

/// Escapes the characters that could end a part or the hash tag early.
fn escape(part: &str, out: &mut String) {
    // Almost every tenant and key has none of the three: copy them whole.
    if !part.bytes().any(|b| matches!(b, b'%' | b'{' | b'}')) {
        out.push_str(part);
        return;
    }
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// The Redis key of a scope: `<prefix>:{<n>:<tenant>:<key>}`, where tenant
/// and key are escaped (`%`, `{`, `}`) and `n` is the escaped tenant's byte
/// length. The length prefix makes the encoding injective, whatever
/// separators the parts hold, and the braces are a hash tag that holds
/// exactly the scope, so a cluster places each record by its whole scope.
pub fn record_key(prefix: &str, scope: &Scope) -> String {
    let mut tenant = String::with_capacity(scope.tenant().as_str().len());
    escape(scope.tenant().as_str(), &mut tenant);
    let mut key = format!("{prefix}:{{{}:{tenant}:", tenant.len());
    escape(scope.key().as_str(), &mut key);
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, key: &str) -> String {
        record_key("idem", &Scope::parse(tenant, key).unwrap())
    }

    #[test]
    fn separators_cannot_make_two_scopes_meet() {
        assert_eq!(key("a:b", "c"), "idem:{3:a:b:c}");
        assert_eq!(key("a", "b:c"), "idem:{1:a:b:c}");
        assert_ne!(key("a}", "b"), key("a", "}b"));
        assert_ne!(key("a%7D", "b"), key("a}", "b"));
        assert_eq!(key("{t}", "{k}"), "idem:{7:%7Bt%7D:%7Bk%7D}");
    }

    #[test]
    fn hash_tag_is_the_whole_scope() {
        let k = key("t{x}", "k}");
        let open = k.find('{').unwrap();
        let close = k[open..].find('}').unwrap() + open;
        assert_eq!(close, k.len() - 1, "{k}");
    }
}
