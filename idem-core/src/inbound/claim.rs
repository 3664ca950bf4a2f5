//! What a claim asks for and what it answers.

use crate::inbound::fingerprint::Fingerprint;
use crate::inbound::record::{Checkpoint, Lease, StoredResponse};
use crate::plumbing::error::InvalidInput;
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::scope::Scope;
use std::time::Duration;

/// The shortest lease or retention accepted: stores keep milliseconds.
pub const MIN_DURATION: Duration = Duration::from_millis(1);
/// The longest lease accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest retention accepted.
pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// What a claim asks for: the scope, the request's fingerprint, how long to
/// hold the key, and how long to keep the record.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{Fingerprint, Scope};
/// use idem_core::store::ClaimRequest;
///
/// let request = ClaimRequest::new(Scope::parse("acme", "k")?, Fingerprint::of_bytes(b"x"))
///     .with_lease(Duration::from_secs(10))?
///     .with_retention(Duration::from_secs(86_400))?;
/// assert_eq!(request.lease(), Duration::from_secs(10));
/// assert!(request.clone().with_lease(Duration::ZERO).is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    scope: Scope,
    fingerprint: Fingerprint,
    owner: OwnerToken,
    lease: Duration,
    retention: Duration,
}

fn check_range(
    field: &'static str,
    value: Duration,
    max: Duration,
    reason: &'static str,
) -> Result<Duration, InvalidInput> {
    if value < MIN_DURATION || value > max {
        return Err(InvalidInput::OutOfRange { field, reason });
    }
    // Stores keep whole milliseconds; round down so every store agrees.
    Ok(Duration::from_millis(value.as_millis() as u64))
}

/// Validates a lease duration (for claims, renewals and runners): 1 ms to 7
/// days, rounded down to whole milliseconds.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::validate_lease;
///
/// assert!(validate_lease(Duration::from_secs(30)).is_ok());
/// assert!(validate_lease(Duration::ZERO).is_err());
/// ```
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside that range.
pub fn validate_lease(ttl: Duration) -> Result<Duration, InvalidInput> {
    check_range("lease", ttl, MAX_LEASE, "must be 1 ms to 7 days")
}

/// Validates a retention: 1 ms to 10 years, rounded down to whole milliseconds.
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside that range.
pub fn validate_retention(retention: Duration) -> Result<Duration, InvalidInput> {
    check_range(
        "retention",
        retention,
        MAX_RETENTION,
        "must be 1 ms to 10 years",
    )
}

impl ClaimRequest {
    /// The default lease: 30 seconds.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// The default retention: 24 hours.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

    /// A claim with the default lease and retention, by a new owner.
    pub fn new(scope: Scope, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            fingerprint,
            owner: OwnerToken::generate(),
            lease: Self::DEFAULT_LEASE,
            retention: Self::DEFAULT_RETENTION,
        }
    }

    /// Sets how long the claim holds the key before another request may take it over.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 7 days.
    pub fn with_lease(mut self, ttl: Duration) -> Result<Self, InvalidInput> {
        self.lease = validate_lease(ttl)?;
        Ok(self)
    }

    /// Sets how long the record is kept (from the claim, and again from completion).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 10 years.
    pub fn with_retention(mut self, retention: Duration) -> Result<Self, InvalidInput> {
        self.retention = validate_retention(retention)?;
        Ok(self)
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The request's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The owner this claim makes: minted with the request, so the same
    /// request delivered twice (a driver's resend, a caller's retry after
    /// `Unavailable`) is recognised as one claim.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The same request by a new owner: another caller's claim of the same
    /// scope and fingerprint.
    #[must_use]
    pub fn with_new_owner(mut self) -> Self {
        self.owner = OwnerToken::generate();
        self
    }

    /// The lease duration.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The retention a claim applies: the retention, or the lease where that
    /// is longer, so an in-flight record never ends before its lease.
    pub fn claim_retention(&self) -> Duration {
        self.retention.max(self.lease)
    }
}

/// The answer to a claim: one row of the decision table.
///
/// Duplicates and mismatches are expected races, so they are values, not errors.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// The caller holds the key: run the work, then complete under `lease`.
    Claimed {
        /// The lease to name in every fenced operation.
        lease: Lease,
        /// The recovery point a previous owner left (takeovers only).
        checkpoint: Option<Checkpoint>,
    },
    /// Another owner holds a valid lease; try again after `retry_after`
    /// (HTTP: 409 with `Retry-After`).
    InProgress {
        /// The lease's remaining time, at least 1 ms.
        retry_after: Duration,
    },
    /// The work is done: replay this response.
    Completed(StoredResponse),
    /// The key was used for a request with another fingerprint (HTTP: 422).
    Mismatch,
}
