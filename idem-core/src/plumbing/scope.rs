//! Validated names: the tenant, the idempotency key, and the scope of both.

use crate::plumbing::error::InvalidInput;
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The longest tenant or key accepted, in bytes of UTF-8.
pub const MAX_NAME_BYTES: usize = 255;

/// Checks the rules shared by tenants, keys and checkpoint names.
pub(crate) fn check_name(field: &'static str, value: &str) -> Result<(), InvalidInput> {
    crate::plumbing::options::validate_name(field, value, MAX_NAME_BYTES, |_| true, "")
}

macro_rules! name_type {
    ($(#[$meta:meta])* $name:ident, $field:literal) => {
        $(#[$meta])*
        // Shared text: scopes are cloned into every lease, record and map key,
        // so a clone is a reference count, not an allocation.
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `value`: 1 to 255 bytes of UTF-8 without control characters.
            ///
            /// # Errors
            ///
            /// [`InvalidInput`] naming the rule that broke.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
                let value = value.into();
                check_name($field, &value)?;
                Ok(Self(value.into()))
            }

            /// [`new`](Self::new) from borrowed text: one allocation, the shared one.
            fn from_text(value: &str) -> Result<Self, InvalidInput> {
                check_name($field, value)?;
                Ok(Self(value.into()))
            }

            /// The validated text, exactly as given.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = InvalidInput;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::from_text(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = InvalidInput;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidInput;

            fn try_from(value: &str) -> Result<Self, Self::Error> {
                Self::from_text(value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// The owner of a set of keys: a customer, an API client, a service.
    ///
    /// No two tenants ever share a record, whatever characters their names hold.
    ///
    /// ```
    /// use idem_core::Tenant;
    ///
    /// let tenant = Tenant::new("acme:eu/1")?;
    /// assert_eq!(tenant.as_str(), "acme:eu/1");
    /// assert!(Tenant::new("").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    Tenant,
    "tenant"
);

name_type!(
    /// A consumer's name: whose inbox records and parked messages they
    /// are (`idem-consumer`). One name per consuming service; two
    /// consumers of one name share an inbox, so each message applies once
    /// between them.
    ///
    /// ```
    /// use idem_core::ConsumerName;
    ///
    /// let shipping = ConsumerName::new("shipping")?;
    /// assert_eq!(shipping.as_str(), "shipping");
    /// assert!(ConsumerName::new("").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    ///
    /// A type of its own, so that a tenant of the records is never taken
    /// for a consumer where parked messages are looked up:
    ///
    /// ```compile_fail
    /// use idem_core::Tenant;
    /// use idem_core::store::ParkedQuery;
    ///
    /// let query = ParkedQuery::new(Tenant::new("shipping").unwrap());
    /// ```
    ConsumerName,
    "consumer"
);

impl ConsumerName {
    /// The tenant its inbox records are kept under, in the records store
    /// the consumer shares with the rest of a service: the same text.
    ///
    /// ```
    /// # use idem_core::ConsumerName;
    /// let shipping = ConsumerName::new("shipping")?;
    /// assert_eq!(shipping.inbox_tenant().as_str(), "shipping");
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn inbox_tenant(&self) -> Tenant {
        Tenant(Arc::clone(&self.0))
    }
}

impl fmt::Debug for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConsumerName").field(&self.0).finish()
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

name_type!(
    /// The idempotency key a client minted once for one intent, before its first attempt.
    ///
    /// Keys may be secrets (some clients put tokens in them), so `Debug` shows
    /// only a short hash; [`as_str`](Self::as_str) gives the key itself.
    /// There is no `Display` on purpose: a key in a `{}` (a log line, a
    /// trace field, an error message) would be written out whole. Write
    /// [`as_str`](Self::as_str) where the key belongs (a database column, a
    /// header to a provider) and [`redacted`](Self::redacted) everywhere
    /// else.
    ///
    /// ```
    /// use idem_core::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::new("order-7f3a")?;
    /// assert!(!format!("{key:?}").contains("order-7f3a"));
    /// assert!(IdempotencyKey::new("line\nbreak").is_err());
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    IdempotencyKey,
    "key"
);

impl IdempotencyKey {
    /// A key of `prefix` and a digest's 64 hex digits: within the key rules
    /// by construction (for a prefix of at most 191 printable bytes).
    pub(crate) fn derived(prefix: &'static str, digest: &crate::Fingerprint) -> Self {
        Self(format!("{prefix}{digest}").into())
    }

    /// A short, stable hash of the key, for logs and traces.
    ///
    /// ```
    /// # use idem_core::IdempotencyKey;
    /// let key = IdempotencyKey::new("secret-key")?;
    /// assert_eq!(key.redacted().len(), 16);
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn redacted(&self) -> String {
        redacted(&self.0)
    }
}

/// A short, stable hash of any key (an aggregate's, a message's), for logs
/// and traces: keys can be personal data, their hashes are not. The same
/// as [`IdempotencyKey::redacted`] for the same text.
///
/// ```
/// let hash = idem_core::redacted("customer-jane@example.com");
/// assert_eq!(hash.len(), 16);
/// assert_eq!(hash, idem_core::IdempotencyKey::new("customer-jane@example.com")?.redacted());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
pub fn redacted(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(&digest[..8])
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tenant").field(&self.0).finish()
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(sha256:{})", self.redacted())
    }
}

/// One `(tenant, key)` pair: the unit every record, read and write names.
///
/// ```
/// use idem_core::{IdempotencyKey, Scope, Tenant};
///
/// let scope = Scope::new(Tenant::new("acme")?, IdempotencyKey::new("order-1")?);
/// assert_eq!(scope.tenant().as_str(), "acme");
/// let same = Scope::parse("acme", "order-1")?;
/// assert_eq!(scope, same);
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    tenant: Tenant,
    key: IdempotencyKey,
}

impl Scope {
    /// Pairs a tenant with a key.
    pub fn new(tenant: Tenant, key: IdempotencyKey) -> Self {
        Self { tenant, key }
    }

    /// Validates both parts from text.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for whichever part breaks a rule, tenant first.
    pub fn parse(tenant: &str, key: &str) -> Result<Self, InvalidInput> {
        Ok(Self::new(
            Tenant::from_text(tenant)?,
            IdempotencyKey::from_text(key)?,
        ))
    }

    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// A deterministic idempotency key for a call this scope's handler makes
    /// to another service, named `name`.
    ///
    /// It depends only on the scope and the name, so every attempt and every
    /// takeover of the same intent sends the downstream service the same key,
    /// and two different downstream calls get different keys.
    ///
    /// ```
    /// # use idem_core::Scope;
    /// let scope = Scope::parse("acme", "order-1")?;
    /// let charge = scope.downstream_key("charge-card");
    /// assert_eq!(charge, scope.downstream_key("charge-card"));
    /// assert_ne!(charge, scope.downstream_key("send-email"));
    /// # Ok::<(), idem_core::InvalidInput>(())
    /// ```
    pub fn downstream_key(&self, name: &str) -> IdempotencyKey {
        let mut hasher = Sha256::new();
        for part in [
            b"idem-downstream-v1".as_slice(),
            self.tenant.as_str().as_bytes(),
            self.key.as_str().as_bytes(),
            name.as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        // 64 hex characters: within the key rules by construction.
        IdempotencyKey(hex::encode(hasher.finalize()).into())
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("tenant", &self.tenant)
            .field("key", &self.key)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_names_are_refused() {
        assert_eq!(
            Tenant::new(""),
            Err(InvalidInput::Empty { field: "tenant" })
        );
        assert_eq!(
            IdempotencyKey::new(""),
            Err(InvalidInput::Empty { field: "key" })
        );
    }

    #[test]
    fn names_longer_than_255_bytes_are_refused() {
        assert!(IdempotencyKey::new("k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::new("k".repeat(256)),
            Err(InvalidInput::TooLong {
                field: "key",
                len: 256,
                max: 255
            })
        );
        // 128 two-byte characters are 256 bytes.
        assert!(Tenant::new("é".repeat(128)).is_err());
    }

    #[test]
    fn control_characters_are_refused_with_their_position() {
        assert_eq!(
            IdempotencyKey::new("ab\u{7f}"),
            Err(InvalidInput::ControlCharacter {
                field: "key",
                position: 2
            })
        );
        assert!(Tenant::new("a\tb").is_err());
        assert!(Tenant::new("a\u{0085}b").is_err());
    }

    #[test]
    fn separators_and_non_ascii_are_accepted() {
        assert!(Scope::parse("a:b/{c}", "ключ:{1}/ü").is_ok());
    }

    #[test]
    fn key_debug_never_shows_the_key() {
        let scope = Scope::parse("acme", "hunter2-secret").unwrap();
        let shown = format!("{scope:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("acme"));
    }

    #[test]
    fn downstream_keys_do_not_collide_across_part_boundaries() {
        let a = Scope::parse("ab", "c").unwrap().downstream_key("d");
        let b = Scope::parse("a", "bc").unwrap().downstream_key("d");
        assert_ne!(a, b);
        assert!(IdempotencyKey::new(a.as_str()).is_ok());
    }
}
