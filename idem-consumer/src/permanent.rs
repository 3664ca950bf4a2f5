//! A handler's failure that no redelivery can fix.

use idem_core::BoxError;

/// A handler's error that no redelivery can fix (the payload does not
/// parse, it names what will never exist): the consumer parks the message
/// at once with this reason (`permanent: <reason>`), where a plain error is
/// delivered again with back-off until
/// [`ConsumerOptions::max_deliveries`](crate::ConsumerOptions::max_deliveries).
/// Return it from [`Handler::handle`](crate::Handler::handle) with `?`.
///
/// ```
/// use idem_consumer::{Handled, Permanent};
/// use idem_core::HandlerError;
///
/// fn total(payload: &[u8]) -> Result<u64, HandlerError> {
///     let text = std::str::from_utf8(payload).map_err(Permanent::because)?;
///     if text.is_empty() {
///         return Err(Permanent::new("an empty order").into());
///     }
///     Ok(text.parse().map_err(Permanent::because)?)
/// }
///
/// let error = total(b"twelve").unwrap_err();
/// assert_eq!(error.to_string(), "invalid digit found in string");
/// assert!(error.into_inner().downcast_ref::<Permanent>().is_some());
/// assert_eq!(total(b"12").unwrap(), 12);
/// # let _ = Handled::Applied;
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct Permanent {
    reason: String,
    #[source]
    source: Option<BoxError>,
}

impl Permanent {
    /// A permanent failure for `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            source: None,
        }
    }

    /// A permanent failure because of `error` (its text the reason).
    pub fn because(error: impl Into<BoxError>) -> Self {
        let source = error.into();
        Self {
            reason: source.to_string(),
            source: Some(source),
        }
    }

    /// Why.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}
