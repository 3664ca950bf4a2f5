//! The table name, the item key of a scope, and the item size limit.

use idem_core::{InvalidInput, Scope};

/// DynamoDB's item size limit, in bytes.
pub const ITEM_LIMIT: usize = 400 * 1024;

/// What a completed item holds besides the response, at most: key, tenant and
/// key attributes (up to 255 bytes each, twice), fingerprint, owner, numbers
/// and attribute names, with room to spare.
pub(crate) const ITEM_OVERHEAD: usize = 2 * 1024;

/// The default [`Capabilities::max_response_bytes`](idem_core::Capabilities):
/// whatever an item leaves beside the record's own attributes.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = ITEM_LIMIT - ITEM_OVERHEAD;

/// A validated DynamoDB table name: 3 to 255 characters of `[A-Za-z0-9_.-]`.
///
/// ```
/// use idem_dynamo::TableName;
///
/// assert!(TableName::new("idem-records").is_ok());
/// assert!(TableName::new("no spaces").is_err());
/// assert!(TableName::new("ab").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// Validates `name` against DynamoDB's rules.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] naming the broken rule.
    pub fn new(name: &str) -> Result<Self, InvalidInput> {
        let field = "table name";
        if name.len() < 3 {
            return Err(InvalidInput::OutOfRange {
                field,
                reason: "DynamoDB table names are 3 to 255 characters",
            });
        }
        if name.len() > 255 {
            return Err(InvalidInput::TooLong {
                field,
                len: name.len(),
                max: 255,
            });
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err(InvalidInput::Malformed {
                field,
                reason: format!("{name:?} holds a character outside [A-Za-z0-9_.-]"),
            });
        }
        Ok(Self(name.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The partition key of a scope: `<n>:<tenant>:<key>`, `n` the tenant's byte
/// length. The length prefix makes it injective whatever the parts hold.
pub fn item_key(scope: &Scope) -> String {
    let tenant = scope.tenant().as_str();
    format!("{}:{tenant}:{}", tenant.len(), scope.key().as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_keys_are_injective() {
        let key = |t: &str, k: &str| item_key(&Scope::parse(t, k).unwrap());
        assert_eq!(key("a:b", "c"), "3:a:b:c");
        assert_eq!(key("a", "b:c"), "1:a:b:c");
        assert_ne!(key("a:b", "c"), key("a", "b:c"));
    }
}
