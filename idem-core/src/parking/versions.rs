//! Version checks: an event applies only on its predecessor, so a stale
//! event is dropped and a gap waits.

use crate::plumbing::error::StoreError;
use async_trait::async_trait;
use std::fmt;

/// What a version check found: the stored version of an aggregate against
/// the version an event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum VersionCheck {
    /// The stored version is the event's predecessor: apply it.
    Apply,
    /// The stored version is at or past the event's: a duplicate or a stale
    /// event; acknowledge it and change nothing.
    Stale {
        /// The stored version (0 for none).
        current: u64,
    },
    /// The stored version is below the event's predecessor: an event before
    /// it is missing. Retry, then park; later versions wait behind it.
    Gap {
        /// The stored version (0 for none).
        current: u64,
    },
}

impl VersionCheck {
    /// The check of an event at `event` (1 or more) against the stored
    /// version `current` (0 when the aggregate has none yet).
    ///
    /// ```
    /// use idem_core::store::VersionCheck;
    ///
    /// assert_eq!(VersionCheck::of(3, 2), VersionCheck::Apply);
    /// assert_eq!(VersionCheck::of(3, 3), VersionCheck::Stale { current: 3 });
    /// assert_eq!(VersionCheck::of(3, 1), VersionCheck::Gap { current: 1 });
    /// ```
    pub fn of(event: u64, current: u64) -> Self {
        if current >= event {
            Self::Stale { current }
        } else if current + 1 == event {
            Self::Apply
        } else {
            Self::Gap { current }
        }
    }
}

/// A store's version check: moves an aggregate's stored version to an
/// event's when it holds the event's predecessor, inside the transaction
/// `Tx` that holds the handler's writes (so the move and the effect commit
/// together, and the conditional write serialises racing handlers of one
/// aggregate); otherwise reads the stored version and tells a stale event
/// from a gap ([`VersionCheck::of`]).
///
/// `idem_postgres::VersionedTable` and `idem_dynamo::VersionedItems` are
/// two, over a table of yours.
///
/// # Contract
///
/// - An aggregate with no stored version is at version 0: its event 1 is
///   [`VersionCheck::Apply`] (and the handler writes its first version).
/// - [`VersionCheck::Apply`] means the stored version is now the event's,
///   inside `tx`; the others change nothing. The version read after a
///   refused move is the latest committed one, never an older snapshot's.
#[async_trait]
pub trait VersionStore<Tx: Send + ?Sized>: Send + Sync + fmt::Debug + 'static {
    /// Moves `aggregate` to `version` if it holds `version - 1`.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] for version 0; the store's failures.
    async fn advance(
        &self,
        tx: &mut Tx,
        aggregate: &str,
        version: u64,
    ) -> Result<VersionCheck, StoreError>;
}
