//! Fencing tokens: the owner a claim or a lease names, so that a stale
//! owner can never write over the one that took its work over.

use std::fmt;
use uuid::Uuid;

/// The fencing token of one claim: a fresh random UUID per claim or takeover.
///
/// Every fenced write names it, and succeeds only while the record is still
/// in flight under this owner.
///
/// ```
/// use idem_core::store::OwnerToken;
///
/// let a = OwnerToken::generate();
/// assert_ne!(a, OwnerToken::generate());
/// assert_eq!(OwnerToken::from_uuid(a.as_uuid()), a);
/// assert_eq!(OwnerToken::parse(&a.to_string()), Some(a));
/// assert_eq!(OwnerToken::parse("not a uuid"), None);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerToken(Uuid);

impl OwnerToken {
    /// A new random token.
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }

    /// The token a store read back from storage.
    pub const fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// The token as a UUID.
    pub const fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The token from its text (as [`Display`](fmt::Display) writes it), or
    /// `None` if `text` is not a UUID.
    pub fn parse(text: &str) -> Option<Self> {
        Uuid::parse_str(text).ok().map(Self)
    }

    /// The token from its 16 raw bytes, or `None` for another length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        Uuid::from_slice(bytes).ok().map(Self)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({})", self.0)
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
