//! Why a console call failed, and the RFC 9457 problem each answer is.

use std::time::Duration;

use http::StatusCode;
use idem_core::{InvalidInput, StoreError};
use idem_http::ProblemDetails;

/// Why an operator's call failed. Every variant is one HTTP status in the
/// JSON API (an `application/problem+json` body, as `idem-http` answers)
/// and one exit code in the `idem` command line.
///
/// A repeated action is never an error: a second retry or drop answers
/// what the first did ([`Done`](crate::Done) with `changed: false`).
///
/// ```
/// use http::StatusCode;
/// use idem_admin::AdminError;
///
/// let error = AdminError::NotFound { what: "outbox message".into() };
/// assert_eq!(error.status(), StatusCode::NOT_FOUND);
/// assert_eq!(error.problem().to_json()["detail"], "no such outbox message");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The console was built without this part (no outbox, no such
    /// consumer or journal).
    #[error("this console has no {part}")]
    Absent {
        /// The part asked for.
        part: String,
    },
    /// Nothing is there (a record, a message, an operation).
    #[error("no such {what}")]
    NotFound {
        /// What was looked for (never the key itself).
        what: String,
    },
    /// The item is in a state the action does not apply to (a sent message
    /// is not dropped, a replayed one is not dropped, an operation settled
    /// otherwise stays as it is).
    #[error("{0}")]
    Conflict(String),
    /// Someone else holds the item now (an executor's lease, a delivery
    /// being handled): try again after `retry_after`.
    #[error("{detail}; try again in {retry_after:?}")]
    Busy {
        /// Who holds it.
        detail: String,
        /// How long they still hold it.
        retry_after: Duration,
    },
    /// Replaying a parked message runs its consumer's handler, which this
    /// console was not given (the command line never has it).
    #[error(
        "replaying a message of consumer {consumer} runs its handler, which only the service has: \
         replay it through the service's admin route (POST <prefix>/api/consumers/{consumer}/replay) \
         or its console page, or drop it"
    )]
    ReplayNeedsHandler {
        /// The consumer.
        consumer: String,
    },
    /// The request was malformed (a bad name, a missing reason, an
    /// unconfirmed drop, a page beyond the listing's reach).
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// The store failed; the action may or may not have happened when the
    /// store was unavailable (repeating it is safe).
    #[error("{part}: {source}")]
    Store {
        /// The part whose store failed.
        part: &'static str,
        /// The store's error (it names the store and the operation).
        #[source]
        source: StoreError,
    },
    /// The part failed otherwise (a broker, a provider): what it said is
    /// for the server's trace only.
    #[error("{part}: {source}")]
    Internal {
        /// The part that failed.
        part: &'static str,
        /// Its error.
        #[source]
        source: idem_core::BoxError,
    },
}

impl AdminError {
    /// `source` from the store of `part`.
    pub(crate) fn store(part: &'static str) -> impl FnOnce(StoreError) -> Self {
        move |source| match source {
            StoreError::InvalidInput(input) => Self::InvalidInput(input),
            source => Self::Store { part, source },
        }
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Absent { .. } | Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::Conflict(_) | Self::Busy { .. } => StatusCode::CONFLICT,
            Self::ReplayNeedsHandler { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::InvalidInput(_) => StatusCode::BAD_REQUEST,
            Self::Store { source, .. } if source.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store { .. } | Self::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A short name of the kind of error, as the problem's `error` member
    /// carries it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Absent { .. } => "absent",
            Self::NotFound { .. } => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Busy { .. } => "busy",
            Self::ReplayNeedsHandler { .. } => "replay_needs_handler",
            Self::InvalidInput(_) => "invalid_input",
            Self::Store { source, .. } if source.is_retryable() => "store_unavailable",
            Self::Store { .. } => "store_failed",
            Self::Internal { .. } => "internal",
        }
    }

    /// How long to wait before trying again, where waiting helps.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { retry_after, .. } => Some(*retry_after),
            Self::Store { source, .. } if source.is_retryable() => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// What an answer (the JSON API's problem, the page) says of it: its
    /// own text, except for a failure of a store or another part, whose
    /// text can hold stored values (a Postgres message names a row's): a
    /// fixed sentence with a fresh incident id, the error traced beside it
    /// on the server (the command line, on the operator's own terminal,
    /// prints the error itself).
    ///
    /// ```
    /// use idem_admin::AdminError;
    /// use idem_core::{Operation, StoreError};
    ///
    /// let leak = StoreError::backend("postgres", Operation::Get, "Key (email)=(jane@example.com)");
    /// let error = AdminError::Store { part: "records", source: leak };
    /// let detail = error.detail();
    /// assert!(!detail.contains("jane@example.com"));
    /// assert!(detail.starts_with("The records store failed; the operator finds it as incident "));
    /// ```
    pub fn detail(&self) -> String {
        let (part, state, error): (_, _, &dyn std::fmt::Display) = match self {
            Self::Store { part, source } if source.is_retryable() => {
                (part, "store is unavailable (try again)", source)
            }
            Self::Store { part, source } => (part, "store failed", source),
            Self::Internal { part, source } => (part, "failed", source),
            other => return other.to_string(),
        };
        let incident = uuid::Uuid::new_v4();
        tracing::error!(%incident, part = %part, %error, "a console call failed");
        format!("The {part} {state}; the operator finds it as incident {incident}.")
    }

    /// The RFC 9457 problem the JSON API answers ([`detail`](Self::detail)).
    pub fn problem(&self) -> ProblemDetails {
        let problem =
            ProblemDetails::new(self.status(), self.detail()).with_extension("error", self.kind());
        match self.retry_after() {
            Some(wait) => problem.with_retry_after(wait),
            None => problem,
        }
    }
}

impl axum::response::IntoResponse for AdminError {
    fn into_response(self) -> axum::response::Response {
        self.problem().into_response().map(axum::body::Body::new)
    }
}
